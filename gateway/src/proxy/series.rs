//! The metric series a finished request writes, found once per worker
//! thread for each (model, key) rather than per request (a request refused
//! before either was known counts under `unknown` and `none`), and counted
//! in that worker's own pending sums, every status code included. A
//! labelled lookup hashes every label, takes the vector's read lock and
//! clones an `Arc`; a write to a shared counter or histogram is an atomic
//! on a cache line every core writes. A worker's cache hit is a pointer
//! comparison, and its writes land in memory only it touches.
//!
//! The cache is direct-mapped and bounded ([`SLOTS`] per thread): a pair
//! that loses its slot is looked up again on its next request, as it was
//! before the cache. An entry holds its model and key names, so their
//! addresses, which the slot is chosen by and compared on, cannot be
//! reused by other names while it lives.
//!
//! A worker's pending counts reach the shared series (what `/metrics`
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

use prometheus::local::LocalHistogram;
use prometheus::{Histogram, IntCounter};
use tokio::sync::Notify;

use crate::metrics::Metrics;

/// Slots per worker thread (a power of two).
const SLOTS: usize = 256;

/// The longest a busy worker keeps counts to itself.
pub const FLUSH_WINDOW: Duration = Duration::from_millis(5);

/// One (model, key)'s series: what this worker counted since its last
/// flush, and the shared series it is added to. A shared series is
/// registered at its first flush, so it appears in `/metrics` with its
/// first count, never at zero before it (a pair shows only the series it
/// has written).
pub struct PairSeries {
    metrics_id: u64,
    model: Arc<str>,
    key: Arc<str>,
    families: Families,
    ok: PendingCounter,
    /// Requests answered with other codes, by code (a few: the gateway's
    /// own refusals and what upstreams answer; at most 900 of them).
    other_codes: RefCell<Vec<(u16, PendingCounter)>>,
    prompt_tokens: PendingCounter,
    completion_tokens: PendingCounter,
    cached_tokens: PendingCounter,
    /// Cost in nano-units, in the currency it was first counted in.
    cost: PendingCounter,
    cost_currency: OnceCell<Arc<str>>,
    rate_limit_tokens: PendingCounter,
    admitted: PendingCounter,
    duration: PendingHistogram,
    first_byte: PendingHistogram,
    per_output_token: PendingHistogram,
    prompt_per_request: PendingHistogram,
    completion_per_request: PendingHistogram,
    overhead: PendingHistogram,
    /// Written since its last flush, and on the thread's list to flush.
    listed: Cell<bool>,
}

/// The shared metric families a pair's series belong to (handles on the
/// registry's own, cloned when the pair is first seen).
struct Families {
    requests: prometheus::IntCounterVec,
    tokens: prometheus::IntCounterVec,
    cost: prometheus::IntCounterVec,
    rate_limit_tokens: prometheus::IntCounterVec,
    rate_limit_requests: prometheus::IntCounterVec,
    duration: prometheus::HistogramVec,
    first_byte: prometheus::HistogramVec,
    per_output_token: prometheus::HistogramVec,
    tokens_per_request: prometheus::HistogramVec,
    overhead: Histogram,
}

/// A count not yet added to its shared counter.
#[derive(Default)]
struct PendingCounter {
    /// `None`: nothing written since the last flush.
    pending: Cell<Option<u64>>,
    shared: OnceCell<IntCounter>,
}

impl PendingCounter {
    fn add(&self, count: u64) {
        self.pending.set(Some(self.pending.get().unwrap_or(0).saturating_add(count)));
    }

    fn publish(&self, register: impl FnOnce() -> IntCounter) {
        if let Some(count) = self.pending.take() {
            self.shared.get_or_init(register).inc_by(count);
        }
    }
}

/// Observations not yet added to their shared histogram.
#[derive(Default)]
struct PendingHistogram {
    pending: RefCell<Vec<f64>>,
    local: OnceCell<LocalHistogram>,
}

/// Observations a histogram holds before it publishes them itself (a
/// worker flushes far sooner unless its timer lags).
const MAX_PENDING: usize = 1024;

impl PendingHistogram {
    /// Notes `value`; true when enough are held to publish now.
    fn observe(&self, value: f64) -> bool {
        let mut pending = self.pending.borrow_mut();
        pending.push(value);
        pending.len() >= MAX_PENDING
    }

    fn publish(&self, register: impl FnOnce() -> Histogram) {
        let mut pending = self.pending.borrow_mut();
        if pending.is_empty() {
            return;
        }
        let local = self.local.get_or_init(|| register().local());
        for value in pending.drain(..) {
            local.observe(value);
        }
        local.flush();
    }
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

/// The model of a request refused before its model was known.
pub fn unknown_model() -> &'static Arc<str> {
    static UNKNOWN: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("unknown"));
    &UNKNOWN
}

/// The key of a request refused before its key was known.
pub fn no_key() -> &'static Arc<str> {
    static NONE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("none"));
    &NONE
}

