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
use waycast_e2e::wait::{Patience, Seen, await_answer, await_condition, await_object};
use waycast_e2e::workloads::{metric_sample, wait_pods_ready};

async fn status_of(url: &str, key: &str) -> Option<http::StatusCode> {
    waycast_e2e::chat::status(url, key, "llama3").await
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
    let patience = Patience::by(deadline).every(Duration::from_millis(250));
    await_object(&keys, "limited", "programmed with its limit", patience, |key| {
        let status = key.status.clone().unwrap_or_default();
        let programmed = condition_true(&status.conditions, "Programmed");
        Seen::when(programmed && status.limits.as_ref().and_then(|l| l.requests_per_minute) == Some(60), status)
    })
    .await
    .unwrap();
    let pods = wait_pods_ready(&client, &namespace, "app.kubernetes.io/instance=gateway", 3, Duration::from_secs(120))
        .await
        .unwrap();
    let ips: Vec<String> = pods.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();
    // Every pod counts the three (their heartbeats).
    for ip in &ips {
        await_condition(format!("pod {ip} counts three pods"), patience, async || {
            let counted = metric_sample(&format!("http://{ip}:9090/metrics"), "waycast_gateway_rate_limit_pods ").await;
            Seen::when(counted == Some(3.0), counted)
        })
        .await
        .unwrap();
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
        await_answer(std::slice::from_ref(url), &alice, "llama3", http::StatusCode::OK, patience).await.unwrap();
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
