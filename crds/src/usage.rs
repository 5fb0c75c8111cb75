//! The usage contract between gateway pods and the operator.
//!
//! ```text
//! gateway pod  GET /usage (admin port) ─► UsageReport: what this process counted
//!                                          this month per key, and per budget
//!                                          in its current period, since it started
//! operator     collects every pod's report ─► the ledger (per Gateway): each
//!              process's last report, and the processes gone, folded
//!          ─► ApiKey.status.usage, Gateway.status.usage (per namespace)
//!          ─► ConfigMap <gateway>-usage: UsageBaseline, the fleet's totals of
//!             each budget and which report of each process they hold
//! gateway pod  watches it ─► a budget counts the fleet's total + what this
//!              process spent since the report the total holds
//! ```
//!
//! Reports are cumulative since the process started, so collecting one
//! twice, or missing one, loses nothing; a process is named by an
//! instance id drawn when it starts, so a restarted container is a new
//! process and the old one's counts stay in the ledger.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::period::Period;

/// The data key of the usage ConfigMap holding a [`UsageBaseline`].
pub const BASELINE_DATA_KEY: &str = "usage.json";
/// The most keys one report lists (the rest are counted in the total
/// under [`OTHER_KEYS`]): bounds a report's size.
pub const MAX_REPORTED_KEYS: usize = 100_000;
/// The most budget spends one report lists: every period of every key,
/// tenant and grant a Gateway can count, and members' (a gateway reports
/// no more, members' last; the operator refuses a report of more).
pub const MAX_REPORTED_BUDGETS: usize = 4 * MAX_REPORTED_KEYS;
/// The most grants one report lists (a gateway reports no more; the
/// operator refuses a report of more).
pub const MAX_REPORTED_GRANTS: usize = 10_000;
/// Where usage of keys past [`MAX_REPORTED_KEYS`] is added up.
pub const OTHER_KEYS: &str = "-";

/// What a key used: requests finished, tokens, and cost in the Gateway's
/// budget currency (nano-units; a model priced in another currency adds
/// no cost).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
// NB: a zero count is left out of the JSON (reports and the persisted
// ledger of 10,000 keys, mostly zeros past the first fields, were a third
// smaller) and read back as zero.
pub struct UsageTotals {
    /// Requests that reached a model (admitted, whatever their answer).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub requests: u64,
    /// Prompt tokens.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_tokens: u64,
    /// Prompt tokens served from the upstream's cache (part of `inputTokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// Cost, in nano-units of the budget currency.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_nanos: u64,
}

#[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
fn is_zero(count: &u64) -> bool {
    *count == 0
}

