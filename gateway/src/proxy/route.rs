//! A request's fate, decided without I/O. Three steps, because the model is
//! named in the body and the body is read only once the key is known and
//! its request limit checked:
//!
//! ```text
//! endpoint(method, path)          → Endpoint         404 unknown path, 405 wrong method
//! admit(snapshot, headers, now)   → &KeyEntry        431/400 framing, 401 missing/unknown/disabled/expired key
//!   … key's request limit, body read, body scanned …
//! route(snapshot, key, model)     → Target           404 unknown (or not visible to the key), 403 not allowed
//! ```

use http::Method;
use http::header::{self, HeaderMap};

use super::auth;
use crate::dialect::{APIS, Dialect};
use crate::error::GatewayError;
use crate::snapshot::{KeyEntry, Route, Snapshot};

/// Largest total size of request headers accepted.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// What a path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// An inference call forwarded to the model's backend (an index into [`APIS`]).
    Proxy(usize),
    /// `GET /v1/models`.
    Models,
    /// `GET /v1/usage`: the key's budgets, what they spent and what is left.
    Usage,
    /// `GET /` or `HEAD /`: a client's check that the gateway is there
    /// (Claude Code's, before its first call), answered without a key.
    Root,
}

impl Endpoint {
    /// The endpoint at `path`, if any.
    pub fn of(path: &str) -> Option<Self> {
        match path {
            "/v1/models" => Some(Self::Models),
            "/v1/usage" => Some(Self::Usage),
            "/" => Some(Self::Root),
            _ => crate::dialect::api_at(path).map(Self::Proxy),
        }
    }

    /// Its path, as metrics and the access log name it.
    pub fn path(self) -> &'static str {
        match self {
            Self::Proxy(index) => APIS[index].path,
            Self::Models => "/v1/models",
            Self::Usage => "/v1/usage",
            Self::Root => "/",
        }
    }

    /// The dialect its requests, answers and errors are in (the gateway's
    /// own endpoints speak OpenAI's).
    pub fn dialect(self) -> Dialect {
        match self {
            Self::Proxy(index) => APIS[index].dialect,
            Self::Models | Self::Usage | Self::Root => Dialect::OpenAi,
        }
    }

    fn method(self) -> Method {
        if matches!(self, Self::Models | Self::Usage | Self::Root) { Method::GET } else { Method::POST }
    }
}

/// Whether no backend of `route` serves `APIS[endpoint]` (each speaks an
/// API without it: `crate::dialect::plan`).
pub fn offers_none(route: &Route, endpoint: usize) -> bool {
    use crate::dialect::plan::{Plan, plan};
    route.backends.iter().all(|backend| plan(endpoint, backend.format) == Plan::NotServed)
}

/// The endpoint a request asks for with its method.
///
/// # Errors
/// 404 for an unknown path, 405 for the wrong method.
pub fn endpoint(method: &Method, path: &str) -> Result<Endpoint, GatewayError> {
    let endpoint = Endpoint::of(path).ok_or_else(|| GatewayError::NotFound(truncated(path)))?;
    if *method != endpoint.method() && !(endpoint == Endpoint::Root && *method == Method::HEAD) {
        return Err(GatewayError::MethodNotAllowed);
    }
    Ok(endpoint)
}

/// Who sent a request whose headers are framed soundly.
///
/// # Errors
/// 431 for oversized headers, 400 for both Content-Length and
/// Transfer-Encoding (a smuggling shape), 401 for the key or token.
pub fn admit<'s>(
    snapshot: &'s Snapshot,
    headers: &HeaderMap,
    now: impl FnOnce() -> jiff::Timestamp,
) -> Result<auth::Caller<'s>, GatewayError> {
    check_framing(headers)?;
    auth::authenticate(snapshot, headers, now)
}

/// Where a request goes.
#[derive(Clone, Copy)]
pub struct Target<'s> {
    /// The route.
    pub route: &'s Route,
}

/// The route `key` may use for `model`: the name resolved in the key's
/// own namespace first, then among the platform's models, then among the
/// models it opted in to ([`Snapshot::resolve`]).
///
/// # Errors
/// 404 when no route has that name — or the key's namespace may not see it,
/// or it is another team's that the key did not opt in to: the same answer,
/// so keys cannot probe other teams' model names; 403 when the key's
/// allow-list leaves it out.
pub fn route<'s>(snapshot: &'s Snapshot, key: &KeyEntry, model: &str) -> Result<Target<'s>, GatewayError> {
    let index = snapshot.resolve(key, model).ok_or_else(|| GatewayError::UnknownModel(truncated(model)))?;
    if !key.allows(index) {
        return Err(GatewayError::ModelNotAllowed(truncated(model)));
    }
    Ok(Target { route: snapshot.route(index) })
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

