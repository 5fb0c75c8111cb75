//! The Keycloak harness against a real Keycloak: what later sign-in tests
//! rely on (discovery, key sets, token claims, rotation, lifespans) holds.
//! Under `make test` or CI a missing Keycloak fails this test; elsewhere it
//! is skipped loudly (`make keycloak` installs it).

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use serde_json::Value;
use waycast_e2e::keycloak::{ClientSpec, Keycloak, OldKeys, UserSpec, decode_jwt};

const REALM: &str = "corp";
const AUDIENCE: &str = "waycast-gateway";

/// The `kid`s of `jwks`'s RS256 signing keys.
fn rs256_kids(jwks: &Value) -> Vec<String> {
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|key| key["kty"] == "RSA" && key["alg"] == "RS256" && key["use"] == "sig")
        .map(|key| key["kid"].as_str().unwrap().to_owned())
        .collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value.as_array().map(|list| list.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

#[tokio::test]
async fn a_real_keycloak_issues_tokens_the_gateway_can_be_told_to_trust() {
    let Some(keycloak) = Keycloak::start_or_skip(IpAddr::V4(Ipv4Addr::LOCALHOST), "keycloak").await.unwrap() else {
        return;
    };
    assert!(keycloak.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    keycloak.create_realm(REALM).await.unwrap();
    let issuer = keycloak.issuer(REALM);
    assert!(issuer.starts_with("https://127.0.0.1:"), "{issuer}");

    // Discovery names the issuer exactly as tokens carry it, and a key set
    // with an RS256 signing key.
    let discovery = keycloak.discovery(REALM).await.unwrap();
    assert_eq!(discovery["issuer"], issuer.as_str());
    let jwks_uri = discovery["jwks_uri"].as_str().unwrap().to_owned();
    assert!(jwks_uri.starts_with(&issuer), "{jwks_uri}");
    let first_kids = rs256_kids(&keycloak.get_json(&jwks_uri).await.unwrap());
    assert!(!first_kids.is_empty(), "no RS256 key in {jwks_uri}");

    let client =
        ClientSpec { client_id: "waycast".into(), secret: Some("client-secret-1".into()), audience: AUDIENCE.into() };
    keycloak.create_client(REALM, &client).await.unwrap();
    keycloak.create_group(REALM, "ml-team").await.unwrap();
    let finance = keycloak.create_group(REALM, "finance").await.unwrap();
    let alice = UserSpec {
        username: "alice".into(),
        password: "alice's p@ss & word".into(),
        email: "alice@example.com".into(),
        groups: vec!["ml-team".into()],
    };
    let alice_id = keycloak.create_user(REALM, &alice).await.unwrap();

    // A person's access token: issuer, our audience, their group (by name,
    // not path), who they are; signed by a key the key set lists.
    let tokens = keycloak.password_token(REALM, &client, &alice.username, &alice.password).await.unwrap();
    assert!(tokens.id_token.is_some(), "scope openid gives an ID token");
    let (header, claims) = decode_jwt(&tokens.access_token).unwrap();
    assert_eq!(header["alg"], "RS256");
    let kid = header["kid"].as_str().unwrap();
    assert!(first_kids.iter().any(|k| k == kid), "{kid} not in {first_kids:?}");
    assert_eq!(claims["iss"], issuer.as_str());
    assert!(strings(&claims["aud"]).contains(&AUDIENCE), "aud: {}", claims["aud"]);
    assert_eq!(strings(&claims["groups"]), ["ml-team"]);
    assert_eq!(claims["preferred_username"], "alice");
    assert_eq!(claims["email"], "alice@example.com");
    assert_eq!(claims["sub"], alice_id.as_str());
    assert!(keycloak.password_token(REALM, &client, "alice", "wrong").await.is_err());

    // A group joined later shows in the next token.
    keycloak.add_to_group(REALM, &alice_id, &finance).await.unwrap();
    let tokens = keycloak.password_token(REALM, &client, &alice.username, &alice.password).await.unwrap();
    let (_, claims) = decode_jwt(&tokens.access_token).unwrap();
    let mut groups = strings(&claims["groups"]);
    groups.sort_unstable();
    assert_eq!(groups, ["finance", "ml-team"]);

    // A public client (a CLI's): passwords, but no credentials of its own.
    let cli = ClientSpec { client_id: "waycast-cli".into(), secret: None, audience: AUDIENCE.into() };
    keycloak.create_client(REALM, &cli).await.unwrap();
    let tokens = keycloak.password_token(REALM, &cli, &alice.username, &alice.password).await.unwrap();
    let (_, claims) = decode_jwt(&tokens.access_token).unwrap();
    assert_eq!((claims["azp"].as_str(), claims["sub"].as_str()), (Some("waycast-cli"), Some(alice_id.as_str())));
    assert!(strings(&claims["aud"]).contains(&AUDIENCE), "aud: {}", claims["aud"]);
    assert!(keycloak.client_credentials_token(REALM, &cli).await.is_err());

    // A workload's token (client credentials): the same issuer and audience.
    let workload = keycloak.client_credentials_token(REALM, &client).await.unwrap();
    let (_, claims) = decode_jwt(&workload.access_token).unwrap();
    assert_eq!(claims["iss"], issuer.as_str());
    assert!(strings(&claims["aud"]).contains(&AUDIENCE), "aud: {}", claims["aud"]);
    assert_eq!(claims["azp"], "waycast");
    assert_ne!(claims["sub"], alice_id.as_str());

    // A short-lived token, for expiry tests.
    keycloak.set_access_token_lifespan(REALM, Duration::from_secs(5)).await.unwrap();
    let short = keycloak.password_token(REALM, &client, &alice.username, &alice.password).await.unwrap();
    assert_eq!(short.expires_in, 5);
    let (_, claims) = decode_jwt(&short.access_token).unwrap();
    assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 5);

    // Rotation with a grace period: new tokens carry the new kid; the key
    // set lists both until the old one is removed.
    let new_kid = keycloak.rotate_signing_key(REALM, OldKeys::Passive).await.unwrap();
    assert!(!first_kids.contains(&new_kid));
    let rotated = keycloak.password_token(REALM, &client, &alice.username, &alice.password).await.unwrap();
    assert_eq!(decode_jwt(&rotated.access_token).unwrap().0["kid"], new_kid.as_str());
    let kids = rs256_kids(&keycloak.get_json(&jwks_uri).await.unwrap());
    assert!(kids.contains(&new_kid) && kids.iter().any(|k| k == kid), "{kids:?}");
    keycloak.remove_signing_key(REALM, kid).await.unwrap();
    assert_eq!(rs256_kids(&keycloak.get_json(&jwks_uri).await.unwrap()), [new_kid.as_str()]);

    // Rotation without one: the old key leaves the key set at once.
    let third_kid = keycloak.rotate_signing_key(REALM, OldKeys::Removed).await.unwrap();
    assert_eq!(rs256_kids(&keycloak.get_json(&jwks_uri).await.unwrap()), [third_kid.as_str()]);
    let workload = keycloak.client_credentials_token(REALM, &client).await.unwrap();
    assert_eq!(decode_jwt(&workload.access_token).unwrap().0["kid"], third_kid.as_str());
}
