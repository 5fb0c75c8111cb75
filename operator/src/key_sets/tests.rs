//! The pure parts of key-set fetching: the refresh rule, what a key set
//! and a discovery document must be, what an answer does to a held set
//! (ETag included), the slots the Gateways want, the status, and the
//! seed a written config gives.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tokio::time::Instant;
use waycast_crds::config::ProviderConfig;
use waycast_crds::identity::{
    ConfigMapKeyRef, GatewayIdentity, GatewayIdentityStatus, IdentityProvider, ProviderKeySetStatus,
    ServiceAccountIssuer,
};

use super::document::{DocumentError, MAX_KEYS, discovery_url, jwks_uri, refresh_after, signing_keys};
use super::fetch::{Answer, FetchError, Want};
use super::slot::Slot;
use super::*;
use crate::compile::key_source::HeldKeySet;

const ISSUER: &str = "https://sso.example.com/realms/corp";

fn rsa(kid: &str) -> serde_json::Value {
    json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": "AQAB", "e": "AQAB"})
}

fn set(keys: &[serde_json::Value]) -> Bytes {
    Bytes::from(serde_json::to_vec(&json!({ "keys": keys })).unwrap())
}

#[test]
fn refresh_is_every_30_s_sooner_on_max_age_never_under_10_s() {
    let rows: [(Option<&str>, u64); 10] = [
        (None, 30),
        (Some("public, max-age=20"), 20),
        (Some("max-age=3600, must-revalidate"), 30),
        (Some("max-age=5"), 10),
        (Some("max-age=0"), 10),
        (Some("no-cache"), 10),
        (Some("NO-STORE"), 10),
        (Some("Max-Age=\"15\""), 15),
        (Some("max-age=soon"), 30),
        (Some("private"), 30),
    ];
    for (header, seconds) in rows {
        assert_eq!(refresh_after(header), Duration::from_secs(seconds), "{header:?}");
    }
}

