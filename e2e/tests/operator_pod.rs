//! The operator as real pods (two replicas, leader election), from its
//! packed image, with the RBAC the project ships (`deploy/operator.yaml`) —
//! proving that RBAC sufficient — serving the quickstart end to end (what
//! `make demo` runs). Gateways keep serving while the operator pods are
//! deleted, and a rescheduled operator takes over; 250 labelled Secrets of
//! 1 MB each leave its memory bounded.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use waycast_crds::ApiKey;
use waycast_e2e::harness::shared_cluster_with_node;
use waycast_e2e::manifest;
use waycast_e2e::wait::{await_object_condition, condition, within};
use waycast_e2e::workloads::{DEMO_NAMESPACE, deploy_demo, wait_pods_ready};
use waycast_mock::fixtures as fixture;

async fn answers(ip: &str, key: &str) -> Option<http::StatusCode> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request =
        fixture::post_request(&format!("http://{ip}/v1/chat/completions"), Some(key), r#"{"model":"llama3"}"#);
    tokio::time::timeout(Duration::from_secs(2), http.request(request)).await.ok()?.ok().map(|r| r.status())
}

#[tokio::test]
async fn the_operator_pods_serve_the_quickstart_with_their_own_rbac_and_survive_deletion() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    let client = cluster.client().await;
    let demo = deploy_demo(&client).await.unwrap();
    assert!(demo.key.starts_with("wc_"));

    // Delete every operator pod: the gateways keep serving their config.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "waycast-system");
    let selector = ListParams::default().labels("app.kubernetes.io/name=waycast-operator");
    pods.delete_collection(&DeleteParams::default(), &selector).await.unwrap();
    for _ in 0..20 {
        assert_eq!(
            answers(&demo.gateway_ip, &demo.key).await,
            Some(http::StatusCode::OK),
            "gateways must not need the operator"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The rescheduled operator takes over (after the old leader's Lease
    // expires) and serves a new key.
    wait_pods_ready(&client, "waycast-system", "app.kubernetes.io/name=waycast-operator", 2, Duration::from_secs(120))
        .await
        .unwrap();
    let carol = serde_json::json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "carol"}, "spec": {}});
    manifest::apply_all(&client, &[serde_json::from_value(carol).unwrap()], DEMO_NAMESPACE).await.unwrap();
    let keys: Api<ApiKey> = Api::namespaced(client.clone(), DEMO_NAMESPACE);
    // An operator replica took over.
    let patience = within(Duration::from_secs(90)).every(Duration::from_millis(200));
    await_object_condition(&keys, "carol", &condition("Programmed"), patience).await.unwrap();
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), DEMO_NAMESPACE)
        .get("carol-key")
        .await
        .unwrap();
    let carol_key = String::from_utf8(secret.data.unwrap()["api-key"].0.clone()).unwrap();
    assert_eq!(answers(&demo.gateway_ip, &carol_key).await, Some(http::StatusCode::OK));

    // The leader's metrics show the config it wrote reaching every pod.
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let mut measured = false;
    for pod in pods.list(&selector).await.unwrap().items {
        let Some(ip) = pod.status.and_then(|s| s.pod_ip) else { continue };
        let Ok(response) = http.get(format!("http://{ip}:8080/metrics").parse().unwrap()).await else { continue };
        let text =
            String::from_utf8_lossy(&http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes())
                .into_owned();
        let count = text
            .lines()
            .find_map(|l| l.strip_prefix("waycast_operator_propagation_seconds_count "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        measured |= count.is_some_and(|c| c >= 1.0) && text.contains("waycast_operator_config_writes_total{gateway=");
    }
    assert!(measured, "no operator replica measured a config reaching every pod");

    // Anyone who may create Secrets can label many large ones: 250 labelled
    // Secrets of 1 MB each. The operator watches their metadata only and
    // reads the data of a referenced one once (too large: refused by
    // name), so its memory stays bounded and it keeps reconciling.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), DEMO_NAMESPACE);
    let payload = k8s_openapi::ByteString(vec![b'x'; 1_000_000]);
    let flood = futures_util::stream::iter(0..250).map(|index| {
        let secrets = secrets.clone();
        let payload = payload.clone();
        async move {
            let label = if index % 2 == 0 { "waycast.dev/api-key" } else { "waycast.dev/credential" };
            let secret = k8s_openapi::api::core::v1::Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(format!("flood-{index}")),
                    labels: Some([(label.to_owned(), "true".to_owned())].into()),
                    ..Default::default()
                },
                data: Some([("api-key".to_owned(), payload)].into()),
                ..Default::default()
            };
            secrets.create(&kube::api::PostParams::default(), &secret).await.map(drop)
        }
    });
    let created: Vec<Result<(), kube::Error>> = flood.buffer_unordered(8).collect().await;
    assert!(created.iter().all(Result::is_ok), "{:?}", created.iter().find(|r| r.is_err()));
    let flooded = serde_json::json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "flooded"},
        "spec": {"secretRef": {"name": "flood-0", "key": "api-key"}}});
    manifest::apply_all(&client, &[serde_json::from_value(flooded).unwrap()], DEMO_NAMESPACE).await.unwrap();
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(200));
    let too_large = condition("Ready").is("False").because("SecretTooLarge");
    await_object_condition(&keys, "flooded", &too_large, patience).await.unwrap();
    let dave = serde_json::json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "dave"}, "spec": {}});
    manifest::apply_all(&client, &[serde_json::from_value(dave).unwrap()], DEMO_NAMESPACE).await.unwrap();
    // The operator keeps reconciling after the flood.
    let patience = within(Duration::from_secs(90)).every(Duration::from_millis(200));
    await_object_condition(&keys, "dave", &condition("Programmed"), patience).await.unwrap();
    let memory = operator_memory();
    println!("operator processes after 250 labelled Secrets of 1 MB (VmRSS, VmHWM in KiB): {memory:?}");
    assert!(!memory.is_empty(), "no operator process found");
    for (rss, peak) in memory {
        assert!(rss < 128 * 1024 && peak < 128 * 1024, "operator RSS {rss} KiB, peak {peak} KiB");
    }
}

/// The resident and peak memory (KiB) of every operator process on this
/// machine: the operator pods' containers are processes here.
fn operator_memory() -> Vec<(u64, u64)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else { continue };
        if cmdline.split(|b| *b == 0).next() != Some(b"/waycast-operator") {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(path.join("status")) else { continue };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        };
        if let (Some(rss), Some(peak)) = (field("VmRSS:"), field("VmHWM:")) {
            found.push((rss, peak));
        }
    }
    found
}
