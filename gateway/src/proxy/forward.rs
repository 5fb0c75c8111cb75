//! Sending a request upstream: the pooled HTTP/1.1 client, header hygiene, model
//! rewrite, failover to the next backend on connect failure, and the
//! first-byte timeout. No total-duration timeout exists anywhere.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Response};

use super::facts::{Tallies, Tally};
pub use super::upstream_headers::returnable;
use super::upstream_headers::{
    ANTHROPIC_VERSION, BAGGAGE, DEFAULT_ANTHROPIC_VERSION, FORWARDED_FOR, FORWARDED_PROTO, TRACEPARENT, TRACESTATE,
    forwardable, forwarded_query, is_client_credential, is_picker_header, is_set_by_gateway,
};
use crate::dialect::plan::{Plan, Translated, plan};
use crate::error::GatewayError;
use crate::request_id::REQUEST_ID;
use crate::snapshot::{Backend, Route};
use crate::telemetry::RequestTrace;
use crate::upstream::body_rest::RestError;
use crate::upstream::endpoints::EndpointTable;
use crate::upstream::http1::UpstreamError;
use crate::upstream::pick::{InFlight, SetHandle};
use crate::upstream::{BodyRest, UpstreamBody, UpstreamRequest};

/// What the upstream answered.
pub struct Forwarded {
    /// Its response; the body is still streaming.
    pub response: Response<UpstreamBody>,
    /// When the request was handed to the client.
    pub sent_at: Instant,
    /// When the response headers arrived.
    pub headers_at: Instant,
    /// The endpoint it came from, counted in flight until this is dropped.
    pub in_flight: Option<InFlight>,
    /// What was made of the request for the backend that answered: its
    /// answer is translated back the same way.
    pub plan: Plan,
}

/// What `send` needs from the client's request.
pub struct Outgoing<'a> {
    /// Method.
    pub method: &'a Method,
    /// Which of [`crate::dialect::APIS`] was asked for.
    pub endpoint: usize,
    /// The client's query string, if any.
    pub query: Option<&'a str>,
    /// The client's headers.
    pub headers: &'a HeaderMap,
    /// The whole request body.
    pub body: &'a Bytes,
    /// Where the model's JSON string sits in `body`.
    pub model_span: std::ops::Range<usize>,
    /// The request id to send upstream.
    pub request_id: &'a HeaderValue,
    /// Who asked (`X-Forwarded-For`, `X-Forwarded-Proto`).
    pub client: &'a super::connection::Client,
    /// The prefix-affinity key, under `PrefixAffinity`.
    pub affinity: Option<u64>,
    /// The Inference Extension's headers to stamp, when the Gateway says so.
    pub inference: Option<Inference<'a>>,
    /// The body translated for the backends that speak another API
    /// (`crate::dialect::plan`); `None`: every backend speaks the client's.
    pub translated: Option<&'a Translated>,
    /// The rest of the client's body, still arriving (a form's file):
    /// `body` is what came before it.
    pub streamed: Option<Streamed<'a>>,
}

/// The rest of a client's body, streamed upstream as it arrives.
#[derive(Debug, Clone, Copy)]
pub struct Streamed<'a> {
    /// Its bytes.
    pub rest: &'a BodyRest,
    /// How long the client has to send it, from the first attempt (what
    /// is left of the body timeout): the first-byte timeout is extended by
    /// as much.
    pub allowance: std::time::Duration,
}

impl Outgoing<'_> {
    /// What is made of this request on `backend`.
    fn plan_on(&self, backend: &Backend) -> Plan {
        if self.translated.is_some() { plan(self.endpoint, backend.format) } else { Plan::Pass }
    }

    /// Its streamed body began going to an upstream: no other attempt can
    /// have it, and an answer held is the answer.
    fn body_begun(&self) -> bool {
        self.streamed.is_some_and(|streamed| streamed.rest.is_begun())
    }
}

/// What an llm-d or endpoint-picker backend reads of a request's owner:
/// the key's namespace and class, never the client's say.
#[derive(Debug, Clone, Copy)]
pub struct Inference<'a> {
    /// `x-gateway-inference-fairness-id`: the key's namespace.
    pub fairness_id: &'a str,
    /// `x-gateway-inference-objective`: the key's class.
    pub objective: &'a str,
}

