//! `Snapshot`: one config, pre-indexed for the request path, built entry by
//! entry: a model or key that cannot be built is left out alone (and
//! reported), never the whole config.
//!
//! ```text
//! GatewayConfig ─screen─► kept entries + dropped ─Registry::lend─► Resources
//!   ─Snapshot::build─► Snapshot (immutable)
//!       models → routes (backends.rs: pre-parsed URIs, headers, clients)   a model failing here: dropped
//!                name|alias → candidates, one per owner namespace (names.rs)
//!       keys   → HashMap<sha256, KeyEntry> (keys.rs: allow-lists, opt-ins, visibility as bitsets)
//! ```
//!
//! Built once per config, published with one `ArcSwap::store`, read by each
//! request with one atomic load. Nothing here is mutated after build except
//! the per-route round-robin counter. What must outlive one config (pools,
//! limiter state, the Redis connection) is lent by [`crate::registry`];
//! building is pure.

mod backends;
mod keys;
pub mod names;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use waycast_crds::config::{GatewayConfig, Settings};
use waycast_crds::validate::Problems;

pub use backends::{Backend, PROXIED_PATHS, Route};
pub use keys::{DigestHasher, KeyEntry, Tenant};
use names::{Candidates, NamespaceId, Namespaces, PLATFORM};

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
    keys: HashMap<[u8; 32], KeyEntry, BuildHasherDefault<DigestHasher>>,
    routes: Vec<Route>,
    by_name: HashMap<Box<str>, Candidates>,
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
}

/// An entry of the config this pod does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// `model <source or name>` or `key <id>`.
    pub entry: String,
    /// Its path in the config and what is wrong (never a credential).
    pub reason: String,
}

impl Dropped {
    fn model(model: &waycast_crds::config::ModelConfig, reason: String) -> Self {
        Self { entry: format!("model {}", model.source.as_deref().unwrap_or(&model.name)), reason }
    }

    fn key(key: &waycast_crds::config::KeyConfig, reason: String) -> Self {
        Self { entry: format!("key {}", key.id), reason }
    }
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
    let describe = |problems: &[waycast_crds::validate::Problem]| Problems(problems.to_vec()).to_string();
    if !review.models.is_empty() {
        let models = std::mem::take(&mut config.models);
        for (index, model) in models.into_iter().enumerate() {
            match review.models.get(&index) {
                Some(problems) => dropped.push(Dropped::model(&model, describe(problems))),
                None => config.models.push(model),
            }
        }
    }
    if !review.keys.is_empty() {
        let keys = std::mem::take(&mut config.keys);
        for (index, key) in keys.into_iter().enumerate() {
            match review.keys.get(&index) {
                Some(problems) => dropped.push(Dropped::key(&key, describe(problems))),
                None => config.keys.push(key),
            }
        }
    }
    Ok((config, dropped))
}

impl Snapshot {
    /// Every budget of its keys and tenants used to `at_least` or more of
    /// it, as (`key:<namespace/name>` or `tenant:<namespace>`, period,
    /// ratio): what `waycast_gateway_budget_used_ratio` shows.
    pub fn budgets_used(&self, now: jiff::Timestamp, at_least: f64) -> Vec<(String, Period, f64)> {
        let mut used = Vec::new();
        let mut tenants_seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for entry in self.keys.values() {
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
        let key_configs = std::mem::take(&mut config.keys);
        let mut keys = HashMap::with_capacity_and_hasher(key_configs.len(), BuildHasherDefault::default());
        // What each namespace's keys may see, and its tenant, made once per namespace.
        let mut visible: HashMap<NamespaceId, Option<Arc<[u64]>>> = HashMap::new();
        let mut tenants: HashMap<NamespaceId, (Arc<Tenant>, Option<&waycast_crds::config::TenantConfig>)> =
            HashMap::new();
        for key in key_configs {
            let Some(digest) = waycast_crds::digest::parse_sha256_hex(&key.sha256) else {
                dropped.push(Dropped::key(&key, "sha256: not a hex SHA-256".to_owned()));
                continue;
            };
            let namespace = key.namespace();
            let namespace_id = namespaces.id(namespace);
            let (tenant, policy) = match tenants.get(&namespace_id) {
                Some((tenant, policy)) => (tenant.clone(), *policy),
                None => {
                    let tenant = Arc::new(Tenant::build(namespace, &config.settings, lent)?);
                    let policy = config.settings.tenant(namespace);
                    tenants.insert(namespace_id, (tenant.clone(), policy));
                    (tenant, policy)
                }
            };
            let (id, usage) = lent.key_usage(&key.id);
            let mut entry = keys::build_key(&key, id, tenant, namespace_id, &routes, |owner| namespaces.get(owner));
            entry.visible_routes =
                visible.entry(namespace_id).or_insert_with(|| keys::visible_routes(&routes, namespace)).clone();
            entry.usage = usage;
            if key.limits.is_some() || !key.budgets.is_empty() {
                let mut rare = entry.rare.take().map_or_else(keys::Rare::default, |rare| *rare);
                if key.limits.is_some() {
                    rare.limits = Some(lent.key_limits(&key.id).ok_or(BuildError::NotLent("key limits"))?);
                }
                if !key.budgets.is_empty() {
                    let scope = format!("key:{}", key.id);
                    rare.budgets =
                        crate::limit::Budget::merged(&key.budgets, |period| lent.budget_state(&scope, period));
                }
                entry.rare = rare.boxed();
            }
            // Screening left out keys whose class cannot be served.
            let sharing = &config.settings.sharing;
            let class = waycast_crds::sharing::key_class(sharing, policy, key.class.as_deref())
                .ok()
                .and_then(|class| sharing.class_index(class));
            entry.class = u8::try_from(class.unwrap_or(0)).unwrap_or(0);
            keys.insert(digest, entry);
        }
        drop(tenants);
        let redis = match config.settings.redis {
            Some(_) => Some(lent.redis().ok_or(BuildError::NotLent("a Redis counter"))?),
            None => None,
        };
        for drop in &dropped {
            tracing::warn!(entry = %drop.entry, reason = %drop.reason, "config entry left out; the rest is served");
        }
        // Validation checked the name: UTC stands in only for a bug.
        let zone =
            waycast_crds::period::time_zone(&config.settings.budgets.time_zone).unwrap_or(jiff::tz::TimeZone::UTC);
        let counts = lent.counts();
        // Validation refused a config whose telemetry has problems.
        let telemetry =
            config.settings.telemetry.as_ref().and_then(|t| crate::telemetry::Destination::of(t).ok()).map(Arc::new);
        let settings = config.settings;
        Ok(Self { hash, settings, keys, routes, by_name, redis, dropped, zone, counts, telemetry })
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
        let candidates = self.by_name.get(model)?;
        let mut best: Option<(u8, usize)> = None;
        for &index in candidates.as_slice() {
            let route = &self.routes[index];
            let Some(rank) = names::rank(route.owner, key.namespace, key.opted_in(index)) else { continue };
            if key.sees(index) && best.is_none_or(|(best_rank, _)| rank < best_rank) {
                best = Some((rank, index));
            }
        }
        best.map(|(_, index)| index)
    }

    /// Route by index.
    pub fn route(&self, index: usize) -> &Route {
        &self.routes[index]
    }

    /// Every route, in config order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Number of keys.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests;
