//! A Gateway's config in parts, so that it is not bounded by what one
//! Secret holds and a key change rewrites a small part of it: the base
//! (models, settings — every field but the keys), the keys in shards by a
//! salted hash of their id, and a manifest naming the salt and each part by
//! the SHA-256 of its canonical JSON. The manifest's own digest is the
//! config's identity (what pods report in heartbeats). A reader assembles a
//! config only from a consistent set — the base and every shard the
//! manifest names, each with the digest it names and holding only keys that
//! hash to it — so a pod never serves half of a change.

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
/// Keys a shard holds on average at most before the count is chosen
/// afresh ([`shard_count`]).
pub const MOST_PER_SHARD: usize = KEYS_PER_SHARD + KEYS_PER_SHARD / 4;
/// Shards at most (a million keys at the aim above).
pub const MAX_SHARDS: u32 = 1024;
/// The length of a manifest's salt: lowercase hex of 8 random bytes. Its
/// fixed length is what makes salt-then-id an unambiguous hash input.
pub const SALT_LEN: usize = 16;
/// The most a key shard's JSON may be. The API server refuses a Secret
/// whose `.data` values total over 1 MiB, counted decoded (base64 is only
/// their form on the wire), and gzip grows no input by more than a few
/// bytes per 64 KiB block: a shard within this bound fits a Secret stored
/// plain or gzipped, with a quarter of the limit left for the Secret's
/// other entries, and the stored object (with its labels, owner references
/// and managed fields) stays well under etcd's 1.5 MiB request limit. At
/// [`MOST_PER_SHARD`], the most [`shard_count`] lets a shard grow to on
/// average, each key may take some 600 bytes (a salted hash spreads keys
/// evenly; a shard past this is refused, and the writer moves the count up).
pub const MAX_SHARD_BYTES: usize = 768 * 1024;

/// In a cluster each part is a Secret of its own, named after the config
/// Secret `C` a gateway is given (`--config-secret NS/C`): `C` holds the
/// manifest ([`SECRET_KEY_MANIFEST`], plain JSON, small), `C-base` the
/// base and `C-keys-N-I` shard `I` of `N` ([`SECRET_KEY_PART`], gzipped
/// canonical JSON, its digest in [`PART_DIGEST_ANNOTATION`]). The count in
/// a shard's name means a new shard count writes a new set beside the one
/// served, never over it. Names, not labels: a pod's Role can grant `get`
/// on these names and nothing else in its namespace.
pub const SECRET_KEY_MANIFEST: &str = "manifest.json";
/// A part's data key in its Secret.
pub const SECRET_KEY_PART: &str = "part.json.gz";
/// The digest of the part a Secret holds (what the writer compares before
/// writing it again).
pub const PART_DIGEST_ANNOTATION: &str = "waycast.dev/part-digest";

/// The name of the Secret holding the base of config Secret `config`.
pub fn base_secret_name(config: &str) -> String {
    format!("{config}-base")
}

/// The name of the Secret holding shard `index` of `of` of config Secret
/// `config`.
pub fn shard_secret_name(config: &str, index: u32, of: u32) -> String {
    format!("{config}-keys-{of}-{index}")
}

/// What names a config's parts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Manifest {
    /// Always [`MANIFEST_API_VERSION`].
    pub api_version: String,
    /// Mixed into each key's placement ([`shard_of`]), [`SALT_LEN`]
    /// lowercase hex digits. Drawn at random by the writer when the shard
    /// count changes and kept otherwise (a new salt moves every key, so
    /// rewrites every shard): a tenant who does not hold it cannot grind
    /// key names that pile into one shard.
    pub salt: String,
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
    /// Its keys, by id.
    pub keys: Vec<KeyConfig>,
}

/// A [`KeyShard`] as written, of borrowed keys: the same JSON.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyShardOf<'a> {
    api_version: &'a str,
    index: u32,
    of: u32,
    keys: Vec<&'a KeyConfig>,
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

