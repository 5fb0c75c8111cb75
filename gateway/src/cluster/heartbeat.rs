//! The pod's heartbeat: a Lease named after the pod, owned by it, labelled
//! with its Gateway, whose `holderIdentity` is the hash of the config the
//! pod serves. The operator reads these to know when a change has reached
//! every pod (`Programmed`).
//!
//! Written at once when the served config changes, and renewed every few
//! seconds otherwise. It also names the providers whose tokens were
//! refused `unknown_key` since the last write (a key rotated in at the
//! issuer), so the operator fetches their key sets sooner: written at once
//! for that too, but at most once per [`NOTE_EVERY`] (else at the next
//! renewal).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use waycast_crds::heartbeat::{
    DROPPED_ENTRIES_ANNOTATION, DroppedEntry, GATEWAY_LABEL, MAX_DROPPED_LISTED, MAX_DROPPED_REASON_BYTES,
    REFUSED_HASH_ANNOTATION, REFUSED_REASON_ANNOTATION, UNKNOWN_KEY_ANNOTATION, truncate, unknown_key_annotation,
};

use super::PodIdentity;
use crate::config::Refused;
use crate::shared::Shared;

/// Renewal interval when nothing changes.
pub const RENEW: Duration = Duration::from_secs(5);
/// How often the served config is checked for a change.
const CHECK: Duration = Duration::from_millis(50);
/// The soonest the heartbeat is written again for `unknown_key` notes
/// alone: the operator fetches a key set at most once per 10 s whatever
/// the pods say, so writing more often would only load the API server
/// (a flood of tokens naming made-up keys costs one write per 10 s).
pub const NOTE_EVERY: Duration = Duration::from_secs(10);

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
fn lease(
    identity: &PodIdentity,
    hash: &str,
    refused: Option<&Refused>,
    dropped: Option<String>,
    unknown_keys: &[String],
) -> Lease {
    let (refused_hash, refused_reason) =
        refused.map_or((String::new(), String::new()), |r| (r.hash.clone(), r.reason.clone()));
    let annotations = Some(
        [
            (REFUSED_HASH_ANNOTATION.to_owned(), refused_hash),
            (REFUSED_REASON_ANNOTATION.to_owned(), refused_reason),
            (DROPPED_ENTRIES_ANNOTATION.to_owned(), dropped.unwrap_or_default()),
            (UNKNOWN_KEY_ANNOTATION.to_owned(), unknown_key_annotation(unknown_keys.iter().map(String::as_str))),
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

/// Whether the heartbeat is written now: the served (or refused) config
/// changed, a renewal is due `since_write` the last write, or providers
/// are `noted` and the last write that named some was [`NOTE_EVERY`] ago
/// or more (`since_noted`; never: `None`).
fn due(changed: bool, since_write: Duration, noted: bool, since_noted: Option<Duration>) -> bool {
    changed || since_write >= RENEW || (noted && since_noted.is_none_or(|since| since >= NOTE_EVERY))
}

/// Keeps the heartbeat until the process ends.
pub async fn run(client: Client, identity: PodIdentity, shared: Arc<Shared>) {
    let api: Api<Lease> = Api::namespaced(client, &identity.namespace);
    let params = PatchParams::apply("waycast-gateway").force();
    let mut reported: (Option<String>, Option<String>) = (None, None);
    let mut last = Instant::now();
    let mut last_noted: Option<Instant> = None;
    loop {
        let current = shared.config.current();
        let serving = current.as_ref().map(|snapshot| snapshot.hash.clone());
        let refused = shared.config.refused();
        let state = (serving, refused.as_ref().map(|r| r.hash.clone()));
        let identity_served = current.as_ref().map(|snapshot| &snapshot.identity);
        let noted = identity_served.is_some_and(|served| served.unknown_keys_noted());
        let due = due(reported != state, last.elapsed(), noted, last_noted.map(|at| at.elapsed()));
        if let (true, Some(hash)) = (due, state.0.as_ref()) {
            let dropped = current.as_ref().and_then(|snapshot| dropped_annotation(&snapshot.dropped));
            let unknown_keys: Vec<String> = identity_served
                .map(|served| served.take_unknown_keys().into_iter().map(str::to_owned).collect())
                .unwrap_or_default();
            let lease = lease(&identity, hash, refused.as_deref(), dropped, &unknown_keys);
            match api.patch(&identity.pod, &params, &Patch::Apply(lease)).await {
                Ok(_) => {
                    reported = state;
                    last = Instant::now();
                    if !unknown_keys.is_empty() {
                        last_noted = Some(last);
                    }
                }
                Err(error) => {
                    // The notes go with the next write.
                    if let Some(served) = identity_served {
                        served.renote_unknown_keys(&unknown_keys);
                    }
                    tracing::warn!(%error, "heartbeat failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        tokio::time::sleep(CHECK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodIdentity {
        PodIdentity { pod: "gw-1".into(), uid: "uid-1".into(), namespace: "platform".into(), gateway: "gw".into() }
    }

    /// A note is written at once, then at most once per `NOTE_EVERY`
    /// (notes meanwhile go with the next renewal).
    #[test]
    fn notes_are_written_at_once_then_at_most_every_ten_seconds() {
        let s = Duration::from_secs;
        assert!(!due(false, s(1), false, None), "nothing to say");
        assert!(due(false, s(1), true, None), "the first note: at once");
        assert!(!due(false, s(1), true, Some(s(3))), "a note 3 s after the last waits");
        assert!(due(false, s(1), true, Some(s(10))));
        assert!(due(false, RENEW, true, Some(s(3))), "the renewal carries it");
        assert!(due(true, s(0), false, None), "a config change is written at once");
    }

    #[test]
    fn the_lease_names_the_providers_noted_and_nothing_else() {
        let annotation = |keys: &[String]| {
            let lease = lease(&pod(), "hash", None, None, keys);
            lease.metadata.annotations.unwrap()[UNKNOWN_KEY_ANNOTATION].clone()
        };
        assert_eq!(annotation(&["corp".into(), "cluster".into()]), "corp,cluster");
        assert_eq!(annotation(&[]), "", "written empty: a value someone else wrote is overwritten");
    }
}
