//! One limit's state (a GCRA's theoretical arrival time, one atomic) and
//! the limits of one key or model.

use std::sync::atomic::{AtomicU64, Ordering};

use waycast_crds::config::LimitsConfig;

use super::gcra::{self, Verdict};

/// One limit and its state.
#[derive(Debug)]
pub struct Limiter {
    /// The limit, for the whole fleet.
    pub per_minute: u64,
    tat: AtomicU64,
}

impl Limiter {
    pub(super) fn new(per_minute: u64, previous: Option<&Limiter>) -> Self {
        let tat = previous.map_or(0, |p| p.tat.load(Ordering::Relaxed));
        Self { per_minute, tat: AtomicU64::new(tat) }
    }

    /// Admits one request if its cost fits (charging it), else refuses.
    pub(super) fn admit(&self, now: u64, shares: u32) -> (Verdict, u64) {
        self.take(now, gcra::unit_cost(self.per_minute, shares))
    }

    /// Reserves `units` (tokens) if they fit, else refuses. A reservation
    /// larger than the whole window is cut to it (it would never fit).
    pub(super) fn reserve(&self, now: u64, units: u64, shares: u32) -> (Verdict, u64) {
        self.take(now, gcra::unit_cost(self.per_minute, shares).saturating_mul(units).min(gcra::WINDOW_NANOS))
    }

    /// Charges `cost` (ns of window) if it fits: one compare-and-swap loop.
    fn take(&self, now: u64, cost: u64) -> (Verdict, u64) {
        let mut current = self.tat.load(Ordering::Relaxed);
        loop {
            let (next, verdict) = gcra::admit(current, now, cost, self.per_minute);
            let Some(next) = next else { return (verdict, 0) };
            match self.tat.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return (verdict, cost),
                Err(actual) => current = actual,
            }
        }
    }

    pub(super) fn refund(&self, cost: u64) {
        let _ = self.tat.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| Some(gcra::refund(tat, cost)));
    }

    pub(super) fn charge(&self, now: u64, units: u64, shares: u32) {
        let unit = gcra::unit_cost(self.per_minute, shares);
        let _ = self
            .tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| Some(gcra::charge(tat, now, units, unit)));
    }
}

/// The limits of one key or one model.
#[derive(Debug)]
pub struct LimitSet {
    /// Requests per minute.
    pub requests: Option<Limiter>,
    /// Tokens per minute.
    pub tokens: Option<Limiter>,
}

impl LimitSet {
    /// The limiters for `config`, continuing the state of `previous` (the
    /// same key or model in the last snapshot).
    pub fn new(config: &LimitsConfig, previous: Option<&LimitSet>) -> Self {
        Self {
            requests: config
                .requests_per_minute
                .map(|limit| Limiter::new(limit, previous.and_then(|p| p.requests.as_ref()))),
            tokens: config.tokens_per_minute.map(|limit| Limiter::new(limit, previous.and_then(|p| p.tokens.as_ref()))),
        }
    }
}
