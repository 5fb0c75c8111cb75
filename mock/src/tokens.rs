//! A token issuer for tests: a fresh ES256 (P-256) key, its JSON Web Key
//! Set, and compact JWS tokens signed with it — assembled here by hand
//! with ring, so nothing of the verifier under test checks itself. Also
//! the forgeries a verifier must refuse: unsigned (`alg: none`), an HMAC
//! keyed with the public key set, a signature from another key.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};

/// An issuer with one signing key.
pub struct TestIssuer {
    /// `iss` of its tokens.
    pub issuer: String,
    /// The key's id.
    pub kid: String,
    pair: EcdsaKeyPair,
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

impl TestIssuer {
    /// An issuer `issuer` signing with a new key known as `kid`.
    ///
    /// # Panics
    /// When the system has no randomness (tests only).
    #[allow(clippy::expect_used, reason = "test material: no randomness is a broken machine")]
    pub fn new(issuer: &str, kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("its pair");
        Self { issuer: issuer.to_owned(), kid: kid.to_owned(), pair }
    }

    /// The key's JWK.
    pub fn jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
               "x": b64(&point[1..33]), "y": b64(&point[33..65])})
    }

    /// Its key set, as a provider publishes it.
    pub fn jwks(&self) -> String {
        json!({"keys": [self.jwk()]}).to_string()
    }

    /// Claims for `subject` with `audience`, `groups`, valid from
    /// `now - 60` to `exp`.
    pub fn claims(&self, subject: &str, audience: &str, groups: &[&str], now: i64, exp: i64) -> Value {
        json!({"iss": self.issuer, "sub": subject, "aud": audience, "groups": groups,
               "iat": now - 60, "nbf": now - 60, "exp": exp})
    }

    /// A token of `claims`, signed.
    pub fn token(&self, claims: &Value) -> String {
        self.token_with_header(&json!({"alg": "ES256", "typ": "JWT", "kid": self.kid}), claims)
    }

    /// A token of `header` and `claims` signed with this key whatever the
    /// header says.
    ///
    /// # Panics
    /// When signing fails (tests only).
    #[allow(clippy::expect_used, reason = "test material")]
    pub fn token_with_header(&self, header: &Value, claims: &Value) -> String {
        let signed = format!("{}.{}", b64(header.to_string()), b64(claims.to_string()));
        let signature = self.pair.sign(&SystemRandom::new(), signed.as_bytes()).expect("signed");
        format!("{signed}.{}", b64(signature.as_ref()))
    }
}

/// An unsigned token (`alg: none`, empty signature).
pub fn unsigned(claims: &Value) -> String {
    format!("{}.{}.", b64(json!({"alg": "none", "typ": "JWT"}).to_string()), b64(claims.to_string()))
}

/// A token "signed" with HS256 keyed by `secret` (an attacker keys it with
/// the issuer's public key set, which anyone can read).
pub fn hmac_signed(secret: &[u8], kid: &str, claims: &Value) -> String {
    let header = json!({"alg": "HS256", "typ": "JWT", "kid": kid});
    let signed = format!("{}.{}", b64(header.to_string()), b64(claims.to_string()));
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), signed.as_bytes());
    format!("{signed}.{}", b64(tag.as_ref()))
}

/// `token` with its claims replaced by `claims`, the signature kept.
pub fn tampered(token: &str, claims: &Value) -> String {
    let mut parts = token.split('.');
    let (header, _, signature) = (parts.next().unwrap_or(""), parts.next(), parts.next().unwrap_or(""));
    format!("{header}.{}.{signature}", b64(claims.to_string()))
}