impl UsageTotals {
    /// Both added (saturating: a count never wraps).
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            requests: self.requests.saturating_add(other.requests),
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cached_input_tokens: self.cached_input_tokens.saturating_add(other.cached_input_tokens),
            cost_nanos: self.cost_nanos.saturating_add(other.cost_nanos),
        }
    }

    /// `self` less `other`, never below zero.
    #[must_use]
    pub fn minus(self, other: Self) -> Self {
        Self {
            requests: self.requests.saturating_sub(other.requests),
            input_tokens: self.input_tokens.saturating_sub(other.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(other.output_tokens),
            cached_input_tokens: self.cached_input_tokens.saturating_sub(other.cached_input_tokens),
            cost_nanos: self.cost_nanos.saturating_sub(other.cost_nanos),
        }
    }

    /// Whether nothing was used.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The most members of one grant a pod counts at once.
pub const MAX_MEMBERS_PER_GRANT: usize = 10_000;
/// The most members' budget spends one report lists (in turns by
/// namespace, each team's who spent most first: [`fair_member_order`];
/// the operator refuses a report of more). With the baseline's
/// bound ([`MAX_BASELINE_MEMBERS`]) it keeps the pods' baseline, which
/// also carries every key's and tenant's budgets, well within what one
/// ConfigMap holds (some 140 bytes a spend): members can never make it
/// too large to write for everyone else.
pub const MAX_REPORTED_MEMBERS: usize = 2_000;
/// The most members' budget spends the operator hands back to the pods
/// (and keeps of processes gone), in the same turns.
pub const MAX_BASELINE_MEMBERS: usize = 2 * MAX_REPORTED_MEMBERS;

/// Whose budget a [`BudgetSpend`] is, read from its scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetScope<'a> {
    /// `key:<namespace/name>`.
    Key(&'a str),
    /// `tenant:<namespace>`.
    Tenant(&'a str),
    /// `grant:<namespace/name>`: a grant's budget for all its members.
    Grant(&'a str),
    /// `user:<namespace/name>:<32 hex digits>`: one member of a grant, by
    /// the first half of the SHA-256 of who their token names (never the
    /// name itself).
    Member {
        /// The grant's id.
        grant: &'a str,
        /// The member's digest.
        digest: &'a str,
    },
}

impl<'a> BudgetScope<'a> {
    /// `scope` read, or `None` if it is none of these (a member's digest
    /// must be 32 lowercase hex digits, so a scope names one member in
    /// one way only).
    pub fn parse(scope: &'a str) -> Option<Self> {
        let (kind, rest) = scope.split_once(':')?;
        let scope = match kind {
            "key" => Self::Key(rest),
            "tenant" => Self::Tenant(rest),
            "grant" => Self::Grant(rest),
            "user" => {
                let (grant, digest) = rest.rsplit_once(':')?;
                let hex = digest.len() == 32 && digest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                if !hex {
                    return None;
                }
                Self::Member { grant, digest }
            }
            _ => return None,
        };
        Some(scope)
    }

    /// A member's scope: `user:<grant>:<hex of the first 16 bytes of
    /// SHA-256(user)>`.
    pub fn member_of(grant: &str, user: &str) -> String {
        let digest = crate::digest::sha256(user.as_bytes());
        let hex: String = digest[..16].iter().map(|byte| format!("{byte:02x}")).collect();
        format!("user:{grant}:{hex}")
    }
}

/// The order in which members' spends `items` are kept when only some can
/// be (a report's [`MAX_REPORTED_MEMBERS`], the baseline's
/// [`MAX_BASELINE_MEMBERS`]): each namespace's largest spender first, then
/// each namespace's second, and so on (within a round by spend, then by
/// scope, so the order does not change between reports). Cut anywhere, the
/// kept part is shared between the namespaces' grants: one team listing
/// thousands of members (its own ServiceAccounts, spending on a model
/// that reports any usage it likes) cannot push every other team's
/// members out. Returns indexes into `items`.
pub fn fair_member_order<T>(
    items: &[T],
    scope_of: impl Fn(&T) -> &str,
    spent_of: impl Fn(&T) -> (u64, u64),
) -> Vec<usize> {
    fn namespace_of(scope: &str) -> &str {
        match BudgetScope::parse(scope) {
            Some(BudgetScope::Member { grant, .. }) => grant.split_once('/').map_or(grant, |(namespace, _)| namespace),
            _ => scope,
        }
    }
    let namespaces: Vec<&str> = items.iter().map(|item| namespace_of(scope_of(item))).collect();
    let larger_first = |a: &T, b: &T| spent_of(b).cmp(&spent_of(a)).then_with(|| scope_of(a).cmp(scope_of(b)));
    let mut by_namespace: Vec<usize> = (0..items.len()).collect();
    by_namespace.sort_by(|&a, &b| namespaces[a].cmp(namespaces[b]).then_with(|| larger_first(&items[a], &items[b])));
    let mut rounds = vec![0_usize; items.len()];
    for pair in by_namespace.windows(2) {
        if namespaces[pair[0]] == namespaces[pair[1]] {
            rounds[pair[1]] = rounds[pair[0]] + 1;
        }
    }
    by_namespace.sort_by(|&a, &b| rounds[a].cmp(&rounds[b]).then_with(|| larger_first(&items[a], &items[b])));
    by_namespace
}

/// What a budget has spent in one of its periods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSpend {
    /// Whose: `key:<namespace/name>`, `tenant:<namespace>`,
    /// `grant:<namespace/name>` or `user:<grant>:<digest>` (see
    /// [`BudgetScope`]).
    pub scope: String,
    /// The budget's period.
    pub period: Period,
    /// Which one (`2026-11-26`, `2026-W48`, `2026-11`).
    pub window: String,
    /// Tokens spent.
    pub tokens: u64,
    /// Nano-units spent.
    pub cost_nanos: u64,
}

/// What one gateway process counted since it started.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// The process: drawn when it starts.
    pub instance: String,
    /// This report's number (each one taken gets the next).
    pub sequence: u64,
    /// The month the key totals are of (`2026-11`), in the Gateway's zone.
    pub month: String,
    /// Per key id (`namespace/name`), what it used this month.
    pub keys: BTreeMap<String, UsageTotals>,
    /// Per budget, what it spent in its current period.
    pub budgets: Vec<BudgetSpend>,
    /// Per AccessGrant id (`namespace/name`), what its members used this
    /// month together (at most [`MAX_REPORTED_GRANTS`]; absent from an
    /// older pod's report, and ignored by an older operator).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: BTreeMap<String, UsageTotals>,
}

/// The prefix under which a grant's month usage is kept beside keys' in
/// the operator's ledger (`grant:<namespace>/<name>`): never a key id,
/// which has no `:`.
pub const GRANT_USAGE_PREFIX: &str = "grant:";

/// What the operator hands back to the pods: per budget, the fleet's total
/// in its current period, and per process the report of its that the
/// totals hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UsageBaseline {
    /// The budgets' totals over every process, gone ones included.
    pub budgets: Vec<BudgetSpend>,
    /// Per live process, the sequence of its report in `budgets`.
    pub reports: BTreeMap<String, u64>,
}