impl<'a> Inference<'a> {
    /// The headers for `key`'s requests, when `sharing` stamps them.
    pub fn of(sharing: &'a waycast_crds::config::SharingConfig, key: &'a crate::snapshot::KeyEntry) -> Option<Self> {
        if !sharing.inference_headers {
            return None;
        }
        let objective = sharing.classes.get(usize::from(key.class)).map_or("", String::as_str);
        Some(Self { fairness_id: &key.tenant.namespace, objective })
    }
}

/// Both generations of the picker's fairness and objective headers, each
/// stamped with the same value.
static FAIRNESS_ID: [HeaderName; 2] = [
    HeaderName::from_static("x-gateway-inference-fairness-id"),
    HeaderName::from_static("x-llm-d-inference-fairness-id"),
];
static OBJECTIVE: [HeaderName; 2] =
    [HeaderName::from_static("x-gateway-inference-objective"), HeaderName::from_static("x-llm-d-inference-objective")];

/// How many endpoints of one backend a request may try.
pub const MAX_ENDPOINT_ATTEMPTS: usize = 3;

/// Sends the request to the route's backends in failover order; within a
/// backend that names `endpoints`, to a picked endpoint, and on a connect
/// failure, a reset before the response headers or a retried status (the
/// model's `retryOnStatus`) to another one
/// (within the route's retry budget). Nothing is retried once a byte of the
/// response may have reached the client, nor after the first-byte timeout.
///
/// # Errors
/// 502 when no backend accepts a connection or one fails after connecting;
/// 504 when none answers within the first-byte timeout.
pub async fn send(
    route: &Route,
    outgoing: &Outgoing<'_>,
    table: &EndpointTable,
    (tallies, mut trace): (&mut Tallies, Option<&mut RequestTrace>),
) -> Result<Forwarded, GatewayError> {
    route.retry_budget.request();
    let mut last_error = None;
    // A retried status every endpoint of a backend gave: the answer, unless a later
    // backend (a failover tier) serves the request.
    let mut overloaded = None;
    for index in route.backend_order() {
        if outgoing.body_begun() {
            break;
        }
        let backend = &route.backends[index];
        if outgoing.plan_on(backend) == Plan::NotServed {
            // Never in place of another backend's real failure.
            let path = crate::dialect::APIS[outgoing.endpoint].path;
            last_error = last_error.or_else(|| Some(GatewayError::NotOffered(route.name.to_string(), path)));
            continue;
        }
        let endpoints = backend.endpoints.as_deref().and_then(|key| table.get_here(key)).filter(|set| !set.is_empty());
        let outcome = match endpoints {
            None => {
                let authority = crate::per_worker::own_authority(&backend.authority);
                send_to(route, backend, authority, outgoing, None, trace.as_deref_mut()).await
            }
            Some(set) => send_to_endpoints(route, backend, &set, outgoing, (tallies, trace.as_deref_mut())).await,
        };
        match outcome {
            Ok(forwarded) => return Ok(forwarded),
            Err(Failure::TryNextBackend(error)) => last_error = Some(error),
            Err(Failure::Overloaded(forwarded)) => overloaded = Some(*forwarded),
            Err(Failure::Final(error)) => return Err(error),
        }
        // The next backend (a failover tier) tries it, if there is one.
        if let Some(trace) = trace.as_deref_mut() {
            trace.note_retry("failover");
        }
    }
    match overloaded {
        Some(forwarded) => Ok(forwarded),
        None => Err(last_error.unwrap_or_else(|| GatewayError::UpstreamUnreachable(route.name.to_string()))),
    }
}

/// How one attempt failed.
enum Failure {
    /// Nothing reached the upstream's application: another backend may try.
    TryNextBackend(GatewayError),
    /// Every endpoint tried answered a retried status (this is the last answer): a
    /// later backend may serve it.
    Overloaded(Box<Forwarded>),
    /// The request may be in progress upstream, or the answer is final.
    Final(GatewayError),
}

