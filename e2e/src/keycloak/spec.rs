//! What tests ask Keycloak for (clients, users, a rotation) and what it
//! answers (tokens), and a JWT's parts decoded for looking at.

use anyhow::{Context as _, bail};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

/// A client to create in a realm.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// Its `client_id`.
    pub client_id: String,
    /// `Some`: a confidential client with this secret (client credentials
    /// work, as a service account); `None`: a public client (password grant
    /// only).
    pub secret: Option<String>,
    /// Added to every access token's `aud` by an audience mapper.
    pub audience: String,
}

/// A user to create in a realm.
#[derive(Debug, Clone)]
pub struct UserSpec {
    /// `preferred_username`.
    pub username: String,
    /// A permanent password (no required actions, so the password grant
    /// works at once).
    pub password: String,
    /// A verified email.
    pub email: String,
    /// Names of existing top-level groups the user joins.
    pub groups: Vec<String>,
}

/// What the token endpoint answered.
#[derive(Debug, Clone, Deserialize)]
pub struct Tokens {
    /// The access token (a JWT, RS256 unless the realm says otherwise).
    pub access_token: String,
    /// The ID token, when the `openid` scope was asked for.
    pub id_token: Option<String>,
    /// Seconds the access token lives.
    pub expires_in: u64,
}

/// What becomes of the signing keys a rotation replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldKeys {
    /// Passive: they sign nothing new but stay in the JWKS, so tokens
    /// already issued still verify (a rotation with a grace period).
    Passive,
    /// Deleted: gone from the JWKS at once, with every token they signed.
    Removed,
}

/// A JWT's header and claims, decoded but NOT verified (tests look at what
/// a provider issued; verifying is the gateway's job).
///
/// # Errors
/// Not three base64url parts, or a part not JSON.
pub fn decode_jwt(token: &str) -> anyhow::Result<(Value, Value)> {
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        bail!("a JWT has three dot-separated parts");
    };
    let decode = |part: &str| -> anyhow::Result<Value> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).context("a JWT part's base64url")?;
        serde_json::from_slice(&bytes).context("a JWT part's JSON")
    };
    Ok((decode(header)?, decode(claims)?))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_jwt_decodes_to_its_header_and_claims() {
        let part = |value: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
        let token = format!("{}.{}.sig", part(json!({"alg": "RS256", "kid": "k1"})), part(json!({"sub": "alice"})));
        let (header, claims) = decode_jwt(&token).unwrap();
        assert_eq!((header["kid"].as_str(), claims["sub"].as_str()), (Some("k1"), Some("alice")));
        assert!(decode_jwt("a.b").is_err());
        assert!(decode_jwt(&format!("{token}.extra")).is_err());
        assert!(decode_jwt("!!.e30.x").is_err());
    }
}
