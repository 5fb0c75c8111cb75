//! Bearer authentication: the presented key's SHA-256 (remembered per
//! worker for known keys, `key_digests`) is looked up in the snapshot. No
//! I/O, no clock except through the `now` the caller passes.

use http::HeaderMap;
use http::header::AUTHORIZATION;

use crate::error::GatewayError;
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

/// Finds the key entry for the request.
///
/// # Errors
/// 401-class [`GatewayError`]: missing, unknown, disabled or expired key.
pub fn authenticate<'s>(
    snapshot: &'s Snapshot,
    headers: &HeaderMap,
    now: impl FnOnce() -> jiff::Timestamp,
) -> Result<&'s KeyEntry, GatewayError> {
    let key = presented_key(headers).ok_or(GatewayError::MissingKey)?;
    let entry = super::key_digests::find(snapshot, key).ok_or(GatewayError::InvalidKey)?;
    if entry.disabled {
        return Err(GatewayError::DisabledKey);
    }
    if entry.expires_at().is_some_and(|expires| expires <= now()) {
        return Err(GatewayError::ExpiredKey);
    }
    Ok(entry)
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
            assert_eq!(&*authenticate(&snapshot, &presented, now).unwrap().id, "t/alice");
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
            assert_eq!(authenticate(&snapshot, &presented, now).map(|e| e.id.clone()), Err(expected));
        }
        // Before its expiry the same key works.
        let before = || "2025-06-01T00:00:00Z".parse().unwrap();
        assert!(authenticate(&snapshot, &headers(&[("x-api-key", "expired-key")]), before).is_ok());
    }
}
