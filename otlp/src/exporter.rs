//! Sends spans and usage records to the collector, off the caller's path:
//! a request (or a reconcile) hands its records to a bounded queue and
//! never waits; a thread of its own batches them (up to 512 items, or
//! every 5 s) and POSTs each batch once, with a deadline. A full queue, or a
//! collector that is down, slow or refusing, drops the records and counts
//! them on the caller's counters ([`Counts`]:
//! `waycast_gateway_telemetry_dropped_total`,
//! `waycast_operator_telemetry_dropped_total`): memory stays bounded
//! whatever the collector does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use prometheus::IntCounterVec;

use crate::destination::Destination;
use crate::proto;

/// Records waiting at most (a request's spans and record are one).
pub const QUEUE: usize = 8192;
/// Requests' records in one export at most.
const BATCH: usize = 512;
/// Longest a record waits for its batch (the OpenTelemetry SDKs' batch
/// span processor's default delay).
const EVERY: Duration = Duration::from_secs(5);
/// The most of a collector's answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Longest one export may take.
const DEADLINE: Duration = Duration::from_secs(5);

/// What a finished request (or reconcile) sends, encoded ([`proto::span`],
/// [`proto::record`]).
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
    /// Records dropped, by signal and reason (`queue_full`, `export_failed`).
    pub dropped: IntCounterVec,
}

/// What the queue carries.
enum Message {
    Record(Arc<Destination>, Item),
    /// Send what is batched now, then say so.
    Flush(SyncSender<()>),
}

/// The senders' end of the queue.
pub struct Exporter {
    queue: SyncSender<Message>,
    /// Items queued and not yet taken (an estimate: spans are shed first
    /// when the queue is half full, so usage records keep their room).
    queued: Arc<AtomicUsize>,
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
        let (sender_counts, taken) = (counts.clone(), queued.clone());
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || send_batches(&receiver, &sender_counts, &taken))?;
        Ok(Self { queue, queued, counts })
    }

    /// Queues `item` for `destination`, or drops it (counted) when the
    /// queue is full; past half full, its spans are dropped (counted) and
    /// its usage record still queued.
    pub fn send(&self, destination: &Arc<Destination>, mut item: Item) {
        if item.span_count > 0 && self.queued.load(Ordering::Relaxed) >= QUEUE / 2 {
            self.counts.dropped.with_label_values(&["traces", "queue_full"]).inc_by(item.span_count as u64);
            (item.spans, item.span_count) = (Vec::new(), 0);
            if item.records.is_empty() {
                return;
            }
        }
        let (spans, records) = (item.span_count as u64, u64::from(!item.records.is_empty()));
        self.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.queue.try_send(Message::Record(destination.clone(), item))
        {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.counts.dropped.with_label_values(&["traces", "queue_full"]).inc_by(spans);
            self.counts.dropped.with_label_values(&["logs", "queue_full"]).inc_by(records);
        }
    }

    /// Sends what is queued now, waiting at most `deadline` (a draining
    /// pod's last records).
    pub fn flush(&self, deadline: Duration) {
        let (done, wait) = sync_channel(1);
        if self.queue.send(Message::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(deadline);
        }
    }
}

fn send_batches(receiver: &Receiver<Message>, counts: &Counts, queued: &AtomicUsize) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        tracing::error!("telemetry: cannot start the export runtime; records are dropped");
        return;
    };
    let http = crate::client::Http::new();
    let mut batch: Vec<(Arc<Destination>, Item)> = Vec::with_capacity(BATCH);
    let mut deadline = Instant::now() + EVERY;
    loop {
        let mut flushed = None;
        match receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Message::Record(destination, item)) => {
                queued.fetch_sub(1, Ordering::Relaxed);
                batch.push((destination, item));
                if batch.len() < BATCH {
                    continue;
                }
            }
            Ok(Message::Flush(done)) => flushed = Some(done),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                runtime.block_on(export(&http, std::mem::take(&mut batch), counts));
                return;
            }
        }
        if !batch.is_empty() {
            runtime.block_on(export(&http, std::mem::take(&mut batch), counts));
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
        deadline = Instant::now() + EVERY;
    }
}

/// One POST per destination and signal.
async fn export(http: &crate::client::Http, batch: Vec<(Arc<Destination>, Item)>, counts: &Counts) {
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
        if span_count > 0 {
            let body = proto::traces(&destination.source, &spans);
            post(http, &destination, "traces", body, span_count, counts).await;
        }
        let records: Vec<&[u8]> = items.iter().map(|item| item.records.as_slice()).filter(|r| !r.is_empty()).collect();
        if !records.is_empty() {
            let body = proto::logs(&destination.source, &records);
            post(http, &destination, "logs", body, records.len(), counts).await;
        }
    }
}

async fn post(
    http: &crate::client::Http,
    destination: &Destination,
    signal: &'static str,
    body: Vec<u8>,
    records: usize,
    counts: &Counts,
) {
    let count = u64::try_from(records).unwrap_or(u64::MAX);
    let url = format!("{}/v1/{signal}", destination.endpoint.trim_end_matches('/'));
    let mut request = http::Request::post(&url).header(http::header::CONTENT_TYPE, "application/x-protobuf");
    for (name, value) in &destination.headers {
        request = request.header(name, value);
    }
    let Ok(request) = request.body(Full::new(Bytes::from(body))) else {
        counts.dropped.with_label_values(&[signal, "export_failed"]).inc_by(count);
        return;
    };
    let sent = tokio::time::timeout(DEADLINE, async {
        let response = http.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        // The answer is read, bounded (an empty partial success is
        // success; a collector that talks on is cut off).
        let _ = Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect().await;
        if status.is_success() { Ok(()) } else { Err(format!("status {status}")) }
    })
    .await
    .unwrap_or_else(|_| Err("timed out".into()));
    match sent {
        Ok(()) => counts.exported.with_label_values(&[signal]).inc_by(count),
        Err(error) => {
            tracing::debug!(%url, %error, "telemetry: export failed; its records are dropped");
            counts.dropped.with_label_values(&[signal, "export_failed"]).inc_by(count);
        }
    }
}
