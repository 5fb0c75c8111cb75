//! The endpoints document: the ready addresses of the Services a Gateway's
//! config routes to, kept apart from the config so that pod churn never
//! rewrites the config Secret (430 KB at 10,000 keys). The operator writes
//! one per Gateway; a standalone gateway can read one from a file.
//!
//! ```json
//! {"apiVersion": "waycast.dev/endpoints-v1",
//!  "services": {"models/vllm:8000": ["10.1.0.7:8000", "10.1.0.9:8000"]}}
//! ```
//!
//! A key is what a backend's `endpoints` names (`namespace/name:port`).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The only `apiVersion` of an endpoints document.
pub const ENDPOINTS_API_VERSION: &str = "waycast.dev/endpoints-v1";
/// The data key holding the document in its ConfigMap.
pub const ENDPOINTS_DATA_KEY: &str = "endpoints.json";
/// The most addresses one Service may list (a bound on what one document
/// can make the gateway hold).
pub const MAX_ADDRESSES_PER_SERVICE: usize = 4096;
/// Most addresses in one document, over all its Services: with them it
/// stays far below what a ConfigMap holds (1 MiB), however many Services a
/// Gateway routes to.
pub const MAX_ADDRESSES_PER_DOCUMENT: usize = 16_384;

/// Ready addresses per Service.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointsDocument {
    /// Always [`ENDPOINTS_API_VERSION`].
    pub api_version: String,
    /// `namespace/name:port` → `ip:port` of each ready endpoint, sorted.
    #[serde(default)]
    pub services: BTreeMap<String, Vec<SocketAddr>>,
}

/// Why an endpoints document was refused.
#[derive(Debug, thiserror::Error)]
pub enum EndpointsError {
    /// Not JSON of the right shape.
    #[error("endpoints document: {0}")]
    Parse(#[from] serde_json::Error),
    /// Another `apiVersion`.
    #[error("endpoints document: apiVersion must be {ENDPOINTS_API_VERSION}, not {0:?}")]
    Version(String),
    /// A key that is not `namespace/name:port`.
    #[error("endpoints document: {0:?} is not namespace/name:port")]
    Key(String),
    /// Too many addresses for one Service.
    #[error("endpoints document: {0} lists more than {MAX_ADDRESSES_PER_SERVICE} addresses")]
    TooMany(String),
}

impl EndpointsDocument {
    /// An empty document of the current version.
    pub fn new() -> Self {
        Self { api_version: ENDPOINTS_API_VERSION.to_owned(), services: BTreeMap::new() }
    }

    /// Parses and checks a document.
    ///
    /// # Errors
    /// [`EndpointsError`] for bad JSON, another version, a malformed key or
    /// too many addresses.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, EndpointsError> {
        let document: Self = serde_json::from_slice(bytes)?;
        if document.api_version != ENDPOINTS_API_VERSION {
            return Err(EndpointsError::Version(document.api_version));
        }
        for (key, addresses) in &document.services {
            if parse_service_key(key).is_none() {
                return Err(EndpointsError::Key(key.clone()));
            }
            if addresses.len() > MAX_ADDRESSES_PER_SERVICE {
                return Err(EndpointsError::TooMany(key.clone()));
            }
        }
        Ok(document)
    }
}

/// `namespace/name:port` → its parts, when each is well formed (DNS labels,
/// a port from 1 to 65535).
pub fn parse_service_key(key: &str) -> Option<(&str, &str, u16)> {
    let (namespace, rest) = key.split_once('/')?;
    let (name, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let label = |text: &str| {
        !text.is_empty()
            && text.len() <= 63
            && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !text.starts_with('-')
            && !text.ends_with('-')
    };
    (label(namespace) && label(name)).then_some((namespace, name, port))
}

/// The key of Service `name` in `namespace` on `port`.
pub fn service_key(namespace: &str, name: &str, port: u16) -> String {
    format!("{namespace}/{name}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_documents_are_checked() {
        assert_eq!(parse_service_key("models/vllm:8000"), Some(("models", "vllm", 8000)));
        for bad in ["vllm:8000", "models/vllm", "models/vllm:0", "models/VLLM:80", "/vllm:80", "models/-x:80"] {
            assert_eq!(parse_service_key(bad), None, "{bad}");
        }
        let good = br#"{"apiVersion":"waycast.dev/endpoints-v1","services":{"models/vllm:8000":["10.1.0.7:8000"]}}"#;
        let document = EndpointsDocument::from_slice(good).unwrap();
        assert_eq!(document.services["models/vllm:8000"], ["10.1.0.7:8000".parse::<SocketAddr>().unwrap()]);
        let other_version = br#"{"apiVersion":"waycast.dev/endpoints-v2"}"#;
        assert!(matches!(EndpointsDocument::from_slice(other_version), Err(EndpointsError::Version(_))));
        let bad_key = br#"{"apiVersion":"waycast.dev/endpoints-v1","services":{"vllm":[]}}"#;
        assert!(matches!(EndpointsDocument::from_slice(bad_key), Err(EndpointsError::Key(_))));
        let not_an_address = br#"{"apiVersion":"waycast.dev/endpoints-v1","services":{"a/b:1":["host:80"]}}"#;
        assert!(EndpointsDocument::from_slice(not_an_address).is_err());
    }
}
