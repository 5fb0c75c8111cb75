//! The request pipeline. Stages run in this order, each a plain function
//! returning `Result<_, GatewayError>`:
//!
//! ```text
//! endpoint  path + method → what to do                       (404, 405)
//! snapshot  one Arc<Snapshot> load, kept for the whole request (503 before the first config)
//! framing   header size, Content-Length + Transfer-Encoding    (431, 400)
//! auth      SHA-256(key) → KeyEntry                            (401)
//! body      read within maxRequestBodyBytes and a deadline     (413, 408)
//! scan      top-level "model"/"stream" from the JSON           (400)
//! route     model → Route; key allow-list                      (404, 403)
//! forward   pick backend, rewrite, failover, first-byte timeout (502, 504)
//! stream    relay frames as they come; idle timeout; usage tap
//! ```
//!
//! Errors are answered in one place (`GatewayError::response`); every
//! request, answered or not, is counted and logged once by its `Exchange`.

pub mod auth;
pub mod body;
pub mod egress;
pub mod forward;
pub mod sse;
pub mod stream;
pub mod usage;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;

use crate::Shared;
use crate::error::GatewayError;
use crate::limit::{self, Admitted, RateHeaders, Refusal};
use crate::snapshot::{KeyEntry, Route, Snapshot};
use forward::{Outgoing, REQUEST_ID};
use stream::{Exchange, Outcome, ProxyBody, RelayBody, UsageWatch};

/// Largest total size of request headers accepted.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// The inference endpoints forwarded to a model's backends; a backend's
/// upstream paths are built for each, in this order, when a config loads.
pub const PROXIED_PATHS: [&str; 5] =
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"];

/// What a path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    /// An inference call forwarded to the model's backend (an index into [`PROXIED_PATHS`]).
    Proxy(usize),
    /// `GET /v1/models`.
    Models,
}

fn endpoint(path: &str) -> Option<Endpoint> {
    match path {
        "/v1/models" => Some(Endpoint::Models),
        _ => PROXIED_PATHS.iter().position(|known| *known == path).map(Endpoint::Proxy),
    }
}

/// The client end of a connection, as the upstream is told of it
/// (`X-Forwarded-For`, `X-Forwarded-Proto`).
#[derive(Debug, Clone)]
pub struct Client {
    /// The peer's address.
    pub forwarded_for: HeaderValue,
    /// `http` or `https`.
    pub forwarded_proto: HeaderValue,
    /// The connection's requests in flight and when the last one ended.
    pub activity: Arc<stream::ConnectionActivity>,
}

impl Client {
    /// For a connection from `address`, over TLS or not.
    pub fn new(address: std::net::IpAddr, tls: bool) -> Self {
        let forwarded_for = HeaderValue::try_from(address.to_string()).unwrap_or(HeaderValue::from_static("unknown"));
        let forwarded_proto = HeaderValue::from_static(if tls { "https" } else { "http" });
        Self { forwarded_for, forwarded_proto, activity: Arc::default() }
    }
}

/// Serves one request. Never fails: errors become OpenAI-shaped responses.
pub async fn handle(
    shared: Arc<Shared>,
    client: Client,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    let request_id = shared.request_ids.for_request(request.headers());
    let target = endpoint(request.uri().path());
    let path = match target {
        Some(Endpoint::Proxy(index)) => PROXIED_PATHS[index],
        Some(Endpoint::Models) => "/v1/models",
        None => "other",
    };
    let mut exchange = Some(Exchange::new(
        shared.clone(),
        client.activity.clone(),
        started,
        request.method().clone(),
        path,
        request_id.clone(),
    ));
    let result = serve(&shared, &client, request, target, &mut exchange, &request_id).await;
    let mut response = match result {
        Ok(response) => response,
        Err(error) => {
            if let Some(exchange) = exchange.take() {
                finish_without_body(exchange, error.status().as_u16(), Some(error.code()));
            }
            error.response()
        }
    };
    response.headers_mut().insert(REQUEST_ID.clone(), request_id);
    Ok(response)
}