/// Why a config was not split.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The salt is not one a manifest may hold. Not echoed: a valid one is
    /// kept from tenants, and a near miss may be most of one.
    #[error("the shard salt is not {SALT_LEN} lowercase hex digits")]
    Salt,
    /// The shard count is not one a manifest may hold.
    #[error("{0} key shards, expected a power of two from 1 to {MAX_SHARDS}")]
    ShardCount(u32),
    /// Two keys share an id, so the set would not assemble.
    #[error("key id {0:?} appears more than once")]
    DuplicateKey(String),
    /// A shard would not fit a Secret: its keys are too many or too large.
    #[error("key shard {index} would be {bytes} bytes, over the {MAX_SHARD_BYTES} a shard may be")]
    ShardTooLarge {
        /// Which shard.
        index: u32,
        /// Its JSON's length.
        bytes: usize,
    },
    /// Serialization failed (it does not for these types).
    #[error("config part does not serialize: {0}")]
    Json(#[from] serde_json::Error),
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
    /// More shards were given than the manifest names: the caller did not
    /// pick them by this manifest.
    #[error("{given} key shards given, the manifest names {named}")]
    ShardsNotNamed {
        /// How many the manifest names.
        named: u32,
        /// How many were given.
        given: usize,
    },
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
    /// A key id appears twice: which of the two is served would be up to
    /// the order of the set. Placement puts both copies in one shard.
    #[error("key shard {index} holds key {id:?} more than once")]
    DuplicateKey {
        /// The shard holding it.
        index: u32,
        /// The key's id.
        id: String,
    },
}

/// The number of shards for `keys` keys: a power of two near
/// `keys / KEYS_PER_SHARD`, kept from `current` while each shard would hold
/// between a quarter and a quarter more than the aim (a change of count
/// rewrites every shard, so it is not made for a key or two; the upper
/// bound keeps a key change within 64 KB written: at twice the aim a shard
/// was some 73 KB gzipped).
pub fn shard_count(keys: usize, current: Option<u32>) -> u32 {
    let per_shard = |shards: u32| keys / shards.max(1) as usize;
    if let Some(current) = current.filter(|c| c.is_power_of_two() && *c <= MAX_SHARDS) {
        let fits_above = per_shard(current) <= MOST_PER_SHARD || current == MAX_SHARDS;
        let fits_below = per_shard(current) >= KEYS_PER_SHARD / 4 || current == 1;
        if fits_above && fits_below {
            return current;
        }
    }
    let wanted = keys.div_ceil(KEYS_PER_SHARD).max(1);
    u32::try_from(wanted.next_power_of_two()).unwrap_or(MAX_SHARDS).min(MAX_SHARDS)
}

/// The shard of the key `id` among `shards` under the manifest's `salt`:
/// the first eight bytes of SHA-256(salt, id), modulo. Stable across
/// versions: a pod and the operator of different builds must agree.
///
/// Unsalted, the placement was public and, the count being a power of two,
/// keys that collide at one count collide at every smaller one, so ground
/// names stayed piled up however the count changed.
pub fn shard_of(salt: &str, id: &str, shards: u32) -> u32 {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(salt.as_bytes());
    context.update(id.as_bytes());
    let digest = context.finish();
    let mut first = [0; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u32::try_from(u64::from_be_bytes(first) % u64::from(shards.max(1))).unwrap_or(0)
}

/// `config` split into a base and `shards` key shards placed by `salt`
/// (the manifest's; kept by the caller across writes, see
/// [`Manifest::salt`]). Each shard lists its keys by id, so equal key sets
/// give equal bytes whatever the config's order.
///
/// # Errors
/// [`SplitError`] for a salt or count a manifest may not hold, a key id
/// that appears twice, or a shard over [`MAX_SHARD_BYTES`]: a set that
/// would not assemble, or not fit its Secrets, is not produced.
pub fn split(config: &GatewayConfig, salt: &str, shards: u32) -> Result<Parts, SplitError> {
    if !salt_ok(salt) {
        return Err(SplitError::Salt);
    }
    if !count_ok(shards) {
        return Err(SplitError::ShardCount(shards));
    }
    // Neither the base nor the shards copy a key: at 100,000 keys the
    // copies were most of what a split allocated, twice per reconcile.
    let base = GatewayConfig {
        api_version: config.api_version.clone(),
        models: config.models.clone(),
        keys: Vec::new(),
        settings: config.settings.clone(),
        providers: config.providers.clone(),
        grants: config.grants.clone(),
    }
    .to_canonical_json()?;
    let mut by_shard: Vec<Vec<&KeyConfig>> = vec![Vec::new(); shards as usize];
    for key in &config.keys {
        by_shard[shard_of(salt, &key.id, shards) as usize].push(key);
    }
    let mut encoded = Vec::with_capacity(by_shard.len());
    for (index, mut keys) in (0..shards).zip(by_shard) {
        keys.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        if let Some(twice) = first_repeated(&keys) {
            return Err(SplitError::DuplicateKey(twice.to_owned()));
        }
        let shard = encode_shard(index, shards, keys)?;
        if shard.len() > MAX_SHARD_BYTES {
            return Err(SplitError::ShardTooLarge { index, bytes: shard.len() });
        }
        encoded.push(shard);
    }
    let manifest = Manifest {
        api_version: MANIFEST_API_VERSION.into(),
        salt: salt.into(),
        base: sha256_hex(&base),
        shards: encoded.iter().map(|shard| sha256_hex(shard)).collect(),
    };
    Ok(Parts { manifest, base, shards: encoded })
}

/// Shard `index` of `of` holding `keys` (sorted by id, each id once), as
/// [`split`] writes it: a writer that patches one shard gives the bytes a
/// split of the same keys gives.
///
/// # Errors
/// Only if serialization itself fails (it does not for these types).
pub fn encode_shard(index: u32, of: u32, keys: Vec<&KeyConfig>) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&KeyShardOf { api_version: SHARD_API_VERSION, index, of, keys })
}

