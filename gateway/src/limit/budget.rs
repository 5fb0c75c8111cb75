//! Budgets: what a key, or a namespace's keys together, may spend per
//! calendar period, in tokens and in money. Enforced like the token limits:
//! a request reserves its worst case at admission (its token reservation,
//! and that many tokens at the model's prices), and settles what it used
//! when it ends; a request the upstream failed gives everything back.
//!
//! ```text
//! admission ─► each budget: spent + reserved + this request's worst case ≤ the budget? ─► reserve
//!                           (no: 429 insufficient_quota, Retry-After until the period starts over)
//! the end   ─► reserved − worst case, spent + used (tokens, cost)
//! ```
//!
//! Counted here (this pod's share of each budget: the budget divided by
//! the live pods, as the rate limits are) or in Redis (the whole fleet,
//! exactly: `redis_scripts.rs`). A period starts over at local midnight
//! of its first day in the Gateway's time zone (`waycast_crds::period`);
//! the state of a budget is carried from config to config by its scope and
//! period, so a config change never starts a period over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use waycast_crds::money::Money;
use waycast_crds::period::Period;
use waycast_crds::spend::BudgetConfig;

use super::period_clock::{PeriodClock, add, sub};

/// One budget of a key or a tenant, as a config sets it.
#[derive(Debug, Clone)]
pub struct Budget {
    /// The calendar period.
    pub period: Period,
    /// Tokens in the period.
    pub tokens: Option<u64>,
    /// Nano-units in the period.
    pub cost: Option<u64>,
    /// What it has counted in the current period (kept across configs).
    pub state: Arc<BudgetState>,
}

impl Budget {
    /// `config`'s budget with the carried `state` (the config was checked:
    /// an amount that does not parse counts as none).
    pub fn new(config: &BudgetConfig, state: Arc<BudgetState>) -> Self {
        let cost = config.cost.as_deref().and_then(|text| Money::parse(text).ok()).map(|money| money.0);
        Self { period: config.period, tokens: config.tokens, cost, state }
    }

    /// The budgets of `configs`, one per period (two of one period — a
    /// token budget and a cost budget of a day, say — are one budget with
    /// the tighter of each), each with its state from `state_of`.
    pub fn merged(configs: &[BudgetConfig], mut state_of: impl FnMut(Period) -> Arc<BudgetState>) -> Box<[Budget]> {
        let mut budgets: Vec<Budget> = Vec::new();
        for config in configs {
            let wanted = Budget::new(config, Arc::default());
            match budgets.iter_mut().find(|budget| budget.period == config.period) {
                Some(budget) => {
                    budget.tokens = tighter(budget.tokens, wanted.tokens);
                    budget.cost = tighter(budget.cost, wanted.cost);
                }
                None => budgets.push(Budget { state: state_of(config.period), ..wanted }),
            }
        }
        budgets.into_boxed_slice()
    }
}

impl Budget {
    /// How much of it the fleet has spent in the period that holds `now`:
    /// the larger of its token and cost parts (1.0 is all of it).
    pub fn used_ratio(&self, now: Timestamp, zone: &TimeZone) -> f64 {
        let (tokens, cost) = self.state.spent_in_fleet(self.period, now, zone);
        // A ratio for a dashboard: precision past 2^53 is of no matter.
        #[allow(clippy::cast_precision_loss)]
        let part = |spent: u64, limit: Option<u64>| limit.map_or(0.0, |limit| spent as f64 / limit.max(1) as f64);
        part(tokens, self.tokens).max(part(cost, self.cost))
    }
}

fn tighter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A budget's counts in its current period.
#[derive(Debug, Default)]
pub struct BudgetState {
    clock: PeriodClock,
    spent_tokens: AtomicU64,
    spent_cost: AtomicU64,
    reserved_tokens: AtomicU64,
    reserved_cost: AtomicU64,
    /// What the rest of the fleet had spent when the operator last
    /// collected (`waycast_crds::usage`); none in a standalone gateway.
    fleet: ArcSwapOption<FleetSpend>,
}

