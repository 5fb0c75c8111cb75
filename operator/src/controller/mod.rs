//! The reconcile shells: read from the stores, call the pure compile and
//! render steps, server-side apply the result, and write status.
//!
//! ```text
//! reflectors (Gateway, ModelEndpoint, ApiKey, Namespace, Service, key Secrets,
//!             config Secret metadata, heartbeat Leases) ─► Stores ─► Feeds + change signals
//! Gateway controller:       stores ─► compile ─► render ─► apply (SSA, prune HPA/PDB) ─► Gateway status
//!                           └─ stores every verdict in `compiled`, announces the objects whose
//!                              verdict or Programmed state moved (programmed.rs)
//! key Secret controller:    generate <name>-key if needed (its own queue: never behind status work)
//! ApiKey controller:        verdict from `compiled` per selecting Gateway ─► ApiKey status
//! ModelEndpoint controller: verdict from `compiled` per selecting Gateway ─► ModelEndpoint status
//! ```
//!
//! The controllers read the shared stores and are fed by them (one cache of
//! each kind). Each kind's status is written only by its own controller, with one field
//! manager. A change the operator reads (spec, labels, Secret data — not
//! status) re-triggers the controllers that read it, after the store has it;
//! bursts are coalesced by the debounce, a request for an object already
//! queued is merged, and at most [`CONCURRENCY`] reconciles of a kind run at
//! once. One compile per Gateway change serves every object's status.

mod api_key;
mod endpoints;
mod gateway;
mod model_endpoint;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::Store;
use serde::de::DeserializeOwned;
use waycast_crds::Gateway;

use crate::compile::{ObjectKey, select};
use crate::context::{Context, backoff};
use crate::error::Error;
use crate::programmed::CompiledFrom;
use crate::stores::{Feed, every, once, signals};

/// How long bursts of changes are coalesced before a reconcile.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Reconciles of one kind in flight at once. Unbounded, a re-check of
/// 10,000 ApiKeys opened thousands of API connections at once, and a new
/// key's reconcile waited behind them for tens of seconds.
pub const CONCURRENCY: u16 = 16;
/// Periodic re-reconcile (picks up rotated upstream credentials).
pub const RESYNC: Duration = Duration::from_secs(300);

/// Runs the three controllers until the process ends.
pub async fn run(context: Arc<Context>) {
    let gateway_controller = gateway::gateway_controller(context.clone());
    let key_controller = status_controller(
        context.clone(),
        context.stores.keys.clone(),
        &context.stores.feeds.keys,
        api_key::reconcile_api_key,
    );
    let key_secrets = api_key::key_secret_controller(context.clone());
    // Conflicts are decided among all of a Gateway's ModelEndpoints: that
    // too comes from its compile.
    let model_controller = status_controller(
        context.clone(),
        context.stores.models.clone(),
        &context.stores.feeds.models,
        model_endpoint::reconcile_model_endpoint,
    );
    let endpoints = endpoints::follow_endpoints(context.clone());
    tokio::join!(gateway_controller, key_controller, key_secrets, model_controller, endpoints);
}

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

/// ApiKey and ModelEndpoint statuses. Selection moves with Gateways and
/// namespaces: then every object is looked at. Verdicts and Programmed come
/// from the Gateways' compiles, which announce just the objects whose state
/// moved (`programmed::next`) on `feed`.
pub(crate) async fn status_controller<K, Reconcile, Reconciled>(
    context: Arc<Context>,
    store: Store<K>,
    feed: &Feed<K>,
    reconcile: Reconcile,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    Reconcile: FnMut(Arc<K>, Arc<Context>) -> Reconciled,
    Reconciled: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let changed = &context.stores.changed;
    let inputs_changed = signals(&[&changed.gateways, &changed.namespaces]);
    Controller::for_stream(futures_util::stream::pending(), store)
        .reconcile_on(feed.subscribe())
        .reconcile_all_on(once().chain(futures_util::stream::select(inputs_changed, every(RESYNC))))
        .with_config(ControllerConfig::default().debounce(DEBOUNCE).concurrency(CONCURRENCY))
        .run(reconcile, error_policy, context)
        .for_each(|_| futures_util::future::ready(()))
        .await;
}

/// What every Gateway that takes `object` decided about its current
/// generation.
pub(crate) struct ParentDecisions<T> {
    /// Gateways it names that do not take it.
    pub(crate) refused: Vec<waycast_crds::common::GatewayAcceptance>,
    /// Each taking Gateway's `namespace/name` and decision.
    pub(crate) decided: Vec<(String, T)>,
    /// (taking Gateways, whether every pod of each serves the generation).
    pub(crate) programmed: (usize, bool),
}

/// The decisions of `object`'s parent Gateways (`kind` says whose), each
/// read through `pick` from that Gateway's latest compile at the object's
/// generation; `None` while one has not compiled that generation yet (its
/// compile announces the object when it has).
pub(crate) async fn parent_decisions<K: Resource, T>(
    context: &Context,
    kind: select::Kind,
    object: &K,
    parent_refs: &[waycast_crds::common::ParentReference],
    pick: impl Fn(&CompiledFrom, &ObjectKey) -> Option<T>,
) -> Option<ParentDecisions<T>> {
    let id = ObjectKey::of(object.meta());
    let generation = object.meta().generation;
    let namespaces: Vec<Arc<Namespace>> = context.stores.namespaces.state();
    let namespaces: Vec<&Namespace> = namespaces.iter().map(AsRef::as_ref).collect();
    let gateways: Vec<Arc<Gateway>> = context.stores.gateways.state();
    let gateways: Vec<&Gateway> = gateways.iter().map(AsRef::as_ref).collect();
    let meta = object.meta();
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let parents = select::parents(&gateways, kind, namespace, labels, parent_refs, &namespaces);
    let memory = context.gateways.read().await;
    let mut decisions = ParentDecisions { refused: parents.refused, decided: Vec::new(), programmed: (0, true) };
    for gateway in parents.admitted {
        let from = memory.get(&ObjectKey::of(&gateway.metadata)).and_then(|m| m.compiled.as_ref());
        let entry = from.and_then(|from| match kind {
            select::Kind::ModelEndpoints => from.models.get(&id),
            select::Kind::ApiKeys => from.keys.get(&id),
        });
        decisions.programmed.0 += 1;
        decisions.programmed.1 &= from.is_some_and(|from| from.programmed(entry, generation));
        entry.filter(|decision| decision.generation == generation)?;
        let decision = pick(from?, &id)?;
        let gateway_id = format!(
            "{}/{}",
            gateway.metadata.namespace.as_deref().unwrap_or_default(),
            gateway.metadata.name.as_deref().unwrap_or_default()
        );
        decisions.decided.push((gateway_id, decision));
    }
    Some(decisions)
}
