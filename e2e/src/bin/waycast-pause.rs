//! `waycast-pause`: the pod sandbox process. It holds the pod's namespaces
//! open by doing nothing until it is told to stop (SIGTERM or SIGINT), then
//! exits 0 — what the kubelet's pause image does.

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
