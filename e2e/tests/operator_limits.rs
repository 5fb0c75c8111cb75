//! A rate limit across a fleet of real gateway pods, counted locally: each
//! of three pods learns of the others from their heartbeat Leases and
//! enforces a third, so together they admit the configured rate.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams};
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::harness::{condition_true, operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::workloads::{metric_sample, wait_pods_ready};
use waycast_mock::fixtures as fixture;

const CHAT: &str = r#"{"model":"llama3","messages":[]}"#;

async fn status_of(url: &str, key: &str) -> Option<http::StatusCode> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let response =
        tokio::time::timeout(Duration::from_secs(2), http.request(fixture::post_request(url, Some(key), CHAT)))
            .await
            .ok()?
            .ok()?;
    Some(response.status())
}

#[tokio::test]
async fn three_pods_together_admit_a_keys_60_a_minute() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "limits").await.unwrap();
    manifest::apply_all(&client, &waycast_e2e::workloads::quickstart().unwrap(), &namespace).await.unwrap();
    let limited = serde_json::json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "limited"},
        "spec": {"limits": {"requestsPerMinute": 60}}});
    manifest::apply_all(&client, &[serde_json::from_value(limited).unwrap()], &namespace).await.unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &namespace);
    let three = serde_json::json!({"spec": {"replicas": 3}});
    gateways.patch("gateway", &PatchParams::default(), &Patch::Merge(&three)).await.unwrap();

    // The key is served everywhere, and its status shows the limit.
    let keys: Api<ApiKey> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let status = keys.get("limited").await.unwrap().status.unwrap_or_default();
        let programmed = condition_true(&status.conditions, "Programmed");
        if programmed && status.limits.as_ref().and_then(|l| l.requests_per_minute) == Some(60) {
            break;
        }
        assert!(Instant::now() < deadline, "the limited key was never programmed: {status:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let pods = wait_pods_ready(&client, &namespace, "app.kubernetes.io/instance=gateway", 3, Duration::from_secs(120))
        .await
        .unwrap();
    let ips: Vec<String> = pods.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();
    // Every pod counts the three (their heartbeats).
    for ip in &ips {
        while metric_sample(&format!("http://{ip}:9090/metrics"), "waycast_gateway_rate_limit_pods ").await != Some(3.0)
        {
            assert!(Instant::now() < deadline, "pod {ip} never counted three pods");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &namespace);
    let key_of = async |name: &str| {
        String::from_utf8(secrets.get(name).await.unwrap().data.unwrap()["api-key"].0.clone()).unwrap()
    };
    let key = key_of("limited-key").await;
    let urls: Vec<String> = ips.iter().map(|ip| format!("http://{ip}:8080/v1/chat/completions")).collect();
    // Every pod serves the model: the key's Programmed can come from the
    // pods that existed when it was applied, before the new ones have
    // their config. Asked with the quickstart's own key, so the limited
    // key's buckets stay full.
    let alice = key_of("alice-key").await;
    for url in &urls {
        while status_of(url, &alice).await != Some(http::StatusCode::OK) {
            assert!(Instant::now() < deadline, "{url} never served the model");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // Six requests a second spread evenly over the pods, for 50 s: each
    // pod's bucket (20) drains in ~12 s; from then on the three together
    // admit one a second.
    let started = Instant::now();
    let mut next = started;
    let (mut early, mut steady, mut refused) = (0, 0, 0);
    let mut turn = 0;
    while started.elapsed() < Duration::from_secs(50) {
        let status = status_of(&urls[turn % urls.len()], &key).await;
        turn += 1;
        match status {
            Some(http::StatusCode::OK) if started.elapsed() < Duration::from_secs(20) => early += 1,
            Some(http::StatusCode::OK) => steady += 1,
            Some(http::StatusCode::TOO_MANY_REQUESTS) => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
        next += Duration::from_millis(166);
        tokio::time::sleep_until(next.into()).await;
    }
    println!("60/min over 3 pods: {early} admitted in the first 20 s, {steady} in the next 30 s, {refused} refused");
    assert!((27..=33).contains(&steady), "30 s at 60/min over three pods: {steady} (±10 %)");
    assert!((60..=86).contains(&early), "the three buckets (60) plus refill: {early}");
    assert!(refused > 150);
}
