//! A Gateway's config in parts, so that it is not bounded by what one
//! Secret holds and a key change rewrites a small part of it: the base
//! (models, settings — every field but the keys), the keys in shards by a
//! hash of their id, and a manifest naming each part by the SHA-256 of its
//! canonical JSON. The manifest's own digest is the config's identity (what
//! pods report in heartbeats). A reader assembles a config only from a
//! consistent set — the base and every shard the manifest names, each
//! with the digest it names and holding only keys that hash to it — so a
//! pod never serves half of a change.

use serde::{Deserialize, Serialize};

use crate::config::{CONFIG_API_VERSION, GatewayConfig, KeyConfig};
use crate::digest::sha256_hex;

/// `apiVersion` of a manifest.
pub const MANIFEST_API_VERSION: &str = "waycast.dev/config-manifest-v1";
/// `apiVersion` of a key shard.
pub const SHARD_API_VERSION: &str = "waycast.dev/config-keys-v1";
/// Keys a shard holds on average when the count is chosen afresh: some
/// 40 KB of gzipped JSON (a key's digest does not compress), so one key's
/// change rewrites that, not the whole table.
pub const KEYS_PER_SHARD: usize = 1024;
/// Shards at most (a million keys at the aim above).
pub const MAX_SHARDS: u32 = 1024;

/// What names a config's parts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Manifest {
    /// Always [`MANIFEST_API_VERSION`].
    pub api_version: String,
    /// The base part's digest.
    pub base: String,
    /// Each shard's digest, by index.
    pub shards: Vec<String>,
}

/// The keys whose ids hash to one shard.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyShard {
    /// Always [`SHARD_API_VERSION`].
    pub api_version: String,
    /// Which shard this is.
    pub index: u32,
    /// Of how many.
    pub of: u32,
    /// Its keys, in the config's order.
    pub keys: Vec<KeyConfig>,
}

/// A config split: each part's canonical JSON, and the manifest naming
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    /// What names the parts below.
    pub manifest: Manifest,
    /// The config without its keys.
    pub base: Vec<u8>,
    /// Each [`KeyShard`], by index.
    pub shards: Vec<Vec<u8>>,
}

/// Why a set of parts is not a config.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AssembleError {
    /// The manifest is not one this version reads.
    #[error("config manifest: {0}")]
    Manifest(String),
    /// The base part is not the one the manifest names (not yet written, or
    /// a later or earlier one).
    #[error("the config's base part is not the one its manifest names")]
    BaseNotNamed,
    /// A shard the manifest names is missing.
    #[error("key shard {0} is missing")]
    ShardMissing(u32),
    /// A shard is not the one the manifest names.
    #[error("key shard {0} is not the one the manifest names")]
    ShardNotNamed(u32),
    /// A part does not read.
    #[error("config part {part}: {reason}")]
    Unreadable {
        /// `base` or `shard N`.
        part: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard holds a key whose id hashes elsewhere, or says it is
    /// another shard: the set was not written by one split.
    #[error("key shard {index} holds key {id:?}, which belongs to shard {belongs}")]
    Misplaced {
        /// The shard that holds it.
        index: u32,
        /// The key's id.
        id: String,
        /// The shard it hashes to.
        belongs: u32,
    },
}

/// The number of shards for `keys` keys: a power of two near
/// `keys / KEYS_PER_SHARD`, kept from `current` while each shard would hold
/// between a quarter and twice the aim (a change of count rewrites every
/// shard, so it is not made for a key or two).
pub fn shard_count(keys: usize, current: Option<u32>) -> u32 {
    let per_shard = |shards: u32| keys / shards.max(1) as usize;
    if let Some(current) = current.filter(|c| c.is_power_of_two() && *c <= MAX_SHARDS) {
        let fits_above = per_shard(current) <= 2 * KEYS_PER_SHARD || current == MAX_SHARDS;
        let fits_below = per_shard(current) >= KEYS_PER_SHARD / 4 || current == 1;
        if fits_above && fits_below {
            return current;
        }
    }
    let wanted = keys.div_ceil(KEYS_PER_SHARD).max(1);
    u32::try_from(wanted.next_power_of_two()).unwrap_or(MAX_SHARDS).min(MAX_SHARDS)
}

/// The shard of the key `id` among `shards`: the first eight bytes of its
/// SHA-256, modulo. Stable across versions: a pod and the operator of
/// different builds must agree.
pub fn shard_of(id: &str, shards: u32) -> u32 {
    let digest = crate::digest::sha256(id.as_bytes());
    let mut first = [0; 8];
    first.copy_from_slice(&digest[..8]);
    u32::try_from(u64::from_be_bytes(first) % u64::from(shards.max(1))).unwrap_or(0)
}

