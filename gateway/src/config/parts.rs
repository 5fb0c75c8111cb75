//! A config in parts (`waycast_crds::shards`): the manifest in the config
//! Secret `C`, the base and the key shards in Secrets named after it, read
//! by name — the pod's Role grants `get` on those names and nothing else in
//! the namespace. Parts are kept (gzipped, a few MB at 100,000 keys) by
//! the digest the manifest names, so a change fetches only the parts it
//! changed; a config is assembled only from every part the manifest names,
//! each the one named, so a pod never serves half of a change.

use std::collections::HashMap;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use waycast_crds::GatewayConfig;
use waycast_crds::shards::{self, AssembleError, Manifest};

use super::load::{MAX_CONFIG_BYTES, gunzip_within};
use std::borrow::Cow;

/// Parts fetched at once: a pod that starts, or a new shard count, reads
/// every part; a few at a time keeps that to a fraction of a second
/// without a burst on the API server from every pod.
const FETCHES_AT_ONCE: usize = 8;

/// Why the parts a manifest names did not make a config (yet).
#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    /// The API server did not give the Secret.
    #[error("cannot read config part Secret {name}: {error}")]
    Fetch {
        /// The Secret's name.
        name: String,
        /// What the client said.
        error: String,
    },
    /// No such Secret, or no part in it: not written yet (the manifest
    /// went ahead of it), or removed.
    #[error("config part Secret {0} is missing or holds no part")]
    Missing(String),
    /// The Secret holds another part than the one named: written since
    /// (a newer manifest is on its way) or not yet.
    #[error("config part Secret {0} holds another version than the manifest names")]
    Stale(String),
    /// The part is not valid gzip, or too large.
    #[error("config part Secret {name}: {error}")]
    Unreadable {
        /// The Secret's name.
        name: String,
        /// Why.
        error: String,
    },
    /// Reading the parts took longer than it may.
    #[error("reading the config's parts took longer than {0:?}")]
    TimedOut(std::time::Duration),
    /// The parts are each the one named, and still not one config.
    #[error(transparent)]
    Assemble(#[from] AssembleError),
}

impl PartsError {
    /// Whether waiting may mend it: the writer is between two writes, or
    /// the API server did not answer.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Fetch { .. } | Self::Missing(_) | Self::Stale(_) | Self::TimedOut(_))
    }
}

/// The parts this pod holds, by Secret name: the digest and gzipped bytes.
#[derive(Default)]
pub struct Parts {
    held: HashMap<String, (String, Vec<u8>)>,
}

