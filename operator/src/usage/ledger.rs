//! One Gateway's usage ledger: each gateway process's last report, and the
//! processes gone folded into one retired total. Pure: the collector
//! (`mod.rs`) feeds it reports and the live pods, and writes what it
//! derives (the baseline the pods count, the status totals).
//!
//! Reports are cumulative since a process started, so the fleet's total is
//! the sum of each process's last report: collecting one twice changes
//! nothing, missing one delays it. A process is gone when its pod is, or
//! when its pod reports as a new process (a restarted container); its last
//! report then moves into the retired total, which a process never
//! reports into again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use waycast_crds::period::Period;
use waycast_crds::usage::{
    BudgetScope, BudgetSpend, GRANT_USAGE_PREFIX, MAX_BASELINE_MEMBERS, UsageBaseline, UsageReport, UsageTotals,
};

/// A budget's identity: scope, period, window.
type BudgetId = (String, Period, String);

/// What one process last reported, and from which pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ProcessEntry {
    /// The pod it runs in.
    pub pod: String,
    /// Its last report.
    pub report: UsageReport,
}

/// The ledger of one Gateway (persisted by the collector, so an operator
/// restart loses nothing).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Ledger {
    /// Live processes by instance.
    pub processes: BTreeMap<String, ProcessEntry>,
    /// Per month, per key, what processes gone had counted.
    pub retired_keys: BTreeMap<String, BTreeMap<String, UsageTotals>>,
    /// What processes gone had spent, per budget and window.
    pub retired_budgets: Vec<BudgetSpend>,
}

impl Ledger {
    /// Equal for equal ledgers (within one process): whether it changed
    /// since it was last written, without a copy of it.
    pub fn digest(&self) -> u64 {
        use std::hash::BuildHasher as _;
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(self)
    }

    /// Takes `report`, collected from `pod`: it replaces the process's
    /// older one (a late answer older than what is held is ignored); a
    /// different process reporting from the same pod retires the one
    /// before it. Its grants' usage is kept beside its keys', each under
    /// `grant:<id>` (no key id has a `:`), so grants are summed, retired
    /// and forgotten as keys are.
    pub fn record(&mut self, pod: &str, mut report: UsageReport) {
        for (grant, used) in std::mem::take(&mut report.grants) {
            let held = report.keys.entry(format!("{GRANT_USAGE_PREFIX}{grant}")).or_default();
            *held = held.plus(used);
        }
        let replaced: Vec<String> = self
            .processes
            .iter()
            .filter(|(instance, entry)| entry.pod == pod && **instance != report.instance)
            .map(|(instance, _)| instance.clone())
            .collect();
        for instance in replaced {
            self.retire(&instance);
        }
        if let Some(held) = self.processes.get(&report.instance)
            && held.report.sequence >= report.sequence
        {
            return;
        }
        self.processes.insert(report.instance.clone(), ProcessEntry { pod: pod.to_owned(), report });
    }

    /// Retires every process whose pod is not in `live`.
    pub fn keep_pods(&mut self, live: &[String]) {
        let gone: Vec<String> = self
            .processes
            .iter()
            .filter(|(_, entry)| !live.contains(&entry.pod))
            .map(|(instance, _)| instance.clone())
            .collect();
        for instance in gone {
            self.retire(&instance);
        }
    }

    fn retire(&mut self, instance: &str) {
        let Some(entry) = self.processes.remove(instance) else { return };
        let month = self.retired_keys.entry(entry.report.month.clone()).or_default();
        for (key, totals) in entry.report.keys {
            let held = month.entry(key).or_default();
            *held = held.plus(totals);
        }
        let mut budgets = budget_map(&self.retired_budgets);
        for spend in entry.report.budgets {
            let held = budgets.entry((spend.scope, spend.period, spend.window)).or_default();
            *held = (held.0.saturating_add(spend.tokens), held.1.saturating_add(spend.cost_nanos));
        }
        keep_members_bounded(&mut budgets);
        self.retired_budgets = budget_list(budgets);
    }