/// `config` split into a base and `shards` key shards.
///
/// # Errors
/// Only if serialization itself fails (it does not for these types).
pub fn split(config: &GatewayConfig, shards: u32) -> Result<Parts, serde_json::Error> {
    let shards = shards.clamp(1, MAX_SHARDS);
    let base = GatewayConfig { keys: Vec::new(), ..config.clone() }.to_canonical_json()?;
    let mut by_shard: Vec<Vec<KeyConfig>> = vec![Vec::new(); shards as usize];
    for key in &config.keys {
        by_shard[shard_of(&key.id, shards) as usize].push(key.clone());
    }
    let shards: Vec<Vec<u8>> = (0..shards)
        .zip(by_shard)
        .map(|(index, keys)| {
            serde_json::to_vec(&KeyShard { api_version: SHARD_API_VERSION.into(), index, of: shards, keys })
        })
        .collect::<Result<_, _>>()?;
    let manifest = Manifest {
        api_version: MANIFEST_API_VERSION.into(),
        base: sha256_hex(&base),
        shards: shards.iter().map(|shard| sha256_hex(shard)).collect(),
    };
    Ok(Parts { manifest, base, shards })
}

impl Manifest {
    /// The config's identity: the digest of the manifest's canonical JSON.
    pub fn hash(&self) -> String {
        sha256_hex(&self.to_canonical_json())
    }

    /// Canonical JSON (struct order).
    pub fn to_canonical_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A manifest from its JSON, checked: this version, a digest per part,
    /// within [`MAX_SHARDS`].
    ///
    /// # Errors
    /// [`AssembleError::Manifest`].
    pub fn parse(bytes: &[u8]) -> Result<Self, AssembleError> {
        let manifest: Self = serde_json::from_slice(bytes).map_err(|e| AssembleError::Manifest(e.to_string()))?;
        if manifest.api_version != MANIFEST_API_VERSION {
            return Err(AssembleError::Manifest(format!(
                "apiVersion {:?}, expected {MANIFEST_API_VERSION}",
                manifest.api_version
            )));
        }
        if manifest.shards.is_empty() || manifest.shards.len() > MAX_SHARDS as usize {
            return Err(AssembleError::Manifest(format!(
                "{} shards, expected 1 to {MAX_SHARDS}",
                manifest.shards.len()
            )));
        }
        let digest = |d: &String| crate::digest::parse_sha256_hex(d).is_some() && d.len() == 64;
        if !digest(&manifest.base) || !manifest.shards.iter().all(digest) {
            return Err(AssembleError::Manifest("a part's digest is not 64 hex digits".into()));
        }
        Ok(manifest)
    }
}

/// The config `manifest` names, from its base and its shards by index
/// (`None`: not held yet).
///
/// # Errors
/// [`AssembleError`] when a part is missing, is not the one named, does
/// not read, or holds a key that belongs elsewhere.
pub fn assemble(manifest: &Manifest, base: &[u8], shards: &[Option<&[u8]>]) -> Result<GatewayConfig, AssembleError> {
    if sha256_hex(base) != manifest.base {
        return Err(AssembleError::BaseNotNamed);
    }
    let of = u32::try_from(manifest.shards.len()).map_err(|e| AssembleError::Manifest(e.to_string()))?;
    let unreadable =
        |part: String| move |e: serde_json::Error| AssembleError::Unreadable { part, reason: e.to_string() };
    let mut config: GatewayConfig = serde_json::from_slice(base).map_err(unreadable("base".into()))?;
    if config.api_version != CONFIG_API_VERSION || !config.keys.is_empty() {
        return Err(AssembleError::Unreadable { part: "base".into(), reason: "not a base part".into() });
    }
    for (index, named) in (0..of).zip(&manifest.shards) {
        let bytes = shards.get(index as usize).copied().flatten().ok_or(AssembleError::ShardMissing(index))?;
        if sha256_hex(bytes) != *named {
            return Err(AssembleError::ShardNotNamed(index));
        }
        let shard: KeyShard = serde_json::from_slice(bytes).map_err(unreadable(format!("shard {index}")))?;
        if shard.api_version != SHARD_API_VERSION || shard.index != index || shard.of != of {
            let reason = format!("says it is shard {} of {} ({})", shard.index, shard.of, shard.api_version);
            return Err(AssembleError::Unreadable { part: format!("shard {index}"), reason });
        }
        if let Some(key) = shard.keys.iter().find(|key| shard_of(&key.id, of) != index) {
            return Err(AssembleError::Misplaced { index, id: key.id.clone(), belongs: shard_of(&key.id, of) });
        }
        config.keys.extend(shard.keys);
    }
    Ok(config)
}

#[cfg(test)]
#[path = "shards_tests.rs"]
mod tests;
