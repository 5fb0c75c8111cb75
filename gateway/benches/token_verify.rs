//! What a bearer token costs the gateway, beside what a key costs, in one
//! run on one machine (figures, not a pass/fail test: timings on a shared
//! machine move; the ratios are what to read):
//!
//! - the first verification of an RS256, ES256 and EdDSA token (the
//!   signature check and the claims: once per token per worker);
//! - a remembered token (what every later request of it costs);
//! - a forged token (our issuer, a garbage signature): one checked, and a
//!   flood of them (past a worker's bucket of bad signatures they are
//!   refused unchecked); an unknown key refused (its SHA-256 and a
//!   lookup): the baseline.
//!
//! Run: `make bench-tokens` (or `cargo bench -p waycast-gateway --bench token_verify`).

#![allow(clippy::unwrap_used, clippy::print_stdout, reason = "a benchmark program: it fails loudly and prints")]

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair as _};
use serde_json::json;
use waycast_gateway::identity::{KeySet, Provider, TokenMemo, verify};

const RSA_PKCS8: &[u8] = include_bytes!("../src/identity/testdata/rsa-2048-test-only.pk8.der");
const ISSUER: &str = "https://sso.example.com/realms/corp";

fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token of `alg`/`kid` signed by `sign`, and its key's JWK.
fn token(alg: &str, kid: &str, sign: &dyn Fn(&[u8]) -> Vec<u8>) -> String {
    let now = jiff::Timestamp::now().as_second();
    let header = json!({"alg": alg, "kid": kid, "typ": "JWT"});
    // A realistic access token: a dozen claims, a few groups.
    let claims = json!({"iss": ISSUER, "sub": "5b1f0c6e-2f6e-4d2f-9c55-6f1f3f0e9a11", "aud": ["waycast", "account"],
        "exp": now + 3600, "iat": now, "nbf": now, "azp": "waycast-cli", "scope": "openid email profile",
        "email": "alice@example.com", "preferred_username": "alice", "name": "Alice Example",
        "groups": ["developers", "ml-platform", "oncall"], "sid": "8d5e0a7c"});
    let signed = format!("{}.{}", b64(header.to_string()), b64(claims.to_string()));
    format!("{signed}.{}", b64(sign(signed.as_bytes())))
}

/// The least time per call over `rounds` rounds of `calls` calls.
fn per_call(rounds: usize, calls: usize, mut call: impl FnMut()) -> Duration {
    (0..rounds)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..calls {
                call();
            }
            started.elapsed() / u32::try_from(calls).unwrap()
        })
        .min()
        .unwrap()
}

