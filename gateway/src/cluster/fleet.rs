//! How many pods share the limits: the live heartbeat Leases of this pod's
//! Gateway (each pod renews its own every few seconds; see `heartbeat.rs`)
//! that are genuine — named after, and owned by, a live pod of the
//! Gateway's Deployment (read by name once per Lease and owner): a Lease
//! anyone else writes with the Gateway's label does not shrink every pod's
//! share.
//!
//! Chosen over a replica count written into the config by the operator:
//! the Leases change within a second of a pod starting to serve, without a
//! config write per scale event, and a pod that dies stops counting when
//! its Lease expires (or at once, when its Pod is deleted and the Lease
//! with it).

use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

use waycast_crds::heartbeat::GATEWAY_LABEL;

use super::PodIdentity;
use crate::limit::fleet::Fleet;

/// How often the live count is recomputed (Leases expire without an event).
const RECOUNT: Duration = Duration::from_secs(1);
/// How long a starting pod counts at least its Gateway's fewest pods while
/// it has not seen that many (their Leases appear a second or more after
/// they are ready).
const FLOOR_WHILE_STARTING: Duration = Duration::from_secs(30);

/// Whether `lease` was renewed within its duration at `now`.
pub fn is_live(lease: &Lease, now: jiff::Timestamp) -> bool {
    let Some(spec) = &lease.spec else { return false };
    let (Some(renewed), Some(duration)) = (&spec.renew_time, spec.lease_duration_seconds) else { return false };
    let expires = renewed.0.as_second().saturating_add(i64::from(duration));
    expires >= now.as_second()
}

/// Keeps `fleet` at the number of live pods of `identity`'s Gateway until
/// the process ends. This pod counts itself even before its own Lease is
/// seen.
pub async fn watch(client: Client, identity: PodIdentity, shared: std::sync::Arc<crate::shared::Shared>) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &identity.namespace);
    let pods: Api<Pod> = Api::namespaced(client, &identity.namespace);
    let config = watcher::Config::default().labels(&format!("{GATEWAY_LABEL}={}", identity.gateway));
    let (reader, writer) = reflector::store();
    let events = reflector::reflector(writer, watcher::watcher(api, config)).default_backoff().touched_objects();
    tokio::spawn(events.for_each(|_| futures_util::future::ready(())));
    let mut checked = Checked::default();
    let started = std::time::Instant::now();
    loop {
        let now = jiff::Timestamp::now();
        let leases = reader.state();
        let candidates: Vec<(String, String)> = leases
            .iter()
            .filter(|lease| lease.metadata.name.as_deref() != Some(&identity.pod))
            .filter(|lease| is_live(lease, now))
            .filter_map(|lease| claimed_pod(lease))
            .collect();
        checked.forget_all_but(&candidates);
        let mut siblings = 0_u32;
        for (pod, uid) in &candidates {
            if checked.is_genuine(&pods, pod, uid, &identity).await {
                siblings = siblings.saturating_add(1);
            }
        }
        set_pods(&shared.fleet, siblings.saturating_add(1), &identity);
        // The minimum comes with the config: before one, nothing is known.
        let minimum = shared.config.current().map(|snapshot| snapshot.settings.minimum_pods);
        let seen_enough = minimum.is_some_and(|minimum| siblings.saturating_add(1) >= minimum);
        if seen_enough || started.elapsed() >= FLOOR_WHILE_STARTING {
            shared.fleet.counted();
        }
        shared.metrics.rate_limit_pods.set(i64::from(shared.fleet.shares_at_least(minimum.unwrap_or(1))));
        tokio::time::sleep(RECOUNT).await;
    }
}

/// The pod a heartbeat Lease says it is: its name, and the UID of the
/// owner Pod of the same name it names (empty when it names none: such a
/// Lease is never genuine, and is reported once like any other).
fn claimed_pod(lease: &Lease) -> Option<(String, String)> {
    let name = lease.metadata.name.as_deref()?;
    let owners = lease.metadata.owner_references.as_deref().unwrap_or_default();
    let uid = owners.iter().find(|o| o.kind == "Pod" && o.name == name).map(|o| o.uid.clone());
    Some((name.to_owned(), uid.unwrap_or_default()))
}

/// What was found of each sibling's pod: genuine or not, by pod name and
/// owner UID; an answer the API server could not give is asked again after
/// [`RECHECK_UNKNOWN`] (and counted meanwhile, as before pods were checked).
#[derive(Default)]
struct Checked(std::collections::HashMap<(String, String), (bool, Option<std::time::Instant>)>);

/// How long a pod the API server could not be asked about counts unchecked.
const RECHECK_UNKNOWN: Duration = Duration::from_secs(30);

impl Checked {
    fn forget_all_but(&mut self, current: &[(String, String)]) {
        self.0.retain(|key, _| current.contains(key));
    }

    async fn is_genuine(&mut self, pods: &Api<Pod>, pod: &str, uid: &str, identity: &PodIdentity) -> bool {
        let key = (pod.to_owned(), uid.to_owned());
        match self.0.get(&key) {
            Some((genuine, None)) => return *genuine,
            Some((genuine, Some(asked))) if asked.elapsed() < RECHECK_UNKNOWN => return *genuine,
            _ => {}
        }
        let found = if uid.is_empty() { (false, None) } else { self.ask(pods, pod, uid, identity).await };
        if !found.0 {
            tracing::warn!(lease = pod, "a heartbeat Lease that is no live pod's own is not counted");
        }
        self.0.insert(key, found);
        found.0
    }

    async fn ask(
        &self,
        pods: &Api<Pod>,
        pod: &str,
        uid: &str,
        identity: &PodIdentity,
    ) -> (bool, Option<std::time::Instant>) {
        match pods.get_metadata_opt(pod).await {
            Ok(Some(meta)) => (
                waycast_crds::heartbeat::is_gateway_pod(&meta.metadata, uid, &identity.namespace, &identity.gateway),
                None,
            ),
            Ok(None) => (false, None),
            Err(error) => {
                tracing::warn!(%error, pod, "cannot read a sibling pod to check its heartbeat; counting it meanwhile");
                (true, Some(std::time::Instant::now()))
            }
        }
    }
}

fn set_pods(fleet: &Fleet, pods: u32, identity: &PodIdentity) {
    if pods != fleet.shares() {
        tracing::info!(pods, gateway = %identity.gateway, "pods sharing the rate limits changed");
    }
    fleet.set(pods);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(renewed_seconds_ago: i64, duration: i32) -> Lease {
        let now = jiff::Timestamp::now().as_second();
        Lease {
            spec: Some(LeaseSpec {
                renew_time: jiff::Timestamp::from_second(now - renewed_seconds_ago).ok().map(MicroTime),
                lease_duration_seconds: Some(duration),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn a_lease_counts_while_renewed_within_its_duration() {
        let now = jiff::Timestamp::now();
        assert!(is_live(&lease(3, 15), now));
        assert!(!is_live(&lease(20, 15), now));
        assert!(!is_live(&Lease::default(), now));
    }
}