fn salt_ok(salt: &str) -> bool {
    salt.len() == SALT_LEN && salt.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn count_ok(shards: u32) -> bool {
    shards.is_power_of_two() && shards <= MAX_SHARDS
}

/// The first id that appears twice in `keys`, sorted by id.
fn first_repeated<K: std::borrow::Borrow<KeyConfig>>(keys: &[K]) -> Option<&str> {
    keys.windows(2).find(|pair| pair[0].borrow().id == pair[1].borrow().id).map(|pair| pair[0].borrow().id.as_str())
}

impl Manifest {
    /// The config's identity: the digest of the manifest's canonical JSON.
    ///
    /// # Errors
    /// Only if serialization itself fails (it does not for this type).
    pub fn hash(&self) -> Result<String, serde_json::Error> {
        Ok(sha256_hex(&self.to_canonical_json()?))
    }

    /// Canonical JSON (struct order).
    ///
    /// # Errors
    /// Only if serialization itself fails (it does not for this type).
    pub fn to_canonical_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// A manifest from its JSON, [checked](Self::check).
    ///
    /// # Errors
    /// [`AssembleError::Manifest`].
    pub fn parse(bytes: &[u8]) -> Result<Self, AssembleError> {
        let manifest: Self = serde_json::from_slice(bytes).map_err(|e| AssembleError::Manifest(e.to_string()))?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Whether this version reads the manifest: its apiVersion, a salt, a
    /// power of two of shards within [`MAX_SHARDS`], a digest per part.
    ///
    /// # Errors
    /// [`AssembleError::Manifest`] saying what is wrong.
    pub fn check(&self) -> Result<(), AssembleError> {
        if self.api_version != MANIFEST_API_VERSION {
            return Err(AssembleError::Manifest(format!(
                "apiVersion {:?}, expected {MANIFEST_API_VERSION}",
                self.api_version
            )));
        }
        if !salt_ok(&self.salt) {
            return Err(AssembleError::Manifest(format!("the salt is not {SALT_LEN} lowercase hex digits")));
        }
        if !u32::try_from(self.shards.len()).is_ok_and(count_ok) {
            return Err(AssembleError::Manifest(format!(
                "{} shards, expected a power of two from 1 to {MAX_SHARDS}",
                self.shards.len()
            )));
        }
        let digest = |d: &String| crate::digest::parse_sha256_hex(d).is_some() && d.len() == 64;
        if !digest(&self.base) || !self.shards.iter().all(digest) {
            return Err(AssembleError::Manifest("a part's digest is not 64 hex digits".into()));
        }
        Ok(())
    }
}

/// The config `manifest` names, from its base and its shards by index
/// (`None`: not held yet; one slot per shard the manifest names). Its keys
/// are sorted by id, so equal sets assemble to equal configs, and splitting
/// it again with the manifest's salt and count gives the same parts.
///
/// The manifest is [checked](Manifest::check) here too: a caller may have
/// built or edited it rather than parsed it.
///
/// # Errors
/// [`AssembleError`] when the manifest is not one this version reads, a
/// part is missing, is not the one named, does not read, or holds a key
/// that belongs elsewhere or appears twice.
pub fn assemble(manifest: &Manifest, base: &[u8], shards: &[Option<&[u8]>]) -> Result<GatewayConfig, AssembleError> {
    manifest.check()?;
    if shards.len() > manifest.shards.len() {
        let named = u32::try_from(manifest.shards.len()).unwrap_or(u32::MAX);
        return Err(AssembleError::ShardsNotNamed { named, given: shards.len() });
    }
    let mut config = read_base(manifest, base)?;
    let of = u32::try_from(manifest.shards.len()).map_err(|e| AssembleError::Manifest(e.to_string()))?;
    for index in 0..of {
        let bytes = shards.get(index as usize).copied().flatten().ok_or(AssembleError::ShardMissing(index))?;
        let keys = read_shard(manifest, index, bytes)?;
        if index == 0 {
            let _ = config.keys.try_reserve_exact(expected_keys(keys.len(), of));
        }
        config.keys.extend(keys);
    }
    // NB: unstable is enough: an id appears in one shard at most (its
    // placement), and once there (`read_shard`), so no two keys the sort
    // could swap exist.
    config.keys.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    Ok(config)
}

/// How many keys to make room for at once, from the first of `of`
/// shards holding `first` keys: an eighth over (keys are spread by a
/// hash: 3σ at 1,024 keys a shard is a tenth), since growing 100,000
/// entries by doubling held two copies of most of them. Bounded by what
/// the writer puts in a shard: a forged first shard must not make a
/// reader reserve gigabytes.
pub fn expected_keys(first: usize, of: u32) -> usize {
    first.min(MOST_PER_SHARD * 2).saturating_mul(of as usize).saturating_mul(9) / 8
}

/// The base part `manifest` names, read: the config without its keys.
/// The manifest is taken as [checked](Manifest::check).
///
/// # Errors
/// [`AssembleError::BaseNotNamed`] when `base` is not the part named, or
/// [`AssembleError::Unreadable`].
pub fn read_base(manifest: &Manifest, base: &[u8]) -> Result<GatewayConfig, AssembleError> {
    if sha256_hex(base) != manifest.base {
        return Err(AssembleError::BaseNotNamed);
    }
    let config: GatewayConfig = serde_json::from_slice(base)
        .map_err(|e| AssembleError::Unreadable { part: "base".into(), reason: e.to_string() })?;
    if config.api_version != CONFIG_API_VERSION || !config.keys.is_empty() {
        return Err(AssembleError::Unreadable { part: "base".into(), reason: "not a base part".into() });
    }
    Ok(config)
}

/// The keys of shard `index` that `manifest` names, read from `bytes`, in
/// the order the shard holds them: a reader may take a changed shard's
/// keys alone. The manifest is taken as [checked](Manifest::check).
///
/// # Errors
/// [`AssembleError`] when `bytes` are not the shard named, do not read,
/// say they are another shard, or hold a key that belongs elsewhere or
/// appears twice.
pub fn read_shard(manifest: &Manifest, index: u32, bytes: &[u8]) -> Result<Vec<KeyConfig>, AssembleError> {
    let of = u32::try_from(manifest.shards.len()).map_err(|e| AssembleError::Manifest(e.to_string()))?;
    let named = manifest
        .shards
        .get(index as usize)
        .ok_or(AssembleError::ShardsNotNamed { named: of, given: index as usize + 1 })?;
    if sha256_hex(bytes) != *named {
        return Err(AssembleError::ShardNotNamed(index));
    }
    let shard: KeyShard = serde_json::from_slice(bytes)
        .map_err(|e| AssembleError::Unreadable { part: format!("shard {index}"), reason: e.to_string() })?;
    if shard.api_version != SHARD_API_VERSION || shard.index != index || shard.of != of {
        let reason = format!("says it is shard {} of {} ({})", shard.index, shard.of, shard.api_version);
        return Err(AssembleError::Unreadable { part: format!("shard {index}"), reason });
    }
    let belongs = |key: &KeyConfig| shard_of(&manifest.salt, &key.id, of);
    if let Some(key) = shard.keys.iter().find(|key| belongs(key) != index) {
        return Err(AssembleError::Misplaced { index, id: key.id.clone(), belongs: belongs(key) });
    }
    let mut ids: Vec<&str> = shard.keys.iter().map(|key| key.id.as_str()).collect();
    ids.sort_unstable();
    if let Some(pair) = ids.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(AssembleError::DuplicateKey { index, id: pair[0].to_owned() });
    }
    Ok(shard.keys)
}

#[cfg(test)]
#[path = "shards_tests.rs"]
mod tests;
