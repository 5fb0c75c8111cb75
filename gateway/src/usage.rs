//! This process's side of the usage contract (`waycast_crds::usage`): the
//! report the operator collects from the admin port (`GET /usage`), and
//! the fleet's spend it hands back (the usage ConfigMap), which each
//! budget then counts beside its own (`limit::budget`).
//!
//! ```text
//! GET /usage ─► report(): each key's month, each budget's period (cumulative
//!               since this process started), numbered; what each budget
//!               had spent is kept under the number (the last HISTORY reports)
//! ConfigMap  ─► apply(): per budget, the fleet's total and the number of
//!               this process's report in it ─► BudgetState::set_fleet
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::Timestamp;
use waycast_crds::period::Period;
use waycast_crds::usage::{
    BudgetScope, BudgetSpend, GRANT_USAGE_PREFIX, MAX_REPORTED_BUDGETS, MAX_REPORTED_GRANTS, MAX_REPORTED_KEYS,
    MAX_REPORTED_MEMBERS, OTHER_KEYS, UsageBaseline, UsageReport, UsageTotals,
};

use crate::limit::budget::{BudgetState, FleetSpend};
use crate::limit::members::MembersFleet;
use crate::snapshot::Snapshot;

/// How many reports' budget spends are kept (a new one at most every
/// second): the operator's baseline names one of them. One older than
/// this counts this process's spend twice (stricter, never looser).
const HISTORY: usize = 64;

/// A budget's identity in a report: scope, period, window.
type BudgetId = (String, Period, String);

/// Per report number, what each budget had spent (tokens, nano-units).
type History = VecDeque<(u64, Arc<HashMap<BudgetId, (u64, u64)>>)>;

/// This process's reports.
pub struct Ledger {
    instance: String,
    sequence: AtomicU64,
    /// The last reports' budget spends.
    history: arc_swap::ArcSwap<History>,
    /// The last baseline the operator handed back.
    last: arc_swap::ArcSwapOption<UsageBaseline>,
    /// The last report taken, and the second it was taken in.
    last_report: arc_swap::ArcSwapOption<UsageReport>,
    last_at: std::sync::atomic::AtomicI64,
    /// Until when readiness waits for a first baseline (none: no source).
    wait_until: std::sync::OnceLock<std::time::Instant>,
}

/// How long a starting process waits for the fleet's spend before it is
/// ready: long enough for the operator to write it for a new Gateway,
/// short enough that a missing one does not keep a fleet down.
pub const BASELINE_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

impl Ledger {
    /// The ledger of a process named `instance` (unique to this start).
    pub fn new(instance: String) -> Self {
        Self {
            instance,
            sequence: AtomicU64::new(0),
            history: arc_swap::ArcSwap::default(),
            last: arc_swap::ArcSwapOption::empty(),
            last_report: arc_swap::ArcSwapOption::empty(),
            last_at: std::sync::atomic::AtomicI64::new(0),
            wait_until: std::sync::OnceLock::new(),
        }
    }

    /// A baseline source is configured: readiness waits for its first
    /// document, at most [`BASELINE_WAIT`] (a restarted process that
    /// served before knowing the fleet's spend would count a budget from
    /// its share alone).
    pub fn expect_baseline(&self) {
        let _ = self.wait_until.set(std::time::Instant::now() + BASELINE_WAIT);
    }

    /// Whether readiness need not wait for a baseline any more.
    pub fn settled(&self) -> bool {
        self.wait_until.get().is_none_or(|until| self.last.load().is_some() || std::time::Instant::now() >= *until)
    }

    /// Keeps `baseline` for the snapshots to come.
    pub fn keep(&self, baseline: UsageBaseline) {
        self.last.store(Some(Arc::new(baseline)));
    }

    /// Hands the last baseline to a new snapshot's budgets.
    pub fn reapply(&self, snapshot: &Snapshot) {
        if let Some(baseline) = self.last.load_full() {
            self.apply(snapshot, &baseline, Timestamp::now());
        }
    }

    /// A name for this process: `base` (its pod) and a number drawn now.
    pub fn instance_name(base: &str) -> String {
        use std::hash::BuildHasher as _;
        let drawn = std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
        format!("{base}-{:08x}", drawn as u32)
    }

