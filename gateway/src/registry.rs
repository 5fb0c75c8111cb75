//! What outlives one config: upstream connection pools, rate-limit state
//! and the Redis connection. A [`crate::snapshot::Snapshot`] is a plain
//! value built from a config and the [`Resources`] lent to it here; the
//! registry decides what each new config keeps from the last one.
//!
//! ```text
//! config ─► Registry::lend_base, lend_keys, finish_lending (or lend_changed for some key shards)
//!        ─► Resources ─► Snapshot (pure) ─► stored ─► Registry::keep     (config/builder.rs drives it)
//!             keeps: a pool per connect timeout (while the egress rules stay),
//!                    a key's / tenant's / model's limiter state (by id / namespace / name),
//!                    a model's fair queue (by id, while it has a capacity),
//!                    the Redis connection and its task (while its settings stay)
//! ```
//!
//! Lending changes nothing, so a config that then fails to build leaves the
//! registry as the serving config left it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use waycast_crds::config::{ClientTlsConfig, GatewayConfig, KeyConfig, LimitsConfig, ModelConfig};
use waycast_crds::egress::EgressPolicy;

use crate::error::BuildError;
use crate::limit::LimitSet;
use crate::limit::budget::BudgetState;
use crate::limit::key_usage::KeyUsage;
use crate::limit::redis::RedisCounter;
use crate::upstream::{UpstreamClient, effective_tls};
use waycast_crds::period::Period;

/// Each key's usage this month, by key id.
pub type UsageCounts = HashMap<Arc<str>, Arc<KeyUsage>>;

/// Budget counts by scope (`key:<id>`, `tenant:<namespace>`), per period.
pub type BudgetCounts = HashMap<Arc<str>, Vec<(Period, Arc<BudgetState>)>>;

/// The resources a config is built with. Cloning shares them.
#[derive(Clone, Default)]
pub struct Resources {
    egress: Arc<EgressPolicy>,
    clients: Vec<(ClientKey, UpstreamClient)>,
    /// Clients that could not be made, and why: the models that need one
    /// are left out alone.
    unbuildable: Vec<(ClientKey, String)>,
    redis: Option<Arc<RedisCounter>>,
    key_limits: HashMap<Arc<str>, Limits>,
    tenant_limits: HashMap<Arc<str>, Limits>,
    model_limits: HashMap<Arc<str>, Limits>,
    gates: HashMap<Arc<str>, Arc<crate::sharing::ModelGate>>,
    /// Each grant's members (by grant id), for grants with `perUser`.
    members: HashMap<Arc<str>, Arc<crate::limit::members::Members>>,
    /// Budget counts by scope (`key:<id>`, `tenant:<namespace>`), per period.
    budgets: Arc<BudgetCounts>,
    /// Each key's usage this month, by key id (whose text the key's entry
    /// shares).
    usage: Arc<UsageCounts>,
    /// The ids of keys the config does not name whose usage or budget
    /// counts are kept (they count something in a period not over).
    left_kept: HashSet<Arc<str>>,
}

/// The counts a config's budgets and keys are built on, for the usage
/// report (`crate::usage`): every one lent, including those kept for keys
/// the config no longer names. Shared with the registry, not copied: at
/// 100,000 keys a copy per snapshot was megabytes.
#[derive(Clone, Default)]
pub struct Counts {
    /// Budget counts by scope, per period.
    pub budgets: Arc<BudgetCounts>,
    /// Each key's usage this month, by key id.
    pub usage: Arc<UsageCounts>,
}

/// What tells two upstream clients apart: the connect timeout and the TLS
/// settings.
type ClientKey = (Duration, Option<ClientTlsConfig>);

/// A limiter set and the limits it was made for.
#[derive(Clone)]
struct Limits {
    config: LimitsConfig,
    state: Arc<LimitSet>,
}

