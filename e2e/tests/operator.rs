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
use waycast_e2e::manifest::{self, object};
use waycast_e2e::wait::{
    ConditionIs, Namespaced, Patience, Seen, await_absent, await_answer, await_condition, await_condition_of,
    await_object, await_object_condition, condition, within,
};
use waycast_e2e::workloads::{wait_endpoints, wait_pods_ready};
use waycast_mock::fixtures as fixture;

fn cluster() -> &'static SharedCluster {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    waycast_e2e::harness::operator_in_process(cluster);
    cluster
}

/// How long the operator may take to show a change in a status, under the
/// load of this binary's tests running side by side.
const OPERATOR_PACE: Duration = Duration::from_secs(90);

/// Waits until the `K` `namespace/name` holds `wanted`, at the operator's pace.
async fn wait_for<K: Namespaced>(client: &Client, namespace: &str, name: &str, wanted: ConditionIs) {
    await_condition_of::<K>(client, namespace, name, &wanted, within(OPERATOR_PACE)).await.unwrap();
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
    waycast_e2e::chat::status(url, key, "llama3").await
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

/// Waits until every pod answers `wanted` to `key` for llama3, looking
/// every 10 ms; how long that took (apply → effect).
async fn wait_all(urls: &[String], key: &str, wanted: StatusCode, timeout: Duration) -> Duration {
    let started = Instant::now();
    let patience = within(timeout).every(Duration::from_millis(10));
    await_answer(urls, key, "llama3", wanted, patience).await.unwrap();
    started.elapsed()
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
    wait_for::<Gateway>(&client, &namespace, "gateway", condition("Ready").because("ReplicasReady")).await;
    wait_for::<ApiKey>(&client, &namespace, "alice", condition("Ready").because("KeyReady")).await;
    wait_for::<ModelEndpoint>(&client, &namespace, "llama-3-1-8b", condition("Accepted").because("Accepted")).await;
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
    let programmed = condition("Programmed").at_generation(patched.metadata.generation);
    let patience = within(Duration::from_secs(30)).every(Duration::from_millis(20));
    await_object_condition(&keys, "bob", &programmed, patience).await.unwrap();
    for url in &urls {
        assert_eq!(
            status_of(url, &bob_key).await,
            Some(StatusCode::UNAUTHORIZED),
            "{url} still accepts a disabled key"
        );
    }
    let gateways = Api::<Gateway>::namespaced(client.clone(), &namespace);
    let patience = within(Duration::from_secs(10)).every(Duration::from_millis(50));
    await_object(&gateways, "gateway", "status shows 2 pods on the current config", patience, |gateway| {
        let up_to_date = gateway.status.as_ref().and_then(|s| s.up_to_date_replicas);
        Seen::when(up_to_date == Some(2), up_to_date)
    })
    .await
    .unwrap();

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
    let collected = Patience::by(Instant::now() + Duration::from_secs(60)).every(Duration::from_millis(200));
    let secrets = Api::<Secret>::namespaced(client.clone(), &namespace);
    await_absent(&Api::<Deployment>::namespaced(client.clone(), &namespace), "gateway", collected).await.unwrap();
    // The manifest Secret and the parts it named.
    await_absent(&secrets, "gateway-config", collected).await.unwrap();
    await_absent(&secrets, "gateway-config-base", collected).await.unwrap();
    await_absent(&Api::<Service>::namespaced(client.clone(), &namespace), "gateway", collected).await.unwrap();
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
    wait_for::<Gateway>(&client, &namespace, "gateway", condition("Ready").because("ReplicasReady")).await;
    for key in ["alice", "bob"] {
        wait_for::<ApiKey>(&client, &namespace, key, condition("Ready").because("KeyReady")).await;
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
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(200));
    let second = await_object(&secrets, "alice-key", "a new key is generated", patience, |secret| {
        let text = secret.data.as_ref().and_then(|d| d.get("api-key")).map(|b| b.0.clone());
        text.filter(|text| text != first.as_bytes()).map(|text| String::from_utf8(text).unwrap())
    })
    .await
    .unwrap();
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
    let patience = within(served).every(Duration::from_millis(200));
    await_condition("the upstream gets the new credential", patience, async || {
        for url in &urls {
            assert_eq!(status_of(url, &second).await, Some(StatusCode::OK));
        }
        let seen = credentials_seen().await;
        let last = &seen[seen.len().saturating_sub(urls.len())..];
        Seen::when(last.iter().all(|c| c == "Bearer second-credential"), last)
    })
    .await
    .unwrap();

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
    wait_for::<ModelEndpoint>(&client, &namespace, "llama-3-1-8b", condition("Accepted").because("Accepted")).await;
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
    wait_for::<ModelEndpoint>(
        &client,
        &namespace,
        "llama-copy",
        condition("Accepted").is("False").because("ModelNameConflict"),
    )
    .await;
    wait_for::<ModelEndpoint>(
        &client,
        &namespace,
        "missing-backend",
        condition("ResolvedRefs").is("False").because("BackendNotFound"),
    )
    .await;
    wait_for::<ApiKey>(&client, &namespace, "short", condition("Ready").is("False").because("KeyTooShort")).await;
    // The team that lost the conflict also sees it in Events.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &namespace);
    await_condition("a ModelNameConflict Event for llama-copy", within(Duration::from_secs(10)), async || {
        events.list(&ListParams::default()).await.unwrap().items.iter().any(|event| {
            event.reason.as_deref() == Some("ModelNameConflict")
                && event.type_.as_deref() == Some("Warning")
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("llama-copy")
        })
    })
    .await
    .unwrap();
    wait_for::<ApiKey>(&client, &namespace, "alice", condition("Ready").because("KeyReady")).await;
    wait_for::<Gateway>(&client, &namespace, "gateway", condition("Ready").because("ReplicasReady")).await;
    let key = generated_key(&client, &namespace, "alice").await;
    let urls = pod_urls(&client, &namespace).await;
    wait_all(&urls, &key, StatusCode::OK, Duration::from_secs(30)).await;

    // The winner goes; the other claim takes over.
    Api::<ModelEndpoint>::namespaced(client.clone(), &namespace)
        .delete("llama-3-1-8b", &DeleteParams::default())
        .await
        .unwrap();
    wait_for::<ModelEndpoint>(&client, &namespace, "llama-copy", condition("Accepted").because("Accepted")).await;
    wait_all(&urls, &key, StatusCode::OK, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_rolling_update_under_load_fails_no_request_and_autoscaling_prunes_cleanly() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "operator-rollout").await.unwrap();
    apply_file(&client, &namespace, "examples/quickstart/quickstart.yaml").await;
    wait_for::<Gateway>(&client, &namespace, "gateway", condition("Ready").because("ReplicasReady")).await;
    wait_for::<ApiKey>(&client, &namespace, "alice", condition("Programmed").because("Programmed")).await;
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
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(250));
    await_object(&deployments, "gateway", "the rollout finishes", patience, |deployment| {
        let generation = deployment.metadata.generation;
        let status = deployment.status.clone().unwrap_or_default();
        let rolled = status.observed_generation == generation
            && status.updated_replicas == Some(2)
            && status.ready_replicas == Some(2)
            && status.replicas == Some(2);
        let requests = deployment.spec.clone().unwrap().template.spec.unwrap().containers[0].resources.clone();
        Seen::when(rolled && requests.is_some_and(|r| r.requests.is_some()), status)
    })
    .await
    .unwrap();
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
    let patience = within(Duration::from_secs(30)).every(Duration::from_millis(200));
    await_object(&hpas, "gateway", "an HPA for an autoscaling Gateway", patience, |_| true).await.unwrap();
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
    // The HPA is pruned when autoscaling is removed.
    await_absent(&hpas, "gateway", patience).await.unwrap();
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
    wait_for::<ApiKey>(&client, &team, "alice", condition("Programmed").because("Programmed")).await;
    wait_for::<ModelEndpoint>(&client, &team, "llama-3-1-8b", condition("Programmed").because("Programmed")).await;
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
    wait_for::<ApiKey>(&client, &namespace, "alice", condition("Programmed").because("Programmed")).await;
    wait_for::<ModelEndpoint>(&client, &namespace, "llama-headless", condition("Programmed").because("Programmed"))
        .await;
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
    // The ConfigMap lists 2; each gateway pod applies it when its copy
    // changes (a moment later): from then on only the remaining pods serve.
    let applied_by = Instant::now() + Duration::from_secs(10);
    let mut after = served_by("llama3", 60).await;
    while after.len() != 2 && Instant::now() < applied_by {
        after = served_by("llama3", 60).await;
    }
    assert_eq!(after.len(), 2, "only the remaining pods serve: {after:?}");
}
