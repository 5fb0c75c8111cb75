//! What the operator remembers of each Gateway between its reconciles,
//! shared by the Gateway reconcile and the key lane.

use kube::runtime::reflector::ObjectRef;
use waycast_crds::Gateway;

use crate::compile::ObjectKey;
use crate::context::{Context, GatewayMemory};
use crate::stores::Stores;

/// The Gateway as its kept facts name it: its uid and generation.
pub(super) fn verified_as(gateway: &Gateway) -> (String, i64) {
    (gateway.metadata.uid.clone().unwrap_or_default(), gateway.metadata.generation.unwrap_or(0))
}

/// Changes what is remembered of the Gateway `key`. A deleted Gateway is
/// never reconciled again: its memory (megabytes at 10,000 keys) goes here,
/// when another one changes.
pub(super) async fn remember<T>(context: &Context, key: &ObjectKey, change: impl FnOnce(&mut GatewayMemory) -> T) -> T {
    let mut gateways = context.gateways.write().await;
    gateways.retain(|key, _| {
        let exists = gateway_exists(&context.stores, key);
        if !exists {
            context.metrics.forget_gateway(&key.to_string());
        }
        exists
    });
    change(gateways.entry(key.clone()).or_default())
}

/// Whether the store holds the Gateway `key`.
pub(super) fn gateway_exists(stores: &Stores, key: &ObjectKey) -> bool {
    stores.gateways.get(&ObjectRef::new(&key.name).within(&key.namespace)).is_some()
}
