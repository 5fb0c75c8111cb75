//! What of an object the operator reads (`store_of`'s `relevant`): a change
//! signal fires only when this changes, so the operator's own status writes
//! do not re-trigger compiles (a stream of 10,000 ApiKey status patches kept
//! postponing the debounced Gateway reconcile for seconds), Lease renewals
//! do not either, and neither does an annotation a team writes in a loop.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt as _};

pub(crate) fn fingerprint(meta: &ObjectMeta, relevant: impl std::hash::Hash) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    relevant.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    hasher.finish()
}

/// Spec (by generation), labels and deletion.
pub(crate) fn spec_and_labels<K: Resource>(object: &K) -> u64 {
    fingerprint(object.meta(), (object.meta().generation, &object.meta().labels))
}

/// Labels and deletion (Namespaces).
pub(crate) fn labels<K: Resource>(object: &K) -> u64 {
    fingerprint(object.meta(), &object.meta().labels)
}

/// Any change (Services, Secrets: no status the operator writes).
pub(crate) fn any_change<K: Resource>(object: &K) -> u64 {
    fingerprint(object.meta(), &object.meta().resource_version)
}

/// What compile and the endpoints read of a Service: its type, selector,
/// ports, cluster IP and external name (an annotation or label written in
/// a loop changes nothing a Gateway serves, and moves nothing).
pub(crate) fn service_content(service: &Service) -> u64 {
    let spec = service.spec.as_ref();
    let ports: Vec<_> = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| (&p.name, p.port, &p.protocol, p.target_port.as_ref().map(|t| format!("{t:?}"))))
        .collect();
    let shape = spec.map(|s| (&s.type_, &s.selector, &s.cluster_ip, &s.external_name));
    fingerprint(&service.metadata, (shape, ports))
}

/// What picking reads of an EndpointSlice: its ports and its endpoints'
/// addresses and readiness.
pub(crate) fn endpoint_content(slice: &EndpointSlice) -> u64 {
    let endpoints: Vec<_> = slice
        .endpoints
        .iter()
        .map(|e| (&e.addresses, e.conditions.as_ref().map(|c| (c.ready, c.serving, c.terminating))))
        .collect();
    let ports: Vec<_> = slice.ports.iter().flatten().map(|p| (&p.name, p.port)).collect();
    fingerprint(&slice.metadata, (&slice.metadata.labels, endpoints, ports))
}

/// A heartbeat's Gateway, the config hash its pod reports, the config it
/// refused and the entries it left out, not its renewals.
pub(crate) fn heartbeat(lease: &Lease) -> u64 {
    let dropped = lease.annotations().get(waycast_crds::heartbeat::DROPPED_ENTRIES_ANNOTATION);
    fingerprint(&lease.metadata, (&lease.metadata.labels, holder(lease), refused_hash(lease), dropped))
}

/// The config hash a heartbeat Lease's holder reports.
pub(crate) fn holder(lease: &Lease) -> &str {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).unwrap_or_default()
}

/// The config hash a heartbeat says its pod refused, if any.
pub(crate) fn refused_hash(lease: &Lease) -> Option<&String> {
    lease.annotations().get(waycast_crds::heartbeat::REFUSED_HASH_ANNOTATION).filter(|hash| !hash.is_empty())
}
