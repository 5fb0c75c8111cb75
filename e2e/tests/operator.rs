//! The operator against the e2e node: Gateways become running gateway pods
//! that serve the quickstart; key changes reach every pod quickly without
//! restarts; conflicts, bad references and deletion behave.
//!
//! The operator runs in this test process (one per test binary); the
//! gateways it creates run as real pods.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use waycast_crds::{ApiKey, Gateway, ModelEndpoint};
use waycast_e2e::harness::{SharedCluster, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::workloads::{wait_endpoints, wait_pods_ready};
use waycast_mock::fixtures as fixture;

fn cluster() -> &'static SharedCluster {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    waycast_e2e::harness::operator_in_process(cluster);
    cluster
}

async fn condition(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
    condition: &str,
) -> Option<(String, String)> {
    let value: serde_json::Value = match kind {
        "Gateway" => {
            serde_json::to_value(Api::<Gateway>::namespaced(client.clone(), namespace).get_opt(name).await.ok()??)
                .ok()?
        }
        "ApiKey" => {
            serde_json::to_value(Api::<ApiKey>::namespaced(client.clone(), namespace).get_opt(name).await.ok()??)
                .ok()?
        }
        _ => {
            serde_json::to_value(Api::<ModelEndpoint>::namespaced(client.clone(), namespace).get_opt(name).await.ok()??)
                .ok()?
        }
    };
    let found = value["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == condition)?.clone();
    Some((found["status"].as_str()?.to_owned(), found["reason"].as_str()?.to_owned()))
}

async fn wait_condition(client: &Client, namespace: &str, kind: &str, name: &str, wanted: (&str, &str, &str)) {
    let (kind_condition, status, reason) = wanted;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = condition(client, namespace, kind, name, kind_condition).await;
        if got.as_ref().is_some_and(|(s, r)| s == status && r == reason) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{kind} {namespace}/{name}: {kind_condition} is {got:?}, wanted {status}/{reason}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn apply_file(client: &Client, namespace: &str, path: &str) {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap();
    manifest::apply_all(client, &manifest::parse_documents(&text).unwrap(), namespace).await.unwrap();
}

async fn generated_key(client: &Client, namespace: &str, name: &str) -> String {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace).get(&format!("{name}-key")).await.unwrap();
    String::from_utf8(secret.data.unwrap()["api-key"].0.clone()).unwrap()
}

async fn status_of(url: &str, key: &str) -> Option<StatusCode> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = fixture::post_request(url, Some(key), r#"{"model":"llama3","messages":[]}"#);
    tokio::time::timeout(Duration::from_secs(2), http.request(request)).await.ok()?.ok().map(|r| r.status())
}

/// Every gateway pod's own URL, so a change can be checked on each pod.
async fn pod_urls(client: &Client, namespace: &str) -> Vec<String> {
    let pods = wait_pods_ready(client, namespace, "app.kubernetes.io/instance=gateway", 2, Duration::from_secs(90))
        .await
        .unwrap();
    pods.iter()
        .map(|p| format!("http://{}:8080/v1/chat/completions", p.status.as_ref().unwrap().pod_ip.as_ref().unwrap()))
        .collect()
}

async fn wait_all(urls: &[String], key: &str, wanted: StatusCode, timeout: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let mut last = None;
        for url in urls {
            let got = status_of(url, key).await;
            if got != Some(wanted) {
                last = Some((url.clone(), got));
                break;
            }
        }
        let Some((url, got)) = last else {
            return started.elapsed();
        };
        assert!(
            started.elapsed() < timeout,
            "not every pod answers {wanted} after {timeout:?}: {url} answered {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

#[tokio::test]
async fn the_quickstart_serves_and_key_changes_reach_every_pod_without_restarts() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "operator-quickstart").await.unwrap();
    apply_file(&client, &namespace, "examples/quickstart/quickstart.yaml").await;
    wait_condition(&client, &namespace, "Gateway", "gateway", ("Ready", "True", "ReplicasReady")).await;
    wait_condition(&client, &namespace, "ApiKey", "alice", ("Ready", "True", "KeyReady")).await;
    wait_condition(&client, &namespace, "ModelEndpoint", "llama-3-1-8b", ("Accepted", "True", "Accepted")).await;
    let key = generated_key(&client, &namespace, "alice").await;
    assert!(key.starts_with("wc_") && key.len() == 46);

    // Through the gateway's Service, a streaming chat reaches the in-cluster backend.
    let service = Api::<Service>::namespaced(client.clone(), &namespace).get("gateway").await.unwrap();
    let url = format!("http://{}/v1/chat/completions", service.spec.unwrap().cluster_ip.unwrap());
    let urls = pod_urls(&client, &namespace).await;
    wait_all(&urls, &key, StatusCode::OK, Duration::from_secs(30)).await;
    // kube-proxy programs a new Service shortly after its pods are ready.
    wait_all(std::slice::from_ref(&url), &key, StatusCode::OK, Duration::from_secs(30)).await;
    let pods_before: Vec<String> = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/instance=gateway"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();

    // Revoke and restore, timing kubectl-apply-to-effect on every pod.
    let keys: Api<ApiKey> = Api::namespaced(client.clone(), &namespace);
    let (mut revoke, mut restore) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let patch = |disabled: bool| json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "spec": {"disabled": disabled, "models": ["llama-*"]}});
        keys.patch("alice", &PatchParams::apply("e2e-user").force(), &Patch::Apply(patch(true))).await.unwrap();
        revoke.push(wait_all(&urls, &key, StatusCode::UNAUTHORIZED, Duration::from_secs(10)).await);
        keys.patch("alice", &PatchParams::apply("e2e-user").force(), &Patch::Apply(patch(false))).await.unwrap();
        restore.push(wait_all(&urls, &key, StatusCode::OK, Duration::from_secs(10)).await);
    }
    revoke.sort();
    restore.sort();
    eprintln!(
        "apply → effect on every pod over 20 trials: revoke p50 {:?} p99 {:?}; restore p50 {:?} p99 {:?}",
        percentile(&revoke, 0.5),
        percentile(&revoke, 0.99),
        percentile(&restore, 0.5),
        percentile(&restore, 0.99)
    );
    assert!(percentile(&revoke, 0.99) < Duration::from_secs(3) && percentile(&restore, 0.99) < Duration::from_secs(3));

    // `kubectl wait --for=condition=Programmed` returns when a new key works
    // on every pod: checked once per pod right after, with no retry.
    let bob = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "bob"}, "spec": {}});
    manifest::apply_all(&client, &[serde_json::from_value(bob).unwrap()], &namespace).await.unwrap();
    let kubectl = waycast_e2e::control_plane::k8s_binary("kubectl").unwrap();
    let waited = std::process::Command::new(&kubectl)
        .args(["wait", "--for=condition=Programmed", "apikey/bob", "-n", &namespace, "--timeout=60s"])
        .env("KUBECONFIG", &cluster().kubeconfig)
        .output()
        .unwrap();
    assert!(waited.status.success(), "kubectl wait: {}", String::from_utf8_lossy(&waited.stderr));
    let bob_key = generated_key(&client, &namespace, "bob").await;
    for url in &urls {
        assert_eq!(
            status_of(url, &bob_key).await,
            Some(StatusCode::OK),
            "{url} did not accept bob right after Programmed"
        );
    }
    // Disabling: Programmed again (for the new generation) means gone everywhere.
    let disable = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "spec": {"disabled": true}});
    let patched = keys.patch("bob", &PatchParams::apply("e2e-user").force(), &Patch::Apply(disable)).await.unwrap();
    let generation = patched.metadata.generation;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current = keys.get("bob").await.unwrap();
        let programmed = current.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Programmed" && c.status == "True" && c.observed_generation == generation)
        });
        if programmed {
            break;
        }
        assert!(Instant::now() < deadline, "bob never became Programmed after being disabled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for url in &urls {
        assert_eq!(
            status_of(url, &bob_key).await,
            Some(StatusCode::UNAUTHORIZED),
            "{url} still accepts a disabled key"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let gateway = Api::<Gateway>::namespaced(client.clone(), &namespace).get("gateway").await.unwrap();
        let up_to_date = gateway.status.and_then(|s| s.up_to_date_replicas);
        if up_to_date == Some(2) {
            break;
        }
        assert!(Instant::now() < deadline, "Gateway status shows {up_to_date:?} pods on the current config, not 2");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Config changes never restarted a pod.
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/instance=gateway"))
        .await
        .unwrap();
    let names: Vec<String> = pods.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, pods_before);
    for pod in &pods.items {
        let restarts: i32 =
            pod.status.as_ref().unwrap().container_statuses.iter().flatten().map(|c| c.restart_count).sum();
        assert_eq!(restarts, 0);
    }

    // Deleting the Gateway collects everything it owned.
    Api::<Gateway>::namespaced(client.clone(), &namespace)
        .delete("gateway", &DeleteParams::foreground())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let deployment = Api::<Deployment>::namespaced(client.clone(), &namespace).get_opt("gateway").await.unwrap();
        // The manifest Secret and the parts it named.
        let config = Api::<Secret>::namespaced(client.clone(), &namespace).get_opt("gateway-config").await.unwrap();
        let base = Api::<Secret>::namespaced(client.clone(), &namespace).get_opt("gateway-config-base").await.unwrap();
        let service = Api::<Service>::namespaced(client.clone(), &namespace).get_opt("gateway").await.unwrap();
        if deployment.is_none() && config.is_none() && base.is_none() && service.is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "owned objects were not garbage-collected");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Rotation, each reaching every pod with no pod restarted: a generated
