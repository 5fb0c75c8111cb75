//! The gateway pods' NetworkPolicy: anyone may reach the proxy port; the
//! admin port (`/metrics`: every tenant's key ids and token counts) only
//! from the peers the platform team names (its Prometheus), and egress is
//! restricted only when the platform team lists the rules. Rendered when
//! the operator runs with it (the chart's `gatewayNetworkPolicy`);
//! otherwise any existing one is pruned.
//!
//! NB: kubelet probes come from the node; most network plugins let a
//! node reach its pods whatever the policies say. With one that does not,
//! add the nodes' range to the metrics peers.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use waycast_crds::Gateway;

use super::meta::{ADMIN_PORT, PUBLIC_PORT, owned_meta, selector_labels};

/// What the platform team set for the gateway pods' NetworkPolicy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkPolicySettings {
    /// Who may reach the admin port (`/metrics`, `/healthz`, `/readyz`).
    pub metrics_from: Vec<NetworkPolicyPeer>,
    /// Where the pods may connect; empty: anywhere (no egress policy).
    pub egress: Vec<NetworkPolicyEgressRule>,
}

/// The operator's pods in `namespace`, which collect the gateway pods'
/// usage from their admin port (`crate::usage`).
pub fn operator_peer(namespace: &str) -> NetworkPolicyPeer {
    let labels = |key: &str, value: &str| LabelSelector {
        match_labels: Some([(key.to_owned(), value.to_owned())].into()),
        ..Default::default()
    };
    NetworkPolicyPeer {
        namespace_selector: Some(labels("kubernetes.io/metadata.name", namespace)),
        pod_selector: Some(labels("app.kubernetes.io/name", "waycast-operator")),
        ..Default::default()
    }
}

/// The NetworkPolicy of `gateway`'s pods, when `settings` ask for one.
pub fn network_policy(gateway: &Gateway, settings: Option<&NetworkPolicySettings>) -> Option<NetworkPolicy> {
    let settings = settings?;
    let port = |number: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(number)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    };
    let mut ingress = vec![NetworkPolicyIngressRule { ports: Some(vec![port(PUBLIC_PORT)]), from: None }];
    // NB: a rule whose `from` is empty admits every source: with no peer
    // named, the admin port gets no rule at all, which admits no one.
    if !settings.metrics_from.is_empty() {
        ingress.push(NetworkPolicyIngressRule {
            ports: Some(vec![port(ADMIN_PORT)]),
            from: Some(settings.metrics_from.clone()),
        });
    }
    let mut policy_types = vec!["Ingress".to_owned()];
    if !settings.egress.is_empty() {
        policy_types.push("Egress".to_owned());
    }
    Some(NetworkPolicy {
        metadata: owned_meta(gateway, gateway.name_any()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(selector_labels(gateway)), ..Default::default() }),
            policy_types: Some(policy_types),
            ingress: Some(ingress),
            egress: (!settings.egress.is_empty()).then(|| settings.egress.clone()),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures;

    #[test]
    fn the_admin_port_only_from_the_named_peers_the_proxy_port_from_anyone() {
        let gateway = fixtures::gateway(Default::default());
        assert_eq!(network_policy(&gateway, None), None);
        let scraper = NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("kubernetes.io/metadata.name".to_owned(), "monitoring".to_owned())].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let settings = NetworkPolicySettings { metrics_from: vec![scraper.clone()], egress: Vec::new() };
        let spec = network_policy(&gateway, Some(&settings)).unwrap().spec.unwrap();
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_owned()][..]));
        let ingress = spec.ingress.unwrap();
        assert_eq!(ingress[0].from, None, "the proxy port is open");
        assert_eq!(ingress[1].ports.as_ref().unwrap()[0].port, Some(IntOrString::Int(ADMIN_PORT)));
        assert_eq!(ingress[1].from.as_deref(), Some(&[scraper][..]));
        // An empty `from` would admit every source (Kubernetes' rule): with
        // no peer named, no rule names the admin port at all.
        let closed = NetworkPolicySettings::default();
        let spec = network_policy(&gateway, Some(&closed)).unwrap().spec.unwrap();
        let ingress = spec.ingress.unwrap();
        let admin = |rule: &NetworkPolicyIngressRule| {
            rule.ports.iter().flatten().any(|p| p.port == Some(IntOrString::Int(ADMIN_PORT)))
        };
        assert!(!ingress.iter().any(admin), "no peer: nobody, not everybody: {ingress:?}");
        assert!(ingress.iter().all(|rule| rule.from.as_ref().is_none_or(|from| !from.is_empty())), "{ingress:?}");
        let egress = NetworkPolicySettings { egress: vec![NetworkPolicyEgressRule::default()], ..closed };
        let spec = network_policy(&gateway, Some(&egress)).unwrap().spec.unwrap();
        assert_eq!(spec.policy_types.unwrap(), ["Ingress", "Egress"]);
    }
}
