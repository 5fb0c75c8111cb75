//! Fetches against a real https issuer started here (rustls, a CA of the
//! test's own, on `127.0.0.1:0`): discovery, the key set with its ETag, a
//! rotation, then an outage (HTTP 500, then connection refused) — and what
//! a held set becomes through each. Then the bounds: only the given CA is
//! trusted, a redirect is not followed, a long answer is not read.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;

use super::fetch::{Answer, FetchError, Want, remote};
use super::slot::Slot;
use crate::compile::key_source::KeySource;

/// What the issuer answers at `/jwks` now.
#[derive(Clone)]
struct Behaviour {
    jwks: String,
    etag: String,
    /// Answer every key set request with this status instead.
    failing: Option<u16>,
}

struct Issuer {
    port: u16,
    behaviour: Arc<arc_swap::ArcSwap<Behaviour>>,
    /// Key set answers with a body (not 304).
    bodies: Arc<AtomicUsize>,
    /// 304 answers.
    not_modified: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
    ca_pem: String,
}

fn jwks(kids: &[&str]) -> String {
    let keys: Vec<_> =
        kids.iter().map(|kid| json!({"kty": "RSA", "kid": kid, "use": "sig", "n": "AQAB", "e": "AQAB"})).collect();
    json!({ "keys": keys }).to_string()
}

