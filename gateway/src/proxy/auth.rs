//! Bearer authentication: the presented key's SHA-256 (remembered per
//! worker for known keys, `key_digests`) is looked up in the snapshot. No
//! I/O, no clock except through the `now` the caller passes.

use http::HeaderMap;
use http::header::AUTHORIZATION;

use std::sync::Arc;

use crate::error::GatewayError;
use crate::identity::{Refusal, Verified};
use crate::limit::members::Member;
use crate::snapshot::identity::{GRANT_HEADER, NotGranted};
use crate::snapshot::{KeyEntry, Snapshot};

/// The key a request presents: `Authorization: Bearer <key>` or, as
/// Anthropic clients send it, `x-api-key: <key>`.
pub fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(AUTHORIZATION) {
        let value = value.as_bytes();
        let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ').unwrap_or(value.len()));
        if scheme.eq_ignore_ascii_case(b"bearer") {
            let key = rest.trim_ascii();
            return (!key.is_empty()).then_some(key);
        }
        return None;
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii()).filter(|k| !k.is_empty())
}

/// Who a request is from: the entry it is served as (a key's, or the
/// grant's that admits a token's holder) and, for a token, who it names.
pub struct Caller<'s> {
    /// The key, or the grant a token's holder is served through.
    pub key: &'s KeyEntry,
    /// The holder of a verified token (`None`: a key).
    pub user: Option<Arc<Verified>>,
    /// Their own state in the grant, when it counts each member on their
    /// own (`perUser`).
    pub member: Option<Arc<Member>>,
}

/// Finds who the request is from. A bearer shaped like a JWT, where the
/// config trusts a provider, is verified (or found remembered) and served
/// through the one grant that admits its holder; any other bearer is a
/// key, looked up by its digest: a key costs no signature check.
///
/// # Errors
/// 401-class [`GatewayError`]: missing, unknown, disabled or expired key;
/// a token refused (its code says why) or admitted by no grant.
pub fn authenticate<'s>(
    snapshot: &'s Snapshot,
    headers: &HeaderMap,
    now: impl FnOnce() -> jiff::Timestamp,
) -> Result<Caller<'s>, GatewayError> {
    let bearer = presented_key(headers).ok_or(GatewayError::MissingKey)?;
    let identity = &snapshot.identity;
    // A token remembered by this worker is found by its bytes first: its
    // shape was checked when it was verified. No key starts with `eyJ`.
    let mut now = Some(now);
    let mut read_at = None;
    if !identity.is_empty() && bearer.starts_with(b"eyJ") {
        let at = now.take().map_or_else(jiff::Timestamp::now, |now| now());
        if let Some(verified) = crate::identity::remembered(bearer, at, |issuer| identity.provider_for(issuer)) {
            return serve_token(identity, headers, verified, at);
        }
        if crate::identity::is_token_shaped(bearer) {
            // Token-shaped: base64url and dots only, so always UTF-8.
            let token = std::str::from_utf8(bearer).map_err(|_| GatewayError::TokenRefused(Refusal::MalformedToken))?;
            // The provider the token names, for an `unknown_key` refusal.
            let named = std::cell::Cell::new(None);
            let verified = crate::identity::verify_remembered(token, at, |issuer| {
                let provider = identity.provider_for(issuer);
                named.set(provider);
                provider
            });
            return match verified {
                Ok(verified) => serve_token(identity, headers, verified, at),
                Err(refusal) => {
                    if let (Refusal::UnknownKey, Some(provider)) = (refusal, named.get()) {
                        identity.note_unknown_key(provider);
                    }
                    Err(GatewayError::TokenRefused(refusal))
                }
            };
        }
        read_at = Some(at);
    }
    let entry = super::key_digests::find(snapshot, bearer).ok_or(GatewayError::InvalidKey)?;
    if entry.disabled {
        return Err(GatewayError::DisabledKey);
    }
    let mut at = || read_at.or_else(|| now.take().map(|now| now())).unwrap_or_else(jiff::Timestamp::now);
    if entry.expires_at().is_some_and(|expires| expires <= at()) {
        return Err(GatewayError::ExpiredKey);
    }
    Ok(Caller { key: entry, user: None, member: None })
}

