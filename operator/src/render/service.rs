//! The Service in front of a Gateway's pods.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use waycast_crds::Gateway;
use waycast_crds::gateway::ServiceType;

use super::meta::{owned_meta, selector_labels};

/// The Service: `spec.service.type` (ClusterIP), port 80 (443 with TLS)
/// to the pods' `http` port.
pub fn service(gateway: &Gateway) -> Service {
    let spec = gateway.spec.service.clone().unwrap_or_default();
    let default_port = if gateway.spec.tls.is_some() { 443 } else { 80 };
    let mut metadata = owned_meta(gateway, gateway.name_any());
    if !spec.annotations.is_empty() {
        metadata.annotations = Some(spec.annotations.clone());
    }
    let type_ = match spec.type_.unwrap_or_default() {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
    };
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(type_.to_owned()),
            selector: Some(selector_labels(gateway)),
            ports: Some(vec![ServicePort {
                name: Some(if gateway.spec.tls.is_some() { "https" } else { "http" }.to_owned()),
                port: spec.port.unwrap_or(default_port),
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
