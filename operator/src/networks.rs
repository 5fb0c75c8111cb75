//! The cluster's own networks, closed to `url` backends unless a Gateway
//! opens them — on top of every private range, which compile always
//! closes: its Service and Pod ranges and its Nodes' addresses (given with
//! `--cluster-cidrs`, or found: the ServiceCIDR objects and each Node's
//! `podCIDRs` and addresses, looked at again every [`REDISCOVER`]) and the
//! API server's addresses (from the `default/kubernetes` EndpointSlices the
//! stores already hold). Found ranges matter where the cluster uses public
//! addresses; a list that fails keeps what was found before.
//!
//! ```text
//! --cluster-cidrs ─┐
//! ServiceCIDRs ────┼─► ClusterNetworks (ArcSwap) ─► Catalog ─► compile: settings.closedCIDRs
//! Node podCIDRs ───┘        changed ─► every Gateway compiled again
//! ```
//!
//! Nothing found (no RBAC for them, an older cluster) closes no less:
//! every private range is closed whatever is found (`egress::PRIVATE_RANGES`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use tokio::sync::broadcast;

/// How often the Service and Pod ranges are looked for again.
pub const REDISCOVER: Duration = Duration::from_secs(60);

/// Nodes listed per page.
const NODE_PAGE: u32 = 100;

/// The cluster's Service and Pod ranges, as CIDR text, sorted.
#[derive(Default)]
pub struct ClusterNetworks {
    ranges: arc_swap::ArcSwap<Vec<String>>,
    /// Fires when the ranges change.
    pub changed: Option<broadcast::Sender<()>>,
}

impl ClusterNetworks {
    /// Ranges given by the platform team: never looked for.
    pub fn fixed(ranges: Vec<String>) -> Self {
        Self { ranges: arc_swap::ArcSwap::from_pointee(sorted(ranges)), changed: None }
    }

    /// Ranges to be found ([`ClusterNetworks::keep_current`]).
    pub fn discovered() -> Self {
        let (changed, _) = broadcast::channel(4);
        Self { ranges: arc_swap::ArcSwap::default(), changed: Some(changed) }
    }

    /// The ranges known now.
    pub fn ranges(&self) -> Arc<Vec<String>> {
        self.ranges.load_full()
    }

    /// Looks for the ranges now and every [`REDISCOVER`], for as long as
    /// the task runs; signals `changed` when they change. Does nothing for
    /// fixed ranges.
    pub async fn keep_current(&self, client: kube::Client) {
        let Some(changed) = &self.changed else { return };
        loop {
            let (found, complete) = discover(&client).await;
            // NB: a list that failed keeps what was found before: the
            // closed ranges never shrink because the API server hiccuped.
            let found = if complete {
                sorted(found)
            } else {
                sorted(found.into_iter().chain(self.ranges.load_full().iter().cloned()).collect())
            };
            if *self.ranges.load_full() != found {
                tracing::info!(ranges = ?found, "cluster networks closed to url backends");
                self.ranges.store(Arc::new(found));
                let _ = changed.send(());
            }
            tokio::time::sleep(REDISCOVER).await;
        }
    }
}

fn sorted(ranges: Vec<String>) -> Vec<String> {
    ranges.into_iter().collect::<BTreeSet<_>>().into_iter().collect()
}

/// The ServiceCIDRs' ranges, the Nodes' pod ranges and the Nodes'
/// addresses (as host ranges); and whether every list succeeded (what
/// cannot be read is logged and left out).
async fn discover(client: &kube::Client) -> (Vec<String>, bool) {
    let mut ranges = Vec::new();
    let mut complete = true;
    match Api::<ServiceCIDR>::all(client.clone()).list(&ListParams::default()).await {
        Ok(list) => {
            ranges.extend(list.items.into_iter().filter_map(|c| c.spec).flat_map(|s| s.cidrs.unwrap_or_default()))
        }
        Err(error) => {
            complete = false;
            tracing::warn!(%error, "cannot list ServiceCIDRs; the Service range is not known");
        }
    }
    let nodes = Api::<Node>::all(client.clone());
    let mut params = ListParams::default().limit(NODE_PAGE);
    loop {
        match nodes.list(&params).await {
            Ok(page) => {
                let next = page.metadata.continue_.clone().filter(|token| !token.is_empty());
                for node in page.items {
                    if let Some(spec) = node.spec {
                        ranges.extend(spec.pod_cidr.into_iter().chain(spec.pod_cidrs.unwrap_or_default()));
                    }
                    // The kubelet, host-network pods and node ports.
                    let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
                    ranges.extend(addresses.into_iter().filter_map(|a| host_range(&a.address)));
                }
                match next {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
            Err(error) => {
                complete = false;
                tracing::warn!(%error, "cannot list Nodes; the Pod ranges are not known");
                break;
            }
        }
    }
    ranges.retain(|range| range.parse::<waycast_crds::egress::Cidr>().is_ok());
    (ranges, complete)
}

/// `address` as a one-address range, when it is an IP address.
fn host_range(address: &str) -> Option<String> {
    let ip = address.parse::<std::net::IpAddr>().ok()?;
    Some(if ip.is_ipv4() { format!("{ip}/32") } else { format!("{ip}/128") })
}

/// The API server's addresses, as host ranges: the endpoints of the
/// `default/kubernetes` Service in `slices`.
pub fn api_server(slices: &Store<EndpointSlice>) -> Vec<String> {
    api_server_of(slices.state().iter().map(AsRef::as_ref))
}

/// [`api_server`] over plain slices.
pub fn api_server_of<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> Vec<String> {
    let mut addresses = BTreeSet::new();
    for slice in slices.into_iter().filter(|slice| is_api_server(slice)) {
        addresses.extend(slice.endpoints.iter().flat_map(|e| e.addresses.iter()).filter_map(|a| host_range(a)));
    }
    addresses.into_iter().collect()
}

/// Whether `slice` is the API server's own (`default/kubernetes`, which
/// the API server writes itself, without the EndpointSlice controller's
/// label).
pub fn is_api_server(slice: &EndpointSlice) -> bool {
    slice.metadata.namespace.as_deref() == Some("default")
        && slice.metadata.labels.as_ref().and_then(|l| l.get(crate::render::endpoints::SERVICE_NAME_LABEL))
            == Some(&"kubernetes".to_owned())
}
