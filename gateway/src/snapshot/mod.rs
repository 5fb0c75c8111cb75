//! `Snapshot`: one config, pre-indexed for the request path, built entry by
//! entry: a model or key that cannot be built is left out alone (and
//! reported), never the whole config.
//!
//! ```text
//! GatewayConfig ─screen─► kept entries + dropped ─Registry::lend_base─► Resources
//!   ─► Snapshot (no key yet) ─► each key shard: Registry::lend_keys ─► key table
//!   ─► Snapshot (immutable)                       (config/builder.rs: SnapshotBuilder drives it)
//!       models → routes (backends.rs: pre-parsed URIs, headers, clients)   a model failing here: dropped
//!                name|alias → candidates, one per owner namespace (names.rs)
//!       keys   → HashMap<sha256, KeyEntry> (keys.rs: allow-lists, opt-ins, visibility as bitsets)
//! ```
//!
//! Built once per config, published with one `ArcSwap::store`, read by each
//! request with one atomic load. Nothing here is mutated after build except
//! the per-route round-robin counter. What must outlive one config (pools,
//! limiter state, the Redis connection) is lent by [`crate::registry`];
//! building is pure. `config::builder::SnapshotBuilder` is the one place
//! that drives the two for a config change, whole or some key shards;
//! [`Snapshot::standalone`] (tests, tools) builds one with a registry of its own.

mod backends;
mod dropped;
pub mod identity;
mod key_table;
mod keys;
pub mod names;

use std::collections::HashMap;
use std::sync::Arc;

use waycast_crds::config::{GatewayConfig, Settings};
use waycast_crds::validate::Problems;

pub use backends::{Backend, Route};
pub use dropped::Dropped;
use key_table::{Against, KeyTable};
pub use keys::KeyEntry;
use names::{Candidates, Namespaces, PLATFORM};
use waycast_crds::config::KeyConfig;
use waycast_crds::shards::Manifest;

use crate::error::BuildError;
use crate::limit::redis::RedisCounter;
use crate::registry::{Registry, Resources};
use waycast_crds::period::Period;

/// A built config.
pub struct Snapshot {
    /// SHA-256 (hex) of the config bytes this was built from.
    pub hash: String,
    /// Fleet-wide settings.
    pub settings: Settings,
    keys: KeyTable,
    /// The routes, shared with the next snapshot while the models stay
    /// (a config in parts whose base did not change).
    models: Arc<Models>,
    /// The config in parts this was built from.
    built_from: Option<BuiltFrom>,
    /// Counts the rate limits for the whole fleet, when the config says Redis.
    pub redis: Option<Arc<RedisCounter>>,
    /// The entries of the config left out, and why.
    pub dropped: Vec<Dropped>,
    /// The time zone budget periods start in.
    pub zone: jiff::tz::TimeZone,
    /// The budget and usage counts it was built on.
    pub counts: crate::registry::Counts,
    /// Where traces and usage records go (`settings.telemetry`).
    pub telemetry: Option<Arc<crate::telemetry::Destination>>,
    /// The token issuers trusted and the grants served.
    pub identity: Arc<identity::Identity>,
}

/// The config in parts a snapshot was built from.
struct BuiltFrom {
    manifest: Manifest,
    /// The key shards read to build it: every one, or those a change
    /// changed.
    shards_read: usize,
    /// Each part's size unpacked: the base's, then each shard's.
    sizes: Vec<u64>,
}

/// The models' routes and what names them.
struct Models {
    routes: Vec<Route>,
    by_name: HashMap<Box<str>, Candidates>,
}

/// Splits `config` into what may be served and what is left out: an entry
/// with a problem of its own is dropped, with its problems as the reason.
///
/// # Errors
/// [`BuildError::Invalid`] for problems with the config as a whole (its
/// version, its settings): nothing of it is served.
pub fn screen(mut config: GatewayConfig) -> Result<(GatewayConfig, Vec<Dropped>), BuildError> {
    let review = config.review();
    if !review.config.is_empty() {
        return Err(BuildError::Invalid(Problems(review.config)));
    }
    let mut dropped = Vec::new();
    keep_reviewed(&mut config.models, &review.models, &mut dropped, Dropped::model);
    keep_reviewed(&mut config.keys, &review.keys, &mut dropped, |key, why| Dropped::key(key, why, 0));
    keep_reviewed(&mut config.providers, &review.providers, &mut dropped, Dropped::provider);
    keep_reviewed(&mut config.grants, &review.grants, &mut dropped, Dropped::grant);
    Ok((config, dropped))
}

