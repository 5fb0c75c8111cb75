//! What a Gateway's usage reports may name ([`Served`]): the keys,
//! namespaces and grants it serves now, and those its ledger counted this
//! period, kept as keyed hashes.

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, Hasher as _};

use waycast_crds::usage::{BudgetScope, GRANT_USAGE_PREFIX};

/// The keys one Gateway counts, as keyed hashes (100,000 ids cost 800 kB,
/// not a copy of each id; the hash key is drawn per process, so no one can
/// make an id collide on purpose).
#[derive(Debug, Clone)]
pub struct Served {
    state: std::collections::hash_map::RandomState,
    /// Keys the Gateway serves now: their usage is written to their status.
    serving: Vec<u64>,
    /// Keys its ledger counted this month (served then, maybe not now): a
    /// report may still list them, nothing is written for them.
    counted: Vec<u64>,
    /// Namespaces of the keys served now (tenant budgets).
    namespaces: Vec<u64>,
    /// Grants served now: a report may list their budgets and their
    /// members', and their usage is written to their status.
    grants: Vec<u64>,
    /// Grants whose budgets its ledger holds (served earlier this period,
    /// maybe not now): a report may still list them, nothing is written
    /// for them.
    counted_grants: Vec<u64>,
}

impl Served {
    /// `serving`: `(namespace, name)` of the keys the Gateway serves in its
    /// current config; `counted`: ids (`namespace/name`) its ledger holds.
    pub fn new<'a>(
        serving: impl IntoIterator<Item = (&'a str, &'a str)>,
        counted: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let state = std::collections::hash_map::RandomState::new();
        let mut namespaces = Vec::new();
        let mut keys = Vec::new();
        for (namespace, name) in serving {
            keys.push(hash_parts(&state, &[namespace.as_bytes(), b"/", name.as_bytes()]));
            namespaces.push(hash_parts(&state, &[namespace.as_bytes()]));
        }
        let mut counted: Vec<u64> = counted.into_iter().map(|id| hash_parts(&state, &[id.as_bytes()])).collect();
        for list in [&mut keys, &mut namespaces, &mut counted] {
            list.sort_unstable();
            list.dedup();
        }
        Self { state, serving: keys, counted, namespaces, grants: Vec::new(), counted_grants: Vec::new() }
    }

    /// These, and grants `grants` (ids, `namespace/name`) served now.
    #[must_use]
    pub fn with_grants<'a>(mut self, grants: impl IntoIterator<Item = &'a str>) -> Self {
        self.grants = self.hashed(grants);
        self
    }

    /// These, and grants `grants` the ledger counted (served earlier).
    #[must_use]
    pub fn with_counted_grants<'a>(mut self, grants: impl IntoIterator<Item = &'a str>) -> Self {
        self.counted_grants = self.hashed(grants);
        self
    }

    fn hashed<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> Vec<u64> {
        let mut hashes: Vec<u64> = ids.into_iter().map(|id| hash_parts(&self.state, &[id.as_bytes()])).collect();
        hashes.sort_unstable();
        hashes.dedup();
        hashes
    }

    /// Whether a report may list the grant `id`'s budgets and members'.
    pub(super) fn grant(&self, id: &str) -> bool {
        let hash = hash_parts(&self.state, &[id.as_bytes()]);
        self.grants.binary_search(&hash).is_ok() || self.counted_grants.binary_search(&hash).is_ok()
    }

    /// Whether a report may list the usage of the grant `id`: one served
    /// now, or whose budgets or usage the ledger holds.
    pub(super) fn counts_grant(&self, id: &str) -> bool {
        self.grant(id)
            || self
                .counted
                .binary_search(&hash_parts(&self.state, &[GRANT_USAGE_PREFIX.as_bytes(), id.as_bytes()]))
                .is_ok()
    }

    /// Whether the Gateway serves the grant `id` now: only then is its
    /// usage written to its status (what a ledger or a pod says of a grant
    /// served earlier is the Gateway's, never written onto the grant).
    pub fn serves_grant(&self, id: &str) -> bool {
        self.grants.binary_search(&hash_parts(&self.state, &[id.as_bytes()])).is_ok()
    }

    /// Whether the Gateway serves the key `id` (`namespace/name`) now.
    pub fn serves(&self, id: &str) -> bool {
        self.serving.binary_search(&hash_parts(&self.state, &[id.as_bytes()])).is_ok()
    }

    /// Whether a report may list the key `id`.
    pub(super) fn counts(&self, id: &str) -> bool {
        let hash = hash_parts(&self.state, &[id.as_bytes()]);
        self.serving.binary_search(&hash).is_ok() || self.counted.binary_search(&hash).is_ok()
    }

    pub(super) fn tenant(&self, namespace: &str) -> bool {
        self.namespaces.binary_search(&hash_parts(&self.state, &[namespace.as_bytes()])).is_ok()
    }
}

/// The keys `compiled` serves, and those `ledger` counted: what a report
/// of the Gateway may name.
pub(super) fn served_by(compiled: &crate::programmed::CompiledFrom, ledger: Option<&super::ledger::Ledger>) -> Served {
    let serving = compiled.keys.keys().map(crate::compile::ObjectKey::as_pair);
    let counted = ledger.into_iter().flat_map(|ledger| {
        let live = ledger.processes.values().flat_map(|entry| entry.report.keys.keys());
        live.chain(ledger.retired_keys.values().flat_map(BTreeMap::keys)).map(String::as_str)
    });
    let granted: Vec<String> = compiled
        .grants
        .iter()
        .filter(|(_, record)| record.verdict.accepted)
        .map(|(grant, _)| grant.as_pair())
        .map(|(namespace, name)| format!("{namespace}/{name}"))
        .collect();
    let ledger_grants = ledger.into_iter().flat_map(|ledger| {
        let live = ledger.processes.values().flat_map(|entry| &entry.report.budgets);
        live.chain(&ledger.retired_budgets).filter_map(|spend| match BudgetScope::parse(&spend.scope)? {
            BudgetScope::Grant(id) | BudgetScope::Member { grant: id, .. } => Some(id),
            _ => None,
        })
    });
    Served::new(serving, counted).with_grants(granted.iter().map(String::as_str)).with_counted_grants(ledger_grants)
}

/// NB: the parts are written as one run of bytes (no length or end
/// marks, unlike `Hash for str`), so `("a", "/", "b")` hashes as `"a/b"`.
fn hash_parts(state: &std::collections::hash_map::RandomState, parts: &[&[u8]]) -> u64 {
    let mut hasher = state.build_hasher();
    for part in parts {
        hasher.write(part);
    }
    hasher.finish()
}
