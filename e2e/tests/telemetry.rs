//! Traces on the e2e node: a Gateway whose `spec.telemetry` names a real
//! OpenTelemetry Collector (built from the Go module proxy, listening on
//! the node's bridge), two mock pods behind a Service, one answering 503.
//! A streamed chat request continuing a client's trace reaches the
//! collector as a server span with the GenAI attributes and the client's
//! trace id; a request retried on the other pod has two attempt spans; the
//! pod that served received the attempt's `traceparent`; each request's
//! usage record arrives as a log record with the request id of its access
//! line.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use waycast_crds::ApiKey;
use waycast_e2e::cluster::images;
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest::{self, object};
use waycast_e2e::wait::{await_condition, await_object_condition, condition, within};
use waycast_e2e::workloads::{apply_values, deployment, generated_key, pod_logs, service, wait_pods_ready};
use waycast_mock::collector::{Collector, attribute};
use waycast_mock::fixtures as fixture;

const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

fn ip(pod: &Pod) -> String {
    pod.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

async fn mock_requests(ip: &str) -> Vec<Value> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::get(format!("http://{ip}:8000/_mock/requests"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = http.request(request).await.unwrap();
    let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
    serde_json::from_slice::<Vec<Value>>(&body).unwrap()
}

#[tokio::test]
async fn a_traced_request_through_a_gateway_pod_reaches_a_real_collector() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let collector = Collector::start(waycast_e2e::node::bridge_address()).unwrap();
    let namespace = test_namespace(&client, "telemetry").await.unwrap();

    let mut mock = deployment("mock", images::MOCK_UPSTREAM, &["--listen", "0.0.0.0:8000"], 8000, json!({}));
    mock["spec"]["replicas"] = json!(2);
    apply_values(&client, &namespace, vec![mock, service("mock", 8000, 8000)]).await.unwrap();
    let gateway = object(json!({
        "apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 1, "telemetry": {"endpoint": collector.endpoint, "resourceAttributes": {"deployment.environment": "e2e"}}}
    }));
    let model = object(json!({
        "apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "traced-llm"},
        "spec": {"model": "traced-llm", "backends": [{"service": {"name": "mock", "port": 8000}}]}
    }));
    let key = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "alice"}, "spec": {}}),
    );
    manifest::apply_all(&client, &[gateway, model, key], &namespace).await.unwrap();
    let keys: kube::Api<ApiKey> = kube::Api::namespaced(client.clone(), &namespace);
    let patience = within(Duration::from_secs(180)).every(Duration::from_millis(250));
    await_object_condition(&keys, "alice", &condition("Programmed"), patience).await.unwrap();
    let text = generated_key(&client, &namespace, "alice", Duration::from_secs(60)).await.unwrap();
    let gateway_ip =
        ip(&wait_pods_ready(&client, &namespace, "app.kubernetes.io/instance=gateway", 1, Duration::from_secs(180))
            .await
            .unwrap()[0]);
    let mocks = wait_pods_ready(&client, &namespace, "app=mock", 2, Duration::from_secs(180)).await.unwrap();
    let (failing, serving) = (ip(&mocks[0]), ip(&mocks[1]));
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let put = http::Request::put(format!("http://{failing}:8000/_mock/status/503"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert!(http.request(put).await.unwrap().status().is_success());

    // Until a request reached the failing pod first (and was retried).
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let body = r#"{"model":"traced-llm","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"where does the time go?"}]}"#;
    let mut request_ids = Vec::new();
    // Each look sends one more request: no pause between them.
    let patience = within(Duration::from_secs(60)).every(Duration::ZERO);
    await_condition("a request reaches the failing pod", patience, async || {
        if mock_requests(&failing).await.iter().any(|r| r["path"] == "/v1/chat/completions") {
            return true;
        }
        let mut request =
            fixture::post_request(&format!("http://{gateway_ip}:8080/v1/chat/completions"), Some(&text), body);
        request.headers_mut().insert("traceparent", traceparent.parse().unwrap());
        let response = http.request(request).await.unwrap();
        // The Service's endpoints reach the gateway after the key: 503 until then.
        let status = response.status();
        let id = response.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_owned());
        http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
        if status == 200 {
            request_ids.push(id.unwrap());
        }
        false
    })
    .await
    .unwrap();
    assert!(!request_ids.is_empty());

    let spans = collector
        .until("traces", "every request's server span and a retried one's two attempts", |spans| {
            let servers = spans.iter().filter(|s| s["kind"] == 2).count();
            let attempts = spans.iter().filter(|s| s["kind"] == 3).count();
            servers >= request_ids.len() && attempts > servers
        })
        .await;
    for span in &spans {
        assert_eq!(span["traceId"], CLIENT_TRACE, "{span:#}");
    }
    let servers: Vec<&Value> = spans.iter().filter(|s| s["kind"] == 2).collect();
    for server in &servers {
        assert_eq!(server["parentSpanId"], CLIENT_SPAN);
        assert_eq!(server["name"], "chat traced-llm", "the Gateway's own model: no namespace");
        assert_eq!(attribute(server, "gen_ai.operation.name").unwrap(), "chat");
        assert_eq!(attribute(server, "gen_ai.request.model").unwrap(), "traced-llm");
        assert_eq!(attribute(server, "waycast.key").unwrap(), format!("{namespace}/alice").as_str());
        assert_eq!(attribute(server, "gen_ai.request.max_tokens").unwrap(), "16");
        assert!(server["events"].as_array().unwrap().iter().any(|e| e["name"] == "gen_ai.first_token"));
    }
    let retried = servers
        .iter()
        .find(|s| spans.iter().filter(|c| c["parentSpanId"] == s["spanId"]).count() == 2)
        .expect("a request with two attempt spans");
    let attempts: Vec<&Value> = spans.iter().filter(|c| c["parentSpanId"] == retried["spanId"]).collect();
    let first =
        attempts.iter().find(|a| attribute(a, "server.address") == Some(&Value::from(failing.as_str()))).unwrap();
    assert_eq!(attribute(first, "http.response.status_code").unwrap(), "503");
    assert!(attribute(first, "waycast.retry_reason").is_some(), "{first:#}");
    let second =
        attempts.iter().find(|a| attribute(a, "server.address") == Some(&Value::from(serving.as_str()))).unwrap();
    assert_eq!(attribute(second, "http.response.status_code").unwrap(), "200");
    let expected = format!("00-{CLIENT_TRACE}-{}-01", second["spanId"].as_str().unwrap());
    let received: Vec<Value> = mock_requests(&serving).await;
    assert!(
        received.iter().any(|r| r["headers"]["traceparent"] == expected.as_str()),
        "the serving pod got no {expected}"
    );

    // The Gateway's resource attributes beside the gateway's own.
    for resource in collector.resources("traces") {
        assert_eq!(attribute(&resource, "deployment.environment").unwrap(), "e2e");
        assert_eq!(attribute(&resource, "service.name").unwrap(), "waycast-gateway");
    }

    // Each request's usage record, with the request id of its access line.
    let records = collector.until("logs", "a usage record per request", |r| r.len() >= request_ids.len()).await;
    let logs = pod_logs(&client, &namespace, "app.kubernetes.io/instance=gateway", 500).await;
    for id in &request_ids {
        let record = records
            .iter()
            .find(|r| attribute(r, "waycast.request_id") == Some(&Value::from(id.as_str())))
            .unwrap_or_else(|| panic!("no usage record of request {id}"));
        // Known by the gateway's own record id, not the request id.
        let body = record["body"]["stringValue"].as_str().unwrap();
        assert!(body.len() == 32 && body.bytes().all(|b| b.is_ascii_hexdigit()), "{record:#}");
        assert_ne!(body, id.as_str());
        assert_eq!(attribute(record, "http.response.status_code").unwrap(), "200");
        assert!(logs.contains(&format!("\"request_id\":\"{id}\"")), "no access line for {id}");
    }
}
