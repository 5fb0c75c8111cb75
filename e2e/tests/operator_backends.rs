//! A Service backend's pods under faults, on a real node (issue 17): a pod
//! that answers 503 while it stays ready is ejected and no client request
//! fails; mended, it serves again once its ejection ends; a model fails over
//! to its `url` backend (priority 1) when its Service has no pod left and
//! comes back when one returns; and a backend served over TLS by a private
//! CA, requiring a client certificate, is reached through its pod addresses
//! while an ApiKey-holder without the certificate's trust gets a 502.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use waycast_e2e::cluster::images;
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::wait::{
    Patience, Seen, await_condition, await_object, await_object_condition, condition, holds_for, within,
};
use waycast_e2e::workloads::{
    apply_values, cluster_ip, deployment, metric_sample, pod_logs, service, wait_endpoints, wait_pods_ready,
};
use waycast_mock::fixtures::{self as fixture, temp_dir};
use waycast_mock::pki::{Authority, Usage};
use waycast_mock::upstream::POD_HEADER;

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

/// One chat for `model`: its status and the pod that served it.
async fn chat(http: &Http, url: &str, key: &str, model: &str) -> (StatusCode, String) {
    let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
    let response =
        tokio::time::timeout(Duration::from_secs(10), http.request(fixture::post_request(url, Some(key), &body)))
            .await
            .unwrap_or_else(|_| panic!("{model}: no answer within 10 s"))
            .unwrap_or_else(|error| panic!("{model}: {error}"));
    let pod = response.headers().get(POD_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    (response.status(), pod)
}

/// Breaks (503) or mends (0) one mock pod from outside.
async fn force_status(pod_ip: &str, status: u16) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let request = http::Request::put(format!("http://{pod_ip}:8000/_mock/status/{status}"))
        .body(http_body_util::Empty::new())
        .unwrap();
    assert_eq!(http.request(request).await.unwrap().status(), StatusCode::OK);
}

async fn wait_programmed(client: &kube::Client, namespace: &str, names: &[&str]) {
    let models: Api<waycast_crds::ModelEndpoint> = Api::namespaced(client.clone(), namespace);
    let patience = Patience::by(Instant::now() + Duration::from_secs(120)).every(Duration::from_millis(200));
    for name in names {
        await_object_condition(&models, name, &condition("Programmed"), patience).await.unwrap();
    }
}

fn labelled_secret(name: &str, type_: &str, data: Value, credential: bool) -> Value {
    let labels = if credential { json!({"waycast.dev/credential": "true"}) } else { json!({}) };
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels}, "type": type_, "stringData": data})
}

