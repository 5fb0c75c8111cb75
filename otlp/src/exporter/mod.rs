//! Sends spans and usage records to the collector, off the caller's path:
//! a request (or a reconcile) hands its records to a bounded queue and
//! never waits; a thread of its own batches them (up to 512 items, or
//! every 5 s) and POSTs each batch with a deadline. A full queue drops and
//! counts ([`Counts`]: `waycast_gateway_telemetry_dropped_total`,
//! `waycast_operator_telemetry_dropped_total`).
//!
//! Usage records are delivered at least once (each carries a record id of
//! its own for de-duplication): a batch of them the collector did not take — it was
//! down, timed out, or answered 429, 502, 503 or 504, as the OTLP
//! specification has it — is kept and sent again after 1 s, 2 s, 4 s … up to
//! 30 s apart (a `Retry-After` is honoured, up to a minute), for about five
//! minutes, within [`RETRY_BYTES`] of encoded records; past either bound the
//! oldest are dropped and counted. Spans are not kept: a failed batch of
//! them is dropped and counted. While an export waits on the collector, the
//! queue is still emptied (into `Arrived`), so a collector that never answers
//! fills the retry store (dropping the oldest) before the queue (dropping
//! the newest). Memory stays bounded whatever the collector does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::destination::Destination;
use crate::proto;

mod arrived;
mod post;
mod queue;
mod retries;

use arrived::Arrived;
use post::{Sent, post};
use queue::{BATCH, EVERY, Message, Tally};
pub use queue::{Counts, Item, QUEUE};
pub use retries::RETRY_BYTES;
use retries::{MAX_RETRY_AFTER, Retries, Retry};
#[cfg(test)]
use retries::{MAX_TRIES, backoff};

/// The senders' end of the queue.
pub struct Exporter {
    queue: SyncSender<Message>,
    /// Items queued and not yet taken (an estimate: spans are shed first
    /// when the queue is half full, so usage records keep their room).
    queued: Arc<AtomicUsize>,
    /// Usage records queued since the start, so a flush that runs out of
    /// time knows how many it leaves undelivered.
    accepted: AtomicU64,
    /// Set by a flush, the pod's last act: what is sent after is counted
    /// dropped (`shutdown`) at once, and the thread counts nothing more.
    closed: Arc<AtomicBool>,
    counts: Counts,
}

