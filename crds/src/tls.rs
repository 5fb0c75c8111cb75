//! Checks on the TLS material a team writes for a backend (`tls` of a
//! ModelEndpoint's backend, compiled into the config with the PEM inline):
//! the same parsers the gateway builds its client with, so an entry that
//! passes here does not fail there. Nothing here echoes PEM text: a
//! problem names the field and what is wrong, never the material.

use std::net::IpAddr;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ClientTlsConfig;

/// The most PEM text a CA bundle or a client certificate chain may hold.
pub const MAX_PEM_BYTES: usize = 256 * 1024;

/// Why `name` is not a name a server's certificate can be checked
/// against: an RFC 1123 DNS name (letters, digits and hyphens in labels of
/// 1–63 characters, at most 253 in all) or an IP address.
pub fn server_name_problem(name: &str) -> Option<&'static str> {
    if name.parse::<IpAddr>().is_ok() {
        return None;
    }
    if name.is_empty() || name.len() > 253 {
        return Some("must be a DNS name of 1 to 253 characters or an IP address");
    }
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if !name.split('.').all(label_ok) {
        return Some("must be an RFC 1123 DNS name (labels of letters, digits and inner hyphens) or an IP address");
    }
    if name.rsplit('.').next().is_some_and(|top| top.bytes().all(|b| b.is_ascii_digit())) {
        return Some("must not end in an all-numeric label unless it is an IP address");
    }
    None
}

/// Every problem with `tls`, as (field, message), fields named as in the
/// config (`caPem`, `clientCertPem`, `clientKeyPem`, `serverName`).
pub fn client_tls_problems(tls: &ClientTlsConfig) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if let Some(name) = &tls.server_name
        && let Some(message) = server_name_problem(name)
    {
        problems.push(("serverName", message.to_owned()));
    }
    if let Some(pem) = &tls.ca_pem {
        match certificates(pem) {
            Err(message) => problems.push(("caPem", message)),
            Ok(certificates) => {
                for (index, certificate) in certificates.iter().enumerate() {
                    if let Err(error) = webpki::anchor_from_trusted_cert(certificate) {
                        problems.push(("caPem", format!("certificate {} is not a usable CA: {error}", index + 1)));
                    }
                }
            }
        }
    }
    match (&tls.client_cert_pem, &tls.client_key_pem) {
        (None, None) => {}
        (Some(_), None) | (None, Some(_)) => {
            problems.push(("clientCertPem", "needs clientKeyPem with it (and the other way round)".to_owned()));
        }
        (Some(chain), Some(key)) => {
            if let Err(message) = certificates(chain) {
                problems.push(("clientCertPem", message));
            }
            if key.len() > MAX_PEM_BYTES || PrivateKeyDer::from_pem_slice(key.as_bytes()).is_err() {
                problems.push(("clientKeyPem", "is not a PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned()));
            }
        }
    }
    problems
}

/// The certificates of a PEM text: at least one, all well-formed.
fn certificates(pem: &str) -> Result<Vec<CertificateDer<'_>>, String> {
    if pem.len() > MAX_PEM_BYTES {
        return Err(format!("is longer than {MAX_PEM_BYTES} bytes"));
    }
    let certificates: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|_| "is not valid PEM".to_owned())?;
    if certificates.is_empty() {
        return Err("holds no PEM certificate".to_owned());
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_are_rfc_1123_names_or_addresses() {
        for good in ["vllm.models.svc", "a", "api.openai.com", "x-1.y", "10.0.0.1", "::1", "fd00::5", "LOCALHOST"] {
            assert_eq!(server_name_problem(good), None, "{good}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        let too_long = ["a"; 128].join(".");
        for bad in [
            "a..b",
            "",
            ".a",
            "a.",
            "-a.b",
            "a-.b",
            "ünï.com",
            "a b",
            "a_b.com",
            "*.x.com",
            "1.2.3",
            &long_label,
            &too_long,
        ] {
            assert!(server_name_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn pem_material_is_parsed_as_the_gateway_parses_it() {
        let garbage = ClientTlsConfig { ca_pem: Some("not pem".into()), ..Default::default() };
        assert_eq!(client_tls_problems(&garbage)[0].0, "caPem");
        let broken_der = ClientTlsConfig {
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into()),
            ..Default::default()
        };
        assert_eq!(client_tls_problems(&broken_der)[0].0, "caPem");
        let lone_cert = ClientTlsConfig { client_cert_pem: Some(String::new()), ..Default::default() };
        assert_eq!(client_tls_problems(&lone_cert)[0].0, "clientCertPem");
        let secret = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LW1hdGVyaWFs\n-----END PRIVATE KEY-----\n";
        let bad_key = ClientTlsConfig {
            client_cert_pem: Some("x".into()),
            client_key_pem: Some(format!("{secret}junk")),
            ..Default::default()
        };
        let problems = client_tls_problems(&bad_key);
        assert!(problems.iter().all(|(_, message)| !message.contains("c2VjcmV0")), "{problems:?}");
        assert_eq!(client_tls_problems(&ClientTlsConfig::default()), Vec::new());
    }
}
