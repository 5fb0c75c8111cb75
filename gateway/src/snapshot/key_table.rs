//! The key table, built a batch of keys at a time: a whole config is one
//! batch; a config in parts is read a shard at a time (one shard's parsed
//! keys held at once, not every one's), and a change of some shards
//! starts from the serving table less those shards' keys, then adds the
//! shards as they now are — namespaces and tenants shared, a key's entry
//! copied, not built again.
//!
//! ```text
//! whole:   KeyTable::new ─► insert(batch, shard 0)
//! parts:   KeyTable::new ─► for each shard: screen ─► lend ─► insert(keys, shard i)
//! change:  serving.without_shards(changed) ─► for each changed shard: the same
//! ```

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use waycast_crds::config::{GrantConfig, KeyConfig, Settings};

use super::backends::Route;
use super::dropped::Dropped;
use super::keys::{self, DigestHasher, KeyEntry, Tenant};
use super::names::{NamespaceId, Namespaces};
use crate::error::BuildError;
use crate::registry::Resources;

/// The accepted keys by the SHA-256 of their text, and what the keys of
/// each namespace share.
#[derive(Clone)]
pub(super) struct KeyTable {
    keys: HashMap<[u8; 32], KeyEntry, BuildHasherDefault<DigestHasher>>,
    /// Every namespace named so far, models' owners first.
    namespaces: Namespaces,
    /// What the keys of each namespace share.
    shared: HashMap<NamespaceId, KeyNamespace>,
    /// Whether two keys hold one key text (one served, the other left
    /// out): such a table is built again whole on every change.
    contested: bool,
}

/// What the keys of one namespace share, made once per namespace.
#[derive(Clone)]
struct KeyNamespace {
    tenant: Arc<Tenant>,
    /// The routes its keys may see (`None`: every route).
    visible: Option<Arc<[u64]>>,
    /// Whether the settings hold a tenant policy for it.
    has_policy: bool,
}

/// What a key is built against: the config's settings and routes, and the
/// state lent for its keys.
pub(super) struct Against<'a> {
    pub(super) settings: &'a Settings,
    pub(super) routes: &'a [Route],
    pub(super) lent: &'a Resources,
}

impl KeyTable {
    /// An empty table; `namespaces` numbers the models' owners.
    pub(super) fn new(namespaces: Namespaces) -> Self {
        Self { keys: HashMap::default(), namespaces, shared: HashMap::new(), contested: false }
    }

