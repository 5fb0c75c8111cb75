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

/// Why a document is not kept. NB: the text goes to the Gateway's status
/// and Events, so it is ours alone: it never quotes the document (serde's
/// messages do: `invalid type: string "…"`), only says where reading
/// stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// Larger than its bound.
    #[error("the document is {0} bytes, more than the {1} read")]
    TooLarge(usize, usize),
    /// Not UTF-8 JSON of the expected shape.
    #[error("not a {what}: {problem}{}", at_byte(*.at))]
    Malformed {
        /// What it should have been.
        what: &'static str,
        /// What it is instead, in our words.
        problem: &'static str,
        /// The byte where reading stopped, when known.
        at: Option<usize>,
    },
    /// More than [`MAX_KEYS`] entries.
    #[error("the key set lists {0} keys, more than the {MAX_KEYS} read")]
    TooManyKeys(usize),
    /// No entry is a signing key.
    #[error("the key set has no signing key (kty RSA, EC or OKP, with use absent or \"sig\")")]
    NoSigningKey,
    /// The discovery document names another issuer (not quoted: only
    /// where the two first differ).
    #[error(
        "the discovery document names another issuer than the configured {configured:?} (its {found_bytes} bytes differ from byte {differs_at})"
    )]
    IssuerMismatch {
        /// As configured.
        configured: String,
        /// The length of the issuer the document names.
        found_bytes: usize,
        /// The first byte at which the two differ.
        differs_at: usize,
    },
    /// The discovery document's `jwks_uri` is not an `https` URL.
    #[error("the discovery document's jwks_uri {0}")]
    JwksUri(&'static str),
}

fn at_byte(at: Option<usize>) -> String {
    at.map(|at| format!(" (at byte {at})")).unwrap_or_default()
}

/// `document` refused as no `what`, for `error`: whether it is no JSON at
/// all or JSON of another shape, and the byte where serde stopped —
/// never serde's own text, which quotes what it read.
fn malformed(what: &'static str, document: &[u8], error: &serde_json::Error) -> DocumentError {
    let problem = match error.classify() {
        serde_json::error::Category::Data => "JSON of another shape",
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof | serde_json::error::Category::Io => {
            "not JSON"
        }
    };
    // serde counts lines from 1 and columns in bytes from 1; line 0: no
    // position.
    let at = (error.line() > 0).then(|| {
        let before: usize =
            document.split(|byte| *byte == b'\n').take(error.line() - 1).map(|line| line.len() + 1).sum();
        (before + error.column().saturating_sub(1)).min(document.len())
    });
    DocumentError::Malformed { what, problem, at }
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
    let text = std::str::from_utf8(document).map_err(|e| DocumentError::Malformed {
        what: "key set",
        problem: "not UTF-8",
        at: Some(e.valid_up_to()),
    })?;
    let shape: KeySetShape = serde_json::from_str(text).map_err(|e| malformed("key set", document, &e))?;
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
        serde_json::from_slice(document).map_err(|e| malformed("discovery document", document, &e))?;
    if shape.issuer != issuer {
        let differs_at = shape.issuer.bytes().zip(issuer.bytes()).take_while(|(a, b)| a == b).count();
        return Err(DocumentError::IssuerMismatch {
            configured: issuer.to_owned(),
            found_bytes: shape.issuer.len(),
            differs_at,
        });
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
        serde_json::from_slice(document).map_err(|e| malformed("discovery document", document, &e))?;
    if shape.issuer.is_empty() || shape.issuer.len() > 2048 {
        return Err(DocumentError::Malformed {
            what: "discovery document",
            problem: "its issuer is not of 1 to 2048 bytes",
            at: None,
        });
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
