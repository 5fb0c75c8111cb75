//! TLS termination: HTTP/1.1 and HTTP/2 (ALPN) over rustls, and a rotated
//! certificate taking effect without a restart.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{StatusCode, Version};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::{Fixture, FixtureOptions};
use waycast_mock::fixtures::{self as fixture, ALICE_KEY};
use waycast_mock::pki::{Authority, Usage};

const CHAT: &str = r#"{"model":"mistral-7b","messages":[]}"#;

fn issue(dir: &Path, ca_name: &str) -> (Authority, std::path::PathBuf, std::path::PathBuf) {
    let ca = Authority::generate(dir, ca_name).unwrap();
    let leaf = ca
        .issue(
            dir,
            &format!("{ca_name}-server"),
            "gateway",
            &[],
            &["localhost".into(), "127.0.0.1".into()],
            Usage::Server,
        )
        .unwrap();
    (ca, leaf.cert, leaf.key)
}

/// A rustls client trusting only the CA in `ca`.
fn tls_config(ca: &Path) -> rustls::ClientConfig {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn client(
    ca: &Path,
    http2: bool,
) -> Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Full<Bytes>> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls_config(ca)).https_only();
    let connector = if http2 { builder.enable_http2().build() } else { builder.enable_http1().build() };
    let mut client = Client::builder(TokioExecutor::new());
    client.http2_only(http2);
    client.build(connector)
}

#[tokio::test]
async fn serves_tls_with_alpn_and_picks_up_a_rotated_certificate() {
    let dir = fixture::temp_dir("tls");
    let (_, cert, key) = issue(&dir, "first-ca");
    let serving_cert = dir.join("tls.crt");
    let serving_key = dir.join("tls.key");
    std::fs::copy(&cert, &serving_cert).unwrap();
    std::fs::copy(&key, &serving_key).unwrap();
    let options =
        FixtureOptions { tls: Some((serving_cert.clone(), serving_key.clone())), ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let url = format!("https://localhost:{}/v1/chat/completions", fixture.addr.port());

    for http2 in [false, true] {
        let client = client(&dir.join("first-ca.crt"), http2);
        let response = client.request(fixture::post_request(&url, Some(ALICE_KEY), CHAT)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.version(), if http2 { Version::HTTP_2 } else { Version::HTTP_11 });
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("chat.completion"));
    }

    // Rotate to a certificate from another CA; new connections get it.
    let (_, new_cert, new_key) = issue(&dir, "second-ca");
    std::fs::copy(&new_key, &serving_key).unwrap();
    std::fs::copy(&new_cert, &serving_cert).unwrap();
    let trusting_new = client(&dir.join("second-ca.crt"), false);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(response) = trusting_new.request(fixture::post_request(&url, Some(ALICE_KEY), CHAT)).await {
            assert_eq!(response.status(), StatusCode::OK);
            break;
        }
        assert!(Instant::now() < deadline, "the rotated certificate was not picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client silent after its TLS handshake is closed within the header
/// timeout (+1 s): bytes cannot be peeked under TLS, so the first request
/// has a deadline of its own.
#[tokio::test]
async fn a_client_silent_after_its_handshake_is_closed_within_the_header_timeout() {
    use rustls::pki_types::ServerName;
    use tokio::io::AsyncReadExt as _;
    let dir = fixture::temp_dir("tls-silent");
    let (_, cert, key) = issue(&dir, "silent-ca");
    let options = FixtureOptions {
        tls: Some((cert, key)),
        header_read_timeout: Duration::from_secs(1),
        ..FixtureOptions::default()
    };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(&dir.join("silent-ca.crt"))));
    let tcp = tokio::net::TcpStream::connect(fixture.addr).await.unwrap();
    let mut tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    let started = Instant::now();
    let mut buffer = [0_u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buffer)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "the silent TLS connection is still open: {read:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "closed after {:?}", started.elapsed());
}
