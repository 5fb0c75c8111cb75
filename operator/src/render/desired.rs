//! Everything a Gateway owns, rendered in one call: what the reconciler
//! applies (one plan, one apply: the endpoints ConfigMap too) and what the
//! goldens compare.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use waycast_crds::endpoints::EndpointsDocument;
use waycast_crds::{Gateway, GatewayConfig};

use super::config_parts::{ConfigParts, Layouts, TooLarge};
use super::settings::RenderSettings;
use super::{config_parts, deployment, network_policy, rbac, scaling, service};

/// Every object a Gateway owns, as it should be.
#[derive(Debug, Clone)]
pub struct Desired {
    /// The compiled config's Secrets: its manifest and parts; why it does
    /// not fit them, when it does not (then it is not written: the pods
    /// keep the last one, and the Gateway says why).
    pub config: Result<std::sync::Arc<ConfigParts>, TooLarge>,
    /// The hash of the config in `config` (its manifest's); empty when it
    /// does not fit.
    pub config_hash: String,
    /// The pods' identity.
    pub service_account: ServiceAccount,
    /// What the pods may read and write (their config's Secrets, their
    /// Leases).
    pub role: Role,
    /// `role` bound to `service_account`.
    pub role_binding: RoleBinding,
    /// The pods.
    pub deployment: Deployment,
    /// Their address.
    pub service: Service,
    /// With autoscaling; absent: any existing one is pruned.
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// With more than one replica; absent: any existing one is pruned.
    pub pdb: Option<PodDisruptionBudget>,
    /// With the operator's NetworkPolicy settings; absent: any existing
    /// one is pruned.
    pub network_policy: Option<NetworkPolicy>,
    /// The ready addresses of the Services the config routes to.
    pub endpoints: ConfigMap,
    /// The hash of the document in `endpoints`.
    pub endpoints_hash: String,
    /// The Services the config routes to (`namespace/name:port`).
    pub services: BTreeSet<String>,
}

impl Desired {
    /// Whether the config fits its Secrets (`config_parts::fits`).
    pub fn config_fits(&self) -> bool {
        self.config.is_ok()
    }
}

/// Renders every object `gateway` owns, serving `config` (split in a
/// layout chosen from `layouts`), with the `endpoints` of the Services it
/// routes to.
///
/// # Errors
/// Only if compressing the config, or serializing the endpoints, fails.
pub fn desired(
    gateway: &Gateway,
    config: &GatewayConfig,
    layouts: &Layouts,
    endpoints: &EndpointsDocument,
    settings: &RenderSettings,
) -> std::io::Result<Desired> {
    let checked = config_parts::check(config, layouts)?;
    desired_checked(gateway, config, checked, layouts, endpoints, settings)
}

/// The same, for a config already split and checked ([`config_parts::check`]).
///
/// # Errors
/// Only if serializing the config or the endpoints fails.
pub fn desired_checked(
    gateway: &Gateway,
    config: &GatewayConfig,
    checked: config_parts::Checked,
    layouts: &Layouts,
    endpoints: &EndpointsDocument,
    settings: &RenderSettings,
) -> std::io::Result<Desired> {
    let config_parts = config_parts::parts_of(gateway, checked)?;
    let (endpoints, endpoints_hash) = super::endpoints::config_map(gateway, endpoints)?;
    let config_hash = config_parts.as_ref().map(|parts| parts.hash.clone()).unwrap_or_default();
    // The pods may read the parts of the config they serve (the last one
    // written) and of the one they are to serve: a new shard count names a
    // new set, and until its manifest is written a starting pod reads the
    // old one. The next reconcile after that drops the old names.
    let current = layouts.current.as_ref().map(|layout| layout.shards);
    let shards: Vec<u32> = match &config_parts {
        Ok(parts) => std::iter::once(parts.layout.shards).chain(current).collect(),
        Err(_) => vec![current.unwrap_or(1)],
    };
    Ok(Desired {
        config: config_parts.map(std::sync::Arc::new),
        config_hash,
        service_account: rbac::service_account(gateway),
        role: rbac::role(gateway, &shards),
        role_binding: rbac::role_binding(gateway),
        deployment: deployment::deployment(gateway, settings),
        service: service::service(gateway),
        hpa: scaling::hpa(gateway),
        pdb: scaling::pdb(gateway),
        network_policy: network_policy::network_policy(gateway, settings.network_policy.as_ref()),
        endpoints,
        endpoints_hash,
        services: super::endpoints::service_keys(config),
    })
}
