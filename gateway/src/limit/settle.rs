//! The end of a request's accounts: what it [`Held`] until it ended,
//! settled once by how it ended ([`settle`]), into what was settled
//! ([`Settled`]) — what its report (metrics, span, access line, usage
//! record) then says it used. No metric is written here.
//!
//! ```text
//! admission ─► Held: reservation, token charge, concurrency places, queue seat, budgets, key's month, prices
//! the end   ─► settle(held, Ended { ending, usage, relayed }) ─► Reservation::charged, once
//!                 ├─► token limits: + more used, − reserved back         (Charge::settle)
//!                 ├─► the model's queue: the tokens its tenant used       (Seat::settle)
//!                 ├─► cost at the model's prices                          (Priced::cost)
//!                 ├─► budgets: reserved back, spent + used (tokens, cost) (BudgetHold::settle)
//!                 └─► the key's month: one request, its tokens and cost   (KeyUsage::count)
//!           ─► Settled { tokens, limited, cost, budgeted } ─► the report
//! dropped   ─► each guard gives back what was not settled (a panic, a future dropped mid-settle)
//! ```
//!
//! The request path settles a request exactly once, when it ends — also
//! when its client left and its future was dropped (the exchange's own
//! `Drop` settles it as left). What [`Held`] still holds when it is dropped
//! unsettled is given back by each guard's own `Drop`: the concurrency
//! places and the endpoint's in-flight count are released, the queue seat
//! is given back at its estimate, the budgets' reservations are given back
//! (nothing spent); the token limits keep the reservation as used.

use std::cell::OnceCell;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use waycast_crds::money::Money;
use waycast_crds::usage::UsageTotals;

use super::budget::BudgetHold;
use super::charge::{Charge, Charged, Ending, Relayed, Reservation};
use super::decision::{Admitted, Places};
use super::key_usage::KeyUsage;
use super::pricing::Priced;

/// What a request holds until it ends, and the terms it is settled on:
/// filled as the stages admit it, settled once by [`settle`], then
/// dropped with the request.
#[derive(Debug, Default)]
pub struct Held {
    /// What it reserved (the estimate a count without a token limit is
    /// settled against), once its model was known.
    pub reservation: Option<Reservation>,
    /// Token limits to charge with the response's usage.
    pub charge: Option<Charge>,
    /// The endpoint answering, counted in flight until the request ends.
    pub endpoint: Option<crate::upstream::pick::InFlight>,
    /// Places under concurrency limits, released when the request ends.
    pub places: Places,
    /// Its place at a model with a capacity, given back (with the tokens
    /// used) when the request ends.
    pub seat: Option<crate::sharing::Seat>,
    /// What it reserved in its budgets (boxed: most keys have none).
    pub budget: Option<Box<BudgetHold>>,
    /// Where its key's usage this month is counted, once it was admitted.
    pub month: Option<Month>,
    /// Its model's prices, when it is priced.
    pub priced: Option<Priced>,
}

impl Held {
    /// Holds what `admitted` holds until the request ends (its token
    /// charge, concurrency places and budget reservations), leaving it its
    /// headers for the response.
    pub fn take_admitted(&mut self, admitted: &mut Admitted) {
        self.charge = admitted.charge.take();
        self.places = std::mem::take(&mut admitted.places);
        self.budget = admitted.budget.take();
    }
}

/// Where a request's use is counted in its key's usage this month.
#[derive(Debug)]
pub struct Month {
    /// The key's counts.
    pub counts: Arc<KeyUsage>,
    /// The zone months start in.
    pub zone: jiff::tz::TimeZone,
}

/// How a request ended, as far as its accounts go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// What the upstream did with it.
    pub ending: Ending,
    /// The tokens the response reported: prompt, cached, completion.
    pub usage: Option<(u64, u64, u64)>,
    /// What was relayed to the client.
    pub relayed: Relayed,
}

/// What a request's end settled, for its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled<'h> {
    /// The tokens its record, the token counters and its key's month say
    /// it used: what it was charged where anything counts it (the
    /// upstream's usage, or the estimate for a client that left before
    /// it), else what the response reported — so they sum to one another.
    pub tokens: Charged,
    /// The tokens settled against its token limits, when one applies.
    pub limited: Option<u64>,
    /// What it cost at its model's prices, and their currency.
    pub cost: Option<(Money, &'h Arc<str>)>,
    /// Whether it was settled against budgets.
    pub budgeted: bool,
}

/// Settles what `held` holds by how the request ended: charges each
/// count what the upstream will bill ([`Reservation::charged`], decided
/// once), prices it, and counts it in the key's month at `wall`'s time.
///
/// # Guarantees
/// Each count is settled with the same charge; nothing is settled when
/// nothing counts the request (no token limit, seat, prices, budget nor
/// month): then the record says what the response reported.
pub fn settle<'h>(held: &'h Held, ended: Ended, wall: &Wall) -> Settled<'h> {
    let unsettled = || Settled {
        tokens: ended.usage.map_or_else(Charged::default, |(prompt, cached, completion)| Charged {
            prompt,
            cached,
            completion,
        }),
        limited: None,
        cost: None,
        budgeted: held.budget.is_some(),
    };
    if held.charge.is_none()
        && held.seat.is_none()
        && held.priced.is_none()
        && held.budget.is_none()
        && held.month.is_none()
    {
        return unsettled();
    }
    // What the upstream will bill is charged (`Reservation::charged`).
    let reservation = held.charge.as_ref().map(|charge| charge.reservation).or(held.reservation);
    let charged = reservation
        .map_or_else(Charged::default, |reservation| reservation.charged(ended.ending, ended.usage, ended.relayed));
    let used = charged.prompt.saturating_add(charged.completion);
    let limited = held.charge.as_ref().map(|charge| charge.settle(used));
    if let Some(seat) = &held.seat {
        seat.settle(used);
    }
    let cost = held.priced.as_ref().map(|priced| (priced.cost(charged), &priced.currency));
    if let Some(budget) = &held.budget {
        budget.settle(used, cost.map_or(0, |(money, _)| money.0));
    }
    if let Some(month) = &held.month {
        let counts_cost = held.priced.as_ref().is_some_and(|priced| priced.in_budget_currency);
        let used = UsageTotals {
            requests: 1,
            input_tokens: charged.prompt,
            output_tokens: charged.completion,
            cached_input_tokens: charged.cached,
            cost_nanos: cost.filter(|_| counts_cost).map_or(0, |(money, _)| money.0),
        };
        let second = i64::try_from(wall.now().as_secs()).unwrap_or(i64::MAX);
        let now = jiff::Timestamp::from_second(second).unwrap_or_else(|_| jiff::Timestamp::now());
        month.counts.count(used, now, &month.zone);
    }
    Settled { tokens: charged, limited, cost, budgeted: held.budget.is_some() }
}

/// The wall clock as a request's end reads it: at most once, by the first
/// that needs it (the key's month, the span, the access line), so all say
/// the same time.
#[derive(Debug, Default)]
pub struct Wall(OnceCell<Duration>);

impl Wall {
    /// A clock that reads `since_epoch`.
    #[cfg(test)]
    pub fn at(since_epoch: Duration) -> Self {
        Self(OnceCell::from(since_epoch))
    }

    /// The time since the Unix epoch.
    pub fn now(&self) -> Duration {
        *self.0.get_or_init(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default())
    }
}

#[cfg(test)]
#[path = "settle_tests.rs"]
mod tests;
