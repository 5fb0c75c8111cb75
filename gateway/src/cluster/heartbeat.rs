//! The pod's heartbeat: a Lease named after the pod, owned by it, labelled
//! with its Gateway, whose `holderIdentity` is the hash of the config the
//! pod serves. The operator reads these to know when a change has reached
//! every pod (`Programmed`).
//!
//! Written at once when the served config changes, and renewed every few
//! seconds otherwise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use waycast_crds::heartbeat::{
    DROPPED_ENTRIES_ANNOTATION, DroppedEntry, GATEWAY_LABEL, MAX_DROPPED_LISTED, MAX_DROPPED_REASON_BYTES,
    REFUSED_HASH_ANNOTATION, REFUSED_REASON_ANNOTATION, truncate,
};

use super::PodIdentity;
use crate::config::Refused;
use crate::shared::Shared;

/// Renewal interval when nothing changes.
pub const RENEW: Duration = Duration::from_secs(5);
/// How often the served config is checked for a change.
const CHECK: Duration = Duration::from_millis(50);

/// The annotation listing the entries of the served config left out.
fn dropped_annotation(dropped: &[crate::snapshot::Dropped]) -> Option<String> {
    if dropped.is_empty() {
        return None;
    }
    let listed: Vec<DroppedEntry> = dropped
        .iter()
        .take(MAX_DROPPED_LISTED)
        .map(|d| DroppedEntry {
            entry: truncate(&d.entry, MAX_DROPPED_REASON_BYTES).to_owned(),
            reason: truncate(&d.reason, MAX_DROPPED_REASON_BYTES).to_owned(),
        })
        .collect();
    serde_json::to_string(&listed).ok()
}

/// The pod's heartbeat Lease. NB: every annotation the operator reads is
/// written, empty when unused: a value someone else wrote into this pod's
/// Lease is overwritten at the next renewal (this pod's apply owns them).
fn lease(identity: &PodIdentity, hash: &str, refused: Option<&Refused>, dropped: Option<String>) -> Lease {
    let (refused_hash, refused_reason) =
        refused.map_or((String::new(), String::new()), |r| (r.hash.clone(), r.reason.clone()));
    let annotations = Some(
        [
            (REFUSED_HASH_ANNOTATION.to_owned(), refused_hash),
            (REFUSED_REASON_ANNOTATION.to_owned(), refused_reason),
            (DROPPED_ENTRIES_ANNOTATION.to_owned(), dropped.unwrap_or_default()),
        ]
        .into(),
    );
    Lease {
        metadata: ObjectMeta {
            name: Some(identity.pod.clone()),
            annotations,
            namespace: Some(identity.namespace.clone()),
            labels: Some([(GATEWAY_LABEL.to_owned(), identity.gateway.clone())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: identity.pod.clone(),
                uid: identity.uid.clone(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(hash.to_owned()),
            lease_duration_seconds: Some(i32::try_from(RENEW.as_secs() * 3).unwrap_or(15)),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// Keeps the heartbeat until the process ends.
pub async fn run(client: Client, identity: PodIdentity, shared: Arc<Shared>) {
    let api: Api<Lease> = Api::namespaced(client, &identity.namespace);
    let params = PatchParams::apply("waycast-gateway").force();
    let mut reported: (Option<String>, Option<String>) = (None, None);
    let mut last = Instant::now();
    loop {
        let current = shared.config.current();
        let serving = current.as_ref().map(|snapshot| snapshot.hash.clone());
        let refused = shared.config.refused();
        let state = (serving, refused.as_ref().map(|r| r.hash.clone()));
        let due = reported != state || last.elapsed() >= RENEW;
        if let (true, Some(hash)) = (due, state.0.as_ref()) {
            let dropped = current.as_ref().and_then(|snapshot| dropped_annotation(&snapshot.dropped));
            let lease = lease(&identity, hash, refused.as_deref(), dropped);
            match api.patch(&identity.pod, &params, &Patch::Apply(lease)).await {
                Ok(_) => {
                    reported = state;
                    last = Instant::now();
                }
                Err(error) => {
                    tracing::warn!(%error, "heartbeat failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        tokio::time::sleep(CHECK).await;
    }
}
