//! Trace and span ids, and OpenTelemetry's ratio sampling by trace id.

use std::cell::Cell;

/// Whether a new trace (no trusted parent) with `trace_id` is recorded at
/// `ratio` (0 to 1): as OpenTelemetry's `TraceIdRatioBased`, by the trace
/// id's last 8 bytes, so every service sampling by ratio agrees.
pub fn sampled_at(ratio: f64, trace_id: &[u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio.is_nan() || ratio <= 0.0 {
        return false;
    }
    let mut low = [0; 8];
    low.copy_from_slice(&trace_id[8..]);
    // Compared on 63 bits, as the SDKs do.
    let bound = (ratio * (1_u64 << 63) as f64) as u64;
    (u64::from_be_bytes(low) >> 1) < bound
}

thread_local! {
    static IDS: Cell<u64> = Cell::new(seed());
    /// This thread's stream: record ids are unique as 128 bits, not as
    /// the 64 of one generator's state, which every thread of every pod
    /// draws from the same cycle of.
    static STREAM: u64 = seed();
    /// Record ids this thread drew.
    static RECORDS: Cell<u64> = const { Cell::new(0) };
}

fn seed() -> u64 {
    let mut bytes = [0; 8];
    // Without the system's randomness, the clock and the thread: ids then
    // only need to differ, not to be unguessable.
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = (nanos.as_nanos() as u64 ^ (std::ptr::from_ref(&bytes) as u64)).to_le_bytes();
    }
    u64::from_le_bytes(bytes) | 1
}

/// wyrand's increment (odd: the state walks all 2^64 values before one
/// repeats).
const STEP: u64 = 0xa076_1d64_78bd_642f;

/// The next 64 random bits of this thread (wyrand: ids need to be unique
/// and spread, not secret).
fn next_random() -> u64 {
    IDS.with(|state| {
        let next = state.get().wrapping_add(STEP);
        state.set(next);
        let product = u128::from(next) * u128::from(next ^ 0xe703_7ed1_a0b4_28db);
        (product as u64) ^ ((product >> 64) as u64)
    })
}

/// A new span id (never all zero).
pub fn new_span_id() -> [u8; 8] {
    loop {
        let id = next_random();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

/// A new id for a usage record, unique among all a fleet ever draws: this
/// thread's random stream (64 bits, from the system's randomness) and how
/// many it drew before. Not the id generator's state, which would let a
/// collector predict the thread's next trace ids (and so its sampling).
/// Not secret: only the gateway draws it, a client never chooses it.
pub fn new_record_id() -> [u8; 16] {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&STREAM.with(|stream| *stream).to_be_bytes());
    id[8..].copy_from_slice(&RECORDS.with(|drawn| drawn.replace(drawn.get().wrapping_add(1))).to_be_bytes());
    id
}

/// A new trace id (never all zero).
pub fn new_trace_id() -> [u8; 16] {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&next_random().to_be_bytes());
    id[8..].copy_from_slice(&new_span_id());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_sampling_keeps_about_the_ratio_and_agrees_for_one_trace() {
        let ids: Vec<[u8; 16]> = (0..20_000).map(|_| new_trace_id()).collect();
        let kept = |ratio: f64| ids.iter().filter(|id| sampled_at(ratio, id)).count();
        assert_eq!(kept(0.0), 0);
        assert_eq!(kept(1.0), ids.len());
        let quarter = kept(0.25);
        assert!((4_500..5_500).contains(&quarter), "{quarter} of 20,000 at 0.25");
        // A trace kept at a ratio is kept at every higher one.
        assert!(ids.iter().all(|id| !sampled_at(0.1, id) || sampled_at(0.5, id)));
    }

    /// As the SDKs' `TraceIdRatioBased`: the id's last eight bytes, big
    /// endian, shifted to 63 bits, below the ratio's share.
    #[test]
    fn sampling_reads_the_trace_ids_last_eight_bytes_as_the_sdks_do() {
        let id = |high: u8, low: [u8; 8]| {
            let mut id = [high; 16];
            id[8..].copy_from_slice(&low);
            id
        };
        assert!(sampled_at(0.5, &id(0xff, [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])));
        assert!(!sampled_at(0.5, &id(0x00, [0x80, 0, 0, 0, 0, 0, 0, 0])));
        assert!(sampled_at(0.25, &id(0xff, [0x3f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])));
        assert!(!sampled_at(0.25, &id(0x00, [0x40, 0, 0, 0, 0, 0, 0, 0])));
    }

    #[test]
    fn new_ids_are_never_zero_and_do_not_repeat() {
        let spans: std::collections::HashSet<[u8; 8]> = (0..10_000).map(|_| new_span_id()).collect();
        assert_eq!(spans.len(), 10_000);
        assert!(!spans.contains(&[0; 8]));
        let traces: std::collections::HashSet<[u8; 16]> = (0..10_000).map(|_| new_trace_id()).collect();
        assert_eq!(traces.len(), 10_000);
    }

    #[test]
    fn record_ids_are_unique_across_threads_and_say_nothing_of_the_trace_ids() {
        let threads: Vec<_> =
            (0..4).map(|_| std::thread::spawn(|| (0..1_000).map(|_| new_record_id()).collect::<Vec<_>>())).collect();
        let all: std::collections::HashSet<[u8; 16]> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert_eq!(all.len(), 4_000);
        IDS.with(|state| state.set(41));
        let record = new_record_id();
        let span = new_span_id();
        IDS.with(|state| state.set(41));
        assert_eq!(new_span_id(), span, "a record id does not step the generator");
        assert_ne!(record[8..], (41 + STEP).to_be_bytes(), "nor is its state");
    }
}
