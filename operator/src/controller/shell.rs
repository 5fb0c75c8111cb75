//! What every reconcile shell shares: how often and how many at once, what
//! a failure does, and how a status is written (only when it changed, with
//! an Event per condition that flipped).

use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::apply::patch_status;
use crate::context::{Context, backoff, emit_transitions};
use crate::error::Error;
use crate::status::{self, WithConditions};

/// How long bursts of changes are coalesced before a reconcile.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Reconciles of one kind in flight at once. Unbounded, a re-check of
/// 10,000 ApiKeys opened thousands of API connections at once, and a new
/// key's reconcile waited behind them for tens of seconds.
pub const CONCURRENCY: u16 = 16;
/// Periodic re-reconcile (picks up rotated upstream credentials).
pub const RESYNC: Duration = Duration::from_secs(300);

pub(crate) fn error_policy<K: Resource<DynamicType = ()>>(
    object: Arc<K>,
    error: &Error,
    context: Arc<Context>,
) -> Action {
    context.metrics.reconcile_errors.with_label_values(&[error.metric_label()]).inc();
    let id = object_id(object.as_ref());
    let failures = context.record_failure(&id);
    tracing::warn!(%error, object = %id, failures, "reconcile failed");
    if error.is_transient() { Action::requeue(backoff(failures)) } else { Action::await_change() }
}

/// `Kind/namespace/name`, the key of an object's failure count.
pub(crate) fn object_id<K: Resource<DynamicType = ()>>(object: &K) -> String {
    let meta = object.meta();
    format!(
        "{}/{}/{}",
        K::kind(&()),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

pub(crate) fn succeeded<K: Resource<DynamicType = ()>>(context: &Context, object: &K) {
    let id = object_id(object);
    context.record_success(&id);
}

/// Writes `new` as `object`'s status when it differs from `current` in
/// anything a reader sees, with an Event per condition that flipped. The
/// one status writer of every kind.
///
/// # Errors
/// The status patch failing.
pub(crate) async fn write_status<K, S>(context: &Context, object: &K, current: Option<&S>, new: &S) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
    S: WithConditions + Serialize,
{
    if status::status_changed(current, new) {
        patch_status(&context.client, object, serde_json::to_value(new)?).await?;
        let previous = current.map(WithConditions::conditions).unwrap_or_default();
        emit_transitions(context, object, previous, new.conditions()).await;
    }
    Ok(())
}