/// Keeps the entries of `entries` the review left in; each left out goes
/// to `dropped` with its problems as the reason.
fn keep_reviewed<T>(
    entries: &mut Vec<T>,
    left_out: &std::collections::BTreeMap<usize, Vec<waycast_crds::validate::Problem>>,
    dropped: &mut Vec<Dropped>,
    drop_of: impl Fn(&T, String) -> Dropped,
) {
    if left_out.is_empty() {
        return;
    }
    let all = std::mem::take(entries);
    for (index, entry) in all.into_iter().enumerate() {
        match left_out.get(&index) {
            Some(problems) => dropped.push(drop_of(&entry, Problems(problems.clone()).to_string())),
            None => entries.push(entry),
        }
    }
}

impl Snapshot {
    /// Every budget of its keys and tenants used to `at_least` or more of
    /// it, as (`key:<namespace/name>` or `tenant:<namespace>`, period,
    /// ratio): what `waycast_gateway_budget_used_ratio` shows.
    pub fn budgets_used(&self, now: jiff::Timestamp, at_least: f64) -> Vec<(String, Period, f64)> {
        let mut used = Vec::new();
        let mut tenants_seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for entry in self.keys.entries() {
            for budget in entry.budgets() {
                let ratio = budget.used_ratio(now, &self.zone);
                if ratio >= at_least {
                    used.push((format!("key:{}", entry.id), budget.period, ratio));
                }
            }
            let tenant = &entry.tenant;
            if !tenant.budgets.is_empty() && tenants_seen.insert(&tenant.namespace) {
                for budget in &tenant.budgets {
                    let ratio = budget.used_ratio(now, &self.zone);
                    if ratio >= at_least {
                        used.push((format!("tenant:{}", tenant.namespace), budget.period, ratio));
                    }
                }
            }
        }
        used
    }

    /// Builds a snapshot from a screened config and the resources the
    /// registry lent for it; `dropped` are the entries screening left out.
    /// A model whose route cannot be built (a backend's TLS fails to set
    /// up, say) and a key whose hash does not parse are left out too. Each
    /// key's config is dropped once its entry is built (its text; the list
    /// that held them goes at the end).
    ///
    /// # Errors
    /// [`BuildError`] for what fails the config as a whole.
    pub fn build(
        mut config: GatewayConfig,
        hash: String,
        lent: &Resources,
        dropped: Vec<Dropped>,
    ) -> Result<Self, BuildError> {
        let keys = std::mem::take(&mut config.keys);
        let mut snapshot = Self::without_keys(config, hash, lent, dropped)?;
        snapshot.insert_keys(keys, 0, lent)?;
        snapshot.finish(lent);
        Ok(snapshot)
    }

