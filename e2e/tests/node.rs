//! Our binaries as real pods on the e2e node: the mock upstream and a
//! gateway (deployed by hand, with a ServiceAccount that may read only its
//! config Secret) behind Services that route; and an HPA that scales a
//! CPU-burning Deployment on real metrics.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt as _;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;
use serde_json::{Value, json};
use waycast_e2e::cluster::images;
use waycast_e2e::harness::{SharedCluster, shared_cluster_with_node, test_namespace};
use waycast_e2e::wait::{Seen, await_condition, await_object, within};
use waycast_e2e::workloads::{
    apply_values, cluster_ip, deploy_gateway, deploy_mock, deployment, service, wait_pods_ready,
};
use waycast_mock::fixtures::{self as fixture, ALICE_KEY};

fn cluster() -> &'static SharedCluster {
    shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"))
}

#[tokio::test]
async fn the_gateway_pod_routes_to_the_mock_upstream_pod_through_cluster_ips() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "node-routing").await.unwrap();
    let mock_url = deploy_mock(&client, &namespace).await.unwrap();
    let gateway_ip = deploy_gateway(&client, &namespace, &fixture::default_config(&mock_url), 2).await.unwrap();

    let pods = wait_pods_ready(&client, &namespace, "app=gateway", 2, Duration::from_secs(60)).await.unwrap();
    wait_pods_ready(&client, &namespace, "app=mock", 1, Duration::from_secs(60)).await.unwrap();
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        let context = spec.containers[0].security_context.as_ref().unwrap();
        assert_eq!(context.run_as_non_root, Some(true));
        assert_eq!(context.read_only_root_filesystem, Some(true));
        assert!(spec.volumes.iter().flatten().any(|v| v.projected.is_some()), "the ServiceAccount token is mounted");
    }

    // From the host, through the gateway's ClusterIP, to the mock's ClusterIP.
    let url = format!("http://{gateway_ip}/v1/chat/completions");
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    // kube-proxy programs a new Service within about a second: poll.
    let what = format!("an answer through the gateway's ClusterIP {gateway_ip}");
    let body = await_condition(what, within(Duration::from_secs(30)), async || {
        match http.request(fixture::post_request(&url, Some(ALICE_KEY), r#"{"model":"llama3","messages":[]}"#)).await {
            Ok(response) if response.status() == StatusCode::OK => {
                Seen::Done(response.into_body().collect().await.unwrap().to_bytes())
            }
            other => Seen::NotYet(format!("{:?}", other.map(|response| response.status()))),
        }
    })
    .await
    .unwrap();
    let value: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(value["object"], "chat.completion");
    assert_eq!(value["model"], "meta-llama/Llama-3.1-8B-Instruct", "the mock pod saw the rewritten model");
    let refused = http.request(fixture::post_request(&url, Some("wc_wrong"), r#"{"model":"llama3"}"#)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_hpa_scales_a_cpu_burning_deployment_on_real_metrics() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "node-hpa").await.unwrap();
    let burner = deployment(
        "burner",
        images::MOCK_UPSTREAM,
        &["--listen", "0.0.0.0:8000", "--burn-ms", "20"],
        8000,
        json!({"resources": {"requests": {"cpu": "50m"}, "limits": {"cpu": "500m"}}}),
    );
    let hpa = json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "burner"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "burner"},
            "minReplicas": 1, "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
            "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 5}]}},
        },
    });
    apply_values(&client, &namespace, vec![burner, service("burner", 8000, 8000), hpa]).await.unwrap();
    wait_pods_ready(&client, &namespace, "app=burner", 1, Duration::from_secs(60)).await.unwrap();
    let url = format!("http://{}:8000/v1/embeddings", cluster_ip(&client, &namespace, "burner").await.unwrap());

    // Load from the host: a few workers, bounded in time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let stop = stop.clone();
        let url = url.clone();
        workers.push(tokio::spawn(async move {
            let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let request = fixture::post_request(&url, None, r#"{"model":"m","input":"x"}"#);
                if let Ok(response) = http.request(request).await {
                    let _ = response.into_body().collect().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &namespace);
    let patience = within(Duration::from_secs(150)).every(Duration::from_secs(1));
    let scaled = await_object(&hpas, "burner", "scales up under load", patience, |hpa| {
        let status = hpa.status.clone().unwrap_or_default();
        let active = status.conditions.iter().flatten().any(|c| c.type_ == "ScalingActive" && c.status == "True");
        if active && status.desired_replicas > 1 {
            return Seen::Done(status.desired_replicas);
        }
        Seen::NotYet(format!(
            "desired {} current {:?} conditions {:?}",
            status.desired_replicas, status.current_replicas, status.conditions
        ))
    })
    .await;
    // The load stops whatever the outcome, then the outcome is told.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    assert!(scaled.unwrap() > 1);
}
