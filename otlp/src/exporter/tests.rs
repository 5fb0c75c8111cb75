use prometheus::IntCounterVec;

use super::*;

pub(super) fn counts() -> Counts {
    let opts = |name: &str| prometheus::Opts::new(name, "test");
    Counts {
        exported: IntCounterVec::new(opts("exported"), &["signal"]).unwrap(),
        dropped: IntCounterVec::new(opts("dropped"), &["signal", "reason"]).unwrap(),
    }
}

/// The export thread's counting over fresh [`counts`].
pub(super) fn tally() -> Tally {
    Tally { counts: counts(), closed: Arc::default() }
}

fn retry(bytes: usize, tries: u32) -> Retry {
    let destination =
        Arc::new(Destination::new("http://127.0.0.1:9", &Default::default(), &Default::default(), "test"));
    Retry { destination, body: Bytes::from(vec![0; bytes]), records: 10, tries, due: Instant::now() }
}

#[test]
fn a_destination_with_a_batch_waiting_is_failing_and_new_batches_wait_with_it() {
    let tally = tally();
    let mut retries = Retries::default();
    let down = retry(100, 1);
    let other = Destination::new("http://127.0.0.1:10", &Default::default(), &Default::default(), "test");
    assert_eq!(retries.failing(&down.destination), None);
    let (same, due) = (
        Destination::new("http://127.0.0.1:9", &Default::default(), &Default::default(), "test"),
        Instant::now() + Duration::from_secs(7),
    );
    retries.keep(down, None, &tally);
    // Equal by value: a config reload's new Arc is the same collector.
    let probe = retries.failing(&same).expect("failing");
    assert_eq!(retries.failing(&other), None);
    retries.wait_with(retry(100, 0), due, &tally);
    assert_eq!(retries.waiting.len(), 2);
    assert_eq!(retries.waiting[1].due, due);
    assert_eq!(retries.failing(&same), Some(probe.min(due)));
}

