//! How a model's requests are spread over a backend's endpoints, in the
//! config (`ModelConfig::load_balancing`).

use serde::{Deserialize, Serialize};

/// How a model's requests are spread over a backend's endpoints.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadBalancingConfig {
    /// The policy.
    #[serde(default)]
    pub policy: LoadBalancingPolicy,
    /// `PrefixAffinity`: how many bytes of the prompt (`messages`, `input`
    /// or `prompt`, from its start) are hashed.
    #[serde(default = "LoadBalancingConfig::default_prefix_bytes")]
    pub prefix_bytes: u32,
    /// `PrefixAffinity`: an endpoint keeps its prefixes while it carries at
    /// most this percentage of the mean load (at least 100).
    #[serde(default = "LoadBalancingConfig::default_load_factor_percent")]
    pub load_factor_percent: u32,
    /// `PrefixAffinity`: a client header whose value, when present, is the
    /// affinity key instead of the prompt (a session or conversation id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_header: Option<String>,
    /// Upstream statuses a request is sent again for, to another endpoint of
    /// the same Service (before any byte reached the client, within the
    /// retry budget); a subset of [`RETRYABLE_STATUSES`].
    #[serde(default = "LoadBalancingConfig::default_retry_on_status")]
    pub retry_on_status: Vec<u16>,
}

/// The statuses `retryOnStatus` may name: an endpoint's overload or failure,
/// never an answer about the request itself.
pub const RETRYABLE_STATUSES: [u16; 5] = [429, 500, 502, 503, 504];

impl LoadBalancingConfig {
    fn default_retry_on_status() -> Vec<u16> {
        vec![429, 503]
    }

    const fn default_prefix_bytes() -> u32 {
        256
    }
    const fn default_load_factor_percent() -> u32 {
        125
    }

    /// Whether this is the default (left out of written configs).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for LoadBalancingConfig {
    fn default() -> Self {
        Self {
            policy: LoadBalancingPolicy::default(),
            prefix_bytes: Self::default_prefix_bytes(),
            load_factor_percent: Self::default_load_factor_percent(),
            session_header: None,
            retry_on_status: Self::default_retry_on_status(),
        }
    }
}

/// How one request's endpoint is chosen.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadBalancingPolicy {
    /// The endpoint with the fewest requests in flight (of all, up to 8;
    /// of two at random, beyond).
    #[default]
    LeastRequest,
    /// Each endpoint in turn.
    RoundRobin,
    /// The same prompt prefix (or session) to the same endpoint, within a
    /// bound on its load, so inference servers' prefix caches hit.
    PrefixAffinity,
}