/// The grant (and the member's own state) a verified token is served by.
fn serve_token<'s>(
    identity: &'s crate::snapshot::identity::Identity,
    headers: &HeaderMap,
    verified: Arc<Verified>,
    now: jiff::Timestamp,
) -> Result<Caller<'s>, GatewayError> {
    let asked = headers.get(&GRANT_HEADER).map(http::HeaderValue::as_bytes);
    let grant = identity.grant_for(&verified, asked).map_err(|refused| match refused {
        NotGranted::NoGrant => GatewayError::NoGrant(false),
        NotGranted::NotInNamedGrant => GatewayError::NoGrant(true),
        NotGranted::Ambiguous => GatewayError::AmbiguousGrant,
    })?;
    let member = match &grant.members {
        Some(members) => Some(members.member(&verified.user, now).map_err(|full| GatewayError::GrantFull(full.0))?),
        None => None,
    };
    Ok(Caller { key: &grant.entry, user: Some(verified), member })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use waycast_crds::config::{GatewayConfig, KeyConfig};

    fn snapshot() -> Snapshot {
        let key = |id: &str, text: &str| KeyConfig::new(id, waycast_crds::digest::sha256_hex(text.as_bytes()));
        let mut expired = key("t/expired", "expired-key");
        expired.expires_at = Some("2026-01-01T00:00:00Z".parse().unwrap());
        let mut disabled = key("t/disabled", "disabled-key");
        disabled.disabled = true;
        let config =
            GatewayConfig { keys: vec![key("t/alice", "alice-key"), expired, disabled], ..GatewayConfig::empty() };
        Snapshot::standalone(&config, "h".into()).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs.iter().map(|(n, v)| (http::HeaderName::from_static(n), HeaderValue::from_str(v).unwrap())).collect()
    }

    #[test]
    fn known_keys_pass_in_either_header() {
        let snapshot = snapshot();
        let now = || "2026-06-01T00:00:00Z".parse().unwrap();
        for presented in [
            headers(&[("authorization", "Bearer alice-key")]),
            headers(&[("authorization", "bearer   alice-key ")]),
            headers(&[("x-api-key", "alice-key")]),
        ] {
            assert_eq!(&*authenticate(&snapshot, &presented, now).unwrap().key.id, "t/alice");
        }
    }

    #[test]
    fn refusals() {
        let snapshot = snapshot();
        let now = || "2026-06-01T00:00:00Z".parse().unwrap();
        let cases = [
            (headers(&[]), GatewayError::MissingKey),
            (headers(&[("authorization", "Basic YWxpY2U6eA==")]), GatewayError::MissingKey),
            (headers(&[("authorization", "Bearer ")]), GatewayError::MissingKey),
            (headers(&[("authorization", "Bearer wrong")]), GatewayError::InvalidKey),
            (headers(&[("authorization", "Bearer expired-key")]), GatewayError::ExpiredKey),
            (headers(&[("authorization", "Bearer disabled-key")]), GatewayError::DisabledKey),
        ];
        for (presented, expected) in cases {
            assert_eq!(authenticate(&snapshot, &presented, now).map(|c| c.key.id.clone()).err(), Some(expected));
        }
        // Before its expiry the same key works.
        let before = || "2025-06-01T00:00:00Z".parse().unwrap();
        assert!(authenticate(&snapshot, &headers(&[("x-api-key", "expired-key")]), before).is_ok());
    }

    /// A token naming a key its issuer's set lacks notes its provider, for
    /// the heartbeat to name (the operator then fetches the set sooner);
    /// no other refusal does, and a note is taken once.
    #[test]
    fn a_token_of_a_key_not_in_the_set_notes_its_provider() {
        use waycast_crds::config::ProviderConfig;
        use waycast_mock::tokens::TestIssuer;
        const CORP: &str = "https://sso.example.com/realms/corp";
        let (served, rotated) = (TestIssuer::new(CORP, "corp-1"), TestIssuer::new(CORP, "corp-2"));
        let mut corp = ProviderConfig::new("corp", CORP, "waycast");
        corp.key_set = Some(served.jwks());
        let config = GatewayConfig { providers: vec![corp], ..GatewayConfig::empty() };
        let snapshot = Snapshot::standalone(&config, "h".into()).unwrap();
        let at = jiff::Timestamp::now();
        let token_of = |issuer: &TestIssuer, audience: &str| {
            let claims = issuer.claims("alice", audience, &[], at.as_second(), at.as_second() + 600);
            format!("Bearer {}", issuer.token(&claims))
        };
        let refusal = |bearer: &str| match authenticate(&snapshot, &headers(&[("authorization", bearer)]), || at) {
            Err(GatewayError::TokenRefused(refusal)) => Some(refusal),
            _ => None,
        };
        let identity = &snapshot.identity;
        assert_eq!(refusal(&token_of(&served, "someone-else")), Some(Refusal::WrongAudience));
        let elsewhere = TestIssuer::new("https://elsewhere.example.com", "corp-2");
        assert_eq!(refusal(&token_of(&elsewhere, "waycast")), Some(Refusal::UnknownIssuer));
        assert!(!identity.unknown_keys_noted(), "no other refusal notes anything");

        assert_eq!(refusal(&token_of(&rotated, "waycast")), Some(Refusal::UnknownKey));
        assert!(identity.unknown_keys_noted());
        assert_eq!(identity.take_unknown_keys(), ["corp"]);
        assert!(identity.take_unknown_keys().is_empty(), "taken once");
        identity.renote_unknown_keys(&["corp".to_owned()]);
        assert_eq!(identity.take_unknown_keys(), ["corp"], "a heartbeat not written gives them back");
    }
}
