//! Which calendar period counts run in, turned over once when a new one
//! starts: the clock of budgets (`budget.rs`) and of each key's usage this
//! month (`key_usage.rs`).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use jiff::Timestamp;
use jiff::tz::TimeZone;
use waycast_crds::period::Period;

/// The current period's first and next-period instants, in seconds since
/// 1970 (0 before the first count).
#[derive(Debug, Default)]
pub struct PeriodClock {
    start: AtomicI64,
    end: AtomicI64,
}

impl PeriodClock {
    /// Brings `counts` to the `period` that holds `now` in `zone` (a new
    /// period starts them from nothing), and returns that period's bounds.
    /// One caller turns a period over; a racing one that finds it turned
    /// (the start already new, the end maybe not yet) leaves the counts
    /// alone, and a clock read before the turn never turns it back: it
    /// counts in the newer period.
    pub fn current(&self, period: Period, now: Timestamp, zone: &TimeZone, counts: &[&AtomicU64]) -> (i64, i64) {
        let second = now.as_second();
        let (start, end) = (self.start.load(Ordering::Acquire), self.end.load(Ordering::Acquire));
        if start <= second && second < end {
            return (start, end);
        }
        let window = period.window(now, zone);
        let (new_start, new_end) = (window.start.as_second(), window.end.as_second());
        if new_start <= start {
            return (start, self.end.load(Ordering::Acquire));
        }
        if self.start.compare_exchange(start, new_start, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            for count in counts {
                count.store(0, Ordering::Relaxed);
            }
            self.end.store(new_end, Ordering::Release);
        }
        (new_start, new_end)
    }

    /// The current period's first instant (0 before the first count).
    pub fn start(&self) -> i64 {
        self.start.load(Ordering::Acquire)
    }

    /// Whether the period counted has ended by `now`.
    pub fn ended(&self, now: Timestamp) -> bool {
        let end = self.end.load(Ordering::Acquire);
        end != 0 && now.as_second() >= end
    }
}

/// Adds without wrapping (an upstream may report any usage).
pub fn add(count: &AtomicU64, amount: u64) {
    if amount != 0 {
        let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| Some(held.saturating_add(amount)));
    }
}

/// Subtracts, never below zero.
pub fn sub(count: &AtomicU64, amount: u64) {
    if amount != 0 {
        let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| Some(held.saturating_sub(amount)));
    }
}
