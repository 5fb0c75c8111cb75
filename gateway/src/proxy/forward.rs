//! Sending a request upstream: pooled hyper client, header hygiene, model
//! rewrite, failover to the next backend on connect failure, and the
//! first-byte timeout. No total-duration timeout exists anywhere.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;

use crate::error::GatewayError;
use crate::snapshot::{Backend, Route};
use crate::upstream::egress::egress_denied;

/// What the upstream answered.
pub struct Forwarded {
    /// Its response; the body is still streaming.
    pub response: Response<Incoming>,
    /// When the request was handed to the client.
    pub sent_at: Instant,
    /// When the response headers arrived.
    pub headers_at: Instant,
}

/// What `send` needs from the client's request.
pub struct Outgoing<'a> {
    /// Method.
    pub method: &'a Method,
    /// Which of [`crate::snapshot::PROXIED_PATHS`] was asked for.
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
    pub client: &'a super::Client,
}

/// Sends the request to the route's backends in failover order.
///
/// # Errors
/// 502 when no backend accepts a connection or one fails after connecting;
/// 504 when none answers within the first-byte timeout.
pub async fn send(route: &Route, outgoing: &Outgoing<'_>) -> Result<Forwarded, GatewayError> {
    let mut last_error = None;
    for index in route.backend_order() {
        let backend = &route.backends[index];
        let request = build_request(backend, &route.forward_headers, outgoing)
            .ok_or_else(|| GatewayError::UpstreamFailed(route.name.to_string()))?;
        let sent_at = Instant::now();
        match tokio::time::timeout(route.timeouts.first_byte, route.client.request(request)).await {
            Ok(Ok(response)) => {
                return Ok(Forwarded { response, sent_at, headers_at: Instant::now() });
            }
            Ok(Err(error)) if error.is_connect() => {
                if egress_denied(&error) {
                    tracing::warn!(model = %route.name, backend = index, %error, "upstream refused by the egress guard");
                    last_error = Some(GatewayError::EgressDenied(route.name.to_string()));
                    continue;
                }
                tracing::debug!(model = %route.name, backend = index, %error, "upstream connect failed; trying the next backend");
                last_error = Some(GatewayError::UpstreamUnreachable(route.name.to_string()));
            }
            Ok(Err(error)) => {
                tracing::warn!(model = %route.name, backend = index, %error, "upstream request failed");
                return Err(GatewayError::UpstreamFailed(route.name.to_string()));
            }
            Err(_) => return Err(GatewayError::UpstreamTimeout(route.name.to_string())),
        }
    }
    Err(last_error.unwrap_or_else(|| GatewayError::UpstreamUnreachable(route.name.to_string())))
}

/// The upstream request; `None` only if the client's query string does not
/// form a valid URI with the backend's path.
fn build_request(
    backend: &Backend,
    extra: &crate::snapshot::ForwardHeaders,
    outgoing: &Outgoing<'_>,
) -> Option<Request<Full<Bytes>>> {
    let path = backend.paths.get(outgoing.endpoint)?;
    // The backend's own query (Azure's `api-version`) comes first, then the
    // client's.
    let path = match (outgoing.query, path.query()) {
        (None, _) => path.clone(),
        (Some(query), None) => PathAndQuery::try_from(format!("{}?{query}", path.path())).ok()?,
        (Some(query), Some(own)) => PathAndQuery::try_from(format!("{}?{own}&{query}", path.path())).ok()?,
    };
    let uri = Uri::builder()
        .scheme(backend.scheme.clone())
        .authority(backend.authority.clone())
        .path_and_query(path)
        .build()
        .ok()?;
    let body = match &backend.model_json {
        Some(model) => rewrite(outgoing.body, outgoing.model_span.clone(), model),
        None => outgoing.body.clone(),
    };
    let mut headers = HeaderMap::with_capacity(outgoing.headers.len() + backend.headers.len() + 2);
    for (name, value) in outgoing.headers {
        if forwardable(name) || (extra.allows(name.as_str()) && !is_client_credential(name)) {
            headers.append(name.clone(), value.clone());
        }
    }
    for (name, value) in &backend.headers {
        headers.insert(name.clone(), value.clone());
    }
    headers.insert(header::HOST, backend.host.clone());
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    headers.insert(REQUEST_ID.clone(), outgoing.request_id.clone());
    // Set by the gateway, never taken from the client: a client's own
    // X-Forwarded-For would let it pose as another address upstream.
    headers.insert(FORWARDED_FOR.clone(), outgoing.client.forwarded_for.clone());
    headers.insert(FORWARDED_PROTO.clone(), outgoing.client.forwarded_proto.clone());
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = outgoing.method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Some(request)
}

/// `X-Request-Id`.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

static FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Whether a client header may go upstream: an allow-list of what an
/// inference API reads (content negotiation, the SDKs' own `openai-*`,
/// `anthropic-*` and `x-stainless-*` headers, trace context). Everything
/// else stays behind — the client's credentials (`Authorization`,
/// `x-api-key`, Azure's `api-key`), cookies, its own `X-Forwarded-*`,
/// hop-by-hop headers and whatever `Connection` names — and
/// `Accept-Encoding` too: a compressed response would hide its usage.
fn forwardable(name: &HeaderName) -> bool {
    let name = name.as_str();
    matches!(name, "content-type" | "accept" | "user-agent" | "traceparent" | "tracestate" | "baggage")
        || name.starts_with("openai-")
        || name.starts_with("anthropic-")
        || name.starts_with("x-stainless-")
}

/// The client's own credentials: never forwarded, whatever a model allows
/// (its validation refuses such patterns too).
fn is_client_credential(name: &HeaderName) -> bool {
    waycast_crds::common::CLIENT_CREDENTIAL_HEADERS.contains(&name.as_str())
}

/// Whether an upstream response header may go back to the client.
pub fn returnable(name: &HeaderName) -> bool {
    !(name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == "keep-alive"
        || name == "proxy-connection"
        || name == header::TE
        || name == header::TRAILER
        || name == header::UPGRADE)
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
        for name in [
            "content-type",
            "accept",
            "anthropic-version",
            "openai-beta",
            "openai-organization",
            "user-agent",
            "x-stainless-lang",
            "traceparent",
        ] {
            assert!(forwardable(&HeaderName::from_static(name)), "{name}");
        }
    }
}