fn finish_without_body(exchange: Exchange, status: u16, error: Option<&'static str>) {
    exchange.finish(Outcome { status, bytes: 0, first_byte: None, upstream: None, usage: None, error });
}

async fn serve(
    shared: &Shared,
    client: &Client,
    request: Request<Incoming>,
    target: Option<Endpoint>,
    exchange: &mut Option<Exchange>,
    request_id: &HeaderValue,
) -> Result<Response<ProxyBody>, GatewayError> {
    let target = target.ok_or_else(|| GatewayError::NotFound(truncated(request.uri().path())))?;
    let expected_method = if target == Endpoint::Models { Method::GET } else { Method::POST };
    if request.method() != expected_method {
        return Err(GatewayError::MethodNotAllowed);
    }
    let snapshot = shared.config.current().ok_or(GatewayError::NotReady)?;
    if let Some(exchange) = exchange.as_mut() {
        exchange.access_log = snapshot.settings.access_log;
    }
    check_framing(request.headers())?;
    let key = auth::authenticate(&snapshot, request.headers(), jiff::Timestamp::now)?;
    if let Some(exchange) = exchange.as_mut() {
        exchange.key = Some(key.id.clone());
    }
    let Endpoint::Proxy(endpoint_index) = target else {
        let body = models_list(&snapshot, key);
        if let Some(exchange) = exchange.take() {
            finish_without_body(exchange, 200, None);
        }
        return Ok(json_response(body));
    };

    // The key's request limit is checked before its body is read: a key
    // over its limit costs no body read.
    let counted = count_key_request(shared, &snapshot, key).await?;
    let (parts, body) = request.into_parts();
    let body = read_body(shared, &snapshot, &parts.headers, body).await?;
    let body_done = Instant::now();
    let fields = body::scan(&body)?;
    // NB: a model the key's namespace may not see answers exactly like one
    // that does not exist, so keys cannot probe other teams' model names.
    let index = snapshot
        .route_index(&fields.model)
        .filter(|index| key.sees(*index))
        .ok_or_else(|| GatewayError::UnknownModel(truncated(&fields.model)))?;
    if !key.allows(index) {
        return Err(GatewayError::ModelNotAllowed(truncated(&fields.model)));
    }
    let route = snapshot.route(index);
    if let Some(exchange) = exchange.as_mut() {
        exchange.model = Some(route.name.clone());
        exchange.stream = fields.stream;
    }

    let reservation = limit::Reservation::for_request(body.len(), fields.max_tokens, route.output_token_reservation);
    let mut admitted = rate_limit(shared, &snapshot, key, route, reservation, counted).await?;
    // Token limits need the usage of streams too: ask for it, and take the
    // extra chunk out again if the client did not ask for it.
    let charge = admitted.as_mut().and_then(|a| a.charge.take());
    let (body, model_span, strip_usage) = match &charge {
        Some(_) if fields.stream && usage::STREAM_OPTIONS_PATHS.contains(&endpoint_index) => {
            usage::with_stream_usage(&body, fields.stream_options.clone(), fields.model_span.clone())
        }
        _ => (body.clone(), fields.model_span.clone(), false),
    };
    if let Some(exchange) = exchange.as_mut() {
        exchange.charge = charge;
    }

    let outgoing = Outgoing {
        method: &parts.method,
        endpoint: endpoint_index,
        query: parts.uri.query(),
        headers: &parts.headers,
        body: &body,
        model_span,
        request_id,
        client,
    };
    let forwarded = forward::send(route, &outgoing).await.inspect_err(|error| {
        let reason = error.code();
        shared.metrics.upstream_errors.with_label_values(&[&route.name, reason]).inc();
    })?;

    // An error page that is not JSON (a proxy's HTML 502) would break the
    // client's SDK: it becomes an OpenAI-shaped error with the same status.
    let upstream_status = forwarded.response.status();
    if !upstream_status.is_success() && !is_json(forwarded.response.headers()) {
        shared.metrics.upstream_errors.with_label_values(&[&route.name, "not_json"]).inc();
        return Err(GatewayError::UpstreamNotJson(route.name.to_string(), upstream_status.as_u16()));
    }
    let Some(mut exchange) = exchange.take() else {
        return Err(GatewayError::NotReady);
    };
    exchange.overhead_before = forwarded.sent_at.saturating_duration_since(body_done);
    let (mut head, upstream_body) = forwarded.response.into_parts();
    head.headers.retain_returnable();
    if let Some(admitted) = &admitted {
        admitted.headers.apply(&mut head.headers);
    }
    let status = head.status.as_u16();
    let usage_watch = match (head.status.is_success(), strip_usage) {
        (false, _) => UsageWatch::Off,
        (true, false) => UsageWatch::Tap,
        (true, true) => UsageWatch::TapAndStripChunk,
    };
    let relay = RelayBody::new(
        upstream_body,
        exchange,
        status,
        route.timeouts.idle,
        usage_watch,
        forwarded.headers_at - forwarded.sent_at,
        forwarded.headers_at,
    );
    Ok(Response::from_parts(head, ProxyBody::Relay(relay)))
}

