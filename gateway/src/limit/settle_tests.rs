//! `settle` as a table: what a request held and how it ended in, what was
//! settled out — and what each count it held says afterwards. No metrics
//! registry, no server: the counts are the in-memory ones a request holds.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use waycast_crds::config::LimitsConfig;
use waycast_crds::money::{Money, TokenPrices};
use waycast_crds::period::Period;
use waycast_crds::spend::BudgetConfig;
use waycast_crds::usage::UsageTotals;

use super::super::budget::{self, Budget, BudgetHold, BudgetOwner, Need};
use super::super::charge::{Charged, Ending, Relayed, Reservation};
use super::super::key_usage::KeyUsage;
use super::super::limiter::LimitSet;
use super::super::local;
use super::super::pricing::Priced;
use super::*;

/// 400 request bytes (a prompt estimate of 100 tokens), 50 output tokens
/// bound.
const RESERVATION: Reservation =
    Reservation { tokens: 150, request_bytes: 400, body_bytes: 400, output: 50, free: false, media_answer: false };
/// Tokens per minute of the key's token limit.
const TOKEN_LIMIT: u64 = 1_000;

/// What a row's request holds.
#[derive(Clone, Copy, Default)]
struct Holds {
    /// The key's token limit.
    limit: bool,
    /// A daily budget of tokens and money.
    budget: bool,
    /// Its key's month.
    month: bool,
    /// Its model's prices' currency (the budgets count in USD).
    priced: Option<&'static str>,
}

const NOTHING: Holds = Holds { limit: false, budget: false, month: false, priced: None };
const MONTH: Holds = Holds { month: true, ..NOTHING };
const ALL: Holds = Holds { limit: true, budget: true, month: true, priced: Some("USD") };

/// A request holding `holds`, and the counts it holds, to read afterwards.
struct Request {
    held: Held,
    limit: Option<Arc<LimitSet>>,
    budget: Option<Budget>,
    month: Option<Arc<KeyUsage>>,
}

/// $1 per million input tokens, $2 per million output tokens, $0.50 per
/// million cached.
fn prices(currency: &str) -> Priced {
    let prices = TokenPrices { input: 1_000_000_000, output: 2_000_000_000, cached_input: 500_000_000 };
    Priced::of(&(prices, Arc::from(currency)), "USD", Arc::clone)
}

fn holding(holds: Holds) -> Request {
    let priced = holds.priced.map(prices);
    let mut held = Held { reservation: Some(RESERVATION), ..Held::default() };
    let limit = holds.limit.then(|| {
        let limits =
            LimitsConfig { requests_per_minute: None, tokens_per_minute: Some(TOKEN_LIMIT), max_concurrent: None };
        let set = Arc::new(LimitSet::new(&limits, None));
        let sets = local::Sets { key: Some(&set), tenant: None, model: None, user: None };
        held.charge = local::admit(sets, 1, RESERVATION, None).unwrap().charge;
        set
    });
    let budget = holds.budget.then(|| {
        let config = BudgetConfig { period: Period::Day, tokens: Some(1_000_000), cost: Some("100.00".into()) };
        let budget = Budget::new(&config, Arc::default());
        let cost = priced.as_ref().map_or(0, |priced| priced.worst_case(RESERVATION).0);
        let need = Need { tokens: RESERVATION.tokens, cost };
        let owned = [(BudgetOwner::Key, std::slice::from_ref(&budget))];
        let reserved = budget::reserve(&owned, need, 1, Timestamp::now(), &TimeZone::UTC).unwrap();
        held.budget = Some(Box::new(BudgetHold::local(reserved, &TimeZone::UTC)));
        budget
    });
    let month = holds.month.then(|| {
        let counts = Arc::new(KeyUsage::default());
        held.month = Some(Month { counts: counts.clone(), zone: TimeZone::UTC });
        counts
    });
    held.priced = priced;
    Request { held, limit, budget, month }
}

/// Tokens the key's token limit has left.
fn tokens_left(limit: &Arc<LimitSet>) -> u64 {
    let sets = local::Sets { key: Some(limit), tenant: None, model: None, user: None };
    let reservation = Reservation::default();
    local::admit(sets, 1, reservation, None).unwrap().headers.tokens.map(|(_, verdict)| verdict.remaining).unwrap()
}

fn ended(ending: Ending, usage: Option<(u64, u64, u64)>, bytes: u64, events: Option<u64>) -> Ended {
    Ended { ending, usage, relayed: Relayed { bytes, events } }
}

fn charged(prompt: u64, cached: u64, completion: u64) -> Charged {
    Charged { prompt, cached, completion }
}

