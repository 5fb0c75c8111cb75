//! An autoscaling Gateway under load: the HPA scales the gateway Deployment
//! up on real CPU metrics, the operator leaves the replica count to it, and
//! the new pods serve the current config (their heartbeats say so).
//! Its own cluster: the load would skew other tests' timings.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::BodyExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::harness::{condition_true, operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::wait::{Seen, await_condition, holds_for, within};
use waycast_mock::fixtures as fixture;

#[tokio::test]
async fn the_hpa_scales_gateway_pods_and_the_operator_does_not_fight_it() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "hpa").await.unwrap();
    let mut objects = waycast_e2e::workloads::quickstart().unwrap();
    // The quickstart's Gateway, autoscaled, with a small CPU request so the
    // load below is well over the target.
    let autoscaled = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"}, "spec": {
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targetCPUUtilizationPercentage": 50},
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}});
    objects.retain(|o| o.types.as_ref().is_none_or(|t| t.kind != "Gateway"));
    objects.push(serde_json::from_value(autoscaled).unwrap());
    manifest::apply_all(&client, &objects, &namespace).await.unwrap();

    let keys: Api<ApiKey> = Api::namespaced(client.clone(), &namespace);
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &namespace);
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(200));
    let (key, address) = await_condition("the autoscaled quickstart is ready", patience, async || {
        let programmed =
            keys.get("alice").await.unwrap().status.is_some_and(|s| condition_true(&s.conditions, "Programmed"));
        let address = gateways.get("gateway").await.unwrap().status.and_then(|s| s.address);
        let (true, Some(address)) = (programmed, address) else { return None };
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &namespace)
            .get("alice-key")
            .await
            .unwrap();
        Some((String::from_utf8(secret.data.unwrap()["api-key"].0.clone()).unwrap(), address))
    })
    .await
    .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..6 {
        let (stop, key, url) = (stop.clone(), key.clone(), format!("http://{address}/v1/chat/completions"));
        workers.push(tokio::spawn(async move {
            let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
            while !stop.load(Ordering::Relaxed) {
                let request = fixture::post_request(
                    &url,
                    Some(&key),
                    r#"{"model":"llama3","messages":[{"role":"user","content":"load"}]}"#,
                );
                match http.request(request).await {
                    Ok(response) => drop(response.into_body().collect().await),
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let replicas = async || deployments.get("gateway").await.unwrap().spec.unwrap().replicas.unwrap_or(0);
    let patience = within(Duration::from_secs(180)).every(Duration::from_millis(500));
    let mut seen = await_condition("the HPA scales the gateway up under load", patience, async || {
        let replicas = replicas().await;
        (replicas > 1).then_some(replicas)
    })
    .await
    .unwrap();
    // The operator reconciles on every heartbeat change and resync; the
    // HPA's count must survive those.
    holds_for("the replica count stays above 1", Duration::from_secs(10), Duration::from_millis(500), async || {
        let replicas = replicas().await;
        seen = seen.max(replicas);
        Seen::when(replicas > 1, format_args!("{replicas} replicas"))
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    // Every pod, the new ones included, reports the current config.
    let hash = gateways.get("gateway").await.unwrap().status.unwrap().config_hash.unwrap();
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(200));
    await_condition("every pod reports the current config", patience, async || {
        let leases = Api::<Lease>::namespaced(client.clone(), &namespace)
            .list(&ListParams::default().labels("waycast.dev/gateway=gateway"))
            .await
            .unwrap();
        let reporting: Vec<String> =
            leases.items.iter().filter_map(|l| l.spec.as_ref()?.holder_identity.clone()).collect();
        Seen::when(reporting.len() >= 2 && reporting.iter().all(|h| *h == hash), reporting)
    })
    .await
    .unwrap();
    eprintln!("the HPA scaled the gateway to {seen} replicas under load");
}
