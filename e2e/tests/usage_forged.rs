//! A Gateway whose pod forges its usage reports, on the e2e node: its
//! `spec.image` is the mock image, which as a gateway pod answers the
//! operator's `GET /usage` in turn with another team's key at a cost of
//! 9e18, the Gateway's own key listed 1,100,000 times (~33 MB), and a
//! report padded past 16 MiB (`waycast_mock::forged_usage`). The operator
//! refuses each whole (`ForeignKey`, `TooManyKeys`, `ReportTooLarge`, shown
//! on that Gateway and in Events), the other team's `status.usage` stays
//! what its own Gateway reported, the operator's memory (it runs in this
//! process) stays bounded, and the other team's key is still revoked in
//! under a second.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::cluster::images;
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::memory::{RssSampler, status_mib};
use waycast_e2e::wait::{Seen, await_condition, await_object, await_object_condition, condition, within};
use waycast_e2e::workloads::{deploy_mock, wait_pods_ready};
use waycast_mock::fixtures as fixture;

const CHAT: &str = r#"{"model":"llm","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;

fn object(value: Value) -> kube::api::DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// The status of one chat through the pod at `ip` with `key`.
async fn chat(ip: &str, key: &str) -> StatusCode {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = fixture::post_request(&format!("http://{ip}:8080/v1/chat/completions"), Some(key), CHAT);
    tokio::time::timeout(Duration::from_secs(10), http.request(request)).await.unwrap().unwrap().status()
}

#[tokio::test]
async fn a_gateways_forged_usage_reports_are_refused_and_change_no_other_teams_status() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let forged = test_namespace(&client, "forged").await.unwrap();
    // The forged pod names `<its namespace>-victim/victim`.
    let team = format!("{forged}-victim");
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(team.clone()),
            labels: Some([("waycast.dev/e2e".to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();

    // The other team: its own Gateway, model and key.
    deploy_mock(&client, &team).await.unwrap();
    let own_gateway = object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway",
        "metadata": {"name": "gateway"}, "spec": {"replicas": 1}}));
    let model =
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "llm"},
        "spec": {"model": "llm", "backends": [{"service": {"name": "mock", "port": 8000}}]}}));
    let victim = object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "victim"},
        "spec": {}}));
    manifest::apply_all(&client, &[own_gateway, model, victim], &team).await.unwrap();
    // The forging Gateway: its author's image, and a key of its own.
    let forging =
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "forged"},
        "spec": {"replicas": 1, "image": images::MOCK_UPSTREAM}}));
    let own = object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "own"},
        "spec": {}}));
    manifest::apply_all(&client, &[forging, own], &forged).await.unwrap();

    let keys: Api<ApiKey> = Api::namespaced(client.clone(), &team);
    let patience = within(Duration::from_secs(180)).every(Duration::from_millis(250));
    await_object_condition(&keys, "victim", &condition("Programmed"), patience).await.unwrap();
    let pods = wait_pods_ready(&client, &team, "app.kubernetes.io/instance=gateway", 1, Duration::from_secs(120))
        .await
        .unwrap();
    let ip = pods[0].status.as_ref().unwrap().pod_ip.clone().unwrap();
    let text = waycast_e2e::workloads::generated_key(&client, &team, "victim", Duration::from_secs(60)).await.unwrap();
    assert_eq!(chat(&ip, &text).await, StatusCode::OK);
    // Its own Gateway's report reaches its status: one request.
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(250));
    let genuine = await_object(&keys, "victim", "its usage is collected", patience, |key| {
        key.status.as_ref().and_then(|s| s.usage.clone()).filter(|u| u.requests == 1)
    })
    .await
    .unwrap();

    // The forged pod runs and is asked; every kind of forgery is refused.
    let baseline = status_mib(std::process::id(), "VmRSS:");
    let sampler = RssSampler::start(std::process::id());
    let from = Instant::now();
    wait_pods_ready(&client, &forged, "app.kubernetes.io/instance=forged", 1, Duration::from_secs(120)).await.unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &forged);
    let wanted: BTreeSet<&str> = ["ForeignKey", "TooManyKeys", "ReportTooLarge"].into();
    let mut seen = BTreeSet::new();
    let patience = within(Duration::from_secs(90)).every(Duration::from_millis(200));
    await_condition(format!("refusals {wanted:?}"), patience, async || {
        let status = gateways.get("forged").await.unwrap().status.unwrap_or_default();
        if let Some(usage) = status.usage {
            assert!(usage.namespaces.is_empty(), "a refused report was counted: {usage:?}");
            for refused in usage.refused_reports {
                assert!(!refused.message.contains("victim"), "a message names another team's key: {refused:?}");
                seen.insert(refused.reason);
            }
        }
        let now = keys.get("victim").await.unwrap().status.unwrap_or_default().usage.unwrap();
        assert_eq!((now.requests, &now.cost), (genuine.requests, &genuine.cost), "the forged report was written");
        Seen::when(wanted.iter().all(|reason| seen.contains(*reason)), &seen)
    })
    .await
    .unwrap();
    let samples = sampler.finish();
    let (peak, _) = samples.peak_and_last(from, Instant::now());
    println!(
        "refused {seen:?} in {:?}; this process (the operator in it) {baseline:.1} MiB before, peak {peak:.1} MiB",
        from.elapsed()
    );
    assert!(peak - baseline < 64.0, "the operator grew {:.1} MiB on forged reports", peak - baseline);
    let events: Api<Event> = Api::namespaced(client.clone(), &forged);
    let listed = events.list(&ListParams::default()).await.unwrap();
    assert!(
        listed.items.iter().any(|e| e.reason.as_deref() == Some("UsageReportRefused")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("forged")),
        "no UsageReportRefused Event on the forged Gateway"
    );

    // The other team's revocations still work, in under a second.
    let patch = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "spec": {"disabled": true}});
    let revoked = Instant::now();
    keys.patch("victim", &PatchParams::apply("e2e-user").force(), &Patch::Apply(patch)).await.unwrap();
    let patience = within(Duration::from_secs(10)).every(Duration::from_millis(10));
    await_condition("the key is revoked", patience, async || {
        let status = chat(&ip, &text).await;
        Seen::when(status == StatusCode::UNAUTHORIZED, status)
    })
    .await
    .unwrap();
    let took = revoked.elapsed();
    println!("revoked the other team's key in {took:?} while the forged pod was being refused");
    assert!(took < Duration::from_secs(1), "revocation took {took:?}");
    let now = keys.get("victim").await.unwrap().status.unwrap_or_default().usage.unwrap();
    assert_eq!((now.requests, &now.cost), (genuine.requests, &genuine.cost));
}
