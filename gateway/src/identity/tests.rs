//! Tokens are signed here with ring directly and assembled by hand
//! (base64url of the header and claims JSON), and key sets are written as
//! JSON by hand: nothing of jsonwebtoken's own encoder is trusted to check
//! its verifier.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::cell::Cell;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jiff::Timestamp;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair as _};
use serde_json::{Value, json};

use super::*;

mod email_verified;

/// A 2048-bit RSA key made once with
/// `openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 | openssl pkcs8 -topk8 -nocrypt -outform DER`,
/// for these tests only.
const RSA_PKCS8: &[u8] = include_bytes!("testdata/rsa-2048-test-only.pk8.der");

const ISSUER: &str = "https://sso.example.com/realms/corp";
const NOW: i64 = 1_800_000_000;

fn now() -> Timestamp {
    Timestamp::from_second(NOW).unwrap()
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

type Sign = Box<dyn Fn(&[u8]) -> Vec<u8>>;

/// A signing key, its JWK and the `alg` its tokens name.
struct Signer {
    kid: &'static str,
    alg: &'static str,
    jwk: Value,
    sign: Sign,
}

fn rsa_signer() -> Signer {
    let pair = signature::RsaKeyPair::from_pkcs8(RSA_PKCS8).unwrap();
    let public = signature::RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
    let jwk =
        json!({"kty": "RSA", "kid": "rsa-1", "alg": "RS256", "use": "sig", "n": b64(&public.n), "e": b64(&public.e)});
    let sign = move |message: &[u8]| {
        let mut signature = vec![0; pair.public().modulus_len()];
        pair.sign(&signature::RSA_PKCS1_SHA256, &SystemRandom::new(), message, &mut signature).unwrap();
        signature
    };
    Signer { kid: "rsa-1", alg: "RS256", jwk, sign: Box::new(sign) }
}

fn ec_signer() -> Signer {
    let rng = SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": "ec-1", "x": b64(&point[1..33]), "y": b64(&point[33..65])});
    let sign = move |message: &[u8]| pair.sign(&SystemRandom::new(), message).unwrap().as_ref().to_vec();
    Signer { kid: "ec-1", alg: "ES256", jwk, sign: Box::new(sign) }
}

fn ed_signer() -> Signer {
    let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed-1", "alg": "EdDSA", "x": b64(pair.public_key())});
    let sign = move |message: &[u8]| pair.sign(message).as_ref().to_vec();
    Signer { kid: "ed-1", alg: "EdDSA", jwk, sign: Box::new(sign) }
}

fn key_set<'v>(jwks: impl IntoIterator<Item = &'v Value>) -> KeySet {
    let jwks: Vec<&Value> = jwks.into_iter().collect();
    KeySet::parse(json!({ "keys": jwks }).to_string().as_bytes()).unwrap()
}

fn provider<'v>(jwks: impl IntoIterator<Item = &'v Value>) -> Provider {
    Provider::new("corp", ISSUER, &["waycast", "other"], "email", Some("groups"), key_set(jwks)).unwrap()
}

fn claims() -> Value {
    json!({
        "iss": ISSUER, "aud": "waycast", "sub": "f81d4fae", "exp": NOW + 300, "iat": NOW - 10, "nbf": NOW - 10,
        "email": "ada@example.com", "groups": ["ml-research", "staff"], "azp": "ide",
    })
}

fn header(signer: &Signer) -> Value {
    json!({"alg": signer.alg, "kid": signer.kid, "typ": "JWT"})
}

/// `header.claims.signature`, signed by `signer`, with the header and the
/// claims as given (any JSON text).
fn token_of(signer: &Signer, header: &str, claims: &str) -> String {
    let signed = format!("{}.{}", b64(header), b64(claims));
    let signature = (signer.sign)(signed.as_bytes());
    format!("{signed}.{}", b64(signature))
}

fn token(signer: &Signer, claims: &Value) -> String {
    token_of(signer, &header(signer).to_string(), &claims.to_string())
}

/// `claims()` with `changes` merged in (a null removes a claim).
fn claims_with(changes: Value) -> Value {
    let mut claims = claims();
    for (name, value) in changes.as_object().unwrap() {
        if value.is_null() {
            claims.as_object_mut().unwrap().remove(name);
        } else {
            claims[name] = value.clone();
        }
    }
    claims
}

