//! What an issuer serves never reaches the Gateway's status or Events as
//! text: a document that is not what it must be is refused in our words —
//! what failed, where it was read, the byte where reading stopped — and
//! every error is bounded. (serde's own messages quote what they read:
//! `invalid type: string "…", expected a sequence`.)

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use tokio::time::Instant;

use bytes::Bytes;
use waycast_crds::identity::{GatewayIdentity, IdentityProvider};

use super::document::{issuer, jwks_uri};
use super::fetch::{Answer, FetchError, MAX_URL_SHOWN, Want, remote, shown};
use super::slot::{MAX_ERROR_BYTES, Slot};
use super::*;

const ISSUER: &str = "https://sso.example.com/realms/corp";
const JWKS: &str = "https://sso.example.com/realms/corp/certs";
/// What a hostile or broken issuer puts in its documents.
const PLANTED: &str = "PLANTED-TEXT";

fn want() -> Want {
    Want { source: KeySource::Discovery { issuer: ISSUER.into() }, ca: None }
}

fn served(body: String) -> Result<Answer, FetchError> {
    Ok(Answer::Document { from: JWKS.into(), body: Bytes::from(body), etag: None, cache_control: None })
}

#[test]
fn a_refused_key_set_is_described_never_quoted() {
    let rows = [
        // serde: invalid type: string "PLANTED-TEXT…", expected a sequence
        (format!(r#"{{"keys": "{PLANTED} see https://evil.example.com"}}"#), "JSON of another shape (at byte"),
        (format!(r#"{{"keys": [], "{PLANTED}": "#), "not JSON (at byte"),
        (format!("<html><title>{PLANTED}</title></html>"), "not JSON (at byte 0)"),
    ];
    for (body, expected) in rows {
        let mut slot = Slot::new(want(), Instant::now());
        slot.settle(served(body.clone()), jiff::Timestamp::UNIX_EPOCH);
        let error = slot.held.error.clone().unwrap();
        assert!(!error.contains(PLANTED), "{body}: {error}");
        assert!(error.starts_with(&format!("{JWKS}: not a key set: ")), "the URL fetched: {error}");
        assert!(error.contains(expected), "{body}: {error}");
    }
    // Not UTF-8: where the bytes stop being text.
    let mut slot = Slot::new(want(), Instant::now());
    let answer = Answer::Document {
        from: JWKS.into(),
        body: Bytes::from_static(b"{\"keys\": [\"\xff\"]}"),
        etag: None,
        cache_control: None,
    };
    slot.settle(Ok(answer), jiff::Timestamp::UNIX_EPOCH);
    assert_eq!(slot.held.error.as_deref(), Some(format!("{JWKS}: not a key set: not UTF-8 (at byte 11)").as_str()));
}

#[test]
fn a_refused_discovery_document_is_described_never_quoted() {
    let impostor = serde_json::json!({"issuer": format!("https://{PLANTED}.example.com"), "jwks_uri": JWKS});
    let error = jwks_uri(impostor.to_string().as_bytes(), ISSUER).unwrap_err().to_string();
    assert!(!error.contains(PLANTED) && error.contains("names another issuer"), "{error}");
    assert!(error.contains("differ from byte 8"), "{error}");
    let wrong_type = format!(r#"{{"issuer": "{ISSUER}", "jwks_uri": ["{PLANTED}"]}}"#);
    let error = jwks_uri(wrong_type.as_bytes(), ISSUER).unwrap_err().to_string();
    assert!(!error.contains(PLANTED) && error.contains("JSON of another shape (at byte"), "{error}");
    // The API server's own, for the cluster's issuer.
    let error = issuer(format!(r#"{{"issuer": ["{PLANTED}"]}}"#).as_bytes()).unwrap_err().to_string();
    assert!(!error.contains(PLANTED) && error.contains("not a discovery document"), "{error}");
}

#[test]
fn urls_reasons_and_held_errors_are_bounded() {
    // A jwks_uri is the discovery document's: up to 2048 bytes of it.
    let long = format!("https://keys.example.com/{}", "a".repeat(4000));
    let url = shown(&long);
    assert!(url.len() <= MAX_URL_SHOWN + "…".len() && url.ends_with('…'), "{}", url.len());
    assert_eq!(shown(JWKS), JWKS);
    let mut slot = Slot::new(want(), Instant::now());
    let refused = FetchError::Unreachable { url: "x".repeat(4000), reason: "y".repeat(4000) };
    slot.settle(Err(refused), jiff::Timestamp::UNIX_EPOCH);
    assert!(slot.held.error.as_ref().unwrap().len() <= MAX_ERROR_BYTES);
    // The status and the Event say it with what it means, within the
    // 1 KiB an Event's note may hold.
    let mut gateway = waycast_mock::fixtures::objects::gateway("platform", "gw");
    let provider = IdentityProvider {
        name: "p".repeat(63),
        issuer: Some(ISSUER.into()),
        audiences: vec!["waycast".into()],
        ..IdentityProvider::default()
    };
    gateway.spec.identity = Some(GatewayIdentity { providers: vec![provider.clone()] });
    let key = (ObjectKey::of(&gateway.metadata), provider.name.clone());
    let published = Published { index: Arc::new([(key, slot.held.clone())].into()), cluster_issuer: None };
    let message = status_of(&gateway, &published).unwrap().providers[0].message.clone().unwrap();
    assert!(message.ends_with("no key set: the pods refuse this provider's tokens"), "{message}");
    let (_, _, note) = event_of(&provider.name, &slot.held);
    assert!(note.len() <= 1024, "{}", note.len());
}

#[tokio::test]
async fn a_ca_bundle_that_does_not_read_is_not_quoted() {
    let source = KeySource::JwksUri { uri: JWKS.into() };
    for pem in [
        format!("-----BEGIN {PLANTED}-----\nAAAA\n"),
        format!("-----BEGIN CERTIFICATE-----\n{PLANTED}!!\n-----END CERTIFICATE-----\n"),
    ] {
        // rustls' own text quotes the line it stopped at (as bytes).
        let error = remote(&source, Some(&pem), None).await.unwrap_err().to_string();
        assert!(error.starts_with("the CA bundle (caConfigMapRef): PEM section "), "{error}");
        assert!(error.ends_with(" does not read"), "{error}");
    }
}
