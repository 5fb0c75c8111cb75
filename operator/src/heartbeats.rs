//! Gateway pods' heartbeats, counted only where they are genuine: a Lease
//! is a pod's heartbeat when it is named after a live Pod of the Gateway's
//! own Deployment and owned by that Pod (name and UID). Anyone who may
//! write Leases in the namespace could write one labelled for a Gateway;
//! only the Deployment's ReplicaSets make such Pods.
//!
//! ```text
//! Leases labelled waycast.dev/gateway=G ─┐
//! gateway Pods (metadata) ───────────────┴─► genuine ─► Heartbeat { pod, serving, refused, dropped }
//!                                                        ─► reporting, refusing, dropping (Programmed, status)
//! ```
//!
//! Everything read off a Lease is untrusted text: reasons are cut to
//! `heartbeat::MAX_REASON_BYTES`, lists to `heartbeat::MAX_DROPPED_LISTED`.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use waycast_crds::Gateway;
use waycast_crds::heartbeat::{
    DROPPED_ENTRIES_ANNOTATION, DroppedEntry, MAX_REASON_BYTES, REFUSED_HASH_ANNOTATION, REFUSED_REASON_ANNOTATION,
    dropped_entries, is_gateway_pod, truncate,
};

use crate::render;
#[cfg(test)]
use crate::render::selector_labels;
use crate::status::RefusingPod;
use crate::stores::holder;

/// One genuine heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The pod.
    pub pod: String,
    /// The config hash it serves.
    pub serving: String,
    /// The config it refused, and why (cut).
    pub refused: Option<(String, String)>,
    /// The entries of the served config it left out.
    pub dropped: Vec<DroppedEntry>,
}

/// Whether `lease` is the heartbeat of a live pod of `gateway`'s own
/// Deployment, by `pods` (the gateway pods' metadata).
pub fn is_genuine(lease: &Lease, gateway: &Gateway, pods: &Store<PartialObjectMeta<Pod>>) -> bool {
    let Some(namespace) = lease.namespace() else { return false };
    let name = lease.name_any();
    let Some(owner) = lease.owner_references().iter().find(|owner| owner.kind == "Pod" && owner.name == name) else {
        return false;
    };
    let Some(pod) = pods.get(&ObjectRef::new(&name).within(&namespace)) else { return false };
    is_gateway_pod(&pod.metadata, &owner.uid, &namespace, &gateway.name_any())
}

/// The genuine heartbeats of `gateway`'s pods.
pub fn heartbeats(leases: &Store<Lease>, pods: &Store<PartialObjectMeta<Pod>>, gateway: &Gateway) -> Vec<Heartbeat> {
    let namespace = gateway.namespace();
    let name = gateway.name_any();
    leases
        .state()
        .iter()
        .filter(|lease| lease.namespace() == namespace && lease.labels().get(render::GATEWAY_LABEL) == Some(&name))
        .filter(|lease| is_genuine(lease, gateway, pods))
        .map(|lease| heartbeat(lease))
        .collect()
}

fn heartbeat(lease: &Lease) -> Heartbeat {
    let annotations = lease.annotations();
    let refused = annotations.get(REFUSED_HASH_ANNOTATION).filter(|hash| !hash.is_empty()).map(|hash| {
        let reason = annotations.get(REFUSED_REASON_ANNOTATION).map_or("", |r| truncate(r, MAX_REASON_BYTES));
        (truncate(hash, 64).to_owned(), reason.to_owned())
    });
    Heartbeat {
        pod: lease.name_any(),
        serving: truncate(holder(lease), 64).to_owned(),
        refused,
        dropped: annotations.get(DROPPED_ENTRIES_ANNOTATION).map(|listed| dropped_entries(listed)).unwrap_or_default(),
    }
}

/// The config hash each pod serves.
pub fn reporting(heartbeats: &[Heartbeat]) -> Vec<String> {
    heartbeats.iter().map(|beat| beat.serving.clone()).collect()
}

