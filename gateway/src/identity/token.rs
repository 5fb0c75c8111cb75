//! One token checked against one provider: the JWS compact form
//! (`header.claims.signature`, RFC 7515/7519) read by our own bounded code,
//! the signature checked by `jsonwebtoken`'s ring-backed verifier with the
//! key's own algorithm.
//!
//! Order: size, shape, header and algorithm, claims (structure and bounds),
//! key, signature; then what the signed claims say (`iss`, `exp`, `nbf`,
//! `iat`, `aud`, the user and groups). So a forged token is refused for
//! its signature, never for what its forged claims say, and a token that
//! is not one at all costs no signature check.

use std::cell::Cell;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::keys::Alg;
use super::keys::{Key, KeySet};
use super::provider::{
    EMAIL_CLAIM, EMAIL_VERIFIED_CLAIM, MAX_CLAIMS, MAX_GROUPS, MAX_KIDLESS_TRIES, MAX_NAME_BYTES, MAX_TOKEN_BYTES,
    Provider, Refusal, SKEW_SECONDS, Verified,
};

/// Whether `bearer` looks like a JWS compact token: three base64url
/// segments, the first a JSON object (`eyJ` is `{"` encoded). No decoding:
/// a key (never of this shape) goes on to the key lookup at no extra cost.
/// The signature segment may be empty so that an unsigned token is
/// refused as one rather than looked up as a key.
pub fn is_token_shaped(bearer: &[u8]) -> bool {
    if !bearer.starts_with(b"eyJ") {
        return false;
    }
    let mut dots = [0; 2];
    let mut found = 0;
    for (at, &byte) in bearer.iter().enumerate() {
        match byte {
            b'.' if found < 2 => {
                dots[found] = at;
                found += 1;
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => {}
            _ => return false,
        }
    }
    found == 2 && dots[1] > dots[0] + 1
}

/// The `iss` a token claims, unverified: only to find the provider whose
/// keys then verify it.
///
/// # Errors
/// A token too large or malformed, or without `iss`.
pub fn unverified_issuer(token: &str) -> Result<String, Refusal> {
    #[derive(Deserialize)]
    struct Issuer {
        iss: Option<String>,
    }
    let parts = Parts::split(token)?;
    let issuer: Issuer = serde_json::from_slice(&decode(parts.claims)?).map_err(|_| Refusal::MalformedToken)?;
    issuer.iss.ok_or(Refusal::MissingClaim)
}

/// Verifies `token` as one of `provider`'s at `now`.
///
/// # Errors
/// The first check it fails, as a [`Refusal`].
pub fn verify(token: &str, provider: &Provider, now: jiff::Timestamp) -> Result<Verified, Refusal> {
    let parts = Parts::split(token)?;
    let header = Header::read(parts.header)?;
    let alg = Alg::named(&header.alg).ok_or(Refusal::DisallowedAlgorithm)?;
    let claims = Claims::read(parts.claims, provider)?;
    check_signature(provider.keys(), header.kid.as_deref(), alg, parts.signed.as_bytes(), parts.signature)?;

    if claims.iss.ok_or(Refusal::MissingClaim)? != provider.issuer() {
        return Err(Refusal::UnknownIssuer);
    }
    let exp = claims.exp.ok_or(Refusal::MissingClaim)?;
    if super::provider::expired(exp, now) {
        return Err(Refusal::TokenExpired);
    }
    let latest_start = now.as_second().saturating_add(SKEW_SECONDS);
    if claims.nbf.is_some_and(|nbf| nbf > latest_start) || claims.iat.is_some_and(|iat| iat > latest_start) {
        return Err(Refusal::TokenNotYetValid);
    }
    let audiences = claims.aud.ok_or(Refusal::MissingClaim)?;
    if !audiences.iter().any(|audience| provider.audiences.iter().any(|ours| **ours == **audience)) {
        return Err(Refusal::WrongAudience);
    }
    let user = claims.user.filter(|user| !user.is_empty()).ok_or(Refusal::MissingClaim)?;
    // An address the issuer says it has not verified may be anyone's who
    // typed it in. Absent, the token is served: Entra ID never sends the
    // claim, and most access tokens leave it out (docs/identity.md).
    if claims.email_verified == Some(false) {
        return Err(Refusal::EmailNotVerified);
    }
    Ok(Verified {
        provider: provider.name.clone(),
        user_hash: super::provider::user_hash(&provider.name, &user),
        user: user.into(),
        groups: claims.groups.unwrap_or_default().into_iter().map(Into::into).collect(),
        exp,
    })
}

/// A token's three segments, still encoded.
struct Parts<'t> {
    header: &'t str,
    claims: &'t str,
    /// `header.claims`: what the signature covers.
    signed: &'t str,
    signature: &'t str,
}

