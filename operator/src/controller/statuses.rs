//! The ApiKey, ModelEndpoint and AccessGrant status controllers' common part: when they
//! run, and what each parent Gateway's compile decided about an object.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
use serde::de::DeserializeOwned;
use waycast_crds::Gateway;

use super::shell::{CONCURRENCY, DEBOUNCE, RESYNC, error_policy};
use crate::compile::{ObjectKey, select};
use crate::context::Context;
use crate::error::Error;
use crate::programmed::CompiledFrom;
use crate::stores::{Feed, every, once, signals};

/// ApiKey, ModelEndpoint and AccessGrant statuses. Selection moves with Gateways and
/// namespaces: then every object is looked at, handed to the controller
/// a window at a time with the announced ones (`Feed::subscribe`). Verdicts and Programmed come
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
    let passes = once().chain(futures_util::stream::select(inputs_changed, every(RESYNC)));
    let (objects, paced) = feed.subscribe(store.clone(), passes);
    Controller::for_stream(futures_util::stream::pending(), store)
        .reconcile_on(objects)
        .with_config(ControllerConfig::default().debounce(DEBOUNCE).concurrency(CONCURRENCY))
        .run(reconcile, error_policy, context)
        .for_each(|reported| {
            paced.finished(&reported);
            futures_util::future::ready(())
        })
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
            select::Kind::ModelEndpoints => from.models.get(&id).map(|record| &record.decision),
            select::Kind::ApiKeys => from.keys.get(&id).map(|record| &record.decision),
            select::Kind::AccessGrants => from.grants.get(&id).map(|record| &record.decision),
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

/// Announces the ApiKeys, ModelEndpoints and AccessGrants whose status may
/// read differently now to their status controllers.
pub(crate) fn announce(context: &Context, moved: crate::programmed::Moved) {
    for id in moved.keys {
        context.stores.feeds.keys.announce(ObjectRef::new(&id.name).within(&id.namespace));
    }
    for id in moved.models {
        context.stores.feeds.models.announce(ObjectRef::new(&id.name).within(&id.namespace));
    }
    for id in moved.grants {
        context.stores.feeds.grants.announce(ObjectRef::new(&id.name).within(&id.namespace));
    }
}
