//! A Gateway shared by teams on the e2e node, its limits counted in a real
//! Redis (Debian's, on the node's bridge): the platform's cap for a team
//! holds across the team's keys and the gateway pods; a key asking for a
//! class its team may not use is refused with `ClassNotAllowed`; a key's
//! `maxConcurrent` holds across the pods, and the places a killed pod held
//! come back within seconds.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest::{self, object};
use waycast_e2e::redis::HostRedis;
use waycast_e2e::wait::{Patience, await_condition, await_condition_of, condition, within};
use waycast_e2e::workloads::{deploy_mock, wait_pods_ready};
use waycast_mock::fixtures as fixture;

const CHAT: &str = r#"{"model":"shared-llm","messages":[{"role":"user","content":"hi"}]}"#;

async fn status_of(ip: &str, key: &str, delay_ms: u64) -> Option<StatusCode> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut request = fixture::post_request(&format!("http://{ip}:8080/v1/chat/completions"), Some(key), CHAT);
    request.headers_mut().insert("x-mock-delay-ms", delay_ms.to_string().parse().unwrap());
    let response = tokio::time::timeout(Duration::from_secs(120), http.request(request)).await.ok()?.ok()?;
    Some(response.status())
}

async fn key_text(client: &kube::Client, namespace: &str, name: &str) -> String {
    waycast_e2e::workloads::generated_key(client, namespace, name, Duration::from_secs(60)).await.unwrap()
}

#[tokio::test]
async fn a_shared_gateway_caps_teams_refuses_classes_and_gives_back_a_killed_pods_places() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, "sharing").await.unwrap();
    let team_a = test_namespace(&client, "team-a").await.unwrap();
    let team_b = test_namespace(&client, "team-b").await.unwrap();
    let redis = HostRedis::start(waycast_e2e::node::bridge_address()).unwrap();
    deploy_mock(&client, &home).await.unwrap();
    let parent = json!([{"name": "gateway", "namespace": home}]);
    let gateway = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 2, "apiKeys": {"namespaces": {"from": "All"}},
                 "rateLimit": {"redis": {"address": redis.address, "timeout": "500ms"}},
                 "tenants": [{"namespaces": {"from": "Selector", "selector": {"matchLabels": {"kubernetes.io/metadata.name": team_a}}},
                              "classes": ["batch"], "limits": {"requestsPerMinute": 6}}]}}),
    );
    let model = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "shared-llm"},
        "spec": {"model": "shared-llm", "backends": [{"service": {"name": "mock", "port": 8000}}],
                 "forwardHeaders": ["x-mock-*"], "apiKeys": {"namespaces": {"from": "All"}}}}),
    );
    manifest::apply_all(&client, &[gateway, model], &home).await.unwrap();
    let key = |name: &str, spec: serde_json::Value| {
        let mut spec = spec;
        spec["parentRefs"] = parent.clone();
        object(
            json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": name}, "spec": spec}),
        )
    };
    let team_a_keys = [
        key("one", json!({})),
        key("two", json!({})),
        key("three", json!({})),
        key("pushy", json!({"class": "interactive"})),
    ];
    manifest::apply_all(&client, &team_a_keys, &team_a).await.unwrap();
    manifest::apply_all(&client, &[key("held", json!({"limits": {"maxConcurrent": 2}}))], &team_b).await.unwrap();

    // Every key is served everywhere but the one asking for a class its
    // team may not use, which says why.
    let programmed = Patience::by(Instant::now() + Duration::from_secs(180)).every(Duration::from_millis(250));
    for (namespace, name) in [(&team_a, "one"), (&team_a, "two"), (&team_a, "three"), (&team_b, "held")] {
        await_condition_of::<ApiKey>(&client, namespace, name, &condition("Programmed"), programmed).await.unwrap();
    }
    let pushy = Api::<ApiKey>::namespaced(client.clone(), &team_a).get("pushy").await.unwrap().status.unwrap();
    let ready = pushy.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ClassNotAllowed"), "{ready:?}");
    assert!(ready.message.contains("\"interactive\""), "{}", ready.message);
    let status = Api::<Gateway>::namespaced(client.clone(), &home).get("gateway").await.unwrap().status.unwrap();
    assert_eq!(status.tenants.len(), 1);
    assert_eq!(status.tenants[0].namespaces, std::slice::from_ref(&team_a), "the policy shows what it matched");

    let pods = wait_pods_ready(&client, &home, "app.kubernetes.io/instance=gateway", 2, Duration::from_secs(120))
        .await
        .unwrap();
    let ips: Vec<String> = pods.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();
    let texts = [
        key_text(&client, &team_a, "one").await,
        key_text(&client, &team_a, "two").await,
        key_text(&client, &team_a, "three").await,
    ];
    assert_eq!(status_of(&ips[0], &key_text(&client, &team_a, "pushy").await, 0).await, Some(StatusCode::UNAUTHORIZED));

    // The team's 6 a minute, over three keys and two pods: 6, not 36.
    let started = Instant::now();
    let mut admitted = 0;
    for round in 0..12 {
        match status_of(&ips[round % 2], &texts[round % 3], 0).await {
            Some(StatusCode::OK) => admitted += 1,
            Some(StatusCode::TOO_MANY_REQUESTS) => {}
            other => panic!("round {round}: {other:?}"),
        }
    }
    // The bucket refills one every 10 s.
    let refilled = (started.elapsed().as_secs() / 10) as usize;
    assert!((6..=6 + refilled + 1).contains(&admitted), "{admitted} admitted of 12 in {:?}", started.elapsed());

    // Two held on one pod; the third, on the other, is refused.
    let held = key_text(&client, &team_b, "held").await;
    let long: Vec<_> = (0..2)
        .map(|_| {
            let (ip, key) = (ips[0].clone(), held.clone());
            tokio::spawn(async move { status_of(&ip, &key, 60_000).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(long.iter().all(|request| !request.is_finished()), "both long requests are in flight");
    assert_eq!(status_of(&ips[1], &held, 0).await, Some(StatusCode::TOO_MANY_REQUESTS), "2 across the pods");

    // The pod holding them is killed: its places come back once its
    // liveness key in Redis expires, with nothing released by it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &home);
    let holder = pods_named_by_ip(&pods, &ips[0]).await;
    pods.delete(&holder, &DeleteParams::default().grace_period(0)).await.unwrap();
    let killed = Instant::now();
    let patience = within(Duration::from_secs(40)).every(Duration::from_millis(500));
    await_condition("a killed pod's places come back", patience, async || match status_of(&ips[1], &held, 0).await {
        Some(StatusCode::OK) => true,
        Some(StatusCode::TOO_MANY_REQUESTS) => false,
        other => panic!("{other:?}"),
    })
    .await
    .unwrap();
    let back = killed.elapsed();
    println!("a killed gateway pod's places came back after {back:?}");
    for request in long {
        request.abort();
    }
}

async fn pods_named_by_ip(pods: &Api<Pod>, ip: &str) -> String {
    let list = pods.list(&kube::api::ListParams::default().labels("app.kubernetes.io/instance=gateway")).await.unwrap();
    list.items
        .into_iter()
        .find(|pod| pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(ip))
        .and_then(|pod| pod.metadata.name)
        .unwrap()
}
