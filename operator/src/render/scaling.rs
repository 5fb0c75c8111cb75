//! Optional children: the HorizontalPodAutoscaler (with `spec.autoscaling`)
//! and the PodDisruptionBudget (with more than one replica). When not
//! desired they are pruned by the apply step.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, PodsMetricSource, ResourceMetricSource,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use waycast_crds::Gateway;

use super::meta::{owned_meta, selector_labels};

/// Default CPU target when autoscaling names no target.
pub const DEFAULT_CPU_TARGET: i32 = 80;
/// The per-pod metric for in-flight request targets (served by a custom
/// metrics adapter).
pub const INFLIGHT_METRIC: &str = "waycast_gateway_inflight_requests";

/// The HPA, when the Gateway autoscales.
pub fn hpa(gateway: &Gateway) -> Option<HorizontalPodAutoscaler> {
    let autoscaling = gateway.spec.autoscaling.as_ref()?;
    let mut metrics = Vec::new();
    let cpu = autoscaling
        .target_cpu_utilization_percentage
        .or(autoscaling.target_inflight_requests.is_none().then_some(DEFAULT_CPU_TARGET));
    if let Some(cpu) = cpu {
        metrics.push(MetricSpec {
            type_: "Resource".into(),
            resource: Some(ResourceMetricSource {
                name: "cpu".into(),
                target: MetricTarget {
                    type_: "Utilization".into(),
                    average_utilization: Some(cpu),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        });
    }
    if let Some(inflight) = autoscaling.target_inflight_requests {
        metrics.push(MetricSpec {
            type_: "Pods".into(),
            pods: Some(PodsMetricSource {
                metric: MetricIdentifier { name: INFLIGHT_METRIC.into(), selector: None },
                target: MetricTarget {
                    type_: "AverageValue".into(),
                    average_value: Some(Quantity(inflight.to_string())),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        });
    }
    Some(HorizontalPodAutoscaler {
        metadata: owned_meta(gateway, gateway.name_any()),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name: gateway.name_any(),
            },
            min_replicas: Some(autoscaling.min_replicas.unwrap_or(1)),
            max_replicas: autoscaling.max_replicas,
            metrics: Some(metrics),
            behavior: None,
        }),
        status: None,
    })
}

/// The fewest replicas the Gateway runs.
pub fn minimum_replicas(gateway: &Gateway) -> i32 {
    gateway.spec.minimum_replicas()
}

/// A PDB allowing one pod down at a time, when there is more than one.
pub fn pdb(gateway: &Gateway) -> Option<PodDisruptionBudget> {
    (minimum_replicas(gateway) > 1).then(|| PodDisruptionBudget {
        metadata: owned_meta(gateway, gateway.name_any()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector { match_labels: Some(selector_labels(gateway)), ..LabelSelector::default() }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures;
    use waycast_crds::GatewaySpec;
    use waycast_crds::gateway::Autoscaling;

    #[test]
    fn optional_children_follow_the_spec() {
        let fixed = fixtures::gateway(GatewaySpec { replicas: Some(1), ..GatewaySpec::default() });
        assert!(hpa(&fixed).is_none() && pdb(&fixed).is_none());
        let two = fixtures::gateway(GatewaySpec { replicas: Some(2), ..GatewaySpec::default() });
        assert!(hpa(&two).is_none() && pdb(&two).is_some());
        let scaled = fixtures::gateway(GatewaySpec {
            autoscaling: Some(Autoscaling {
                min_replicas: Some(2),
                max_replicas: 6,
                target_cpu_utilization_percentage: None,
                target_inflight_requests: Some(50),
            }),
            ..GatewaySpec::default()
        });
        let hpa = hpa(&scaled).unwrap().spec.unwrap();
        assert_eq!((hpa.min_replicas, hpa.max_replicas), (Some(2), 6));
        let metrics = hpa.metrics.unwrap();
        assert_eq!(metrics.len(), 1, "an in-flight target alone replaces the CPU default");
        assert_eq!(metrics[0].pods.as_ref().unwrap().metric.name, INFLIGHT_METRIC);
        assert!(pdb(&scaled).is_some());
    }
}