/// The key's request limit, before the body is read (`None` when it has
/// none, or Redis failed open). Refused or failed closed: the error.
async fn count_key_request(
    shared: &Shared,
    snapshot: &Snapshot,
    key: &KeyEntry,
) -> Result<Option<limit::Counted>, GatewayError> {
    let limits = key.limits.as_ref();
    if limits.is_none_or(|set| set.requests.is_none()) {
        return Ok(None);
    }
    let counted = match &snapshot.redis {
        None => limit::count_key_request(limits, shared.fleet.shares()),
        Some(counter) => match limit::count_key_request_in_redis(counter, &key.id, limits).await {
            Ok(decision) => decision,
            Err(error) => {
                shared.metrics.rate_limit_store_errors.with_label_values(&[error.label()]).inc();
                if counter.config.fail_closed {
                    return Err(GatewayError::RateLimitUnavailable(error));
                }
                Ok(None)
            }
        },
    };
    counted.map_err(|refusal| {
        shared.metrics.rate_limit_requests.with_label_values(&["unknown", &key.id, refusal.label()]).inc();
        GatewayError::RateLimited(refusal)
    })
}

/// The key's and the model's rate limits for this request: `None` when
/// neither has any, else the admission (headers, token charge) or a 429.
/// Counted locally (this pod's share) or in Redis, as the config says.
async fn rate_limit(
    shared: &Shared,
    snapshot: &Snapshot,
    key: &KeyEntry,
    route: &Route,
    reservation: limit::Reservation,
    counted: Option<limit::Counted>,
) -> Result<Option<Admitted>, GatewayError> {
    if key.limits.is_none() && route.limits.is_none() {
        return Ok(None);
    }
    let counted = counted.as_ref();
    let (key_limits, model_limits) = (key.limits.as_ref(), route.limits.as_ref());
    let decision = match &snapshot.redis {
        None => limit::admit(key_limits, model_limits, shared.fleet.shares(), reservation, counted),
        Some(counter) => {
            let subject = limit::Subject { key: (&key.id, key_limits), model: (&route.name, model_limits) };
            match limit::admit_in_redis(counter, &subject, reservation, counted).await {
                Ok(decision) => decision,
                Err(error) => {
                    shared.metrics.rate_limit_store_errors.with_label_values(&[error.label()]).inc();
                    if counter.config.fail_closed {
                        return Err(GatewayError::RateLimitUnavailable(error));
                    }
                    // Failing open: admitted, uncounted.
                    Ok(Admitted { headers: RateHeaders::default(), charge: None })
                }
            }
        }
    };
    let label = decision.as_ref().map_or_else(Refusal::label, |_| "admitted");
    shared.metrics.rate_limit_requests.with_label_values(&[&route.name, &key.id, label]).inc();
    decision.map(Some).map_err(GatewayError::RateLimited)
}

