//! A Gateway's config as last written, kept so that a change of a few
//! ApiKeys is written as a patch of the shards holding them — the bytes a
//! whole compile and split of the same keys would give — without a compile
//! of every key (`controller::config_writer`).
//!
//! ```text
//! Kept { parts as written, served digests, served keys per namespace, basis }
//!   + [(key id, its entry now, or none)]
//!   ─► each touched shard parsed, its entries replaced, encoded again
//!   ─► the shards' digests, the manifest, the config's hash
//! refused (a whole compile decides): a digest another served key has,
//!   a namespace gaining its first or losing its last key while tenant
//!   policies apply, a key count the shard count no longer keeps, a shard
//!   or the whole over its bound
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use waycast_crds::config::{KeyConfig, MAX_CONFIG_JSON_BYTES};
use waycast_crds::shards::{self, KeyShard, MAX_SHARD_BYTES};

use super::config_parts::ConfigParts;

/// What a kept config was compiled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Basis {
    /// The Gateway's uid and generation.
    pub gateway: (String, i64),
    /// The key log position its inputs include (`stores::key_log`).
    pub position: u64,
    /// Whether the Gateway has tenant policies: a namespace's first served
    /// key then adds its tenant entry to the base.
    pub tenants: bool,
}

/// A config as written, and what a patch of it checks.
#[derive(Debug)]
pub struct Kept {
    /// Its Secrets (shared with the reconcile that wrote them until it
    /// ends; a patch then copies them).
    pub parts: Arc<ConfigParts>,
    /// What it was compiled from.
    pub basis: Basis,
    /// Served keys per digest (a 64-bit hash of it: a false match only
    /// sends a change to the whole compile).
    served: HashMap<u64, u32>,
    /// Served keys per namespace.
    namespaces: HashMap<String, u32>,
    /// Served keys in all.
    keys: usize,
}

/// Why a change is left to a whole compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unpatchable {
    /// Another served key has the digest: which one is served is decided
    /// among all of them, oldest first.
    #[error("another served key has the same digest")]
    Duplicate,
    /// A namespace gains its first or loses its last served key while the
    /// Gateway has tenant policies (the base lists the served ones').
    #[error("namespace {0} gains its first or loses its last served key")]
    Tenant(String),
    /// The key count no longer keeps the shard count.
    #[error("{0} keys want another shard count")]
    Recount(usize),
    /// A shard would be over [`MAX_SHARD_BYTES`].
    #[error("key shard {0} would be over its bound")]
    ShardTooLarge(usize),
    /// The config would be over what a gateway reads.
    #[error("the config would be over what a gateway reads")]
    TooLarge,
    /// A kept part does not read (it was written here: a bug).
    #[error("a kept part does not read: {0}")]
    Unreadable(String),
}

impl Kept {
    /// `parts`, written for a config whose keys are `keys`.
    pub fn new(parts: Arc<ConfigParts>, keys: &[KeyConfig], basis: Basis) -> Self {
        let mut kept = Self { parts, basis, served: HashMap::new(), namespaces: HashMap::new(), keys: 0 };
        kept.served.reserve(keys.len());
        for key in keys {
            kept.serve(key);
        }
        kept
    }

    fn serve(&mut self, key: &KeyConfig) -> u32 {
        self.keys += 1;
        *self.namespaces.entry(key.namespace().to_owned()).or_default() += 1;
        let count = self.served.entry(digest_hash(&key.sha256)).or_default();
        *count += 1;
        *count
    }

    fn unserve(&mut self, key: &KeyConfig) {
        self.keys = self.keys.saturating_sub(1);
        if let Some(count) = self.namespaces.get_mut(key.namespace()) {
            *count = count.saturating_sub(1);
        }
        let hash = digest_hash(&key.sha256);
        if let Some(count) = self.served.get_mut(&hash) {
            *count -= 1;
            if *count == 0 {
                self.served.remove(&hash);
            }
        }
    }

    fn namespace_count(&self, namespace: &str) -> u32 {
        self.namespaces.get(namespace).copied().unwrap_or(0)
    }