/// A budget's spend over the whole fleet as the operator last collected
/// it, and what of it this process had spent then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FleetSpend {
    /// The period it is of (its first instant).
    pub start: i64,
    /// Tokens and nano-units spent by every process.
    pub total: (u64, u64),
    /// Of which this process's.
    pub mine: (u64, u64),
}

/// What one request reserved in one budget.
#[derive(Debug)]
pub(super) struct Reserved {
    state: Arc<BudgetState>,
    period: Period,
    /// The period it was reserved in (its start).
    start: i64,
    tokens: u64,
    cost: u64,
}

/// A request's worst case: its token reservation, and its cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Need {
    /// Tokens.
    pub tokens: u64,
    /// Nano-units.
    pub cost: u64,
}

/// Whose budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetOwner {
    /// The API key's.
    Key,
    /// Its namespace's: every key of the namespace together.
    Tenant,
    /// One member's of a grant (a token's holder, each on their own).
    User,
}

/// Why a budget refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    /// Whose budget.
    pub owner: BudgetOwner,
    /// Its period.
    pub period: Period,
    /// When the period starts over.
    pub resets_at: Timestamp,
    /// What ran out: `tokens` or `cost`.
    pub what: &'static str,
}

impl Exhausted {
    /// The `decision` label of `waycast_gateway_rate_limit_requests_total`.
    pub fn label(&self) -> &'static str {
        match (self.owner, self.what) {
            (BudgetOwner::Key, "tokens") => "key_budget_tokens",
            (BudgetOwner::Key, _) => "key_budget_cost",
            (BudgetOwner::Tenant, "tokens") => "tenant_budget_tokens",
            (BudgetOwner::Tenant, _) => "tenant_budget_cost",
            (BudgetOwner::User, "tokens") => "user_budget_tokens",
            (BudgetOwner::User, _) => "user_budget_cost",
        }
    }

    /// For the error message: "the API key's daily token budget".
    pub fn describe(&self) -> String {
        let owner = match self.owner {
            BudgetOwner::Key => "API key's",
            BudgetOwner::Tenant => "namespace's",
            BudgetOwner::User => "per-person",
        };
        let period = match self.period {
            Period::Day => "daily",
            Period::Week => "weekly",
            Period::Month => "monthly",
        };
        let what = if self.what == "tokens" { "token" } else { "spending" };
        format!("the {owner} {period} {what} budget")
    }

    /// Seconds until the period starts over (at least 1).
    pub fn retry_after_seconds(&self, now: Timestamp) -> u64 {
        u64::try_from(self.resets_at.as_second().saturating_sub(now.as_second())).unwrap_or(0).max(1)
    }
}

impl BudgetState {
    fn current(&self, period: Period, now: Timestamp, zone: &TimeZone) -> (i64, i64) {
        let counts = [&self.spent_tokens, &self.spent_cost, &self.reserved_tokens, &self.reserved_cost];
        self.clock.current(period, now, zone, &counts)
    }

    /// Whether the period it counts has ended by `now` (its counts can go:
    /// nothing reserved in it is given back into a newer one).
    pub fn ended(&self, now: Timestamp) -> bool {
        self.clock.ended(now)
    }

    /// The first instant of the period it counts (0 before any count).
    pub fn period_start(&self) -> i64 {
        self.clock.start()
    }

    /// What the fleet spent in the `period` that holds `now`: the rest of
    /// the fleet's as last collected, and this process's own.
    pub fn spent_in_fleet(&self, period: Period, now: Timestamp, zone: &TimeZone) -> (u64, u64) {
        let (start, _) = self.current(period, now, zone);
        let fleet = self.fleet.load().as_deref().copied().filter(|fleet| fleet.start == start).unwrap_or_default();
        let (tokens, cost) = self.spent();
        (
            fleet.total.0.saturating_sub(fleet.mine.0).saturating_add(tokens),
            fleet.total.1.saturating_sub(fleet.mine.1).saturating_add(cost),
        )
    }

    /// The fleet's spend as last collected (replacing the one before).
    pub fn set_fleet(&self, spend: FleetSpend) {
        self.fleet.store(Some(Arc::new(spend)));
    }

