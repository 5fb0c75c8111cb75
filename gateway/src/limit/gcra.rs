//! The generic cell rate algorithm, as plain arithmetic on one number: the
//! theoretical arrival time (TAT) of a limiter, in nanoseconds on a clock
//! the caller owns.
//!
//! A limit of `N` per minute is a bucket that holds a minute's worth (`N`)
//! and refills continuously (`N` per minute), as OpenAI's limits behave: the
//! window `τ` is one minute, and each unit (a request, a token) costs
//! `τ / N` of it. A limiter is "full" when `TAT ≤ now`; it has used
//! `TAT − now` of its window otherwise.
//!
//! Requests are charged before they are admitted (admitted only if the cost
//! fits). Tokens are reserved the same way (an estimate of the request's
//! tokens must fit), then settled after the response: what it used beyond
//! the reservation is charged without a cap — the TAT may run past the
//! window, and the key waits until that is paid back — and what it did not
//! use is given back.
//!
//! NB: the same arithmetic runs in Redis (`redis.rs`) for fleet-exact limits.

/// The window a per-minute limit is counted over.
pub const WINDOW_NANOS: u64 = 60_000_000_000;

/// The cost of one unit in nanoseconds of window, for a limit of
/// `per_minute` units shared by `shares` pods (each pod refills at
/// `per_minute / shares`, and its window holds as many).
pub fn unit_cost(per_minute: u64, shares: u32) -> u64 {
    let per_minute = u128::from(per_minute.max(1));
    let cost = u128::from(WINDOW_NANOS) * u128::from(shares.max(1)) / per_minute;
    u64::try_from(cost.max(1)).unwrap_or(u64::MAX)
}

/// What a limiter says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Admitted.
    pub allowed: bool,
    /// Units left in the window after this request, scaled to the whole
    /// limit (what `x-ratelimit-remaining-*` reports).
    pub remaining: u64,
    /// Nanoseconds until the limiter is full again.
    pub reset_nanos: u64,
    /// Nanoseconds until this request would be admitted (0 if it was).
    pub retry_after_nanos: u64,
}

/// The TAT after admitting a request that costs `cost` at `now`, and the
/// verdict. A refused request leaves the TAT as it was (`None`).
pub fn admit(tat: u64, now: u64, cost: u64, per_minute: u64) -> (Option<u64>, Verdict) {
    let start = tat.max(now);
    let after = start.saturating_add(cost);
    let used_after = after - now;
    if used_after <= WINDOW_NANOS {
        let verdict = Verdict {
            allowed: true,
            remaining: remaining(used_after, per_minute),
            reset_nanos: used_after,
            retry_after_nanos: 0,
        };
        (Some(after), verdict)
    } else {
        let used = start - now;
        let verdict = Verdict {
            allowed: false,
            remaining: remaining(used, per_minute),
            reset_nanos: used,
            retry_after_nanos: used_after - WINDOW_NANOS,
        };
        (None, verdict)
    }
}

/// The TAT after charging `units` at `now` (tokens, after a response).
pub fn charge(tat: u64, now: u64, units: u64, unit: u64) -> u64 {
    tat.max(now).saturating_add(units.saturating_mul(unit))
}

/// The TAT after giving back a request's cost (another limiter refused it).
pub fn refund(tat: u64, cost: u64) -> u64 {
    tat.saturating_sub(cost)
}

