//! `waycast-pause`: the pod sandbox process. It holds the pod's namespaces
//! open by doing nothing until it is told to stop (SIGTERM or SIGINT), then
//! exits 0 — what the kubelet's pause image does.

#[tokio::main(flavor = "current_thread")]
async fn main() {
    waycast_gateway::termination_signal().await;
}
