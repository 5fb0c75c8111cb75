//! The endpoints ConfigMap a Gateway owns: the ready addresses of every
//! Service its config routes to (`waycast_crds::endpoints`), from the
//! Services' EndpointSlices. Kept apart from the config's Secrets so that pod
//! churn never rewrites the config; the gateway pods watch it by name.
//!
//! ```text
//! config backends' `endpoints` keys ─┐
//! Services (port name of each key)  ─┼─► document() ─► config_map() ─► <gateway>-endpoints
//! EndpointSlices (ready addresses)  ─┘
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use waycast_crds::Gateway;
use waycast_crds::config::GatewayConfig;
use waycast_crds::endpoints::{
    ENDPOINTS_DATA_KEY, EndpointsDocument, MAX_ADDRESSES_PER_DOCUMENT, MAX_ADDRESSES_PER_SERVICE, parse_service_key,
};

use super::meta::{config_map_name, owned_meta};

/// The label an EndpointSlice carries with its Service's name.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The label saying which controller manages an EndpointSlice, and the
/// value of Kubernetes' own EndpointSlice controller (which lists the pods
/// a Service selects).
pub const MANAGED_BY_LABEL: (&str, &str) =
    ("endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io");

/// Whether `slice` was written by Kubernetes' EndpointSlice controller
/// (not by hand, nor mirrored from hand-written Endpoints).
pub fn is_controller_managed(slice: &EndpointSlice) -> bool {
    slice.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL.0)).map(String::as_str)
        == Some(MANAGED_BY_LABEL.1)
}

/// The Service keys (`namespace/name:port`) a config routes to.
pub fn service_keys(config: &GatewayConfig) -> BTreeSet<String> {
    config.models.iter().flat_map(|m| &m.backends).filter_map(|b| b.endpoints.clone()).collect()
}

/// The ready addresses of each Service in `keys`. `service` finds a
/// Service by namespace and name; `slices` gives a Service's EndpointSlices.
/// An endpoint counts unless it is reported not ready or terminating; a
/// Service that is gone, or has no such port, lists none. At most
/// [`MAX_ADDRESSES_PER_SERVICE`] a Service and
/// [`MAX_ADDRESSES_PER_DOCUMENT`] in all (Services in key order): one
/// team's many pods cannot push the document past what a ConfigMap holds.
pub fn document<'a, S>(
    keys: &BTreeSet<String>,
    service: impl Fn(&str, &str) -> Option<&'a Service>,
    slices: impl Fn(&str, &str) -> S,
) -> EndpointsDocument
where
    S: IntoIterator<Item = &'a EndpointSlice>,
{
    let mut services = BTreeMap::new();
    let mut listed = 0_usize;
    for key in keys {
        let Some((namespace, name, port)) = parse_service_key(key) else { continue };
        let port_name = service(namespace, name)
            .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.iter().find(|p| p.port == i32::from(port)).cloned())
            .map(|p| p.name.unwrap_or_default());
        let mut addresses = BTreeSet::new();
        if let Some(port_name) = port_name {
            for slice in slices(namespace, name) {
                let target = slice.ports.iter().flatten().find(|p| p.name.clone().unwrap_or_default() == port_name);
                let Some(target) = target.and_then(|p| p.port).and_then(|p| u16::try_from(p).ok()) else { continue };
                for endpoint in &slice.endpoints {
                    let conditions = endpoint.conditions.as_ref();
                    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
                    let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
                    if !ready || terminating {
                        continue;
                    }
                    let parsed = endpoint.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok());
                    addresses.extend(parsed.map(|ip| SocketAddr::new(ip, target)));
                }
            }
        }
        let room = MAX_ADDRESSES_PER_DOCUMENT.saturating_sub(listed).min(MAX_ADDRESSES_PER_SERVICE);
        let kept: Vec<SocketAddr> = addresses.into_iter().take(room).collect();
        listed += kept.len();
        services.insert(key.clone(), kept);
    }
    EndpointsDocument { services, ..EndpointsDocument::new() }
}

/// The ConfigMap holding `document`, and the document's hash (to skip
/// writing an unchanged one).
///
/// # Errors
/// Serialization failing (not expected for this type).
pub fn config_map(gateway: &Gateway, document: &EndpointsDocument) -> serde_json::Result<(ConfigMap, String)> {
    let json = serde_json::to_string(document)?;
    let hash = waycast_crds::digest::config_hash(json.as_bytes());
    let map = ConfigMap {
        metadata: owned_meta(gateway, config_map_name(gateway)),
        data: Some(BTreeMap::from([(ENDPOINTS_DATA_KEY.to_owned(), json)])),
        ..ConfigMap::default()
    };
    Ok((map, hash))
}

/// The hash [`config_map`] gives `document`.
///
/// # Errors
/// Serialization failing (not expected for this type).
pub fn document_hash(document: &EndpointsDocument) -> serde_json::Result<String> {
    Ok(waycast_crds::digest::config_hash(serde_json::to_string(document)?.as_bytes()))
}

/// Services and their EndpointSlices by namespace and name: built once
/// per reconcile or per burst of endpoint changes and shared by every
/// Gateway looked at from it, so a burst costs one pass over the cluster,
/// not one per Gateway.
pub struct ServiceIndex<'a> {
    services: HashMap<&'a str, HashMap<&'a str, &'a Service>>,
    slices: HashMap<&'a str, HashMap<&'a str, Vec<&'a EndpointSlice>>>,
}

