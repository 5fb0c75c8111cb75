//! Pod churn reaches the endpoints ConfigMaps. The ConfigMap is part of
//! what a Gateway owns (`render::Desired`: the reconcile renders and applies
//! it with the rest); when only pods came and went, this task renders that
//! same object from the stores and applies it alone, without a recompile —
//! so a team whose pods flap costs a shared Gateway one small write a second
//! at most, not a reconcile of every key.
//!
//! ```text
//! EndpointSlices/Services changed, or CHURN_CHECK passed ─► for each Gateway routing to Services:
//!     document hash ≠ the one written? ─► render::endpoints::config_map ─► apply that ConfigMap
//! ```
//!
//! At most one look per [`CHURN_INTERVAL`]; at least one per
//! [`CHURN_CHECK`] (a change that raced a reconcile is caught then).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use kube::runtime::reflector::ObjectRef;

use super::shell::DEBOUNCE;
use crate::compile::ObjectKey;
use crate::context::Context;
use crate::render::endpoints::{ServiceIndex, config_map};
use crate::stores::signals;

/// The least time between two looks at pod churn.
pub const CHURN_INTERVAL: Duration = Duration::from_secs(1);
/// The most time between two looks, changes or not.
pub const CHURN_CHECK: Duration = Duration::from_secs(10);

/// Keeps every routed Gateway's endpoints ConfigMap current until the
/// process ends.
pub(crate) async fn follow_endpoints(context: Arc<Context>) {
    let stores = &context.stores;
    let mut changes = signals(&[&stores.changed.endpoint_slices, &stores.changed.services]);
    loop {
        tokio::select! {
            change = changes.next() => {
                if change.is_none() {
                    return;
                }
                // A rollout changes many slices at once: look once per burst.
                tokio::time::sleep(DEBOUNCE).await;
            }
            () = tokio::time::sleep(CHURN_CHECK) => {}
        }
        while let Some(Some(())) = changes.next().now_or_never() {}
        let looked_at = tokio::time::Instant::now();
        write_moved(&context).await;
        // Changes meanwhile wait in `changes` for the next look.
        tokio::time::sleep_until(looked_at + CHURN_INTERVAL).await;
    }
}

/// Writes the endpoints ConfigMap of each routed Gateway whose document
/// moved since it was last written.
async fn write_moved(context: &Context) {
    let stores = &context.stores;
    let routed: Vec<(ObjectKey, BTreeSet<String>, Option<String>)> = context
        .gateways
        .read()
        .await
        .iter()
        .filter(|(_, memory)| !memory.services.is_empty())
        .map(|(key, memory)| (key.clone(), memory.services.clone(), memory.endpoints_written.clone()))
        .collect();
    let (services, slices) = (stores.services.state(), stores.endpoint_slices.state());
    let index = ServiceIndex::new(&services, &slices);
    for (key, services, written) in routed {
        let Some(gateway) = stores.gateways.get(&ObjectRef::new(&key.name).within(&key.namespace)) else { continue };
        let Ok((map, hash)) = config_map(&gateway, &index.document_of(&services)) else { continue };
        if written.as_deref() == Some(hash.as_str()) {
            continue;
        }
        match crate::apply::apply(&context.client, &map).await {
            Ok(_) => {
                let mut gateways = context.gateways.write().await;
                if let Some(memory) = gateways.get_mut(&key) {
                    memory.endpoints_written = Some(hash);
                }
                tracing::info!(gateway = %key, "endpoints written");
            }
            Err(error) => tracing::warn!(gateway = %key, %error, "cannot write endpoints; retrying at the next look"),
        }
    }
}
