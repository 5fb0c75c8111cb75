//! The API server restarts mid-run: gateway pods keep serving their last
//! config meanwhile, and the operator converges afterwards (a key applied
//! after the restart works everywhere).

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use kube::Api;
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::wait::{Patience, Seen, await_condition, await_object_condition, condition, holds_for};
use waycast_e2e::workloads::wait_pods_ready;
use waycast_mock::fixtures as fixture;

async fn answers(url: &str, key: &str) -> Option<http::StatusCode> {
    use http_body_util::BodyExt as _;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = fixture::post_request(url, Some(key), r#"{"model":"llama3"}"#);
    let response = tokio::time::timeout(Duration::from_secs(2), http.request(request)).await.ok()?.ok()?;
    let status = response.status();
    if status != http::StatusCode::OK {
        let body = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        eprintln!("{url} answered {status}: {}", String::from_utf8_lossy(&body));
    }
    Some(status)
}

async fn key_text(client: &kube::Client, namespace: &str, name: &str) -> String {
    waycast_e2e::workloads::generated_key(client, namespace, name, Duration::from_secs(60)).await.unwrap()
}

#[tokio::test]
async fn gateways_serve_through_an_api_server_restart_and_the_operator_converges() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "restart").await.unwrap();
    manifest::apply_all(&client, &waycast_e2e::workloads::quickstart().unwrap(), &namespace).await.unwrap();
    // NB: route to the inference pod by its IP rather than its Service:
    // while the API server restarts, kube-proxy resyncs its rules and the
    // Service path can drop connections for a moment (seen here); this test
    // is about the gateways keeping their config, not about kube-proxy.
    let upstream =
        wait_pods_ready(&client, &namespace, "app.kubernetes.io/name=vllm", 1, Duration::from_secs(60)).await.unwrap();
    let upstream_ip = upstream[0].status.as_ref().unwrap().pod_ip.clone().unwrap();
    // A url backend to a pod: the platform team opens that address.
    waycast_e2e::workloads::open_egress(&client, &namespace, "gateway", &[&upstream_ip]).await.unwrap();
    let direct = serde_json::json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "llama-3-1-8b"},
        "spec": {"model": "llama-3.1-8b", "aliases": ["llama3"], "backends": [{"url": format!("http://{upstream_ip}:8000/v1")}]}});
    manifest::apply_all(&client, &[serde_json::from_value(direct).unwrap()], &namespace).await.unwrap();
    let keys: Api<ApiKey> = Api::namespaced(client.clone(), &namespace);
    let patience = Patience::by(Instant::now() + Duration::from_secs(120)).every(Duration::from_millis(200));
    await_object_condition(&keys, "alice", &condition("Programmed"), patience).await.unwrap();
    let alice = key_text(&client, &namespace, "alice").await;
    // The direct route is programmed.
    let endpoints: Api<waycast_crds::ModelEndpoint> = Api::namespaced(client.clone(), &namespace);
    let direct = condition("Programmed").at_generation(Some(2));
    await_object_condition(&endpoints, "llama-3-1-8b", &direct, patience).await.unwrap();
    let pods = wait_pods_ready(&client, &namespace, "app.kubernetes.io/instance=gateway", 2, Duration::from_secs(60))
        .await
        .unwrap();
    let urls: Vec<String> = pods
        .iter()
        .map(|p| format!("http://{}:8080/v1/chat/completions", p.status.as_ref().unwrap().pod_ip.as_ref().unwrap()))
        .collect();

    cluster.restart_apiserver();
    // While the API server is away (and its watches break), every pod
    // keeps serving its last config.
    let mut saw_outage = false;
    holds_for("every pod serves during the restart", Duration::from_secs(8), Duration::from_millis(100), async || {
        for url in &urls {
            let answer = answers(url, &alice).await;
            if answer != Some(http::StatusCode::OK) {
                return Seen::NotYet(format!("{url} answered {answer:?}"));
            }
        }
        saw_outage |= Api::<Gateway>::namespaced(client.clone(), &namespace).get("gateway").await.is_err();
        Seen::Done(())
    })
    .await
    .unwrap();
    assert!(saw_outage, "the API server never went away: the test proved nothing");

    // Afterwards the operator converges: a new key is programmed and works.
    let converged = Patience::by(Instant::now() + Duration::from_secs(60)).every(Duration::from_millis(200));
    let bob = serde_json::json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "bob"}, "spec": {}});
    await_condition("the API server comes back and takes bob", converged, async || {
        let applied = manifest::apply_all(&client, &[serde_json::from_value(bob.clone()).unwrap()], &namespace).await;
        Seen::when(applied.is_ok(), applied)
    })
    .await
    .unwrap();
    // The operator converges after the restart.
    await_object_condition(&keys, "bob", &condition("Programmed"), converged).await.unwrap();
    let bob_key = key_text(&client, &namespace, "bob").await;
    for url in &urls {
        assert_eq!(answers(url, &bob_key).await, Some(http::StatusCode::OK));
    }
}
