//! Connections to upstreams: one pooled hyper client per connect timeout
//! and TLS settings, and of each one per data-plane worker (HTTP/1.1 and
//! HTTP/2, TLS through rustls), whose host names resolve through the egress
//! guard (`egress.rs`). Clients are held by the [`crate::registry::Registry`]
//! across configs, so a reload keeps warm connections.

pub mod balancing;
pub mod egress;
pub mod endpoints;
pub mod pick;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use waycast_crds::config::{BackendConfig, ClientTlsConfig};
use waycast_crds::egress::Cidr;

use egress::GuardedResolver;

/// The pooled upstream client (HTTP/1.1 and HTTP/2, TLS via rustls), whose
/// host names resolve through the egress guard.
pub type UpstreamClient = Client<HttpsConnector<HttpConnector<GuardedResolver>>, Full<Bytes>>;

/// How long an idle upstream connection stays pooled.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// One pooled client per data-plane worker (`crate::worker`), all with the
/// same settings: a worker sends only through its own, so an upstream
/// connection, its task and the requests on it stay on one thread.
#[derive(Clone)]
pub struct UpstreamClients(Arc<[UpstreamClient]>);

impl UpstreamClients {
    /// `workers` clients (at least one) whose TCP connects give up after
    /// `connect_timeout` and never reach a link-local/metadata address or
    /// one in `denied`; `https` connections trust `tls`'s CA (else the web
    /// PKI), present its client certificate, and check its `server_name`
    /// (else the URL's host). The TLS settings are parsed once for all.
    ///
    /// # Errors
    /// The TLS configuration failing to build (a bad PEM, a bad server name).
    pub fn new(
        workers: usize,
        connect_timeout: Duration,
        denied: &Arc<[Cidr]>,
        tls: Option<&ClientTlsConfig>,
    ) -> Result<Self, crate::tls::TlsError> {
        let config = crate::tls::client_config(tls)?;
        let server_name = match tls.and_then(|tls| tls.server_name.as_deref()) {
            None => None,
            Some(name) => Some(
                rustls::pki_types::ServerName::try_from(name.to_owned())
                    .map_err(|e| crate::tls::TlsError::Field { what: "serverName", reason: e.to_string() })?,
            ),
        };
        let clients: Vec<UpstreamClient> = (0..workers.max(1))
            .map(|_| upstream_client(connect_timeout, denied.clone(), config.clone(), server_name.clone()))
            .collect();
        Ok(Self(clients.into()))
    }

    /// The calling worker's client.
    pub fn local(&self) -> &UpstreamClient {
        &self.0[crate::worker::index() % self.0.len()]
    }
}

fn upstream_client(
    connect_timeout: Duration,
    denied: Arc<[Cidr]>,
    config: rustls::ClientConfig,
    server_name: Option<rustls::pki_types::ServerName<'static>>,
) -> UpstreamClient {
    let mut http = HttpConnector::new_with_resolver(GuardedResolver { denied });
    http.enforce_http(false);
    // NB: without TCP_NODELAY a small request written after its headers
    // waits for a delayed ACK: 40 ms per request on reused connections.
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_or_http();
    let builder = match server_name {
        None => builder,
        Some(name) => builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name)),
    };
    let https = builder.enable_http1().enable_http2().wrap_connector(http);
    Client::builder(TokioExecutor::new()).pool_idle_timeout(POOL_IDLE_TIMEOUT).build(https)
}

/// The TLS a backend's connections use: its own settings, and for an
/// `https` backend served through its endpoints (pod addresses), the name
/// its certificate must carry — its `serverName`, else the URL's host — as
/// the connection's address no longer names it.
pub fn effective_tls(backend: &BackendConfig) -> Option<ClientTlsConfig> {
    let https = backend.url.starts_with("https://");
    match (&backend.tls, https && backend.endpoints.is_some()) {
        (tls, false) => tls.clone(),
        (tls, true) => {
            let host = backend.url.parse::<http::Uri>().ok().and_then(|uri| uri.host().map(str::to_owned));
            let mut tls = tls.clone().unwrap_or_default();
            tls.server_name = tls.server_name.or(host);
            Some(tls)
        }
    }
}
