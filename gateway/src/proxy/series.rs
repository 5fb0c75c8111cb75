//! The metric series a finished request writes, found once per worker
//! thread for each (model, key) rather than per request, and written on
//! that worker's own copies. A labelled lookup hashes every label, takes
//! the vector's read lock and clones an `Arc`; a write to a shared counter
//! or histogram is an atomic on a cache line every core writes. A worker's
//! cache hit is a pointer comparison, and its writes land in memory only
//! it touches ([`prometheus::local`]).
//!
//! The cache is direct-mapped and bounded ([`SLOTS`] per thread): a pair
//! that loses its slot is looked up again on its next request, as it was
//! before the cache. An entry holds its model and key names, so their
//! addresses, which the slot is chosen by and compared on, cannot be
//! reused by other names while it lives.
//!
//! A worker's local counts reach the shared series (what `/metrics`
//! renders) when the worker has no request left in flight, and otherwise
//! within [`FLUSH_WINDOW`] of the first unflushed request
//! ([`flush_on_this_thread`]); a busy worker so writes the shared cache
//! lines a few hundred times a second, not once per request per series.
//! On a thread that runs no flush task, every request's counts go out at
//! once, as before.

use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use prometheus::local::{LocalHistogram, LocalIntCounter};
use tokio::sync::Notify;

use crate::metrics::Metrics;

/// Slots per worker thread (a power of two).
const SLOTS: usize = 256;

/// The longest a busy worker keeps counts to itself.
pub const FLUSH_WINDOW: Duration = Duration::from_millis(5);

/// One (model, key)'s series, each registered on first use so that a pair
/// shows only the series it has written.
pub struct PairSeries {
    metrics_id: u64,
    model: Arc<str>,
    key: Arc<str>,
    ok: OnceCell<LocalIntCounter>,
    duration: OnceCell<LocalHistogram>,
    first_byte: OnceCell<LocalHistogram>,
    prompt_tokens: OnceCell<LocalIntCounter>,
    completion_tokens: OnceCell<LocalIntCounter>,
    rate_limit_tokens: OnceCell<LocalIntCounter>,
    admitted: OnceCell<LocalIntCounter>,
    overhead: OnceCell<LocalHistogram>,
    /// Written since its last flush, and on the thread's list to flush.
    listed: Cell<bool>,
}

/// A flushing thread's written entries.
struct Unflushed {
    series: Vec<Rc<PairSeries>>,
    first: Arc<Notify>,
}

thread_local! {
    static CACHE: RefCell<Vec<Option<Rc<PairSeries>>>> = RefCell::new(vec![None; SLOTS]);
    /// `Some` on a thread that runs [`flush_on_this_thread`].
    static UNFLUSHED: RefCell<Option<Unflushed>> = const { RefCell::new(None) };
}

/// The series of `model` and `key` in `metrics`, from this thread's cache.
pub fn pair(metrics: &Metrics, model: &Arc<str>, key: &Arc<str>) -> Rc<PairSeries> {
    let slot = slot_of(model, key);
    CACHE.with_borrow_mut(|cache| {
        let entry = &mut cache[slot];
        match entry {
            Some(series) if series.is(metrics, model, key) => series.clone(),
            _ => {
                let series = Rc::new(PairSeries::new(metrics, model.clone(), key.clone()));
                *entry = Some(series.clone());
                series
            }
        }
    })
}

fn slot_of(model: &Arc<str>, key: &Arc<str>) -> usize {
    let model = Arc::as_ptr(model).cast::<u8>() as usize as u64;
    let key = Arc::as_ptr(key).cast::<u8>() as usize as u64;
    (crate::upstream::pick::mix(model ^ key.rotate_left(29)) % SLOTS as u64) as usize
}

/// A request has written `series`: its counts go out now when `idle` (the
/// worker has no other request in flight) or the thread runs no flush
/// task, else with the thread's next flush.
pub fn written(series: &Rc<PairSeries>, idle: bool) {
    let listed = UNFLUSHED.with_borrow_mut(|unflushed| {
        let unflushed = unflushed.as_mut()?;
        if !series.listed.replace(true) {
            if unflushed.series.is_empty() {
                unflushed.first.notify_one();
            }
            unflushed.series.push(series.clone());
        }
        Some(())
    });
    match listed {
        None => series.flush(),
        Some(()) if idle => flush_this_thread(),
        Some(()) => {}
    }
}

