//! Pod churn reaches the endpoints ConfigMaps: when EndpointSlices or
//! Services change, each Gateway whose Services' ready addresses moved is
//! reconciled (its ConfigMap is part of what it owns: one plan, one apply),
//! and no other. The config Secret is not rewritten for it: its hash is
//! unchanged.
//!
//! ```text
//! EndpointSlices/Services changed ─► debounce ─► for each Gateway routing to Services:
//!     endpoints document hash ≠ the one written? ─► reconcile that Gateway
//! ```

use std::collections::BTreeSet;
use std::sync::Arc;

use futures_util::{FutureExt as _, StreamExt as _};
use kube::runtime::reflector::ObjectRef;

use super::shell::DEBOUNCE;
use crate::compile::ObjectKey;
use crate::context::Context;
use crate::render::endpoints::{ServiceIndex, document_hash};
use crate::stores::signals;

/// Asks for a reconcile of every Gateway whose endpoints moved, on each
/// burst of EndpointSlice or Service changes, until the process ends.
pub(crate) async fn follow_endpoints(context: Arc<Context>) {
    let stores = &context.stores;
    let mut changes = signals(&[&stores.changed.endpoint_slices, &stores.changed.services]);
    while changes.next().await.is_some() {
        // A rollout changes many slices at once: look once per burst.
        tokio::time::sleep(DEBOUNCE).await;
        while let Some(Some(())) = changes.next().now_or_never() {}
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
            let Ok(hash) = document_hash(&index.document_of(&services)) else { continue };
            if written.as_deref() != Some(hash.as_str()) {
                stores.feeds.gateways.announce(ObjectRef::new(&key.name).within(&key.namespace));
            }
        }
    }
}