impl<'t> Parts<'t> {
    fn split(token: &'t str) -> Result<Self, Refusal> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::TokenTooLarge);
        }
        let (signed, signature) = token.rsplit_once('.').ok_or(Refusal::MalformedToken)?;
        let (header, claims) = signed.split_once('.').ok_or(Refusal::MalformedToken)?;
        if claims.contains('.') {
            return Err(Refusal::MalformedToken);
        }
        Ok(Self { header, claims, signed, signature })
    }
}

fn decode(segment: &str) -> Result<Vec<u8>, Refusal> {
    URL_SAFE_NO_PAD.decode(segment).map_err(|_| Refusal::MalformedToken)
}

/// The JOSE header fields read. `jku`, `jwk`, `x5u` and `x5c` are ignored:
/// a token never brings the key that verifies it.
#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Extensions the verifier must understand (RFC 7515 4.1.11); we
    /// understand none, so a token that has any is refused.
    crit: Option<IgnoredAny>,
}

impl Header {
    fn read(segment: &str) -> Result<Self, Refusal> {
        let header: Self = serde_json::from_slice(&decode(segment)?).map_err(|_| Refusal::MalformedToken)?;
        if header.crit.is_some() {
            return Err(Refusal::MalformedToken);
        }
        Ok(header)
    }
}

/// Checks the signature with the key `kid` names, or, without a kid, with
/// the first few keys of the algorithm.
fn check_signature(keys: &KeySet, kid: Option<&str>, alg: Alg, signed: &[u8], signature: &str) -> Result<(), Refusal> {
    let verifies = |key: &Key| {
        // The key's own algorithm, which is the token's (the lookup
        // matched them): jsonwebtoken must never see a key of another
        // family than the algorithm it is asked for.
        jsonwebtoken::crypto::verify(signature, signed, &key.key, key.alg.jsonwebtoken())
            .map_err(|_| Refusal::MalformedToken)
    };
    if signature.is_empty() {
        return Err(Refusal::BadSignature);
    }
    match kid {
        Some(kid) => {
            let key = keys.with_kid(kid, alg).ok_or(Refusal::UnknownKey)?;
            if verifies(key)? { Ok(()) } else { Err(Refusal::BadSignature) }
        }
        None => {
            let mut tried = 0;
            for key in keys.of_alg(alg).take(MAX_KIDLESS_TRIES) {
                tried += 1;
                if verifies(key)? {
                    return Ok(());
                }
            }
            Err(if tried == 0 { Refusal::UnknownKey } else { Refusal::BadSignature })
        }
    }
}

/// The claims read; every other is skipped unread.
#[derive(Default)]
struct Claims {
    iss: Option<String>,
    aud: Option<Vec<String>>,
    exp: Option<i64>,
    nbf: Option<i64>,
    iat: Option<i64>,
    user: Option<String>,
    groups: Option<Vec<String>>,
    /// `email_verified`, read only when the user claim is `email`.
    email_verified: Option<bool>,
}