impl Resources {
    /// The pooled clients whose connects give up after `connect` and use
    /// `tls`, or why they could not be made.
    ///
    /// # Errors
    /// Why no client exists for these settings (a TLS setup that failed).
    pub fn client(&self, connect: Duration, tls: Option<&ClientTlsConfig>) -> Result<&UpstreamClient, String> {
        let same = |(timeout, with): &ClientKey| *timeout == connect && with.as_ref() == tls;
        if let Some((_, client)) = self.clients.iter().find(|(key, _)| same(key)) {
            return Ok(client);
        }
        Err(self
            .unbuildable
            .iter()
            .find(|(key, _)| same(key))
            .map_or_else(|| "no upstream client was lent for it".to_owned(), |(_, reason)| reason.clone()))
    }

    /// The limiter state of the key with this id.
    pub fn key_limits(&self, id: &str) -> Option<Arc<LimitSet>> {
        self.key_limits.get(id).map(|limits| limits.state.clone())
    }

    /// The members of the grant with this id, when it counts each on
    /// their own (`perUser`).
    pub fn members(&self, grant: &str) -> Option<Arc<crate::limit::members::Members>> {
        self.members.get(grant).cloned()
    }

    /// The limiter state of the tenant `namespace` (all its keys together).
    pub fn tenant_limits(&self, namespace: &str) -> Option<Arc<LimitSet>> {
        self.tenant_limits.get(namespace).map(|limits| limits.state.clone())
    }

    /// The counts of the budget of `scope` (`key:<id>`, `tenant:<namespace>`)
    /// over `period` (fresh when none was lent: a budget the config did
    /// not name).
    pub fn budget_state(&self, scope: &str, period: Period) -> Arc<BudgetState> {
        self.budgets
            .get(scope)
            .and_then(|states| states.iter().find(|(p, _)| *p == period))
            .map(|(_, state)| state.clone())
            .unwrap_or_default()
    }

    /// The usage counts of the key with this id (fresh when none was lent),
    /// and its id as the registry holds it (shared, not allocated again).
    pub fn key_usage(&self, id: &str) -> (Arc<str>, Arc<KeyUsage>) {
        match self.usage.get_key_value(id) {
            Some((held, usage)) => (held.clone(), usage.clone()),
            None => (Arc::from(id), Arc::default()),
        }
    }

    /// Every budget and usage count lent.
    pub fn counts(&self) -> Counts {
        Counts { budgets: self.budgets.clone(), usage: self.usage.clone() }
    }

    /// The fair queue of the model with this id, when it has a capacity.
    pub fn gate(&self, id: &str) -> Option<Arc<crate::sharing::ModelGate>> {
        self.gates.get(id).cloned()
    }

    /// The limiter state of the model with this id (over all keys; see
    /// [`model_id`]).
    pub fn model_limits(&self, id: &str) -> Option<Arc<LimitSet>> {
        self.model_limits.get(id).map(|limits| limits.state.clone())
    }

    /// The fleet-wide counter, when the config says Redis.
    pub fn redis(&self) -> Option<Arc<RedisCounter>> {
        self.redis.clone()
    }
}

/// What the serving config was built with.
#[derive(Default)]
pub struct Registry {
    held: Resources,
    /// Where models' gates report their queues' depth.
    queue_depth: Option<prometheus::IntGaugeVec>,
}

impl Registry {
    /// A registry whose models' gates report their queues' depth in
    /// `queue_depth` (labels `model`, `class`).
    pub fn reporting(queue_depth: prometheus::IntGaugeVec) -> Self {
        Self { held: Resources::default(), queue_depth: Some(queue_depth) }
    }

    /// The whole loan for `config` at once (a standalone snapshot, tests):
    /// as a whole build of a config change lends it.
    ///
    /// # Errors
    /// As [`Registry::lend_base`].
    pub fn lend(&self, config: &GatewayConfig) -> Result<Resources, BuildError> {
        let mut lent = self.lend_base(config)?;
        self.lend_keys(&mut lent, &config.keys);
        self.finish_lending(&mut lent);
        Ok(lent)
    }