/// Publishes this thread's written series, [`FLUSH_WINDOW`] after the
/// first write since the last flush, for as long as it runs. A worker
/// spawns it on its runtime.
pub async fn flush_on_this_thread() {
    let first = Arc::new(Notify::new());
    UNFLUSHED.set(Some(Unflushed { series: Vec::new(), first: first.clone() }));
    crate::worker::publish_batches(first, FLUSH_WINDOW, flush_this_thread).await;
}

/// Publishes what this thread's written series hold (also at a worker's
/// end).
pub fn flush_this_thread() {
    let mut listed = UNFLUSHED.with_borrow_mut(|unflushed| {
        unflushed.as_mut().map(|unflushed| std::mem::take(&mut unflushed.series)).unwrap_or_default()
    });
    for series in listed.drain(..) {
        series.listed.set(false);
        series.flush();
    }
    // Nothing is written while this runs: the emptied list, and its
    // allocation, go back.
    UNFLUSHED.with_borrow_mut(|unflushed| {
        if let Some(unflushed) = unflushed.as_mut() {
            unflushed.series = listed;
        }
    });
}

impl PairSeries {
    /// Uncached series of `model` and `key` (for a request refused before
    /// its model or key was known).
    pub fn new(metrics: &Metrics, model: Arc<str>, key: Arc<str>) -> Self {
        Self {
            metrics_id: metrics.id,
            model,
            key,
            ok: OnceCell::new(),
            duration: OnceCell::new(),
            first_byte: OnceCell::new(),
            prompt_tokens: OnceCell::new(),
            completion_tokens: OnceCell::new(),
            rate_limit_tokens: OnceCell::new(),
            admitted: OnceCell::new(),
            overhead: OnceCell::new(),
            listed: Cell::new(false),
        }
    }

    /// Adds this worker's counts to the shared series.
    fn flush(&self) {
        let counters =
            [&self.ok, &self.prompt_tokens, &self.completion_tokens, &self.rate_limit_tokens, &self.admitted];
        for counter in counters.into_iter().filter_map(OnceCell::get) {
            counter.flush();
        }
        for histogram in [&self.duration, &self.first_byte, &self.overhead].into_iter().filter_map(OnceCell::get) {
            histogram.flush();
        }
    }

    fn is(&self, metrics: &Metrics, model: &Arc<str>, key: &Arc<str>) -> bool {
        self.metrics_id == metrics.id && Arc::ptr_eq(&self.model, model) && Arc::ptr_eq(&self.key, key)
    }

    /// Counts a request answered 200 (other codes are rarer and looked up).
    pub fn ok(&self, metrics: &Metrics) -> &LocalIntCounter {
        self.ok.get_or_init(|| metrics.requests.with_label_values(&[&self.model, &self.key, "200"]).local())
    }

    /// The model's request duration.
    pub fn duration(&self, metrics: &Metrics) -> &LocalHistogram {
        self.duration.get_or_init(|| metrics.request_duration.with_label_values(&[&self.model]).local())
    }

    /// The model's time to first byte.
    pub fn first_byte(&self, metrics: &Metrics) -> &LocalHistogram {
        self.first_byte.get_or_init(|| metrics.time_to_first_byte.with_label_values(&[&self.model]).local())
    }

    /// Prompt tokens of the model and key.
    pub fn prompt_tokens(&self, metrics: &Metrics) -> &LocalIntCounter {
        self.prompt_tokens.get_or_init(|| metrics.tokens.with_label_values(&[&self.model, &self.key, "prompt"]).local())
    }

    /// Completion tokens of the model and key.
    pub fn completion_tokens(&self, metrics: &Metrics) -> &LocalIntCounter {
        self.completion_tokens
            .get_or_init(|| metrics.tokens.with_label_values(&[&self.model, &self.key, "completion"]).local())
    }

    /// Tokens charged to the key's rate limits for the model.
    pub fn rate_limit_tokens(&self, metrics: &Metrics) -> &LocalIntCounter {
        self.rate_limit_tokens
            .get_or_init(|| metrics.rate_limit_tokens.with_label_values(&[&self.model, &self.key]).local())
    }

