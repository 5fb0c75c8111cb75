//! Keeps each Gateway's endpoints ConfigMap current: after each Gateway
//! reconcile (its config may route to other Services now) and whenever
//! EndpointSlices or Services change (pods became ready or went away).
//! Nothing else is reconciled for pod churn, and the config Secret is never
//! rewritten for it.
//!
//! ```text
//! EndpointSlices/Services changed ─► debounce ─► for each Gateway routing to Services:
//!     render::endpoints::document ─► unchanged hash? skip : apply <gateway>-endpoints
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use futures_util::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::ObjectRef;
use waycast_crds::Gateway;

use super::DEBOUNCE;
use crate::compile::ObjectKey;
use crate::context::Context;
use crate::error::Error;
use crate::render;
use crate::stores::signals;

/// The cluster's Services and their EndpointSlices, by namespace and
/// name: built once per Gateway reconcile or per burst of endpoint changes
/// and shared by every Gateway synced from it, so a burst costs one pass
/// over the cluster, not one per Gateway (nor, as first written, one per
/// routed Service).
pub(crate) struct ServiceIndex {
    services: HashMap<String, HashMap<String, Arc<Service>>>,
    slices: HashMap<String, HashMap<String, Vec<Arc<EndpointSlice>>>>,
}

impl ServiceIndex {
    /// What the stores hold now.
    pub(crate) fn of(context: &Context) -> Self {
        let mut services: HashMap<String, HashMap<String, Arc<Service>>> = HashMap::new();
        for service in context.stores.services.state() {
            let metadata = &service.metadata;
            if let (Some(namespace), Some(name)) = (metadata.namespace.clone(), metadata.name.clone()) {
                services.entry(namespace).or_default().insert(name, service);
            }
        }
        let mut slices: HashMap<String, HashMap<String, Vec<Arc<EndpointSlice>>>> = HashMap::new();
        for slice in context.stores.endpoint_slices.state() {
            let metadata = &slice.metadata;
            let owner = metadata.labels.as_ref().and_then(|labels| labels.get(render::endpoints::SERVICE_NAME_LABEL));
            if let (Some(namespace), Some(owner)) = (metadata.namespace.clone(), owner.cloned()) {
                slices.entry(namespace).or_default().entry(owner).or_default().push(slice);
            }
        }
        Self { services, slices }
    }

    fn service(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.services.get(namespace)?.get(name).map(AsRef::as_ref)
    }

    fn slices<'a>(&'a self, namespace: &str, name: &str) -> impl Iterator<Item = &'a EndpointSlice> + use<'a> {
        self.slices.get(namespace).and_then(|by_service| by_service.get(name)).into_iter().flatten().map(AsRef::as_ref)
    }
}

/// Writes the endpoints of `services` into the Gateway's ConfigMap unless
/// it already holds them, and remembers what the Gateway routes to.
///
/// # Errors
/// The apply failing.
pub(crate) async fn sync(
    context: &Context,
    index: &ServiceIndex,
    gateway: &Gateway,
    services: BTreeSet<String>,
) -> Result<(), Error> {
    let key = ObjectKey::of(&gateway.metadata);
    let document = render::endpoints::document(
        &services,
        |namespace, name| index.service(namespace, name),
        |namespace, name| index.slices(namespace, name),
    );
    let (map, hash) = render::endpoints::config_map(gateway, &document)?;
    let written = context.gateways.read().await.get(&key).and_then(|m| m.endpoints_written.clone());
    if written.as_deref() != Some(hash.as_str()) {
        crate::apply::apply(&context.client, &map).await?;
        let known: usize = document.services.values().map(Vec::len).sum();
        tracing::info!(gateway = %key, services = document.services.len(), endpoints = known, "endpoints written");
    }
    let mut gateways = context.gateways.write().await;
    let memory = gateways.entry(key).or_default();
    memory.endpoints_written = Some(hash);
    memory.services = services;
    Ok(())
}

/// Re-writes the endpoints of every Gateway that routes to Services when
/// EndpointSlices or Services change, until the process ends.
pub(crate) async fn follow_endpoints(context: Arc<Context>) {
    let stores = &context.stores;
    let mut changes = signals(&[&stores.changed.endpoint_slices, &stores.changed.services]);
    while changes.next().await.is_some() {
        // A rollout changes many slices at once: write once per burst.
        tokio::time::sleep(DEBOUNCE).await;
        while let Some(Some(())) = changes.next().now_or_never() {}
        let routed: Vec<(ObjectKey, BTreeSet<String>)> = context
            .gateways
            .read()
            .await
            .iter()
            .filter(|(_, memory)| !memory.services.is_empty())
            .map(|(key, memory)| (key.clone(), memory.services.clone()))
            .collect();
        let index = ServiceIndex::of(&context);
        for (key, services) in routed {
            let Some(gateway) = stores.gateways.get(&ObjectRef::new(&key.name).within(&key.namespace)) else {
                continue;
            };
            if let Err(error) = sync(&context, &index, &gateway, services).await {
                tracing::warn!(gateway = %key, %error, "cannot write endpoints; retrying on the next change");
            }
        }
    }
}
