//! The request pipeline. Stages run in this order, each a plain function
//! returning `Result<_, GatewayError>`; the decisions are pure (`route.rs`),
//! the rest is I/O:
//!
//! ```text
//! endpoint  path + method → what to do                          (404, 405)    route::endpoint
//! snapshot  the worker's own handle on the served snapshot, kept for the whole request   (503 before the first config)
//! admit     framing, then SHA-256(key) → KeyEntry               (431, 400, 401) route::admit
//! count     the key's request limit, before the body            (429, 503)
//! body      read within maxRequestBodyBytes and a deadline       (413, 408)
//! scan      top-level "model"/"stream"/… from the JSON          (400)         body::scan
//! route     model → Route; visibility and allow-list            (404, 403)    route::route
//! limits    key and model limits, token reservation             (429, 503)
//! forward   pick backend, rewrite, failover, first-byte timeout (502, 504)
//! stream    relay frames as they come; idle timeout; usage tap
//! ```
//!
//! Errors are answered in one place (`GatewayError::response`). Every
//! request has one `Exchange` (counted and logged once): `handle` finishes
//! it for an error or the gateway's own answer, the relay for a relayed one.

pub mod auth;
pub mod body;
pub mod exchange;
pub mod forward;
pub mod route;
pub mod series;
pub mod sse;
pub mod stream;
pub mod usage;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use crate::error::GatewayError;
use crate::limit::{self, Admitted, RateHeaders};
use crate::shared::{Shared, WorkerShared};
use crate::snapshot::{KeyEntry, Route, Snapshot};
use exchange::{Exchange, Outcome};
use forward::{Outgoing, REQUEST_ID};
use route::Endpoint;
use stream::{ProxyBody, RelayBody, UsageWatch};

/// The client end of a connection, as the upstream is told of it
/// (`X-Forwarded-For`, `X-Forwarded-Proto`).
#[derive(Debug, Clone)]
pub struct Client {
    /// The peer's address.
    pub forwarded_for: HeaderValue,
    /// `http` or `https`.
    pub forwarded_proto: HeaderValue,
    /// The connection's requests in flight and when the last one ended.
    pub activity: Arc<exchange::ConnectionActivity>,
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
    shared: Arc<WorkerShared>,
    client: Client,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    client.activity.note_version(request.version());
    let request_id = shared.request_ids.for_request(request.headers());
    let path = Endpoint::of(request.uri().path()).map_or("other", Endpoint::path);
    let method = request.method().clone();
    let mut exchange =
        Exchange::new(shared.clone(), client.activity.clone(), started, method, path, request_id.clone());
    let mut response = match serve(&shared, &client, request, &mut exchange, &request_id).await {
        Ok(Answer::Own(body)) => {
            finish_without_body(exchange, 200, None);
            json_response(body)
        }
        Ok(Answer::Relay(relayed)) => {
            exchange.overhead_before = relayed.overhead_before;
            let relay = RelayBody::new(
                relayed.body,
                exchange,
                &relayed.head,
                relayed.idle_timeout,
                relayed.usage_watch,
                relayed.upstream_took,
                relayed.headers_at,
            );
            Response::from_parts(relayed.head, ProxyBody::Relay(relay))
        }
        Err(error) => {
            finish_without_body(exchange, error.status().as_u16(), Some(error.code()));
            error.response()
        }
    };
    response.headers_mut().insert(REQUEST_ID.clone(), request_id);
    Ok(response)
}

/// How a request is answered when it is not an error.
#[allow(
    clippy::large_enum_variant,
    reason = "Relay is the common case and lives only until the response is made; boxing it costs an allocation per request"
)]
enum Answer {
    /// By the gateway itself (`/v1/models`).
    Own(Bytes),
    /// By relaying an upstream response.
    Relay(Relayed),
}

/// An upstream response ready to relay, and what the relay needs.
struct Relayed {
    head: http::response::Parts,
    body: crate::upstream::UpstreamBody,
    idle_timeout: std::time::Duration,
    usage_watch: UsageWatch,
    /// Request sent → response headers.
    upstream_took: std::time::Duration,
    headers_at: Instant,
    /// Gateway time before the upstream was asked.
    overhead_before: std::time::Duration,
}

fn finish_without_body(exchange: Exchange, status: u16, error: Option<&'static str>) {
    exchange.finish(Outcome {
        status,
        bytes: 0,
        events: None,
        first_byte: None,
        upstream: None,
        usage: None,
        error,
        ended: None,
    });
}