/// The pods that refused the config `hash`, sorted.
pub fn refusing(heartbeats: &[Heartbeat], hash: &str) -> Vec<RefusingPod> {
    let mut refusing: Vec<RefusingPod> = heartbeats
        .iter()
        .filter_map(|beat| {
            let (refused, reason) = beat.refused.as_ref()?;
            (refused == hash).then(|| RefusingPod {
                pod: beat.pod.clone(),
                reason: reason.clone(),
                serving: beat.serving.clone(),
            })
        })
        .collect();
    refusing.sort();
    refusing
}

/// The entries left out of the config `hash` by the pods serving it.
pub fn dropping(heartbeats: &[Heartbeat], hash: &str) -> Vec<(String, DroppedEntry)> {
    heartbeats
        .iter()
        .filter(|beat| beat.serving == hash)
        .flat_map(|beat| beat.dropped.iter().map(|entry| (beat.pod.clone(), entry.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    fn gateway() -> Gateway {
        waycast_mock::fixtures::objects::gateway("platform", "gw")
    }

    fn pod(name: &str, uid: &str, replica_set: &str) -> PartialObjectMeta<Pod> {
        let mut labels = selector_labels(&gateway());
        labels.insert("extra".into(), "label".into());
        PartialObjectMeta::<Pod> {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("platform".into()),
                uid: Some(uid.into()),
                labels: Some(labels),
                owner_references: Some(vec![OwnerReference {
                    kind: "ReplicaSet".into(),
                    name: replica_set.into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn lease(name: &str, owner: &str, owner_uid: &str, serving: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("platform".into()),
                labels: Some([(render::GATEWAY_LABEL.to_owned(), "gw".to_owned())].into()),
                owner_references: Some(vec![OwnerReference {
                    kind: "Pod".into(),
                    name: owner.into(),
                    uid: owner_uid.into(),
                    ..Default::default()
                }]),
                annotations: Some(
                    [
                        (REFUSED_HASH_ANNOTATION.to_owned(), "new".to_owned()),
                        (REFUSED_REASON_ANNOTATION.to_owned(), "x".repeat(5000)),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec { holder_identity: Some(serving.into()), ..Default::default() }),
        }
    }

    fn store<K>(objects: Vec<K>) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let (reader, mut writer) = kube::runtime::reflector::store();
        for object in objects {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
        }
        reader
    }

    /// Only a Lease named after a live Pod of the Gateway's Deployment and
    /// owned by it (by UID) counts: forged holders and extra Leases do not
    /// change what the pods are said to serve, nor how many report.
    #[test]
    fn only_a_live_gateway_pods_own_lease_counts() {
        let mut terminating = pod("gw-5d9f-e", "uid-e", "gw-5d9f");
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
        let pods = store(vec![
            pod("gw-5d9f-a", "uid-a", "gw-5d9f"),
            pod("gw-5d9f-b", "uid-b", "gw-5d9f"),
            pod("other-77-c", "uid-c", "other-77"),
            pod("gw-5d9f-d", "uid-d", "gw-5d9f"),
            terminating,
        ]);
        let leases = store(vec![
            lease("gw-5d9f-a", "gw-5d9f-a", "uid-a", "hash-1"),
            lease("forged", "forged", "uid-x", "hash-new"),
            lease("gw-5d9f-b", "gw-5d9f-b", "uid-stale", "hash-new"),
            lease("copy-of-a", "gw-5d9f-a", "uid-a", "hash-new"),
            lease("other-77-c", "other-77-c", "uid-c", "hash-new"),
            // The right pod's UID, but an owner of another name.
            lease("gw-5d9f-d", "someone-else", "uid-d", "hash-new"),
            // A pod of the Gateway's own that is being deleted.
            lease("gw-5d9f-e", "gw-5d9f-e", "uid-e", "hash-new"),
        ]);
        let beats = heartbeats(&leases, &pods, &gateway());
        assert_eq!(reporting(&beats), ["hash-1"]);
        let refusing = refusing(&beats, "new");
        assert_eq!(refusing.len(), 1);
        assert_eq!(refusing[0].reason.len(), MAX_REASON_BYTES, "a reason is cut before it reaches a status");
    }
}