trait RetainReturnable {
    fn retain_returnable(&mut self);
}

impl RetainReturnable for HeaderMap {
    fn retain_returnable(&mut self) {
        let hop: Vec<_> = self.keys().filter(|name| !forward::returnable(name)).cloned().collect();
        for name in hop {
            self.remove(name);
        }
    }
}

/// Refuses header blocks that are too large and request-smuggling shapes.
fn check_framing(headers: &HeaderMap) -> Result<(), GatewayError> {
    if headers.contains_key(header::TRANSFER_ENCODING) && headers.contains_key(header::CONTENT_LENGTH) {
        return Err(GatewayError::AmbiguousLength);
    }
    let size: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    if size > MAX_HEADER_BYTES {
        return Err(GatewayError::HeadersTooLarge(MAX_HEADER_BYTES));
    }
    Ok(())
}

/// Reads the whole body, refusing it early when Content-Length already says
/// it is too large, and giving up when the client is too slow.
async fn read_body(
    shared: &Shared,
    snapshot: &Snapshot,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<Bytes, GatewayError> {
    let limit = snapshot.settings.max_request_body_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(GatewayError::BodyTooLarge(limit));
    }
    let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match tokio::time::timeout(shared.body_timeout, limited.collect()).await {
        Err(_) => Err(GatewayError::BodyTimeout),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => Err(GatewayError::BodyTooLarge(limit)),
        Ok(Err(_)) => Err(GatewayError::BodyRead),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// The models a key may use, in OpenAI's list format.
fn models_list(snapshot: &Snapshot, key: &crate::snapshot::KeyEntry) -> Bytes {
    let data: Vec<serde_json::Value> = snapshot
        .routes()
        .iter()
        .enumerate()
        .filter(|(index, _)| key.sees(*index) && key.allows(*index))
        .flat_map(|(_, route)| route.names.iter())
        .map(|name| serde_json::json!({"id": name, "object": "model", "created": 0, "owned_by": "waycast"}))
        .collect();
    Bytes::from(serde_json::json!({"object": "list", "data": data}).to_string())
}

/// Whether a response says its body is JSON (`application/json`, or a
/// `+json` type such as `application/problem+json`).
fn is_json(headers: &http::HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|value| {
        let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        essence == "application/json" || essence.ends_with("+json")
    })
}

fn json_response(body: Bytes) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::from(body));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// User text in error messages is capped, so a 1 MB model name does not
/// come back as a 1 MB error.
fn truncated(text: &str) -> String {
    const MAX: usize = 128;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(endpoint("/v1/chat/completions"), Some(Endpoint::Proxy(0)));
        assert_eq!(endpoint("/v1/messages"), Some(Endpoint::Proxy(4)));
        assert_eq!(endpoint("/v1/models"), Some(Endpoint::Models));
        assert_eq!(endpoint("/v1/chat/completions/"), None);
        assert_eq!(endpoint("/admin"), None);
    }

    #[test]
    fn framing_checks() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        assert!(check_framing(&headers).is_ok());
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        assert_eq!(check_framing(&headers), Err(GatewayError::AmbiguousLength));
        let mut big = HeaderMap::new();
        big.insert("x-big", HeaderValue::from_str(&"a".repeat(MAX_HEADER_BYTES)).unwrap());
        assert_eq!(check_framing(&big), Err(GatewayError::HeadersTooLarge(MAX_HEADER_BYTES)));
    }

    #[test]
    fn long_user_text_is_truncated_on_a_char_boundary() {
        let long = "é".repeat(200);
        let short = truncated(&long);
        assert!(short.len() <= 128 + "…".len());
        assert!(short.ends_with('…'));
    }
}
