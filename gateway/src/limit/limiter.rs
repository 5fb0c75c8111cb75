//! One limit's state (a GCRA's theoretical arrival time, one atomic; a
//! count of requests in flight) and the limits of one key, tenant or model.

use std::sync::Arc;
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

    /// Whether nothing is counted against it at `now` (its bucket is full).
    fn is_full(&self, now: u64) -> bool {
        self.tat.load(Ordering::Relaxed) <= now
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

/// A limit on requests in flight at once, and this pod's count of those
/// holding it: the count is carried from config to config (a reload must
/// not forget the streams still open).
#[derive(Debug)]
pub struct Concurrency {
    /// The limit, for the whole fleet.
    pub limit: u64,
    held: Arc<AtomicU64>,
}

/// One request counted against a local [`Concurrency`]: dropping it (when
/// the request, its stream included, has ended) counts it out.
#[derive(Debug)]
pub struct LocalHold(Arc<AtomicU64>);

impl Drop for LocalHold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Concurrency {
    fn new(limit: u64, previous: Option<&Concurrency>) -> Self {
        Self { limit, held: previous.map_or_else(Arc::default, |p| p.held.clone()) }
    }

    /// This pod's share of the limit with `shares` live pods: the limit
    /// divided among them, rounded down, at least 1 (so the fleet never
    /// holds more than the limit unless the limit is below the pods).
    pub fn share(&self, shares: u32) -> u64 {
        (self.limit / u64::from(shares.max(1))).max(1)
    }

    /// Counts one more request in flight if this pod holds fewer than its
    /// share, else `None`.
    pub(super) fn take(&self, shares: u32) -> Option<LocalHold> {
        let share = self.share(shares);
        self.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| (held < share).then_some(held + 1)).ok()?;
        Some(LocalHold(self.held.clone()))
    }

    /// Requests this pod counts in flight now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// The limits of one key, one tenant (a namespace's keys together) or one
/// model.
#[derive(Debug)]
pub struct LimitSet {
    /// Requests per minute.
    pub requests: Option<Limiter>,
    /// Tokens per minute.
    pub tokens: Option<Limiter>,
    /// Requests in flight at once (keys and tenants).
    pub concurrent: Option<Concurrency>,
}

impl LimitSet {
    /// Whether nothing is counted against any of its limits: every bucket
    /// full, no request in flight. A set that is not idle must outlive a
    /// config that leaves its owner out, or the owner would come back with
    /// its counts forgotten.
    pub fn is_idle(&self) -> bool {
        let now = super::clock::now_nanos();
        self.requests.as_ref().is_none_or(|limiter| limiter.is_full(now))
            && self.tokens.as_ref().is_none_or(|limiter| limiter.is_full(now))
            && self.concurrent.as_ref().is_none_or(|concurrency| concurrency.held() == 0)
    }

    /// The limiters for `config`, continuing the state of `previous` (the
    /// same key, tenant or model in the last snapshot).
    pub fn new(config: &LimitsConfig, previous: Option<&LimitSet>) -> Self {
        Self {
            requests: config
                .requests_per_minute
                .map(|limit| Limiter::new(limit, previous.and_then(|p| p.requests.as_ref()))),
            tokens: config.tokens_per_minute.map(|limit| Limiter::new(limit, previous.and_then(|p| p.tokens.as_ref()))),
            concurrent: config
                .max_concurrent
                .map(|limit| Concurrency::new(limit, previous.and_then(|p| p.concurrent.as_ref()))),
        }
    }
}
