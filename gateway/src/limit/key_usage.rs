//! What one key used this month in this process: requests, tokens and
//! cost, counted when each request ends, reported to the operator
//! (`crate::usage`) and shown in `ApiKey.status.usage`. Carried from config
//! to config by the key's id, like its budgets.

use std::sync::atomic::{AtomicU64, Ordering};

use jiff::Timestamp;
use jiff::tz::TimeZone;
use waycast_crds::period::Period;
use waycast_crds::usage::UsageTotals;

use super::period_clock::{PeriodClock, add};

/// A key's counts in the current month.
#[derive(Debug, Default)]
pub struct KeyUsage {
    clock: PeriodClock,
    requests: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    cached_input_tokens: AtomicU64,
    cost_nanos: AtomicU64,
}

impl KeyUsage {
    fn counts(&self) -> [&AtomicU64; 5] {
        [&self.requests, &self.input_tokens, &self.output_tokens, &self.cached_input_tokens, &self.cost_nanos]
    }

    /// Counts one request that used `used` (its `requests` ignored) at
    /// `now`, in the month of `zone` that holds it.
    pub fn count(&self, used: UsageTotals, now: Timestamp, zone: &TimeZone) {
        self.clock.current(Period::Month, now, zone, &self.counts());
        add(&self.requests, 1);
        add(&self.input_tokens, used.input_tokens);
        add(&self.output_tokens, used.output_tokens);
        add(&self.cached_input_tokens, used.cached_input_tokens);
        add(&self.cost_nanos, used.cost_nanos);
    }

    /// What it counted in the month that holds `now` (nothing when its
    /// counts are of an earlier month).
    pub fn totals(&self, now: Timestamp, zone: &TimeZone) -> UsageTotals {
        let start = Period::Month.window(now, zone).start.as_second();
        if self.clock.start() != start {
            return UsageTotals::default();
        }
        let read = |count: &AtomicU64| count.load(Ordering::Relaxed);
        UsageTotals {
            requests: read(&self.requests),
            input_tokens: read(&self.input_tokens),
            output_tokens: read(&self.output_tokens),
            cached_input_tokens: read(&self.cached_input_tokens),
            cost_nanos: read(&self.cost_nanos),
        }
    }

    /// Whether it holds nothing worth keeping at `now` (never counted, or
    /// its month is over).
    pub fn idle(&self, now: Timestamp) -> bool {
        self.clock.start() == 0 || self.clock.ended(now)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    #[test]
    fn a_month_of_usage_starts_over_with_the_next() {
        let berlin = waycast_crds::period::time_zone("Europe/Berlin").unwrap();
        let usage = KeyUsage::default();
        let used =
            UsageTotals { input_tokens: 10, output_tokens: 5, cached_input_tokens: 2, cost_nanos: 9, requests: 0 };
        let late = "2026-11-30T22:30:00Z".parse().unwrap(); // 23:30 in Berlin
        usage.count(used, late, &berlin);
        usage.count(used, late, &berlin);
        assert_eq!(usage.totals(late, &berlin), UsageTotals { requests: 2, ..used.plus(used) });
        // December in Berlin.
        let december = "2026-11-30T23:00:01Z".parse().unwrap();
        assert_eq!(usage.totals(december, &berlin), UsageTotals::default(), "November's counts are not December's");
        assert!(usage.idle(december) && !usage.idle(late));
        usage.count(used, december, &berlin);
        assert_eq!(usage.totals(december, &berlin).requests, 1);
    }
}
