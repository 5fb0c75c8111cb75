//! What each store keeps of the objects it watches: only what the
//! operator reads, so that memory stays bounded, and only what it may
//! believe, since anyone who may write such an object may write anything
//! in it.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt as _;
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;
use waycast_crds::heartbeat::{
    DROPPED_ENTRIES_ANNOTATION, GATEWAY_LABEL, MAX_PROVIDER_NAME_BYTES, MAX_UNKNOWN_KEY_LISTED, POD_INSTANCE_LABEL,
    POD_NAME_LABEL, REFUSED_HASH_ANNOTATION, REFUSED_REASON_ANNOTATION, UNKNOWN_KEY_ANNOTATION, truncate,
};

use crate::render::endpoints::{SERVICE_NAME_LABEL, is_controller_managed};

/// Longest heartbeat annotation kept.
pub const MAX_ANNOTATION_BYTES: usize = 64 * 1024;
/// Longest heartbeat holder kept: a config hash (64 hex digits) with room.
pub const MAX_HOLDER_BYTES: usize = 128;

/// An ApiKey, with its status as the status controller compares it
/// (`status::kept_form`): without the usage the collector wrote into it
/// (the operator compares and writes its own status without it), and the
/// rest a digest beside each condition's type, status and time.
pub fn api_key(key: &mut waycast_crds::ApiKey) {
    if let Some(status) = key.status.as_mut() {
        status.usage = None;
        *status = crate::status::kept_form(status);
    }
}

/// A key Secret: its name, namespace, owner and version. At 10,000 of them
/// their label maps alone were 5 MB (a B-tree node each), and the watch
/// selects them by that label already. The list's type strings
/// (`meta.k8s.io/v1`, `PartialObjectMetadata`) are two more allocations
/// of each, read by nothing.
pub fn key_secret(secret: &mut PartialObjectMeta<Secret>) {
    secret.types = None;
    let meta = &mut secret.metadata;
    (meta.labels, meta.annotations, meta.uid, meta.creation_timestamp) = (None, None, None, None);
}

/// An EndpointSlice: its Service, ports and endpoints' addresses and
/// conditions (what picking reads: at a pod's churn the other fields —
/// topology, hints, target refs — change too and would only cost memory).
///
/// NB: only the EndpointSlice controller's slices keep their endpoints:
/// one written by hand (or mirrored from hand-written Endpoints) may list
/// any address, and the gateway would reach it unguarded.
pub fn endpoint_slice(slice: &mut EndpointSlice) {
    // The API server's own slice is kept: its addresses are closed to
    // `url` backends (`networks::api_server`), never routed to.
    if !is_controller_managed(slice) && !crate::networks::is_api_server(slice) {
        slice.endpoints.clear();
    }
    let service = slice.labels().get(SERVICE_NAME_LABEL).cloned();
    let meta = &mut slice.metadata;
    (meta.annotations, meta.owner_references, meta.generate_name) = (None, None, None);
    meta.labels = service.map(|name| [(SERVICE_NAME_LABEL.to_owned(), name)].into());
    for endpoint in &mut slice.endpoints {
        (endpoint.target_ref, endpoint.node_name, endpoint.zone, endpoint.hints, endpoint.hostname) =
            (None, None, None, None, None);
        endpoint.deprecated_topology = None;
    }
}