/// Up to [`MAX_ENDPOINT_ATTEMPTS`] endpoints of `set`, each picked by the
/// route's policy among those not tried yet. A failure counts against the
/// endpoint (enough in a row eject it); a retry needs the route's budget,
/// and without it the failure stands (a connect failure still lets the next
/// backend try, as for URL backends).
async fn send_to_endpoints(
    route: &Route,
    backend: &Backend,
    set: &std::sync::Arc<SetHandle>,
    outgoing: &Outgoing<'_>,
    (tallies, mut trace): (&mut Tallies, Option<&mut RequestTrace>),
) -> Result<Forwarded, Failure> {
    let attempts = set.endpoints().len().min(MAX_ENDPOINT_ATTEMPTS);
    let mut tried = Vec::with_capacity(attempts);
    let mut last = GatewayError::UpstreamUnreachable(route.name.to_string());
    while tried.len() < attempts {
        let now = crate::limit::clock::now_nanos();
        let Some(pick) = set.pick(route.balancing.policy, outgoing.affinity, &tried, now) else { break };
        tried.push(pick);
        let endpoint = &set.endpoints()[pick];
        let Some(authority) = endpoint.authority.as_ref().map(crate::per_worker::own_authority) else { continue };
        let sent = send_to(route, backend, authority, outgoing, Some(set.start(pick)), trace.as_deref_mut()).await;
        let retried = sent.as_ref().ok().and_then(|forwarded| route.balancing.retries(forwarded.response.status()));
        let reason = match (sent, retried) {
            (Ok(forwarded), Some(reason)) => {
                // A 5xx counts toward ejecting the endpoint; a 429 is a busy
                // pod, not a broken one.
                if forwarded.response.status().is_server_error() {
                    count_failure(route, endpoint, now, tallies);
                }
                // Overloaded, draining or failing: another endpoint may
                // serve it, else another backend; else this answer is the
                // answer.
                if tried.len() >= attempts || outgoing.body_begun() || !route.retry_budget.take_retry() {
                    return Err(Failure::Overloaded(Box::new(forwarded)));
                }
                reason
            }
            (Ok(forwarded), None) => {
                endpoint.record_success();
                return Ok(forwarded);
            }
            // `send_to` never answers Overloaded: that is decided here.
            (Err(failure @ (Failure::Final(_) | Failure::Overloaded(_))), _) => return Err(failure),
            (Err(Failure::TryNextBackend(error)), _) if outgoing.body_begun() => {
                count_failure(route, endpoint, now, tallies);
                return Err(Failure::Final(error));
            }
            (Err(Failure::TryNextBackend(error)), _) => {
                count_failure(route, endpoint, now, tallies);
                last = error;
                if tried.len() >= attempts || !route.retry_budget.take_retry() {
                    break;
                }
                "connect_or_reset"
            }
        };
        tallies.note(Tally::Retry(reason));
        if let Some(trace) = trace.as_deref_mut() {
            trace.note_retry(reason);
        }
    }
    Err(Failure::TryNextBackend(last))
}

fn count_failure(route: &Route, endpoint: &crate::upstream::pick::Endpoint, now: u64, tallies: &mut Tallies) {
    if endpoint.record_failure(now) {
        tracing::warn!(model = %route.name, endpoint = %endpoint.address, "endpoint ejected after failures in a row");
        tallies.note(Tally::Ejection);
    }
}