/// User text in error messages is capped, so a 1 MB model name does not
/// come back as a 1 MB error.
pub fn truncated(text: &str) -> String {
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
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use http::HeaderValue;
    use waycast_crds::config::{GatewayConfig, KeyConfig, ModelConfig};

    use super::*;

    #[test]
    fn endpoint_table() {
        let rows: [(&Method, &str, Result<Endpoint, u16>); 11] = [
            (&Method::POST, "/v1/chat/completions", Ok(Endpoint::Proxy(0))),
            (&Method::POST, "/v1/messages", Ok(Endpoint::Proxy(4))),
            (&Method::GET, "/v1/models", Ok(Endpoint::Models)),
            (&Method::GET, "/v1/chat/completions", Err(405)),
            (&Method::POST, "/v1/models", Err(405)),
            (&Method::POST, "/v1/chat/completions/", Err(404)),
            (&Method::GET, "/admin", Err(404)),
            (&Method::POST, "", Err(404)),
            (&Method::HEAD, "/", Ok(Endpoint::Root)),
            (&Method::GET, "/", Ok(Endpoint::Root)),
            (&Method::POST, "/", Err(405)),
        ];
        for (method, path, expected) in rows {
            let got = endpoint(method, path).map_err(|e| e.status().as_u16());
            assert_eq!(got, expected, "{method} {path:?}");
        }
        assert_eq!(Endpoint::Proxy(1).path(), "/v1/completions");
    }

    const ALICE: &str = "wc_alice";
    const BOB: &str = "wc_bob";

    /// Models `open`, `mine` (seen only by team-a) and `other`; Alice
    /// (team-a) may use `open` and `mine`, Bob (team-b) every model he sees.
    fn snapshot() -> Snapshot {
        let model = |name: &str, namespaces: Option<Vec<String>>| {
            let mut model = ModelConfig::to(name, "http://10.0.0.1/v1");
            model.key_namespaces = namespaces;
            model
        };
        let key = |id: &str, text: &str, models: Option<Vec<String>>| {
            let mut key = KeyConfig::new(id, waycast_crds::digest::sha256_hex(text.as_bytes()));
            key.models = models;
            key
        };
        let config = GatewayConfig {
            models: vec![model("open", None), model("mine", Some(vec!["team-a".into()])), model("other", None)],
            keys: vec![
                key("team-a/alice", ALICE, Some(vec!["open".into(), "mine".into()])),
                key("team-b/bob", BOB, None),
            ],
            ..GatewayConfig::empty()
        };
        Snapshot::standalone(&config, "test".into()).unwrap()
    }

    fn headers(key: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = key {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {key}")).unwrap());
        }
        headers
    }

    #[test]
    fn admit_table() {
        let snapshot = snapshot();
        let now = || jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut ambiguous = headers(Some(ALICE));
        ambiguous.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        ambiguous.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        let mut oversized = headers(Some(ALICE));
        oversized.insert("x-big", HeaderValue::from_str(&"a".repeat(MAX_HEADER_BYTES)).unwrap());
        let rows: [(&str, HeaderMap, Result<&str, u16>); 5] = [
            ("a known key", headers(Some(ALICE)), Ok("team-a/alice")),
            ("no key", headers(None), Err(401)),
            ("an unknown key", headers(Some("wc_nobody")), Err(401)),
            ("both lengths", ambiguous, Err(400)),
            ("oversized headers", oversized, Err(431)),
        ];
        for (name, headers, expected) in rows {
            let got = admit(&snapshot, &headers, now).map(|caller| &*caller.key.id).map_err(|e| e.status().as_u16());
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn route_table() {
        let snapshot = snapshot();
        let now = || jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let alice = admit(&snapshot, &headers(Some(ALICE)), now).unwrap().key;
        let bob = admit(&snapshot, &headers(Some(BOB)), now).unwrap().key;
        type Row<'a> = (&'a KeyEntry, &'a str, Result<&'a str, (u16, &'a str)>);
        let rows: [Row<'_>; 6] = [
            (alice, "open", Ok("open")),
            (alice, "mine", Ok("mine")),
            (alice, "other", Err((403, "model_not_allowed"))),
            (bob, "other", Ok("other")),
            // Not visible to team-b: the same 404 as a model that does not exist.
            (bob, "mine", Err((404, "model_not_found"))),
            (bob, "nonexistent", Err((404, "model_not_found"))),
        ];
        for (key, model, expected) in rows {
            let got = route(&snapshot, key, model)
                .map(|target| &*target.route.name)
                .map_err(|e| (e.status().as_u16(), e.code()));
            assert_eq!(got, expected, "{} → {model}", key.id);
        }
        let long = "é".repeat(200);
        let message = route(&snapshot, alice, &long).err().unwrap().to_string();
        assert!(message.len() < 200 && message.contains('…'), "{message}");
    }
}
