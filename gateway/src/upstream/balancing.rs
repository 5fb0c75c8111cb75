//! A model's load-balancing settings as the request path uses them: the
//! picking policy, how a request's affinity key is taken, and the retry
//! budget that keeps retries a small share of the load.

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName};

use crate::per_worker::PerWorker;

/// A model's load-balancing settings, pre-parsed.
#[derive(Debug, Clone)]
pub struct Balancing {
    /// The policy.
    pub policy: crate::upstream::pick::Policy,
    /// Bytes of the prompt hashed for prefix affinity.
    pub prefix_bytes: usize,
    /// The client header that names a session, for prefix affinity.
    pub session_header: Option<HeaderName>,
    /// Upstream statuses sent again to another endpoint.
    pub retry_on_status: Box<[u16]>,
}

impl Balancing {
    pub(crate) fn from_config(config: &waycast_crds::config::LoadBalancingConfig) -> Self {
        use crate::upstream::pick::Policy;
        use waycast_crds::config::LoadBalancingPolicy;
        let policy = match config.policy {
            LoadBalancingPolicy::LeastRequest => Policy::LeastRequest,
            LoadBalancingPolicy::RoundRobin => Policy::RoundRobin,
            LoadBalancingPolicy::PrefixAffinity => {
                Policy::PrefixAffinity { load_factor: f64::from(config.load_factor_percent) / 100.0 }
            }
        };
        Self {
            policy,
            prefix_bytes: usize::try_from(config.prefix_bytes).unwrap_or(usize::MAX),
            session_header: config.session_header.as_deref().and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
            retry_on_status: config.retry_on_status.clone().into_boxed_slice(),
        }
    }

    /// Whether an answer with `status` is sent again to another endpoint;
    /// with the label it is counted under.
    pub fn retries(&self, status: http::StatusCode) -> Option<&'static str> {
        if !self.retry_on_status.contains(&status.as_u16()) {
            return None;
        }
        Some(match status.as_u16() {
            429 => "status_429",
            500 => "status_500",
            502 => "status_502",
            503 => "status_503",
            504 => "status_504",
            _ => "status_other",
        })
    }

    /// The request's affinity key under prefix affinity: its session
    /// header's value, else the first `prefix_bytes` of its prompt.
    pub fn affinity(&self, headers: &HeaderMap, body: &[u8], prompt_start: Option<usize>) -> Option<u64> {
        use crate::upstream::pick::{Policy, affinity_hash};
        if !matches!(self.policy, Policy::PrefixAffinity { .. }) {
            return None;
        }
        if let Some(value) = self.session_header.as_ref().and_then(|name| headers.get(name)) {
            return Some(affinity_hash(value.as_bytes()));
        }
        let start = prompt_start?;
        let end = start.saturating_add(self.prefix_bytes).min(body.len());
        body.get(start..end).map(affinity_hash)
    }
}

/// Retries allowed: a tenth of the requests plus a burst of 10, counted per
/// worker thread. Every request counts itself, so one shared counter would
/// be a cache line written by every core per request; each worker writes
/// only its own shard instead (1 KiB per model).
#[derive(Debug, Default)]
pub struct RetryBudget {
    shards: PerWorker<RetryShard>,
}

/// One worker's counts.
#[derive(Debug, Default)]
struct RetryShard {
    requests: AtomicU64,
    retries: AtomicU64,
}

impl RetryBudget {
    fn shard(&self) -> &RetryShard {
        self.shards.mine()
    }

    /// Counts one request.
    pub fn request(&self) {
        self.shard().requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry if the budget allows it.
    pub fn take_retry(&self) -> bool {
        let shard = self.shard();
        let allowed = shard.requests.load(Ordering::Relaxed) / 10 + 10;
        shard
            .retries
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| (used < allowed).then_some(used + 1))
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retries_granted(budget: &RetryBudget) -> usize {
        std::iter::from_fn(|| budget.take_retry().then_some(())).take(1_000).count()
    }

    #[test]
    fn the_retry_budget_is_a_tenth_plus_ten_and_each_worker_has_its_own() {
        let budget = RetryBudget::default();
        assert_eq!(retries_granted(&budget), 10, "the burst");
        for _ in 0..100 {
            budget.request();
        }
        assert_eq!(retries_granted(&budget), 10, "a tenth of 100 requests");
        std::thread::scope(|scope| {
            scope.spawn(|| {
                crate::per_worker::become_worker(1);
                assert_eq!(retries_granted(&budget), 10, "another worker has its own burst");
                budget.request();
                assert!(!budget.take_retry(), "and its own count of requests");
            });
        });
        assert_eq!(retries_granted(&budget), 0, "worker 0 spent its budget");
    }
}