    /// Raises each budget's total to at least what `floor` (the pods'
    /// last baseline) says the fleet had spent: what the ledger lacks (one
    /// lost or unreadable, the processes it knew gone) is taken as spent by
    /// processes gone. Called once every live process has reported, so what
    /// they reported is not counted twice; what they spent after the floor
    /// was written and before this report is the one part not counted.
    pub fn raise_to(&mut self, floor: &[BudgetSpend]) {
        let counted = budget_map(&self.baseline().budgets);
        let mut retired = budget_map(&self.retired_budgets);
        for spend in floor {
            let id = (spend.scope.clone(), spend.period, spend.window.clone());
            let (tokens, cost) = counted.get(&id).copied().unwrap_or_default();
            let lacking = (spend.tokens.saturating_sub(tokens), spend.cost_nanos.saturating_sub(cost));
            if lacking != (0, 0) {
                let held = retired.entry(id).or_default();
                *held = (held.0.saturating_add(lacking.0), held.1.saturating_add(lacking.1));
            }
        }
        self.retired_budgets = budget_list(retired);
    }

    /// Drops what no longer counts: retired key totals of other months
    /// than `month`, and retired budget spends of windows not in `current`
    /// (the window each period is in now).
    pub fn forget_past(&mut self, month: &str, current: &[(Period, String)]) {
        self.retired_keys.retain(|held, _| held == month);
        self.retired_budgets.retain(|spend| current.iter().any(|(p, w)| *p == spend.period && *w == spend.window));
    }

    /// Per grant id, how many of its members spent from their own budgets
    /// in a window the ledger holds (live processes' and gone ones',
    /// each member once).
    pub fn members_by_grant(&self) -> BTreeMap<String, u64> {
        let live = self.processes.values().flat_map(|entry| &entry.report.budgets);
        let spent = live.chain(&self.retired_budgets).filter(|spend| (spend.tokens, spend.cost_nanos) != (0, 0));
        let members: std::collections::BTreeSet<(&str, &str)> = spent
            .filter_map(|spend| match BudgetScope::parse(&spend.scope)? {
                BudgetScope::Member { grant, digest } => Some((grant, digest)),
                _ => None,
            })
            .collect();
        let mut counted: BTreeMap<String, u64> = BTreeMap::new();
        for (grant, _) in members {
            *counted.entry(grant.to_owned()).or_default() += 1;
        }
        counted
    }

    /// Each key's usage in `month` over every process, gone ones included.
    pub fn key_totals(&self, month: &str) -> BTreeMap<String, UsageTotals> {
        let mut totals = self.retired_keys.get(month).cloned().unwrap_or_default();
        for entry in self.processes.values().filter(|entry| entry.report.month == month) {
            for (key, used) in &entry.report.keys {
                let held = totals.entry(key.clone()).or_default();
                *held = held.plus(*used);
            }
        }
        totals
    }

    /// What the pods count: each budget's total, and which report of each
    /// live process it holds.
    pub fn baseline(&self) -> UsageBaseline {
        let mut budgets = budget_map(&self.retired_budgets);
        for entry in self.processes.values() {
            for spend in &entry.report.budgets {
                let held = budgets.entry((spend.scope.clone(), spend.period, spend.window.clone())).or_default();
                *held = (held.0.saturating_add(spend.tokens), held.1.saturating_add(spend.cost_nanos));
            }
        }
        keep_members_bounded(&mut budgets);
        let reports =
            self.processes.iter().map(|(instance, entry)| (instance.clone(), entry.report.sequence)).collect();
        UsageBaseline { budgets: budget_list(budgets), reports }
    }
}

