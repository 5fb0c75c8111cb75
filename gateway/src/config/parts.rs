//! A config in parts (`waycast_crds::shards`): the manifest in the config
//! Secret `C`, the base and the key shards in Secrets named after it, read
//! by name — the pod's Role grants `get` on those names and nothing else in
//! the namespace. Parts are kept (gzipped, a few MB at 100,000 keys) by
//! the digest the manifest names, so a change fetches only the parts it
//! changed; a config is built only from every part the manifest names,
//! each the one named (`load::load_parts`), so a pod never serves half of
//! a change.

use std::collections::HashMap;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use waycast_crds::shards::{self, AssembleError, Manifest};

use super::gzip::{MAX_CONFIG_BYTES, gunzip_within, gzip};
use std::sync::Arc;

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
    held: HashMap<String, (String, Arc<[u8]>)>,
}

/// The parts a manifest names, as this pod holds them: each gzipped (a
/// tenth of their size), each checked to be the one named. Cloning shares
/// them.
#[derive(Clone)]
pub struct HeldParts {
    /// What names them.
    pub manifest: Manifest,
    /// Each part's Secret name and gzipped bytes: the base's, then each
    /// shard's by index.
    parts: Vec<(String, Arc<[u8]>)>,
}

impl Parts {
    /// The parts `manifest` names, fetching through `secrets` only those
    /// this pod does not hold already; `config` is the name of the config
    /// Secret. Parts no longer named are let go.
    ///
    /// # Errors
    /// [`PartsError`]: a part missing, of another version or unreadable.
    pub async fn read(
        &mut self,
        secrets: &Api<Secret>,
        config: &str,
        manifest: &Manifest,
    ) -> Result<HeldParts, PartsError> {
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
                    self.held.insert(name, (digest, Arc::from(gzipped)));
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        let parts = named
            .into_iter()
            .map(|(name, _)| {
                let (_, gzipped) = self.held.get(&name).ok_or_else(|| PartsError::Missing(name.clone()))?;
                let gzipped = gzipped.clone();
                Ok((name, gzipped))
            })
            .collect::<Result<_, PartsError>>()?;
        Ok(HeldParts { manifest: manifest.clone(), parts })
    }
}

impl HeldParts {
    /// The parts of `split`, the config Secret called `config`, gzipped as
    /// a pod holds them (tools and tests).
    ///
    /// # Errors
    /// Compression failing.
    pub fn of_split(config: &str, split: &shards::Parts) -> std::io::Result<Self> {
        let of = u32::try_from(split.shards.len()).unwrap_or(u32::MAX);
        let mut parts = vec![(shards::base_secret_name(config), Arc::from(gzip(&split.base)?))];
        for (index, shard) in (0..of).zip(&split.shards) {
            parts.push((shards::shard_secret_name(config, index, of), Arc::from(gzip(shard)?)));
        }
        Ok(Self { manifest: split.manifest.clone(), parts })
    }

    /// Part `at` (0: the base; `i + 1`: shard `i`) unpacked, within `limit`
    /// bytes and the part's own bound: a shard is unpacked only when its
    /// turn comes (one shard's text at a time, not every one's: 11 MB at
    /// 100,000 keys).
    ///
    /// # Errors
    /// [`PartsError::Missing`] for a part not held, or
    /// [`PartsError::Unreadable`].
    pub fn unpack(&self, at: usize, limit: u64) -> Result<Vec<u8>, PartsError> {
        let (name, gzipped) = self.parts.get(at).ok_or_else(|| PartsError::Missing(format!("part {at}")))?;
        unpack(name, gzipped, part_bound(at).min(limit))
    }
}

#[cfg(test)]
impl HeldParts {
    /// Replaces part `at`'s bytes (tests of what a build reads).
    pub(crate) fn replace(&mut self, at: usize, gzipped: &[u8]) {
        if let Some(part) = self.parts.get_mut(at) {
            part.1 = Arc::from(gzipped);
        }
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
    gunzip_within(gzipped, limit).map_err(|error| PartsError::Unreadable { name: name.to_owned(), error })
}