    /// Whether `limit` holds what this process counts (`spent`, with
    /// `reserved` and the request's worst case already in it) beside what
    /// the rest of the fleet spent by the last collection (`fleet`), and
    /// this process keeps to its share of what was left then. Without a
    /// collection this is the share of the budget: each of `shares` pods
    /// may count `limit / shares`. With one, the fleet's total holds a
    /// process's spend across restarts and scale-ups (a new process starts
    /// from the total, not from nothing), and since each process spends at
    /// most its share of what was left, the fleet never passes the limit
    /// however late the next collection comes.
    fn fits(limit: u64, spent: u64, reserved: u64, fleet: (u64, u64), shares: u32) -> bool {
        let (total, mine) = fleet;
        let others = total.saturating_sub(mine);
        let since = spent.saturating_sub(mine).saturating_add(reserved);
        let left_at_collection = limit.saturating_sub(total);
        others.saturating_add(spent).saturating_add(reserved) <= limit
            && since <= left_at_collection / u64::from(shares.max(1))
    }

    /// Spent and reserved, in tokens and nano-units.
    pub fn counted(&self) -> (u64, u64) {
        let tokens =
            self.spent_tokens.load(Ordering::Relaxed).saturating_add(self.reserved_tokens.load(Ordering::Relaxed));
        let cost = self.spent_cost.load(Ordering::Relaxed).saturating_add(self.reserved_cost.load(Ordering::Relaxed));
        (tokens, cost)
    }

    /// Spent in the current period: tokens, nano-units.
    pub fn spent(&self) -> (u64, u64) {
        (self.spent_tokens.load(Ordering::Relaxed), self.spent_cost.load(Ordering::Relaxed))
    }
}

/// Reserves `need` in every budget of `budgets` (whose owner each is),
/// each pod counting `1 / shares` of each budget; all or none.
///
/// # Errors
/// The first budget it does not fit, with when that period starts over.
pub(super) fn reserve(
    budgets: &[(BudgetOwner, &[Budget])],
    need: Need,
    shares: u32,
    now: Timestamp,
    zone: &TimeZone,
) -> Result<Vec<Reserved>, Exhausted> {
    let mut reserved: Vec<Reserved> = Vec::new();
    for (owner, list) in budgets {
        for budget in *list {
            let (start, end) = budget.state.current(budget.period, now, zone);
            // Taken first and checked after (given back when over), so
            // requests racing for the last room can both be refused but
            // never both admitted past the budget.
            let taken = Reserved {
                state: budget.state.clone(),
                period: budget.period,
                start,
                tokens: if budget.tokens.is_some() { need.tokens } else { 0 },
                cost: if budget.cost.is_some() { need.cost } else { 0 },
            };
            let state = &budget.state;
            add(&state.reserved_tokens, taken.tokens);
            add(&state.reserved_cost, taken.cost);
            let fleet = state.fleet.load().as_deref().copied().filter(|fleet| fleet.start == start).unwrap_or_default();
            let fits = |limit: Option<u64>, spent: &AtomicU64, reserved: &AtomicU64, fleet: (u64, u64)| {
                limit.is_none_or(|limit| {
                    let (spent, reserved) = (spent.load(Ordering::Relaxed), reserved.load(Ordering::Relaxed));
                    BudgetState::fits(limit, spent, reserved, fleet, shares)
                })
            };
            let over =
                if !fits(budget.tokens, &state.spent_tokens, &state.reserved_tokens, (fleet.total.0, fleet.mine.0)) {
                    Some("tokens")
                } else if !fits(budget.cost, &state.spent_cost, &state.reserved_cost, (fleet.total.1, fleet.mine.1)) {
                    Some("cost")
                } else {
                    None
                };
            if let Some(what) = over {
                taken.give_back();
                for taken in reserved {
                    taken.give_back();
                }
                let resets_at = Timestamp::from_second(end).unwrap_or(Timestamp::MAX);
                return Err(Exhausted { owner: *owner, period: budget.period, resets_at, what });
            }
            reserved.push(taken);
        }
    }
    Ok(reserved)
}