/// Keeps [`MAX_BASELINE_MEMBERS`] members' spends (per member and
/// window), taken in turns by namespace, each team's largest first; the
/// rest are let go. A member's id is any
/// digest, so a pod that restarts again and again naming new members each
/// time would otherwise grow the ledger, and the baseline every budget
/// shares, without bound.
fn keep_members_bounded(budgets: &mut BTreeMap<BudgetId, (u64, u64)>) {
    let members: Vec<(&BudgetId, (u64, u64))> = budgets
        .iter()
        .filter(|(id, _)| matches!(BudgetScope::parse(&id.0), Some(BudgetScope::Member { .. })))
        .map(|(id, spent)| (id, *spent))
        .collect();
    if members.len() <= MAX_BASELINE_MEMBERS {
        return;
    }
    // In turns by namespace: one team's many members cannot push every
    // other team's out.
    let order = waycast_crds::usage::fair_member_order(&members, |(id, _)| id.0.as_str(), |(_, spent)| *spent);
    let dropped: std::collections::BTreeSet<BudgetId> =
        order[MAX_BASELINE_MEMBERS..].iter().map(|&index| members[index].0.clone()).collect();
    budgets.retain(|id, _| !dropped.contains(id));
}

fn budget_map(spends: &[BudgetSpend]) -> BTreeMap<BudgetId, (u64, u64)> {
    spends
        .iter()
        .map(|spend| ((spend.scope.clone(), spend.period, spend.window.clone()), (spend.tokens, spend.cost_nanos)))
        .collect()
}

fn budget_list(map: BTreeMap<BudgetId, (u64, u64)>) -> Vec<BudgetSpend> {
    map.into_iter()
        .map(|((scope, period, window), (tokens, cost_nanos))| BudgetSpend {
            scope,
            period,
            window,
            tokens,
            cost_nanos,
        })
        .collect()
}