impl UsageBaseline {
    /// The document in a ConfigMap (untrusted bytes: anything else is
    /// refused with the parser's message).
    ///
    /// # Errors
    /// Not such a document.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// `ApiKey.status.usage`: what the key used this month over every
/// Gateway that serves it, as the operator last collected it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyUsageStatus {
    /// The month (`2026-11`), in the Gateway's budget time zone.
    pub period: String,
    /// Requests that reached a model.
    pub requests: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the upstream's cache (part of `inputTokens`).
    pub cached_input_tokens: u64,
    /// Cost at the models' prices, as a decimal string.
    pub cost: String,
    /// The currency of `cost`.
    pub currency: String,
    /// When it was collected (RFC 3339).
    pub as_of: String,
}

/// `AccessGrant.status.usage`: what the grant's members used this month
/// together over every Gateway that serves it, as the operator last
/// collected it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantUsageStatus {
    /// Requests, tokens and cost, as an ApiKey's.
    #[serde(flatten)]
    pub used: KeyUsageStatus,
    /// How many members spent from their own (`perUser`) budgets in the
    /// budgets' current period, summed over the Gateways (each keeps the
    /// 4,000 spends, in turns by namespace). Absent when the grant sets no `perUser`
    /// budget: members are counted only where each has a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<u64>,
}

/// What one namespace's keys used this month on a Gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceUsage {
    /// The namespace.
    pub namespace: String,
    /// Requests that reached a model.
    pub requests: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the upstream's cache.
    pub cached_input_tokens: u64,
    /// Cost, as a decimal string.
    pub cost: String,
}

/// `Gateway.status.usage`: this month's usage per namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayUsageStatus {
    /// The month (`2026-11`), in `spec.budgets.timeZone`.
    pub period: String,
    /// The currency of the costs.
    pub currency: String,
    /// When it was collected (RFC 3339).
    pub as_of: String,
    /// Per namespace with usage, sorted (at most [`MAX_STATUS_NAMESPACES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceUsage>,
    /// Pods whose last usage report the operator refused (it broke a
    /// rule: too large, too many keys, a key this Gateway does not serve,
    /// a number out of bounds), sorted by pod, at most 16. Nothing of a refused report is counted;
    /// the pod's last accepted report still is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_reports: Vec<RefusedUsageReport>,
}

/// A pod whose usage report was refused, and why.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefusedUsageReport {
    /// The pod.
    pub pod: String,
    /// Why, in CamelCase (`ReportTooLarge`, `TooManyKeys`, `ForeignKey`,
    /// `OutOfBounds`, `ForeignInstance`, `Malformed`).
    pub reason: String,
    /// For a person.
    pub message: String,
}

/// The most pods `Gateway.status.usage.refusedReports` lists.
pub const MAX_STATUS_REFUSED: usize = 16;

/// The most namespaces `Gateway.status.usage` lists (the status stays small).
pub const MAX_STATUS_NAMESPACES: usize = 500;

impl UsageTotals {
    /// As `ApiKey.status.usage` shows it.
    pub fn key_status(&self, period: &str, currency: &str, as_of: &str) -> KeyUsageStatus {
        KeyUsageStatus {
            period: period.to_owned(),
            requests: self.requests,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cached_input_tokens: self.cached_input_tokens,
            cost: crate::money::Money(self.cost_nanos).to_string(),
            currency: currency.to_owned(),
            as_of: as_of.to_owned(),
        }
    }