impl Reserved {
    /// Takes the reservation back (in the period it was made in; a period
    /// that has started over since holds none of it).
    fn give_back(&self) {
        if self.state.period_start() == self.start {
            sub(&self.state.reserved_tokens, self.tokens);
            sub(&self.state.reserved_cost, self.cost);
        }
    }

    /// The request used `tokens` and cost `cost` by `now`: the reservation
    /// goes, the use is spent in the period that holds `now` (what a
    /// request spends across midnight counts in the period it ended in).
    pub(super) fn settle(&self, tokens: u64, cost: u64, now: Timestamp, zone: &TimeZone) {
        self.give_back();
        if tokens == 0 && cost == 0 {
            return;
        }
        self.state.current(self.period, now, zone);
        add(&self.state.spent_tokens, tokens);
        add(&self.state.spent_cost, cost);
    }
}

/// What a request reserved in its budgets, settled once when it ends; one
/// dropped unsettled (the request never got that far) gives everything back.
#[derive(Debug, Default)]
pub struct BudgetHold {
    pub(super) local: Vec<Reserved>,
    /// The zone the local budgets' periods are in.
    pub(super) zone: Option<TimeZone>,
    pub(super) redis: Option<super::redis::RedisSpend>,
    settled: std::cell::Cell<bool>,
}

impl BudgetHold {
    /// Holds `local` reservations, whose periods are in `zone`.
    pub(super) fn local(local: Vec<Reserved>, zone: &TimeZone) -> Self {
        Self { local, zone: Some(zone.clone()), redis: None, settled: std::cell::Cell::new(false) }
    }

