//! TLS to a backend served through its endpoints: a private CA, a client
//! certificate (mutual TLS) and the name the certificate carries — the
//! Service's DNS name, not the pod address the gateway connects to. A
//! gateway without the client certificate, or trusting another CA, is
//! refused by the pod and answers 502; the pod never sees the request.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use http::StatusCode;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::ClientTlsConfig;
use waycast_mock::fixtures::{ALICE_KEY, temp_dir};
use waycast_mock::pki::{Authority, Usage, server_tls};
use waycast_mock::upstream::{MockOptions, MockUpstream};

const SERVICE: &str = "models/vllm:8443";
const MODEL: &str = "mistral-7b";

/// A pod serving TLS for `vllm.models.svc` that requires a client
/// certificate signed by `authority`: the mock upstream's own HTTPS.
async fn tls_pod(dir: &Path, authority: &Authority) -> MockUpstream {
    let server = authority.issue(dir, "vllm", "vllm", &[], &["vllm.models.svc".into()], Usage::Server).unwrap();
    let tls = server_tls(&server.cert, &server.key, Some(&authority.files.cert)).unwrap();
    let options = MockOptions { tls: Some(tls), ..MockOptions::default() };
    waycast_mock::upstream::start("127.0.0.1:0".parse().unwrap(), options).await.unwrap()
}

#[tokio::test]
async fn mutual_tls_to_the_pods_of_a_service_with_a_private_ca() {
    let dir = temp_dir("backend-tls");
    let authority = Authority::generate(&dir, "models-ca").unwrap();
    let client = authority.issue(&dir, "gateway", "gateway", &[], &[], Usage::Client).unwrap();
    let trusted = waycast_mock::pki::client_tls(&authority, &client).unwrap();
    let options = FixtureOptions { endpoints_file: true, ..FixtureOptions::default() };
    let with_tls = |tls: ClientTlsConfig| {
        move |config: &mut waycast_crds::GatewayConfig, _: &str| {
            let model = config.models.iter_mut().find(|m| m.name == MODEL).unwrap();
            // Not resolvable: only the endpoints lead to the pod.
            model.backends[0].url = "https://vllm.models.svc:8443/v1".into();
            model.backends[0].endpoints = Some(SERVICE.into());
            model.backends[0].tls = Some(tls);
        }
    };
    let fixture = Fixture::start(options, with_tls(trusted.clone())).await;
    let pod = tls_pod(&dir, &authority).await;
    let document =
        serde_json::json!({"apiVersion": "waycast.dev/endpoints-v1", "services": {SERVICE: [pod.addr.to_string()]}});
    fixture.write_endpoints(document.to_string().as_bytes());
    let body = format!(r#"{{"model":"{MODEL}","messages":[]}}"#);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "no 200 over mutual TLS to the pod: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = pod.recorder.requests().await.len();
    assert!(served >= 1);

    // Without the client certificate, trusting another CA, or expecting
    // another name: refused at the handshake, never reaching the pod.
    let other_dir = temp_dir("backend-tls-other");
    let other = Authority::generate(&other_dir, "other-ca").unwrap();
    let refused = [
        ClientTlsConfig { client_cert_pem: None, client_key_pem: None, ..trusted.clone() },
        ClientTlsConfig { ca_pem: Some(std::fs::read_to_string(&other.files.cert).unwrap()), ..trusted.clone() },
        ClientTlsConfig { server_name: Some("vllm.elsewhere.svc".into()), ..trusted.clone() },
    ];
    for (case, tls) in refused.into_iter().enumerate() {
        let mut config = waycast_mock::fixtures::default_config(&fixture.mock.base_url());
        with_tls(tls)(&mut config, "");
        // A different config each time (and different from the first).
        config.models[0].aliases.push(format!("case-{case}"));
        fixture.apply_config(&config).await;
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "case {case}");
        assert_eq!(pod.recorder.requests().await.len(), served, "case {case} reached the pod");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other_dir);
}

/// An HTTPS `url` backend (a provider's address, no endpoints): the
/// certificate is checked against the name in the URL and the CA given, a
/// keep-alive connection is reused across requests, and a certificate for
/// another name is refused (502, the request never reaching it).
#[tokio::test]
async fn an_https_url_backend_is_checked_against_its_name_and_its_connection_reused() {
    let dir = temp_dir("url-tls");
    let authority = Authority::generate(&dir, "provider-ca").unwrap();
    let server = authority.issue(&dir, "provider", "provider", &[], &["localhost".into()], Usage::Server).unwrap();
    let tls = server_tls(&server.cert, &server.key, None).unwrap();
    let provider = waycast_mock::upstream::start(
        "127.0.0.1:0".parse().unwrap(),
        MockOptions { tls: Some(tls), ..Default::default() },
    )
    .await
    .unwrap();
    let ca = std::fs::read_to_string(&authority.files.cert).unwrap();
    let port = provider.addr.port();
    let to = |host: &'static str, ca: String| {
        move |config: &mut waycast_crds::GatewayConfig, _: &str| {
            let model = config.models.iter_mut().find(|m| m.name == MODEL).unwrap();
            model.backends[0].url = format!("https://{host}:{port}/v1");
            model.backends[0].tls = Some(ClientTlsConfig { ca_pem: Some(ca), ..ClientTlsConfig::default() });
        }
    };
    let fixture = Fixture::start(FixtureOptions::default(), to("localhost", ca.clone())).await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[]}}"#);
    for _ in 0..3 {
        let (status, _, answer) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&answer));
    }
    assert_eq!(provider.recorder.requests().await.len(), 3);
    let connections = provider.recorder.connections.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(connections, 1, "the TLS connection is kept alive and reused");

    // The same server reached by another name: its certificate is not for it.
    let mut config = waycast_mock::fixtures::default_config(&fixture.mock.base_url());
    to("127.0.0.1", ca)(&mut config, "");
    fixture.apply_config(&config).await;
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        provider.recorder.requests().await.len(),
        3,
        "the request reached a server with another name's certificate"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
