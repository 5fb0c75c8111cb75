//! A provider's JSON Web Key Set (RFC 7517), read once each time it is
//! fetched, never per request: bounded, its usable signing keys kept by
//! `kid`, every other entry skipped. A provider that adds an encryption
//! key, a symmetric one or a curve we do not verify keeps its other keys
//! serving; only a document that is not a key set at all, or one past the
//! bounds, is refused whole.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::DecodingKey;
use serde::Deserialize;

/// Largest key set document read (real ones are 1–10 KiB).
pub const MAX_KEY_SET_BYTES: usize = 64 * 1024;

/// Most entries a key set may list, usable or not.
pub const MAX_KEYS: usize = 64;

/// RSA moduli verified: ring's bounds for PKCS#1 v1.5 signatures, so a
/// key kept is one that can verify.
const RSA_MODULUS_BITS: std::ops::RangeInclusive<usize> = 2048..=8192;

/// Longest RSA public exponent kept (ring accepts up to 33 bits).
const RSA_EXPONENT_BYTES: usize = 5;

/// Why a key set document is refused whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    /// Longer than [`MAX_KEY_SET_BYTES`].
    #[error("the key set is {0} bytes, more than the {MAX_KEY_SET_BYTES} read")]
    TooLarge(usize),
    /// More than [`MAX_KEYS`] entries.
    #[error("the key set lists {0} keys, more than the {MAX_KEYS} read")]
    TooManyKeys(usize),
    /// Not a JSON object with a `keys` array.
    #[error("not a JSON Web Key Set: {0}")]
    NotAKeySet(String),
}

/// The signature algorithms accepted: asymmetric only. `none` and the
/// HMACs (`HS*`) never are, whatever a key set says: an HMAC "verified"
/// with a public key is a signature anyone can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl Alg {
    /// The algorithm a JOSE `alg` value names, if it is one accepted.
    /// `Ed25519` is RFC 9864's fully specified name for what `EdDSA` means
    /// with an Ed25519 key, the only kind of OKP key a set keeps.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "RS256" => Some(Self::Rs256),
            "ES256" => Some(Self::Es256),
            "EdDSA" | "Ed25519" => Some(Self::EdDsa),
            _ => None,
        }
    }

    pub(super) fn jsonwebtoken(self) -> jsonwebtoken::Algorithm {
        match self {
            Self::Rs256 => jsonwebtoken::Algorithm::RS256,
            Self::Es256 => jsonwebtoken::Algorithm::ES256,
            Self::EdDsa => jsonwebtoken::Algorithm::EdDSA,
        }
    }
}

/// A provider's usable signing keys.
pub struct KeySet {
    keys: Vec<Key>,
    by_kid: HashMap<Box<str>, Vec<usize>>,
    skipped: usize,
    digest: [u8; 32],
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<(&str, Alg)> = self.keys.iter().map(|key| (key.kid.as_deref().unwrap_or(""), key.alg)).collect();
        f.debug_struct("KeySet").field("keys", &kids).field("skipped", &self.skipped).finish()
    }
}

/// One usable key: its `kid` and the one algorithm it verifies, fixed by
/// its type (RSA: RS256, EC P-256: ES256, OKP Ed25519: EdDSA). A token is
/// only ever checked with its key's own algorithm, so a key of one family
/// never meets a signature of another.
pub(super) struct Key {
    pub(super) kid: Option<Box<str>>,
    pub(super) alg: Alg,
    pub(super) key: DecodingKey,
}

#[derive(Deserialize)]
struct Document {
    keys: Vec<serde_json::Value>,
}

