//! What a fetched document must be before it is kept, pure: a key set
//! (bounded, at least one signing key the gateway could verify with), a
//! discovery document (its `issuer` the one configured, its `jwks_uri`
//! `https`), and the refresh interval a response's `Cache-Control` allows.
//!
//! NB: the gateway reads a key set again, key by key (`gateway`'s
//! `identity::keys`), and skips what it cannot verify with; the check here
//! only keeps a document that is no key set at all (an error page, an
//! encryption-only set) from replacing a good one.

use std::time::Duration;

use serde::Deserialize;
use waycast_crds::identity_config::{MAX_KEY_SET_BYTES, https_url_problem};

/// The most entries a key set may list (as the gateway reads it).
pub const MAX_KEYS: usize = 64;
/// The largest discovery document read.
pub const MAX_DISCOVERY_BYTES: usize = 64 * 1024;
/// How often a key set is fetched again when its server says nothing
/// sooner: a rotation at the provider is served within twice this.
pub const REFRESH: Duration = Duration::from_secs(30);
/// The soonest a key set is fetched again, whatever its server says; also
/// how soon a failed fetch is tried again.
pub const MIN_REFRESH: Duration = Duration::from_secs(10);

/// Why a document is not kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// Larger than its bound.
    #[error("the document is {0} bytes, more than the {1} read")]
    TooLarge(usize, usize),
    /// Not UTF-8 JSON of the expected shape.
    #[error("not a {0}: {1}")]
    Malformed(&'static str, String),
    /// More than [`MAX_KEYS`] entries.
    #[error("the key set lists {0} keys, more than the {MAX_KEYS} read")]
    TooManyKeys(usize),
    /// No entry is a signing key.
    #[error("the key set has no signing key (kty RSA, EC or OKP, with use absent or \"sig\")")]
    NoSigningKey,
    /// The discovery document names another issuer.
    #[error("the discovery document's issuer {found:?} is not the configured issuer {configured:?}")]
    IssuerMismatch {
        /// As configured.
        configured: String,
        /// As the document says (cut to 256 bytes).
        found: String,
    },
    /// The discovery document's `jwks_uri` is not an `https` URL.
    #[error("the discovery document's jwks_uri {0}")]
    JwksUri(&'static str),
}

#[derive(Deserialize)]
struct KeySetShape {
    keys: Vec<serde_json::Value>,
}

/// The signing keys `document` lists, when it is a key set to keep: at
/// most [`MAX_KEY_SET_BYTES`] of UTF-8 JSON, an object with a `keys` array
/// of at most [`MAX_KEYS`] entries, at least one of which has `kty` RSA, EC
/// or OKP and `use` absent or `sig`.
///
/// # Errors
/// [`DocumentError`] saying which rule it breaks.
pub fn signing_keys(document: &[u8]) -> Result<usize, DocumentError> {
    if document.len() > MAX_KEY_SET_BYTES {
        return Err(DocumentError::TooLarge(document.len(), MAX_KEY_SET_BYTES));
    }
    let text = std::str::from_utf8(document).map_err(|e| DocumentError::Malformed("key set", e.to_string()))?;
    let shape: KeySetShape =
        serde_json::from_str(text).map_err(|e| DocumentError::Malformed("key set", e.to_string()))?;
    if shape.keys.len() > MAX_KEYS {
        return Err(DocumentError::TooManyKeys(shape.keys.len()));
    }
    let signing = shape.keys.iter().filter(|key| is_signing_key(key)).count();
    if signing == 0 {
        return Err(DocumentError::NoSigningKey);
    }
    Ok(signing)
}

fn is_signing_key(key: &serde_json::Value) -> bool {
    let kty = key.get("kty").and_then(serde_json::Value::as_str);
    let intended = key.get("use");
    matches!(kty, Some("RSA" | "EC" | "OKP")) && intended.is_none_or(|intended| intended.as_str() == Some("sig"))
}

#[derive(Deserialize)]
struct DiscoveryShape {
    issuer: String,
    jwks_uri: String,
}

#[derive(Deserialize)]
struct IssuerShape {
    issuer: String,
}

/// The `jwks_uri` of a discovery document fetched for `issuer`: its
/// `issuer` must be `issuer` exactly (OpenID Connect Discovery 1.0 §4.3:
/// else a document served elsewhere could name keys for this issuer), and
/// its `jwks_uri` an `https` URL.
///
/// # Errors
/// [`DocumentError`] saying which rule it breaks.
pub fn jwks_uri(document: &[u8], issuer: &str) -> Result<String, DocumentError> {
    if document.len() > MAX_DISCOVERY_BYTES {
        return Err(DocumentError::TooLarge(document.len(), MAX_DISCOVERY_BYTES));
    }
    let shape: DiscoveryShape =
        serde_json::from_slice(document).map_err(|e| DocumentError::Malformed("discovery document", e.to_string()))?;
    if shape.issuer != issuer {
        let found = cut(&shape.issuer, 256).to_owned();
        return Err(DocumentError::IssuerMismatch { configured: issuer.to_owned(), found });
    }
    if let Some(problem) = https_url_problem(&shape.jwks_uri, true) {
        return Err(DocumentError::JwksUri(problem));
    }
    Ok(shape.jwks_uri)
}

/// The issuer a discovery document names: the API server's, trusted as
/// it says (it is the one that signs the cluster's ServiceAccount tokens).
///
/// # Errors
/// [`DocumentError::Malformed`] when it names none, or one over 2048 bytes.
pub fn issuer(document: &[u8]) -> Result<String, DocumentError> {
    if document.len() > MAX_DISCOVERY_BYTES {
        return Err(DocumentError::TooLarge(document.len(), MAX_DISCOVERY_BYTES));
    }
    let shape: IssuerShape =
        serde_json::from_slice(document).map_err(|e| DocumentError::Malformed("discovery document", e.to_string()))?;
    if shape.issuer.is_empty() || shape.issuer.len() > 2048 {
        return Err(DocumentError::Malformed("discovery document", "an issuer of 1 to 2048 bytes".into()));
    }
    Ok(shape.issuer)
}

/// The discovery URL of `issuer` (OpenID Connect Discovery 1.0 §4: a
/// trailing `/` of the issuer is not doubled).
pub fn discovery_url(issuer: &str) -> String {
    format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'))
}

/// How long until a key set is fetched again, given the `Cache-Control`
/// its server sent: [`REFRESH`], or sooner when `max-age` says so
/// (`no-cache` and `no-store` count as `max-age=0`), never sooner than
/// [`MIN_REFRESH`]. A longer `max-age` is not honoured: a rotation must be
/// served within a minute.
pub fn refresh_after(cache_control: Option<&str>) -> Duration {
    let max_age = cache_control.into_iter().flat_map(|value| value.split(',')).find_map(|directive| {
        let directive = directive.trim();
        let lower = directive.to_ascii_lowercase();
        if lower == "no-cache" || lower == "no-store" {
            return Some(0);
        }
        let value = lower.strip_prefix("max-age=")?;
        // A quoted value is allowed (RFC 9111 §5.2); an unreadable one is
        // ignored.
        value.trim_matches('"').parse::<u64>().ok()
    });
    max_age.map_or(REFRESH, |seconds| Duration::from_secs(seconds).clamp(MIN_REFRESH, REFRESH))
}

/// `text` cut to at most `limit` bytes, at a character boundary.
pub fn cut(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
