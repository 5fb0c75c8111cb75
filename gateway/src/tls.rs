//! TLS termination with rustls from PEM files, re-read when they change so a
//! renewed certificate (cert-manager rotating the Secret) applies without a
//! restart. ALPN offers h2 and http/1.1.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

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