    /// The resources for all of `config` but its keys (which it may not
    /// hold: a config in parts is read a shard at a time): what it shares
    /// with the serving config is reused, the rest is made (a limit that
    /// changed continues from the old state). Starts a Redis connection
    /// task when the settings ask for a new one. The keys are lent by
    /// [`Registry::lend_keys`], then the loan finished by
    /// [`Registry::finish_lending`].
    ///
    /// An upstream client that cannot be made (its TLS settings fail) is
    /// not an error here: it is recorded, and the models that need it are
    /// left out when the snapshot is built.
    ///
    /// # Errors
    /// [`BuildError::Tls`] when the Redis TLS setup fails.
    pub fn lend_base(&self, config: &GatewayConfig) -> Result<Resources, BuildError> {
        let held = &self.held;
        // Validation parsed these already; an entry that fails here is skipped.
        let egress = Arc::new(EgressPolicy::from_settings(&config.settings));
        // Pools are reused only while the egress rules they enforce stay.
        let reusable = if held.egress == egress { held.clients.as_slice() } else { &[] };
        let mut clients: Vec<(ClientKey, UpstreamClient)> = Vec::new();
        let mut unbuildable: Vec<(ClientKey, String)> = Vec::new();
        let wanted =
            config.models.iter().flat_map(|m| m.backends.iter().map(move |b| (m.timeouts.connect, effective_tls(b))));
        for key in wanted {
            if clients.iter().any(|(held, _)| *held == key) || unbuildable.iter().any(|(held, _)| *held == key) {
                continue;
            }
            match reusable.iter().find(|(held, _)| *held == key) {
                Some((_, client)) => clients.push((key, client.clone())),
                None => match crate::upstream::client(key.0, &egress, key.1.as_ref()) {
                    Ok(client) => clients.push((key, client)),
                    Err(error) => unbuildable.push((key, format!("tls: {error}"))),
                },
            }
        }
        let mut tenant_limits: HashMap<Arc<str>, Limits> = config
            .settings
            .tenants
            .iter()
            .filter_map(|tenant| Some((tenant.namespace.as_str(), tenant.limits?)))
            .map(|(namespace, wanted)| (Arc::from(namespace), continued(held.tenant_limits.get(namespace), wanted)))
            .collect();
        // A team whose keys all left the config (disabled, deleted) keeps
        // what it counted while anything is counted: the platform's caps
        // must not start over because a team toggled its keys.
        for (namespace, limits) in &held.tenant_limits {
            if !tenant_limits.contains_key(namespace) && !limits.state.is_idle() {
                tenant_limits.insert(namespace.clone(), limits.clone());
            }
        }
        let model_limits = config
            .models
            .iter()
            .filter_map(|model| Some((state_id(model), model.limits?)))
            .map(|(id, wanted)| {
                let state = continued(held.model_limits.get(id.as_str()), wanted);
                (Arc::from(id.as_str()), state)
            })
            .collect();
        // A model's queue (its waiters, its requests in flight) is kept while
        // it has a capacity; a new one starts its task here.
        let gates = config
            .models
            .iter()
            .filter(|model| model.capacity.is_some())
            .map(|model| {
                let id = state_id(model);
                let gate = match held.gates.get(id.as_str()) {
                    Some(kept) => kept.clone(),
                    None => crate::sharing::ModelGate::start(&model_id(model), self.queue_depth.clone()),
                };
                (Arc::from(id.as_str()), gate)
            })
            .collect();
        // The connection (and its task) is kept while the Redis settings stay.
        let redis = match config.settings.redis.as_ref() {
            None => None,
            Some(wanted) => match held.redis.as_ref().filter(|counter| counter.config == *wanted) {
                Some(kept) => Some(kept.clone()),
                None => Some(Arc::new(
                    RedisCounter::start(wanted.clone())
                        .map_err(|e| BuildError::Tls(format!("settings.redis.tls: {e}")))?,
                )),
            },
        };
        let mut budgets: BudgetCounts = HashMap::new();
        for tenant in &config.settings.tenants {
            let scope = format!("tenant:{}", tenant.namespace);
            for period in tenant.budgets.iter().map(|budget| budget.period) {
                lend_budget(&mut budgets, &held.budgets, &scope, period);
            }
        }
        // A grant's limits and budgets for all its members together: kept
        // under `grant:<id>`, apart from any key's.
        let mut key_limits = HashMap::new();
        let mut members = HashMap::new();
        let mut usage = UsageCounts::with_capacity(config.grants.len());
        for grant in &config.grants {
            // Each member's state is kept while the grant's `perUser`
            // stays as it was, and continued when it changes.
            if let Some(per_user) = grant.per_user.as_ref().filter(|p| p.limits.is_some() || !p.budgets.is_empty()) {
                let store = match held.members.get(grant.id.as_str()) {
                    Some(kept) if kept.config() == per_user => kept.clone(),
                    Some(kept) => Arc::new(kept.continued(per_user.clone())),
                    None => Arc::new(crate::limit::members::Members::new(&grant.id, per_user.clone())),
                };
                members.insert(Arc::from(grant.id.as_str()), store);
            }
            let scope = grant_scope(&grant.id);
            // Its members' month usage together, reported as the grant's.
            let (id, state) = held.key_usage(&scope);
            usage.insert(id, state);
            if let Some(wanted) = grant.limits {
                key_limits.insert(Arc::from(scope.as_str()), continued(held.key_limits.get(scope.as_str()), wanted));
            }
            for budget in &grant.budgets {
                lend_budget(&mut budgets, &held.budgets, &scope, budget.period);
            }
        }
        Ok(Resources {
            egress,
            clients,
            unbuildable,
            redis,
            key_limits,
            members,
            tenant_limits,
            model_limits,
            gates,
            budgets: Arc::new(budgets),
            usage: Arc::new(usage),
            left_kept: HashSet::new(),
        })
    }

