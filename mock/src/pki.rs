//! Certificates and keys for a throwaway cluster: one CA, the API server's
//! serving certificate, client certificates per component, and the
//! ServiceAccount token signing key.
//!
//! Everything is generated fresh for each cluster and lives only in its
//! state directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, as PEM files on disk.
#[derive(Debug, Clone)]
pub struct PemFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// The certificate authority every certificate of one cluster chains to.
pub struct Authority {
    params: CertificateParams,
    key: KeyPair,
    /// Where the CA certificate and key were written.
    pub files: PemFiles,
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server.
    Server,
    /// A TLS client (Kubernetes maps CN to the user, O to groups).
    Client,
}

impl Authority {
    /// Generates a CA and writes `<name>.crt` / `<name>.key` into `dir`.
    ///
    /// # Errors
    /// Key generation or file writes failing.
    pub fn generate(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate().context("generating CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, format!("waycast-e2e {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).context("self-signing CA")?;
        let files = write_pair(dir, name, &cert.pem(), &key.serialize_pem())?;
        Ok(Self { params, key, files })
    }

    /// Issues a leaf certificate for `common_name` (with `organizations` as
    /// groups) valid for `sans` (DNS names or IP addresses), writes it as
    /// `<file_stem>.crt` / `.key` into `dir`.
    ///
    /// # Errors
    /// Invalid SANs, key generation or file writes failing.
    pub fn issue(
        &self,
        dir: &Path,
        file_stem: &str,
        common_name: &str,
        organizations: &[&str],
        sans: &[String],
        usage: Usage,
    ) -> anyhow::Result<PemFiles> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(sans.to_vec()).with_context(|| format!("SANs for {file_stem}"))?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        for organization in organizations {
            params.distinguished_name.push(DnType::OrganizationName, *organization);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![match usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        params.use_authority_key_identifier_extension = true;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).with_context(|| format!("signing {file_stem}"))?;
        write_pair(dir, file_stem, &cert.pem(), &key.serialize_pem())
    }
}

/// PEM text of a fresh CA certificate and of a client certificate it
/// signed with that certificate's key, in memory: `(ca, cert, key)`.
///
/// # Errors
/// Key generation or signing failing.
pub fn pem_ca_and_client() -> anyhow::Result<(String, String, String)> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "waycast test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key)?;
    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client.distinguished_name.push(DnType::CommonName, "gateway");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client.signed_by(&client_key, &Issuer::from_params(&ca, &ca_key))?;
    Ok((ca_cert.pem(), client_cert.pem(), client_key.serialize_pem()))
}

/// Generates the ServiceAccount token signing key pair: `sa.key` (private,
/// for the API server and controller-manager) and `sa.pub`.
///
/// # Errors
/// Key generation or file writes failing.
pub fn service_account_key(dir: &Path) -> anyhow::Result<PemFiles> {
    let key = KeyPair::generate()?;
    let private = dir.join("sa.key");
    let public = dir.join("sa.pub");
    std::fs::write(&private, key.serialize_pem()).context("writing sa.key")?;
    std::fs::write(&public, key.public_key_pem()).context("writing sa.pub")?;
    Ok(PemFiles { cert: public, key: private })
}

/// A TLS server configuration from PEM files: the certificate chain and key
/// served and, when given, the CA whose client certificates every
/// connection must present (mutual TLS). HTTP/2 and HTTP/1.1 are offered.
///
/// # Errors
/// A file unreadable or not PEM, or a key that does not fit the certificate.
pub fn server_tls(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .with_context(|| format!("reading certificates from {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading a key from {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading CA certificates from {}", path.display()))?
            {
                roots.add(certificate?).with_context(|| format!("a CA certificate in {}", path.display()))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).context("the certificate and its key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What a gateway needs to speak mutual TLS to a server `authority`
/// signed: that CA, and `client`'s certificate and key, as the config's PEM
/// text (no server name: the host's).
///
/// # Errors
/// A file unreadable.
pub fn client_tls(authority: &Authority, client: &PemFiles) -> anyhow::Result<waycast_crds::config::ClientTlsConfig> {
    let read = |path: &Path| std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
    Ok(waycast_crds::config::ClientTlsConfig {
        ca_pem: Some(read(&authority.files.cert)?),
        client_cert_pem: Some(read(&client.cert)?),
        client_key_pem: Some(read(&client.key)?),
        server_name: None,
    })
}

fn write_pair(dir: &Path, stem: &str, cert_pem: &str, key_pem: &str) -> anyhow::Result<PemFiles> {
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    std::fs::write(&cert, cert_pem).with_context(|| format!("writing {}", cert.display()))?;
    std::fs::write(&key, key_pem).with_context(|| format!("writing {}", key.display()))?;
    Ok(PemFiles { cert, key })
}
