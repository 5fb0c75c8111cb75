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

/// Writes the endpoints of `services` into the Gateway's ConfigMap unless
/// it already holds them, and remembers what the Gateway routes to.
///
/// # Errors
/// The apply failing.
pub(crate) async fn sync(context: &Context, gateway: &Gateway, services: BTreeSet<String>) -> Result<(), Error> {
    let key = ObjectKey::of(&gateway.metadata);
    let all_services = context.stores.services.state();
    let all_slices = context.stores.endpoint_slices.state();
    // Indexed once per sync: a Gateway routing to hundreds of Services would
    // otherwise scan every Service and slice of the cluster for each.
    let services_by_name: HashMap<(&str, &str), &Service> = all_services
        .iter()
        .filter_map(|service| {
            let metadata = &service.metadata;
            Some(((metadata.namespace.as_deref()?, metadata.name.as_deref()?), service.as_ref()))
        })
        .collect();
    let mut slices_by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for slice in &all_slices {
        let metadata = &slice.metadata;
        let owner = metadata.labels.as_ref().and_then(|labels| labels.get(render::endpoints::SERVICE_NAME_LABEL));
        if let (Some(namespace), Some(service)) = (metadata.namespace.as_deref(), owner) {
            slices_by_service.entry((namespace, service.as_str())).or_default().push(slice.as_ref());
        }
    }
    let document = render::endpoints::document(
        &services,
        |namespace, name| services_by_name.get(&(namespace, name)).copied(),
        |namespace, name| slices_by_service.get(&(namespace, name)).cloned().unwrap_or_default(),
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
        for (key, services) in routed {
            let Some(gateway) = stores.gateways.get(&ObjectRef::new(&key.name).within(&key.namespace)) else {
                continue;
            };
            if let Err(error) = sync(&context, &gateway, services).await {
                tracing::warn!(gateway = %key, %error, "cannot write endpoints; retrying on the next change");
            }
        }
    }
}