    pub(super) fn get(&self, digest: &[u8; 32]) -> Option<&KeyEntry> {
        self.keys.get(digest)
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = &KeyEntry> {
        self.keys.values()
    }

    pub(super) fn is_contested(&self) -> bool {
        self.contested
    }

    pub(super) fn reserve(&mut self, keys: usize) {
        self.keys.reserve(keys.saturating_sub(self.keys.len()));
    }

    /// Adds screened `keys` (of key shard `shard`) to the table. Each key's
    /// config is dropped once its entry is built. A key whose text another
    /// key of the table holds is served only if its id is the lower of the
    /// two (the order a whole config is checked in); the other is left out,
    /// listed in `dropped`.
    ///
    /// # Errors
    /// A key's state not lent (a bug).
    pub(super) fn insert(
        &mut self,
        keys: Vec<KeyConfig>,
        shard: u32,
        against: &Against<'_>,
        dropped: &mut Vec<Dropped>,
    ) -> Result<(), BuildError> {
        let mut leave_out = |drop: Dropped| {
            drop.log();
            dropped.push(drop);
        };
        self.keys.reserve(keys.len());
        for key in keys {
            let Some(digest) = waycast_crds::digest::parse_sha256_hex(&key.sha256) else {
                leave_out(Dropped::key(&key, "sha256: not a hex SHA-256".to_owned(), shard));
                continue;
            };
            let mut entry = self.entry(&key, against)?;
            entry.shard = shard;
            if let Some(held) = self.keys.get(&digest) {
                self.contested = true;
                let reason = "sha256: the same key as another key of this config".to_owned();
                if *held.id < *key.id {
                    leave_out(Dropped::key(&key, reason, shard));
                    continue;
                }
                leave_out(Dropped { entry: format!("key {}", held.id), reason, shard: Some(held.shard) });
            }
            self.keys.insert(digest, entry);
        }
        Ok(())
    }

    /// `key`'s entry, with its namespace's shared parts.
    fn entry(&mut self, key: &KeyConfig, against: &Against<'_>) -> Result<KeyEntry, BuildError> {
        let scope = format!("key:{}", key.id);
        self.entry_as(key, against, &key.id, &scope)
    }

    /// The entry a grant's members are served as: built as a key's (its
    /// models, class, tenant), its limits and budgets the grant's own
    /// state (`grant:<id>`, never a key's of the same name). Its usage is
    /// its own (`grant:<id>` too), reported as the grant's, never a key's.
    pub(super) fn grant_entry(&mut self, grant: &GrantConfig, against: &Against<'_>) -> Result<KeyEntry, BuildError> {
        let mut shadow = KeyConfig::new(grant.id.clone(), String::new());
        shadow.models = grant.models.clone();
        shadow.limits = grant.limits;
        shadow.class = grant.class.clone();
        shadow.budgets = grant.budgets.clone();
        let state = crate::registry::grant_scope(&grant.id);
        let mut entry = self.entry_as(&shadow, against, &state, &state)?;
        entry.usage = against.lent.key_usage(&state).1;
        let mut rare = entry.rare.take().map_or_else(keys::Rare::default, |rare| *rare);
        rare.state_id = Some(Arc::from(state));
        entry.rare = rare.boxed();
        Ok(entry)
    }

    /// `key`'s entry, its limiter state lent as `state` and its budgets'
    /// as `scope`.
    fn entry_as(
        &mut self,
        key: &KeyConfig,
        against: &Against<'_>,
        state: &str,
        scope: &str,
    ) -> Result<KeyEntry, BuildError> {
        let Against { settings, routes, lent } = *against;
        let namespace = key.namespace();
        let namespace_id = self.namespaces.id(namespace);
        let shared = match self.shared.get(&namespace_id) {
            Some(shared) => shared.clone(),
            None => {
                let shared = KeyNamespace {
                    tenant: Arc::new(Tenant::build(namespace, settings, lent)?),
                    visible: keys::visible_routes(routes, namespace),
                    has_policy: settings.tenant(namespace).is_some(),
                };
                self.shared.insert(namespace_id, shared.clone());
                shared
            }
        };
        let (id, usage) = lent.key_usage(&key.id);
        let namespaces = &self.namespaces;
        let mut entry = keys::build_key(key, id, shared.tenant, namespace_id, routes, |owner| namespaces.get(owner));
        entry.visible_routes = shared.visible;
        entry.usage = usage;
        if key.limits.is_some() || !key.budgets.is_empty() {
            let mut rare = entry.rare.take().map_or_else(keys::Rare::default, |rare| *rare);
            if key.limits.is_some() {
                rare.limits = Some(lent.key_limits(state).ok_or(BuildError::NotLent("key limits"))?);
            }
            if !key.budgets.is_empty() {
                rare.budgets = crate::limit::Budget::merged(&key.budgets, |period| lent.budget_state(scope, period));
            }
            entry.rare = rare.boxed();
        }
        // Screening left out keys whose class cannot be served.
        let sharing = &settings.sharing;
        let policy = if shared.has_policy { settings.tenant(namespace) } else { None };
        let class = waycast_crds::sharing::key_class(sharing, policy, key.class.as_deref())
            .ok()
            .and_then(|class| sharing.class_index(class));
        entry.class = u8::try_from(class.unwrap_or(0)).unwrap_or(0);
        Ok(entry)
    }

    /// This table less the keys of `shards`, and the ids of those keys.
    pub(super) fn without_shards(&self, shards: &[u32]) -> (Self, Vec<Arc<str>>) {
        let mut leaving = Vec::new();
        let mut keys = HashMap::with_capacity_and_hasher(self.keys.len(), BuildHasherDefault::default());
        for (digest, entry) in &self.keys {
            if shards.contains(&entry.shard) {
                leaving.push(entry.id.clone());
            } else {
                keys.insert(*digest, entry.clone());
            }
        }
        let table =
            Self { keys, namespaces: self.namespaces.clone(), shared: self.shared.clone(), contested: self.contested };
        (table, leaving)
    }

    /// Every key's entry as text, in digest order: two tables that serve
    /// alike give the same list.
    #[cfg(test)]
    pub(super) fn described(&self) -> Vec<String> {
        let mut keys: Vec<(&[u8; 32], &KeyEntry)> = self.keys.iter().collect();
        keys.sort_unstable_by_key(|(digest, _)| *digest);
        keys.into_iter().map(|(digest, entry)| format!("{digest:02x?} {entry:?}")).collect()
    }
}

/// The keys of `keys` that may be served, checked one by one under
/// `settings` as a whole config's are; the rest are left out (listed in
/// `dropped`, as from `shard`).
pub(super) fn screen(
    settings: &Settings,
    mut keys: Vec<KeyConfig>,
    shard: u32,
    dropped: &mut Vec<Dropped>,
) -> Vec<KeyConfig> {
    let left_out = waycast_crds::validate::review_keys(settings, &keys);
    if left_out.is_empty() {
        return keys;
    }
    let mut index = 0;
    keys.retain(|key| {
        let problems = left_out.get(&index);
        index += 1;
        match problems {
            Some(problems) => {
                let reason = waycast_crds::validate::Problems(problems.clone()).to_string();
                let drop = Dropped::key(key, reason, shard);
                drop.log();
                dropped.push(drop);
                false
            }
            None => true,
        }
    });
    keys
}