/// A collector that accepts and never answers holds an export for its
/// whole deadline; the queue is emptied meanwhile, so records sent
/// then (more than the queue holds) wait for a retry instead of being
/// dropped as the queue fills.
#[test]
fn records_sent_while_an_export_hangs_are_taken_off_the_queue() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().collect();
        drop(held);
    });
    let counts = counts();
    let exporter = Exporter::start(counts.clone()).unwrap();
    let destination =
        Arc::new(Destination::new(&format!("http://{address}"), &Default::default(), &Default::default(), "test"));
    let record = || Item { records: vec![0x0a, 0], spans: vec![0x0a, 0], span_count: 1 };
    // A full batch: its export starts and hangs.
    for _ in 0..BATCH {
        exporter.send(&destination, record());
    }
    std::thread::sleep(Duration::from_millis(200));
    // More than the queue holds, well within the export's deadline.
    for _ in 0..12 {
        for _ in 0..1000 {
            exporter.send(&destination, record());
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    let queue_full = counts.dropped.with_label_values(&["logs", "queue_full"]).get();
    assert_eq!(queue_full, 0, "records dropped at a full queue while an export hung");
    assert_eq!(counts.exported.with_label_values(&["logs"]).get(), 0, "the silent collector took nothing");
}

#[test]
fn a_retry_after_shorter_than_the_backoff_does_not_hurry_it() {
    let tally = tally();
    let mut retries = Retries::default();
    let before = Instant::now();
    retries.keep(retry(1, 3), Some(Duration::ZERO), &tally);
    // The third try's wait: 4 s less up to a fifth.
    assert!(retries.waiting[0].due >= before + Duration::from_millis(3200));
    retries.keep(retry(1, 3), None, &tally);
    assert!(retries.waiting[1].due >= before + Duration::from_millis(3200));
}

#[test]
fn waits_double_to_half_a_minute_less_a_random_fifth() {
    for (tries, full) in [(1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (40, 30)] {
        let wait = backoff(tries);
        let full = Duration::from_secs(full);
        assert!(wait <= full && wait >= full - full / 5, "try {tries}: {wait:?}");
    }
}

#[test]
fn kept_batches_stay_within_their_bytes_and_tries_dropping_the_oldest_counted() {
    let tally = tally();
    let counts = &tally.counts;
    let mut retries = Retries::default();
    retries.keep(retry(RETRY_BYTES / 2, 1), None, &tally);
    retries.keep(retry(RETRY_BYTES / 2, 1), Some(Duration::from_secs(600)), &tally);
    assert_eq!((retries.waiting.len(), retries.bytes), (2, RETRY_BYTES));
    // A Retry-After is honoured up to a minute.
    assert!(retries.waiting[1].due <= Instant::now() + MAX_RETRY_AFTER);
    retries.keep(retry(1, 1), None, &tally);
    assert_eq!(retries.waiting.len(), 2, "the oldest went");
    assert_eq!(retries.bytes, RETRY_BYTES / 2 + 1);
    assert_eq!(retries.waiting.back().map(|r| r.body.len()), Some(1), "the newest stays");
    assert_eq!(counts.dropped.with_label_values(&["logs", "retry_full"]).get(), 10);
    retries.keep(retry(1, MAX_TRIES), None, &tally);
    assert_eq!(retries.waiting.len(), 2);
    assert_eq!(counts.dropped.with_label_values(&["logs", "export_failed"]).get(), 10);
}

/// A collector on a socket of its own: `answer` gives, for each request's
/// path (`/v1/traces`, `/v1/logs`), the status, a `Retry-After` if any and
/// how long to wait before answering; the posts are counted.
fn collector(answer: impl Fn(&str) -> (u16, Option<u64>, Duration) + Send + Sync + 'static) -> (String, Arc<Asked>) {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (answer, asked) = (Arc::new(answer), Arc::new(Asked::default()));
    let kept = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (answer, asked) = (answer.clone(), asked.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        if header.trim().is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    reader.by_ref().take(length).read_to_end(&mut Vec::new()).unwrap();
                    match path.as_str() {
                        "/v1/logs" => asked.logs.fetch_add(1, Ordering::Relaxed),
                        _ => asked.traces.fetch_add(1, Ordering::Relaxed),
                    };
                    let (status, retry_after, wait) = answer(&path);
                    std::thread::sleep(wait);
                    let retry_after = retry_after.map(|s| format!("retry-after: {s}\r\n")).unwrap_or_default();
                    let head = format!("HTTP/1.1 {status} X\r\n{retry_after}content-length: 0\r\n\r\n");
                    if writer.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, kept)
}

/// Posts a [`collector`] was sent.
#[derive(Default)]
struct Asked {
    traces: AtomicUsize,
    logs: AtomicUsize,
}

fn destination(endpoint: &str) -> Arc<Destination> {
    Arc::new(Destination::new(endpoint, &Default::default(), &Default::default(), "test"))
}

fn item() -> Item {
    Item { records: vec![0x0a, 0], spans: vec![0x0a, 0], span_count: 1 }
}

/// A collector whose traces pipeline alone pushes back (429 or 503 with a
/// `Retry-After`) still takes the records, sent now, not after its wait;
/// its traces are not asked again before the wait is over.
#[test]
fn records_are_sent_when_only_the_traces_pipeline_pushes_back() {
    let (endpoint, asked) = collector(|path| match path {
        "/v1/traces" => (503, Some(60), Duration::ZERO),
        _ => (200, None, Duration::ZERO),
    });
    let counts = counts();
    let exporter = Exporter::start(counts.clone()).unwrap();
    let destination = destination(&endpoint);
    // Two full batches: each sent at once, no flush (which would send
    // what waits for a retry regardless of its wait).
    let started = Instant::now();
    (0..2 * BATCH).for_each(|_| exporter.send(&destination, item()));
    while counts.exported.with_label_values(&["logs"]).get() < 2 * BATCH as u64 {
        assert!(started.elapsed() < Duration::from_secs(3), "records held back by the traces' Retry-After");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(asked.logs.load(Ordering::Relaxed), 2);
    assert_eq!(asked.traces.load(Ordering::Relaxed), 1, "traces asked again within their Retry-After");
    assert_eq!(counts.dropped.with_label_values(&["traces", "export_failed"]).get(), 2 * BATCH as u64);
}

/// A flush that runs out of time (the collector holds the export) counts
/// the records it leaves, and closes the exporter: what is sent after is
/// counted at once, and the export that ends after is not counted again.
#[test]
fn records_a_flush_leaves_undelivered_are_counted_once() {
    let (endpoint, _) = collector(|_| (200, None, Duration::from_millis(800)));
    let counts = counts();
    let exporter = Exporter::start(counts.clone()).unwrap();
    let destination = destination(&endpoint);
    let record = || Item { records: vec![0x0a, 0], ..Item::default() };
    (0..10).for_each(|_| exporter.send(&destination, record()));
    let started = Instant::now();
    exporter.flush(Duration::from_millis(300));
    assert!(started.elapsed() < Duration::from_secs(2), "the flush kept to its deadline");
    let shutdown = || counts.dropped.with_label_values(&["logs", "shutdown"]).get();
    assert_eq!(shutdown(), 10);
    exporter.send(&destination, record());
    assert_eq!(shutdown(), 11, "sent after the flush");
    // The held export is answered 200 after the flush: already counted.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(counts.exported.with_label_values(&["logs"]).get(), 0);
    assert_eq!(shutdown(), 11);
}

/// One destination slow enough that messages are always waiting aside
/// does not hold another's retry back: the recovered one is tried again
/// within a batch delay.
#[test]
fn a_slow_destination_does_not_hold_back_anothers_retries() {
    let refused_once = std::sync::atomic::AtomicBool::new(false);
    let (recovered, asked) = collector(move |_| match refused_once.swap(true, Ordering::Relaxed) {
        false => (503, None, Duration::ZERO),
        true => (200, None, Duration::ZERO),
    });
    let (slow, _) = collector(|_| (200, None, Duration::from_millis(200)));
    let counts = counts();
    let exporter = Exporter::start(counts.clone()).unwrap();
    let (recovered, slow) = (destination(&recovered), destination(&slow));
    // A full batch is sent at once, refused, and kept for a retry in a
    // second or so.
    (0..BATCH).for_each(|_| exporter.send(&recovered, Item { records: vec![0x0a, 0], ..Item::default() }));
    while asked.logs.load(Ordering::Relaxed) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Some 4,000 a second to a collector that takes 400 ms an export:
    // more arrive during each export than one batch takes.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) && asked.logs.load(Ordering::Relaxed) < 2 {
        (0..4).for_each(|_| exporter.send(&slow, item()));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(asked.logs.load(Ordering::Relaxed), 2, "the recovered collector was not tried again under load");
}

/// One export to a collector whose traces pipeline alone pushes back: its
/// records are taken in that export, nothing waits for a retry, and its
/// traces are paused.
#[test]
fn an_export_sends_the_records_at_once_when_only_traces_push_back() {
    let (endpoint, asked) = collector(|path| match path {
        "/v1/traces" => (503, Some(60), Duration::ZERO),
        _ => (200, None, Duration::ZERO),
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (http, tally, mut retries) = (crate::client::Http::new(), tally(), Retries::default());
    let destination = destination(&endpoint);
    let batch = (0..3).map(|_| (destination.clone(), item())).collect();
    runtime.block_on(export(&http, batch, &tally, &mut retries));
    assert!(retries.waiting.is_empty(), "records kept for a retry");
    assert_eq!(tally.counts.exported.with_label_values(&["logs"]).get(), 3);
    assert_eq!((asked.traces.load(Ordering::Relaxed), asked.logs.load(Ordering::Relaxed)), (1, 1));
    assert!(retries.traces_paused(&destination));
}

/// A destination with a batch waiting for its retry is down: a new export
/// for it posts nothing, drops its spans (counted) and its records wait
/// with the others, due with them.
#[test]
fn an_export_for_a_failing_destination_posts_nothing_and_waits_with_it() {
    let (endpoint, asked) = collector(|_| (200, None, Duration::ZERO));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (http, tally, mut retries) = (crate::client::Http::new(), tally(), Retries::default());
    let destination = destination(&endpoint);
    let waiting = Retry {
        destination: destination.clone(),
        body: Bytes::from_static(b"x"),
        records: 1,
        tries: 1,
        due: Instant::now(),
    };
    retries.keep(waiting, Some(Duration::from_secs(30)), &tally);
    let batch = (0..3).map(|_| (destination.clone(), item())).collect();
    runtime.block_on(export(&http, batch, &tally, &mut retries));
    assert_eq!(asked.traces.load(Ordering::Relaxed) + asked.logs.load(Ordering::Relaxed), 0, "posted");
    assert_eq!(retries.waiting.len(), 2);
    assert_eq!(retries.waiting[0].due, retries.waiting[1].due, "due with the batch before");
    assert_eq!(tally.counts.dropped.with_label_values(&["traces", "export_failed"]).get(), 3);
}