    /// Requests of the key admitted by the rate limits for the model.
    pub fn admitted(&self, metrics: &Metrics) -> &LocalIntCounter {
        self.admitted.get_or_init(|| {
            metrics.rate_limit_requests.with_label_values(&[&self.model, &self.key, "admitted"]).local()
        })
    }

    /// The gateway's own time on a request (unlabelled: every pair's
    /// copy adds to the one histogram).
    pub fn overhead(&self, metrics: &Metrics) -> &LocalHistogram {
        self.overhead.get_or_init(|| metrics.overhead.local())
    }
}

impl Drop for PairSeries {
    /// An entry that leaves the cache, or the thread's end, loses no count.
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_found_by_its_names_and_its_metrics() {
        let metrics = Metrics::new().unwrap();
        let other_metrics = Metrics::new().unwrap();
        let (model, key) = (Arc::<str>::from("m"), Arc::<str>::from("team/k"));
        let first = pair(&metrics, &model, &key);
        assert!(Rc::ptr_eq(&first, &pair(&metrics, &model, &key)));
        // Equal names in another allocation, or another gateway's metrics,
        // are another entry.
        assert!(!Rc::ptr_eq(&first, &pair(&metrics, &Arc::from("m"), &key)));
        assert!(!Rc::ptr_eq(&pair(&metrics, &model, &key), &pair(&other_metrics, &model, &key)));
    }

    #[test]
    fn series_are_labelled_and_registered_only_when_written() {
        let metrics = Metrics::new().unwrap();
        let (model, key) = (Arc::<str>::from("m"), Arc::<str>::from("team/k"));
        let series = pair(&metrics, &model, &key);
        series.ok(&metrics).inc();
        series.prompt_tokens(&metrics).inc_by(7);
        // No flush task on this thread: out at once.
        written(&series, false);
        let text = metrics.render();
        assert!(text.contains(r#"waycast_gateway_requests_total{code="200",key="team/k",model="m"} 1"#), "{text}");
        assert!(text.contains(r#"waycast_gateway_tokens_total{key="team/k",kind="prompt",model="m"} 7"#), "{text}");
        assert!(!text.contains(r#"kind="completion""#), "{text}");
        assert!(!text.contains("waycast_gateway_rate_limit_tokens_total{"), "{text}");
    }

    /// On a worker, counts wait for the worker to be idle or for the
    /// flush window, and an entry that leaves the cache takes its counts
    /// to the shared series.
    #[tokio::test]
    async fn a_worker_publishes_when_idle_or_within_the_window() {
        let metrics = Metrics::new().unwrap();
        let flusher = tokio::spawn(flush_on_this_thread());
        tokio::task::yield_now().await;
        let requests = |text: &str, model: &str| {
            let sample = format!(r#"waycast_gateway_requests_total{{code="200",key="k",model="{model}"}} "#);
            text.lines().find_map(|line| line.strip_prefix(sample.as_str())?.parse::<u64>().ok())
        };
        let (model, key) = (Arc::<str>::from("m"), Arc::<str>::from("k"));
        let busy = pair(&metrics, &model, &key);
        for _ in 0..3 {
            busy.ok(&metrics).inc();
            busy.duration(&metrics).observe(0.01);
            written(&busy, false);
        }
        assert_eq!(requests(&metrics.render(), "m"), Some(0), "kept by the busy worker");
        tokio::time::sleep(FLUSH_WINDOW * 4).await;
        let text = metrics.render();
        assert_eq!(requests(&text, "m"), Some(3), "{text}");
        assert!(text.contains(r#"waycast_gateway_request_duration_seconds_count{model="m"} 3"#), "{text}");

        busy.ok(&metrics).inc();
        written(&busy, true);
        assert_eq!(requests(&metrics.render(), "m"), Some(4), "out as soon as the worker is idle");

        let evicted = PairSeries::new(&metrics, Arc::from("gone"), key.clone());
        evicted.ok(&metrics).inc_by(2);
        drop(evicted);
        assert_eq!(requests(&metrics.render(), "gone"), Some(2));
        flusher.abort();
    }
}