/// One attempt at `authority`.
async fn send_to(
    route: &Route,
    backend: &Backend,
    authority: http::uri::Authority,
    outgoing: &Outgoing<'_>,
    in_flight: Option<InFlight>,
    trace: Option<&mut RequestTrace>,
) -> Result<Forwarded, Failure> {
    let begun = trace.as_deref().map(RequestTrace::begin_attempt);
    let endpoint = begun.as_ref().map(|_| authority.clone());
    let request = build_request(route, backend, authority, outgoing, begun.as_ref())
        .ok_or_else(|| Failure::Final(GatewayError::UpstreamFailed(route.name.to_string())))?;
    let sent_at = Instant::now();
    let waited = route.timeouts.first_byte + outgoing.streamed.map(|streamed| streamed.allowance).unwrap_or_default();
    let answered = tokio::time::timeout(waited, backend.client.request(request)).await;
    let mut sent = answered_as(route, answered, sent_at, in_flight);
    if let Ok(forwarded) = &mut sent {
        forwarded.plan = outgoing.plan_on(backend);
    }
    if let (Some(trace), Some(begun), Some(endpoint)) = (trace, begun, endpoint) {
        // The span runs from the request sent to the response head (the
        // clock readings taken for the metrics), or to the failure.
        let (status, error, ended) = match &sent {
            Ok(forwarded) => (Some(forwarded.response.status().as_u16()), None, forwarded.headers_at),
            Err(Failure::Overloaded(forwarded)) => {
                (Some(forwarded.response.status().as_u16()), None, forwarded.headers_at)
            }
            Err(Failure::TryNextBackend(error) | Failure::Final(error)) => (None, Some(error.code()), Instant::now()),
        };
        trace.end_attempt(begun, endpoint, (sent_at, ended), status, error);
    }
    sent
}

/// How an attempt went, from the upstream client's answer (or its
/// deadline): a plain function, so the attempt is one future.
fn answered_as(
    route: &Route,
    answered: Result<Result<Response<UpstreamBody>, UpstreamError>, tokio::time::error::Elapsed>,
    sent_at: Instant,
    in_flight: Option<InFlight>,
) -> Result<Forwarded, Failure> {
    match answered {
        Ok(Ok(response)) => {
            let headers_at = Instant::now();
            if let Some(flight) = &in_flight {
                flight.endpoint().observe_response(headers_at - sent_at);
            }
            Ok(Forwarded { response, sent_at, headers_at, in_flight, plan: Plan::Pass })
        }
        // The client's streamed body failed or was refused as it came: its
        // answer, whoever was sent the beginning.
        Ok(Err(UpstreamError::RequestBody(RestError::Source(source)))) => {
            Err(Failure::Final(source.downcast::<GatewayError>().map_or(GatewayError::BodyRead, |error| *error)))
        }
        // Begun, its body cannot be sent to another.
        Ok(Err(UpstreamError::RequestBody(error))) => {
            tracing::warn!(model = %route.name, %error, "streaming the request body upstream failed");
            Err(Failure::Final(GatewayError::UpstreamFailed(route.name.to_string())))
        }
        Ok(Err(error)) if error.is_connect() => {
            if error.is_egress_denied() {
                tracing::warn!(model = %route.name, %error, "upstream refused by the egress guard");
                return Err(Failure::TryNextBackend(GatewayError::EgressDenied(route.name.to_string())));
            }
            tracing::debug!(model = %route.name, %error, "upstream connect failed; trying the next");
            Err(Failure::TryNextBackend(GatewayError::UpstreamUnreachable(route.name.to_string())))
        }
        Ok(Err(error)) if in_flight.is_some() => {
            // Reset or closed before the response headers: with endpoints
            // another pod may answer (an URL backend keeps its old rule).
            tracing::debug!(model = %route.name, %error, "upstream failed before answering; trying another endpoint");
            Err(Failure::TryNextBackend(GatewayError::UpstreamFailed(route.name.to_string())))
        }
        Ok(Err(error)) => {
            tracing::warn!(model = %route.name, %error, "upstream request failed");
            Err(Failure::Final(GatewayError::UpstreamFailed(route.name.to_string())))
        }
        Err(_) => Err(Failure::Final(GatewayError::UpstreamTimeout(route.name.to_string()))),
    }
}

