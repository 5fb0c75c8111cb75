//! Server-side apply, prune and status patches, each bounded in time.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
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

/// What the API server returned for the objects a Gateway's status reads.
pub struct Observed {
    /// The Deployment, with its replica counts.
    pub deployment: Deployment,
    /// The Service, with its cluster IP.
    pub service: Service,
    /// Whether the endpoints ConfigMap is as desired (applied now, or not
    /// asked to be): a failure to write it is logged and retried, and
    /// fails nothing else.
    pub endpoints_current: bool,
}

/// Applies every object of `desired` (the config Secret only when
/// `write_config`, the endpoints ConfigMap only when `write_endpoints`)
/// and prunes the optional ones it leaves out.
///
/// Independent objects go together, in two rounds: what others refer to
/// (the ServiceAccount, the Role a RoleBinding names — the API server checks
/// a binding against its Role — and the config) before what refers to them.
/// Every apply of a round runs to its end (join, not try_join): cancelling
/// the Role's apply when the binding failed kept the Role from ever being
/// created.
///
/// # Errors
/// The first failed call of a round, after the whole round ran.
pub async fn apply_all(
    client: &Client,
    desired: &render::Desired,
    write_config: bool,
    write_endpoints: bool,
) -> Result<Observed, Error> {
    let namespace = desired.deployment.metadata.namespace.clone().ok_or(Error::Incomplete("namespace"))?;
    let name = desired.deployment.metadata.name.clone().ok_or(Error::Incomplete("name"))?;
    let config = async {
        if write_config {
            apply(client, &desired.config_secret).await?;
        }
        Ok::<_, Error>(())
    };
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
    let (account, role, config, endpoints_current) =
        tokio::join!(apply(client, &desired.service_account), apply(client, &desired.role), config, endpoints);
    account?;
    role?;
    config?;
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
    Ok(Observed { deployment, service, endpoints_current })
}
