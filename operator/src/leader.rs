//! Leader election on a coordination.k8s.io Lease, so two operator replicas
//! are safe: only the holder reconciles. The holder renews every
//! [`RENEW`]; a replica takes over once a Lease has gone unrenewed for
//! [`LEASE_DURATION`]. A holder that cannot renew in time exits, so two
//! replicas never both act for long.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// How long a Lease is valid after its last renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews.
pub const RENEW: Duration = Duration::from_secs(3);
/// The Lease's name.
pub const LEASE_NAME: &str = "waycast-operator";

/// Whether `lease` is held by someone other than `identity` and still valid at `now`.
pub fn held_by_other(lease: &Lease, identity: &str, now: jiff::Timestamp) -> bool {
    let Some(spec) = &lease.spec else { return false };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return false;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    spec.renew_time.as_ref().is_some_and(|renewed| renewed.0.as_second() + duration > now.as_second())
}

fn claimed(mut lease: Lease, identity: &str, now: jiff::Timestamp, taking_over: bool) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if taking_over {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.holder_identity = Some(identity.to_owned());
    spec.lease_duration_seconds = Some(i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(15));
    spec.renew_time = Some(MicroTime(now));
    lease
}

/// Tries once to hold the Lease; `Ok(true)` when this replica holds it now.
/// Updates use the read resourceVersion, so two replicas cannot both win.
///
/// # Errors
/// API errors other than a lost race.
pub async fn try_acquire(api: &Api<Lease>, identity: &str) -> Result<bool, kube::Error> {
    let now = jiff::Timestamp::now();
    let result = match api.get_opt(LEASE_NAME).await? {
        None => {
            let lease =
                Lease { metadata: ObjectMeta { name: Some(LEASE_NAME.into()), ..ObjectMeta::default() }, spec: None };
            api.create(&PostParams::default(), &claimed(lease, identity, now, true)).await
        }
        Some(lease) if held_by_other(&lease, identity, now) => return Ok(false),
        Some(lease) => {
            let taking_over = lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(identity);
            api.replace(LEASE_NAME, &PostParams::default(), &claimed(lease, identity, now, taking_over)).await
        }
    };
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Waits until this replica holds the Lease, then keeps renewing it in the
/// background; the returned future resolves if leadership is lost.
pub async fn lead(client: Client, namespace: &str, identity: String) -> impl std::future::Future<Output = ()> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    loop {
        match try_acquire(&api, &identity).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "leader election failed; retrying"),
        }
        tokio::time::sleep(RENEW).await;
    }
    tracing::info!(%identity, "became the leader");
    async move {
        let mut last_renewal = std::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW).await;
            match try_acquire(&api, &identity).await {
                Ok(true) => last_renewal = std::time::Instant::now(),
                Ok(false) => return,
                Err(error) => tracing::warn!(%error, "lease renewal failed"),
            }
            // NB: stop before another replica could take over.
            if last_renewal.elapsed() > LEASE_DURATION - RENEW {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(jiff::Timestamp::from_second(renewed).unwrap())),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_fresh_lease_of_another_replica_is_respected_until_it_expires() {
        let now = jiff::Timestamp::from_second(1_000).unwrap();
        assert!(held_by_other(&lease("other", 990), "me", now));
        assert!(!held_by_other(&lease("other", 980), "me", now), "expired");
        assert!(!held_by_other(&lease("me", 999), "me", now), "ours");
        assert!(!held_by_other(&lease("", 999), "me", now), "released");
    }
}