#[test]
fn tokens_of_each_accepted_algorithm_verify() {
    let signers = [rsa_signer(), ec_signer(), ed_signer()];
    let corp = provider(signers.iter().map(|signer| &signer.jwk));
    assert_eq!(corp.keys().len(), 3);
    for signer in &signers {
        let verified = verify(&token(signer, &claims()), &corp, now()).unwrap();
        assert_eq!(&*verified.provider, "corp", "{}", signer.alg);
        assert_eq!(&*verified.user, "ada@example.com");
        assert_eq!(verified.groups.iter().map(|g| &**g).collect::<Vec<_>>(), ["ml-research", "staff"]);
        assert_eq!(verified.exp, NOW + 300);
        // An audience array that names one of ours; no groups claim at all.
        let other = claims_with(json!({"aud": ["someone-else", "other"], "groups": null}));
        let verified = verify(&token(signer, &other), &corp, now()).unwrap();
        assert!(verified.groups.is_empty());
        // No kid: the set's keys of the algorithm are tried.
        let kidless = token_of(signer, &json!({"alg": signer.alg}).to_string(), &claims().to_string());
        assert!(verify(&kidless, &corp, now()).is_ok(), "{}", signer.alg);
    }
    // RFC 9864's fully specified name for Ed25519.
    let ed = &signers[2];
    let named = token_of(ed, &json!({"alg": "Ed25519", "kid": "ed-1"}).to_string(), &claims().to_string());
    assert!(verify(&named, &corp, now()).is_ok());
    // Fractional NumericDates are read (their fraction dropped).
    let fractional = claims_with(json!({"exp": NOW as f64 + 300.7, "iat": NOW as f64 - 0.5}));
    assert_eq!(verify(&token(&signers[0], &fractional), &corp, now()).unwrap().exp, NOW + 300);
}

#[test]
fn time_claims_are_checked_with_a_small_skew() {
    let signer = rsa_signer();
    let corp = provider([&signer.jwk]);
    let check = |changes: Value| verify(&token(&signer, &claims_with(changes)), &corp, now()).map(|_| ());
    assert_eq!(check(json!({"exp": NOW - SKEW_SECONDS - 1})), Err(Refusal::TokenExpired));
    assert_eq!(check(json!({"exp": NOW - SKEW_SECONDS})), Err(Refusal::TokenExpired));
    assert_eq!(check(json!({"exp": NOW - SKEW_SECONDS + 1})), Ok(()), "within the skew");
    assert_eq!(check(json!({"nbf": NOW + SKEW_SECONDS + 1})), Err(Refusal::TokenNotYetValid));
    assert_eq!(check(json!({"nbf": NOW + SKEW_SECONDS})), Ok(()), "within the skew");
    assert_eq!(check(json!({"iat": NOW + 3600})), Err(Refusal::TokenNotYetValid), "issued in the future");
    assert_eq!(check(json!({"nbf": null, "iat": null})), Ok(()), "nbf and iat are optional");
    assert_eq!(check(json!({"exp": null})), Err(Refusal::MissingClaim), "exp is required");
    assert_eq!(check(json!({"exp": "tomorrow"})), Err(Refusal::MalformedToken));
    assert_eq!(check(json!({"exp": i64::MAX})), Ok(()), "a far exp does not overflow");
}

#[test]
fn issuer_audience_and_user_are_checked() {
    let signer = ec_signer();
    let corp = provider([&signer.jwk]);
    let check = |changes: Value| verify(&token(&signer, &claims_with(changes)), &corp, now()).map(|_| ());
    assert_eq!(check(json!({"aud": "someone-else"})), Err(Refusal::WrongAudience));
    assert_eq!(check(json!({"aud": ["a", "b"]})), Err(Refusal::WrongAudience));
    assert_eq!(check(json!({"aud": []})), Err(Refusal::WrongAudience));
    assert_eq!(check(json!({"aud": "WAYCAST"})), Err(Refusal::WrongAudience), "exact");
    assert_eq!(check(json!({"aud": null})), Err(Refusal::MissingClaim));
    assert_eq!(check(json!({"aud": 7})), Err(Refusal::MalformedToken));
    assert_eq!(check(json!({"iss": "https://evil.example.com/realms/corp"})), Err(Refusal::UnknownIssuer));
    assert_eq!(check(json!({"iss": format!("{ISSUER}/")})), Err(Refusal::UnknownIssuer), "exact");
    assert_eq!(check(json!({"iss": null})), Err(Refusal::MissingClaim));
    assert_eq!(check(json!({"email": null})), Err(Refusal::MissingClaim));
    assert_eq!(check(json!({"email": ""})), Err(Refusal::MissingClaim));
    assert_eq!(check(json!({"email": 42})), Err(Refusal::MalformedToken));
    assert_eq!(check(json!({"groups": "staff"})), Err(Refusal::MalformedToken), "groups: an array of strings");
    assert_eq!(check(json!({"groups": ["staff", 1]})), Err(Refusal::MalformedToken));
}