impl Parts {
    /// The config `manifest` names, fetching through `secrets` only the
    /// parts this pod does not hold already; `config` is the name of the
    /// config Secret. Parts no longer named are let go.
    ///
    /// # Errors
    /// [`PartsError`]: a part missing, of another version or unreadable;
    /// or a set that does not assemble.
    pub async fn read(
        &mut self,
        secrets: &Api<Secret>,
        config: &str,
        manifest: &Manifest,
    ) -> Result<GatewayConfig, PartsError> {
        manifest.check()?;
        let of = u32::try_from(manifest.shards.len()).map_err(|_| AssembleError::Manifest("too many shards".into()))?;
        let named: Vec<(String, &str)> = std::iter::once((shards::base_secret_name(config), manifest.base.as_str()))
            .chain(
                (0..of)
                    .zip(&manifest.shards)
                    .map(|(index, digest)| (shards::shard_secret_name(config, index, of), digest.as_str())),
            )
            .collect();
        self.held.retain(|name, _| named.iter().any(|(named, _)| named == name));
        let wanted: Vec<(String, String)> = named
            .iter()
            .filter(|(name, digest)| self.held.get(name).is_none_or(|(held, _)| held != digest))
            .map(|(name, digest)| (name.clone(), (*digest).to_owned()))
            .collect();
        let mut fetched = futures_util::stream::iter(wanted)
            .map(|(name, digest)| {
                let (secrets, config) = (secrets.clone(), config.to_owned());
                async move {
                    let part = fetch(&secrets, &config, &name, &digest).await;
                    (name, digest, part)
                }
            })
            .buffer_unordered(FETCHES_AT_ONCE);
        let mut first_error = None;
        while let Some((name, digest, part)) = fetched.next().await {
            match part {
                Ok(gzipped) => {
                    self.held.insert(name, (digest, gzipped));
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        let names: Vec<&str> = named.iter().map(|(name, _)| name.as_str()).collect();
        self.assemble(manifest, &names, MAX_CONFIG_BYTES)
    }

    /// The config from the parts held under `names` (the base's, then each
    /// shard's by index), together within `limit` bytes unpacked, as each
    /// part is within its own bound; a shard unpacked only when its turn
    /// comes (one shard's text at a time, not every one's: 11 MB at
    /// 100,000 keys).
    fn assemble(&self, manifest: &Manifest, names: &[&str], limit: u64) -> Result<GatewayConfig, PartsError> {
        let mut left = limit;
        let mut unpack_at = |at: usize| -> Result<Vec<u8>, PartsError> {
            let name = names.get(at).ok_or_else(|| PartsError::Missing(format!("part {at}")))?;
            let (_, gzipped) = self.held.get(*name).ok_or_else(|| PartsError::Missing((*name).to_owned()))?;
            let part = unpack(name, gzipped, part_bound(at).min(left))?;
            left -= part.len() as u64;
            Ok(part)
        };
        let base = unpack_at(0)?;
        let keys = names.len().saturating_sub(1);
        shards::assemble_each(manifest, &base, |index| {
            if index < keys { unpack_at(index + 1).map(|part| Some(Cow::Owned(part))) } else { Ok(None) }
        })
    }
}

/// Part Secret `name`, gzipped, when it holds the part of `digest`.
async fn fetch(secrets: &Api<Secret>, config: &str, name: &str, digest: &str) -> Result<Vec<u8>, PartsError> {
    let secret =
        secrets.get_opt(name).await.map_err(|e| PartsError::Fetch { name: name.to_owned(), error: e.to_string() })?;
    let gzipped = secret
        .and_then(|secret| secret.data?.remove(shards::SECRET_KEY_PART))
        .ok_or_else(|| PartsError::Missing(name.to_owned()))?
        .0;
    // Read to check it is the one named; kept gzipped (a tenth the size).
    let plain = unpack(name, &gzipped, part_bound(usize::from(name != shards::base_secret_name(config))))?;
    if waycast_crds::digest::sha256_hex(&plain) != digest {
        return Err(PartsError::Stale(name.to_owned()));
    }
    Ok(gzipped)
}

/// The most part `at` may unpack to: the base, what a whole config may be;
/// a key shard, what the writer keeps one within.
fn part_bound(at: usize) -> u64 {
    if at == 0 { MAX_CONFIG_BYTES } else { shards::MAX_SHARD_BYTES as u64 }
}

fn unpack(name: &str, gzipped: &[u8], limit: u64) -> Result<Vec<u8>, PartsError> {
    gunzip_within(gzipped, limit).map_err(|e| PartsError::Unreadable { name: name.to_owned(), error: e.to_string() })
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use waycast_crds::config::KeyConfig;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// A config of `keys` keys split in `shards`, held as a pod holds it.
    fn held(keys: usize, shards: u32) -> (Parts, Manifest, Vec<String>, u64) {
        let mut config = GatewayConfig::empty();
        config.keys = (0..keys).map(|i| KeyConfig::new(format!("team/key-{i}"), "a".repeat(64))).collect();
        let split = shards::split(&config, "0123456789abcdef", shards).unwrap();
        let mut parts = Parts::default();
        let mut names = vec![shards::base_secret_name("gw-config")];
        parts.held.insert(names[0].clone(), (split.manifest.base.clone(), gzip(&split.base)));
        for (index, shard) in split.shards.iter().enumerate() {
            let name = shards::shard_secret_name("gw-config", index as u32, shards);
            parts.held.insert(name.clone(), (split.manifest.shards[index].clone(), gzip(shard)));
            names.push(name);
        }
        let total = (split.base.len() + split.shards.iter().map(Vec::len).sum::<usize>()) as u64;
        (parts, split.manifest, names, total)
    }

    #[test]
    fn the_parts_together_stay_within_what_a_whole_config_may_be() {
        let (parts, manifest, names, total) = held(200, 4);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let config = parts.assemble(&manifest, &names, total).unwrap();
        assert_eq!(config.keys.len(), 200);
        // Each part alone is within its bound; all of them together are a byte over.
        let error = parts.assemble(&manifest, &names, total - 1).unwrap_err();
        assert!(matches!(error, PartsError::Unreadable { .. }), "{error}");
        assert!(error.to_string().contains("-keys-4-3"), "the part that crossed the bound is named: {error}");
        // A part the manifest names that is not held is missing, not a panic.
        let error = parts.assemble(&manifest, &names[..3], total).unwrap_err();
        assert!(matches!(error, PartsError::Assemble(AssembleError::ShardMissing(2))), "{error}");
    }
}
