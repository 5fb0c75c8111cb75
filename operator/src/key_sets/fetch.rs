//! The fetches, each bounded: `https` only for remote sources (rustls, the
//! public web PKI roots or the provider's CA bundle), 10 s per request, a
//! body of at most 64 KiB, redirects not followed, `If-None-Match` when the
//! last answer had an `ETag`. The API server's own documents go through the
//! operator's kube client (its credentials and CA); ConfigMaps are read
//! through the kube API.
//!
//! ```text
//! Discovery: GET <issuer>/.well-known/openid-configuration ─► jwks_uri (issuer checked) ─► GET jwks_uri
//! JwksUri:   GET uri
//! Cluster:   kube GET /openid/v1/jwks      (the issuer: kube GET /.well-known/openid-configuration)
//! ConfigMap: kube GET configmaps/<name>, data[<key>]
//! ```
//!
//! Nothing here decides what is kept: an answer goes back as an
//! [`Answer`], and `slot::settle` decides.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use waycast_crds::identity::ConfigMapKeyRef;
use waycast_crds::identity_config::MAX_KEY_SET_BYTES;

use super::document::{self, DocumentError, MAX_DISCOVERY_BYTES};
use crate::compile::key_source::KeySource;

/// The longest one request may take, answer read included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest CA bundle read from a ConfigMap.
const MAX_CA_BYTES: usize = 256 * 1024;
/// The most of a URL an error shows.
pub const MAX_URL_SHOWN: usize = 256;
/// The most of a library's reason (hyper, rustls, kube) an error shows.
pub const MAX_REASON_SHOWN: usize = 256;

/// `url` as an error shows it: cut to [`MAX_URL_SHOWN`] bytes.
pub fn shown(url: &str) -> String {
    cut_marked(url, MAX_URL_SHOWN)
}

/// `text` cut to `limit` bytes, `…` marking a cut.
fn cut_marked(text: &str, limit: usize) -> String {
    let kept = document::cut(text, limit);
    if kept.len() < text.len() { format!("{kept}…") } else { kept.to_owned() }
}

/// Why a fetch brought no document. The text goes to the Gateway's status
/// and Events: it names the URL or object (a URL cut to [`MAX_URL_SHOWN`]
/// bytes: a `jwks_uri` is the discovery document's), never a document's
/// content; a library's reason is cut to [`MAX_REASON_SHOWN`].
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No connection or no answer: DNS, TCP, TLS, a reset.
    #[error("GET {url}: {reason}")]
    Unreachable {
        /// The URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// No whole answer within [`FETCH_TIMEOUT`].
    #[error("GET {0}: no answer within 10 s")]
    Timeout(String),
    /// An answer other than 200 (or 304 to a conditional request).
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// Its status code.
        status: u16,
    },
    /// A redirect: not followed (a key set's location is configured, not
    /// learned from an answer).
    #[error("GET {url}: HTTP {status}, a redirect (not followed)")]
    Redirect {
        /// The URL.
        url: String,
        /// Its status code.
        status: u16,
    },
    /// An answer longer than its bound.
    #[error("GET {url}: the answer is longer than {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The bound.
        limit: usize,
    },
    /// A document of the wrong shape.
    #[error("{url}: {error}")]
    Document {
        /// Where it came from.
        url: String,
        /// What is wrong with it.
        error: DocumentError,
    },
    /// The ConfigMap or its key is missing or unreadable.
    #[error("ConfigMap {namespace}/{name}: {reason}")]
    ConfigMap {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The CA bundle (`caConfigMapRef`) holds no usable certificate.
    #[error("the CA bundle (caConfigMapRef): {0}")]
    Ca(String),
    /// rustls refused the TLS settings (a bug, not input).
    #[error("TLS settings: {0}")]
    Tls(String),
    /// The API server refused or failed a request.
    #[error("Kubernetes API {path}: {reason}")]
    Api {
        /// What was asked.
        path: String,
        /// Its error.
        reason: String,
    },
}

impl FetchError {
    /// Bounded label for `waycast_operator_key_set_fetches_total{result}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Document { .. } | Self::TooLarge { .. } => "invalid",
            _ => "failed",
        }
    }
}

/// `(url, etag)`: the `ETag` an answer for `url` had, what a conditional
/// request for the same URL sends.
pub type Etag = (String, String);

/// What a fetch brought.
#[derive(Debug)]
pub enum Answer {
    /// A document, with its `ETag` (and the URL it is for) and
    /// `Cache-Control`.
    Document {
        /// Where it was read (the URL, the API path, the ConfigMap), as an
        /// error shows it.
        from: String,
        /// The body.
        body: Bytes,
        /// `(url, etag)`: what a conditional request for the same URL sends.
        etag: Option<Etag>,
        /// The `Cache-Control` header.
        cache_control: Option<String>,
    },
    /// 304: the document held is current.
    NotModified {
        /// The `Cache-Control` header.
        cache_control: Option<String>,
    },
}

/// What a provider's fetch needs besides its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// Where the document is.
    pub source: KeySource,
    /// The CA bundle for its TLS, a ConfigMap key of `.0`'s namespace.
    pub ca: Option<(String, ConfigMapKeyRef)>,
}

