//! The metric series a finished request writes, found once per worker
//! thread for each (model, key) rather than per request. A labelled
//! lookup hashes every label, takes the vector's read lock and clones an
//! `Arc`, each write on a cache line every core shares; a worker's cache
//! hit is a pointer comparison in memory only that worker touches.
//!
//! The cache is direct-mapped and bounded ([`SLOTS`] per thread): a pair
//! that loses its slot is looked up again on its next request, as it was
//! before the cache. An entry holds its model and key names, so their
//! addresses, which the slot is chosen by and compared on, cannot be
//! reused by other names while it lives.

use std::cell::{OnceCell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use prometheus::{Histogram, IntCounter};

use crate::metrics::Metrics;

/// Slots per worker thread (a power of two).
const SLOTS: usize = 256;

/// One (model, key)'s series, each registered on first use so that a pair
/// shows only the series it has written.
pub struct PairSeries {
    metrics_id: u64,
    model: Arc<str>,
    key: Arc<str>,
    ok: OnceCell<IntCounter>,
    duration: OnceCell<Histogram>,
    first_byte: OnceCell<Histogram>,
    prompt_tokens: OnceCell<IntCounter>,
    completion_tokens: OnceCell<IntCounter>,
    rate_limit_tokens: OnceCell<IntCounter>,
}

thread_local! {
    static CACHE: RefCell<Vec<Option<Rc<PairSeries>>>> = RefCell::new(vec![None; SLOTS]);
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
        }
    }

    fn is(&self, metrics: &Metrics, model: &Arc<str>, key: &Arc<str>) -> bool {
        self.metrics_id == metrics.id && Arc::ptr_eq(&self.model, model) && Arc::ptr_eq(&self.key, key)
    }

    /// Counts a request answered 200 (other codes are rarer and looked up).
    pub fn ok(&self, metrics: &Metrics) -> &IntCounter {
        self.ok.get_or_init(|| metrics.requests.with_label_values(&[&self.model, &self.key, "200"]))
    }

    /// The model's request duration.
    pub fn duration(&self, metrics: &Metrics) -> &Histogram {
        self.duration.get_or_init(|| metrics.request_duration.with_label_values(&[&self.model]))
    }

    /// The model's time to first byte.
    pub fn first_byte(&self, metrics: &Metrics) -> &Histogram {
        self.first_byte.get_or_init(|| metrics.time_to_first_byte.with_label_values(&[&self.model]))
    }

    /// Prompt tokens of the model and key.
    pub fn prompt_tokens(&self, metrics: &Metrics) -> &IntCounter {
        self.prompt_tokens.get_or_init(|| metrics.tokens.with_label_values(&[&self.model, &self.key, "prompt"]))
    }

    /// Completion tokens of the model and key.
    pub fn completion_tokens(&self, metrics: &Metrics) -> &IntCounter {
        self.completion_tokens.get_or_init(|| metrics.tokens.with_label_values(&[&self.model, &self.key, "completion"]))
    }

    /// Tokens charged to the key's rate limits for the model.
    pub fn rate_limit_tokens(&self, metrics: &Metrics) -> &IntCounter {
        self.rate_limit_tokens.get_or_init(|| metrics.rate_limit_tokens.with_label_values(&[&self.model, &self.key]))
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
        let text = metrics.render();
        assert!(text.contains(r#"waycast_gateway_requests_total{code="200",key="team/k",model="m"} 1"#), "{text}");
        assert!(text.contains(r#"waycast_gateway_tokens_total{key="team/k",kind="prompt",model="m"} 7"#), "{text}");
        assert!(!text.contains(r#"kind="completion""#), "{text}");
        assert!(!text.contains("waycast_gateway_rate_limit_tokens_total{"), "{text}");
    }
}