/// `status` (at most 999) as three digits, without allocating.
fn status_text(digits: &mut [u8; 3], status: u16) -> &str {
    let status = status.min(999);
    digits[0] = b'0' + u8::try_from(status / 100).unwrap_or(0);
    digits[1] = b'0' + u8::try_from(status / 10 % 10).unwrap_or(0);
    digits[2] = b'0' + u8::try_from(status % 10).unwrap_or(0);
    std::str::from_utf8(digits).unwrap_or("000")
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
    crate::per_worker::publish_batches(first, FLUSH_WINDOW, flush_this_thread).await;
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
    /// Series of `model` and `key`, outside the cache (which makes them).
    fn new(metrics: &Metrics, model: Arc<str>, key: Arc<str>) -> Self {
        Self {
            metrics_id: metrics.id,
            model,
            key,
            families: Families {
                requests: metrics.requests.clone(),
                tokens: metrics.tokens.clone(),
                cost: metrics.cost.clone(),
                rate_limit_tokens: metrics.rate_limit_tokens.clone(),
                rate_limit_requests: metrics.rate_limit_requests.clone(),
                duration: metrics.request_duration.clone(),
                first_byte: metrics.time_to_first_byte.clone(),
                per_output_token: metrics.time_per_output_token.clone(),
                tokens_per_request: metrics.tokens_per_request.clone(),
                overhead: metrics.overhead.clone(),
            },
            ok: PendingCounter::default(),
            other_codes: RefCell::new(Vec::new()),
            prompt_tokens: PendingCounter::default(),
            completion_tokens: PendingCounter::default(),
            cached_tokens: PendingCounter::default(),
            cost: PendingCounter::default(),
            cost_currency: OnceCell::new(),
            rate_limit_tokens: PendingCounter::default(),
            admitted: PendingCounter::default(),
            duration: PendingHistogram::default(),
            first_byte: PendingHistogram::default(),
            per_output_token: PendingHistogram::default(),
            prompt_per_request: PendingHistogram::default(),
            completion_per_request: PendingHistogram::default(),
            overhead: PendingHistogram::default(),
            listed: Cell::new(false),
        }
    }

    fn is(&self, metrics: &Metrics, model: &Arc<str>, key: &Arc<str>) -> bool {
        self.metrics_id == metrics.id && Arc::ptr_eq(&self.model, model) && Arc::ptr_eq(&self.key, key)
    }

    /// Counts a request answered `status`.
    pub fn count_status(&self, status: u16) {
        if status == 200 {
            self.ok.add(1);
            return;
        }
        let status = status.min(999);
        let mut codes = self.other_codes.borrow_mut();
        match codes.iter().find(|(code, _)| *code == status) {
            Some((_, counter)) => counter.add(1),
            None => {
                let counter = PendingCounter::default();
                counter.add(1);
                codes.push((status, counter));
            }
        }
    }

    /// Prompt and completion tokens of the model and key.
    pub fn count_tokens(&self, prompt: u64, completion: u64) {
        self.prompt_tokens.add(prompt);
        self.completion_tokens.add(completion);
    }

    /// Prompt tokens the server read from its cache.
    pub fn count_cached_tokens(&self, tokens: u64) {
        self.cached_tokens.add(tokens);
    }

    /// A request's cost, in nano-units of `currency`. A pair counts in the
    /// currency it first saw; a model repriced in another currency counts
    /// under that one's series directly.
    pub fn count_cost(&self, nanos: u64, currency: &Arc<str>) {
        let first = self.cost_currency.get_or_init(|| currency.clone());
        if **first == **currency {
            self.cost.add(nanos);
        } else {
            self.families.cost.with_label_values(&[&*self.model, &*self.key, &**currency]).inc_by(nanos);
        }
    }

    /// Tokens charged to the key's rate limits for the model.
    pub fn count_rate_limit_tokens(&self, tokens: u64) {
        self.rate_limit_tokens.add(tokens);
    }

    /// A request of the key admitted by the rate limits for the model.
    pub fn count_admitted(&self) {
        self.admitted.add(1);
    }

    /// The model's request duration, in seconds.
    pub fn observe_duration(&self, seconds: f64) {
        if self.duration.observe(seconds) {
            self.publish_histograms();
        }
    }

    /// The model's time to first byte, in seconds.
    pub fn observe_first_byte(&self, seconds: f64) {
        if self.first_byte.observe(seconds) {
            self.publish_histograms();
        }
    }

    /// The model's mean time between output tokens after the first, in
    /// seconds, of one response.
    pub fn observe_per_output_token(&self, seconds: f64) {
        if self.per_output_token.observe(seconds) {
            self.publish_histograms();
        }
    }

    /// The prompt and completion tokens of one request of the model.
    pub fn observe_request_tokens(&self, prompt: u64, completion: u64) {
        // Precision past 2^53 tokens is of no matter to a bucket.
        #[allow(clippy::cast_precision_loss)]
        let full =
            self.prompt_per_request.observe(prompt as f64) | self.completion_per_request.observe(completion as f64);
        if full {
            self.publish_histograms();
        }
    }

    /// The gateway's own time on a request, in seconds (unlabelled: every
    /// pair's copy adds to the one histogram).
    pub fn observe_overhead(&self, seconds: f64) {
        if self.overhead.observe(seconds) {
            self.publish_histograms();
        }
    }

    /// Adds this worker's counts to the shared series.
    fn flush(&self) {
        let (model, key, families) = (&*self.model, &*self.key, &self.families);
        self.ok.publish(|| families.requests.with_label_values(&[model, key, "200"]));
        for (code, counter) in self.other_codes.borrow().iter() {
            let mut digits = [b'0'; 3];
            let code = status_text(&mut digits, *code);
            counter.publish(|| families.requests.with_label_values(&[model, key, code]));
        }
        self.prompt_tokens.publish(|| families.tokens.with_label_values(&[model, key, "prompt"]));
        self.completion_tokens.publish(|| families.tokens.with_label_values(&[model, key, "completion"]));
        self.cached_tokens.publish(|| families.tokens.with_label_values(&[model, key, "cached_prompt"]));
        if let Some(currency) = self.cost_currency.get() {
            self.cost.publish(|| families.cost.with_label_values(&[model, key, currency]));
        }
        self.rate_limit_tokens.publish(|| families.rate_limit_tokens.with_label_values(&[model, key]));
        self.admitted.publish(|| families.rate_limit_requests.with_label_values(&[model, key, "admitted"]));
        self.publish_histograms();
    }

    fn publish_histograms(&self) {
        let (model, families) = (&*self.model, &self.families);
        self.duration.publish(|| families.duration.with_label_values(&[model]));
        self.first_byte.publish(|| families.first_byte.with_label_values(&[model]));
        self.per_output_token.publish(|| families.per_output_token.with_label_values(&[model]));
        self.prompt_per_request.publish(|| families.tokens_per_request.with_label_values(&[model, "prompt"]));
        self.completion_per_request.publish(|| families.tokens_per_request.with_label_values(&[model, "completion"]));
        self.overhead.publish(|| families.overhead.clone());
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
        series.count_status(200);
        series.prompt_tokens.add(7);
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
            busy.count_status(200);
            busy.observe_duration(0.01);
            written(&busy, false);
        }
        // Not shown at all until published: never a zero before its count.
        let text = metrics.render();
        assert_eq!(requests(&text, "m"), None, "kept by the busy worker: {text}");
        assert!(!text.contains(r#"waycast_gateway_request_duration_seconds_count{model="m"}"#), "{text}");
        tokio::time::sleep(FLUSH_WINDOW * 4).await;
        let text = metrics.render();
        assert_eq!(requests(&text, "m"), Some(3), "{text}");
        assert!(text.contains(r#"waycast_gateway_request_duration_seconds_count{model="m"} 3"#), "{text}");

        busy.count_status(200);
        written(&busy, true);
        assert_eq!(requests(&metrics.render(), "m"), Some(4), "out as soon as the worker is idle");

        let evicted = PairSeries::new(&metrics, Arc::from("gone"), key.clone());
        evicted.ok.add(2);
        drop(evicted);
        assert_eq!(requests(&metrics.render(), "gone"), Some(2));
        flusher.abort();
    }

    #[test]
    fn status_codes_format_without_allocating() {
        let mut digits = [b'0'; 3];
        assert_eq!(status_text(&mut digits, 200), "200");
        assert_eq!(status_text(&mut digits, 499), "499");
        assert_eq!(status_text(&mut digits, 1200), "999");
    }

    /// Refused requests count per worker too, under their codes, and one
    /// refused before its key was known under `unknown` and `none`.
    #[tokio::test]
    async fn other_codes_are_counted_per_worker_by_code() {
        let metrics = Metrics::new().unwrap();
        let flusher = tokio::spawn(flush_on_this_thread());
        tokio::task::yield_now().await;
        let refused = pair(&metrics, unknown_model(), no_key());
        assert!(Rc::ptr_eq(&refused, &pair(&metrics, unknown_model(), no_key())), "cached like any pair");
        for status in [401, 401, 401, 429, 200, 1200] {
            refused.count_status(status);
            written(&refused, false);
        }
        assert!(!metrics.render().contains(r#"code="401""#), "held by the busy worker");
        tokio::time::sleep(FLUSH_WINDOW * 4).await;
        let text = metrics.render();
        for (code, count) in [("401", 3), ("429", 1), ("200", 1), ("999", 1)] {
            let line = format!(r#"waycast_gateway_requests_total{{code="{code}",key="none",model="unknown"}} {count}"#);
            assert!(text.contains(&line), "{line}: {text}");
        }
        assert_eq!(refused.other_codes.borrow().len(), 3, "one pending count per code");
        flusher.abort();
    }

    /// A histogram whose worker does not flush in time publishes by itself
    /// once it holds [`MAX_PENDING`] observations.
    #[test]
    fn held_observations_are_bounded() {
        let metrics = Metrics::new().unwrap();
        let series = PairSeries::new(&metrics, Arc::from("m"), Arc::from("k"));
        for _ in 0..MAX_PENDING {
            series.observe_overhead(0.000_01);
        }
        assert!(series.overhead.pending.borrow().is_empty());
        let text = metrics.render();
        assert!(text.contains(&format!("waycast_gateway_overhead_seconds_count {MAX_PENDING}")), "{text}");
    }
}
