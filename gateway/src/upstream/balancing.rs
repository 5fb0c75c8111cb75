//! A model's load-balancing settings as the request path uses them: the
//! picking policy, how a request's affinity key is taken, and the retry
//! budget that keeps retries a small share of the load.

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName};

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

/// Retries allowed: a tenth of the requests plus a burst of 10.
#[derive(Debug, Default)]
pub struct RetryBudget {
    requests: AtomicU64,
    retries: AtomicU64,
}

impl RetryBudget {
    /// Counts one request.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry if the budget allows it.
    pub fn take_retry(&self) -> bool {
        let allowed = self.requests.load(Ordering::Relaxed) / 10 + 10;
        self.retries
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| (used < allowed).then_some(used + 1))
            .is_ok()
    }
}