    /// The request used `tokens` and cost `cost` (nano-units).
    pub fn settle(&self, tokens: u64, cost: u64) {
        if self.settled.replace(true) {
            return;
        }
        if let Some(zone) = self.zone.as_ref().filter(|_| !self.local.is_empty()) {
            let now = Timestamp::now();
            for reserved in &self.local {
                reserved.settle(tokens, cost, now, zone);
            }
        }
        if let Some(spend) = &self.redis {
            spend.settle(tokens, cost);
        }
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        self.settle(0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::BudgetOwner;
    use super::*;

    fn budget(period: Period, tokens: Option<u64>, cost: Option<&str>) -> Budget {
        Budget::new(&BudgetConfig { period, tokens, cost: cost.map(str::to_owned) }, Arc::new(BudgetState::default()))
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_budget_holds_its_reservations_and_spends_what_was_used() {
        let utc = TimeZone::UTC;
        let day = [budget(Period::Day, Some(1_000), None)];
        let budgets = [(BudgetOwner::Key, &day[..])];
        let now = at("2026-11-26T10:00:00Z");
        let need = Need { tokens: 400, cost: 0 };
        let first = reserve(&budgets, need, 1, now, &utc).unwrap();
        let second = reserve(&budgets, need, 1, now, &utc).unwrap();
        // 800 reserved: a third worst case of 400 does not fit.
        let refused = reserve(&budgets, need, 1, now, &utc).unwrap_err();
        assert_eq!((refused.owner, refused.what), (BudgetOwner::Key, "tokens"));
        assert_eq!(refused.resets_at, at("2026-11-27T00:00:00Z"));
        assert_eq!(refused.retry_after_seconds(now), 14 * 3600);
        // They used far less than they reserved: room again.
        for reserved in first.iter().chain(&second) {
            reserved.settle(50, 0, now, &utc);
        }
        assert_eq!(day[0].state.spent(), (100, 0));
        assert!(reserve(&budgets, need, 1, now, &utc).is_ok());
        // A failed request gives its reservation back, spending nothing.
        let failed = reserve(&budgets, Need { tokens: 300, cost: 0 }, 1, now, &utc).unwrap();
        failed[0].settle(0, 0, now, &utc);
        assert_eq!(day[0].state.counted(), (500, 0), "100 spent + the 400 still reserved");
    }

    #[test]
    fn a_period_starts_over_at_local_midnight_and_a_refusal_reserves_nothing() {
        let berlin = waycast_crds::period::time_zone("Europe/Berlin").unwrap();
        let key = [budget(Period::Day, Some(100), None), budget(Period::Month, None, Some("1.00"))];
        let tenant = [budget(Period::Month, Some(1_000_000), None)];
        let budgets = [(BudgetOwner::Key, &key[..]), (BudgetOwner::Tenant, &tenant[..])];
        let late = at("2026-11-26T22:30:00Z"); // 23:30 in Berlin
        let spent = reserve(&budgets, Need { tokens: 90, cost: 0 }, 1, late, &berlin).unwrap();
        for reserved in &spent {
            reserved.settle(90, 0, late, &berlin);
        }
        let refused = reserve(&budgets, Need { tokens: 20, cost: 0 }, 1, late, &berlin).unwrap_err();
        assert_eq!(refused.resets_at, at("2026-11-26T23:00:00Z"), "Berlin's midnight");
        assert_eq!(tenant[0].state.counted(), (90, 0), "refused by the key's budget: nothing reserved in the tenant's");
        // Past midnight in Berlin: the day starts over, the month does not.
        let after = at("2026-11-26T23:00:01Z");
        let next = reserve(&budgets, Need { tokens: 20, cost: 0 }, 1, after, &berlin).unwrap();
        assert_eq!(key[0].state.counted(), (20, 0));
        assert_eq!(tenant[0].state.counted(), (110, 0));
        // The cost budget: 1.00 of money.
        let dear = Need { tokens: 1, cost: Money::parse("0.60").unwrap().0 };
        let paid = reserve(&[(BudgetOwner::Key, &key[1..])], dear, 1, after, &berlin).unwrap();
        let refused = reserve(&[(BudgetOwner::Key, &key[1..])], dear, 1, after, &berlin).unwrap_err();
        assert_eq!((refused.what, refused.period), ("cost", Period::Month));
        drop((next, paid));
    }

    #[test]
    fn each_pod_counts_its_share() {
        let month = [budget(Period::Month, Some(1_000), None)];
        let budgets = [(BudgetOwner::Tenant, &month[..])];
        let now = at("2026-11-26T10:00:00Z");
        let need = Need { tokens: 100, cost: 0 };
        let admitted = (0..10).filter(|_| reserve(&budgets, need, 4, now, &TimeZone::UTC).is_ok()).count();
        assert_eq!(admitted, 2, "250 of 1,000 for each of 4 pods");
    }

    #[test]
    fn a_spend_after_midnight_counts_in_the_new_day_and_racing_turns_keep_the_counts() {
        let utc = TimeZone::UTC;
        let day = [budget(Period::Day, Some(1_000), None)];
        let budgets = [(BudgetOwner::Key, &day[..])];
        let evening = at("2026-11-26T23:59:00Z");
        let open = reserve(&budgets, Need { tokens: 400, cost: 0 }, 1, evening, &utc).unwrap();
        // It ends after midnight, before any other request turned the day.
        let morning = at("2026-11-27T00:01:00Z");
        open[0].settle(300, 0, morning, &utc);
        assert_eq!(day[0].state.spent(), (300, 0), "spent in the new day");
        // A turn seen late (a clock read before midnight) does not wipe it.
        let late = reserve(&budgets, Need { tokens: 100, cost: 0 }, 1, evening, &utc).unwrap();
        assert_eq!(day[0].state.counted(), (400, 0));
        late[0].settle(0, 0, evening, &utc);
        assert_eq!(day[0].state.counted(), (300, 0), "given back into the day it was counted in");
        assert!(!day[0].state.ended(morning) && day[0].state.ended(at("2026-11-28T00:00:00Z")));
    }

    #[test]
    fn usage_beyond_any_number_saturates_and_a_dimension_without_a_limit_reserves_nothing() {
        let utc = TimeZone::UTC;
        let now = at("2026-11-26T10:00:00Z");
        let tokens_only = [budget(Period::Month, Some(1_000), None)];
        let budgets = [(BudgetOwner::Key, &tokens_only[..])];
        let huge = Need { tokens: 10, cost: u64::MAX };
        let held = reserve(&budgets, huge, 1, now, &utc).unwrap();
        assert_eq!(tokens_only[0].state.counted(), (10, 0), "no cost limit: no cost reserved");
        held[0].settle(5, 5, now, &utc);
        let more = reserve(&budgets, Need { tokens: 10, cost: 0 }, 1, now, &utc).unwrap();
        more[0].settle(u64::MAX, u64::MAX, now, &utc);
        let again = reserve(&budgets, huge, 1, now, &utc).unwrap_err();
        assert_eq!(again.what, "tokens");
        assert_eq!(tokens_only[0].state.spent(), (u64::MAX, u64::MAX), "saturated, not wrapped");
    }

    #[test]
    fn with_the_fleets_spend_a_process_keeps_to_its_share_of_what_was_left() {
        let utc = TimeZone::UTC;
        let now = at("2026-11-26T10:00:00Z");
        let day = [budget(Period::Day, Some(1_000), None)];
        let budgets = [(BudgetOwner::Key, &day[..])];
        let start = Period::Day.window(now, &utc).start.as_second();
        // The fleet spent 600, 100 of it this process's; two pods live.
        day[0].state.current(Period::Day, now, &utc);
        let spent = reserve(&budgets, Need { tokens: 100, cost: 0 }, 1, now, &utc).unwrap();
        spent[0].settle(100, 0, now, &utc);
        day[0].state.set_fleet(FleetSpend { start, total: (600, 0), mine: (100, 0) });
        assert_eq!(day[0].state.spent_in_fleet(Period::Day, now, &utc), (600, 0));
        // 400 were left: this process may spend 200 more of them.
        let need = Need { tokens: 50, cost: 0 };
        let admitted = (0..10).filter_map(|_| reserve(&budgets, need, 2, now, &utc).ok()).count();
        assert_eq!(admitted, 4, "200 of the 400 left, at 50 each");
        // A fleet's spend of another day is not counted.
        day[0].state.set_fleet(FleetSpend { start: start - 86_400, total: (900, 0), mine: (0, 0) });
        assert_eq!(day[0].state.spent_in_fleet(Period::Day, now, &utc), (100, 0));
        // Past the budget in total, nothing more, whatever the share.
        day[0].state.set_fleet(FleetSpend { start, total: (1_000, 0), mine: (100, 0) });
        assert!(reserve(&budgets, Need { tokens: 1, cost: 0 }, 1, now, &utc).is_err());
    }

    #[test]
    fn a_refusal_gives_back_what_the_request_reserved_in_budgets_checked_before() {
        let utc = TimeZone::UTC;
        let now = at("2026-11-26T10:00:00Z");
        let key = [budget(Period::Day, Some(1_000), None)];
        let tenant = [budget(Period::Month, Some(50), None)];
        let budgets = [(BudgetOwner::Key, &key[..]), (BudgetOwner::Tenant, &tenant[..])];
        let refused = reserve(&budgets, Need { tokens: 60, cost: 0 }, 1, now, &utc).unwrap_err();
        assert_eq!(refused.owner, BudgetOwner::Tenant);
        assert_eq!(key[0].state.counted(), (0, 0), "the key's reservation was given back");
        assert_eq!(tenant[0].state.counted(), (0, 0));
    }

    #[test]
    fn budgets_of_one_period_are_one_with_the_tighter_of_each() {
        let configs = [
            BudgetConfig { period: Period::Day, tokens: Some(100), cost: Some("1".into()) },
            BudgetConfig { period: Period::Month, tokens: Some(7), cost: None },
            BudgetConfig { period: Period::Day, tokens: Some(50), cost: Some("2".into()) },
        ];
        let merged = Budget::merged(&configs, |_| Arc::new(BudgetState::default()));
        assert_eq!(merged.len(), 2);
        assert_eq!((merged[0].period, merged[0].tokens, merged[0].cost), (Period::Day, Some(50), Some(1_000_000_000)));
        assert_eq!((merged[1].period, merged[1].tokens), (Period::Month, Some(7)));
    }
}