    /// As a namespace's line of `Gateway.status.usage`.
    pub fn namespace_status(&self, namespace: &str) -> NamespaceUsage {
        NamespaceUsage {
            namespace: namespace.to_owned(),
            requests: self.requests,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cached_input_tokens: self.cached_input_tokens,
            cost: crate::money::Money(self.cost_nanos).to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    #[test]
    fn totals_add_and_subtract_without_wrapping() {
        let a = UsageTotals { requests: 2, input_tokens: 10, output_tokens: 5, cached_input_tokens: 1, cost_nanos: 7 };
        let max = UsageTotals { requests: u64::MAX, ..UsageTotals::default() };
        assert_eq!(a.plus(max).requests, u64::MAX);
        assert_eq!(a.minus(max), UsageTotals { requests: 0, ..a });
        assert_eq!(a.plus(a).minus(a), a);
        assert!(UsageTotals::default().is_empty() && !a.is_empty());
    }

    #[test]
    fn members_are_kept_in_turns_by_namespace_so_one_team_cannot_push_the_others_out() {
        let spend = |grant: &str, user: usize, tokens| BudgetSpend {
            scope: BudgetScope::member_of(grant, &format!("u{user}")),
            period: Period::Day,
            window: "2026-11-26".into(),
            tokens,
            cost_nanos: 0,
        };
        // Team A: 1,000 members over two grants, each spending a lot;
        // team B: three members spending little.
        let mut items: Vec<BudgetSpend> = (0..1_000)
            .map(|user| spend(if user % 2 == 0 { "team-a/x" } else { "team-a/y" }, user, 1_000_000 + user as u64))
            .collect();
        items.extend([spend("team-b/devs", 1, 30), spend("team-b/devs", 2, 20), spend("team-b/devs", 3, 10)]);
        let order = fair_member_order(&items, |s| s.scope.as_str(), |s| (s.tokens, s.cost_nanos));
        assert_eq!(order.len(), items.len());
        let kept: Vec<&BudgetSpend> = order[..6].iter().map(|&i| &items[i]).collect();
        let of_b: Vec<u64> = kept.iter().filter(|s| s.scope.contains("team-b")).map(|s| s.tokens).collect();
        assert_eq!(of_b, [30, 20, 10], "B's members are kept in turn with A's, largest first: {kept:?}");
        // A's turns go to its largest spenders, whichever grant.
        assert!(kept.iter().filter(|s| s.scope.contains("team-a")).all(|s| s.tokens >= 1_000_997));
        // The same items in another order: the same order.
        let mut reversed = items.clone();
        reversed.reverse();
        let again: Vec<&BudgetSpend> = fair_member_order(&reversed, |s| s.scope.as_str(), |s| (s.tokens, s.cost_nanos))
            .into_iter()
            .map(|i| &reversed[i])
            .collect();
        assert_eq!(again, order.iter().map(|&i| &items[i]).collect::<Vec<_>>());
    }

    #[test]
    fn a_report_reads_back_as_written() {
        let report = UsageReport {
            instance: "gw-abc-1".into(),
            sequence: 3,
            month: "2026-11".into(),
            keys: [("team-a/alice".to_owned(), UsageTotals { requests: 1, ..UsageTotals::default() })].into(),
            budgets: vec![BudgetSpend {
                scope: "tenant:team-a".into(),
                period: Period::Day,
                window: "2026-11-26".into(),
                tokens: 40,
                cost_nanos: 0,
            }],
            grants: [("team-a/devs".to_owned(), UsageTotals { requests: 2, ..UsageTotals::default() })].into(),
        };
        let text = serde_json::to_string(&report).unwrap();
        assert!(text.contains(r#""team-a/alice":{"requests":1}"#), "zero counts are left out: {text}");
        assert_eq!(serde_json::from_str::<UsageReport>(&text).unwrap(), report);
        assert!(UsageBaseline::from_slice(b"{\"budgets\":7}").is_err());
    }

    #[test]
    fn budget_scopes_read_one_way_only() {
        assert_eq!(BudgetScope::parse("key:team-a/alice"), Some(BudgetScope::Key("team-a/alice")));
        assert_eq!(BudgetScope::parse("tenant:team-a"), Some(BudgetScope::Tenant("team-a")));
        assert_eq!(BudgetScope::parse("grant:team-a/devs"), Some(BudgetScope::Grant("team-a/devs")));
        let alice = BudgetScope::member_of("team-a/devs", "alice@example.com");
        let digest = &alice[alice.len() - 32..];
        assert_eq!(BudgetScope::parse(&alice), Some(BudgetScope::Member { grant: "team-a/devs", digest }));
        assert!(!alice.contains("alice@"), "{alice}");
        assert_ne!(alice, BudgetScope::member_of("team-a/devs", "bob@example.com"));
        let upper = format!("user:team-a/devs:{}", digest.to_uppercase());
        for refused in ["", "alice", "team:x", "user:team-a/devs:abc", upper.as_str(), "user:team-a/devs"] {
            assert_eq!(BudgetScope::parse(refused), None, "{refused}");
        }
    }
}