/// Units of the whole limit that fit in the unused part of the window.
pub fn remaining(used: u64, per_minute: u64) -> u64 {
    let free = u128::from(WINDOW_NANOS.saturating_sub(used));
    u64::try_from(free * u128::from(per_minute) / u128::from(WINDOW_NANOS)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    /// Requests at `every` apart for `duration`, through one limiter of
    /// `per_minute` shared by `shares`; how many were admitted.
    fn admitted(per_minute: u64, shares: u32, every: u64, duration: u64, start_tat: u64) -> u64 {
        let cost = unit_cost(per_minute, shares);
        let (mut tat, mut count, mut now) = (start_tat, 0, 0);
        while now < duration {
            if let (Some(next), verdict) = admit(tat, now, cost, per_minute) {
                assert!(verdict.allowed);
                tat = next;
                count += 1;
            }
            now += every;
        }
        count
    }

    #[test]
    fn a_full_bucket_admits_a_minutes_worth_at_once_then_the_rate() {
        // 60/min from full, 10 requests a second for two minutes: 60 at
        // once, then one a second.
        let count = admitted(60, 1, SECOND / 10, 120 * SECOND, 0);
        assert!((60 + 119..=60 + 120).contains(&count), "{count}");
    }

    #[test]
    fn once_drained_a_minute_admits_the_limit() {
        // Start drained (TAT a full window ahead): exactly the rate.
        let count = admitted(60, 1, SECOND / 10, 60 * SECOND, WINDOW_NANOS);
        assert!((59..=61).contains(&count), "{count}");
    }

    #[test]
    fn shares_of_a_limit_add_up_to_the_limit() {
        // Three pods each enforcing a third, each seeing a third of a
        // steady overload: together the limit.
        let per_pod = admitted(60, 3, SECOND / 3, 60 * SECOND, WINDOW_NANOS);
        assert!((19..=21).contains(&per_pod), "{per_pod}");
    }

    #[test]
    fn refusals_say_when_to_come_back_and_change_nothing() {
        let cost = unit_cost(60, 1);
        let (tat, verdict) = admit(WINDOW_NANOS, 0, cost, 60);
        assert_eq!(tat, None);
        assert!(!verdict.allowed);
        assert_eq!(verdict.retry_after_nanos, SECOND);
        assert_eq!(verdict.remaining, 0);
        assert_eq!(verdict.reset_nanos, WINDOW_NANOS);
        let (tat, verdict) = admit(WINDOW_NANOS, SECOND, cost, 60);
        assert_eq!(tat, Some(WINDOW_NANOS + SECOND));
        assert!(verdict.allowed);
    }

    #[test]
    fn remaining_counts_down_from_the_limit() {
        let cost = unit_cost(10, 1);
        let (tat, first) = admit(0, 0, cost, 10);
        assert_eq!(first.remaining, 9);
        let (_, second) = admit(tat.unwrap_or_default(), 0, cost, 10);
        assert_eq!(second.remaining, 8);
        assert_eq!(second.reset_nanos, 12 * SECOND);
    }

    #[test]
    fn tokens_overdraw_and_block_until_paid_back() {
        let unit = unit_cost(1000, 1);
        // One response used 1,500 tokens of a 1,000/min limit.
        let tat = charge(0, 0, 1500, unit);
        let now = 10 * SECOND;
        let (next, verdict) = admit(tat, now, 100 * unit, 1000);
        assert!(next.is_none() && !verdict.allowed);
        assert_eq!(verdict.remaining, 0);
        // 90 s of window used at t=0; a 100-token reservation fits once
        // below 54 s: at t=36 s.
        assert_eq!(verdict.retry_after_nanos, 26 * SECOND);
        assert!(admit(tat, 36 * SECOND, 100 * unit, 1000).1.allowed);
    }

    #[test]
    fn a_refund_gives_the_cost_back() {
        let cost = unit_cost(60, 1);
        let (tat, _) = admit(0, 0, cost, 60);
        assert_eq!(refund(tat.unwrap_or_default(), cost), 0);
    }

    #[test]
    fn costs_never_reach_zero_or_overflow() {
        assert_eq!(unit_cost(u64::MAX, 1), 1);
        assert_eq!(unit_cost(1, u32::MAX), u64::MAX);
        assert_eq!(unit_cost(0, 0), WINDOW_NANOS);
        assert_eq!(charge(u64::MAX - 1, 0, u64::MAX, 2), u64::MAX);
    }
}