/// Per namespace (the part of a key's or grant's id before `/`), the sum
/// of its keys and its grants' members.
pub fn by_namespace(keys: &BTreeMap<String, UsageTotals>) -> BTreeMap<String, UsageTotals> {
    let mut namespaces: BTreeMap<String, UsageTotals> = BTreeMap::new();
    for (key, used) in keys {
        let id = key.strip_prefix(GRANT_USAGE_PREFIX).unwrap_or(key);
        let Some((namespace, _)) = id.split_once('/') else { continue };
        let held = namespaces.entry(namespace.to_owned()).or_default();
        *held = held.plus(*used);
    }
    namespaces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(instance: &str, sequence: u64, requests: u64, tokens: u64) -> UsageReport {
        UsageReport {
            instance: instance.into(),
            sequence,
            month: "2026-11".into(),
            keys: [(
                "team-a/alice".to_owned(),
                UsageTotals { requests, input_tokens: tokens, ..UsageTotals::default() },
            )]
            .into(),
            budgets: vec![BudgetSpend {
                scope: "tenant:team-a".into(),
                period: Period::Day,
                window: "2026-11-26".into(),
                tokens,
                cost_nanos: 0,
            }],
            grants: BTreeMap::new(),
        }
    }

    fn alice(ledger: &Ledger) -> (u64, u64) {
        let totals = ledger.key_totals("2026-11")["team-a/alice"];
        (totals.requests, ledger.baseline().budgets[0].tokens)
    }

    #[test]
    fn reports_are_cumulative_so_a_repeat_or_a_late_one_changes_nothing() {
        let mut ledger = Ledger::default();
        ledger.record("gw-1", report("gw-1-a", 1, 2, 100));
        ledger.record("gw-2", report("gw-2-a", 1, 1, 40));
        assert_eq!(alice(&ledger), (3, 140));
        ledger.record("gw-1", report("gw-1-a", 2, 5, 250));
        ledger.record("gw-1", report("gw-1-a", 2, 5, 250));
        ledger.record("gw-1", report("gw-1-a", 1, 2, 100));
        assert_eq!(alice(&ledger), (6, 290), "the newest report of each process, once");
        let baseline = ledger.baseline();
        assert_eq!(baseline.reports, [("gw-1-a".to_owned(), 2), ("gw-2-a".to_owned(), 1)].into());
    }

    #[test]
    fn a_process_gone_keeps_its_count_in_the_total_and_the_next_one_adds_to_it() {
        let mut ledger = Ledger::default();
        ledger.record("gw-1", report("gw-1-a", 3, 5, 250));
        ledger.record("gw-2", report("gw-2-a", 1, 1, 40));
        // gw-1's container restarts: a new process reports from the same pod.
        ledger.record("gw-1", report("gw-1-b", 1, 1, 10));
        assert_eq!(alice(&ledger), (7, 300));
        assert!(!ledger.baseline().reports.contains_key("gw-1-a"), "the old process is retired");
        // gw-2 is deleted and replaced by gw-3.
        ledger.keep_pods(&["gw-1".into(), "gw-3".into()]);
        ledger.record("gw-3", report("gw-3-a", 1, 2, 20));
        assert_eq!(alice(&ledger), (9, 320), "nothing lost, nothing twice");
        assert!(!ledger.baseline().reports.contains_key("gw-2-a"));
        // It survives being written and read back (an operator restart).
        let text = serde_json::to_string(&ledger).unwrap_or_default();
        let read: Ledger = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(read, ledger);
        // Still the same day and month: nothing retired goes.
        ledger.forget_past("2026-11", &[(Period::Day, "2026-11-26".into())]);
        assert_eq!(alice(&ledger), (9, 320));
        // A new day: the budget's past window and another month's keys go.
        ledger.forget_past("2026-12", &[(Period::Day, "2026-12-01".into())]);
        assert!(ledger.retired_keys.is_empty() && ledger.retired_budgets.is_empty());
    }

    #[test]
    fn a_lost_ledger_is_raised_to_the_pods_last_baseline_and_live_processes_count_once() {
        // The fleet had spent 500: 300 by processes gone, 200 by gw-1-a.
        let mut before = Ledger::default();
        before.record("gw-0", report("gw-0-a", 1, 3, 300));
        before.record("gw-1", report("gw-1-a", 1, 2, 200));
        before.keep_pods(&["gw-1".into()]);
        let floor = before.baseline().budgets;
        assert_eq!(floor[0].tokens, 500);
        // The ledger is lost; the live process reports again, having spent
        // 50 more. The baseline does not say which part of its 500 was the
        // live process's: the 50 it spent since is the one thing not counted
        // (at most a collection's spend of the live processes).
        let mut ledger = Ledger::default();
        ledger.record("gw-1", report("gw-1-a", 2, 3, 250));
        ledger.raise_to(&floor);
        assert_eq!(ledger.baseline().budgets[0].tokens, 500, "never below what the pods were last told");
        // Raised once more (a repeat), nothing changes.
        ledger.raise_to(&floor);
        assert_eq!(ledger.baseline().budgets[0].tokens, 500);
        // From here on the live process's spend adds to it, and the retired
        // part holds when it goes too.
        ledger.record("gw-1", report("gw-1-a", 3, 4, 300));
        assert_eq!(ledger.baseline().budgets[0].tokens, 550);
        ledger.keep_pods(&[]);
        assert_eq!(ledger.baseline().budgets[0].tokens, 550);
    }

    #[test]
    fn namespaces_sum_their_keys_and_their_grants() {
        let used = |requests| UsageTotals { requests, ..UsageTotals::default() };
        let keys = [
            ("a/x".to_owned(), used(1)),
            ("a/y".to_owned(), used(2)),
            ("b/z".to_owned(), used(4)),
            ("grant:b/devs".to_owned(), used(8)),
        ]
        .into();
        assert_eq!(by_namespace(&keys), [("a".to_owned(), used(3)), ("b".to_owned(), used(12))].into());
    }

    #[test]
    fn grants_usage_is_summed_and_retired_as_keys_are_and_members_are_counted_once() {
        let member = |grant: &str, user: &str, tokens| BudgetSpend {
            scope: BudgetScope::member_of(grant, user),
            period: Period::Day,
            window: "2026-11-26".into(),
            tokens,
            cost_nanos: 0,
        };
        let with_grant = |instance: &str, sequence, requests, members: Vec<BudgetSpend>| {
            let mut report = report(instance, sequence, 1, 10);
            report.grants = [("team-a/devs".to_owned(), UsageTotals { requests, ..UsageTotals::default() })].into();
            report.budgets.extend(members);
            report
        };
        let mut ledger = Ledger::default();
        let alice = member("team-a/devs", "alice", 5);
        let bob = member("team-a/devs", "bob", 7);
        ledger.record("gw-0", with_grant("gw-0-a", 1, 3, vec![alice.clone(), bob.clone()]));
        ledger.record("gw-1", with_grant("gw-1-a", 1, 4, vec![alice, member("team-a/devs", "carol", 0)]));
        let grant = |ledger: &Ledger| ledger.key_totals("2026-11")["grant:team-a/devs"].requests;
        assert_eq!(grant(&ledger), 7, "both pods' members together");
        // Alice on two pods is one member; Carol spent nothing.
        assert_eq!(ledger.members_by_grant(), [("team-a/devs".to_owned(), 2)].into());
        // A pod gone: its part of the grant's usage and its members stay counted.
        ledger.keep_pods(&["gw-1".into()]);
        assert_eq!(grant(&ledger), 7);
        assert_eq!(ledger.members_by_grant()["team-a/devs"], 2);
        // A new month forgets it as it forgets keys.
        ledger.forget_past("2026-12", &[(Period::Day, "2026-12-01".into())]);
        ledger.keep_pods(&[]);
        assert!(!ledger.key_totals("2026-12").contains_key("grant:team-a/devs"));
    }

    #[test]
    fn members_are_kept_within_a_bound_those_who_spent_most_first() {
        use waycast_crds::usage::MAX_REPORTED_MEMBERS;
        let member = |n: usize| format!("user:team-a/devs:{n:032x}");
        let spends = |from: usize, count: usize, tokens: u64| -> Vec<BudgetSpend> {
            (from..from + count)
                .map(|n| BudgetSpend {
                    scope: member(n),
                    period: Period::Day,
                    window: "2026-11-26".into(),
                    tokens: tokens + n as u64 % 3,
                    cost_nanos: 0,
                })
                .collect()
        };
        let mut ledger = Ledger::default();
        // A pod restarting again and again, naming new members each time.
        let mut named = 0;
        for round in 0..4 {
            let mut process = report(&format!("gw-1-{round}"), 1, 1, 10);
            process.budgets = spends(named, MAX_REPORTED_MEMBERS, 10);
            named += MAX_REPORTED_MEMBERS;
            ledger.record("gw-1", process);
        }
        // The last one spent more: kept, though named last.
        let mut last = report("gw-1-last", 1, 1, 10);
        last.budgets = spends(named, 10, 1_000);
        ledger.record("gw-1", last);
        let members = |spends: &[BudgetSpend]| spends.iter().filter(|s| s.scope.starts_with("user:")).count();
        assert_eq!(members(&ledger.baseline().budgets), MAX_BASELINE_MEMBERS, "the baseline is bounded");
        ledger.keep_pods(&[]);
        let retired: Vec<&str> = ledger.retired_budgets.iter().map(|spend| spend.scope.as_str()).collect();
        assert_eq!(retired.len(), MAX_BASELINE_MEMBERS);
        assert!(retired.contains(&member(named).as_str()), "the member who spent most is kept");
        // Below the bound nothing goes.
        let mut few = Ledger::default();
        let mut process = report("gw-2-a", 1, 1, 10);
        process.budgets = spends(0, 5, 10);
        few.record("gw-2", process);
        few.keep_pods(&[]);
        assert_eq!(few.retired_budgets.len(), 5);
    }
}