#[test]
fn a_tampered_token_is_refused_for_its_signature() {
    let signer = rsa_signer();
    let corp = provider([&signer.jwk]);
    let good = token(&signer, &claims());
    let [header, _, signature]: [&str; 3] = good.split('.').collect::<Vec<_>>().try_into().unwrap();
    // A payload naming someone else under the original signature.
    let forged = b64(claims_with(json!({"email": "root@example.com"})).to_string());
    assert_eq!(verify(&format!("{header}.{forged}.{signature}"), &corp, now()), Err(Refusal::BadSignature));
    // Even one that also extends its own expiry and audience.
    let forged = b64(claims_with(json!({"exp": NOW + 99_999, "aud": "anything"})).to_string());
    assert_eq!(verify(&format!("{header}.{forged}.{signature}"), &corp, now()), Err(Refusal::BadSignature));
    // A signature of one flipped bit, a truncated one, none.
    let mut bytes = URL_SAFE_NO_PAD.decode(signature).unwrap();
    bytes[10] ^= 1;
    let payload = good.split('.').nth(1).unwrap();
    assert_eq!(verify(&format!("{header}.{payload}.{}", b64(&bytes)), &corp, now()), Err(Refusal::BadSignature));
    assert_eq!(verify(&format!("{header}.{payload}.{}", b64(&bytes[..100])), &corp, now()), Err(Refusal::BadSignature));
    assert_eq!(verify(&format!("{header}.{payload}."), &corp, now()), Err(Refusal::BadSignature));
    // Signed by another key under the set's kid.
    let impostor = ec_signer();
    let other = ec_signer();
    let corp_ec = provider([&other.jwk]);
    let by_impostor = token_of(&impostor, &json!({"alg": "ES256", "kid": "ec-1"}).to_string(), &claims().to_string());
    assert_eq!(verify(&by_impostor, &corp_ec, now()), Err(Refusal::BadSignature));
}

#[test]
fn unsigned_and_hmac_tokens_are_never_accepted() {
    let signer = rsa_signer();
    let corp = provider([&signer.jwk, &json!({"kty": "oct", "kid": "hmac", "k": b64(b"shared-secret")})]);
    assert_eq!(corp.keys().len(), 1, "a symmetric key is never kept");
    let claims = b64(claims().to_string());
    for alg in ["none", "None", "NONE", "nOnE"] {
        let unsigned = format!("{}.{claims}.", b64(json!({"alg": alg, "kid": "rsa-1"}).to_string()));
        assert!(is_token_shaped(unsigned.as_bytes()), "an unsigned token is refused as a token, not tried as a key");
        assert_eq!(verify(&unsigned, &corp, now()), Err(Refusal::DisallowedAlgorithm), "{alg}");
    }
    // The classic confusion: an HMAC whose secret is the issuer's public
    // key, in each form a verifier might hand over as "the key".
    let pair = signature::RsaKeyPair::from_pkcs8(RSA_PKCS8).unwrap();
    let public_der = pair.public().as_ref().to_vec();
    let public_jwk = signer.jwk.to_string().into_bytes();
    let n = URL_SAFE_NO_PAD.decode(signer.jwk["n"].as_str().unwrap()).unwrap();
    for (alg, hmac) in
        [("HS256", ring::hmac::HMAC_SHA256), ("HS384", ring::hmac::HMAC_SHA384), ("HS512", ring::hmac::HMAC_SHA512)]
    {
        for secret in [&public_der, &public_jwk, &n, &b"shared-secret".to_vec()] {
            for kid in ["rsa-1", "hmac"] {
                let header = b64(json!({"alg": alg, "kid": kid}).to_string());
                let signed = format!("{header}.{claims}");
                let tag = ring::hmac::sign(&ring::hmac::Key::new(hmac, secret), signed.as_bytes());
                let token = format!("{signed}.{}", b64(tag));
                assert_eq!(verify(&token, &corp, now()), Err(Refusal::DisallowedAlgorithm), "{alg} {kid}");
            }
        }
    }
    for alg in ["RS384", "PS256", "ES384", "ES256K", "", "rs256"] {
        let token = format!("{}.{claims}.c2ln", b64(json!({"alg": alg, "kid": "rsa-1"}).to_string()));
        assert_eq!(verify(&token, &corp, now()), Err(Refusal::DisallowedAlgorithm), "{alg}");
    }
}