    /// Lends `keys` their state in `lent`: their limiter state (kept when
    /// unchanged, continued when changed), their budget counts and their
    /// usage counts, each the serving config's when it named the key.
    pub fn lend_keys(&self, lent: &mut Resources, keys: &[KeyConfig]) {
        let held = &self.held;
        let budgets = Arc::make_mut(&mut lent.budgets);
        let usage = Arc::make_mut(&mut lent.usage);
        usage.reserve(keys.len());
        for key in keys {
            if let Some(wanted) = key.limits {
                let limits = continued(held.key_limits.get(key.id.as_str()), wanted);
                lent.key_limits.insert(Arc::from(key.id.as_str()), limits);
            }
            if !key.budgets.is_empty() {
                let scope = format!("key:{}", key.id);
                for budget in &key.budgets {
                    lend_budget(budgets, &held.budgets, &scope, budget.period);
                }
            }
            // A key named before keeps the id text it had (its entry
            // shares it): no second copy of every id per swap.
            let (id, state) = held.key_usage(&key.id);
            usage.insert(id, state);
            lent.left_kept.remove(key.id.as_str());
        }
    }

    /// Makes room in `lent` for the usage counts of `keys` keys at once.
    pub fn reserve_keys(&self, lent: &mut Resources, keys: usize) {
        Arc::make_mut(&mut lent.usage).reserve(keys);
    }

    /// Finishes a loan: budget and usage counts the serving config holds
    /// and the new one does not name are kept while they count something
    /// in a period not over (a key or team toggled off and on mid-period
    /// must not start its period over; keys created and deleted in turn
    /// must not pile up).
    pub fn finish_lending(&self, lent: &mut Resources) {
        let now = jiff::Timestamp::now();
        let budgets = Arc::make_mut(&mut lent.budgets);
        for (scope, states) in self.held.budgets.iter() {
            for (period, state) in states {
                if find_budget(budgets, scope, *period).is_none() && state.counted() != (0, 0) && !state.ended(now) {
                    budgets.entry(scope.clone()).or_default().push((*period, state.clone()));
                    if let Some(id) = scope.strip_prefix("key:") {
                        lent.left_kept.insert(Arc::from(id));
                    }
                }
            }
        }
        let usage = Arc::make_mut(&mut lent.usage);
        for (id, state) in self.held.usage.iter() {
            if !usage.contains_key(id) && !state.idle(now) {
                usage.insert(id.clone(), state.clone());
                lent.left_kept.insert(id.clone());
            }
        }
    }