async fn serve(
    shared: &Shared,
    client: &Client,
    request: Request<Incoming>,
    exchange: &mut Exchange,
    request_id: &HeaderValue,
) -> Result<Answer, GatewayError> {
    let (parts, body) = request.into_parts();
    // Answered before its body is read (a refusal), the rest of the body is
    // read and thrown away in the background: see `UnreadBody`.
    let mut body = UnreadBody(Some(body));
    let endpoint = route::endpoint(&parts.method, parts.uri.path())?;
    let snapshot = shared.config.current_here().ok_or(GatewayError::NotReady)?;
    exchange.access_log = snapshot.settings.access_log;
    let key = route::admit(&snapshot, &parts.headers, jiff::Timestamp::now)?;
    exchange.key = Some(crate::worker::own_name(&key.id));
    let Endpoint::Proxy(endpoint_index) = endpoint else {
        return Ok(Answer::Own(models_list(&snapshot, key)));
    };

    // The key's request limit is checked before its body is read: a key
    // over its limit costs no body read.
    let counted = count_key_request(shared, &snapshot, key).await?;
    let body = read_body(shared, &snapshot, &parts.headers, &mut body).await?;
    let body_done = Instant::now();
    let fields = body::scan(&body)?;
    let route = route::route(&snapshot, key, &fields.model)?.route;
    exchange.model = Some(crate::worker::own_name(&route.name));
    exchange.stream = fields.stream;

    let reservation =
        limit::Reservation::for_request(body.len(), fields.max_tokens, fields.choices, route.output_token_reservation);
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
    exchange.charge = charge;

    let outgoing = Outgoing {
        method: &parts.method,
        endpoint: endpoint_index,
        query: parts.uri.query(),
        headers: &parts.headers,
        body: &body,
        model_span,
        request_id,
        client,
        affinity: route.balancing.affinity(&parts.headers, &body, fields.prompt_start),
        metrics: &shared.metrics,
    };
    let forwarded = forward::send(route, &outgoing, &shared.endpoints).await.inspect_err(|error| {
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
    exchange.endpoint = forwarded.in_flight;
    let (mut head, body) = forwarded.response.into_parts();
    head.headers.retain_returnable();
    if let Some(admitted) = &admitted {
        admitted.headers.apply(&mut head.headers);
    }
    let usage_watch = match (head.status.is_success(), strip_usage) {
        (false, _) => UsageWatch::Off,
        (true, false) => UsageWatch::Tap,
        (true, true) => UsageWatch::TapAndStripChunk,
    };
    if usage_watch == UsageWatch::TapAndStripChunk {
        // The relayed body is shorter than the upstream's by the chunk taken out.
        head.headers.remove(http::header::CONTENT_LENGTH);
    }
    Ok(Answer::Relay(Relayed {
        head,
        body,
        idle_timeout: route.timeouts.idle,
        usage_watch,
        upstream_took: forwarded.headers_at - forwarded.sent_at,
        headers_at: forwarded.headers_at,
        overhead_before: forwarded.sent_at.saturating_duration_since(body_done),
    }))
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
            Err(error) => Ok(on_store_error(shared, counter, error, None)?),
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
                // Failing open: admitted, uncounted.
                Err(error) => Ok(on_store_error(
                    shared,
                    counter,
                    error,
                    Admitted { headers: RateHeaders::default(), charge: None },
                )?),
            }
        }
    };
    match &decision {
        // Every admitted request: counted on the worker's own copy.
        Ok(_) => {
            let series = series::pair(&shared.metrics, &route.name, &key.id);
            series.count_admitted();
            series::written(&series, false);
        }
        Err(refusal) => {
            shared.metrics.rate_limit_requests.with_label_values(&[&route.name, &key.id, refusal.label()]).inc();
        }
    }
    decision.map(Some).map_err(GatewayError::RateLimited)
}

