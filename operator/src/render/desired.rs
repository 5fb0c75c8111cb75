//! Everything a Gateway owns, rendered in one call: what the reconciler
//! applies (one plan, one apply: the endpoints ConfigMap too) and what the
//! goldens compare.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use waycast_crds::endpoints::EndpointsDocument;
use waycast_crds::{Gateway, GatewayConfig};

use super::settings::RenderSettings;
use super::{config_secret, deployment, network_policy, rbac, scaling, service};

/// Every object a Gateway owns, as it should be.
#[derive(Debug, Clone)]
pub struct Desired {
    /// The compiled config, gzipped.
    pub config_secret: Secret,
    /// The hash of the config in `config_secret`.
    pub config_hash: String,
    /// Its gzipped size.
    pub config_bytes: usize,
    /// Its size uncompressed, as a gateway reads it.
    pub config_json_bytes: usize,
    /// The pods' identity.
    pub service_account: ServiceAccount,
    /// What the pods may read and write (their config Secret, their Leases).
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
    /// Whether the config fits in a Secret, and uncompressed within what a
    /// gateway reads (`MAX_CONFIG_JSON_BYTES`: a config of repeated text
    /// can compress a hundredfold). When it does not, it is not written:
    /// the pods keep the last one, and the Gateway says why.
    pub fn config_fits(&self) -> bool {
        self.config_bytes <= config_secret::MAX_CONFIG_BYTES
            && self.config_json_bytes as u64 <= waycast_crds::config::MAX_CONFIG_JSON_BYTES
    }
}

/// Renders every object `gateway` owns, serving `config`, with the
/// `endpoints` of the Services it routes to.
///
/// # Errors
/// Only if compressing the config, or serializing the endpoints, fails.
pub fn desired(
    gateway: &Gateway,
    config: &GatewayConfig,
    endpoints: &EndpointsDocument,
    settings: &RenderSettings,
) -> std::io::Result<Desired> {
    let (config_secret, config_hash, config_json_bytes) = config_secret::config_secret(gateway, config)?;
    let (endpoints, endpoints_hash) = super::endpoints::config_map(gateway, endpoints)?;
    let config_bytes = config_secret.data.as_ref().and_then(|d| d.values().next()).map_or(0, |b| b.0.len());
    Ok(Desired {
        config_secret,
        config_hash,
        config_bytes,
        config_json_bytes,
        service_account: rbac::service_account(gateway),
        role: rbac::role(gateway),
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
