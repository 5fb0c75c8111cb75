//! SHA-256 as every waycast binary spells it: lowercase hex. API keys are
//! stored and looked up by this digest, and a config is named by the
//! digest of its canonical JSON — the operator writes it, each gateway pod
//! reports it in its heartbeat, and the two must agree byte for byte.

/// The SHA-256 digest of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0_u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The SHA-256 digest of `bytes` in lowercase hex (64 characters).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha256(bytes))
}

/// A digest from its 64 hex characters (either case); `None` otherwise.
pub fn parse_sha256_hex(text: &str) -> Option<[u8; 32]> {
    let mut digest = [0_u8; 32];
    hex::decode_to_slice(text, &mut digest).ok()?;
    Some(digest)
}

/// The name of a config: the digest of its canonical JSON
/// (`GatewayConfig::to_canonical_json`), or of the bytes a standalone
/// gateway read.
pub fn config_hash(config_bytes: &[u8]) -> String {
    sha256_hex(config_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest_and_round_trip() {
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(sha256_hex(b""), empty);
        assert_eq!(parse_sha256_hex(empty), Some(sha256(b"")));
        assert_eq!(parse_sha256_hex(&empty.to_uppercase()), Some(sha256(b"")));
        for bad in ["abc", &"zz".repeat(32), &"ab".repeat(33), ""] {
            assert_eq!(parse_sha256_hex(bad), None, "{bad}");
        }
    }
}