    /// A snapshot of a screened config's models and settings, with no key
    /// yet: its keys are added by [`Snapshot::insert_keys`], a batch at a
    /// time, then [`Snapshot::finish`] is called. `dropped` are the
    /// entries screening left out.
    ///
    /// # Errors
    /// [`BuildError`] for what fails the config as a whole.
    pub(crate) fn without_keys(
        config: GatewayConfig,
        hash: String,
        lent: &Resources,
        mut dropped: Vec<Dropped>,
    ) -> Result<Self, BuildError> {
        let mut namespaces = Namespaces::default();
        let mut routes = Vec::with_capacity(config.models.len());
        let mut by_name: HashMap<Box<str>, Candidates> = HashMap::new();
        let classes: Arc<[String]> = Arc::from(config.settings.sharing.classes.clone());
        for model in &config.models {
            let owner = model.owner_namespace().map_or(PLATFORM, |namespace| namespaces.id(namespace));
            let mut route = match backends::build_route(model, owner, lent) {
                Ok(route) => route,
                Err(reason) => {
                    dropped.push(Dropped::model(model, reason));
                    continue;
                }
            };
            if model.limits.is_some() {
                route.limits = Some(lent.model_limits(&route.state_id).ok_or(BuildError::NotLent("model limits"))?);
            }
            if let Some(capacity) = model.capacity {
                let gate = lent.gate(&route.state_id).ok_or(BuildError::NotLent("a model's queue"))?;
                let endpoints = route.backends.iter().map(|backend| backend.endpoints.clone());
                let sharing = &config.settings.sharing;
                route.gate = Some(crate::sharing::Gated::new(gate, capacity, endpoints, sharing, classes.clone()));
            }
            let index = routes.len();
            for name in &route.names {
                match by_name.get_mut(name.as_str()) {
                    Some(candidates) => candidates.add(index),
                    None => {
                        by_name.insert(name.clone().into_boxed_str(), Candidates::One(index));
                    }
                }
            }
            routes.push(route);
        }
        let redis = match config.settings.redis {
            Some(_) => Some(lent.redis().ok_or(BuildError::NotLent("a Redis counter"))?),
            None => None,
        };
        let mut keys = KeyTable::new(namespaces);
        let providers = identity::providers(&config.providers, &mut dropped);
        let against = Against { settings: &config.settings, routes: &routes, lent };
        let mut failed = None;
        let entry_of = |grant: &waycast_crds::config::GrantConfig| match keys.grant_entry(grant, &against) {
            Ok(entry) => Some((entry, lent.members(&grant.id))),
            Err(error) => {
                failed.get_or_insert(error);
                None
            }
        };
        let identity = identity::Identity::new(providers, &config.grants, entry_of, &mut dropped);
        if let Some(error) = failed {
            return Err(error);
        }
        for drop in &dropped {
            drop.log();
        }
        // Validation checked the name: UTC stands in only for a bug.
        let zone =
            waycast_crds::period::time_zone(&config.settings.budgets.time_zone).unwrap_or(jiff::tz::TimeZone::UTC);
        // Validation refused a config whose telemetry has problems.
        let telemetry =
            config.settings.telemetry.as_ref().and_then(|t| crate::telemetry::Destination::of(t).ok()).map(Arc::new);
        Ok(Self {
            hash,
            settings: config.settings,
            keys,
            models: Arc::new(Models { routes, by_name }),
            built_from: None,
            redis,
            dropped,
            zone,
            counts: crate::registry::Counts::default(),
            telemetry,
            identity: Arc::new(identity),
        })
    }

    /// Finishes a snapshot built a batch of keys at a time: takes the
    /// counts `lent` holds, every key's lent.
    pub(crate) fn finish(&mut self, lent: &Resources) {
        self.counts = lent.counts();
    }

    /// The keys of `keys` that may be served, checked one by one under
    /// this snapshot's settings as a whole config's are; the rest are left
    /// out (listed in `dropped`, as from key shard `shard`).
    pub(crate) fn screen_keys(&mut self, keys: Vec<KeyConfig>, shard: u32) -> Vec<KeyConfig> {
        key_table::screen(&self.settings, keys, shard, &mut self.dropped)
    }

    /// Adds screened `keys` (of key shard `shard`) to the table, with the
    /// state `lent` holds for them. A key whose text another key holds is
    /// served only if its id is the lower of the two.
    ///
    /// # Errors
    /// A key's state not lent (a bug).
    pub(crate) fn insert_keys(&mut self, keys: Vec<KeyConfig>, shard: u32, lent: &Resources) -> Result<(), BuildError> {
        let against = Against { settings: &self.settings, routes: &self.models.routes, lent };
        self.keys.insert(keys, shard, &against, &mut self.dropped)
    }

    /// Makes room in the key table for `keys` keys at once.
    pub(crate) fn reserve_keys(&mut self, keys: usize) {
        self.keys.reserve(keys);
    }

    /// Whether two keys of the table hold one text (one served, the other
    /// left out).
    pub fn is_contested(&self) -> bool {
        self.keys.is_contested()
    }

    /// Marks this snapshot as built from the config in parts `manifest`
    /// names, whose parts unpacked to `sizes` bytes (the base's, then each
    /// shard's), reading `shards_read` of its key shards, so that the next
    /// one may start from it.
    pub(crate) fn built_from(&mut self, manifest: Manifest, sizes: Vec<u64>, shards_read: usize) {
        self.built_from = Some(BuiltFrom { manifest, sizes, shards_read });
    }

