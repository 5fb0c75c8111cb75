//! What every object a Gateway owns carries: its labels, the Gateway as
//! controlling owner, the names of the objects others refer to, the
//! gateway container's ports, the operator's field manager, and how a
//! config Secret's digest is read back from its annotations (`config_plan`
//! compares the store's with the desired ones).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource as _, ResourceExt as _};
use waycast_crds::Gateway;
use waycast_crds::shards::PART_DIGEST_ANNOTATION;

/// The label every gateway pod, owned object and heartbeat Lease carries
/// with its Gateway's name (one contract, in `waycast_crds::heartbeat`).
pub use waycast_crds::heartbeat::GATEWAY_LABEL;
/// The annotation carrying the config hash (its manifest's) on the config
/// Secret, which holds the manifest.
pub const CONFIG_HASH_ANNOTATION: &str = "waycast.dev/config-hash";
/// The digest a config Secret is annotated with: a part's own, or the
/// manifest's hash on the manifest Secret.
pub fn digest_of(meta: &ObjectMeta) -> Option<&str> {
    let annotations = meta.annotations.as_ref()?;
    annotations.get(PART_DIGEST_ANNOTATION).or_else(|| annotations.get(CONFIG_HASH_ANNOTATION)).map(String::as_str)
}

/// The field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "waycast-operator";

/// Public (proxy) port of the gateway container.
pub const PUBLIC_PORT: i32 = 8080;
/// Admin port (`/metrics`, `/healthz`, `/readyz`).
pub const ADMIN_PORT: i32 = 9090;
/// How long gateway pods drain in-flight requests after SIGTERM.
pub const DRAIN_SECONDS: i64 = 30;
/// The preStop pause that lets endpoints drop the pod before it stops accepting.
pub const PRE_STOP_SECONDS: i64 = 5;

/// Labels that select a Gateway's pods.
pub fn selector_labels(gateway: &Gateway) -> BTreeMap<String, String> {
    use waycast_crds::heartbeat::{GATEWAY_POD_NAME, POD_INSTANCE_LABEL, POD_NAME_LABEL};
    BTreeMap::from([
        (POD_NAME_LABEL.to_owned(), GATEWAY_POD_NAME.to_owned()),
        (POD_INSTANCE_LABEL.to_owned(), gateway.name_any()),
    ])
}

/// Labels on every object a Gateway owns.
pub fn labels(gateway: &Gateway) -> BTreeMap<String, String> {
    let mut labels = selector_labels(gateway);
    labels.insert("app.kubernetes.io/component".to_owned(), "gateway".to_owned());
    labels.insert("app.kubernetes.io/managed-by".to_owned(), FIELD_MANAGER.to_owned());
    labels.insert(GATEWAY_LABEL.to_owned(), gateway.name_any());
    labels
}

/// Metadata of an owned object named `name`: namespace, labels, and the
/// Gateway as controlling owner (so deleting it collects everything).
pub fn owned_meta(gateway: &Gateway, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: gateway.namespace(),
        labels: Some(labels(gateway)),
        owner_references: owner_reference(gateway).map(|owner| vec![owner]),
        ..ObjectMeta::default()
    }
}

fn owner_reference(gateway: &Gateway) -> Option<OwnerReference> {
    gateway.controller_owner_ref(&())
}

/// The config Secret's name, `<gateway>-config`: it holds the manifest;
/// the parts' Secrets are named after it (`waycast_crds::shards`).
pub fn config_secret_name(gateway: &Gateway) -> String {
    format!("{}-config", gateway.name_any())
}

/// `<gateway>-endpoints`.
pub fn config_map_name(gateway: &Gateway) -> String {
    format!("{}-endpoints", gateway.name_any())
}

/// The name of a Gateway's usage ConfigMap: the fleet's budget spend the
/// pods count (`crate::usage`).
pub fn usage_config_map_name(gateway: &Gateway) -> String {
    format!("{}-usage", gateway.name_any())
}

/// The name of a Gateway's usage ledger ConfigMap (the operator's own).
pub fn usage_ledger_name(gateway: &Gateway) -> String {
    format!("{}-usage-ledger", gateway.name_any())
}
