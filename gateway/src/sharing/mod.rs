//! Sharing a saturated model between teams (DESIGN "Sharing capacity and
//! spend"): when a model's requests in flight from this pod reach its share
//! of the model's capacity, requests wait in the model's gate — classes in
//! strict order, tenants by weight on tokens, a tenant's keys in turn, FIFO
//! per key — with headroom above the capacity for a tenant under its share.
//!
//! ```text
//! fair_queue.rs  which waiting request goes next (pure)
//! scheduler.rs   at once, queued, or refused; what a release lets go (pure)
//! gate.rs        the model's task, by channel: arrivals, departures, releases; Seat, the place held
//! ```
//!
//! The capacity of a model is `capacity.maxInFlightPerEndpoint` × its
//! endpoints (a `url` backend, or a Service backend's endpoints before any
//! is known, counts as one); each pod holds its share, the capacity divided
//! by the Gateway's live pods (rounded down, at least 1), so the pods'
//! shares add up to at most the model's capacity.

pub mod fair_queue;
pub mod gate;
pub mod scheduler;

use std::sync::Arc;
use std::time::Duration;

use waycast_crds::config::{CapacityConfig, SharingConfig};

pub use gate::{Bounds, ModelGate, Refused, Seat};

use crate::upstream::endpoints::EndpointTable;

/// A route's gate and what sizes it.
pub struct Gated {
    /// The model's gate (kept across configs).
    pub gate: Arc<ModelGate>,
    per_endpoint: u32,
    /// Per backend, the Service whose endpoints serve it (`None`: one endpoint).
    endpoints: Vec<Option<Arc<str>>>,
    burst_percent: u32,
    max_queued: usize,
    /// Longest a request waits.
    pub max_wait: Duration,
    /// The class names, highest first (the same for every route of a config).
    pub classes: Arc<[String]>,
}

impl Gated {
    /// The gate of a route with `capacity`, whose backends are served by
    /// `endpoints` (a Service key each, or `None`), under `sharing`.
    pub fn new(
        gate: Arc<ModelGate>,
        capacity: CapacityConfig,
        endpoints: impl Iterator<Item = Option<Arc<str>>>,
        sharing: &SharingConfig,
        classes: Arc<[String]>,
    ) -> Self {
        Self {
            gate,
            per_endpoint: capacity.max_in_flight_per_endpoint.max(1),
            endpoints: endpoints.collect(),
            burst_percent: sharing.burst_percent,
            max_queued: usize::try_from(sharing.max_queued).unwrap_or(usize::MAX),
            max_wait: sharing.max_wait,
            classes,
        }
    }

    /// This pod's bounds with the endpoints `table` knows and `shares` live
    /// pods.
    pub fn bounds(&self, table: &EndpointTable, shares: u32) -> Bounds {
        let endpoints: u64 = self
            .endpoints
            .iter()
            .map(|key| key.as_deref().and_then(|key| table.get_here(key)).map_or(1, |set| set.endpoints().len().max(1)))
            .map(|count| u64::try_from(count).unwrap_or(u64::MAX))
            .sum();
        let total = u64::from(self.per_endpoint).saturating_mul(endpoints.max(1));
        let capacity = bounds_share(total, shares);
        let burst = u32::try_from(u64::from(capacity) * u64::from(self.burst_percent) / 100).unwrap_or(u32::MAX);
        Bounds { capacity, burst, max_queued: self.max_queued }
    }
}

/// A pod's share of a model's capacity: the capacity divided among
/// `shares` pods, rounded down, at least 1.
pub fn bounds_share(total: u64, shares: u32) -> u32 {
    u32::try_from((total / u64::from(shares.max(1))).max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_shares_add_up_to_at_most_the_capacity() {
        assert_eq!(bounds_share(16, 2), 8);
        assert_eq!(bounds_share(10, 3), 3, "rounded down: 9 of 10 across the fleet");
        assert_eq!(bounds_share(2, 4), 1, "never 0: a pod can always send one");
        assert_eq!(bounds_share(8, 0), 8);
    }
}
