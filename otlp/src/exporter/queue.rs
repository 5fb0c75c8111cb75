//! What the exporter's queue carries, and its bounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use prometheus::IntCounterVec;

use crate::destination::Destination;

/// Longest a record waits for its batch (the OpenTelemetry SDKs' batch
/// span processor's default delay).
pub(super) const EVERY: Duration = Duration::from_secs(5);
/// Records waiting at most (a request's spans and record are one).
pub const QUEUE: usize = 8192;
/// Requests' records in one export at most.
pub const BATCH: usize = 512;
/// What a finished request (or reconcile) sends, encoded ([`crate::proto::span`],
/// [`crate::proto::record`]).
#[derive(Default)]
pub struct Item {
    /// Its spans, as `ScopeSpans.spans` entries.
    pub spans: Vec<u8>,
    /// How many spans `spans` holds.
    pub span_count: usize,
    /// Its usage record, as a `ScopeLogs.log_records` entry (or empty).
    pub records: Vec<u8>,
}

/// The counts the exporter keeps.
#[derive(Clone)]
pub struct Counts {
    /// Records sent and accepted, by signal.
    pub exported: IntCounterVec,
    /// Records dropped, by signal and reason (`queue_full`,
    /// `export_failed`, `retry_full`, `shutdown`).
    pub dropped: IntCounterVec,
}

/// The export thread's counting: nothing once the exporter is closed, for
/// a closing flush has counted everything the thread held (`shutdown`),
/// and an export that ends after it must not count its records twice.
pub(super) struct Tally {
    pub(super) counts: Counts,
    pub(super) closed: Arc<AtomicBool>,
}

impl Tally {
    pub(super) fn exported(&self, signal: &str, count: u64) {
        if !self.closed.load(Ordering::Relaxed) {
            self.counts.exported.with_label_values(&[signal]).inc_by(count);
        }
    }

    pub(super) fn dropped(&self, signal: &str, reason: &str, count: u64) {
        if !self.closed.load(Ordering::Relaxed) {
            self.counts.dropped.with_label_values(&[signal, reason]).inc_by(count);
        }
    }
}

/// What the queue carries.
pub enum Message {
    Record(Arc<Destination>, Item),
    /// Send what is batched now, then say so.
    Flush(SyncSender<()>),
}