/// Fetches key sets: the kube client for the cluster's own documents and
/// ConfigMaps, and an HTTPS client per fetch (a CA bundle is read again
/// each time).
#[derive(Clone)]
pub struct Fetcher {
    client: kube::Client,
}

type Https = HttpClient<HttpsConnector<HttpConnector>, Empty<Bytes>>;

impl Fetcher {
    /// Fetches through `client` (API server documents, ConfigMaps) and
    /// HTTPS.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// The key set of `want`, conditional on `etag` (`(url, etag)` of the
    /// last answer) where the URL is the same.
    ///
    /// # Errors
    /// [`FetchError`] when no document came (a 304 is an answer).
    pub async fn key_set(&self, want: &Want, etag: Option<&Etag>) -> Result<Answer, FetchError> {
        match &want.source {
            KeySource::Discovery { .. } | KeySource::JwksUri { .. } => {
                let ca = match &want.ca {
                    Some((namespace, reference)) => {
                        Some(self.config_map_key(namespace, &reference.name, &reference.key, MAX_CA_BYTES).await?)
                    }
                    None => None,
                };
                remote(&want.source, ca.as_deref(), etag).await
            }
            KeySource::Cluster => self.api_get(CLUSTER_JWKS, etag, MAX_KEY_SET_BYTES).await,
            KeySource::ConfigMap { namespace, name, key } => {
                let text = self.config_map_key(namespace, name, key, MAX_KEY_SET_BYTES).await?;
                let from = want.source.to_string();
                Ok(Answer::Document { from, body: Bytes::from(text), etag: None, cache_control: None })
            }
        }
    }

    /// The cluster's ServiceAccount issuer, as the API server's discovery
    /// document names it.
    ///
    /// # Errors
    /// [`FetchError`] when it cannot be read.
    pub async fn cluster_issuer(&self) -> Result<String, FetchError> {
        let Answer::Document { body, .. } = self.api_get(CLUSTER_DISCOVERY, None, MAX_DISCOVERY_BYTES).await? else {
            return Err(FetchError::Status { url: CLUSTER_DISCOVERY.into(), status: 304 });
        };
        document::issuer(&body).map_err(|error| FetchError::Document { url: CLUSTER_DISCOVERY.into(), error })
    }

    /// A key of a ConfigMap's `data`, at most `limit` bytes.
    async fn config_map_key(&self, namespace: &str, name: &str, key: &str, limit: usize) -> Result<String, FetchError> {
        let problem =
            |reason: String| FetchError::ConfigMap { namespace: namespace.to_owned(), name: name.to_owned(), reason };
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
        let config_map = tokio::time::timeout(FETCH_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|_| problem("no answer from the API server within 10 s".into()))?
            .map_err(|e| problem(cut_marked(&e.to_string(), MAX_REASON_SHOWN)))?
            .ok_or_else(|| problem("not found".into()))?;
        let text = config_map
            .data
            .and_then(|mut data| data.remove(key))
            .ok_or_else(|| problem(format!("has no key {key} in data")))?;
        if text.len() > limit {
            return Err(problem(format!("key {key} holds {} bytes, more than the {limit} read", text.len())));
        }
        Ok(text)
    }

    /// GET `path` of the API server through the kube client.
    async fn api_get(&self, path: &str, etag: Option<&Etag>, limit: usize) -> Result<Answer, FetchError> {
        let api =
            |reason: String| FetchError::Api { path: path.to_owned(), reason: cut_marked(&reason, MAX_REASON_SHOWN) };
        let mut request =
            http::Request::get(path).header(http::header::ACCEPT, "application/json, application/jwk-set+json");
        if let Some((_, tag)) = etag.filter(|(url, _)| url == path) {
            request = request.header(http::header::IF_NONE_MATCH, tag);
        }
        let request = request.body(kube::client::Body::empty()).map_err(|e| api(e.to_string()))?;
        let answer = async {
            let response = self.client.send(request).await.map_err(|e| api(e.to_string()))?;
            read(response, path, limit).await
        };
        tokio::time::timeout(FETCH_TIMEOUT, answer).await.map_err(|_| FetchError::Timeout(path.to_owned()))?
    }
}

/// The key set of a remote source (discovery or a JWKS URL) over https,
/// trusting the PEM certificates `ca` (else the public web PKI roots),
/// conditional on `etag` where it is for the key set's URL.
///
/// # Errors
/// [`FetchError`] when no document came (a 304 is an answer); a source
/// that is not remote is [`FetchError::Tls`] (a bug).
pub async fn remote(source: &KeySource, ca: Option<&str>, etag: Option<&Etag>) -> Result<Answer, FetchError> {
    let https = https(ca)?;
    match source {
        KeySource::Discovery { issuer } => {
            let url = document::discovery_url(issuer);
            let Answer::Document { body, .. } = get(&https, &url, None, MAX_DISCOVERY_BYTES).await? else {
                return Err(FetchError::Status { url: shown(&url), status: 304 });
            };
            let jwks_uri =
                document::jwks_uri(&body, issuer).map_err(|error| FetchError::Document { url: shown(&url), error })?;
            get(&https, &jwks_uri, etag, MAX_KEY_SET_BYTES).await
        }
        KeySource::JwksUri { uri } => get(&https, uri, etag, MAX_KEY_SET_BYTES).await,
        KeySource::Cluster | KeySource::ConfigMap { .. } => {
            Err(FetchError::Tls(format!("{source} is not fetched over https")))
        }
    }
}

