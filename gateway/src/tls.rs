//! TLS with rustls. Serving: from PEM files, re-read when they change so a
//! renewed certificate (cert-manager rotating the Secret) applies without a
//! restart; ALPN offers h2 and http/1.1. Calling out (Redis, HTTPS
//! upstreams): one client config from inline PEM, or the public roots.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use waycast_crds::config::ClientTlsConfig;

/// Why TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no certificate.
    #[error("cannot read certificate {path}: {reason}")]
    Certificate {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The key file is unreadable or holds no key.
    #[error("cannot read private key {path}: {reason}")]
    Key {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A field of a client TLS config (inline PEM, server name) is unusable.
    #[error("{what}: {reason}")]
    Field {
        /// Which field.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// rustls refused the pair.
    #[error("certificate and key do not form a usable TLS config: {0}")]
    Config(#[from] rustls::Error),
}

/// The current acceptor, swapped when the files change.
pub struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    acceptor: ArcSwap<TlsAcceptor>,
}

impl TlsFiles {
    /// Loads the pair.
    ///
    /// # Errors
    /// [`TlsError`] naming the file at fault.
    pub fn load(cert: PathBuf, key: PathBuf) -> Result<Self, TlsError> {
        let acceptor = acceptor(&cert, &key)?;
        Ok(Self { cert, key, acceptor: ArcSwap::from_pointee(acceptor) })
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> Arc<TlsAcceptor> {
        self.acceptor.load_full()
    }

    /// Re-reads the files every `interval` while they change; a bad pair is
    /// logged and the previous one kept.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut last = (modified(&self.cert), modified(&self.key));
        loop {
            tokio::time::sleep(interval).await;
            let now = (modified(&self.cert), modified(&self.key));
            if now == last {
                continue;
            }
            last = now;
            match acceptor(&self.cert, &self.key) {
                Ok(acceptor) => {
                    self.acceptor.store(Arc::new(acceptor));
                    tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                }
                Err(error) => {
                    tracing::error!(%error, "TLS files changed but cannot be used; keeping the previous certificate")
                }
            }
        }
    }
}

fn modified(path: &PathBuf) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn acceptor(cert: &PathBuf, key: &PathBuf) -> Result<TlsAcceptor, TlsError> {
    let cert_error = |reason: String| TlsError::Certificate { path: cert.display().to_string(), reason };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_error(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_error(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_error("no certificate in file".into()));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::Key { path: key.display().to_string(), reason: e.to_string() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, private)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A client config: trusting `tls.ca_pem` (else the public web PKI roots)
/// and presenting `tls.client_cert_pem` when set. Refused here, a bad PEM
/// refuses the config that carries it, so the last good one keeps serving.
///
/// # Errors
/// [`TlsError::Field`] naming the field; [`TlsError::Config`] from rustls.
pub fn client_config(tls: Option<&ClientTlsConfig>) -> Result<ClientConfig, TlsError> {
    let roots = match tls.and_then(|tls| tls.ca_pem.as_deref()) {
        None => RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() },
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for certificate in pem_certificates(pem, "caPem")? {
                roots.add(certificate).map_err(|e| TlsError::Field { what: "caPem", reason: e.to_string() })?;
            }
            roots
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let pair = tls.and_then(|tls| Some((tls.client_cert_pem.as_deref()?, tls.client_key_pem.as_deref()?)));
    Ok(match pair {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = pem_certificates(cert, "clientCertPem")?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| TlsError::Field { what: "clientKeyPem", reason: e.to_string() })?;
            builder.with_client_auth_cert(chain, key)?
        }
    })
}

fn pem_certificates(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Field { what, reason: e.to_string() })?;
    if certificates.is_empty() {
        return Err(TlsError::Field { what, reason: "no PEM certificate".into() });
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    const NOT_A_CERTIFICATE: &str =
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";

    #[test]
    fn unusable_client_tls_fields_are_named() {
        let cases = [
            (ClientTlsConfig { ca_pem: Some("no PEM here".into()), ..Default::default() }, "caPem"),
            (ClientTlsConfig { ca_pem: Some(NOT_A_CERTIFICATE.into()), ..Default::default() }, "caPem"),
            (
                ClientTlsConfig {
                    client_cert_pem: Some("no PEM here".into()),
                    client_key_pem: Some("no key".into()),
                    ..Default::default()
                },
                "clientCertPem",
            ),
        ];
        for (tls, field) in cases {
            let error = client_config(Some(&tls)).unwrap_err().to_string();
            assert!(error.starts_with(field), "{field}: {error}");
        }
        assert!(client_config(None).is_ok(), "the public roots");
    }
}
