//! Connections to upstreams: one pooled hyper client per connect timeout
//! (HTTP/1.1 and HTTP/2, TLS through rustls), whose host names resolve
//! through the egress guard (`egress.rs`). Clients are held by the
//! [`crate::registry::Registry`] across configs, so a reload keeps warm
//! connections.

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
use waycast_crds::egress::Cidr;

use egress::GuardedResolver;

/// The pooled upstream client (HTTP/1.1 and HTTP/2, TLS via rustls), whose
/// host names resolve through the egress guard.
pub type UpstreamClient = Client<HttpsConnector<HttpConnector<GuardedResolver>>, Full<Bytes>>;

/// How long an idle upstream connection stays pooled.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A client whose TCP connects give up after `connect_timeout` and never
/// reach a link-local/metadata address or one in `denied`.
///
/// # Errors
/// The TLS configuration failing to build.
pub fn upstream_client(connect_timeout: Duration, denied: Arc<[Cidr]>) -> Result<UpstreamClient, crate::tls::TlsError> {
    let mut http = HttpConnector::new_with_resolver(GuardedResolver { denied });
    http.enforce_http(false);
    // NB: without TCP_NODELAY a small request written after its headers
    // waits for a delayed ACK: 40 ms per request on reused connections.
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let tls = crate::tls::client_config(None)?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).pool_idle_timeout(POOL_IDLE_TIMEOUT).build(https))
}