#[test]
fn settle_table() {
    let at = "2026-11-26T10:00:00Z".parse::<Timestamp>().unwrap();
    let wall = Wall::at(Duration::from_secs(u64::try_from(at.as_second()).unwrap()));
    let whole = ended(Ending::Whole, Some((30, 10, 20)), 1_000, None);
    // (row, held, ended, tokens recorded, tokens limited, cost in nano-units)
    type Row = (&'static str, Holds, Ended, Charged, Option<u64>, Option<u64>);
    let rows: [Row; 10] = [
        // Nothing counts it: the record says what the response reported,
        // uncapped (nothing was charged).
        (
            "nothing held",
            NOTHING,
            ended(Ending::Whole, Some((9_000, 0, 5_000)), 10, None),
            charged(9_000, 0, 5_000),
            None,
            None,
        ),
        ("nothing held, no usage", NOTHING, ended(Ending::Whole, None, 1_000, None), charged(0, 0, 0), None, None),
        ("its month, answered whole", MONTH, whole, charged(30, 10, 20), None, None),
        // 20 uncached × $1/M + 10 cached × $0.50/M + 20 × $2/M.
        ("priced, answered whole", ALL, whole, charged(30, 10, 20), Some(50), Some(65_000)),
        (
            "priced in another currency",
            Holds { priced: Some("EUR"), ..MONTH },
            whole,
            charged(30, 10, 20),
            None,
            Some(65_000),
        ),
        (
            "the upstream failed it",
            ALL,
            ended(Ending::Unserved, Some((30, 0, 20)), 0, None),
            charged(0, 0, 0),
            Some(0),
            Some(0),
        ),
        // Left before the head: the prompt estimate and the output bound.
        (
            "left before the head",
            ALL,
            ended(Ending::Unfinished, None, 0, None),
            charged(100, 0, 50),
            Some(150),
            Some(200_000),
        ),
        // A stream cut short: a token per event relayed.
        (
            "a stream cut short",
            ALL,
            ended(Ending::Cancelled, None, 300, Some(7)),
            charged(100, 0, 7),
            Some(107),
            Some(114_000),
        ),
        // More than is plausible: a prompt token per request byte plus the
        // allowance, a completion token per byte relayed.
        (
            "implausible usage",
            Holds { limit: false, ..ALL },
            ended(Ending::Whole, Some((100_000, 0, 5_000)), 1_000, None),
            charged(400 + 8_192, 0, 1_000),
            None,
            Some(8_592_000 + 2_000_000),
        ),
        ("its budget alone", Holds { budget: true, ..NOTHING }, whole, charged(30, 10, 20), None, None),
    ];
    for (name, holds, ended, tokens, limited, cost) in rows {
        let request = holding(holds);
        let settled = settle(&request.held, ended, &wall);
        let currency = holds.priced.filter(|_| cost.is_some());
        let got = (settled.tokens, settled.limited, settled.cost.map(|(money, currency)| (money, &**currency)));
        assert_eq!(got, (tokens, limited, cost.map(Money).zip(currency)), "{name}");
        assert_eq!(settled.budgeted, holds.budget, "{name}: budgeted");
        let used = tokens.prompt + tokens.completion;
        if let Some(limit) = &request.limit {
            // Its limit refills a token every 60 ms while the test runs.
            let left = tokens_left(limit);
            let settled_left = TOKEN_LIMIT.saturating_sub(used);
            assert!((settled_left..settled_left + 5).contains(&left), "{name}: {left} left, {settled_left} expected");
        }
        if let Some(budget) = &request.budget {
            let spent = (used, cost.unwrap_or(0));
            assert_eq!(budget.state.spent(), spent, "{name}: spent");
            assert_eq!(budget.state.counted(), spent, "{name}: nothing still reserved");
        }
        if let Some(month) = &request.month {
            let counts_cost = holds.priced == Some("USD");
            let expected = UsageTotals {
                requests: 1,
                input_tokens: tokens.prompt,
                output_tokens: tokens.completion,
                cached_input_tokens: tokens.cached,
                cost_nanos: cost.filter(|_| counts_cost).unwrap_or(0),
            };
            assert_eq!(month.totals(at, &TimeZone::UTC), expected, "{name}: the key's month");
        }
    }
}

#[test]
fn a_request_dropped_unsettled_gives_back_its_budget_and_keeps_its_tokens() {
    let request = holding(ALL);
    let (limit, budget, month) = (request.limit.unwrap(), request.budget.unwrap(), request.month.unwrap());
    drop(request.held);
    assert_eq!(budget.state.counted(), (0, 0), "the budget's reservation given back, nothing spent");
    let left = tokens_left(&limit);
    let reserved_left = TOKEN_LIMIT - RESERVATION.tokens;
    assert!((reserved_left..reserved_left + 5).contains(&left), "the token limit keeps the reservation: {left} left");
    assert_eq!(month.totals(Timestamp::now(), &TimeZone::UTC), UsageTotals::default(), "not counted in its month");
}

#[test]
fn the_wall_clock_is_read_once() {
    let wall = Wall::default();
    let first = wall.now();
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(wall.now(), first);
    assert_eq!(Wall::at(Duration::from_secs(7)).now(), Duration::from_secs(7));
}
