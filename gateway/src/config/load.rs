//! Bytes → validated `Snapshot`, with what the registry lends it.

use waycast_crds::GatewayConfig;
use waycast_crds::config::ConfigError;

use waycast_crds::shards;

use super::builder::SnapshotBuilder;
use super::parts::{HeldParts, PartsError};
use crate::error::BuildError;
use crate::registry::Registry;
use crate::snapshot::Snapshot;

use super::gzip::MAX_CONFIG_BYTES;

/// Why a config was rejected.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not parseable, or invalid (the message lists every problem).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Valid, but could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The gzip data was corrupt or too large.
    #[error("config is not valid gzip or larger than {MAX_CONFIG_BYTES} bytes: {0}")]
    Gzip(String),
    /// The source had no config in it.
    #[error("{0}")]
    Missing(String),
    /// The source could not be read.
    #[error("cannot read: {0}")]
    Unreadable(String),
    /// The parts of a config in parts did not make a config.
    #[error(transparent)]
    Parts(#[from] PartsError),
}

/// Builds a snapshot from `bytes`, or `None` when they are what `previous`
/// was built from. Entries that cannot be served are left out one by one
/// (the snapshot lists them); the registry keeps what the new snapshot was
/// built with only once it is built.
///
/// # Errors
/// [`LoadError`] when the bytes are not a config, or its version or
/// settings are invalid.
pub fn load(bytes: &[u8], previous: Option<&Snapshot>, registry: &mut Registry) -> Result<Option<Snapshot>, LoadError> {
    let hash = waycast_crds::digest::config_hash(bytes);
    if previous.is_some_and(|p| p.hash == hash) {
        return Ok(None);
    }
    build(GatewayConfig::parse(bytes)?, hash, registry).map(Some)
}

/// The same for a config in parts, known by `identity` (its manifest's
/// digest, what the operator expects pods to report), built a shard at a
/// time from `held` (one shard's parsed keys held at once). When the
/// serving config was built from parts with the same base and shard
/// layout, the new one starts from its key table less the changed shards'
/// keys, and only the changed shards are read: a key change costs a pod
/// one shard's rebuild, not the whole table's.
///
/// # Errors
/// As [`load`], and [`LoadError::Parts`] when the parts do not read.
pub fn load_parts(
    held: &HeldParts,
    identity: String,
    previous: Option<&Snapshot>,
    registry: &mut Registry,
) -> Result<Option<Snapshot>, LoadError> {
    if previous.is_some_and(|p| p.hash == identity) {
        return Ok(None);
    }
    if let Some(previous) = previous
        && let Some(changed) = previous.changed_shards(&held.manifest)
        && let Some(next) = load_changed(held, identity.clone(), previous, &changed, registry, MAX_CONFIG_BYTES)?
    {
        return Ok(Some(next));
    }
    load_every_part(held, identity, registry, MAX_CONFIG_BYTES).map(Some)
}

/// Every part of `held` read and built, a shard at a time; the parts
/// together within `limit` bytes unpacked, as each is within its own
/// bound.
fn load_every_part(
    held: &HeldParts,
    identity: String,
    registry: &mut Registry,
    limit: u64,
) -> Result<Snapshot, LoadError> {
    let manifest = &held.manifest;
    let mut left = limit;
    let base_bytes = held.unpack(0, left)?;
    left -= base_bytes.len() as u64;
    let mut sizes = vec![base_bytes.len() as u64];
    let base = shards::read_base(manifest, &base_bytes).map_err(PartsError::from)?;
    drop(base_bytes);
    let mut builder = SnapshotBuilder::new(registry, base, identity)?;
    for index in (0..).take(manifest.shards.len()) {
        let bytes = held.unpack(index as usize + 1, left)?;
        left -= bytes.len() as u64;
        sizes.push(bytes.len() as u64);
        let keys = shards::read_shard(manifest, index, &bytes).map_err(PartsError::from)?;
        drop(bytes);
        if index == 0 {
            let shard_count = u32::try_from(manifest.shards.len()).unwrap_or(u32::MAX);
            builder.reserve_keys(shards::expected_keys(keys.len(), shard_count));
        }
        builder.add_shard(keys, index)?;
    }
    builder.built_from_parts(manifest.clone(), sizes);
    Ok(builder.finish())
}

/// The config of `held` built from `previous`'s key table less the keys
/// of the `changed` shards, with those shards read as they now are, the
/// parts together still within `limit` bytes unpacked; `None` when the
/// result has two keys holding one text (which one is served is then
/// decided over the whole table).
fn load_changed(
    held: &HeldParts,
    identity: String,
    previous: &Snapshot,
    changed: &[u32],
    registry: &mut Registry,
    limit: u64,
) -> Result<Option<Snapshot>, LoadError> {
    let manifest = &held.manifest;
    let mut builder = SnapshotBuilder::from_serving(registry, previous, identity, changed);
    // The parts unchanged and the changed shards read so far: within the
    // bound at each shard, so within it at the end.
    let mut sizes = previous.part_sizes().to_vec();
    for &index in changed {
        if let Some(size) = sizes.get_mut(index as usize + 1) {
            *size = 0;
        }
    }
    for &index in changed {
        let at = index as usize + 1;
        let bytes = held.unpack(at, limit.saturating_sub(sizes.iter().sum()))?;
        if let Some(size) = sizes.get_mut(at) {
            *size = bytes.len() as u64;
        }
        let keys = shards::read_shard(manifest, index, &bytes).map_err(PartsError::from)?;
        drop(bytes);
        builder.add_shard(keys, index)?;
    }
    if builder.is_contested() {
        return Ok(None);
    }
    builder.built_from_parts(manifest.clone(), sizes);
    Ok(Some(builder.finish()))
}

fn build(config: GatewayConfig, hash: String, registry: &mut Registry) -> Result<Snapshot, LoadError> {
    Ok(SnapshotBuilder::new(registry, config, hash)?.finish())
}

/// Decompresses gzip, refusing output over [`MAX_CONFIG_BYTES`].
///
/// # Errors
/// [`LoadError::Gzip`].
pub fn gunzip(compressed: &[u8]) -> Result<Vec<u8>, LoadError> {
    super::gzip::gunzip_within(compressed, MAX_CONFIG_BYTES).map_err(LoadError::Gzip)
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