impl Issuer {
    /// An https issuer at `https://localhost:<port>/realms/corp`, with a
    /// certificate of a fresh CA (`ca_pem`).
    async fn start() -> Self {
        let dir = waycast_mock::fixtures::temp_dir("key-sets");
        let ca = waycast_mock::pki::Authority::generate(&dir, "issuer-ca").unwrap();
        let sans = ["localhost".to_owned(), "127.0.0.1".to_owned()];
        let leaf = ca.issue(&dir, "issuer", "issuer", &[], &sans, waycast_mock::pki::Usage::Server).unwrap();
        let tls = waycast_mock::pki::server_tls(&leaf.cert, &leaf.key, None).unwrap();
        let ca_pem = std::fs::read_to_string(&ca.files.cert).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let behaviour = Arc::new(arc_swap::ArcSwap::from_pointee(Behaviour {
            jwks: jwks(&["first"]),
            etag: "\"v1\"".into(),
            failing: None,
        }));
        let (bodies, not_modified) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let state = (behaviour.clone(), bodies.clone(), not_modified.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (acceptor, state) = (acceptor.clone(), state.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let service = hyper::service::service_fn(move |request| {
                        let answer = answer(&request, port, &state);
                        async move { Ok::<_, std::convert::Infallible>(answer) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { port, behaviour, bodies, not_modified, server, ca_pem }
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    fn behave(&self, change: impl FnOnce(&mut Behaviour)) {
        let mut next = (**self.behaviour.load()).clone();
        change(&mut next);
        self.behaviour.store(Arc::new(next));
    }
}

type State = (Arc<arc_swap::ArcSwap<Behaviour>>, Arc<AtomicUsize>, Arc<AtomicUsize>);

fn answer(request: &http::Request<hyper::body::Incoming>, port: u16, state: &State) -> http::Response<Full<Bytes>> {
    let (behaviour, bodies, not_modified) = state;
    let behaviour = behaviour.load();
    let base = format!("https://localhost:{port}");
    let reply = |status: u16, body: String| {
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
        response
    };
    let discovery = |issuer: String| json!({"issuer": issuer, "jwks_uri": format!("{base}/jwks")}).to_string();
    match request.uri().path() {
        "/realms/corp/.well-known/openid-configuration" => reply(200, discovery(format!("{base}/realms/corp"))),
        "/impostor/.well-known/openid-configuration" => reply(200, discovery(format!("{base}/realms/corp"))),
        "/jwks" => {
            if let Some(status) = behaviour.failing {
                return reply(status, "<html>upstream error</html>".into());
            }
            let sent = request.headers().get(http::header::IF_NONE_MATCH).and_then(|v| v.to_str().ok());
            if sent == Some(behaviour.etag.as_str()) {
                not_modified.fetch_add(1, Ordering::Relaxed);
                return reply(304, String::new());
            }
            bodies.fetch_add(1, Ordering::Relaxed);
            let mut response = reply(200, behaviour.jwks.clone());
            response.headers_mut().insert(http::header::ETAG, behaviour.etag.parse().unwrap());
            response.headers_mut().insert(http::header::CACHE_CONTROL, "public, max-age=20".parse().unwrap());
            response
        }
        "/moved" => {
            let mut response = reply(302, String::new());
            response.headers_mut().insert(http::header::LOCATION, format!("{base}/jwks").parse().unwrap());
            response
        }
        "/huge" => reply(200, format!("{{\"keys\":[],\"pad\":\"{}\"}}", "x".repeat(64 * 1024))),
        _ => reply(404, String::new()),
    }
}

/// Fetches the slot's source as the refresher does (trusting `ca_pem`),
/// into the slot.
async fn fetch_into(slot: &mut Slot, ca_pem: &str) -> super::slot::Settled {
    let answer = remote(&slot.want.source, Some(ca_pem), slot.etag.as_ref()).await;
    slot.settle(answer, jiff::Timestamp::now())
}

#[tokio::test]
async fn a_held_set_follows_a_real_issuer_through_a_rotation_and_keeps_the_last_good_one_through_an_outage() {
    let issuer = Issuer::start().await;
    let source = KeySource::Discovery { issuer: issuer.url("/realms/corp") };
    let mut slot = Slot::new(Want { source, ca: None }, Instant::now());

    let first = fetch_into(&mut slot, &issuer.ca_pem).await;
    assert_eq!((first.result, first.document_changed), ("changed", true), "{:?}", slot.held.error);
    assert_eq!(slot.held.document.as_deref(), Some(jwks(&["first"]).as_str()));
    assert_eq!(first.after, std::time::Duration::from_secs(20), "the issuer's max-age, under 30 s");

    // Unchanged: the ETag is sent, a 304 comes back, nothing moves.
    let again = fetch_into(&mut slot, &issuer.ca_pem).await;
    assert_eq!((again.result, again.document_changed, again.error_changed), ("unchanged", false, false));
    assert_eq!((issuer.bodies.load(Ordering::Relaxed), issuer.not_modified.load(Ordering::Relaxed)), (1, 1));

    // The issuer rotates: the new set replaces the held one.
    issuer.behave(|b| (b.jwks, b.etag) = (jwks(&["first", "second"]), "\"v2\"".into()));
    let rotated = fetch_into(&mut slot, &issuer.ca_pem).await;
    assert_eq!((rotated.result, rotated.document_changed), ("changed", true));
    let rotated_set = jwks(&["first", "second"]);
    assert_eq!((slot.held.document.as_deref(), slot.held.keys), (Some(rotated_set.as_str()), 2));

    // An outage: HTTP 500 keeps the last good set.
    issuer.behave(|b| b.failing = Some(500));
    let failing = fetch_into(&mut slot, &issuer.ca_pem).await;
    assert_eq!((failing.result, failing.document_changed, failing.error_changed), ("failed", false, true));
    assert_eq!(slot.held.document.as_deref(), Some(rotated_set.as_str()));
    assert!(slot.held.error.as_deref().unwrap().contains("HTTP 500"), "{:?}", slot.held.error);

    // The issuer is gone: connection refused, the same set still held.
    let server = issuer.server;
    server.abort();
    let _ = server.await;
    let gone = fetch_into(&mut slot, &issuer.ca_pem).await;
    assert_eq!((gone.result, gone.document_changed, gone.error_changed), ("failed", false, true));
    assert_eq!(slot.held.document.as_deref(), Some(rotated_set.as_str()));
    let error = slot.held.error.as_deref().unwrap();
    assert!(error.contains("onnection refused") || error.contains("os error"), "{error}");
    assert_eq!(slot.held.keys, 2);
}

#[tokio::test]
async fn a_fetch_trusts_only_its_ca_follows_no_redirect_reads_at_most_64_kib_and_checks_the_issuer() {
    let issuer = Issuer::start().await;
    let list = |path: &str| KeySource::JwksUri { uri: issuer.url(path) };
    let ok = remote(&list("/jwks"), Some(&issuer.ca_pem), None).await.unwrap();
    assert!(matches!(ok, Answer::Document { .. }));

    // The public roots (no CA bundle) do not trust the issuer's CA.
    let untrusted = remote(&list("/jwks"), None, None).await.unwrap_err();
    assert!(matches!(untrusted, FetchError::Unreachable { .. }), "{untrusted}");
    assert!(untrusted.to_string().to_lowercase().contains("certificate"), "{untrusted}");
    // Another CA neither.
    let other = Issuer::start().await;
    let wrong_ca = remote(&list("/jwks"), Some(&other.ca_pem), None).await.unwrap_err();
    assert!(wrong_ca.to_string().to_lowercase().contains("certificate"), "{wrong_ca}");
    let no_ca = remote(&list("/jwks"), Some("not PEM"), None).await.unwrap_err();
    assert!(matches!(no_ca, FetchError::Ca(_)), "{no_ca}");

    let redirect = remote(&list("/moved"), Some(&issuer.ca_pem), None).await.unwrap_err();
    assert!(matches!(redirect, FetchError::Redirect { status: 302, .. }), "{redirect}");
    let huge = remote(&list("/huge"), Some(&issuer.ca_pem), None).await.unwrap_err();
    assert!(matches!(huge, FetchError::TooLarge { limit: 65536, .. }), "{huge}");
    let plain = KeySource::JwksUri { uri: format!("http://localhost:{}/jwks", issuer.port) };
    assert!(remote(&plain, Some(&issuer.ca_pem), None).await.is_err(), "http is never fetched");

    // A discovery document served for one issuer names another.
    let impostor = KeySource::Discovery { issuer: issuer.url("/impostor") };
    let mismatch = remote(&impostor, Some(&issuer.ca_pem), None).await.unwrap_err();
    assert!(mismatch.to_string().contains("names another issuer than the configured"), "{mismatch}");
    assert_eq!(issuer.bodies.load(Ordering::Relaxed), 1, "only the first fetch reached the key set");
}