#[test]
fn a_key_serves_only_its_own_algorithm_and_kid() {
    let (rsa, ec, ed) = (rsa_signer(), ec_signer(), ed_signer());
    let corp = provider([&rsa.jwk, &ec.jwk, &ed.jwk]);
    // An ES256 signature naming the RSA key, and the other way round:
    // refused by lookup, never handed to a verifier of another family.
    let crossed = [(&ec, "rsa-1"), (&ec, "ed-1"), (&rsa, "ec-1"), (&ed, "rsa-1"), (&rsa, "ed-1")];
    for (signer, kid) in crossed {
        let header = json!({"alg": signer.alg, "kid": kid}).to_string();
        assert_eq!(verify(&token_of(signer, &header, &claims().to_string()), &corp, now()), Err(Refusal::UnknownKey));
    }
    let unknown = token_of(&rsa, &json!({"alg": "RS256", "kid": "rotated-away"}).to_string(), &claims().to_string());
    assert_eq!(verify(&unknown, &corp, now()), Err(Refusal::UnknownKey));
    // Kid-less, with no key of the algorithm in the set.
    let only_rsa = provider([&rsa.jwk]);
    let kidless = token_of(&ec, &json!({"alg": "ES256"}).to_string(), &claims().to_string());
    assert_eq!(verify(&kidless, &only_rsa, now()), Err(Refusal::UnknownKey));
    // Kid-less, with keys of the algorithm none of which signed it.
    let strangers: Vec<Value> = (0..MAX_KIDLESS_TRIES + 2).map(|_| ed_signer().jwk).collect();
    let kidless = token_of(&ed, &json!({"alg": "EdDSA"}).to_string(), &claims().to_string());
    assert_eq!(verify(&kidless, &provider(&strangers), now()), Err(Refusal::BadSignature));
    // A key that names another algorithm than its type verifies is skipped.
    let mut mislabelled = rsa.jwk.clone();
    mislabelled["alg"] = json!("ES256");
    assert!(key_set([&mislabelled]).is_empty());
}

#[test]
fn sizes_and_counts_are_bounded() {
    let signer = ed_signer();
    let corp = provider([&signer.jwk]);
    let check = |claims: Value| verify(&token(&signer, &claims), &corp, now()).map(|_| ());
    let oversized = claims_with(json!({"padding": "x".repeat(MAX_TOKEN_BYTES)}));
    assert_eq!(check(oversized.clone()), Err(Refusal::TokenTooLarge));
    assert_eq!(unverified_issuer(&token(&signer, &oversized)), Err(Refusal::TokenTooLarge));
    let mut many = claims();
    for n in 0..MAX_CLAIMS {
        many[format!("c{n}")] = json!(n);
    }
    assert_eq!(check(many), Err(Refusal::TokenTooLarge), "too many claims");
    let groups: Vec<String> = (0..=MAX_GROUPS).map(|n| format!("g{n}")).collect();
    assert_eq!(check(claims_with(json!({ "groups": groups }))), Err(Refusal::TokenTooLarge), "too many groups");
    assert_eq!(check(claims_with(json!({ "groups": groups[..MAX_GROUPS] }))), Ok(()), "as many as allowed");
    let long = "g".repeat(MAX_NAME_BYTES + 1);
    assert_eq!(check(claims_with(json!({ "groups": [long] }))), Err(Refusal::TokenTooLarge), "a group too long");
    assert_eq!(check(claims_with(json!({ "email": long }))), Err(Refusal::TokenTooLarge), "a user too long");
}

