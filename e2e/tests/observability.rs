//! The chart's dashboards and alerts against a real Prometheus (built from
//! the Go module proxy, `e2e/scripts/build-prometheus.sh`) scraping the
//! node's pods: the operator installed by the chart, a Gateway's pod and
//! the mock inference pods behind it. After a load that touches every
//! panel — streams, a priced model, a key spending its budget, a model
//! whose endpoints refuse connections (errors, ejections), a full model
//! whose queue times out, telemetry to a collector that is not there —
//! every panel's query and every alert's probe evaluates without error
//! and returns data, every alert expression evaluates, and Prometheus
//! loads the rendered rules. A renamed metric fails here.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use waycast_crds::ApiKey;
use waycast_e2e::cluster::images;
use waycast_e2e::harness::{shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest::{self, object};
use waycast_e2e::wait::{Patience, Seen, await_condition, await_object_condition, condition, within};
use waycast_e2e::workloads::{
    apply_values, deployment, generated_key, metric_sample, repository_root, service, wait_endpoints, wait_pods_ready,
};
use waycast_mock::fixtures as fixture;

const RELEASE_NAMESPACE: &str = "waycast-system";

fn ip(pod: &Pod) -> String {
    pod.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

fn built(script: &str) -> PathBuf {
    let output = Command::new("bash").arg(repository_root().join(script)).output().expect("bash runs");
    assert!(output.status.success(), "{script} failed: {}", String::from_utf8_lossy(&output.stderr));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// A Prometheus server on loopback, scraping static targets every second.
struct Prometheus {
    child: Child,
    address: String,
    _dir: tempdir::Dir,
}

mod tempdir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Prometheus {
    fn start(bin: &std::path::Path, jobs: &[(&str, Vec<String>)], rules: &std::path::Path) -> Self {
        let dir = std::env::temp_dir().join(format!("waycast-prometheus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
            rules.display()
        );
        for (job, targets) in jobs {
            let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let address = format!("127.0.0.1:{port}");
        let child = Command::new(bin.join("prometheus"))
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap();
        Self { child, address, _dir: tempdir::Dir(dir) }
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let mut url = format!("http://{}/api/v1/{path}", self.address);
        if !query.is_empty() {
            let encoded: Vec<String> = query.iter().map(|(k, v)| format!("{k}={}", percent_encode(v))).collect();
            url = format!("{url}?{}", encoded.join("&"));
        }
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let request = http::Request::get(url).body(http_body_util::Full::new(bytes::Bytes::new())).unwrap();
        let Ok(response) = http.request(request).await else { return Value::Null };
        let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    }

    async fn query(&self, expr: &str) -> Value {
        self.api("query", &[("query", expr)]).await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn send(url: &str, key: &str, body: &str, headers: &[(&'static str, &str)]) -> http::StatusCode {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut request = fixture::post_request(url, Some(key), body);
    for (name, value) in headers {
        request.headers_mut().insert(*name, value.parse().unwrap());
    }
    let Ok(response) = http.request(request).await else { return http::StatusCode::BAD_GATEWAY };
    let status = response.status();
    let _ = http_body_util::BodyExt::collect(response.into_body()).await;
    status
}

#[tokio::test]
async fn every_dashboard_query_and_alert_returns_data_from_a_real_prometheus() {
    let prometheus_bin = built("e2e/scripts/build-prometheus.sh");
    let helm = built("e2e/scripts/build-helm.sh");
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    let client = cluster.client().await;

    // The operator as the chart installs it (the harness has put the CRDs
    // in: helm leaves existing ones as they are).
    let output = Command::new(&helm)
        .current_dir(repository_root())
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args(["install", "waycast", "charts/waycast", "--namespace", RELEASE_NAMESPACE, "--create-namespace"])
        .args(["--set", "operator.image.tag=dev", "--set", "gatewayImage.tag=dev"])
        .args(["--set", "operator.replicas=1", "--set", "operator.leaderElection=false"])
        .args(["--set", "gatewayNetworkPolicy.enabled=false", "--wait", "--timeout", "3m"])
        .output()
        .unwrap();
    assert!(output.status.success(), "helm install: {}", String::from_utf8_lossy(&output.stderr));
    let operator = wait_pods_ready(
        &client,
        RELEASE_NAMESPACE,
        "app.kubernetes.io/name=waycast-operator",
        1,
        Duration::from_secs(120),
    )
    .await
    .unwrap();

    let namespace = test_namespace(&client, "observed").await.unwrap();
    let mut mock = deployment("mock", images::MOCK_UPSTREAM, &["--listen", "0.0.0.0:8000"], 8000, json!({}));
    mock["spec"]["replicas"] = json!(2);
    // The same pods on a port nothing listens on: every attempt refused.
    let refusing = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "refusing"},
        "spec": {"selector": {"app": "mock"}, "ports": [{"port": 8001, "targetPort": 8001}]}});
    apply_values(&client, &namespace, vec![mock, service("mock", 8000, 8000), refusing]).await.unwrap();
    let nowhere = format!("http://{}:9", waycast_e2e::node::bridge_address());
    let models = [
        json!({"name": "observed-llm", "spec": {"model": "observed-llm",
            "backends": [{"service": {"name": "mock", "port": 8000}}],
            "pricing": {"currency": "USD", "inputPerMillionTokens": "1", "outputPerMillionTokens": "2"}}}),
        json!({"name": "refusing-llm", "spec": {"model": "refusing-llm",
            "backends": [{"service": {"name": "refusing", "port": 8001}}]}}),
        json!({"name": "busy-llm", "spec": {"model": "busy-llm", "forwardHeaders": ["x-mock-*"],
            "backends": [{"service": {"name": "mock", "port": 8000}}], "capacity": {"maxInFlightPerEndpoint": 1}}}),
    ];
    let mut objects = vec![object(json!({
        "apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 1, "telemetry": {"endpoint": nowhere}, "sharing": {"queue": {"maxWait": "1s"}}}
    }))];
    for model in models {
        objects.push(object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint",
            "metadata": {"name": model["name"]}, "spec": model["spec"]})));
    }
    for (name, spec) in [("steady", json!({})), ("thrifty", json!({"budgets": [{"period": "Day", "tokens": 600}]}))] {
        objects.push(object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey",
            "metadata": {"name": name}, "spec": spec})));
    }
    manifest::apply_all(&client, &objects, &namespace).await.unwrap();
    let keys: kube::Api<ApiKey> = kube::Api::namespaced(client.clone(), &namespace);
    let programmed = Patience::by(Instant::now() + Duration::from_secs(180)).every(Duration::from_millis(250));
    for name in ["steady", "thrifty"] {
        await_object_condition(&keys, name, &condition("Programmed"), programmed).await.unwrap();
    }
    let steady = generated_key(&client, &namespace, "steady", Duration::from_secs(60)).await.unwrap();
    let thrifty = generated_key(&client, &namespace, "thrifty", Duration::from_secs(60)).await.unwrap();
    let gateway_pod =
        ip(&wait_pods_ready(&client, &namespace, "app.kubernetes.io/instance=gateway", 1, Duration::from_secs(180))
            .await
            .unwrap()[0]);
    wait_pods_ready(&client, &namespace, "app=mock", 2, Duration::from_secs(180)).await.unwrap();

    let rendered_rules = repository_root().join(waycast_xtask::observability::RULES_FILE);
    let prometheus = Prometheus::start(
        &prometheus_bin,
        &[
            ("waycast-operator", vec![format!("{}:8080", ip(&operator[0]))]),
            ("waycast-gateway", vec![format!("{gateway_pod}:9090")]),
        ],
        &rendered_rules,
    );

    // The load.
    let url = format!("http://{gateway_pod}:8080/v1/chat/completions");
    let chat = |model: &str| {
        format!(
            r#"{{"model":"{model}","stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"what do the dashboards show?"}}]}}"#
        )
    };
    // Each look sends one more request: no pause between them.
    let mut served = 0;
    await_condition(
        "the gateway serves 20 requests",
        within(Duration::from_secs(60)).every(Duration::ZERO),
        async || {
            if send(&url, &steady, &chat("observed-llm"), &[]).await == 200 {
                served += 1;
            }
            Seen::when(served >= 20, format_args!("{served} served"))
        },
    )
    .await
    .unwrap();
    // Refused attempts are retried only on endpoints the gateway has been
    // told of: wait for both, then send until the gateway counts retries.
    let refusing_service = format!("{namespace}/refusing:8001");
    wait_endpoints(&client, &namespace, &refusing_service, 2, Duration::from_secs(60)).await.unwrap();
    let admin = format!("http://{gateway_pod}:9090/metrics");
    let mut refused_sent = 0;
    await_condition("the gateway counts retries", within(Duration::from_secs(60)).every(Duration::ZERO), async || {
        send(&url, &steady, &chat("refusing-llm"), &[]).await;
        refused_sent += 1;
        let retries = metric_sample(&admin, "waycast_gateway_upstream_retries_total{").await;
        Seen::when(
            refused_sent >= 8 && retries.is_some_and(|n| n > 0.0),
            format_args!("{retries:?} after {refused_sent}"),
        )
    })
    .await
    .unwrap();
    // A small reservation each (max_tokens), so the day is spent, not
    // refused at its first request.
    let small = chat("observed-llm").replacen('{', r#"{"max_tokens":16,"#, 1);
    let mut spent = false;
    for _ in 0..200 {
        if send(&url, &thrifty, &small, &[]).await == 429 {
            spent = true;
            break;
        }
    }
    assert!(spent, "thrifty's budget never ran out");
    // Two in flight fill busy-llm's two endpoints; the rest wait past maxWait.
    let slow = [("x-mock-delay-ms", "3000")];
    let waiting: Vec<_> = (0..6)
        .map(|_| {
            let (url, key, body) = (url.clone(), steady.clone(), chat("busy-llm"));
            tokio::spawn(async move { send(&url, &key, &body, &slow).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for wait in waiting {
        statuses.push(wait.await.unwrap());
    }
    assert!(statuses.contains(&http::StatusCode::TOO_MANY_REQUESTS), "no queue timeout: {statuses:?}");

    // Every target up, then a few scrapes after the load.
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(500));
    await_condition("every target is up", patience, async || {
        let targets = prometheus.api("targets", &[]).await;
        let active = targets["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
        Seen::when(active.len() == 2 && active.iter().all(|t| t["health"] == "up"), format_args!("{targets:#}"))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;

    let mut failures = Vec::new();
    let queries = waycast_xtask::observability::queries_for_test();
    for (place, expr) in &queries {
        let answer = prometheus.query(expr).await;
        let results = answer["data"]["result"].as_array().map_or(0, Vec::len);
        if answer["status"] != "success" || results == 0 {
            failures.push(format!("{place}: {expr}\n  -> {answer}"));
        }
    }
    for (name, expr) in waycast_xtask::observability::alert_expressions() {
        let answer = prometheus.query(expr).await;
        if answer["status"] != "success" {
            failures.push(format!("alert {name}: {expr}\n  -> {answer}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} queries failed:\n{}", failures.len(), queries.len(), failures.join("\n"));
    eprintln!("{} panel queries and alert probes returned data", queries.len());

    // Prometheus loaded the rendered rules and evaluates each without error;
    // the budget alert fires for thrifty's spent day.
    let patience = within(Duration::from_secs(30)).every(Duration::from_millis(500));
    await_condition("every rule is healthy and the budget alert fires", patience, async || {
        let rules = prometheus.api("rules", &[]).await;
        let all: Vec<Value> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let healthy =
            all.len() == waycast_xtask::observability::ALERTS.len() && all.iter().all(|r| r["health"] == "ok");
        let budget_firing = all.iter().any(|r| {
            r["name"] == "WaycastBudgetAt80Percent"
                && r["alerts"].as_array().is_some_and(|alerts| {
                    alerts.iter().any(|a| a["labels"]["scope"] == format!("key:{namespace}/thrifty").as_str())
                })
        });
        Seen::when(healthy && budget_firing, format_args!("{rules:#}"))
    })
    .await
    .unwrap();
}