impl<'a> ServiceIndex<'a> {
    /// An index of `services` and `slices` (a slice by its Service label).
    pub fn new(services: &'a [Arc<Service>], slices: &'a [Arc<EndpointSlice>]) -> Self {
        let mut by_service: HashMap<&str, HashMap<&str, &Service>> = HashMap::new();
        for service in services {
            let metadata = &service.metadata;
            if let (Some(namespace), Some(name)) = (metadata.namespace.as_deref(), metadata.name.as_deref()) {
                by_service.entry(namespace).or_default().insert(name, service);
            }
        }
        let mut by_owner: HashMap<&str, HashMap<&str, Vec<&EndpointSlice>>> = HashMap::new();
        for slice in slices {
            let metadata = &slice.metadata;
            let owner = metadata.labels.as_ref().and_then(|labels| labels.get(SERVICE_NAME_LABEL));
            if let (Some(namespace), Some(owner)) = (metadata.namespace.as_deref(), owner) {
                by_owner.entry(namespace).or_default().entry(owner.as_str()).or_default().push(slice);
            }
        }
        Self { services: by_service, slices: by_owner }
    }

    /// The endpoints document of the Services `config` routes to.
    pub fn document(&self, config: &GatewayConfig) -> EndpointsDocument {
        self.document_of(&service_keys(config))
    }

    /// The endpoints document of the Services `keys` name.
    pub fn document_of(&self, keys: &BTreeSet<String>) -> EndpointsDocument {
        document(
            keys,
            |namespace, name| self.services.get(namespace)?.get(name).copied(),
            |namespace, name| {
                self.slices.get(namespace).and_then(|by_service| by_service.get(name)).into_iter().flatten().copied()
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    fn service(ports: &[(&str, i32)]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|(name, port)| ServicePort {
                            name: (!name.is_empty()).then(|| (*name).to_owned()),
                            port: *port,
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    fn slice(port: (&str, i32), endpoints: &[(&str, Option<bool>, Option<bool>)]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            ports: Some(vec![EndpointPort {
                name: Some(port.0.to_owned()),
                port: Some(port.1),
                ..EndpointPort::default()
            }]),
            endpoints: endpoints
                .iter()
                .map(|(address, ready, terminating)| Endpoint {
                    addresses: vec![(*address).to_owned()],
                    conditions: Some(EndpointConditions { ready: *ready, terminating: *terminating, serving: None }),
                    ..Endpoint::default()
                })
                .collect(),
            ..EndpointSlice::default()
        }
    }

    #[test]
    fn ready_addresses_on_the_target_port_of_the_named_service_port() {
        let vllm = service(&[("http", 8000), ("metrics", 9000)]);
        let slices = [
            slice(("http", 8080), &[("10.1.0.7", Some(true), None), ("10.1.0.8", None, None)]),
            slice(("http", 8080), &[("10.1.0.9", Some(false), None), ("10.1.0.10", Some(true), Some(true))]),
            slice(("metrics", 9100), &[("10.1.0.7", Some(true), None)]),
        ];
        let keys = BTreeSet::from(["models/vllm:8000".to_owned(), "models/gone:80".to_owned()]);
        let document = document(
            &keys,
            |namespace, name| (namespace == "models" && name == "vllm").then_some(&vllm),
            |_, name| if name == "vllm" { slices.iter().collect::<Vec<_>>() } else { Vec::new() },
        );
        let addresses: Vec<String> = document.services["models/vllm:8000"].iter().map(ToString::to_string).collect();
        // Not ready and terminating endpoints are left out; the metrics
        // port's slice is not this port's.
        assert_eq!(addresses, ["10.1.0.7:8080", "10.1.0.8:8080"]);
        assert!(document.services["models/gone:80"].is_empty(), "a Service that is gone lists none");
        let (map, hash) = config_map(&crate::render::fixtures::gateway(Default::default()), &document).unwrap();
        let parsed = EndpointsDocument::from_slice(map.data.unwrap()[ENDPOINTS_DATA_KEY].as_bytes()).unwrap();
        assert_eq!(parsed, document, "what the gateway reads back");
        assert_eq!(hash.len(), 64);
    }

    /// However many Services and pods a config routes to, the document
    /// lists at most its bound in all (and each Service its own), so the
    /// ConfigMap always fits.
    #[test]
    fn the_document_is_bounded_whatever_the_pods() {
        let vllm = service(&[("http", 8000)]);
        let addresses: Vec<String> =
            (0..5_000).map(|i| format!("10.{}.{}.{}", i / 65_536, (i / 256) % 256, i % 256)).collect();
        let endpoints: Vec<(&str, Option<bool>, Option<bool>)> =
            addresses.iter().map(|a| (a.as_str(), Some(true), None)).collect();
        let big = slice(("http", 8000), &endpoints);
        let keys: BTreeSet<String> = (0..6).map(|i| format!("team/vllm-{i}:8000")).collect();
        let document = document(&keys, |_, _| Some(&vllm), |_, _| [&big]);
        let total: usize = document.services.values().map(Vec::len).sum();
        assert!(document.services.values().all(|a| a.len() <= MAX_ADDRESSES_PER_SERVICE));
        assert_eq!(total, MAX_ADDRESSES_PER_DOCUMENT);
        let (map, _) = config_map(&crate::render::fixtures::gateway(Default::default()), &document).unwrap();
        let bytes = map.data.unwrap()[ENDPOINTS_DATA_KEY].len();
        assert!(bytes < 900 * 1024, "{bytes} bytes: a ConfigMap holds 1 MiB");
    }
}
