//! Usage-record batches the collector did not take, kept for another try
//! within their bounds.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::post::post;
use super::queue::{EVERY, Tally};
use crate::destination::Destination;

/// Encoded usage records kept for another try at most (about 35,000 of
/// some 480 bytes: most of a minute of one busy worker's requests).
pub const RETRY_BYTES: usize = 16 * 1024 * 1024;
/// The first wait before a batch is sent again; each next one doubles.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Tries of one batch at most (1 + 2 + 4 + 8 + 16 + 30 × 9 s of waits: about
/// five minutes).
pub(super) const MAX_TRIES: u32 = 15;

/// Usage-record batches the collector did not take, oldest first.
#[derive(Default)]
pub(super) struct Retries {
    pub(super) waiting: VecDeque<Retry>,
    pub(super) bytes: usize,
    /// Destinations whose traces pipeline pushed back or did not answer,
    /// and until when their spans are dropped without a try: a collector
    /// that asked for a minute is not asked again each batch, nor a
    /// traces endpoint that hangs waited on for each.
    pub(super) traces_paused: Vec<(Arc<Destination>, Instant)>,
}

pub(super) struct Retry {
    pub(super) destination: Arc<Destination>,
    pub(super) body: Bytes,
    pub(super) records: u64,
    pub(super) tries: u32,
    pub(super) due: Instant,
}

impl Retries {
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.waiting.iter().map(|retry| retry.due).min()
    }

    /// When `destination` is next tried, while it has a batch waiting: it
    /// is down, and new batches for it wait too instead of each paying a
    /// deadline.
    pub(super) fn failing(&self, destination: &Destination) -> Option<Instant> {
        self.waiting.iter().filter(|retry| *retry.destination == *destination).map(|retry| retry.due).min()
    }

    /// Keeps a batch for another try after `tries`, dropping the oldest
    /// (counted) past the bounds.
    pub(super) fn keep(&mut self, mut retry: Retry, after: Option<Duration>, counts: &Tally) {
        if retry.tries >= MAX_TRIES {
            tracing::warn!(records = retry.records, "telemetry: usage records dropped after {MAX_TRIES} tries");
            counts.dropped("logs", "export_failed", retry.records);
            return;
        }
        // A Retry-After shorter than the backoff (0, say) does not hurry it.
        let wait = backoff(retry.tries).max(after.map_or(Duration::ZERO, |after| after.min(MAX_RETRY_AFTER)));
        retry.due = Instant::now() + wait;
        self.bytes += retry.body.len();
        self.waiting.push_back(retry);
        self.shed(counts);
    }

    /// Keeps a batch never tried (its destination is down) until `due`,
    /// with the others of its destination.
    pub(super) fn wait_with(&mut self, mut retry: Retry, due: Instant, counts: &Tally) {
        retry.due = due;
        self.bytes += retry.body.len();
        self.waiting.push_back(retry);
        self.shed(counts);
    }

    /// Drops the oldest batches (counted) while more than [`RETRY_BYTES`]
    /// are kept.
    fn shed(&mut self, counts: &Tally) {
        while self.bytes > RETRY_BYTES
            && let Some(oldest) = self.waiting.pop_front()
        {
            self.bytes -= oldest.body.len();
            counts.dropped("logs", "retry_full", oldest.records);
        }
    }

    /// Whether `destination`'s spans are to be dropped without a try now.
    pub(super) fn traces_paused(&mut self, destination: &Destination) -> bool {
        let now = Instant::now();
        self.traces_paused.retain(|(_, until)| *until > now);
        self.traces_paused.iter().any(|(paused, _)| **paused == *destination)
    }

    /// Sends the batches due by `now` (every one when `None`), oldest
    /// first, for one batch delay at most (the rest wait for the next
    /// turn: a collector that answers each just within its deadline must
    /// not hold the thread for minutes); a destination that fails again
    /// holds its other batches back with it.
    pub(super) async fn send_due(&mut self, http: &crate::client::Http, counts: &Tally, now: Option<Instant>) {
        let mut held: Vec<Arc<Destination>> = Vec::new();
        let mut later = VecDeque::with_capacity(self.waiting.len());
        let due = std::mem::take(&mut self.waiting);
        self.bytes = 0;
        let started = Instant::now();
        for mut retry in due {
            let ready = now.is_none_or(|now| retry.due <= now) && started.elapsed() < EVERY;
            if !ready || held.iter().any(|d| **d == *retry.destination) {
                self.bytes += retry.body.len();
                later.push_back(retry);
                continue;
            }
            retry.tries += 1;
            let sent = post(http, &retry.destination, "logs", retry.body.clone(), retry.records, counts).await;
            if let Some(after) = sent.again() {
                held.push(retry.destination.clone());
                self.waiting = later;
                self.keep(retry, after, counts);
                later = std::mem::take(&mut self.waiting);
            }
        }
        self.waiting = later;
        // The destination's other batches wait for its next probe.
        for destination in held {
            if let Some(probe) = self.waiting.iter().rev().find(|r| *r.destination == *destination).map(|r| r.due) {
                for retry in self.waiting.iter_mut().filter(|r| *r.destination == *destination) {
                    retry.due = retry.due.max(probe);
                }
            }
        }
    }
}

/// The wait before try `tries + 1`: doubling from [`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`], less up to a fifth at random so pods that lost the
/// same collector do not all come back at once.
pub(super) fn backoff(tries: u32) -> Duration {
    let full = FIRST_BACKOFF.saturating_mul(1 << tries.saturating_sub(1).min(16)).min(MAX_BACKOFF);
    let spread = u32::from(crate::ids::new_span_id()[0]);
    full - full / 5 * spread / 255
}