/// The upstream request; `None` only if the client's query string does not
/// form a valid URI with the backend's path.
///
/// The gateway's own fields (`Host`, `Content-Length`, `X-Request-Id`,
/// `X-Forwarded-*`) replace any of the same name, and the backend's
/// configured headers replace the client's.
fn build_request(
    route: &Route,
    backend: &Backend,
    authority: http::uri::Authority,
    outgoing: &Outgoing<'_>,
    traced: Option<&crate::telemetry::Upstream>,
) -> Option<UpstreamRequest> {
    let extra = &route.forward_headers;
    let plan = outgoing.plan_on(backend);
    let path = backend.paths.get(plan.upstream_endpoint(outgoing.endpoint))?;
    let form = crate::dialect::APIS[outgoing.endpoint].form;
    let form_type = if form { Some(super::form::upstream_content_type(outgoing.headers)?) } else { None };
    // The backend's own query (Azure's `api-version`) comes first, then the
    // client's parameters the model forwards; the rest of the client's
    // query is dropped (it could reach another upstream endpoint's options).
    let joined;
    let forwarded = outgoing.query.map(|query| forwarded_query(query, &route.forward_query)).unwrap_or_default();
    let target = match (forwarded.is_empty(), path.query()) {
        (true, _) => path.as_str(),
        (false, own) => {
            let text = match own {
                None => format!("{}?{forwarded}", path.path()),
                Some(own) => format!("{}?{own}&{forwarded}", path.path()),
            };
            joined = PathAndQuery::try_from(text).ok()?;
            joined.as_str()
        }
    };
    let translated = outgoing.translated.and_then(|bodies| bodies.body_for(plan, backend.model_json.as_ref()));
    let body = match (translated, &backend.model_json) {
        (Some(body), _) => body,
        (None, Some(model)) if form => {
            rewrite(outgoing.body, outgoing.model_span.clone(), &super::form::model_text(model)?)
        }
        (None, Some(model)) => rewrite(outgoing.body, outgoing.model_span.clone(), model),
        (None, None) => outgoing.body.clone(),
    };
    let tls = backend.scheme == http::uri::Scheme::HTTPS;
    let mut head = UpstreamRequest::build(outgoing.method, tls, authority, target, body);
    if !backend.guarded {
        head.for_own_service();
    }
    if let Some(streamed) = outgoing.streamed {
        head.with_rest(streamed.rest.clone());
    }
    let stamped =
        |name: &HeaderName| outgoing.inference.is_some() && (FAIRNESS_ID.contains(name) || OBJECTIVE.contains(name));
    for (name, value) in outgoing.headers {
        if (forwardable(name) || (extra.allows(name.as_str()) && !is_client_credential(name)))
            && !traced.is_some_and(|t| name == TRACEPARENT || name == TRACESTATE || (name == BAGGAGE && !t.trusted))
            && !backend.headers.contains_key(name)
            && !is_set_by_gateway(name)
            && !is_picker_header(name)
            && !(form && name == header::CONTENT_TYPE)
        {
            head.header(name, value);
        }
    }
    if let Some(form_type) = &form_type {
        head.header(&header::CONTENT_TYPE, form_type);
    }
    // A chat client's request sent as Messages needs the version header a
    // chat client never sends (a credential of Anthropic's style sets it).
    if plan == Plan::ChatOnMessages
        && !backend.headers.contains_key(&ANTHROPIC_VERSION)
        && !outgoing.headers.contains_key(&ANTHROPIC_VERSION)
    {
        head.header(&ANTHROPIC_VERSION, &DEFAULT_ANTHROPIC_VERSION);
    }
    // One value per name: the snapshot inserts them.
    for (name, value) in &backend.headers {
        if !is_set_by_gateway(name) && !stamped(name) {
            head.header(name, value);
        }
    }
    if let Some(inference) = &outgoing.inference {
        // Namespaces and class names are DNS labels: valid header values.
        for (names, value) in [(&FAIRNESS_ID, inference.fairness_id), (&OBJECTIVE, inference.objective)] {
            if let Ok(value) = HeaderValue::from_str(value) {
                for name in names {
                    head.header(name, &value);
                }
            }
        }
    }
    if let Some(traced) = traced {
        // This attempt's span is the upstream's parent.
        head.line(&traced.traceparent_line());
        if let Some(state) = &traced.tracestate {
            head.header(&TRACESTATE, state);
        }
    }
    head.header(&header::HOST, &backend.host);
    head.header(&REQUEST_ID, outgoing.request_id);
    // Set by the gateway, never taken from the client: a client's own
    // X-Forwarded-For would let it pose as another address upstream.
    head.header(&FORWARDED_FOR, &outgoing.client.forwarded_for);
    head.header(&FORWARDED_PROTO, &outgoing.client.forwarded_proto);
    Some(head.finish())
}