#[test]
fn a_key_set_is_kept_only_with_a_signing_key_and_within_bounds() {
    let ec_without_use = json!({"kty": "EC", "crv": "P-256", "x": "a", "y": "b"});
    let encryption = json!({"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"});
    let symmetric = json!({"kty": "oct", "k": "c2VjcmV0"});
    let odd_use = json!({"kty": "OKP", "crv": "Ed25519", "x": "a", "use": 1});
    let many: Vec<serde_json::Value> = (0..=MAX_KEYS).map(|i| rsa(&format!("k{i}"))).collect();
    let huge = format!(r#"{{"keys":[{}],"pad":"{}"}}"#, rsa("a"), "x".repeat(64 * 1024));
    let rows: Vec<(&str, Bytes, Result<usize, &str>)> = vec![
        ("one RSA signing key", set(&[rsa("a")]), Ok(1)),
        (
            "signing keys counted, others skipped",
            set(&[rsa("a"), ec_without_use.clone(), encryption.clone(), symmetric.clone(), odd_use]),
            Ok(2),
        ),
        ("encryption and symmetric keys only", set(&[encryption, symmetric]), Err("no signing key")),
        ("no keys", set(&[]), Err("no signing key")),
        ("not JSON", Bytes::from_static(b"<html>502 Bad Gateway</html>"), Err("not a key set")),
        ("keys not an array", Bytes::from_static(br#"{"keys": {"kty": "RSA"}}"#), Err("not a key set")),
        ("a JSON array", Bytes::from_static(b"[]"), Err("not a key set")),
        ("not UTF-8", Bytes::from_static(b"{\"keys\": [\"\xff\"]}"), Err("not a key set")),
        ("65 keys", set(&many), Err("more than the 64")),
        ("over 64 KiB", Bytes::from(huge), Err("more than the 65536")),
    ];
    for (case, document, expected) in rows {
        match (signing_keys(&document), expected) {
            (Ok(keys), Ok(count)) => assert_eq!(keys, count, "{case}"),
            (Err(error), Err(text)) => assert!(error.to_string().contains(text), "{case}: {error}"),
            (got, expected) => panic!("{case}: {got:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn a_discovery_document_must_name_the_issuer_exactly_and_an_https_jwks_uri() {
    let document = |issuer: &str, uri: &str| serde_json::to_vec(&json!({"issuer": issuer, "jwks_uri": uri})).unwrap();
    let keys = "https://keys.example.com/jwks";
    assert_eq!(jwks_uri(&document(ISSUER, keys), ISSUER).unwrap(), keys);
    let rows: [(&str, Vec<u8>, &str); 5] = [
        ("another issuer", document("https://evil.example.com/realms/corp", keys), "differ from byte 8"),
        ("a trailing slash", document(&format!("{ISSUER}/"), keys), "36 bytes differ from byte 35"),
        ("http jwks_uri", document(ISSUER, "http://keys.example.com/jwks"), "jwks_uri must be an absolute https"),
        ("no jwks_uri", serde_json::to_vec(&json!({"issuer": ISSUER})).unwrap(), "not a discovery document"),
        ("over 64 KiB", vec![b' '; 64 * 1024 + 1], "more than the 65536"),
    ];
    for (case, document, expected) in rows {
        let error = jwks_uri(&document, ISSUER).unwrap_err();
        assert!(error.to_string().contains(expected), "{case}: {error}");
    }
    assert!(matches!(
        jwks_uri(&document("https://evil.example.com", keys), ISSUER),
        Err(DocumentError::IssuerMismatch { .. })
    ));
    assert_eq!(discovery_url(ISSUER), format!("{ISSUER}/.well-known/openid-configuration"));
    assert_eq!(discovery_url(&format!("{ISSUER}/")), format!("{ISSUER}/.well-known/openid-configuration"));
}

fn want() -> Want {
    Want { source: KeySource::Discovery { issuer: ISSUER.into() }, ca: None }
}

fn at(second: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(2_000_000_000 + second).unwrap()
}

fn document(body: Bytes, etag: Option<&str>) -> Result<Answer, FetchError> {
    let etag = etag.map(|tag| ("https://keys.example.com/jwks".to_owned(), tag.to_owned()));
    let from = "https://keys.example.com/jwks".to_owned();
    Ok(Answer::Document { from, body, etag, cache_control: Some("max-age=15".into()) })
}

fn refused() -> Result<Answer, FetchError> {
    Err(FetchError::Status { url: "https://keys.example.com/jwks".into(), status: 500 })
}

#[test]
fn a_new_document_replaces_the_held_one_and_an_unchanged_one_changes_nothing() {
    let mut slot = Slot::new(want(), Instant::now());
    let first = slot.settle(document(set(&[rsa("a")]), Some("\"v1\"")), at(0));
    assert_eq!((first.result, first.document_changed, first.error_changed), ("changed", true, false));
    assert_eq!(first.after, Duration::from_secs(15), "the server's max-age");
    assert_eq!((slot.held.keys, slot.held.fetched_at), (1, Some(at(0))));
    assert_eq!(slot.etag.as_ref().map(|(_, tag)| tag.as_str()), Some("\"v1\""));

    let again = slot.settle(document(set(&[rsa("a")]), Some("\"v1\"")), at(30));
    assert_eq!((again.result, again.document_changed, again.error_changed), ("unchanged", false, false));
    assert_eq!(slot.held.fetched_at, Some(at(0)), "fetchedAt is when the content last changed");

    let rotated = slot.settle(document(set(&[rsa("a"), rsa("b")]), Some("\"v2\"")), at(60));
    assert_eq!((rotated.result, rotated.document_changed), ("changed", true));
    assert_eq!((slot.held.keys, slot.held.fetched_at), (2, Some(at(60))));
    assert!(slot.held.document.as_deref().unwrap().contains("\"b\""));
}

#[test]
fn a_failure_or_a_bad_set_keeps_the_last_good_one_and_says_why_once() {
    let mut slot = Slot::new(want(), Instant::now());
    slot.settle(document(set(&[rsa("a")]), Some("\"v1\"")), at(0));
    let good = slot.held.document.clone();

    let failed = slot.settle(refused(), at(30));
    assert_eq!((failed.result, failed.document_changed, failed.error_changed), ("failed", false, true));
    assert_eq!(failed.after, Duration::from_secs(10), "a failed fetch is tried again soon");
    assert_eq!(slot.held.document, good, "the last good set keeps serving");
    assert!(slot.held.error.as_deref().unwrap().contains("HTTP 500"));
    let again = slot.settle(refused(), at(40));
    assert!(!again.error_changed, "the same error again is no news");

    let invalid = slot.settle(document(Bytes::from_static(b"<html>oops</html>"), Some("\"bad\"")), at(50));
    assert_eq!((invalid.result, invalid.document_changed, invalid.error_changed), ("invalid", false, true));
    assert_eq!(slot.held.document, good);
    assert_eq!(slot.etag, None, "a refused document's ETag is not sent again");
    assert!(slot.held.error.as_deref().unwrap().contains("not a key set"), "{:?}", slot.held.error);

    let recovered = slot.settle(document(set(&[rsa("a")]), None), at(60));
    assert_eq!((recovered.result, recovered.document_changed, recovered.error_changed), ("unchanged", false, true));
    assert_eq!(slot.held.error, None);
}

#[test]
fn a_304_keeps_the_held_set_only_when_one_is_held() {
    let mut slot = Slot::new(want(), Instant::now());
    let nothing_held = slot.settle(Ok(Answer::NotModified { cache_control: None }), at(0));
    assert_eq!((nothing_held.result, nothing_held.error_changed), ("failed", true));
    assert_eq!(slot.held.document, None);

    slot.settle(document(set(&[rsa("a")]), Some("\"v1\"")), at(10));
    let not_modified = slot.settle(Ok(Answer::NotModified { cache_control: Some("max-age=12".into()) }), at(20));
    assert_eq!((not_modified.result, not_modified.document_changed), ("unchanged", false));
    assert_eq!(not_modified.after, Duration::from_secs(12));
    assert_eq!(slot.etag.as_ref().map(|(_, tag)| tag.as_str()), Some("\"v1\""), "the ETag is kept");
    assert_eq!(slot.held.keys, 1);
}

fn provider(name: &str) -> IdentityProvider {
    IdentityProvider {
        name: name.into(),
        issuer: Some(ISSUER.into()),
        audiences: vec!["waycast".into()],
        ..IdentityProvider::default()
    }
}

fn gateway(providers: Vec<IdentityProvider>) -> Gateway {
    let mut gateway = waycast_mock::fixtures::objects::gateway("platform", "gw");
    gateway.spec.identity = Some(GatewayIdentity { providers });
    gateway
}

#[test]
fn each_provider_of_each_live_gateway_wants_its_source_and_a_ca_only_for_https() {
    let ca = ConfigMapKeyRef { name: "corp-ca".into(), key: "ca.crt".into() };
    let mut corp = provider("corp");
    corp.ca_config_map_ref = Some(ca.clone());
    let mut pinned = provider("pinned");
    pinned.config_map_ref = Some(ConfigMapKeyRef { name: "jwks".into(), key: "jwks.json".into() });
    pinned.ca_config_map_ref = Some(ca.clone());
    let cluster = IdentityProvider {
        name: "cluster".into(),
        service_account_issuer: Some(ServiceAccountIssuer {}),
        audiences: vec!["waycast".into()],
        ..IdentityProvider::default()
    };
    let live = gateway(vec![corp, pinned, cluster]);
    let mut leaving = gateway(vec![provider("corp")]);
    leaving.metadata.name = Some("leaving".into());
    leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(0)));
    let (wanted, cluster) = wanted([&live, &leaving]);
    assert!(cluster, "a provider trusts the cluster's issuer");
    let gw = ObjectKey { namespace: "platform".into(), name: "gw".into() };
    let slot = |name: &str| wanted.get(&(gw.clone(), name.to_owned())).unwrap();
    assert_eq!(slot("corp").source, KeySource::Discovery { issuer: ISSUER.into() });
    assert_eq!(slot("corp").ca, Some(("platform".into(), ca)));
    let pinned_source =
        KeySource::ConfigMap { namespace: "platform".into(), name: "jwks".into(), key: "jwks.json".into() };
    assert_eq!((&slot("pinned").source, &slot("pinned").ca), (&pinned_source, &None));
    assert_eq!(slot("cluster").source, KeySource::Cluster);
    assert_eq!(wanted.len(), 3, "a Gateway being deleted wants nothing: {:?}", wanted.keys());
}

#[test]
fn the_status_says_per_provider_whether_a_key_set_is_loaded() {
    let mut edited = provider("edited");
    edited.issuer = Some("https://new.example.com".into());
    let gateway = gateway(vec![provider("ok"), provider("failing"), provider("never"), provider("new"), edited]);
    let gw = ObjectKey::of(&gateway.metadata);
    let source = KeySource::Discovery { issuer: ISSUER.into() };
    let held = |document: Option<&str>, error: Option<&str>| HeldKeySet {
        source: source.clone(),
        document: document.map(Into::into),
        keys: usize::from(document.is_some()),
        fetched_at: document.map(|_| at(0)),
        error: error.map(Into::into),
        seeded_issuer: None,
    };
    let index: KeySetIndex = [
        ("ok", held(Some("{}"), None)),
        ("failing", held(Some("{}"), Some("GET x: HTTP 500"))),
        ("never", held(None, Some("GET x: refused"))),
        // Fetched from the issuer it named before its edit.
        ("edited", held(Some("{}"), None)),
    ]
    .into_iter()
    .map(|(name, held)| ((gw.clone(), name.to_owned()), held))
    .collect();
    let published = Published { index: Arc::new(index), cluster_issuer: None };
    let status = status_of(&gateway, &published).unwrap();
    let row = |name: &str| status.providers.iter().find(|p| p.name == name).unwrap();
    assert_eq!((row("ok").keys, row("ok").message.as_deref()), (Some(1), None));
    assert_eq!(row("ok").fetched_at.as_ref().map(|t| t.0), Some(at(0)));
    assert_eq!(row("failing").keys, Some(1));
    assert!(row("failing").message.as_deref().unwrap().contains("HTTP 500; the key set loaded before keeps serving"));
    assert_eq!(row("never").keys, None);
    assert!(row("never").message.as_deref().unwrap().contains("refused; no key set: the pods refuse"));
    for name in ["new", "edited"] {
        assert_eq!((row(name).keys, row(name).fetched_at.as_ref()), (None, None), "{name}");
        assert!(row(name).message.as_deref().unwrap().contains("not fetched yet"), "{name}");
    }
    let names: Vec<&str> = status.providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["ok", "failing", "never", "new", "edited"], "the spec's order");
    assert_eq!(status_of(&self::gateway(Vec::new()), &published), None);
}

#[test]
fn a_seed_is_the_written_set_when_it_still_passes_and_keeps_its_fetch_time() {
    let mut gateway = waycast_mock::fixtures::objects::gateway("platform", "gw");
    let fetched = jiff::Timestamp::from_second(1_900_000_000).unwrap();
    gateway.status = Some(waycast_crds::GatewayStatus {
        identity: Some(GatewayIdentityStatus {
            providers: vec![ProviderKeySetStatus {
                name: "corp".into(),
                keys: Some(1),
                fetched_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(fetched)),
                message: None,
            }],
        }),
        ..Default::default()
    });
    let set = r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#;
    let mut written = ProviderConfig::new("corp", ISSUER, "waycast");
    written.key_set = Some(set.into());
    let seed = seed::seed_of(&gateway, &written).unwrap();
    assert_eq!(seed.source, KeySource::Discovery { issuer: ISSUER.into() });
    assert_eq!((seed.document.as_deref(), seed.keys, seed.fetched_at), (Some(set), 1, Some(fetched)));
    let mut cluster = ProviderConfig::new("cluster", "https://kubernetes.default.svc", "waycast");
    cluster.service_accounts = true;
    cluster.key_set = Some(set.into());
    let seed = seed::seed_of(&gateway, &cluster).unwrap();
    assert_eq!((seed.source, seed.fetched_at), (KeySource::Cluster, None));
    written.key_set = Some(r#"{"keys":[]}"#.into());
    assert!(seed::seed_of(&gateway, &written).is_none(), "no signing key: nothing to hold");
    written.key_set = None;
    assert!(seed::seed_of(&gateway, &written).is_none());
}
