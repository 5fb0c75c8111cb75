//! Accepted keys, pre-resolved against the routes: which the key may use
//! (its `models`), which it opted in to (`namespace/pattern` entries naming
//! another team's models) and which its namespace may see
//! (`keyNamespaces`), as bitsets over route indices.

use std::hash::Hasher;
use std::sync::Arc;

use waycast_crds::config::{KeyConfig, glob_matches};

use super::backends::Route;
use super::names::{NamespaceId, PLATFORM};
use crate::limit::LimitSet;

/// An accepted key. What few keys have (an allow-list, opt-ins, an expiry,
/// limits, budgets) is boxed apart ([`Rare`]): every key has a slot in the
/// key table, and at 100,000 keys each byte of it is 0.1 MB held twice
/// while a config is swapped.
#[derive(Debug, Clone)]
pub struct KeyEntry {
    /// `namespace/name` (or the id a standalone config gives).
    pub id: Arc<str>,
    /// The key's namespace: its own models come first.
    pub namespace: NamespaceId,
    /// Refused with 401.
    pub disabled: bool,
    /// Its priority class, an index into `settings.sharing.classes`.
    pub class: u8,
    /// Bit `i` set: route `i` is shared with the key's namespace
    /// (`keyNamespaces`). `None`: every route. Shared by the keys of a namespace.
    pub(super) visible_routes: Option<Arc<[u64]>>,
    /// Its namespace's policy: weight and caps (shared by the namespace's keys).
    pub tenant: Arc<Tenant>,
    /// A number for the key that stays across configs (its fair-queue line).
    pub fair_id: u64,
    /// What it used this month.
    pub usage: Arc<crate::limit::key_usage::KeyUsage>,
    /// What few keys have; `None`: none of it.
    pub(super) rare: Option<Box<Rare>>,
    /// The key shard of the config it came in (0 for a whole config).
    pub(super) shard: u32,
}

/// What few keys have.
#[derive(Debug, Default, Clone)]
pub(super) struct Rare {
    /// Bit `i` set: route `i` allowed. `None`: every route it can reach.
    pub(super) allowed_routes: Option<Box<[u64]>>,
    /// Bit `i` set: route `i`, another team's, was opted in to.
    pub(super) opted_in: Option<Box<[u64]>>,
    /// When it stops working.
    pub(super) expires_at: Option<jiff::Timestamp>,
    /// Its rate limits, if any.
    pub(super) limits: Option<Arc<LimitSet>>,
    /// Its budgets (one per period).
    pub(super) budgets: Box<[crate::limit::Budget]>,
    /// What names its limiters' and budgets' state when it is not its id:
    /// a grant's (`grant:<id>`), never the same as a key's of that name.
    pub(super) state_id: Option<Arc<str>>,
}

impl Rare {
    /// `None` when it holds nothing: the key needs no box.
    pub(super) fn boxed(self) -> Option<Box<Self>> {
        let nothing = self.allowed_routes.is_none()
            && self.opted_in.is_none()
            && self.expires_at.is_none()
            && self.limits.is_none()
            && self.budgets.is_empty()
            && self.state_id.is_none();
        (!nothing).then(|| Box::new(self))
    }
}

/// A namespace's policy on the Gateway, shared by its keys.
#[derive(Debug)]
pub struct Tenant {
    /// The namespace.
    pub namespace: Arc<str>,
    /// Its share of a saturated model against other tenants.
    pub weight: u32,
    /// Caps for all its keys together, if any.
    pub limits: Option<Arc<LimitSet>>,
    /// A number for the namespace that stays across configs (its place in
    /// a fair queue).
    pub fair_id: u64,
    /// Budgets for all its keys together (one per period).
    pub budgets: Box<[crate::limit::Budget]>,
}

impl Tenant {
    /// The tenant `namespace` under `settings` (weight 1 and no caps when
    /// no policy names it), with its limiter state from `lent`.
    ///
    /// # Errors
    /// Its limits were not lent (a bug).
    pub fn build(
        namespace: &str,
        settings: &waycast_crds::config::Settings,
        lent: &crate::registry::Resources,
    ) -> Result<Self, crate::error::BuildError> {
        let policy = settings.tenant(namespace);
        let limits = match policy.and_then(|p| p.limits) {
            Some(_) => {
                Some(lent.tenant_limits(namespace).ok_or(crate::error::BuildError::NotLent("a tenant's limits"))?)
            }
            None => None,
        };
        let scope = format!("tenant:{namespace}");
        let budgets = policy.map_or_else(Box::default, |p| {
            crate::limit::Budget::merged(&p.budgets, |period| lent.budget_state(&scope, period))
        });
        Ok(Self {
            namespace: Arc::from(namespace),
            weight: policy.map_or(1, |p| p.weight.max(1)),
            limits,
            fair_id: stable_id(namespace),
            budgets,
        })
    }
}

/// A 64-bit keyed hash of `text` (SipHash with keys drawn once per
/// process): the same in every config of this process, and not a value a
/// team can aim at by choosing a name, so it cannot share another team's
/// place in a fair queue.
pub fn stable_id(text: &str) -> u64 {
    use std::hash::BuildHasher as _;
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    KEYS.get_or_init(std::collections::hash_map::RandomState::new).hash_one(text)
}

impl KeyEntry {
    /// Whether the key's own allow-list (`models`) lets it use route `index`.
    pub fn allows(&self, index: usize) -> bool {
        self.rare.as_ref().and_then(|rare| rare.allowed_routes.as_deref()).is_none_or(|bits| bit_set(bits, index))
    }