/// `body` with the bytes at `span` replaced by `model` (a JSON string).
fn rewrite(body: &Bytes, span: std::ops::Range<usize>, model: &Bytes) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len() - span.len() + model.len());
    out.extend_from_slice(&body[..span.start]);
    out.extend_from_slice(model);
    out.extend_from_slice(&body[span.end..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_the_model() {
        let body = Bytes::from_static(br#"{"model":"llama3","messages":[]}"#);
        let rewritten = rewrite(&body, 9..17, &Bytes::from_static(br#""meta/Llama-3""#));
        assert_eq!(&rewritten[..], br#"{"model":"meta/Llama-3","messages":[]}"#);
    }

    /// The client's allowed headers go up, unless the backend configures
    /// the same name or the gateway sets it; the gateway's own fields
    /// appear once, with its values.
    #[test]
    fn the_gateway_and_the_backend_have_the_last_word_on_each_header() {
        let config: waycast_crds::config::GatewayConfig = serde_json::from_value(serde_json::json!({
            "apiVersion": "waycast.dev/config-v1",
            "models": [{
                "name": "m",
                "forwardHeaders": ["x-session", "x-team"],
                "forwardQueryParameters": ["trace"],
                "backends": [{"url": "https://up.example:8443/v1?api-version=7", "headers": {"x-team": "from-config"}}]
            }],
            "keys": []
        }))
        .unwrap();
        let snapshot = crate::snapshot::Snapshot::standalone(&config, "h".into()).unwrap();
        let route = snapshot.route(0);
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/json"),
            ("x-team", "from-client"),
            ("x-request-id", "client-chosen"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-session", "s1"),
            ("authorization", "Bearer wc_secret"),
            ("cookie", "c=1"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        let body = Bytes::from_static(br#"{"model":"m"}"#);
        let client = super::super::connection::Client {
            forwarded_for: HeaderValue::from_static("10.1.2.3"),
            forwarded_proto: HeaderValue::from_static("http"),
            activity: Default::default(),
        };
        let request_id = HeaderValue::from_static("gw-1");
        let outgoing = Outgoing {
            method: &Method::POST,
            endpoint: 0,
            query: Some("trace=1&redirect=http://elsewhere&trace2=x&trace=2;redirect=x"),
            headers: &headers,
            body: &body,
            model_span: 9..12,
            request_id: &request_id,
            client: &client,
            affinity: None,
            inference: None,
            translated: None,
            streamed: None,
        };
        let backend = &route.backends[0];
        let request = build_request(route, backend, backend.authority.clone(), &outgoing, None).unwrap();
        let wire = String::from_utf8(request.wire().to_vec()).unwrap();
        let (head, sent_body) = wire.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        assert_eq!(lines.next(), Some("POST /v1/chat/completions?api-version=7&trace=1 HTTP/1.1"));
        let mut fields: Vec<&str> = lines.collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "content-length: 13",
                "content-type: application/json",
                "host: up.example:8443",
                "x-forwarded-for: 10.1.2.3",
                "x-forwarded-proto: http",
                "x-request-id: gw-1",
                "x-session: s1",
                "x-team: from-config",
            ]
        );
        assert_eq!(sent_body, r#"{"model":"m"}"#);
    }

    #[test]
    fn only_what_an_inference_api_reads_goes_upstream() {
        for name in [
            "authorization",
            "x-api-key",
            "api-key",
            "cookie",
            "x-forwarded-for",
            "forwarded",
            "connection",
            "keep-alive",
            "transfer-encoding",
            "host",
            "te",
            "upgrade",
            "accept-encoding",
            "x-request-id",
            "x-custom-hop",
        ] {
            assert!(!forwardable(&HeaderName::from_static(name)), "{name}");
        }
        for name in ["openai-organization", "openai-project", "anthropic-beta", "openai-anything-new"] {
            assert!(!forwardable(&HeaderName::from_static(name)), "{name}: the platform pays for what it picks");
        }
        for name in [
            "content-type",
            "accept",
            "anthropic-version",
            "openai-beta",
            "user-agent",
            "x-stainless-lang",
            "traceparent",
        ] {
            assert!(forwardable(&HeaderName::from_static(name)), "{name}");
        }
    }
}