/// An HTTPS-only client trusting the PEM certificates `ca`, else the
/// public web PKI roots.
fn https(ca: Option<&str>) -> Result<Https, FetchError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let tls = match ca {
        None => builder.with_provider_and_webpki_roots(provider).map_err(tls_error)?,
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for (index, certificate) in CertificateDer::pem_slice_iter(pem.as_bytes()).enumerate() {
                // NB: not rustls' text: it quotes the line it could not read.
                let certificate =
                    certificate.map_err(|_| FetchError::Ca(format!("PEM section {} does not read", index + 1)))?;
                roots.add(certificate).map_err(|e| FetchError::Ca(format!("certificate {}: {e}", index + 1)))?;
            }
            if roots.is_empty() {
                return Err(FetchError::Ca("no PEM certificate".into()));
            }
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(tls_error)?
                .with_root_certificates(roots)
                .with_no_client_auth();
            builder.with_tls_config(config)
        }
    };
    let connector = tls.https_only().enable_http1().build();
    Ok(HttpClient::builder(TokioExecutor::new()).build(connector))
}

/// The API server's discovery document.
pub const CLUSTER_DISCOVERY: &str = "/.well-known/openid-configuration";
/// The API server's key set.
pub const CLUSTER_JWKS: &str = "/openid/v1/jwks";

fn tls_error(error: rustls::Error) -> FetchError {
    FetchError::Tls(error.to_string())
}

/// GET `url` over `https`, conditional on `etag` when it is for `url`.
async fn get(https: &Https, url: &str, etag: Option<&Etag>, limit: usize) -> Result<Answer, FetchError> {
    let unreachable =
        |reason: String| FetchError::Unreachable { url: shown(url), reason: cut_marked(&reason, MAX_REASON_SHOWN) };
    let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| unreachable(e.to_string()))?;
    let mut request = http::Request::get(uri)
        .header(http::header::ACCEPT, "application/json, application/jwk-set+json")
        .header(http::header::USER_AGENT, "waycast-operator");
    if let Some((_, tag)) = etag.filter(|(for_url, _)| for_url == url) {
        request = request.header(http::header::IF_NONE_MATCH, tag);
    }
    let request = request.body(Empty::new()).map_err(|e| unreachable(e.to_string()))?;
    let answer = async {
        let response = https.request(request).await.map_err(|e| unreachable(chain(&e)))?;
        read(response, url, limit).await
    };
    tokio::time::timeout(FETCH_TIMEOUT, answer).await.map_err(|_| FetchError::Timeout(shown(url)))?
}

/// An answer read within `limit` bytes: 200 a document, 304 not
/// modified, anything else an error.
async fn read<B>(response: http::Response<B>, url: &str, limit: usize) -> Result<Answer, FetchError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let status = response.status();
    // NB: a closure over the headers, not the response: one alive across
    // the body's read would hold a shared borrow of a body that is not
    // `Sync` (the kube client's), and the fetch could not be a task.
    let headers = response.headers();
    let header = |name: http::header::HeaderName| header_text(headers, name);
    let cache_control = header(http::header::CACHE_CONTROL);
    if status == http::StatusCode::NOT_MODIFIED {
        return Ok(Answer::NotModified { cache_control });
    }
    if status.is_redirection() {
        return Err(FetchError::Redirect { url: shown(url), status: status.as_u16() });
    }
    if status != http::StatusCode::OK {
        return Err(FetchError::Status { url: shown(url), status: status.as_u16() });
    }
    let too_large = || FetchError::TooLarge { url: shown(url), limit };
    let declared = header(http::header::CONTENT_LENGTH).and_then(|length| length.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(too_large());
    }
    let etag = header(http::header::ETAG).map(|tag| (url.to_owned(), tag));
    let body = Limited::new(response.into_body(), limit).collect().await.map_err(|error| {
        if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            too_large()
        } else {
            let reason = cut_marked(&format!("reading the answer: {error}"), MAX_REASON_SHOWN);
            FetchError::Unreachable { url: shown(url), reason }
        }
    })?;
    Ok(Answer::Document { from: shown(url), body: body.to_bytes(), etag, cache_control })
}

/// A header's value as text, cut to 256 bytes.
fn header_text(headers: &http::HeaderMap, name: http::header::HeaderName) -> Option<String> {
    headers.get(name).and_then(|value| value.to_str().ok()).map(|value| document::cut(value, 256).to_owned())
}

/// An error and its sources, one line: hyper's own says only "client error
/// (Connect)"; the cause (refused, a certificate not trusted) is below it.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
