//! No takeover: before the operator applies what a Gateway owns, it checks
//! that no object of the same kind and name exists under another
//! controller. Server-side apply with `force` would otherwise take such an
//! object over (a ServiceAccount, a Service, another team's `<name>-config`
//! Secret), and deleting the Gateway would garbage-collect it.
//!
//! ```text
//! desired names ─► metadata GET each (concurrently) ─► foreign()? ─► NameConflict, nothing applied
//! ```
//!
//! The names of a config's key shards hold their count, which moves with
//! the number of keys, not with the Gateway's generation: they are checked
//! when they are about to be written and the store does not show them as
//! the Gateway's own ([`first_foreign_secret`]).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::ObjectMeta;
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use waycast_crds::Gateway;

use crate::error::Error;
use crate::render;

/// Whether an existing object is someone else's: it has no controller
/// owner reference to the Gateway with `owner_uid`.
pub fn foreign(meta: &ObjectMeta, owner_uid: &str) -> bool {
    !meta.owner_references.iter().flatten().any(|owner| owner.controller == Some(true) && owner.uid == owner_uid)
}

/// The first object the Gateway would own that exists and is someone
/// else's, as `Kind namespace/name`.
///
/// # Errors
/// An API call failed or timed out.
pub async fn first_conflict(client: &Client, gateway: &Gateway) -> Result<Option<String>, Error> {
    let namespace = gateway.namespace().ok_or(Error::Incomplete("namespace"))?;
    let uid = gateway.metadata.uid.clone().ok_or(Error::Incomplete("uid"))?;
    let name = gateway.name_any();
    let config = render::config_secret_name(gateway);
    let base = waycast_crds::shards::base_secret_name(&config);
    let endpoints = render::meta::config_map_name(gateway);
    let usage = render::meta::usage_config_map_name(gateway);
    let ledger = render::meta::usage_ledger_name(gateway);
    let (usage, ledger, base) = tokio::join!(
        check::<ConfigMap>(client, &namespace, &usage, &uid),
        check::<ConfigMap>(client, &namespace, &ledger, &uid),
        check::<Secret>(client, &namespace, &base, &uid),
    );
    let (account, role, binding, secret, endpoints, deployment, service, hpa, pdb, policy) = tokio::join!(
        check::<ServiceAccount>(client, &namespace, &name, &uid),
        check::<Role>(client, &namespace, &name, &uid),
        check::<RoleBinding>(client, &namespace, &name, &uid),
        check::<Secret>(client, &namespace, &config, &uid),
        check::<ConfigMap>(client, &namespace, &endpoints, &uid),
        check::<Deployment>(client, &namespace, &name, &uid),
        check::<Service>(client, &namespace, &name, &uid),
        check::<HorizontalPodAutoscaler>(client, &namespace, &name, &uid),
        check::<PodDisruptionBudget>(client, &namespace, &name, &uid),
        check::<k8s_openapi::api::networking::v1::NetworkPolicy>(client, &namespace, &name, &uid),
    );
    let found = [account, role, binding, secret, base, endpoints, deployment, service, hpa, pdb, policy, usage, ledger];
    for found in found {
        if let Some(conflict) = found? {
            return Ok(Some(conflict));
        }
    }
    Ok(None)
}

/// Secrets looked up at once.
const PARALLEL_LOOKUPS: usize = 16;

/// The first of the Secrets `names` in `namespace` that exists and is not
/// the Gateway's with `uid`, as `Secret namespace/name`.
///
/// # Errors
/// An API call failed or timed out.
pub async fn first_foreign_secret(
    client: &Client,
    namespace: &str,
    names: &[String],
    uid: &str,
) -> Result<Option<String>, Error> {
    use futures_util::StreamExt as _;
    // NB: owned names flow through the stream (see `apply::write_parts`).
    let found: Vec<Result<Option<String>, Error>> = futures_util::stream::iter(names.to_vec())
        .map(|name| async move { check::<Secret>(client, namespace, &name, uid).await })
        .buffered(PARALLEL_LOOKUPS)
        .collect()
        .await;
    for found in found {
        if let Some(conflict) = found? {
            return Ok(Some(conflict));
        }
    }
    Ok(None)
}

async fn check<K>(client: &Client, namespace: &str, name: &str, uid: &str) -> Result<Option<String>, Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let found = crate::apply::bounded(api.get_metadata_opt(name)).await?;
    Ok(found.filter(|object| foreign(&object.metadata, uid)).map(|_| format!("{} {namespace}/{name}", K::kind(&()))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owned_by(uid: &str, controller: Option<bool>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference { uid: uid.into(), controller, ..OwnerReference::default() }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_the_gateways_own_objects_are_not_foreign() {
        assert!(!foreign(&owned_by("gw-uid", Some(true)), "gw-uid"));
        assert!(foreign(&ObjectMeta::default(), "gw-uid"), "an object with no owner is someone's own");
        assert!(foreign(&owned_by("other", Some(true)), "gw-uid"), "another controller's object");
        assert!(foreign(&owned_by("gw-uid", None), "gw-uid"), "a plain owner reference is not control");
    }
}
