//! Which headers go upstream and back, and which query parameters: the
//! client's are allowed by name, the gateway's own are set by it alone.

use http::header::{self, HeaderName, HeaderValue};

use crate::request_id::REQUEST_ID;

/// The `name=value` pairs of `query` whose name is in `allowed`, in order.
pub(super) fn forwarded_query(query: &str, allowed: &[String]) -> String {
    if allowed.is_empty() {
        return String::new();
    }
    let kept: Vec<&str> = query
        .split('&')
        // NB: a `;` is a separator to some servers (Rack, older Python):
        // a pair holding one could smuggle a parameter past the list.
        .filter(|pair| !pair.contains(';'))
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
            allowed.iter().any(|allowed| allowed == name)
        })
        .collect();
    kept.join("&")
}

/// The fields [`build_request`] sets itself.
pub(super) fn is_set_by_gateway(name: &HeaderName) -> bool {
    name == header::HOST
        || name == header::CONTENT_LENGTH
        || name == REQUEST_ID
        || name == FORWARDED_FOR
        || name == FORWARDED_PROTO
}

pub(super) static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub(super) static ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
pub(super) static DEFAULT_ANTHROPIC_VERSION: HeaderValue = HeaderValue::from_static("2023-06-01");
pub(super) static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
pub(super) static BAGGAGE: HeaderName = HeaderName::from_static("baggage");
pub(super) static FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(super) static FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Whether a client header may go upstream: an allow-list of what an
/// inference API reads (content negotiation, the protocol versions of
/// `waycast_crds::common::PROVIDER_PROTOCOL_HEADERS`, the SDKs'
/// `x-stainless-*`, trace context). Everything else stays behind unless the
/// model forwards it — the headers that choose what a provider bills
/// (`openai-organization`, `openai-project`, `anthropic-beta`), the
/// client's credentials (`Authorization`, `x-api-key`, Azure's `api-key`),
/// cookies, its own `X-Forwarded-*`, hop-by-hop headers and whatever
/// `Connection` names — and `Accept-Encoding` too: a compressed response
/// would hide its usage.
pub(super) fn forwardable(name: &HeaderName) -> bool {
    let name = name.as_str();
    matches!(name, "content-type" | "accept" | "user-agent" | "traceparent" | "tracestate" | "baggage")
        || waycast_crds::common::PROVIDER_PROTOCOL_HEADERS.contains(&name)
        || name.starts_with("x-stainless-")
}

/// Whether a header is one an endpoint picker reads: never the client's,
/// whatever the model forwards (stamped by the gateway when the Gateway
/// says so).
pub(super) fn is_picker_header(name: &HeaderName) -> bool {
    waycast_crds::common::PICKER_HEADER_PREFIXES.iter().any(|prefix| name.as_str().starts_with(prefix))
}

/// The client's own credentials: never forwarded, whatever a model allows
/// (its validation refuses such patterns too).
pub(super) fn is_client_credential(name: &HeaderName) -> bool {
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