#[test]
fn malformed_tokens_are_refused_as_such() {
    let signer = rsa_signer();
    let corp = provider([&signer.jwk]);
    let claims_text = claims().to_string();
    let good_header = header(&signer).to_string();
    let signed = |header: &str, claims: &str| token_of(&signer, header, claims);
    let cases = [
        ("empty", String::new()),
        ("one part", "eyJhbGciOiJSUzI1NiJ9".into()),
        ("two parts", format!("{}.{}", b64(&good_header), b64(&claims_text))),
        ("four parts", format!("{}.x", signed(&good_header, &claims_text))),
        ("header not base64url", format!("eyJ+/.{}.c2ln", b64(&claims_text))),
        ("padded base64", format!("{}=.{}.c2ln", b64(&good_header), b64(&claims_text))),
        ("header not JSON", signed("alg: RS256", &claims_text)),
        ("header without alg", signed(r#"{"kid":"rsa-1"}"#, &claims_text)),
        ("alg not a string", signed(r#"{"alg":["RS256"],"kid":"rsa-1"}"#, &claims_text)),
        ("a critical extension", signed(r#"{"alg":"RS256","kid":"rsa-1","crit":["b64"],"b64":false}"#, &claims_text)),
        ("claims not an object", signed(&good_header, "[1,2,3]")),
        ("claims not JSON", signed(&good_header, "{\"iss\":")),
        ("trailing bytes", signed(&good_header, &format!("{claims_text} x"))),
        ("iss twice", signed(&good_header, &claims_text.replacen('{', &format!("{{\"iss\":\"{ISSUER}\","), 1))),
        ("user twice", signed(&good_header, &claims_text.replacen('{', "{\"email\":\"eve@example.com\",", 1))),
        ("signature not base64url", format!("{}.{}.@@@", b64(&good_header), b64(&claims_text))),
    ];
    for (case, token) in cases {
        assert_eq!(verify(&token, &corp, now()), Err(Refusal::MalformedToken), "{case}");
    }
}

#[test]
fn a_key_set_with_junk_still_serves_its_good_keys() {
    let (rsa, ec, ed) = (rsa_signer(), ec_signer(), ed_signer());
    let mut weak_modulus = vec![0xc5; 128];
    weak_modulus[127] = 0x01;
    let mut encryption = rsa.jwk.clone();
    encryption["use"] = json!("enc");
    encryption["kid"] = json!("enc-1");
    let junk = [
        json!({"kty": "oct", "kid": "k", "k": b64(b"secret")}),
        encryption,
        json!({"kty": "RSA", "kid": "oaep", "alg": "RSA-OAEP", "n": rsa.jwk["n"], "e": "AQAB"}),
        json!({"kty": "RSA", "kid": "ps", "alg": "PS256", "n": rsa.jwk["n"], "e": "AQAB"}),
        json!({"kty": "RSA", "kid": "weak", "n": b64(&weak_modulus), "e": "AQAB"}),
        json!({"kty": "RSA", "kid": "no-e", "n": rsa.jwk["n"]}),
        json!({"kty": "RSA", "kid": "numeric", "n": 12345, "e": "AQAB"}),
        json!({"kty": "EC", "crv": "P-384", "kid": "p384", "x": b64([1; 48]), "y": b64([2; 48])}),
        json!({"kty": "EC", "crv": "P-256", "kid": "short", "x": b64([1; 31]), "y": b64([2; 32])}),
        json!({"kty": "OKP", "crv": "X25519", "kid": "x", "x": b64([3; 32])}),
        json!({"kty": "OKP", "crv": "Ed448", "kid": "ed448", "x": b64([3; 57])}),
        json!({"kty": "EC", "crv": "P-256", "kid": "bad-b64", "x": "***", "y": "***"}),
        json!({"kid": "no-kty"}),
        json!("a string"),
        json!(42),
        json!(null),
        // The same kid again for the same algorithm: the first serves.
        json!({"kty": "RSA", "kid": "rsa-1", "n": b64([0xc5; 256]), "e": "AQAB"}),
    ];
    let mut keys: Vec<Value> = junk[..8].to_vec();
    keys.extend([rsa.jwk.clone(), ec.jwk.clone()]);
    keys.extend(junk[8..].iter().cloned());
    keys.push(ed.jwk.clone());
    let set = key_set(&keys);
    assert_eq!((set.len(), set.skipped()), (3, junk.len()), "{set:?}");
    let corp = Provider::new("corp", ISSUER, &["waycast"], "email", Some("groups"), set).unwrap();
    for signer in [&rsa, &ec, &ed] {
        assert!(verify(&token(signer, &claims()), &corp, now()).is_ok(), "{}", signer.alg);
    }
    // A modulus padded with a leading zero is the same key.
    let mut padded = rsa.jwk.clone();
    let n = URL_SAFE_NO_PAD.decode(rsa.jwk["n"].as_str().unwrap()).unwrap();
    padded["n"] = json!(b64([&[0][..], &n].concat()));
    assert!(verify(&token(&rsa, &claims()), &provider([&padded]), now()).is_ok());
}

#[test]
fn a_key_set_past_its_bounds_or_not_one_is_refused_whole() {
    let too_large = vec![b' '; MAX_KEY_SET_BYTES + 1];
    assert_eq!(KeySet::parse(&too_large).unwrap_err(), KeySetError::TooLarge(MAX_KEY_SET_BYTES + 1));
    let many = json!({ "keys": vec![json!({"kty": "oct"}); MAX_KEYS + 1] }).to_string();
    assert_eq!(KeySet::parse(many.as_bytes()).unwrap_err(), KeySetError::TooManyKeys(MAX_KEYS + 1));
    for document in ["", "[]", "{}", r#"{"keys": {}}"#, r#"{"keys": [1,"#, "<html>"] {
        assert!(matches!(KeySet::parse(document.as_bytes()), Err(KeySetError::NotAKeySet(_))), "{document}");
    }
    let empty = KeySet::parse(br#"{"keys": [], "extra": true}"#).unwrap();
    assert!(empty.is_empty());
}

#[test]
fn a_bearer_is_a_token_by_its_shape() {
    let signer = ed_signer();
    let real = token(&signer, &claims());
    let cases: [(&[u8], bool); 13] = [
        (real.as_bytes(), true),
        (b"eyJh.eyJp.c2ln", true),
        (b"eyJh.eyJp.", true),
        (b"sk-waycast-0123456789abcdef", false),
        (b"", false),
        (b"eyJ", false),
        (b"eyJh.eyJp", false),
        (b"eyJh..c2ln", false),
        (b"eyJh.eyJp.c2ln.x", false),
        (b"eyJh.eyJp.c2ln=", false),
        (b"eyJh.ey Jp.c2ln", false),
        (b"eyJh.ey+p.c2/n", false),
        (b"abJh.eyJp.c2ln", false),
    ];
    for (bearer, shaped) in cases {
        assert_eq!(is_token_shaped(bearer), shaped, "{}", String::from_utf8_lossy(bearer));
    }
    assert_eq!(unverified_issuer(&real).unwrap(), ISSUER);
    assert_eq!(unverified_issuer(&token(&signer, &claims_with(json!({"iss": null})))), Err(Refusal::MissingClaim));
    assert_eq!(unverified_issuer("eyJh.!!.c2ln"), Err(Refusal::MalformedToken));
}

#[test]
fn refusal_codes_are_stable() {
    let codes = [
        (Refusal::TokenExpired, "token_expired"),
        (Refusal::TokenNotYetValid, "token_not_yet_valid"),
        (Refusal::WrongAudience, "wrong_audience"),
        (Refusal::UnknownIssuer, "unknown_issuer"),
        (Refusal::UnknownKey, "unknown_key"),
        (Refusal::BadSignature, "bad_signature"),
        (Refusal::MalformedToken, "malformed_token"),
        (Refusal::TokenTooLarge, "token_too_large"),
        (Refusal::DisallowedAlgorithm, "disallowed_algorithm"),
        (Refusal::MissingClaim, "missing_claim"),
        (Refusal::EmailNotVerified, "email_not_verified"),
        (Refusal::VerificationBusy, "token_verification_busy"),
    ];
    for (refusal, code) in codes {
        assert_eq!(refusal.code(), code);
    }
}

#[test]
fn a_provider_needs_an_issuer_an_audience_and_claims_of_its_own() {
    let keys = || key_set(std::iter::empty());
    let new = |issuer: &str, audiences: &[&str], user: &str, groups: Option<&str>| {
        Provider::new("p", issuer, audiences, user, groups, keys())
    };
    assert_eq!(new("", &["a"], "email", None).unwrap_err(), ProviderError::NoIssuer("p".into()));
    assert_eq!(new(ISSUER, &[], "email", None).unwrap_err(), ProviderError::NoAudience("p".into()));
    for (user, groups) in [("iss", None), ("exp", None), ("email", Some("aud")), ("email", Some("email")), ("", None)] {
        assert!(matches!(new(ISSUER, &["a"], user, groups), Err(ProviderError::ReservedClaim { .. })), "{user}");
    }
    assert!(new(ISSUER, &["a"], "sub", None).is_ok());
    // Same inputs, same fingerprint; any change, another.
    let a = new(ISSUER, &["a"], "sub", Some("groups")).unwrap();
    assert_eq!(a.fingerprint(), new(ISSUER, &["a"], "sub", Some("groups")).unwrap().fingerprint());
    for other in [
        new(ISSUER, &["b"], "sub", Some("groups")),
        new(ISSUER, &["a"], "email", Some("groups")),
        new(ISSUER, &["a"], "sub", None),
        new("https://other", &["a"], "sub", Some("groups")),
        Provider::new("p", ISSUER, &["a"], "sub", Some("groups"), key_set([&ed_signer().jwk])),
    ] {
        assert_ne!(a.fingerprint(), other.unwrap().fingerprint());
    }
}

/// The memo finds a token by its tail and compares it whole: a token made
/// to end as a remembered one does (its signature copied onto other
/// claims of the same length) is not taken for it, and costs its
/// verification, which refuses it; the remembered one stays.
#[test]
fn a_token_ending_as_a_remembered_one_is_not_taken_for_it() {
    let signer = rsa_signer();
    let corp = provider([&signer.jwk]);
    let provider_for = |issuer: &str| (issuer == ISSUER).then_some(&corp);
    let mut memo = TokenMemo::new(8);
    let verifications = Cell::new(0);
    let counted = |token: &str, provider: &Provider, now| {
        verifications.set(verifications.get() + 1);
        verify(token, provider, now)
    };
    let genuine = token(&signer, &claims());
    assert_eq!(&*memo.verify_with(&genuine, now(), provider_for, counted).unwrap().user, "ada@example.com");
    let other = token(&signer, &claims_with(json!({"email": "eve@example.com"})));
    let (signed_part, _) = other.rsplit_once('.').unwrap();
    let (_, signature) = genuine.rsplit_once('.').unwrap();
    let forged = format!("{signed_part}.{signature}");
    assert_eq!(forged.len(), genuine.len());
    assert_eq!(forged.as_bytes()[forged.len() - 32..], genuine.as_bytes()[genuine.len() - 32..], "the same tail");
    assert_ne!(forged, genuine);
    assert!(memo.remembered(forged.as_bytes(), now(), provider_for).is_none(), "not found as the genuine one");
    assert_eq!(memo.verify_with(&forged, now(), provider_for, counted), Err(Refusal::BadSignature));
    assert_eq!(verifications.get(), 2, "checked, not remembered");
    let still = memo.remembered(genuine.as_bytes(), now(), provider_for).unwrap();
    assert_eq!((&*still.user, memo.len()), ("ada@example.com", 1), "the genuine one stays remembered");
}

#[test]
fn the_memo_remembers_a_verified_token_until_it_expires() {
    let signer = rsa_signer();
    let corp = provider([&signer.jwk]);
    let provider_for = |issuer: &str| (issuer == ISSUER).then_some(&corp);
    let mut memo = TokenMemo::new(8);
    let verifications = Cell::new(0);
    let counted = |token: &str, provider: &Provider, now| {
        verifications.set(verifications.get() + 1);
        verify(token, provider, now)
    };
    let remembered = token(&signer, &claims());
    let first = memo.verify_with(&remembered, now(), provider_for, counted).unwrap();
    assert_eq!((verifications.get(), memo.len()), (1, 1));
    let again = memo.verify_with(&remembered, at(NOW + 200), provider_for, counted).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the remembered one");
    assert_eq!(verifications.get(), 1, "not verified again");
    // Past exp (and the skew) it is verified again, and refused.
    let expired_at = at(NOW + 300 + SKEW_SECONDS);
    assert_eq!(memo.verify_with(&remembered, expired_at, provider_for, counted), Err(Refusal::TokenExpired));
    assert_eq!((verifications.get(), memo.len()), (2, 0), "forgotten");
    // Refused tokens are never remembered.
    let wrong = token(&signer, &claims_with(json!({"aud": "x"})));
    assert_eq!(memo.verify_with(&wrong, now(), provider_for, counted), Err(Refusal::WrongAudience));
    assert_eq!(memo.verify_with(&wrong, now(), provider_for, counted), Err(Refusal::WrongAudience));
    assert_eq!((verifications.get(), memo.len()), (4, 0));
    // An issuer no provider answers for costs no signature check.
    let stranger = token(&signer, &claims_with(json!({"iss": "https://elsewhere"})));
    assert_eq!(memo.verify_with(&stranger, now(), provider_for, counted), Err(Refusal::UnknownIssuer));
    assert_eq!(verifications.get(), 4);
    // The plain entry point verifies for real.
    assert_eq!(&*memo.verify(&remembered, now(), provider_for).unwrap().user, "ada@example.com");
}

#[test]
fn a_flood_of_forged_signatures_is_checked_within_a_share_of_time_and_spares_remembered_tokens() {
    use std::time::{Duration, Instant};
    let signer = rsa_signer();
    let corp = provider([&signer.jwk]);
    let provider_for = |issuer: &str| (issuer == ISSUER).then_some(&corp);
    let mut memo = TokenMemo::new(8);
    let verifications = Cell::new(0);
    let counted = |token: &str, provider: &Provider, now| {
        verifications.set(verifications.get() + 1);
        verify(token, provider, now)
    };
    // A clock on which each reading is 1 ms after the last: every check
    // takes 1 ms, and time moves only as checks are made.
    let start = Instant::now();
    let (ticks, frozen) = (Cell::new(0_u32), Cell::new(false));
    let clock = || {
        if !frozen.get() {
            ticks.set(ticks.get() + 1);
        }
        start + Duration::from_millis(u64::from(ticks.get()))
    };
    let good = token(&signer, &claims());
    memo.verify_at(&good, (now(), clock), provider_for, counted).unwrap();
    let forged = |n: u32| tampered_claims(&good, &claims_with(json!({"jti": n})));
    let mut checked = 0;
    let busy = loop {
        match memo.verify_at(&forged(checked), (now(), clock), provider_for, counted) {
            Err(Refusal::BadSignature) => checked += 1,
            other => break other,
        }
        assert!(checked < 1_000, "never stopped checking forged signatures");
    };
    assert_eq!(busy, Err(Refusal::VerificationBusy));
    // 200 ms of burst, each check 1 ms less what 2 ms of time refill
    // (a tenth of it): about 250 checks.
    assert!((240..=260).contains(&checked), "checked {checked}");
    // Empty (and no time passing): a good token not seen before waits
    // too, unchecked; the remembered one is served.
    frozen.set(true);
    let fresh = token(&signer, &claims_with(json!({"jti": "fresh"})));
    let before = verifications.get();
    assert_eq!(memo.verify_at(&fresh, (now(), clock), provider_for, counted), Err(Refusal::VerificationBusy));
    assert_eq!(verifications.get(), before, "no check while it is empty");
    assert!(memo.verify_at(&good, (now(), clock), provider_for, counted).is_ok());
    // Refilled with time, new tokens are checked again.
    ticks.set(ticks.get() + 100);
    frozen.set(false);
    assert!(memo.verify_at(&fresh, (now(), clock), provider_for, counted).is_ok());
    // Refusals are charged what they took, not a price each: a signature
    // that is not there is refused unchecked, here in 1 µs (a clock of
    // its own, so a loaded machine cannot make the check slow), and 10,000
    // of them take 10 ms of the 200 ms.
    let mut memo = TokenMemo::new(8);
    let micro_ticks = Cell::new(0_u64);
    let quick_clock = || {
        micro_ticks.set(micro_ticks.get() + 1);
        start + Duration::from_micros(micro_ticks.get())
    };
    let unsigned_parts: Vec<&str> = good.split('.').collect();
    let empty = format!("{}.{}.", unsigned_parts[0], unsigned_parts[1]);
    for _ in 0..10_000 {
        let refused = memo.verify_at(&empty, (now(), quick_clock), provider_for, counted);
        assert!(matches!(refused, Err(Refusal::BadSignature | Refusal::MalformedToken)), "{refused:?}");
    }
}

/// `token` with its claims replaced, its signature kept.
fn tampered_claims(token: &str, claims: &Value) -> String {
    let mut parts = token.split('.');
    let header = parts.next().unwrap();
    let signature = parts.nth(1).unwrap();
    format!("{header}.{}.{signature}", b64(claims.to_string()))
}

#[test]
fn the_memo_verifies_again_when_the_provider_changes() {
    let (signer, spare) = (rsa_signer(), ed_signer());
    let before = provider([&signer.jwk]);
    let rotated = provider([&spare.jwk]);
    let refetched = provider([&signer.jwk]);
    let mut memo = TokenMemo::new(8);
    let verifications = Cell::new(0);
    let counted = |token: &str, provider: &Provider, now| {
        verifications.set(verifications.get() + 1);
        verify(token, provider, now)
    };
    let remembered = token(&signer, &claims());
    memo.verify_with(&remembered, now(), |_: &str| Some(&before), counted).unwrap();
    // The same key set fetched again: still remembered.
    memo.verify_with(&remembered, now(), |_: &str| Some(&refetched), counted).unwrap();
    assert_eq!(verifications.get(), 1);
    // The signing key rotated away: verified again, and refused.
    assert_eq!(memo.verify_with(&remembered, now(), |_: &str| Some(&rotated), counted), Err(Refusal::UnknownKey));
    assert_eq!(verifications.get(), 2);
    // The provider gone: refused without a check.
    assert_eq!(memo.verify_with(&remembered, now(), |_: &str| None, counted), Err(Refusal::UnknownIssuer));
    assert_eq!((verifications.get(), memo.len()), (2, 0));
}

#[test]
fn the_memo_is_bounded_and_lets_the_expired_go_first() {
    let signer = ec_signer();
    let corp = provider([&signer.jwk]);
    let provider_for = |_: &str| Some(&corp);
    let mut memo = TokenMemo::new(3);
    let token_until = |exp: i64, n: u32| token(&signer, &claims_with(json!({"exp": exp, "jti": n})));
    let short = token_until(NOW + 40, 0);
    let long = [token_until(NOW + 900, 1), token_until(NOW + 600, 2)];
    memo.verify(&short, now(), provider_for).unwrap();
    for lasting in &long {
        memo.verify(lasting, now(), provider_for).unwrap();
    }
    assert_eq!(memo.len(), 3);
    // Later, when the short one has expired: it is let go for the new one.
    let later = at(NOW + 100);
    memo.verify(&token_until(NOW + 700, 3), later, provider_for).unwrap();
    assert_eq!(memo.len(), 3);
    // Full of live tokens: the one expiring soonest goes (exp NOW + 600).
    memo.verify(&token_until(NOW + 800, 4), later, provider_for).unwrap();
    assert_eq!(memo.len(), 3);
    let verifications = Cell::new(0);
    let counted = |token: &str, provider: &Provider, now| {
        verifications.set(verifications.get() + 1);
        verify(token, provider, now)
    };
    memo.verify_with(&long[0], later, provider_for, counted).unwrap();
    assert_eq!(verifications.get(), 0, "the longest-lived is still remembered");
    memo.verify_with(&long[1], later, provider_for, counted).unwrap();
    assert_eq!(verifications.get(), 1, "the soonest to expire was let go");
    // Each worker thread has its own memo.
    assert!(verify_remembered(&long[0], later, provider_for).is_ok());
    let elsewhere = std::thread::scope(|scope| {
        scope.spawn(|| verify_remembered(&long[0], later, provider_for).map(|v| v.user.clone())).join().unwrap()
    });
    assert_eq!(&*elsewhere.unwrap(), "ada@example.com");
}