/// A Redis call that failed: counted, then the Gateway's failure mode —
/// closed: the request is refused (503); open: it gets `when_open`.
fn on_store_error<T>(
    shared: &Shared,
    counter: &limit::redis::RedisCounter,
    error: limit::redis::StoreError,
    when_open: T,
) -> Result<T, GatewayError> {
    shared.metrics.rate_limit_store_errors.with_label_values(&[error.label()]).inc();
    if counter.config.fail_closed { Err(GatewayError::RateLimitUnavailable(error)) } else { Ok(when_open) }
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

/// Reads the whole body, refusing it early when Content-Length already says
/// it is too large, and giving up when the client is too slow. A body
/// refused for its size stays in `body` (to be discarded); one read, or cut
/// off by the timeout or a read error, is taken.
async fn read_body(
    shared: &Shared,
    snapshot: &Snapshot,
    headers: &HeaderMap,
    body: &mut UnreadBody,
) -> Result<Bytes, GatewayError> {
    let limit = snapshot.settings.max_request_body_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(GatewayError::BodyTooLarge(limit));
    }
    let Some(incoming) = body.0.as_mut() else { return Err(GatewayError::BodyRead) };
    let read = match tokio::time::timeout(shared.body_timeout, collect_at_most(incoming, limit)).await {
        Err(_) => Err(GatewayError::BodyTimeout),
        // Left in `body`: the rest is discarded when it drops.
        Ok(Err(BodyError::TooLarge)) => return Err(GatewayError::BodyTooLarge(limit)),
        Ok(Err(BodyError::Read)) => Err(GatewayError::BodyRead),
        Ok(Ok(bytes)) => Ok(bytes),
    };
    // Read whole, or cut off: a slow or broken client's connection is not
    // kept for it.
    body.0 = None;
    read
}

enum BodyError {
    TooLarge,
    Read,
}

/// The body's data frames, joined with one copy at the end (none for a
/// one-frame body), or `TooLarge` as soon as they pass `limit` bytes.
async fn collect_at_most(body: &mut Incoming, limit: u64) -> Result<Bytes, BodyError> {
    // The first frame apart: most bodies come in one, and then no list is
    // allocated.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<Bytes> = Vec::new();
    let mut total = 0_usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyError::Read)?.into_data() else { continue };
        total += data.len();
        if total as u64 > limit {
            return Err(BodyError::TooLarge);
        }
        if first.is_none() { first = Some(data) } else { more.push(data) }
    }
    let first = first.unwrap_or_default();
    if more.is_empty() {
        return Ok(first);
    }
    let mut joined = bytes::BytesMut::with_capacity(total);
    for frame in std::iter::once(&first).chain(&more) {
        joined.extend_from_slice(frame);
    }
    Ok(joined.freeze())
}

/// How much of a refused request's body is still read and thrown away, and
/// for how long: enough that a client still sending it can finish and read
/// the answer (a connection closed with unread data is reset, and the
/// client loses the answer with it), bounded so a client cannot make the
/// gateway read forever.
const DISCARD_AFTER_REFUSAL_BYTES: u64 = 16 * 1024 * 1024;
/// See [`DISCARD_AFTER_REFUSAL_BYTES`].
const DISCARD_AFTER_REFUSAL_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// A request body not read (yet). Dropped while still held — the request
/// was answered without it — the rest is discarded in the background within
/// the bounds above; HTTP/1.1 keep-alive then goes on if it all came.
struct UnreadBody(Option<Incoming>);

impl Drop for UnreadBody {
    fn drop(&mut self) {
        let Some(mut body) = self.0.take() else { return };
        // Nothing left, or more declared than would be read: close now.
        if http_body::Body::is_end_stream(&body)
            || http_body::Body::size_hint(&body).lower() > DISCARD_AFTER_REFUSAL_BYTES
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let discard = async {
                let mut left = DISCARD_AFTER_REFUSAL_BYTES;
                while let Some(Ok(frame)) = body.frame().await {
                    let length = frame.data_ref().map_or(0, |data| data.len() as u64);
                    if length >= left {
                        return;
                    }
                    left -= length;
                }
            };
            let _ = tokio::time::timeout(DISCARD_AFTER_REFUSAL_TIME, discard).await;
        });
    }
}

/// The models a key may use, in OpenAI's list format: each name as the
/// key resolves it, listed once.
fn models_list(snapshot: &Snapshot, key: &crate::snapshot::KeyEntry) -> Bytes {
    let data: Vec<serde_json::Value> = snapshot
        .routes()
        .iter()
        .enumerate()
        .filter(|(index, _)| key.allows(*index))
        .flat_map(|(index, route)| route.names.iter().filter(move |name| snapshot.resolve(key, name) == Some(index)))
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
