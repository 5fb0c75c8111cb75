//! The operator as a real pod, from its packed image, with the RBAC the
//! project ships (`deploy/operator.yaml`) — proving that RBAC sufficient —
//! serving the quickstart end to end. This is also what `make demo` runs.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use waycast_e2e::harness::shared_cluster_with_node;
use waycast_e2e::workloads::deploy_demo;

#[tokio::test]
async fn the_operator_pod_serves_the_quickstart_with_its_own_rbac() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    let client = cluster.client().await;
    let demo = deploy_demo(&client).await.unwrap();
    assert!(demo.key.starts_with("wc_"));
    assert!(!demo.gateway_ip.is_empty());
}