/// key by deleting its Secret (the operator makes a new one), a team's own
/// key by changing its Secret, an upstream credential by changing its
/// Secret.
#[tokio::test]
async fn keys_and_credentials_rotate_without_a_restart() {
    const OWN_FIRST: &str = "wc_own_key_first_0123456789abcdefghijklmn";
    const OWN_SECOND: &str = "wc_own_key_second_0123456789abcdefghijklm";
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "rotation").await.unwrap();
    apply_file(&client, &namespace, "examples/quickstart/quickstart.yaml").await;
    let objects = [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "upstream",
            "labels": {"waycast.dev/credential": "true"}}, "stringData": {"token": "first-credential"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bob-text",
            "labels": {"waycast.dev/api-key": "true"}}, "stringData": {"key": OWN_FIRST}}),
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "bob"},
            "spec": {"secretRef": {"name": "bob-text", "key": "key"}}}),
    ];
    manifest::apply_all(&client, &objects.map(object), &namespace).await.unwrap();
    let backends = json!({"spec": {"backends": [{"service": {"name": "vllm", "port": 8000},
        "auth": {"secretRef": {"name": "upstream", "key": "token"}}}]}});
    Api::<ModelEndpoint>::namespaced(client.clone(), &namespace)
        .patch("llama-3-1-8b", &PatchParams::default(), &Patch::Merge(backends))
        .await
        .unwrap();
    wait_condition(&client, &namespace, "Gateway", "gateway", ("Ready", "True", "ReplicasReady")).await;
    for key in ["alice", "bob"] {
        wait_condition(&client, &namespace, "ApiKey", key, ("Ready", "True", "KeyReady")).await;
    }
    let urls = pod_urls(&client, &namespace).await;
    let pods_before: Vec<String> = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/instance=gateway"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.uid)
        .collect();
    let first = generated_key(&client, &namespace, "alice").await;
    let served = Duration::from_secs(30);
    wait_all(&urls, &first, StatusCode::OK, served).await;
    wait_all(&urls, OWN_FIRST, StatusCode::OK, served).await;

    // A generated key: its Secret deleted, the operator makes another.
    let secrets = Api::<Secret>::namespaced(client.clone(), &namespace);
    secrets.delete("alice-key", &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let second = loop {
        if let Some(secret) = secrets.get_opt("alice-key").await.unwrap()
            && let Some(text) = secret.data.and_then(|d| d.get("api-key").map(|b| b.0.clone()))
            && text != first.as_bytes()
        {
            break String::from_utf8(text).unwrap();
        }
        assert!(Instant::now() < deadline, "no new key was generated");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    wait_all(&urls, &second, StatusCode::OK, served).await;
    wait_all(&urls, &first, StatusCode::UNAUTHORIZED, served).await;

    // A team's own key: its Secret's text changed.
    let text = json!({"stringData": {"key": OWN_SECOND}});
    secrets.patch("bob-text", &PatchParams::default(), &Patch::Merge(text)).await.unwrap();
    wait_all(&urls, OWN_SECOND, StatusCode::OK, served).await;
    wait_all(&urls, OWN_FIRST, StatusCode::UNAUTHORIZED, served).await;

    // An upstream credential: the upstream is sent the new one.
    let upstream = waycast_e2e::workloads::cluster_ip(&client, &namespace, "vllm").await.unwrap();
    let credentials_seen = || async {
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let uri: http::Uri = format!("http://{upstream}:8000/_mock/requests").parse().unwrap();
        let response = http.get(uri).await.unwrap();
        let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
        let requests: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
        requests.iter().filter_map(|r| r["headers"]["authorization"].as_str().map(str::to_owned)).collect::<Vec<_>>()
    };
    assert!(credentials_seen().await.iter().all(|c| c == "Bearer first-credential"), "{:?}", credentials_seen().await);
    let token = json!({"stringData": {"token": "second-credential"}});
    secrets.patch("upstream", &PatchParams::default(), &Patch::Merge(token)).await.unwrap();
    let deadline = Instant::now() + served;
    'rotated: loop {
        for url in &urls {
            assert_eq!(status_of(url, &second).await, Some(StatusCode::OK));
        }
        if credentials_seen().await.iter().rev().take(urls.len()).all(|c| c == "Bearer second-credential") {
            break 'rotated;
        }
        assert!(Instant::now() < deadline, "the upstream never got the new credential");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let pods_after: Vec<String> = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/instance=gateway"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.uid)
        .collect();
    assert_eq!(pods_before, pods_after, "a gateway pod was restarted");
}

#[tokio::test]
async fn conflicts_and_bad_references_show_in_status_without_disturbing_others() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "operator-conflicts").await.unwrap();
    apply_file(&client, &namespace, "examples/quickstart/quickstart.yaml").await;
    wait_condition(&client, &namespace, "ModelEndpoint", "llama-3-1-8b", ("Accepted", "True", "Accepted")).await;
    let objects = vec![
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "llama-copy"},
               "spec": {"model": "llama-3.1-8b", "aliases": ["llama3"], "backends": [{"service": {"name": "vllm", "port": 8000}}]}}),
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "missing-backend"},
               "spec": {"model": "ghost", "backends": [{"service": {"name": "nowhere", "port": 8000}}]}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "short", "labels": {"waycast.dev/api-key": "true"}},
               "stringData": {"key": "too-short"}}),
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "short"},
               "spec": {"secretRef": {"name": "short", "key": "key"}}}),
    ];
    let objects: Vec<_> = objects.into_iter().map(|v| serde_json::from_value(v).unwrap()).collect();
    manifest::apply_all(&client, &objects, &namespace).await.unwrap();
    wait_condition(&client, &namespace, "ModelEndpoint", "llama-copy", ("Accepted", "False", "ModelNameConflict"))
        .await;
    wait_condition(
        &client,
        &namespace,
        "ModelEndpoint",
        "missing-backend",
        ("ResolvedRefs", "False", "BackendNotFound"),
    )
    .await;
    wait_condition(&client, &namespace, "ApiKey", "short", ("Ready", "False", "KeyTooShort")).await;
    // The team that lost the conflict also sees it in Events.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = events.list(&ListParams::default()).await.unwrap().items.iter().any(|event| {
            event.reason.as_deref() == Some("ModelNameConflict")
                && event.type_.as_deref() == Some("Warning")
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("llama-copy")
        });
        if found {
            break;
        }
        assert!(Instant::now() < deadline, "no ModelNameConflict Event for llama-copy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_condition(&client, &namespace, "ApiKey", "alice", ("Ready", "True", "KeyReady")).await;
    wait_condition(&client, &namespace, "Gateway", "gateway", ("Ready", "True", "ReplicasReady")).await;
    let key = generated_key(&client, &namespace, "alice").await;
    let urls = pod_urls(&client, &namespace).await;
    wait_all(&urls, &key, StatusCode::OK, Duration::from_secs(30)).await;

    // The winner goes; the other claim takes over.
    Api::<ModelEndpoint>::namespaced(client.clone(), &namespace)
        .delete("llama-3-1-8b", &DeleteParams::default())
        .await
        .unwrap();
    wait_condition(&client, &namespace, "ModelEndpoint", "llama-copy", ("Accepted", "True", "Accepted")).await;
    wait_all(&urls, &key, StatusCode::OK, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_rolling_update_under_load_fails_no_request_and_autoscaling_prunes_cleanly() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "operator-rollout").await.unwrap();
    apply_file(&client, &namespace, "examples/quickstart/quickstart.yaml").await;
    wait_condition(&client, &namespace, "Gateway", "gateway", ("Ready", "True", "ReplicasReady")).await;
    wait_condition(&client, &namespace, "ApiKey", "alice", ("Programmed", "True", "Programmed")).await;
    let key = generated_key(&client, &namespace, "alice").await;
    let service = Api::<Service>::namespaced(client.clone(), &namespace).get("gateway").await.unwrap();
    let url = format!("http://{}/v1/chat/completions", service.spec.unwrap().cluster_ip.unwrap());
    wait_all(std::slice::from_ref(&url), &key, StatusCode::OK, Duration::from_secs(30)).await;

    // Steady load through the Service while the Deployment rolls.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, url, key) = (stop.clone(), url.clone(), key.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0_u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match status_of(&url, &key).await {
                    Some(StatusCode::OK) => ok += 1,
                    other => failed.push(other),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (ok, failed)
        })
    };
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &namespace);
    let resources = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway",
        "spec": {"replicas": 2, "resources": {"requests": {"cpu": "20m", "memory": "16Mi"}}}});
    gateways
        .patch("gateway", &PatchParams::apply(manifest::FIELD_MANAGER).force(), &Patch::Apply(resources))
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let deployment = deployments.get("gateway").await.unwrap();
        let generation = deployment.metadata.generation;
        let status = deployment.status.unwrap_or_default();
        let rolled = status.observed_generation == generation
            && status.updated_replicas == Some(2)
            && status.ready_replicas == Some(2)
            && status.replicas == Some(2);
        let requests = deployment.spec.unwrap().template.spec.unwrap().containers[0].resources.clone();
        if rolled && requests.is_some_and(|r| r.requests.is_some()) {
            break;
        }
        assert!(Instant::now() < deadline, "the rollout did not finish");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Let the old pods' drain finish under load too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    assert!(ok > 50, "only {ok} requests ran during the rollout");
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rollout: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );

    // Autoscaling: an HPA appears and the operator leaves replicas alone;
    // removing autoscaling prunes the HPA. (Applied by the manager that
    // applied the quickstart, so dropping `replicas` removes it.)
    let hpas: Api<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler> =
        Api::namespaced(client.clone(), &namespace);
    let autoscaled = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway",
        "spec": {"autoscaling": {"minReplicas": 2, "maxReplicas": 4}, "resources": {"requests": {"cpu": "20m", "memory": "16Mi"}}}});
    gateways
        .patch("gateway", &PatchParams::apply(manifest::FIELD_MANAGER).force(), &Patch::Apply(autoscaled))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while hpas.get_opt("gateway").await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "no HPA for an autoscaling Gateway");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let managers = deployments.get("gateway").await.unwrap().metadata.managed_fields.unwrap_or_default();
    let operator_owns_replicas = managers
        .iter()
        .filter(|m| m.manager.as_deref() == Some("waycast-operator"))
        .any(|m| m.fields_v1.as_ref().is_some_and(|f| f.0.to_string().contains("f:replicas")));
    assert!(!operator_owns_replicas, "with an HPA the operator must not own spec.replicas");
    let fixed = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "spec": {"replicas": 2}});
    gateways
        .patch("gateway", &PatchParams::apply(manifest::FIELD_MANAGER).force(), &Patch::Apply(fixed))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while hpas.get_opt("gateway").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the HPA was not pruned when autoscaling was removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_platform_gateway_serves_team_namespaces_by_label_and_scale_down_drains_streams() {
    let client = cluster().client().await;
    let platform = test_namespace(&client, "platform").await.unwrap();
    let team = test_namespace(&client, "team").await.unwrap();
    let label = format!("waycast.dev/team-of-{platform}");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let labelled = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team, "labels": {label.clone(): "enabled"}}});
    namespaces.patch(&team, &PatchParams::apply(manifest::FIELD_MANAGER), &Patch::Apply(labelled)).await.unwrap();
    // The team publishes a model and a key in its own namespace...
    let mut objects = waycast_e2e::workloads::quickstart().unwrap();
    objects.retain(|o| o.types.as_ref().is_none_or(|t| t.kind != "Gateway"));
    // Two-way consent: the team's objects name the platform's Gateway.
    for object in &mut objects {
        if object.types.as_ref().is_some_and(|t| t.kind == "ApiKey" || t.kind == "ModelEndpoint") {
            object.data["spec"]["parentRefs"] = json!([{"name": "gateway", "namespace": platform}]);
        }
        // The streams below are paced by x-mock-* headers the mock reads.
        if object.types.as_ref().is_some_and(|t| t.kind == "ModelEndpoint") {
            object.data["spec"]["forwardHeaders"] = json!(["x-mock-*"]);
        }
    }
    manifest::apply_all(&client, &objects, &team).await.unwrap();
    // ... and the platform's Gateway selects team namespaces by label.
    let selector = json!({"namespaces": {"from": "Selector", "selector": {"matchLabels": {label.clone(): "enabled"}}}});
    let gateway = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 2, "modelEndpoints": selector, "apiKeys": selector}});
    manifest::apply_all(&client, &[serde_json::from_value(gateway).unwrap()], &platform).await.unwrap();
    wait_condition(&client, &team, "ApiKey", "alice", ("Programmed", "True", "Programmed")).await;
    wait_condition(&client, &team, "ModelEndpoint", "llama-3-1-8b", ("Programmed", "True", "Programmed")).await;
    let key = generated_key(&client, &team, "alice").await;
    let urls = pod_urls(&client, &platform).await;
    wait_all(&urls, &key, StatusCode::OK, Duration::from_secs(30)).await;

    // A stream on every pod, then scale down: the pod that goes drains its
    // stream to the end. The streams (100 chunks, 10 s) outlast the pod's
    // preStop pause (PRE_STOP_SECONDS, 5 s), so SIGTERM reaches the pod
    // mid-stream and only the drain can let the stream finish.
    let mut streams = Vec::new();
    for url in &urls {
        let mut request = fixture::post_request(url, Some(&key), r#"{"model":"llama3","stream":true,"messages":[]}"#);
        request.headers_mut().insert("x-mock-chunks", "100".parse().unwrap());
        request.headers_mut().insert("x-mock-interval-ms", "100".parse().unwrap());
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        streams.push(tokio::spawn(async move {
            let response = http.request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = http_body_util::BodyExt::collect(response.into_body()).await.map(|c| c.to_bytes());
            body.map(|b| String::from_utf8_lossy(&b).into_owned())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let one = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 1, "modelEndpoints": selector, "apiKeys": selector}});
    manifest::apply_all(&client, &[serde_json::from_value(one).unwrap()], &platform).await.unwrap();
    for stream in streams {
        let text = stream.await.unwrap().expect("the stream completed without an error");
        assert!(text.contains("token99") && text.ends_with("data: [DONE]\n\n"), "a stream was cut during scale-down");
    }
    let deployment = Api::<Deployment>::namespaced(client.clone(), &platform).get("gateway").await.unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(1), "the scale-down happened");
}