fn main() {
    let rsa = signature::RsaKeyPair::from_pkcs8(RSA_PKCS8).unwrap();
    let rsa_public = signature::RsaPublicKeyComponents::<Vec<u8>>::from(rsa.public());
    let rng = SystemRandom::new();
    let ec_alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let ec_pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(ec_alg, &rng).unwrap();
    let ec = signature::EcdsaKeyPair::from_pkcs8(ec_alg, ec_pkcs8.as_ref(), &rng).unwrap();
    let ed_pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let ed = signature::Ed25519KeyPair::from_pkcs8(ed_pkcs8.as_ref()).unwrap();
    let point = ec.public_key().as_ref();
    let jwks = json!({"keys": [
        {"kty": "RSA", "kid": "rsa", "alg": "RS256", "n": b64(&rsa_public.n), "e": b64(&rsa_public.e)},
        {"kty": "EC", "crv": "P-256", "kid": "ec", "x": b64(&point[1..33]), "y": b64(&point[33..65])},
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": b64(ed.public_key())},
    ]});
    let keys = KeySet::parse(jwks.to_string().as_bytes()).unwrap();
    let provider = Provider::new("corp", ISSUER, &["waycast"], "sub", Some("groups"), keys).unwrap();
    let rsa_sign = |message: &[u8]| {
        let mut out = vec![0; rsa.public().modulus_len()];
        rsa.sign(&signature::RSA_PKCS1_SHA256, &SystemRandom::new(), message, &mut out).unwrap();
        out
    };
    let tokens = [
        ("RS256 (2048-bit)", token("RS256", "rsa", &rsa_sign)),
        ("ES256", token("ES256", "ec", &|m| ec.sign(&SystemRandom::new(), m).unwrap().as_ref().to_vec())),
        ("EdDSA", token("EdDSA", "ed", &|m| ed.sign(m).as_ref().to_vec())),
    ];
    let now = jiff::Timestamp::now();
    println!("token verification, this machine, least of 5 rounds:");
    for (name, token) in &tokens {
        verify(token, &provider, now).unwrap();
        let first = per_call(5, 200, || drop(black_box(verify(black_box(token), &provider, now))));
        println!("  first sight, {name:<17} {:>8.1} µs", first.as_secs_f64() * 1e6);
    }
    let by_issuer = |issuer: &str| (issuer == ISSUER).then_some(&provider);
    let mut memo = TokenMemo::new(1024);
    let remembered = &tokens[0].1;
    memo.verify(remembered, now, by_issuer).unwrap();
    let memo_cost = per_call(5, 100_000, || drop(black_box(memo.verify(black_box(remembered), now, by_issuer))));
    // A token's shape, its issuer ours, its signature garbage: refused
    // after the issuer is read and one signature check fails.
    let mut parts = remembered.split('.');
    let (header, claims) = (parts.next().unwrap(), parts.next().unwrap());
    let garbage = format!("{header}.{claims}.{}", b64([7_u8; 256]));
    // Each checked: what one forged token costs.
    let garbage_cost = per_call(5, 200, || drop(black_box(verify(black_box(&garbage), &provider, now))));
    // A flood of them at a worker: past its bucket of bad signatures, a
    // token it does not remember is refused unchecked.
    let flood_cost = per_call(5, 100_000, || drop(black_box(memo.verify(black_box(&garbage), now, by_issuer))));
    // Of an issuer not trusted: refused once the claims are read.
    let stranger =
        format!("{header}.{}.{}", b64(json!({"iss": "https://evil.example.com"}).to_string()), b64([7_u8; 64]));
    let stranger_cost = per_call(5, 100_000, || drop(black_box(memo.verify(black_box(&stranger), now, by_issuer))));
    // A bad key's refusal: its SHA-256 and a lookup that misses.
    let table: HashMap<[u8; 32], u32> =
        (0_u32..1000).map(|i| (waycast_crds::digest::sha256(&i.to_le_bytes()), i)).collect();
    let bad_key = "wc_not_a_key_of_this_gateway_0000000000000";
    let key_cost = per_call(5, 100_000, || {
        black_box(table.get(&waycast_crds::digest::sha256(black_box(bad_key.as_bytes()))));
    });
    let ratio = |cost: Duration| cost.as_secs_f64() / key_cost.as_secs_f64();
    println!(
        "  remembered token             {:>8.3} µs  ({:.1}× a bad key's refusal)",
        memo_cost.as_secs_f64() * 1e6,
        ratio(memo_cost)
    );
    println!("  bad key refused (baseline)   {:>8.3} µs", key_cost.as_secs_f64() * 1e6);
    println!(
        "  forged signature, checked    {:>8.1} µs  ({:.0}× a bad key's refusal)",
        garbage_cost.as_secs_f64() * 1e6,
        ratio(garbage_cost)
    );
    println!(
        "  a flood of forged tokens     {:>8.3} µs  ({:.1}× a bad key's refusal; at most {} ms a second per worker checked)",
        flood_cost.as_secs_f64() * 1e6,
        ratio(flood_cost),
        waycast_gateway::identity::REFUSED_CHECKS_NANOS_PER_SECOND / 1_000_000
    );
    println!(
        "  issuer not trusted, refused  {:>8.3} µs  ({:.1}× a bad key's refusal)",
        stranger_cost.as_secs_f64() * 1e6,
        ratio(stranger_cost)
    );
}