/// A heartbeat Lease: its name, namespace, Gateway label, the owner a
/// heartbeat is checked against (the Pod it is named after), the holder
/// (the config hash served) and the heartbeat's own annotations, nothing
/// else (anyone may write a Lease with the label in a namespace of their
/// own, and a pod of a Gateway runs its author's image). A holder past
/// [`MAX_HOLDER_BYTES`] or a heartbeat annotation past
/// [`MAX_ANNOTATION_BYTES`] makes it no valid heartbeat: its holder and
/// annotations are dropped, not kept.
pub fn lease(lease: &mut Lease) {
    let name = lease.metadata.name.take();
    let holder = lease.spec.take().and_then(|spec| spec.holder_identity);
    let mut annotations = lease.metadata.annotations.take().unwrap_or_default();
    annotations.retain(|key, _| {
        [REFUSED_HASH_ANNOTATION, REFUSED_REASON_ANNOTATION, DROPPED_ENTRIES_ANNOTATION, UNKNOWN_KEY_ANNOTATION]
            .contains(&key.as_str())
    });
    let oversized = holder.as_ref().is_some_and(|holder| holder.len() > MAX_HOLDER_BYTES)
        || annotations.values().any(|value| value.len() > MAX_ANNOTATION_BYTES);
    // Only as much of the providers' list as is ever read.
    if let Some(listed) = annotations.get_mut(UNKNOWN_KEY_ANNOTATION) {
        let kept = truncate(listed, MAX_UNKNOWN_KEY_LISTED * (MAX_PROVIDER_NAME_BYTES + 1)).len();
        listed.truncate(kept);
    }
    let gateway = lease.metadata.labels.take().and_then(|mut labels| labels.remove(GATEWAY_LABEL));
    let owner = lease
        .metadata
        .owner_references
        .take()
        .into_iter()
        .flatten()
        .find(|owner| owner.kind == "Pod" && Some(&owner.name) == name.as_ref());
    let meta = &lease.metadata;
    lease.metadata = ObjectMeta {
        name,
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        deletion_timestamp: meta.deletion_timestamp.clone(),
        labels: gateway.map(|gateway| [(GATEWAY_LABEL.to_owned(), gateway)].into()),
        owner_references: owner.map(|owner| vec![owner]),
        annotations: (!oversized && !annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    lease.spec = (!oversized).then(|| LeaseSpec { holder_identity: holder, ..LeaseSpec::default() });
}

/// A gateway pod's metadata: only the labels that tell whose pod it is
/// (anyone may label a pod of their own like a gateway pod, with anything
/// else on it).
pub fn gateway_pod(pod: &mut PartialObjectMeta<Pod>) {
    let meta = &mut pod.metadata;
    meta.annotations = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|key, _| key == POD_NAME_LABEL || key == POD_INSTANCE_LABEL);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::Endpoint;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::render::endpoints::MANAGED_BY_LABEL;

    fn slice(managed_by: Option<&str>) -> EndpointSlice {
        let mut labels = std::collections::BTreeMap::from([(SERVICE_NAME_LABEL.to_owned(), "vllm".to_owned())]);
        if let Some(manager) = managed_by {
            labels.insert(MANAGED_BY_LABEL.0.to_owned(), manager.to_owned());
        }
        EndpointSlice {
            metadata: ObjectMeta { labels: Some(labels), ..Default::default() },
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint {
                addresses: vec!["10.0.0.7".into()],
                node_name: Some("node-a".into()),
                ..Default::default()
            }],
            ports: None,
        }
    }

    /// Only slices Kubernetes' EndpointSlice controller wrote keep their
    /// addresses: a slice by hand, by the mirroring controller, or by
    /// anything else lists no endpoint a gateway would reach.
    #[test]
    fn only_the_endpointslice_controllers_slices_keep_their_endpoints() {
        let mut managed = slice(Some(MANAGED_BY_LABEL.1));
        endpoint_slice(&mut managed);
        assert_eq!(managed.endpoints.len(), 1);
        assert_eq!(managed.endpoints[0].addresses, ["10.0.0.7"]);
        assert_eq!(managed.endpoints[0].node_name, None, "what picking does not read is dropped");
        assert_eq!(managed.labels().get(SERVICE_NAME_LABEL).map(String::as_str), Some("vllm"));
        for manager in [None, Some("endpointslice-mirroring-controller.k8s.io"), Some("team-b.example/slicer")] {
            let mut other = slice(manager);
            endpoint_slice(&mut other);
            assert!(other.endpoints.is_empty(), "{manager:?}");
            assert_eq!(other.labels().get(SERVICE_NAME_LABEL).map(String::as_str), Some("vllm"));
        }
    }

    /// The API server writes `default/kubernetes` itself, without the
    /// controller's label: its addresses stay, for the egress rules.
    #[test]
    fn the_api_servers_own_slice_keeps_its_addresses() {
        let mut api_server = EndpointSlice {
            metadata: ObjectMeta {
                name: Some("kubernetes".into()),
                namespace: Some("default".into()),
                labels: Some([(SERVICE_NAME_LABEL.to_owned(), "kubernetes".to_owned())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint { addresses: vec!["34.120.7.9".into()], ..Default::default() }],
            ports: None,
        };
        endpoint_slice(&mut api_server);
        assert_eq!(crate::networks::api_server_of([&api_server]), ["34.120.7.9/32"]);
        // The same in another namespace is a team's: cleared.
        api_server.metadata.namespace = Some("team-a".into());
        api_server.endpoints = vec![Endpoint { addresses: vec!["34.120.7.9".into()], ..Default::default() }];
        endpoint_slice(&mut api_server);
        assert!(api_server.endpoints.is_empty());
    }

    /// The providers a pod names for a sooner key-set fetch are kept, but
    /// only as much of the list as is ever read.
    #[test]
    fn a_lease_keeps_the_unknown_key_providers_cut_to_what_is_read() {
        let mut beat = heartbeat_lease(&"h".repeat(64), "");
        let long = format!("corp,{}", "x,".repeat(4000));
        beat.metadata.annotations.as_mut().unwrap().insert(UNKNOWN_KEY_ANNOTATION.to_owned(), long);
        lease(&mut beat);
        let kept = &beat.metadata.annotations.unwrap()[UNKNOWN_KEY_ANNOTATION];
        assert!(kept.starts_with("corp,x,") && kept.len() == MAX_UNKNOWN_KEY_LISTED * 64, "{}", kept.len());
    }

    fn heartbeat_lease(holder: &str, reason: &str) -> Lease {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owner = |kind: &str, name: &str| OwnerReference {
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ..Default::default()
        };
        Lease {
            metadata: ObjectMeta {
                name: Some("gw-5d9f-a".into()),
                namespace: Some("platform".into()),
                labels: Some([(GATEWAY_LABEL.to_owned(), "gw".to_owned()), ("big".to_owned(), "z".repeat(60))].into()),
                annotations: Some(
                    [
                        (REFUSED_HASH_ANNOTATION.to_owned(), "abc".to_owned()),
                        (REFUSED_REASON_ANNOTATION.to_owned(), reason.to_owned()),
                        ("something.else/big".to_owned(), "y".repeat(1000)),
                    ]
                    .into(),
                ),
                owner_references: Some(vec![
                    owner("ConfigMap", "gw-5d9f-a"),
                    owner("Pod", "someone-else"),
                    owner("Pod", "gw-5d9f-a"),
                ]),
                finalizers: Some(vec!["x".repeat(1000)]),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(10),
                ..Default::default()
            }),
        }
    }

    /// A Lease keeps its name, Gateway label, the Pod owner it is named
    /// after, its holder and the heartbeat's own annotations; nothing else.
    #[test]
    fn a_lease_keeps_only_what_a_heartbeat_reads() {
        let mut beat = heartbeat_lease(&"h".repeat(64), "bad config");
        lease(&mut beat);
        let meta = &beat.metadata;
        assert_eq!(meta.name.as_deref(), Some("gw-5d9f-a"));
        assert_eq!(meta.labels, Some([(GATEWAY_LABEL.to_owned(), "gw".to_owned())].into()));
        let owners = meta.owner_references.as_deref().unwrap_or_default();
        assert_eq!(
            owners.iter().map(|o| (o.kind.as_str(), o.name.as_str())).collect::<Vec<_>>(),
            [("Pod", "gw-5d9f-a")]
        );
        assert_eq!(meta.finalizers, None);
        let kept = meta.annotations.clone().unwrap();
        assert_eq!(kept.keys().collect::<Vec<_>>(), [REFUSED_HASH_ANNOTATION, REFUSED_REASON_ANNOTATION]);
        let spec = beat.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref().map(str::len), Some(64));
        assert_eq!(spec.lease_duration_seconds, None);
    }

    /// An oversized holder or heartbeat annotation is no heartbeat at all:
    /// neither is kept (a 1 MiB holder would otherwise sit in the store).
    #[test]
    fn an_oversized_holder_or_annotation_is_no_valid_heartbeat() {
        for (holder, reason) in [
            ("h".repeat(1024 * 1024), "bad config".to_owned()),
            ("h".repeat(MAX_HOLDER_BYTES + 1), "bad config".to_owned()),
            ("h".repeat(64), "x".repeat(MAX_ANNOTATION_BYTES + 1)),
        ] {
            let mut beat = heartbeat_lease(&holder, &reason);
            lease(&mut beat);
            assert_eq!(beat.spec, None);
            assert_eq!(beat.metadata.annotations, None);
            assert_eq!(crate::stores::holder(&beat), "", "serves nothing");
        }
    }

    /// At the bounds exactly, a heartbeat is still one.
    #[test]
    fn a_holder_and_annotation_at_their_bounds_are_kept() {
        let holder = "h".repeat(MAX_HOLDER_BYTES);
        let mut beat = heartbeat_lease(&holder, &"x".repeat(MAX_ANNOTATION_BYTES));
        lease(&mut beat);
        assert!(beat.spec.is_some());
        assert_eq!(crate::stores::holder(&beat), holder);
    }

    #[test]
    fn an_api_key_is_kept_without_its_usage_and_the_rest_of_its_status_as_a_digest() {
        let mut key: waycast_crds::ApiKey = serde_json::from_value(serde_json::json!({
            "apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey",
            "metadata": {"name": "alice", "namespace": "team-a"},
            "spec": {},
            "status": {
                "secretName": "alice-key",
                "conditions": [{"type": "Ready", "status": "True", "reason": "KeyReady", "message": "",
                                "lastTransitionTime": "2026-11-26T00:00:00Z"}],
                "usage": {"period": "2026-11", "requests": 3, "inputTokens": 30, "outputTokens": 9,
                          "cachedInputTokens": 0, "cost": "0.01", "currency": "USD", "asOf": "2026-11-26T00:00:00Z"}
            }
        }))
        .unwrap();
        let whole = key.status.clone().unwrap();
        api_key(&mut key);
        let kept = key.status.unwrap();
        assert!(kept.usage.is_none());
        assert_eq!(kept.secret_name, None, "the rest is a digest");
        assert_eq!(kept.compared_digest, Some(crate::status::compared_digest(&whole)));
        let [ready] = kept.conditions.as_slice() else { panic!("{kept:?}") };
        assert_eq!((ready.type_.as_str(), ready.status.as_str()), ("Ready", "True"));
        assert_eq!(ready.last_transition_time, whole.conditions[0].last_transition_time);
        assert!(!crate::status::status_changed(Some(&kept), &whole), "the same status, its usage aside");
    }
}