impl Exporter {
    /// Starts the sending thread.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start(counts: Counts) -> std::io::Result<Self> {
        let (queue, receiver) = sync_channel(QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let tally = Tally { counts: counts.clone(), closed: closed.clone() };
        let taken = queued.clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || send_batches(&receiver, &tally, &taken))?;
        Ok(Self { queue, queued, accepted: AtomicU64::new(0), closed, counts })
    }

    /// Queues `item` for `destination`, or drops it (counted) when the
    /// queue is full; past half full, its spans are dropped (counted) and
    /// its usage record still queued.
    pub fn send(&self, destination: &Arc<Destination>, mut item: Item) {
        if self.closed.load(Ordering::Relaxed) {
            self.counts.dropped.with_label_values(&["traces", "shutdown"]).inc_by(item.span_count as u64);
            self.counts.dropped.with_label_values(&["logs", "shutdown"]).inc_by(u64::from(!item.records.is_empty()));
            return;
        }
        if item.span_count > 0 && self.queued.load(Ordering::Relaxed) >= QUEUE / 2 {
            self.counts.dropped.with_label_values(&["traces", "queue_full"]).inc_by(item.span_count as u64);
            (item.spans, item.span_count) = (Vec::new(), 0);
            if item.records.is_empty() {
                return;
            }
        }
        let (spans, records) = (item.span_count as u64, u64::from(!item.records.is_empty()));
        self.queued.fetch_add(1, Ordering::Relaxed);
        match self.queue.try_send(Message::Record(destination.clone(), item)) {
            Ok(()) => {
                self.accepted.fetch_add(records, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                self.counts.dropped.with_label_values(&["traces", "queue_full"]).inc_by(spans);
                self.counts.dropped.with_label_values(&["logs", "queue_full"]).inc_by(records);
            }
        }
    }

    /// Sends what is queued now, waiting at most `deadline` (a draining
    /// pod's last records). Usage records not delivered by then (the
    /// collector is down or slow, or more waited than the time allowed)
    /// are counted dropped (`shutdown`) and logged: the pod may exit next.
    /// The exporter is closed after: it sends nothing more.
    pub fn flush(&self, deadline: Duration) {
        let flushed = self.flushed_by(deadline);
        self.closed.store(true, Ordering::Relaxed);
        let undelivered = self.undelivered();
        if undelivered > 0 {
            tracing::warn!(undelivered, flushed, "telemetry: usage records not delivered before shutdown");
            self.counts.dropped.with_label_values(&["logs", "shutdown"]).inc_by(undelivered);
        }
    }

    /// Usage records queued and neither exported nor dropped yet.
    fn undelivered(&self) -> u64 {
        let dropped = |reason| self.counts.dropped.with_label_values(&["logs", reason]).get();
        let settled = self.counts.exported.with_label_values(&["logs"]).get()
            + dropped("export_failed")
            + dropped("retry_full")
            + dropped("shutdown");
        self.accepted.load(Ordering::Relaxed).saturating_sub(settled)
    }

    /// Whether the flush was done within `deadline`.
    fn flushed_by(&self, deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        let (done, wait) = sync_channel(1);
        let mut flush = Message::Flush(done);
        // A full queue (a silent collector) must not hold the pod past its
        // deadline: the flush waits for room within it too.
        loop {
            match self.queue.try_send(flush) {
                Ok(()) => break,
                Err(TrySendError::Full(again)) if Instant::now() < until => {
                    flush = again;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return false,
            }
        }
        wait.recv_timeout(until.saturating_duration_since(Instant::now())).is_ok()
    }
}

fn send_batches(receiver: &Receiver<Message>, counts: &Tally, queued: &AtomicUsize) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        tracing::error!("telemetry: cannot start the export runtime; records are dropped");
        return;
    };
    let http = crate::client::Http::new();
    let mut batch: Vec<(Arc<Destination>, Item)> = Vec::with_capacity(BATCH);
    let mut retries = Retries::default();
    let mut arrived = Arrived::default();
    let mut deadline = Instant::now() + EVERY;
    let mut retried_at = Instant::now();
    loop {
        if counts.closed.load(Ordering::Relaxed) {
            // Everything held was counted by the closing flush.
            (batch, retries) = (Vec::new(), Retries::default());
            while arrived.pop().is_some() {}
            match receiver.recv() {
                Ok(Message::Flush(done)) => drop(done.send(())),
                Ok(Message::Record(..)) => {}
                Err(_) => return,
            }
            continue;
        }
        let mut flushed = None;
        let wake = retries.next_due().map_or(deadline, |due| due.min(deadline));
        // What arrived during the last exports first, in order.
        let (next, from_arrived) = match arrived.pop() {
            Some(message) => (Ok(message), true),
            None => (receiver.recv_timeout(wake.saturating_duration_since(Instant::now())), false),
        };
        match next {
            Ok(Message::Record(destination, item)) => {
                if !from_arrived {
                    queued.fetch_sub(1, Ordering::Relaxed);
                }
                batch.push((destination, item));
                if batch.len() < BATCH {
                    continue;
                }
            }
            Ok(Message::Flush(done)) => flushed = Some(done),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                runtime.block_on(async {
                    export(&http, std::mem::take(&mut batch), counts, &mut retries).await;
                    retries.send_due(&http, counts, None).await;
                });
                return;
            }
        }
        let now = Instant::now();
        if !batch.is_empty() && (batch.len() >= BATCH || now >= deadline || flushed.is_some()) {
            let exported = export(&http, std::mem::take(&mut batch), counts, &mut retries);
            arrived.drain_while(&runtime, receiver, queued, counts, Box::pin(exported));
            deadline = Instant::now() + EVERY;
        } else if batch.is_empty() && now >= deadline {
            deadline = now + EVERY;
        }
        // What arrived during the last tries is batched first (kept for a
        // retry, its destination down) before that destination is tried
        // again: one batch between two probes of a silent collector would
        // leave the queue to fill. Yet retries wait no longer than a batch
        // delay: another destination slow enough to keep messages aside
        // must not hold a recovered one's records back for good.
        if arrived.is_empty() || flushed.is_some() || retried_at.elapsed() >= EVERY {
            // A draining pod tries what waits for a retry once more, now.
            let due = if flushed.is_some() { None } else { Some(Instant::now()) };
            let retried = retries.send_due(&http, counts, due);
            arrived.drain_while(&runtime, receiver, queued, counts, Box::pin(retried));
            // From the end of the turn: a probe that waits out its deadline
            // is followed by a batch delay of what arrived meanwhile.
            retried_at = Instant::now();
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
    }
}