    /// Sets each key id of `changes` to its entry (`None`: not served):
    /// the shards holding them encoded again, the manifest and hash after
    /// them. Returns the indices of the shards whose bytes changed.
    ///
    /// # Errors
    /// [`Unpatchable`]: the change is for a whole compile to decide, and
    /// this `Kept` is not to be patched again (it may be half changed).
    pub fn patch(&mut self, changes: Vec<(String, Option<KeyConfig>)>) -> Result<Vec<usize>, Unpatchable> {
        let of = u32::try_from(self.parts.shards.len()).unwrap_or(u32::MAX);
        let salt = self.parts.layout.salt.clone();
        let mut by_shard: BTreeMap<usize, Vec<(String, Option<KeyConfig>)>> = BTreeMap::new();
        for (id, entry) in changes {
            by_shard.entry(shards::shard_of(&salt, &id, of) as usize).or_default().push((id, entry));
        }
        let mut namespaces_before: HashMap<String, u32> = HashMap::new();
        let mut replaced = Vec::new();
        let mut json_bytes = self.parts.json_bytes;
        for (index, changes) in by_shard {
            let held = self.parts.shard_json(index).ok_or(Unpatchable::Unreadable(format!("shard {index}")))?;
            let held_len = held.len();
            let mut shard: KeyShard =
                serde_json::from_slice(held).map_err(|e| Unpatchable::Unreadable(format!("shard {index}: {e}")))?;
            let mut moved = false;
            for (id, entry) in changes {
                let at = shard.keys.binary_search_by(|key| key.id.as_str().cmp(&id));
                if at.as_ref().ok().map(|i| &shard.keys[*i]) == entry.as_ref() {
                    continue;
                }
                moved = true;
                for namespace in at
                    .as_ref()
                    .ok()
                    .map(|i| shard.keys[*i].namespace())
                    .into_iter()
                    .chain(entry.as_ref().map(KeyConfig::namespace))
                {
                    if !namespaces_before.contains_key(namespace) {
                        namespaces_before.insert(namespace.to_owned(), self.namespace_count(namespace));
                    }
                }
                if let Ok(i) = at {
                    let old = shard.keys.remove(i);
                    self.unserve(&old);
                }
                if let Some(entry) = entry {
                    if self.serve(&entry) > 1 {
                        return Err(Unpatchable::Duplicate);
                    }
                    let place = shard.keys.binary_search_by(|key| key.id.as_str().cmp(&entry.id)).unwrap_or_else(|i| i);
                    shard.keys.insert(place, entry);
                }
            }
            if !moved {
                continue;
            }
            let json = shards::encode_shard(shard.index, shard.of, shard.keys.iter().collect())
                .map_err(|e| Unpatchable::Unreadable(e.to_string()))?;
            if json.len() > MAX_SHARD_BYTES {
                return Err(Unpatchable::ShardTooLarge(index));
            }
            if self.parts.shard_json(index) != Some(json.as_slice()) {
                json_bytes = json_bytes - held_len + json.len();
                replaced.push((index, json));
            }
        }
        if self.basis.tenants {
            let moved = namespaces_before
                .into_iter()
                .find(|(namespace, before)| (*before > 0) != (self.namespace_count(namespace) > 0));
            if let Some((namespace, _)) = moved {
                return Err(Unpatchable::Tenant(namespace));
            }
        }
        if shards::shard_count(self.keys, Some(of)) != of {
            return Err(Unpatchable::Recount(self.keys));
        }
        if json_bytes as u64 > MAX_CONFIG_JSON_BYTES {
            return Err(Unpatchable::TooLarge);
        }
        let changed: Vec<usize> = replaced.iter().map(|(index, _)| *index).collect();
        Arc::make_mut(&mut self.parts).replace_shards(replaced).map_err(|e| Unpatchable::Unreadable(e.to_string()))?;
        Ok(changed)
    }
}

/// A 64-bit hash of a key's digest (its text).
fn digest_hash(sha256: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    sha256.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
#[path = "key_patch_tests.rs"]
mod tests;