/// What a JWK says, each field as text when it is; any other shape skips
/// the entry.
#[derive(Deserialize)]
struct RawKey {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    intended_use: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

impl KeySet {
    /// Reads a key set document.
    ///
    /// # Errors
    /// A document past the bounds, or one that is not a JSON object with a
    /// `keys` array. Entries that are not usable signing keys are skipped,
    /// never an error.
    pub fn parse(document: &[u8]) -> Result<Self, KeySetError> {
        if document.len() > MAX_KEY_SET_BYTES {
            return Err(KeySetError::TooLarge(document.len()));
        }
        let parsed: Document =
            serde_json::from_slice(document).map_err(|error| KeySetError::NotAKeySet(error.to_string()))?;
        if parsed.keys.len() > MAX_KEYS {
            return Err(KeySetError::TooManyKeys(parsed.keys.len()));
        }
        let mut set =
            Self { keys: Vec::with_capacity(parsed.keys.len()), by_kid: HashMap::new(), skipped: 0, digest: [0; 32] };
        set.digest.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, document).as_ref());
        for entry in &parsed.keys {
            let Some(key) = RawKey::deserialize(entry).ok().and_then(usable) else {
                set.skipped += 1;
                continue;
            };
            if let Some(kid) = &key.kid {
                let same_kid = set.by_kid.entry(kid.clone()).or_default();
                // The same kid twice for one algorithm is ambiguous: the
                // first listed serves.
                if same_kid.iter().any(|&i| set.keys[i].alg == key.alg) {
                    set.skipped += 1;
                    continue;
                }
                same_kid.push(set.keys.len());
            }
            set.keys.push(key);
        }
        Ok(set)
    }

    /// A set of no keys: it verifies nothing (a provider whose key set is
    /// not fetched yet, or did not read).
    pub fn empty() -> Self {
        Self { keys: Vec::new(), by_kid: HashMap::new(), skipped: 0, digest: [0; 32] }
    }

    /// Usable keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is usable.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Entries skipped: not signing keys we verify with, or malformed.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// SHA-256 of the document it was read from.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The key of `kid` for `alg`.
    pub(super) fn with_kid(&self, kid: &str, alg: Alg) -> Option<&Key> {
        self.by_kid.get(kid)?.iter().map(|&i| &self.keys[i]).find(|key| key.alg == alg)
    }

    /// Every key for `alg`, in the set's order.
    pub(super) fn of_alg(&self, alg: Alg) -> impl Iterator<Item = &Key> {
        self.keys.iter().filter(move |key| key.alg == alg)
    }
}

/// The key `raw` describes, if it is a signing key we verify with.
fn usable(raw: RawKey) -> Option<Key> {
    if raw.intended_use.as_deref().is_some_and(|intended| intended != "sig") {
        return None;
    }
    let decode = |field: Option<String>| URL_SAFE_NO_PAD.decode(field?).ok();
    let (alg, key) = match (raw.kty.as_str(), raw.crv.as_deref()) {
        ("RSA", _) => {
            let modulus = decode(raw.n)?;
            let exponent = decode(raw.e)?;
            // ring reads both as positive integers without leading zeros;
            // some providers pad them.
            let modulus = without_leading_zeros(&modulus);
            let exponent = without_leading_zeros(&exponent);
            let bits = modulus.len() * 8 - modulus.first().map_or(8, |top| top.leading_zeros() as usize);
            if !RSA_MODULUS_BITS.contains(&bits) || exponent.is_empty() || exponent.len() > RSA_EXPONENT_BYTES {
                return None;
            }
            (Alg::Rs256, DecodingKey::from_rsa_raw_components(modulus, exponent))
        }
        ("EC", Some("P-256")) => {
            let (x, y) = (decode(raw.x)?, decode(raw.y)?);
            if x.len() != 32 || y.len() != 32 {
                return None;
            }
            // The uncompressed point ring verifies with.
            let mut point = Vec::with_capacity(65);
            point.push(0x04);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            (Alg::Es256, DecodingKey::from_ec_der(&point))
        }
        ("OKP", Some("Ed25519")) => {
            let x = decode(raw.x)?;
            if x.len() != 32 {
                return None;
            }
            (Alg::EdDsa, DecodingKey::from_ed_der(&x))
        }
        _ => return None,
    };
    // A key that names its algorithm serves only that one.
    if raw.alg.is_some_and(|named| Alg::named(&named) != Some(alg)) {
        return None;
    }
    Some(Key { kid: raw.kid.map(Into::into), alg, key })
}

fn without_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&byte| byte != 0).unwrap_or(bytes.len());
    &bytes[first..]
}