/// One POST per destination and signal.
async fn export(
    http: &crate::client::Http,
    batch: Vec<(Arc<Destination>, Item)>,
    counts: &Tally,
    retries: &mut Retries,
) {
    let mut groups: Vec<(Arc<Destination>, Vec<Item>)> = Vec::new();
    for (destination, item) in batch {
        match groups.iter_mut().find(|(d, _)| Arc::ptr_eq(d, &destination) || **d == *destination) {
            Some((_, items)) => items.push(item),
            None => groups.push((destination, vec![item])),
        }
    }
    for (destination, items) in groups {
        let spans: Vec<&[u8]> = items.iter().map(|item| item.spans.as_slice()).filter(|s| !s.is_empty()).collect();
        let span_count: usize = items.iter().map(|item| item.span_count).sum();
        // A destination with records waiting for a retry is down: its spans
        // are dropped without a try, its records join the wait, and only
        // the oldest waiting batch probes it.
        let failing = retries.failing(&destination);
        let mut unreached = false;
        if span_count > 0 {
            let spans_count = u64::try_from(span_count).unwrap_or(u64::MAX);
            let sent = match failing {
                Some(_) => Sent::Unreached,
                None if retries.traces_paused(&destination) => Sent::Busy(None),
                None => {
                    let body = Bytes::from(proto::traces(&destination.source, &spans));
                    let sent = post(http, &destination, "traces", body, spans_count, counts).await;
                    if let Some(after) = sent.again() {
                        let pause = after.unwrap_or(EVERY).min(MAX_RETRY_AFTER);
                        retries.traces_paused.push((destination.clone(), Instant::now() + pause));
                    }
                    sent
                }
            };
            if sent.again().is_some() {
                counts.dropped("traces", "export_failed", spans_count);
            }
            // A collector that did not answer will not answer the records
            // now either: they are kept for its retry rather than wait out
            // a second deadline. One that answered (its traces pipeline
            // alone pushing back, say) is sent them now.
            unreached = matches!(sent, Sent::Unreached);
        }
        let records: Vec<&[u8]> = items.iter().map(|item| item.records.as_slice()).filter(|r| !r.is_empty()).collect();
        if !records.is_empty() {
            let body = Bytes::from(proto::logs(&destination.source, &records));
            let count = u64::try_from(records.len()).unwrap_or(u64::MAX);
            let retry = |tries| Retry {
                destination: destination.clone(),
                body: body.clone(),
                records: count,
                tries,
                due: Instant::now(),
            };
            match failing {
                Some(due) => retries.wait_with(retry(0), due, counts),
                None if unreached => retries.keep(retry(0), None, counts),
                None => {
                    if let Some(after) = post(http, &destination, "logs", body.clone(), count, counts).await.again() {
                        retries.keep(retry(1), after, counts);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