    /// The serving config's resources with the keys `leaving` (by id) let
    /// go, for a config that differs from it only in some keys (a changed
    /// shard), whose keys are then lent by [`Registry::lend_keys`]: the
    /// same loan a whole build makes for the whole new config, but for
    /// what [`Registry::finish_lending`] keeps of keys left earlier, kept
    /// until the next whole loan. A key both leaving and lent again
    /// (changed) keeps its state.
    pub fn lend_changed(&self, leaving: &[Arc<str>]) -> Resources {
        let mut lent = self.held.clone();
        let now = jiff::Timestamp::now();
        let usage = Arc::make_mut(&mut lent.usage);
        let budgets = Arc::make_mut(&mut lent.budgets);
        for id in leaving {
            lent.key_limits.remove(id);
            lent.left_kept.insert(id.clone());
        }
        // What is kept of keys that left (now or earlier) goes once it
        // counts nothing more, as a whole loan lets it go: keys created and
        // deleted in turn must not pile up between whole loans.
        lent.left_kept.retain(|id| {
            let usage_kept = match usage.get(id) {
                Some(state) if state.idle(now) => {
                    usage.remove(id);
                    false
                }
                kept => kept.is_some(),
            };
            let scope = format!("key:{id}");
            let budgets_kept = match budgets.get_mut(scope.as_str()) {
                Some(states) => {
                    states.retain(|(_, state)| state.counted() != (0, 0) && !state.ended(now));
                    if states.is_empty() {
                        budgets.remove(scope.as_str());
                    }
                    budgets.contains_key(scope.as_str())
                }
                None => false,
            };
            usage_kept || budgets_kept
        });
        lent
    }

    /// Records what the config now serving was built with; what it does not
    /// use is dropped (pools close, a Redis task ends).
    pub fn keep(&mut self, resources: Resources) {
        self.held = resources;
    }
}

/// What names a grant's state (its limiters, its budgets' counts): never a
/// key's id, whose names cannot hold a `:`.
pub fn grant_scope(id: &str) -> String {
    format!("{}{id}", waycast_crds::usage::GRANT_USAGE_PREFIX)
}

/// What names a model across namespaces (its limiter state, its metrics):
/// its name for a platform model, `namespace/name` for a team's.
pub fn model_id(model: &ModelConfig) -> std::borrow::Cow<'_, str> {
    match model.owner_namespace() {
        None => std::borrow::Cow::Borrowed(&model.name),
        Some(namespace) => std::borrow::Cow::Owned(format!("{namespace}/{}", model.name)),
    }
}

/// What names a model's state (its limiters, its queue, its Redis keys):
/// `namespace/name` for a team's model, `/name` for a platform model. Its
/// [`model_id`] would do for a label but not here: a platform model named
/// `meta-llama/Llama-3.1-8B` and the model `Llama-3.1-8B` of a namespace
/// `meta-llama` share a `model_id`, and must not share a limit or a queue.
pub fn state_id(model: &ModelConfig) -> String {
    match model.owner_namespace() {
        None => format!("/{}", model.name),
        Some(namespace) => format!("{namespace}/{}", model.name),
    }
}

/// The counts of `scope`'s budget over `period` in `budgets`, if lent.
fn find_budget(budgets: &BudgetCounts, scope: &str, period: Period) -> Option<Arc<BudgetState>> {
    budgets.get(scope).and_then(|states| states.iter().find(|(p, _)| *p == period)).map(|(_, state)| state.clone())
}

/// Lends `scope`'s budget over `period` in `budgets`, once: the counts
/// `held` has for it, else fresh ones.
fn lend_budget(budgets: &mut BudgetCounts, held: &BudgetCounts, scope: &str, period: Period) {
    if find_budget(budgets, scope, period).is_some() {
        return;
    }
    let state = find_budget(held, scope, period).unwrap_or_default();
    budgets.entry(Arc::from(scope)).or_default().push((period, state));
}

