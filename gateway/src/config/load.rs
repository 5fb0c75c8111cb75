//! Bytes → validated `Snapshot`, with what the registry lends it.

use std::io::Read as _;

use waycast_crds::GatewayConfig;
use waycast_crds::config::ConfigError;

use crate::error::BuildError;
use crate::registry::Registry;
use crate::snapshot::{self, Snapshot};

/// Largest config accepted after decompression: a bound against gzip bombs,
/// the same the operator writes within.
pub const MAX_CONFIG_BYTES: u64 = waycast_crds::config::MAX_CONFIG_JSON_BYTES;

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

/// The same for a config assembled from its parts, known by `identity`
/// (its manifest's digest, what the operator expects pods to report).
///
/// # Errors
/// As [`load`].
pub fn load_assembled(
    config: GatewayConfig,
    identity: String,
    previous: Option<&Snapshot>,
    registry: &mut Registry,
) -> Result<Option<Snapshot>, LoadError> {
    if previous.is_some_and(|p| p.hash == identity) {
        return Ok(None);
    }
    build(config, identity, registry).map(Some)
}

fn build(config: GatewayConfig, hash: String, registry: &mut Registry) -> Result<Snapshot, LoadError> {
    let (config, dropped) = snapshot::screen(config)?;
    let lent = registry.lend(&config)?;
    let snapshot = Snapshot::build(config, hash, &lent, dropped)?;
    registry.keep(lent);
    Ok(snapshot)
}

/// Decompresses gzip, refusing output over [`MAX_CONFIG_BYTES`].
///
/// # Errors
/// [`LoadError::Gzip`].
pub fn gunzip(compressed: &[u8]) -> Result<Vec<u8>, LoadError> {
    gunzip_within(compressed, MAX_CONFIG_BYTES)
}

/// Decompresses gzip, refusing output over `limit` bytes.
///
/// # Errors
/// [`LoadError::Gzip`].
pub fn gunzip_within(compressed: &[u8], limit: u64) -> Result<Vec<u8>, LoadError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(compressed)
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| LoadError::Gzip(e.to_string()))?;
    if out.len() as u64 > limit {
        return Err(LoadError::Gzip(format!("larger than {limit} bytes unpacked")));
    }
    Ok(out)
}