#[tokio::test]
async fn a_services_pods_are_ejected_recover_fail_over_and_speak_tls() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "backends").await.unwrap();

    // The quickstart with two inference pods and one gateway pod (whose
    // metrics are then the whole story), plus a fallback server and a TLS one.
    let mut objects = waycast_e2e::workloads::quickstart().unwrap();
    for object in &mut objects {
        match object.types.as_ref().map(|t| t.kind.as_str()) {
            Some("Deployment") => object.data["spec"]["replicas"] = json!(2),
            Some("Gateway") => object.data["spec"]["replicas"] = json!(1),
            _ => {}
        }
    }
    manifest::apply_all(&client, &objects, &namespace).await.unwrap();

    let dir = temp_dir("e2e-backend-tls");
    let authority = Authority::generate(&dir, "models-ca").unwrap();
    let tls_host = format!("vllm-tls.{namespace}.svc");
    let serving =
        authority.issue(&dir, "serving", "vllm-tls", &[], std::slice::from_ref(&tls_host), Usage::Server).unwrap();
    let client_cert = authority.issue(&dir, "gateway", "gateway", &[], &[], Usage::Client).unwrap();
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap();
    let ca = read(&authority.files.cert);
    let mut tls_server = deployment(
        "vllm-tls",
        images::MOCK_UPSTREAM,
        &[
            "--listen",
            "0.0.0.0:8443",
            "--tls-cert",
            "/tls/tls.crt",
            "--tls-key",
            "/tls/tls.key",
            "--tls-client-ca",
            "/tls/ca.crt",
        ],
        8443,
        json!({"volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}]}),
    );
    tls_server["spec"]["template"]["spec"]["volumes"] =
        json!([{"name": "tls", "secret": {"secretName": "vllm-tls-serving"}}]);
    apply_values(
        &client,
        &namespace,
        vec![
            labelled_secret(
                "vllm-tls-serving",
                "Opaque",
                json!({"tls.crt": read(&serving.cert), "tls.key": read(&serving.key), "ca.crt": ca}),
                false,
            ),
            labelled_secret("models-ca", "Opaque", json!({"ca.crt": ca}), true),
            labelled_secret(
                "gateway-client",
                "kubernetes.io/tls",
                json!({"tls.crt": read(&client_cert.cert), "tls.key": read(&client_cert.key)}),
                true,
            ),
            tls_server,
            service("vllm-tls", 8443, 8443),
            deployment("fallback", images::MOCK_UPSTREAM, &["--listen", "0.0.0.0:8000"], 8000, json!({})),
            service("fallback", 8000, 8000),
        ],
    )
    .await
    .unwrap();
    let fallback_ip = cluster_ip(&client, &namespace, "fallback").await.unwrap();
    // A url backend to a ClusterIP: the platform team opens that address.
    waycast_e2e::workloads::open_egress(&client, &namespace, "gateway", &[&fallback_ip]).await.unwrap();
    let model = |name: &str, backends: Value| {
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": name},
               "spec": {"model": name, "backends": backends}})
    };
    let tls_backend = |client_cert: bool| {
        let mut tls = json!({"caSecretRef": {"name": "models-ca", "key": "ca.crt"}});
        if client_cert {
            tls["clientCertSecretRef"] = json!({"name": "gateway-client"});
        }
        json!([{"service": {"name": "vllm-tls", "port": 8443}, "tls": tls}])
    };
    apply_values(
        &client,
        &namespace,
        vec![
            model(
                "failover",
                json!([{"service": {"name": "vllm", "port": 8000}},
                       {"url": format!("http://{fallback_ip}:8000/v1"), "priority": 1}]),
            ),
            model("secure", tls_backend(true)),
            model("secure-anonymous", tls_backend(false)),
            json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "ops"}, "spec": {}}),
        ],
    )
    .await
    .unwrap();
    wait_programmed(&client, &namespace, &["llama-3-1-8b", "failover", "secure", "secure-anonymous"]).await;
    let inference =
        wait_pods_ready(&client, &namespace, "app.kubernetes.io/name=vllm", 2, Duration::from_secs(120)).await.unwrap();
    wait_pods_ready(&client, &namespace, "app=vllm-tls", 1, Duration::from_secs(90)).await.unwrap();
    wait_endpoints(&client, &namespace, &format!("{namespace}/vllm:8000"), 2, Duration::from_secs(30)).await.unwrap();
    wait_endpoints(&client, &namespace, &format!("{namespace}/vllm-tls:8443"), 1, Duration::from_secs(30))
        .await
        .unwrap();
    let gateway =
        wait_pods_ready(&client, &namespace, "app.kubernetes.io/instance=gateway", 1, Duration::from_secs(90))
            .await
            .unwrap();
    let gateway_ip = gateway[0].status.as_ref().unwrap().pod_ip.clone().unwrap();
    let url = format!("http://{gateway_ip}:8080/v1/chat/completions");
    let admin = format!("http://{gateway_ip}:9090/metrics");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &namespace);
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(200));
    let key = await_object(&secrets, "ops-key", "the ops key is generated", patience, |secret| {
        secret.data.as_ref().map(|data| String::from_utf8(data["api-key"].0.clone()).unwrap())
    })
    .await
    .unwrap();
    let http: Http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let served = Patience::by(Instant::now() + Duration::from_secs(60)).every(Duration::from_millis(200));
    for name in ["llama3", "failover", "secure"] {
        await_condition(format!("{name} is served"), served, async || {
            let (status, pod) = chat(&http, &url, &key, name).await;
            Seen::when(status == StatusCode::OK, format_args!("{status} from {pod:?}"))
        })
        .await
        .unwrap();
    }

    // Ejection: one pod answers 503 to everything while it stays ready.
    let pod_name = |pod: &k8s_openapi::api::core::v1::Pod| pod.metadata.name.clone().unwrap();
    let (broken, healthy) = (&inference[0], &inference[1]);
    let broken_ip = broken.status.as_ref().unwrap().pod_ip.clone().unwrap();
    force_status(&broken_ip, 503).await;
    let retries = r#"waycast_gateway_upstream_retries_total{model="llama-3.1-8b",reason="status_503"}"#;
    let ejections = r#"waycast_gateway_endpoint_ejections_total{model="llama-3.1-8b"}"#;
    let (retries_before, ejections_before) =
        (metric_sample(&admin, retries).await.unwrap_or(0.0), metric_sample(&admin, ejections).await.unwrap_or(0.0));
    for turn in 0..100 {
        let (status, pod) = chat(&http, &url, &key, "llama3").await;
        assert_eq!(status, StatusCode::OK, "request {turn} failed while a pod answered 503");
        assert!(pod.starts_with(&pod_name(healthy)), "request {turn} served by {pod}");
    }
    let retried = metric_sample(&admin, retries).await.unwrap_or(0.0) - retries_before;
    let ejected = metric_sample(&admin, ejections).await.unwrap_or(0.0) - ejections_before;
    println!("one pod answering 503: 100/100 served by the other; {retried} retries, {ejected} ejections");
    assert!(ejected >= 1.0, "the broken pod was never ejected");
    assert!((5.0..=20.0).contains(&retried), "five 503s in a row eject it; {retried} retries");

    // Recovery: mended, it serves again once its ejection (5 s) ends.
    force_status(&broken_ip, 0).await;
    let mended = Instant::now();
    let patience = within(Duration::from_secs(15)).every(Duration::from_millis(50));
    await_condition("the mended pod serves again", patience, async || {
        let (status, pod) = chat(&http, &url, &key, "llama3").await;
        assert_eq!(status, StatusCode::OK);
        pod.starts_with(&pod_name(broken))
    })
    .await
    .unwrap();
    println!("the mended pod served again {:?} after it was mended", mended.elapsed());

    // TLS with a private CA and a client certificate, to the pod address
    // under the Service's DNS name; without the certificate: refused.
    let (status, pod) = chat(&http, &url, &key, "secure").await;
    if (status, pod.starts_with("vllm-tls-")) != (StatusCode::OK, true) {
        // Once seen in CI (a 502 after the ejection phase), not reproduced:
        // what the gateway and the TLS pod said is the lead.
        let gateway = pod_logs(&client, &namespace, "app.kubernetes.io/instance=gateway", 60).await;
        let upstream = pod_logs(&client, &namespace, "app=vllm-tls", 30).await;
        panic!("secure: {status}, served by {pod:?}\n{gateway}\n{upstream}");
    }
    let (status, _) = chat(&http, &url, &key, "secure-anonymous").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "a TLS server requiring a client certificate served without one");

    // Priority failover: no pod left, the url backend serves; none lost.
    let (status, pod) = chat(&http, &url, &key, "failover").await;
    assert_eq!((status, pod.starts_with("vllm-")), (StatusCode::OK, true), "served by {pod}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let scale = |replicas: u32| json!({"spec": {"replicas": replicas}});
    deployments.patch("vllm", &PatchParams::default(), &Patch::Merge(scale(0))).await.unwrap();
    let scaled = Instant::now();
    let every_50_ms = Duration::from_millis(50);
    let failover = async || {
        let (status, pod) = chat(&http, &url, &key, "failover").await;
        assert_eq!(status, StatusCode::OK, "a request failed while the Service's pods went away");
        pod
    };
    await_condition("the url backend serves", within(Duration::from_secs(60)).every(every_50_ms), async || {
        failover().await.starts_with("fallback-")
    })
    .await
    .unwrap();
    let failed_over = scaled.elapsed();
    // And for 3 s more, none is lost.
    holds_for("requests are served", Duration::from_secs(3), every_50_ms, async || {
        failover().await;
        true
    })
    .await
    .unwrap();
    wait_endpoints(&client, &namespace, &format!("{namespace}/vllm:8000"), 0, Duration::from_secs(60)).await.unwrap();
    for _ in 0..20 {
        let (status, pod) = chat(&http, &url, &key, "failover").await;
        assert_eq!((status, pod.starts_with("fallback-")), (StatusCode::OK, true), "served by {pod}");
    }
    // A pod back: the first tier takes the traffic again.
    deployments.patch("vllm", &PatchParams::default(), &Patch::Merge(scale(1))).await.unwrap();
    let restored = Instant::now();
    await_condition("the Service's new pod takes the traffic back", within(Duration::from_secs(90)), async || {
        let (status, pod) = chat(&http, &url, &key, "failover").await;
        assert_eq!(status, StatusCode::OK);
        pod.starts_with("vllm-")
    })
    .await
    .unwrap();
    println!(
        "scale 2 → 0: the url backend served from {failed_over:?}; scale 0 → 1: the Service served again after {:?}",
        restored.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