    /// What this process counted, as of `now`, under the next number.
    pub fn report(&self, snapshot: &Snapshot, now: Timestamp) -> UsageReport {
        let zone = &snapshot.zone;
        let mut keys = std::collections::BTreeMap::new();
        let mut grants = std::collections::BTreeMap::new();
        let mut other = UsageTotals::default();
        for (id, usage) in snapshot.counts.usage.iter() {
            let totals = usage.totals(now, zone);
            if totals.is_empty() {
                continue;
            }
            if let Some(grant) = id.strip_prefix(GRANT_USAGE_PREFIX) {
                if grants.len() < MAX_REPORTED_GRANTS {
                    grants.insert(grant.to_owned(), totals);
                }
                continue;
            }
            if keys.len() < MAX_REPORTED_KEYS {
                keys.insert(id.to_string(), totals);
            } else {
                other = other.plus(totals);
            }
        }
        if !other.is_empty() {
            keys.insert(OTHER_KEYS.to_owned(), other);
        }
        let mut spends = HashMap::new();
        let mut budgets = Vec::new();
        let mut members = Vec::new();
        each_budget(snapshot, |scope, period, state, member| {
            let window = period.window(now, zone);
            if state.period_start() != window.start.as_second() {
                return;
            }
            let (tokens, cost_nanos) = state.spent();
            // Nothing spent is not listed (and not kept: what the baseline
            // does not name counts as nothing of this process's).
            if tokens == 0 && cost_nanos == 0 {
                return;
            }
            let spend = BudgetSpend { scope: scope.to_owned(), period, window: window.key, tokens, cost_nanos };
            if member { members.push(spend) } else { budgets.push(spend) }
        });
        // Past the operator's bounds a report is refused whole: members are
        // listed in turns by namespace, each team's who spent most first,
        // the others go unreported (their spend is then this pod's alone),
        // in an order that does not change between reports.
        budgets.truncate(MAX_REPORTED_BUDGETS);
        let room = MAX_REPORTED_MEMBERS.min(MAX_REPORTED_BUDGETS - budgets.len());
        if members.len() > room {
            let order =
                waycast_crds::usage::fair_member_order(&members, |s| s.scope.as_str(), |s| (s.tokens, s.cost_nanos));
            let mut kept = vec![false; members.len()];
            for index in order.into_iter().take(room) {
                kept[index] = true;
            }
            let mut index = 0;
            members.retain(|_| {
                index += 1;
                kept[index - 1]
            });
        }
        budgets.append(&mut members);
        for spend in &budgets {
            spends.insert((spend.scope.clone(), spend.period, spend.window.clone()), (spend.tokens, spend.cost_nanos));
        }
        budgets.sort();
        let month = Period::Month.window(now, zone).key;
        let mut report = UsageReport { instance: self.instance.clone(), sequence: 0, month, keys, budgets, grants };
        // Nothing new since the last report: the same number, so the
        // operator has nothing to write. A new number at most every
        // second, so no caller of the admin port can push the numbers the
        // operator's baseline names out of the history (the process would
        // then count its own spend twice).
        if let Some(last) = self.last_report.load_full() {
            let unchanged = (&last.month, &last.keys, &last.budgets, &last.grants)
                == (&report.month, &report.keys, &report.budgets, &report.grants);
            let recent = self.last_at.load(Ordering::Relaxed) == now.as_second();
            if unchanged || recent {
                return UsageReport::clone(&last);
            }
        }
        self.last_at.store(now.as_second(), Ordering::Relaxed);
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
        report.sequence = sequence;
        let spends = Arc::new(spends);
        self.history.rcu(|history| {
            let mut history = History::clone(history);
            history.push_back((sequence, spends.clone()));
            while history.len() > HISTORY {
                history.pop_front();
            }
            history
        });
        self.last_report.store(Some(Arc::new(report.clone())));
        report
    }

    /// Hands each budget of `snapshot` the fleet's spend in `baseline`, as
    /// of `now`: the total over every process, and what of it was this
    /// process's (from the report the baseline names; none when it names
    /// none, as for a process not collected yet).
    pub fn apply(&self, snapshot: &Snapshot, baseline: &UsageBaseline, now: Timestamp) {
        let zone = &snapshot.zone;
        let history = self.history.load();
        let mine: Arc<HashMap<BudgetId, (u64, u64)>> = baseline
            .reports
            .get(&self.instance)
            .and_then(|sequence| history.iter().find(|(number, _)| number == sequence))
            .map(|(_, spends)| spends.clone())
            .unwrap_or_default();
        let totals: HashMap<(&str, Period, &str), (u64, u64)> = baseline
            .budgets
            .iter()
            .map(|spend| {
                ((spend.scope.as_str(), spend.period, spend.window.as_str()), (spend.tokens, spend.cost_nanos))
            })
            .collect();
        let fleet = |scope: &str, period: Period| {
            let window = period.window(now, zone);
            let total = totals.get(&(scope, period, window.key.as_str())).copied().unwrap_or_default();
            let own = mine.get(&(scope.to_owned(), period, window.key.clone())).copied().unwrap_or_default();
            // What this process reported can only be in the total.
            let own = (own.0.min(total.0), own.1.min(total.1));
            FleetSpend { start: window.start.as_second(), total, mine: own }
        };
        for (scope, states) in snapshot.counts.budgets.iter() {
            if reported(scope) {
                for (period, state) in states {
                    state.set_fleet(fleet(scope, *period));
                }
            }
        }
        // A grant's members: every member the baseline names, held now or
        // not (one first seen by this process later starts from it).
        let mut members: HashMap<&str, MembersFleet> = HashMap::new();
        for spend in &baseline.budgets {
            if let Some(BudgetScope::Member { grant, .. }) = BudgetScope::parse(&spend.scope) {
                let spends = members.entry(grant).or_default().entry(Arc::from(spend.scope.as_str())).or_default();
                if !spends.iter().any(|(period, _)| *period == spend.period) {
                    spends.push((spend.period, fleet(&spend.scope, spend.period)));
                }
            }
        }
        for grant in snapshot.identity.grants() {
            if let Some(held) = &grant.members {
                held.set_fleet(members.remove(held.grant()).unwrap_or_default());
            }
        }
    }
}

/// Whether a budget of `scope` is reported to the operator (and handed
/// its fleet's spend): keys', tenants' and grants'; members' are reported
/// through their grant's members.
fn reported(scope: &str) -> bool {
    matches!(BudgetScope::parse(scope), Some(BudgetScope::Key(_) | BudgetScope::Tenant(_) | BudgetScope::Grant(_)))
}

/// Calls `each` with every budget this process counts (and whether it is
/// a member's): keys', tenants' and grants', then each member's of each
/// grant.
fn each_budget(snapshot: &Snapshot, mut each: impl FnMut(&str, Period, &BudgetState, bool)) {
    for (scope, states) in snapshot.counts.budgets.iter() {
        if reported(scope) {
            for (period, state) in states {
                each(scope, *period, state, false);
            }
        }
    }
    for grant in snapshot.identity.grants() {
        let Some(members) = &grant.members else { continue };
        for member in members.held().values() {
            for budget in &member.budgets {
                each(&member.id, budget.period, &budget.state, true);
            }
        }
    }
}