    /// Whether route `index` is shared with the key's namespace at all. A
    /// route it cannot see is, to the key, a model that does not exist.
    pub fn sees(&self, index: usize) -> bool {
        self.visible_routes.as_deref().is_none_or(|bits| bit_set(bits, index))
    }

    /// Whether the key opted in to route `index` (another team's model).
    pub fn opted_in(&self, index: usize) -> bool {
        self.rare.as_ref().and_then(|rare| rare.opted_in.as_deref()).is_some_and(|bits| bit_set(bits, index))
    }

    /// When it stops working.
    pub fn expires_at(&self) -> Option<jiff::Timestamp> {
        self.rare.as_ref().and_then(|rare| rare.expires_at)
    }

    /// Its rate limits, if any.
    pub fn limits(&self) -> Option<&Arc<LimitSet>> {
        self.rare.as_ref().and_then(|rare| rare.limits.as_ref())
    }

    /// Its budgets (one per period).
    pub fn budgets(&self) -> &[crate::limit::Budget] {
        self.rare.as_ref().map_or(&[], |rare| &rare.budgets)
    }

    /// Whether it is a grant's: what a token's holder is served as.
    pub fn is_grant(&self) -> bool {
        self.rare.as_ref().is_some_and(|rare| rare.state_id.is_some())
    }

    /// What names its limiters' and budgets' state (Redis keys included):
    /// its id, or a grant's `grant:<id>`.
    pub fn state_id(&self) -> &str {
        self.rare.as_ref().and_then(|rare| rare.state_id.as_deref()).unwrap_or(&self.id)
    }
}

fn bit_set(bits: &[u64], index: usize) -> bool {
    bits.get(index / 64).is_some_and(|word| word & (1 << (index % 64)) != 0)
}

fn bits_where(routes: &[Route], mut wanted: impl FnMut(&Route) -> bool) -> Box<[u64]> {
    let mut bits = vec![0_u64; routes.len().div_ceil(64)];
    for (index, route) in routes.iter().enumerate() {
        if wanted(route) {
            bits[index / 64] |= 1 << (index % 64);
        }
    }
    bits.into()
}

/// The routes `namespace`'s keys may see; `None` when every route is open
/// to every key (no model restricts by namespace).
pub(super) fn visible_routes(routes: &[Route], namespace: &str) -> Option<Arc<[u64]>> {
    if routes.iter().all(|route| route.key_namespaces.is_none()) {
        return None;
    }
    let visible = bits_where(routes, |route| {
        route.key_namespaces.as_ref().is_none_or(|allowed| allowed.iter().any(|n| n == namespace))
    });
    Some(visible.into())
}

/// A key entry for `key` (of namespace `namespace`, its id shared as `id`) over `routes`;
/// `namespace_of` numbers the namespaces its opt-ins name.
///
/// A `models` entry is a pattern over the names of the models of the key's
/// own namespace and the platform's; one of the form `namespace/pattern`,
/// where a namespace of that name owns models, also opts the key in to
/// that namespace's models whose name or an alias matches `pattern`, and
/// allows them.
pub(super) fn build_key(
    key: &KeyConfig,
    id: Arc<str>,
    tenant: Arc<Tenant>,
    namespace: NamespaceId,
    routes: &[Route],
    namespace_of: impl Fn(&str) -> Option<NamespaceId>,
) -> KeyEntry {
    let mut allowed_routes = None;
    let mut opted_in = None;
    if let Some(patterns) = &key.models {
        let opt_ins: Vec<(NamespaceId, &str)> = patterns
            .iter()
            .filter_map(|p| p.split_once('/'))
            .filter_map(|(owner, pattern)| Some((namespace_of(owner)?, pattern)))
            .filter(|(owner, _)| *owner != namespace && *owner != PLATFORM)
            .collect();
        // NB: a pattern with a `/` is also a pattern over the home models'
        // names: model names may hold a `/` (`meta-llama/Llama-3.1-8B`).
        let home: Vec<&str> = patterns.iter().map(String::as_str).collect();
        let names_match = |route: &Route, pattern: &str| route.names.iter().any(|name| glob_matches(pattern, name));
        let opted = bits_where(routes, |route| {
            opt_ins.iter().any(|(owner, pattern)| route.owner == *owner && names_match(route, pattern))
        });
        let allowed = bits_where(routes, |route| {
            let home_route = route.owner == namespace || route.owner == PLATFORM;
            home_route && home.iter().any(|pattern| names_match(route, pattern))
        });
        let allowed: Box<[u64]> = allowed.iter().zip(opted.iter()).map(|(a, o)| a | o).collect();
        if !opt_ins.is_empty() {
            opted_in = Some(opted);
        }
        allowed_routes = Some(allowed);
    }
    KeyEntry {
        id,
        namespace,
        disabled: key.disabled,
        class: 0,
        visible_routes: None,
        tenant,
        fair_id: stable_id(&key.id),
        usage: Arc::default(),
        rare: Rare { allowed_routes, opted_in, expires_at: key.expires_at, ..Rare::default() }.boxed(),
        shard: 0,
    }
}

/// Hashes SHA-256 digests by their first 8 bytes: they are already uniformly
/// distributed, so running SipHash over them again buys nothing.
#[derive(Default)]
pub struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(1) {
            let mut word = [0_u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }

    fn write_usize(&mut self, _length: usize) {}
}