async fn status_for(url: &str, key: &str, model: &str) -> Option<StatusCode> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = fixture::post_request(url, Some(key), &format!(r#"{{"model":"{model}","messages":[]}}"#));
    tokio::time::timeout(Duration::from_secs(2), http.request(request)).await.ok()?.ok().map(|r| r.status())
}

async fn wait_model_status(urls: &[String], key: &str, model: &str, wanted: StatusCode) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for url in urls {
        loop {
            let got = status_for(url, key, model).await;
            if got == Some(wanted) {
                break;
            }
            assert!(Instant::now() < deadline, "{url}: {model} answered {got:?}, wanted {wanted}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn object(value: serde_json::Value) -> kube::api::DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// The mock pod that answered `key`'s `model` on `url` (a 200 first).
async fn served_by(url: &str, key: &str, model: &str) -> String {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
    let response = http.request(fixture::post_request(url, Some(key), &body)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{model} on {url}");
    response.headers()[waycast_mock::upstream::POD_HEADER].to_str().unwrap().to_owned()
}

/// The tenancy promise on a real cluster: what one team writes cannot
/// freeze, read or redirect what another team gets from a shared Gateway.
#[tokio::test]
async fn tenants_cannot_break_read_or_redirect_each_other() {
    let client = cluster().client().await;
    let home = test_namespace(&client, "home").await.unwrap();
    let team = test_namespace(&client, "tenant").await.unwrap();
    let rogue = test_namespace(&client, "rogue").await.unwrap();
    apply_file(&client, &home, "examples/quickstart/quickstart.yaml").await;
    // The Gateway also takes keys and models from other namespaces (that name it).
    let all = json!({"namespaces": {"from": "All"}});
    let gateway = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 2, "apiKeys": all, "modelEndpoints": all}});
    manifest::apply_all(&client, &[object(gateway)], &home).await.unwrap();
    wait_condition(&client, &home, "ApiKey", "alice", ("Programmed", "True", "Programmed")).await;
    let alice = generated_key(&client, &home, "alice").await;
    let urls = pod_urls(&client, &home).await;
    wait_all(&urls, &alice, StatusCode::OK, Duration::from_secs(30)).await;

    // What the schema can refuse, the API server refuses with the field named.
    let refused = [
        ("zero idle", json!({"timeouts": {"idle": "0s"}}), "must be longer than 0"),
        ("a non-breaking space", json!({"model": "llama\u{a0}4"}), "spec.model"),
        (
            "a Host credential header",
            json!({"backends": [{"url": "https://a.example/v1",
            "auth": {"secretRef": {"name": "x", "key": "k"}, "header": "Host"}}]}),
            "must not be Host",
        ),
        ("a metadata URL", json!({"backends": [{"url": "http://169.254.169.254/latest"}]}), "link-local"),
        (
            "a TLS server name with an empty label",
            json!({"backends": [{"url": "https://a.example/v1", "tls": {"serverName": "a..b"}}]}),
            "serverName",
        ),
        (
            "a TLS server name that is not ASCII",
            json!({"backends": [{"url": "https://a.example/v1", "tls": {"serverName": "ünï.example"}}]}),
            "serverName",
        ),
    ];
    for (what, overrides, expected) in refused {
        let mut spec = json!({"model": "bad", "backends": [{"url": "https://a.example/v1"}]});
        for (field, value) in overrides.as_object().unwrap() {
            spec[field] = value.clone();
        }
        let bad = object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint",
            "metadata": {"name": "bad"}, "spec": spec}));
        let error = manifest::apply_all(&client, &[bad], &home).await.expect_err(what);
        assert!(format!("{error:#}").contains(expected), "{what}: {error:#}");
    }

    // What only the gateway's own check sees (a control character in a
    // credential) is left out on its own, with the field named...
    let credential = |name: &str, value: &str, labelled: bool| {
        let labels = if labelled { json!({"waycast.dev/credential": "true"}) } else { json!({}) };
        object(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels},
            "stringData": {"k": value}}))
    };
    manifest::apply_all(
        &client,
        &[credential("bell", "sk-\u{7}", true), credential("unlabelled", "sk-never-sent", false)],
        &home,
    )
    .await
    .unwrap();
    let vllm = Api::<Service>::namespaced(client.clone(), &home).get("vllm").await.unwrap();
    let vllm_ip = vllm.spec.unwrap().cluster_ip.unwrap();
    // A url backend to a ClusterIP: the platform team opens that address.
    waycast_e2e::workloads::open_egress(&client, &home, "gateway", &[&vllm_ip]).await.unwrap();
    // A CA that does not parse, in a team's labelled Secret: that model is
    // left out, naming the field; nobody else's config stops.
    let bad_ca = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad-ca",
        "labels": {"waycast.dev/credential": "true"}}, "stringData": {"ca.crt": "-----BEGIN CERTIFICATE-----\nnot base64\n"}});
    let poisoned = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "poisoned"},
        "spec": {"model": "poisoned", "parentRefs": [{"name": "gateway", "namespace": home}],
            "backends": [{"url": "https://a.example/v1", "tls": {"caSecretRef": {"name": "bad-ca", "key": "ca.crt"}}}]}});
    manifest::apply_all(&client, &[object(bad_ca), object(poisoned)], &team).await.unwrap();
    let endpoints = [
        json!({"metadata": {"name": "control"}, "spec": {"model": "control", "backends": [{"url": "https://a.example/v1",
            "auth": {"secretRef": {"name": "bell", "key": "k"}}}]}}),
        json!({"metadata": {"name": "unlabelled"}, "spec": {"model": "unlabelled", "backends": [{"url": "https://a.example/v1",
            "auth": {"secretRef": {"name": "unlabelled", "key": "k"}}}]}}),
        // An Azure-style URL with a query: served, the query sent upstream.
        json!({"metadata": {"name": "azure"}, "spec": {"model": "azure-style",
            "backends": [{"url": format!("http://{vllm_ip}:8000/v1?api-version=2024-06-01")}]}}),
    ];
    let endpoints: Vec<_> = endpoints
        .into_iter()
        .map(|mut e| {
            e["apiVersion"] = json!("waycast.dev/v1alpha1");
            e["kind"] = json!("ModelEndpoint");
            object(e)
        })
        .collect();
    manifest::apply_all(&client, &endpoints, &home).await.unwrap();
    wait_condition(&client, &home, "ModelEndpoint", "control", ("Accepted", "False", "Invalid")).await;
    wait_condition(&client, &team, "ModelEndpoint", "poisoned", ("Accepted", "False", "Invalid")).await;
    wait_condition(&client, &home, "ModelEndpoint", "unlabelled", ("ResolvedRefs", "False", "SecretNotLabelled")).await;
    wait_condition(&client, &home, "ModelEndpoint", "azure", ("Programmed", "True", "Programmed")).await;
    // ... while everyone else's changes keep propagating: a disabled key
    // answers 401 and a new key 200 on every pod.
    let bob = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "bob"}, "spec": {}});
    manifest::apply_all(&client, &[object(bob)], &home).await.unwrap();
    Api::<ApiKey>::namespaced(client.clone(), &home)
        .patch("alice", &PatchParams::default(), &Patch::Merge(json!({"spec": {"disabled": true}})))
        .await
        .unwrap();
    wait_condition(&client, &home, "ApiKey", "bob", ("Programmed", "True", "Programmed")).await;
    let bob = generated_key(&client, &home, "bob").await;
    wait_all(&urls, &bob, StatusCode::OK, Duration::from_secs(5)).await;
    // The disable was applied before bob was Programmed: at once.
    wait_all(&urls, &alice, StatusCode::UNAUTHORIZED, Duration::from_secs(2)).await;
    // (alice's allow-list is llama-*; bob may call any model of his namespace.)
    wait_model_status(&urls, &bob, "azure-style", StatusCode::OK).await;
    wait_condition(&client, &home, "Gateway", "gateway", ("Programmed", "True", "ConfigWritten")).await;
    // An unlabelled Secret's value never reaches the config's Secrets.
    let written = waycast_e2e::config_secrets::read_config(&client, &home, "gateway-config").await.unwrap();
    let text = String::from_utf8(written.config.to_canonical_json().unwrap()).unwrap();
    assert!(!text.contains("sk-never-sent") && text.contains("api-version=2024-06-01"), "{text}");

    // A Gateway in another namespace with from: All gets nothing that did
    // not name it, and shows in no one's status.
    let all = json!({"namespaces": {"from": "All"}});
    let grab = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "grab"},
        "spec": {"replicas": 1, "modelEndpoints": all, "apiKeys": all}});
    manifest::apply_all(&client, &[object(grab)], &rogue).await.unwrap();
    wait_condition(&client, &rogue, "Gateway", "grab", ("Programmed", "True", "ConfigWritten")).await;
    let grabbed = Api::<Gateway>::namespaced(client.clone(), &rogue).get("grab").await.unwrap().status.unwrap();
    assert_eq!((grabbed.model_count, grabbed.api_key_count), (Some(0), Some(0)));
    let bob_status = Api::<ApiKey>::namespaced(client.clone(), &home).get("bob").await.unwrap().status.unwrap();
    assert_eq!(bob_status.gateways, [format!("{home}/gateway")]);
    assert!(bob_status.parents.iter().all(|p| !p.gateway.starts_with(&rogue)), "{:?}", bob_status.parents);

    // Another team's key sees only what is shared with it: 404 (as for a
    // model that does not exist), then 200 once the model is shared.
    let carol = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "carol"},
        "spec": {"parentRefs": [{"name": "gateway", "namespace": home}]}});
    manifest::apply_all(&client, &[object(carol)], &team).await.unwrap();
    wait_condition(&client, &team, "ApiKey", "carol", ("Programmed", "True", "Programmed")).await;
    let carol = generated_key(&client, &team, "carol").await;
    wait_model_status(&urls, &carol, "llama3", StatusCode::NOT_FOUND).await;
    Api::<ModelEndpoint>::namespaced(client.clone(), &home)
        .patch(
            "llama-3-1-8b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"apiKeys": {"namespaces": {"from": "All"}}}})),
        )
        .await
        .unwrap();
    wait_model_status(&urls, &carol, "llama3", StatusCode::OK).await;

    // Squatting: the tenant publishes its own `llama3`, shared with every
    // namespace. Keys of other namespaces still get the platform's llama3
    // (its pods answer), and its own keys get its own: a name is its
    // namespace's, and nobody else's prompts reach the squatter.
    let squatter = [
        waycast_e2e::workloads::deployment(
            "squatter",
            waycast_e2e::cluster::images::MOCK_UPSTREAM,
            &["--listen", "0.0.0.0:8000"],
            8000,
            json!({}),
        ),
        waycast_e2e::workloads::service("squatter", 8000, 8000),
    ];
    waycast_e2e::workloads::apply_values(&client, &team, squatter.to_vec()).await.unwrap();
    let squat = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "squat"},
        "spec": {"model": "llama3", "parentRefs": [{"name": "gateway", "namespace": home}],
            "apiKeys": {"namespaces": {"from": "All"}}, "backends": [{"service": {"name": "squatter", "port": 8000}}]}});
    manifest::apply_all(&client, &[object(squat)], &team).await.unwrap();
    wait_condition(&client, &team, "ModelEndpoint", "squat", ("Programmed", "True", "Programmed")).await;
    wait_pods_ready(&client, &team, "app=squatter", 1, Duration::from_secs(90)).await.unwrap();
    let dave = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "dave"},
        "spec": {"parentRefs": [{"name": "gateway", "namespace": home}]}});
    manifest::apply_all(&client, &[object(dave)], &rogue).await.unwrap();
    wait_condition(&client, &rogue, "ApiKey", "dave", ("Programmed", "True", "Programmed")).await;
    let dave = generated_key(&client, &rogue, "dave").await;
    for url in &urls {
        for (who, key, pod_prefix) in [("bob", &bob, "vllm-"), ("dave", &dave, "vllm-"), ("carol", &carol, "squatter-")]
        {
            let pod = served_by(url, key, "llama3").await;
            assert!(pod.starts_with(pod_prefix), "{who}'s llama3 was served by {pod} on {url}");
        }
    }

    // Egress is closed by default: a url backend naming another
    // namespace's Service by its address is not served (the operator sees
    // the literal), and one naming a host that resolves into a closed range
    // (loopback: the pod's own admin port) gets a 502 egress_denied from the
    // pods, which check every address they connect to.
    // (The home gateway's own Service: its vllm's address was opened above.)
    let home_service = Api::<Service>::namespaced(client.clone(), &home).get("gateway").await.unwrap();
    let home_service_ip = home_service.spec.unwrap().cluster_ip.unwrap();
    let reach = |name: &str, url: String| {
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": name},
            "spec": {"model": name, "parentRefs": [{"name": "gateway", "namespace": home}], "backends": [{"url": url}]}}))
    };
    let steal = reach("steal", format!("http://{home_service_ip}:80/v1"));
    let loopback = reach("loopback", "http://localhost:9090".into());
    manifest::apply_all(&client, &[steal, loopback], &team).await.unwrap();
    wait_condition(&client, &team, "ModelEndpoint", "steal", ("Accepted", "False", "NotAllowedByGateway")).await;
    wait_condition(&client, &team, "ModelEndpoint", "loopback", ("Programmed", "True", "Programmed")).await;
    for url in &urls {
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let request = fixture::post_request(url, Some(&carol), r#"{"model":"loopback","messages":[]}"#);
        let response = http.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY, "{url}");
        let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(error["error"]["code"], "egress_denied", "{url}: {error}");
    }

    // A forged heartbeat — a Lease labelled for the Gateway, naming no live
    // pod of it, claiming a refusal — changes neither Programmed nor the
    // pods' count of their fleet (each shares the rate limits by it).
    let hash = waycast_e2e::config_secrets::read_config(&client, &home, "gateway-config").await.unwrap().hash;
    // A MicroTime: the API server parses exactly six fractional digits.
    let renewed = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let forged = object(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "forged-pod", "labels": {"waycast.dev/gateway": "gateway"},
            "annotations": {"waycast.dev/refused-config-hash": hash, "waycast.dev/refused-config-reason": "forged"}},
        "spec": {"holderIdentity": "0123456789abcdef", "renewTime": renewed, "leaseDurationSeconds": 3600}}));
    // A second one is a live pod's own, but of a pod outside the Gateway
    // (the mock upstream's): named after it, with it as owner.
    let pods = Api::<Pod>::namespaced(client.clone(), &home).list(&ListParams::default()).await.unwrap();
    let stranger = pods
        .items
        .iter()
        .find(|pod| !pod.metadata.name.as_deref().unwrap_or_default().starts_with("gateway-"))
        .expect("the quickstart's upstream pod");
    let (stranger_name, stranger_uid) =
        (stranger.metadata.name.clone().unwrap(), stranger.metadata.uid.clone().unwrap());
    let owned = object(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": stranger_name, "labels": {"waycast.dev/gateway": "gateway"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": stranger_name, "uid": stranger_uid}],
            "annotations": {"waycast.dev/config-hash": hash}},
        "spec": {"holderIdentity": "0123456789abcdef", "renewTime": renewed, "leaseDurationSeconds": 3600}}));
    manifest::apply_all(&client, &[forged, owned], &home).await.unwrap();
    // Positive signals first: each pod logged that it did not count either
    // Lease, and a change made after them was programmed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = waycast_e2e::workloads::pod_logs(&client, &home, "app.kubernetes.io/instance=gateway", 200).await;
        if logs.matches("no live pod's own is not counted").count() >= 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the gateway pods never looked at the forged Lease:\n{logs}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let eve = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "eve"}, "spec": {}});
    manifest::apply_all(&client, &[object(eve)], &home).await.unwrap();
    wait_condition(&client, &home, "ApiKey", "eve", ("Programmed", "True", "Programmed")).await;
    wait_condition(&client, &home, "Gateway", "gateway", ("Programmed", "True", "ConfigWritten")).await;
    let status = Api::<Gateway>::namespaced(client.clone(), &home).get("gateway").await.unwrap().status.unwrap();
    assert_eq!(status.up_to_date_replicas, Some(2), "{status:?}");
    for url in &urls {
        let admin = url.replace(":8080/v1/chat/completions", ":9090/metrics");
        let pods = waycast_e2e::workloads::metric_sample(&admin, "waycast_gateway_rate_limit_pods").await;
        assert_eq!(pods, Some(2.0), "{admin}: the forged Lease changed the fleet count");
    }
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), &home);
    for name in ["forged-pod", stranger_name.as_str()] {
        leases.delete(name, &DeleteParams::default()).await.unwrap();
    }

    // A pod that really refuses the written config says so in its own
    // heartbeat, and the Gateway stops claiming "written": here the
    // platform's Redis CA does not parse, which only the pods find out.
    let redis_ca = object(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-ca"},
        "stringData": {"ca.crt": "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"}}));
    manifest::apply_all(&client, &[redis_ca], &home).await.unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &home);
    let redis = json!({"spec": {"rateLimit": {"redis": {"address": "redis.invalid:6379",
        "tls": {"caSecretRef": {"name": "redis-ca", "key": "ca.crt"}}}}}});
    gateways.patch("gateway", &PatchParams::default(), &Patch::Merge(redis)).await.unwrap();
    wait_condition(&client, &home, "Gateway", "gateway", ("Programmed", "False", "ConfigRefused")).await;
    let refused = gateways.get("gateway").await.unwrap().status.unwrap();
    let message = &refused.conditions.iter().find(|c| c.type_ == "Programmed").unwrap().message;
    assert!(message.contains("redis") && !message.contains("forged"), "{message}");
    gateways
        .patch("gateway", &PatchParams::default(), &Patch::Merge(json!({"spec": {"rateLimit": null}})))
        .await
        .unwrap();
    wait_condition(&client, &home, "Gateway", "gateway", ("Programmed", "True", "ConfigWritten")).await;

    // No takeover: a Gateway named like an existing ServiceAccount leaves it
    // alone and says so; deleting the Gateway does not collect it.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &home);
    let account = object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "taken"}}));
    manifest::apply_all(&client, &[account], &home).await.unwrap();
    let taken =
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "taken"}, "spec": {}});
    manifest::apply_all(&client, &[object(taken)], &home).await.unwrap();
    wait_condition(&client, &home, "Gateway", "taken", ("Accepted", "False", "NameConflict")).await;
    assert!(accounts.get("taken").await.unwrap().metadata.owner_references.is_none());
    assert!(Api::<Deployment>::namespaced(client.clone(), &home).get_opt("taken").await.unwrap().is_none());
    // A canary the Gateway does own: once the garbage collector has taken
    // it, the Gateway's deletion has been acted on.
    let taken_uid = Api::<Gateway>::namespaced(client.clone(), &home).get("taken").await.unwrap().metadata.uid.unwrap();
    let canary = object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken-canary",
        "ownerReferences": [{"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "name": "taken", "uid": taken_uid}]}}));
    manifest::apply_all(&client, &[canary], &home).await.unwrap();
    Api::<Gateway>::namespaced(client.clone(), &home).delete("taken", &DeleteParams::default()).await.unwrap();
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &home);
    let deadline = Instant::now() + Duration::from_secs(60);
    while maps.get_opt("taken-canary").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the garbage collector never acted on the Gateway's deletion");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(accounts.get_opt("taken").await.unwrap().is_some(), "the ServiceAccount survived its namesake");
}

