//! Server-side apply, prune and status patches, each bounded in time.

use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config_plan::Plan;
use crate::error::Error;
use crate::render::config_parts::{ConfigParts, data_bytes};
use crate::render::{self, FIELD_MANAGER};

pub(crate) async fn apply<K>(client: &Client, object: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let namespace = object.meta().namespace.clone().ok_or(Error::Incomplete("namespace"))?;
    let name = object.meta().name.clone().ok_or(Error::Incomplete("name"))?;
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    bounded(api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object))).await
}

/// Longest one API call may take. A request caught in an API server
/// restart can hang with no reply; the reconcile fails instead and is
/// retried (a hung reconcile holds its object: nothing else runs for it).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn bounded<T>(call: impl std::future::Future<Output = Result<T, kube::Error>>) -> Result<T, Error> {
    tokio::time::timeout(CALL_TIMEOUT, call).await.map_err(|_| Error::Timeout(CALL_TIMEOUT))?.map_err(Error::from)
}

pub(crate) async fn prune<K>(client: &Client, namespace: &str, name: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match bounded(api.delete(name, &DeleteParams::background())).await {
        Ok(_) => Ok(()),
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

pub(crate) async fn patch_status<K>(client: &Client, object: &K, status: serde_json::Value) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let namespace = object.meta().namespace.clone().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    bounded(api.patch_status(&object.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(body)))
        .await?;
    Ok(())
}

/// Applies what a Gateway's config and its other objects refer to: the
/// ServiceAccount and the Role (the API server checks a binding against
/// its Role; the pods read the config's parts with it), and the endpoints
/// ConfigMap when `write_endpoints`. Whether the endpoints ConfigMap is as
/// desired: a failure to write it is logged and retried, and fails nothing
/// else.
///
/// Every apply runs to its end (join, not try_join): cancelling the Role's
/// apply when another failed kept the Role from ever being created.
///
/// # Errors
/// The first failed call, after all ran.
pub async fn apply_referred(client: &Client, desired: &render::Desired, write_endpoints: bool) -> Result<bool, Error> {
    let endpoints = async {
        if !write_endpoints {
            return true;
        }
        match apply(client, &desired.endpoints).await {
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(%error, "cannot write the endpoints ConfigMap; retrying at the next look");
                false
            }
        }
    };
    let (account, role, endpoints_current) =
        tokio::join!(apply(client, &desired.service_account), apply(client, &desired.role), endpoints);
    account?;
    role?;
    Ok(endpoints_current)
}

/// What the API server returned for the objects a Gateway's status reads.
pub struct Observed {
    /// The Deployment, with its replica counts.
    pub deployment: Deployment,
    /// The Service, with its cluster IP.
    pub service: Service,
}

/// Applies the rest of `desired` — the RoleBinding, the Deployment, the
/// Service and the optional objects, pruning those it leaves out — each to
/// its end. After [`apply_referred`]; the config's Secrets are its
/// writer's (`controller::config_writer`, [`write_config`]).
///
/// # Errors
/// The first failed call, after all ran.
pub async fn apply_rest(client: &Client, desired: &render::Desired) -> Result<Observed, Error> {
    let namespace = desired.deployment.metadata.namespace.clone().ok_or(Error::Incomplete("namespace"))?;
    let name = desired.deployment.metadata.name.clone().ok_or(Error::Incomplete("name"))?;
    let hpa = async {
        match &desired.hpa {
            Some(hpa) => apply(client, hpa).await.map(drop),
            None => prune::<HorizontalPodAutoscaler>(client, &namespace, &name).await,
        }
    };
    let pdb = async {
        match &desired.pdb {
            Some(pdb) => apply(client, pdb).await.map(drop),
            None => prune::<PodDisruptionBudget>(client, &namespace, &name).await,
        }
    };
    let network_policy = async {
        match &desired.network_policy {
            Some(policy) => apply(client, policy).await.map(drop),
            None => prune::<k8s_openapi::api::networking::v1::NetworkPolicy>(client, &namespace, &name).await,
        }
    };
    let (binding, deployment, service, hpa, pdb, network_policy) = tokio::join!(
        apply(client, &desired.role_binding),
        apply(client, &desired.deployment),
        apply(client, &desired.service),
        hpa,
        pdb,
        network_policy
    );
    let (_, deployment, service, (), (), ()) = (binding?, deployment?, service?, hpa?, pdb?, network_policy?);
    Ok(Observed { deployment, service })
}

/// Writes the config Secrets `plan` names: the parts, then — once every
/// part it names is written — the manifest, then the shards it no longer
/// names are emptied. A part that fails leaves the manifest as it was: the
/// pods keep a whole config. Their data bytes.
///
/// # Errors
/// The first that failed.
pub async fn write_config(client: &Client, parts: &ConfigParts, plan: &Plan) -> Result<usize, Error> {
    let mut written = write_parts(client, parts, plan).await?;
    if plan.writes_manifest() {
        apply(client, &parts.manifest).await?;
        written += data_bytes(&parts.manifest);
    }
    let retired: Vec<Secret> = plan.retire.iter().map(|stale| parts.retired(stale)).collect();
    let retiring = retired.iter().map(|secret| apply(client, secret));
    futures_util::future::join_all(retiring).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(written)
}

/// Writes the shards `indices` of `parts`, then its manifest: a patch of
/// a few keys (`controller::config_writer`). Their data bytes.
///
/// # Errors
/// The first that failed (the manifest is then not written: the pods keep
/// the config they have).
pub async fn write_patch(client: &Client, parts: &ConfigParts, indices: &[usize]) -> Result<usize, Error> {
    let write = indices.iter().filter_map(|index| parts.shards.get(*index)?.name.clone()).collect();
    let written = write_parts(client, parts, &Plan { write, ..Plan::default() }).await?;
    apply(client, &parts.manifest).await?;
    Ok(written + data_bytes(&parts.manifest))
}

/// Parts written at once: a new shard count writes up to a thousand.
const PARALLEL_PART_WRITES: usize = 8;

/// Writes the parts `plan` names (not the manifest), every one to its end;
/// their data bytes.
///
/// # Errors
/// The first that failed.
async fn write_parts(client: &Client, parts: &ConfigParts, plan: &Plan) -> Result<usize, Error> {
    // Gzipped here, for the parts written only.
    let mut wanted = Vec::new();
    for name in plan.parts() {
        wanted.extend(parts.secret(name)?);
    }
    // NB: indices, not references, flow through the stream: a stream of
    // borrowed items made the reconcile future not `Send` for every
    // lifetime, as the controller needs.
    let results: Vec<Result<usize, Error>> = futures_util::stream::iter(0..wanted.len())
        .map(|index| {
            let secret = &wanted[index];
            async move { apply(client, secret).await.map(|_| data_bytes(secret)) }
        })
        .buffer_unordered(PARALLEL_PART_WRITES)
        .collect()
        .await;
    results.into_iter().sum()
}
