//! [`SnapshotBuilder`]: the one way a config change becomes a [`Snapshot`] beside
//! the serving one, for a whole build and for a change of some key shards.
//!
//! ```text
//! new           screen ─► Registry::lend_base ─► models, settings (no key yet)
//! from_serving  serving snapshot less the changed shards' keys ─► Registry::lend_changed
//! add_shard     (each shard read) screen ─► Registry::lend_keys ─► key table
//! finish        whole: Registry::finish_lending ─► counts ─► Registry::keep
//! ```
//!
//! What outlives a config (pools while the egress rules stay, limiter
//! state, the Redis connection, the counts of keys that left while they
//! count) is the registry's to decide; the builder keeps the order: the
//! registry keeps a loan only once the snapshot built on it is finished,
//! so a build that fails or is given up leaves it as it was.

use waycast_crds::config::{GatewayConfig, KeyConfig};
use waycast_crds::shards::Manifest;

use crate::error::BuildError;
use crate::registry::{Registry, Resources};
use crate::snapshot::{self, Snapshot};

/// A snapshot being built, with what the registry lent it.
pub struct SnapshotBuilder<'r> {
    registry: &'r mut Registry,
    snapshot: Snapshot,
    lent: Resources,
    /// Lent for the whole config (the counts of keys it does not name are
    /// then settled at the end), not changed from the serving loan.
    whole: bool,
    /// Key shards added by [`SnapshotBuilder::add_shard`].
    shards_read: usize,
    /// The config in parts it is built from, and its parts' unpacked sizes.
    parts: Option<(Manifest, Vec<u64>)>,
}

impl<'r> SnapshotBuilder<'r> {
    /// A whole build of `config`, known by `hash`: its entries screened
    /// (one that cannot be served left out alone), its models and settings
    /// built, and its keys, if it has any (the base of a config in parts
    /// has none), added. More keys come by [`SnapshotBuilder::add_shard`].
    ///
    /// # Errors
    /// [`BuildError`] for what fails the config as a whole.
    pub fn new(registry: &'r mut Registry, config: GatewayConfig, hash: String) -> Result<Self, BuildError> {
        let (mut config, dropped) = snapshot::screen(config)?;
        let keys = std::mem::take(&mut config.keys);
        let lent = registry.lend_base(&config)?;
        let snapshot = Snapshot::without_keys(config, hash, &lent, dropped)?;
        let mut builder = Self { registry, snapshot, lent, whole: true, shards_read: 0, parts: None };
        // Screened with the config: its keys go in as they are.
        builder.insert(keys, 0)?;
        Ok(builder)
    }

    /// A build known by `hash` that starts from `serving` (built from a
    /// config in parts of the same base and layout) less the keys of the
    /// `changed` shards, whose keys are then added as they now are: the
    /// models, namespaces and tenants shared, every other key's state the
    /// serving one's.
    pub fn from_serving(registry: &'r mut Registry, serving: &Snapshot, hash: String, changed: &[u32]) -> Self {
        let (snapshot, leaving) = serving.without_shards(hash, changed);
        let lent = registry.lend_changed(&leaving);
        Self { registry, snapshot, lent, whole: false, shards_read: 0, parts: None }
    }

    /// Makes room for `keys` keys at once (the table and the usage counts
    /// sized once, not grown by doubling beside the serving snapshot).
    pub fn reserve_keys(&mut self, keys: usize) {
        self.snapshot.reserve_keys(keys);
        self.registry.reserve_keys(&mut self.lent, keys);
    }

    /// Adds the keys of key shard `shard`: each checked under the
    /// snapshot's settings (one that may not be served left out alone),
    /// lent its state, and added to the table.
    ///
    /// # Errors
    /// A key's state not lent (a bug).
    pub fn add_shard(&mut self, keys: Vec<KeyConfig>, shard: u32) -> Result<(), BuildError> {
        let keys = self.snapshot.screen_keys(keys, shard);
        self.shards_read += 1;
        self.insert(keys, shard)
    }

    fn insert(&mut self, keys: Vec<KeyConfig>, shard: u32) -> Result<(), BuildError> {
        self.registry.lend_keys(&mut self.lent, &keys);
        self.snapshot.insert_keys(keys, shard, &self.lent)
    }

    /// Records that it is built from the config in parts `manifest` names,
    /// whose parts unpacked to `sizes` bytes (the base's, then each
    /// shard's), so that the next build may start from it.
    pub fn built_from_parts(&mut self, manifest: Manifest, sizes: Vec<u64>) {
        self.parts = Some((manifest, sizes));
    }

    /// Whether two keys of the table hold one text. A build from the
    /// serving snapshot that ends so is given up (dropped unfinished) for
    /// a whole one: which key is served is decided over the whole table.
    pub fn is_contested(&self) -> bool {
        self.snapshot.is_contested()
    }

    /// The snapshot, with the counts it was lent; the registry now keeps
    /// that loan (what the serving config held and this one does not use
    /// is let go). A whole build first keeps the counts of keys and teams
    /// that left while they count something.
    pub fn finish(mut self) -> Snapshot {
        if self.whole {
            self.registry.finish_lending(&mut self.lent);
        }
        self.snapshot.finish(&self.lent);
        if let Some((manifest, sizes)) = self.parts {
            self.snapshot.built_from(manifest, sizes, self.shards_read);
        }
        self.registry.keep(self.lent);
        self.snapshot
    }
}

#[cfg(test)]
#[path = "builder_tests.rs"]
mod tests;