    /// How many key shards were read to build it (for the log), when it
    /// was built from a config in parts.
    pub fn key_shards_read(&self) -> Option<usize> {
        self.built_from.as_ref().map(|built| built.shards_read)
    }

    /// The unpacked size of each part of the config in parts this was
    /// built from (the base's, then each shard's); empty for a whole config.
    pub fn part_sizes(&self) -> &[u64] {
        self.built_from.as_ref().map_or(&[], |built| &built.sizes)
    }

    /// The key shards `next` changes from the config in parts this was
    /// built from: `None` when the next config cannot start from this
    /// one's table (another base, salt or shard count; not built from
    /// parts; two keys holding one text).
    pub fn changed_shards(&self, next: &Manifest) -> Option<Vec<u32>> {
        let built = &self.built_from.as_ref()?.manifest;
        let same_layout = built.base == next.base && built.salt == next.salt && built.shards.len() == next.shards.len();
        if !same_layout || self.keys.is_contested() {
            return None;
        }
        let changed = (0..)
            .zip(built.shards.iter().zip(&next.shards))
            .filter(|(_, (was, now))| was != now)
            .map(|(index, _)| index)
            .collect();
        Some(changed)
    }

    /// A snapshot known by `hash` with this one's models, settings and
    /// keys but the keys of `shards` (and what was left out of them), and
    /// the ids of those keys: the start of the next config when it changes
    /// only those shards, whose keys are then added as they now are.
    pub(crate) fn without_shards(&self, hash: String, shards: &[u32]) -> (Self, Vec<Arc<str>>) {
        let (keys, leaving) = self.keys.without_shards(shards);
        let dropped = self
            .dropped
            .iter()
            .filter(|drop| drop.shard.is_none_or(|shard| !shards.contains(&shard)))
            .cloned()
            .collect();
        let next = Self {
            hash,
            settings: self.settings.clone(),
            keys,
            models: self.models.clone(),
            built_from: None,
            redis: self.redis.clone(),
            dropped,
            zone: self.zone.clone(),
            counts: crate::registry::Counts::default(),
            telemetry: self.telemetry.clone(),
            identity: self.identity.clone(),
        };
        (next, leaving)
    }

    /// Every key's entry as text, in digest order (tests).
    #[cfg(test)]
    pub(crate) fn described_keys(&self) -> Vec<String> {
        self.keys.described()
    }

    /// A snapshot of `config` with resources of its own (tests, tools).
    ///
    /// # Errors
    /// As [`screen`], [`Snapshot::build`] and [`Registry::lend`].
    pub fn standalone(config: &GatewayConfig, hash: String) -> Result<Self, BuildError> {
        let (config, dropped) = screen(config.clone())?;
        let lent = Registry::default().lend(&config)?;
        Self::build(config, hash, &lent, dropped)
    }

    /// The key with this SHA-256 digest.
    pub fn key(&self, digest: &[u8; 32]) -> Option<&KeyEntry> {
        self.keys.get(digest)
    }

    /// The route `key` means by `model`: of the routes with that name or
    /// alias that its namespace may see, its own namespace's, else the
    /// platform's, else one it opted in to. `None`: no such model, to it.
    pub fn resolve(&self, key: &KeyEntry, model: &str) -> Option<usize> {
        let candidates = self.models.by_name.get(model)?;
        let mut best: Option<(u8, usize)> = None;
        for &index in candidates.as_slice() {
            let route = &self.models.routes[index];
            let Some(rank) = names::rank(route.owner, key.namespace, key.opted_in(index)) else { continue };
            if key.sees(index) && best.is_none_or(|(best_rank, _)| rank < best_rank) {
                best = Some((rank, index));
            }
        }
        best.map(|(_, index)| index)
    }

    /// Route by index.
    pub fn route(&self, index: usize) -> &Route {
        &self.models.routes[index]
    }

    /// Every route, in config order.
    pub fn routes(&self) -> &[Route] {
        &self.models.routes
    }

    /// Number of keys.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests;