/// The gateway picks the inference pod itself (issue 17): a Service
/// backend resolves to its ready endpoints, relayed by the operator in the
/// Gateway's endpoints ConfigMap; requests spread over every pod (not per
/// kube-proxy connection), a headless Service works, and a pod that goes
/// away leaves the ConfigMap and gets nothing more, with no request lost.
#[tokio::test]
async fn the_gateway_spreads_requests_over_the_services_pods_and_follows_them() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "endpoints").await.unwrap();
    let mut objects = waycast_e2e::workloads::quickstart().unwrap();
    for object in &mut objects {
        if object.types.as_ref().is_some_and(|t| t.kind == "Deployment") {
            object.data["spec"]["replicas"] = json!(3);
        }
    }
    // The same pods behind a headless Service, as a second model.
    let headless = [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "vllm-headless"},
               "spec": {"clusterIP": "None", "selector": {"app.kubernetes.io/name": "vllm"},
                        "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}}),
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "llama-headless"},
               "spec": {"model": "llama-headless", "backends": [{"service": {"name": "vllm-headless", "port": 8000}}]}}),
    ];
    objects.extend(headless.into_iter().map(|value| serde_json::from_value(value).unwrap()));
    manifest::apply_all(&client, &objects, &namespace).await.unwrap();
    wait_condition(&client, &namespace, "ApiKey", "alice", ("Programmed", "True", "Programmed")).await;
    wait_condition(&client, &namespace, "ModelEndpoint", "llama-headless", ("Programmed", "True", "Programmed")).await;
    wait_pods_ready(&client, &namespace, "app.kubernetes.io/name=vllm", 3, Duration::from_secs(90)).await.unwrap();
    let key = generated_key(&client, &namespace, "alice").await;
    let service_key = format!("{namespace}/vllm:8000");
    wait_endpoints(&client, &namespace, &service_key, 3, Duration::from_secs(30)).await.unwrap();

    // Through the gateway's Service, on kept-alive connections.
    let gateway_ip = waycast_e2e::workloads::cluster_ip(&client, &namespace, "gateway").await.unwrap();
    let url = format!("http://{gateway_ip}/v1/chat/completions");
    // kube-proxy programs a new Service shortly after its pods are ready;
    // until then its ClusterIP refuses connections.
    wait_all(std::slice::from_ref(&url), &key, StatusCode::OK, Duration::from_secs(30)).await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let served_by = |model: &'static str, count: usize| {
        let (http, url, key) = (http.clone(), url.clone(), key.clone());
        async move {
            let mut pods = std::collections::BTreeMap::<String, usize>::new();
            for _ in 0..count {
                let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
                let response = http.request(fixture::post_request(&url, Some(&key), &body)).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK, "{model}");
                let pod = response.headers()[waycast_mock::upstream::POD_HEADER].to_str().unwrap().to_owned();
                *pods.entry(pod).or_default() += 1;
            }
            pods
        }
    };
    let spread = served_by("llama3", 300).await;
    println!("300 requests over 3 pods: {spread:?}");
    assert_eq!(spread.len(), 3, "every pod served: {spread:?}");
    assert!(spread.values().all(|n| *n >= 60), "each pod near a third: {spread:?}");
    let headless = served_by("llama-headless", 30).await;
    assert!(headless.len() >= 2, "the headless Service's pods share its requests: {headless:?}");

    // A pod goes away: the ConfigMap follows, no request fails, and the pod
    // gets nothing once it is out.
    let scaled = Instant::now();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    deployments.patch("vllm", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}}))).await.unwrap();
    let during = served_by("llama3", 60).await;
    wait_endpoints(&client, &namespace, &service_key, 2, Duration::from_secs(30)).await.unwrap();
    println!("scale 3 → 2: the endpoints ConfigMap listed 2 after {:?}; meanwhile {during:?}", scaled.elapsed());
    let after = served_by("llama3", 60).await;
    assert_eq!(after.len(), 2, "only the remaining pods serve: {after:?}");
}