impl Claims {
    /// Reads the claims segment for `provider`: a JSON object of at most
    /// [`MAX_CLAIMS`] members, each claim read at most once (a claim given
    /// twice could mean one thing here and another to the issuer), the
    /// user and groups within their bounds.
    fn read(segment: &str, provider: &Provider) -> Result<Self, Refusal> {
        let bytes = decode(segment)?;
        let too_many = Cell::new(false);
        let seed = ClaimsSeed {
            user: &provider.user_claim,
            groups: provider.groups_claim.as_deref(),
            email: &*provider.user_claim == EMAIL_CLAIM,
            too_many: &too_many,
        };
        let mut json = serde_json::Deserializer::from_slice(&bytes);
        let claims = seed.deserialize(&mut json).and_then(|claims| json.end().map(|()| claims));
        let claims = match claims {
            Ok(claims) => claims,
            Err(_) if too_many.get() => return Err(Refusal::TokenTooLarge),
            Err(_) => return Err(Refusal::MalformedToken),
        };
        if claims.user.as_ref().is_some_and(|user| user.len() > MAX_NAME_BYTES) {
            return Err(Refusal::TokenTooLarge);
        }
        if let Some(groups) = &claims.groups
            && (groups.len() > MAX_GROUPS || groups.iter().any(|group| group.len() > MAX_NAME_BYTES))
        {
            return Err(Refusal::TokenTooLarge);
        }
        Ok(claims)
    }
}

/// Reads [`Claims`] with the provider's claim names.
struct ClaimsSeed<'p> {
    user: &'p str,
    groups: Option<&'p str>,
    /// The user claim is `email`: `email_verified` is read too.
    email: bool,
    too_many: &'p Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for ClaimsSeed<'_> {
    type Value = Claims;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Claims, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ClaimsSeed<'_> {
    type Value = Claims;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of claims")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Claims, A::Error> {
        let mut claims = Claims::default();
        let mut count = 0;
        while let Some(name) = map.next_key::<String>()? {
            count += 1;
            if count > MAX_CLAIMS {
                self.too_many.set(true);
                return Err(de::Error::custom("too many claims"));
            }
            // Provider's claim names are never registered ones (checked
            // when it is built), so one name is one meaning.
            if name == self.user {
                once(&mut claims.user, map.next_value()?)?;
            } else if self.groups == Some(name.as_str()) {
                once(&mut claims.groups, map.next_value()?)?;
            } else if self.email && name == EMAIL_VERIFIED_CLAIM {
                once(&mut claims.email_verified, map.next_value::<EmailVerified>()?.0)?;
            } else {
                match name.as_str() {
                    "iss" => once(&mut claims.iss, map.next_value()?)?,
                    "aud" => once(&mut claims.aud, map.next_value::<Audiences>()?.0)?,
                    "exp" => once(&mut claims.exp, map.next_value::<NumericDate>()?.0)?,
                    "nbf" => once(&mut claims.nbf, map.next_value::<NumericDate>()?.0)?,
                    "iat" => once(&mut claims.iat, map.next_value::<NumericDate>()?.0)?,
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
        }
        Ok(claims)
    }
}

fn once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::custom("a claim given twice"));
    }
    *slot = Some(value);
    Ok(())
}

/// `aud`: one string or an array of them (RFC 7519 4.1.3).
struct Audiences(Vec<String>);

impl<'de> Deserialize<'de> for Audiences {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(Self(match OneOrMany::deserialize(deserializer)? {
            OneOrMany::One(audience) => vec![audience],
            OneOrMany::Many(audiences) => audiences,
        }))
    }
}

/// `email_verified`: a boolean, or the strings `"true"` and `"false"` (as
/// some issuers, AWS Cognito among them, have sent it); anything else is
/// malformed.
struct EmailVerified(bool);

impl<'de> Deserialize<'de> for EmailVerified {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum BoolOrText {
            Bool(bool),
            Text(String),
        }
        match BoolOrText::deserialize(deserializer)? {
            BoolOrText::Bool(verified) => Ok(Self(verified)),
            BoolOrText::Text(text) if text == "true" => Ok(Self(true)),
            BoolOrText::Text(text) if text == "false" => Ok(Self(false)),
            BoolOrText::Text(_) => Err(de::Error::custom("email_verified: not a boolean")),
        }
    }
}

/// A NumericDate: seconds since the epoch, an integer or not (RFC 7519 2);
/// a fraction is dropped, a value past `i64` saturates.
struct NumericDate(i64);

impl<'de> Deserialize<'de> for NumericDate {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(deserializer)?;
        number
            .as_i64()
            .or_else(|| number.as_f64().map(|seconds| seconds.floor() as i64))
            .map(Self)
            .ok_or_else(|| de::Error::custom("not a NumericDate"))
    }
}
