//! Connections to upstreams: one HTTP/1.1 client ([`http1`]) per connect
//! timeout and TLS settings, with a pool per data-plane worker, whose host
//! names resolve through the egress guard (`egress.rs`). Clients are held
//! by the [`crate::registry::Registry`] across configs, so a reload keeps
//! warm connections.

pub mod balancing;
pub mod body_rest;
pub mod egress;
pub mod endpoints;
pub mod framing;
pub mod http1;
mod io;
pub mod pick;
pub mod pool;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use waycast_crds::config::{BackendConfig, ClientTlsConfig};
use waycast_crds::egress::EgressPolicy;

pub use body_rest::BodyRest;
pub use http1::{UpstreamBody, UpstreamClient};
pub use pool::Pool;
pub use wire::UpstreamRequest;

/// A client (its connections pooled per thread, so a worker's upstream
/// connections and the requests on them stay on its thread) whose connects
/// give up after `connect_timeout` and never reach a link-local/metadata
/// address, nor for `url` backends one `egress` refuses; `https` connections trust `tls`'s CA (else
/// the web PKI), present its client certificate, and check its
/// `server_name` (else the URL's host). The TLS settings are parsed once.
///
/// # Errors
/// The TLS configuration failing to build (a bad PEM, a bad server name).
pub fn client(
    connect_timeout: Duration,
    egress: &Arc<EgressPolicy>,
    tls: Option<&ClientTlsConfig>,
) -> Result<UpstreamClient, crate::tls::TlsError> {
    let config = crate::tls::client_config(tls)?;
    let server_name = match tls.and_then(|tls| tls.server_name.as_deref()) {
        None => None,
        Some(name) => Some(
            rustls::pki_types::ServerName::try_from(name.to_owned())
                .map_err(|e| crate::tls::TlsError::Field { what: "serverName", reason: e.to_string() })?,
        ),
    };
    Ok(UpstreamClient::new(connect_timeout, egress.clone(), config, server_name))
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