/// The same limits keep their state as is; changed ones continue from it.
fn continued(before: Option<&Limits>, wanted: LimitsConfig) -> Limits {
    match before {
        Some(same) if same.config == wanted => same.clone(),
        other => Limits { config: wanted, state: Arc::new(LimitSet::new(&wanted, other.map(|l| l.state.as_ref()))) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waycast_crds::config::Settings;

    fn config(connects: &[u64], key_limit: Option<u64>, denied: &[&str]) -> GatewayConfig {
        let mut config: GatewayConfig = serde_json::from_str(r#"{"apiVersion":"waycast.dev/config-v1"}"#).unwrap();
        config.settings = Settings { denied_cidrs: denied.iter().map(|&c| c.to_owned()).collect(), ..config.settings };
        for (index, seconds) in connects.iter().enumerate() {
            let mut model = ModelConfig::to(format!("m{index}"), "http://upstream:8000/v1");
            model.timeouts.connect = Duration::from_secs(*seconds);
            config.models.push(model);
        }
        let mut key = waycast_crds::config::KeyConfig::new("team/key", "00".repeat(32));
        key.limits = key_limit.map(LimitsConfig::requests);
        config.keys.push(key);
        config
    }

    #[tokio::test]
    async fn one_pool_per_connect_timeout_kept_while_the_egress_rules_stay() {
        let mut registry = Registry::default();
        let first = registry.lend(&config(&[5, 5, 10], None, &[])).unwrap();
        assert_eq!(first.clients.len(), 2, "one pool per distinct connect timeout (and TLS settings)");
        registry.keep(first.clone());
        let fewer = registry.lend(&config(&[5], None, &[])).unwrap();
        assert_eq!(fewer.clients.len(), 1, "a pool no model uses is not lent");
        let denied = registry.lend(&config(&[5], None, &["10.0.0.0/8"])).unwrap();
        assert_eq!(denied.egress.denied, ["10.0.0.0/8".parse().unwrap()]);
        assert!(!Arc::ptr_eq(&denied.clients[0].1.egress_policy(), &fewer.clients[0].1.egress_policy()));
        assert_eq!(registry.held.egress.denied.len(), 0, "lend changes nothing");
    }

    #[tokio::test]
    async fn limiter_state_is_kept_when_unchanged_and_continued_when_changed() {
        let mut registry = Registry::default();
        let first = registry.lend(&config(&[5], Some(60), &[])).unwrap();
        registry.keep(first.clone());
        let same = registry.lend(&config(&[5], Some(60), &[])).unwrap();
        assert!(Arc::ptr_eq(&first.key_limits("team/key").unwrap(), &same.key_limits("team/key").unwrap()));
        let changed = registry.lend(&config(&[5], Some(120), &[])).unwrap();
        let changed = changed.key_limits("team/key").unwrap();
        assert!(!Arc::ptr_eq(&first.key_limits("team/key").unwrap(), &changed));
        assert_eq!(changed.requests.as_ref().map(|l| l.per_minute), Some(120));
        let removed = registry.lend(&config(&[5], None, &[])).unwrap();
        assert!(removed.key_limits("team/key").is_none());
    }

    #[tokio::test]
    async fn a_loan_for_some_changed_keys_is_the_loan_for_the_whole_config() {
        let with = |limits: &[(&str, u64)]| {
            let mut config = config(&[5], None, &[]);
            config.keys = limits
                .iter()
                .map(|(id, per_minute)| {
                    let mut key = waycast_crds::config::KeyConfig::new(*id, "00".repeat(32));
                    key.limits = Some(LimitsConfig::requests(*per_minute));
                    key
                })
                .collect();
            config
        };
        let mut registry = Registry::default();
        let before = with(&[("team/kept", 60), ("team/changed", 60), ("team/leaving", 60)]);
        registry.keep(registry.lend(&before).unwrap());
        let after = with(&[("team/kept", 60), ("team/changed", 120), ("team/new", 10)]);
        let whole = registry.lend(&after).unwrap();
        // The changed key counted this month: once lent again it is named,
        // not kept as a key that left (whose counts go when its month ends).
        let now = jiff::Timestamp::now();
        registry.held.usage["team/changed"].count(Default::default(), now, &jiff::tz::TimeZone::UTC);
        let mut changed = registry.lend_changed(&[Arc::from("team/changed"), Arc::from("team/leaving")]);
        registry.lend_keys(&mut changed, &after.keys[1..]);
        assert!(!changed.left_kept.contains("team/changed"), "{:?}", changed.left_kept);
        let ids = |lent: &Resources| {
            let mut limits: Vec<String> = lent.key_limits.keys().map(|id| id.to_string()).collect();
            let mut usage: Vec<String> = lent.usage.keys().map(|id| id.to_string()).collect();
            limits.sort();
            usage.sort();
            (limits, usage)
        };
        assert_eq!(ids(&changed), ids(&whole), "the same keys are lent state");
        assert!(changed.key_limits("team/leaving").is_none(), "a key that left lets its limits go");
        let kept = |lent: &Resources| lent.key_limits("team/kept").unwrap();
        assert!(Arc::ptr_eq(&kept(&changed), &kept(&registry.held)), "an unchanged key keeps its state");
        let limit = |lent: &Resources| lent.key_limits("team/changed").unwrap().requests.as_ref().map(|l| l.per_minute);
        assert_eq!(limit(&changed), Some(120), "a changed key's limits continue from the new config");
        assert_eq!(limit(&changed), limit(&whole));
    }

    #[tokio::test]
    async fn what_is_kept_of_keys_that_left_goes_once_it_counts_nothing() {
        let with = |ids: &[&str]| {
            let mut config = config(&[5], None, &[]);
            config.keys = ids.iter().map(|id| waycast_crds::config::KeyConfig::new(*id, "00".repeat(32))).collect();
            config
        };
        let (now, utc) = (jiff::Timestamp::now(), jiff::tz::TimeZone::UTC);
        let long_ago: jiff::Timestamp = "2020-01-15T12:00:00Z".parse().unwrap();
        let mut registry = Registry::default();
        registry.keep(registry.lend(&with(&["team/a", "team/b", "team/c", "team/d"])).unwrap());
        let used = |registry: &Registry, id: &str| registry.held.usage.get(id).cloned().unwrap();
        used(&registry, "team/b").count(waycast_crds::usage::UsageTotals::default(), now, &utc);
        used(&registry, "team/c").count(waycast_crds::usage::UsageTotals::default(), long_ago, &utc);
        // b and c leave: b counted this month and is kept, c's month is
        // over; as a loan for the whole new config keeps them.
        let whole = registry.lend(&with(&["team/a", "team/d"])).unwrap();
        registry.keep(registry.lend_changed(&[Arc::from("team/b"), Arc::from("team/c")]));
        let ids = |lent: &Resources| {
            let mut ids: Vec<String> = lent.usage.keys().map(|id| id.to_string()).collect();
            ids.sort();
            ids
        };
        let kept = |registry: &Registry| ids(&registry.held);
        assert_eq!(kept(&registry), ["team/a", "team/b", "team/d"]);
        assert_eq!(kept(&registry), ids(&whole));
        // Once b's counts are of a month over (as c's were), the next
        // change lets them go, whichever keys it changes.
        let over = Arc::new(KeyUsage::default());
        over.count(waycast_crds::usage::UsageTotals::default(), long_ago, &utc);
        Arc::make_mut(&mut registry.held.usage).insert(Arc::from("team/b"), over);
        registry.keep(registry.lend_changed(&[Arc::from("team/d")]));
        assert_eq!(kept(&registry), ["team/a"]);
        assert!(registry.held.left_kept.is_empty(), "{:?}", registry.held.left_kept);
    }
}
