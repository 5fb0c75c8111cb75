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

use std::collections::BTreeSet;
use std::sync::Arc;

use futures_util::{FutureExt as _, StreamExt as _};
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
    let slices = context.stores.endpoint_slices.state();
    let document = render::endpoints::document(
        &services,
        |namespace, name| {
            all_services
                .iter()
                .find(|s| {
                    s.metadata.namespace.as_deref() == Some(namespace) && s.metadata.name.as_deref() == Some(name)
                })
                .map(AsRef::as_ref)
        },
        |namespace, name| {
            slices
                .iter()
                .filter(|slice| {
                    slice.metadata.namespace.as_deref() == Some(namespace)
                        && slice
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(render::endpoints::SERVICE_NAME_LABEL))
                            .is_some_and(|service| service == name)
                })
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
        },
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
