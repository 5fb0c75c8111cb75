//! The limiters' clock: monotonic nanoseconds from the first reading.

use std::sync::OnceLock;
use std::time::Instant;

/// Nanoseconds on the limiters' clock (monotonic, from the first call).
pub fn now_nanos() -> u64 {
    nanos_at(Instant::now())
}

/// `at` on [`now_nanos`]'s clock (for a caller that has read the time
/// already: each reading costs a few dozen cycles).
pub fn nanos_at(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| at);
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}
