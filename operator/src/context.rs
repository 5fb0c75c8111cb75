//! What every reconcile shares: the client, the stores, the per-Gateway
//! bookkeeping of compiles and writes, failure counts for backoff, Events,
//! the reconcile spans' exporter.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::{Client, Resource};

use crate::apply::bounded;
use crate::compile::ObjectKey;
use crate::metrics::Metrics;
use crate::programmed::CompiledFrom;
use crate::render::RenderSettings;
use crate::stores::Stores;

/// Shared by every reconcile.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Stores.
    pub stores: Stores,
    /// The cluster's networks, closed to `url` backends.
    pub networks: crate::networks::ClusterNetworks,
    /// Every identity provider's key set, as the refresher last published.
    pub key_sets: crate::key_sets::KeySets,
    /// The data of the Secrets served objects reference.
    pub secret_data: crate::secret_data::SecretData,
    /// Render settings.
    pub settings: RenderSettings,
    /// Metrics.
    pub metrics: Metrics,
    /// Publishes Events.
    pub events: crate::events::Publisher,
    /// What the operator remembers of each Gateway between reconciles; an
    /// entry goes when its Gateway is gone.
    pub gateways: tokio::sync::RwLock<BTreeMap<ObjectKey, GatewayMemory>>,
    /// Consecutive failed reconciles per object, for exponential backoff.
    pub failures: arc_swap::ArcSwap<BTreeMap<String, u32>>,
    /// Where each Gateway reconcile's span goes (`--otlp-endpoint`);
    /// `None`: no traces.
    pub traces: Option<crate::telemetry::Traces>,
}

/// The retry delay after `failures` consecutive transient errors: 1 s,
/// doubling, capped at 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let seconds = 1_u64.checked_shl(failures.saturating_sub(1).min(16)).unwrap_or(u64::MAX).min(300);
    Duration::from_secs(seconds)
}

impl Context {
    pub(crate) fn record_failure(&self, object: &str) -> u32 {
        let mut count = 0;
        self.failures.rcu(|current| {
            let mut next = (**current).clone();
            let entry = next.entry(object.to_owned()).or_insert(0);
            *entry += 1;
            count = *entry;
            next
        });
        count
    }

    pub(crate) fn record_success(&self, object: &str) {
        if self.failures.load().contains_key(object) {
            self.failures.rcu(|current| {
                let mut next = (**current).clone();
                next.remove(object);
                next
            });
        }
    }
}

/// Publishes an Event for every condition whose status changed (Normal when
/// it became True, Warning when False). Failures are logged, not fatal.
pub(crate) async fn emit_transitions<K: Resource<DynamicType = ()>>(
    context: &Context,
    object: &K,
    old: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    new: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) {
    use crate::events::EventType;
    for condition in new {
        let before = old.iter().find(|o| o.type_ == condition.type_).map(|o| o.status.as_str());
        if before == Some(condition.status.as_str()) {
            continue;
        }
        let type_ = if condition.status == "True" { EventType::Normal } else { EventType::Warning };
        let note = format!("{}: {}", condition.type_, condition.message);
        let published = context.events.publish(object.object_ref(&()), type_, &condition.reason, note, "Reconcile");
        if let Err(error) = bounded(published).await {
            tracing::debug!(%error, "could not publish an Event");
        }
    }
}

/// What the operator remembers of one Gateway between its reconciles.
#[derive(Debug, Default)]
pub struct GatewayMemory {
    /// What its current config was compiled from (the ApiKeys',
    /// ModelEndpoints' and AccessGrants' statuses are read from it).
    pub compiled: Option<CompiledFrom>,
    /// Its last config written, for the propagation metric.
    pub written: Option<Written>,
    /// The (uid, generation) whose owned objects were found to be its own
    /// or absent, and then applied: not looked up again until the spec
    /// changes. NB: the check guards against objects that existed before
    /// the Gateway; at 10,000 keys its eight reads per reconcile doubled the
    /// reconcile time.
    pub verified: Option<(String, i64)>,
    /// The Services (`namespace/name:port`) its config routes to through
    /// their endpoints.
    pub services: std::collections::BTreeSet<String>,
    /// The hash of the endpoints document last written for it.
    pub endpoints_written: Option<String>,
    /// The salt its config takes when its shard count changes, drawn once:
    /// a count change whose writes failed is retried with the same salt, so
    /// the parts already written are not written again.
    pub fresh_salt: Option<String>,
}

/// When a Gateway's current config was written, until every pod reports it.
#[derive(Debug, Clone)]
pub struct Written {
    /// The config hash written.
    pub hash: String,
    /// When.
    pub at: std::time::Instant,
    /// Whether its propagation was already measured.
    pub measured: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let delays: Vec<u64> = [1, 2, 3, 4, 9, 10, 50].iter().map(|n| backoff(*n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 256, 300, 300]);
    }
}
