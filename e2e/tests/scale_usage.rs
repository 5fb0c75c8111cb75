//! Usage at scale (`make bench-scale`; ignored by `make test`): 10,000
//! ApiKeys on one Gateway on the e2e node, every key sending a request
//! through the gateway pod, with the release operator as a process
//! (`WAYCAST_OPERATOR_BIN`) collecting the usage. Prints and checks: the
//! API server writes for usage per second (every write of an ApiKey seen
//! by a watch, in 1-s and 10-s windows), the operator's peak RSS, and apply
//! → served for one more key while the usage is being written. Sizes:
//! `WAYCAST_SCALE_KEYS`, `WAYCAST_SCALE_TRIALS`, `WAYCAST_USAGE_WATCH_SECONDS`.

#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on any unexpected error")]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::control_plane::free_port;
use waycast_e2e::harness::{shared_cluster_with_node, test_namespace};
use waycast_e2e::memory::{RssSampler, status_mib};
use waycast_e2e::process::KilledOnDrop;
use waycast_e2e::wait::{Patience, Seen, await_condition};
use waycast_e2e::workloads::{deploy_mock, wait_pods_ready};
use waycast_e2e::workloads::{env_number, p99};
use waycast_mock::fixtures as fixture;

async fn chat(ip: &str, key: &str) -> Option<u16> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = fixture::post_request(
        &format!("http://{ip}:8080/v1/chat/completions"),
        Some(key),
        r#"{"model":"usage-llm","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let response = tokio::time::timeout(Duration::from_secs(10), http.request(request)).await.ok()?.ok()?;
    let status = response.status().as_u16();
    http_body_util::BodyExt::collect(response.into_body()).await.ok()?;
    Some(status)
}

#[tokio::test]
#[ignore = "a benchmark: make bench-scale"]
async fn usage_of_ten_thousand_keys_costs_the_api_server_twenty_writes_a_second() {
    let keys = env_number("WAYCAST_SCALE_KEYS", 10_000);
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "scale-usage").await.unwrap();
    deploy_mock(&client, &namespace).await.unwrap();

    let operator_bin = std::env::var_os("WAYCAST_OPERATOR_BIN").map_or_else(
        || std::path::Path::new(env!("CARGO_BIN_EXE_waycast-cluster")).with_file_name("waycast-operator"),
        std::path::PathBuf::from,
    );
    let operator_admin = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST.into()).unwrap()));
    let operator = KilledOnDrop(
        Command::new(operator_bin)
            .args(["--admin-listen", &operator_admin.to_string(), "--log", "warn"])
            .args(["--gateway-image", waycast_e2e::cluster::images::GATEWAY])
            .env("KUBECONFIG", &cluster.kubeconfig)
            // As the chart runs it.
            .env("MIMALLOC_PURGE_DELAY", "0")
            .stdout(std::fs::File::create(std::env::temp_dir().join("waycast-scale-usage-operator.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let post = PostParams::default();
    let gateway: Gateway = serde_json::from_value(json!({
        "apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway",
        "metadata": {"name": "gateway", "namespace": namespace},
        "spec": {"replicas": 1, "budgets": {"currency": "USD"}}
    }))
    .unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &namespace);
    gateways.create(&post, &gateway).await.unwrap();
    let model = serde_json::from_value(json!({
        "apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "usage-llm"},
        "spec": {"model": "usage-llm", "backends": [{"service": {"name": "mock", "port": 8000}}],
                 "pricing": {"currency": "USD", "inputPerMillionTokens": "1", "outputPerMillionTokens": "2"}}
    }))
    .unwrap();
    waycast_e2e::manifest::apply_all(&client, &[model], &namespace).await.unwrap();
    let key_api: Api<ApiKey> = Api::namespaced(client.clone(), &namespace);
    let fleet = waycast_mock::fixtures::fleet::fleet(&namespace, keys, 0, "");
    let started = Instant::now();
    futures_util::stream::iter(fleet.keys.iter())
        .for_each_concurrent(32, |key| {
            let (api, post) = (key_api.clone(), post.clone());
            let mut key = key.clone();
            key.metadata.uid = None;
            key.metadata.generation = None;
            async move { drop(api.create(&post, &key).await.unwrap()) }
        })
        .await;
    println!("created {keys} ApiKeys in {:.1}s", started.elapsed().as_secs_f64());
    let deadline = Instant::now() + Duration::from_secs(900);
    waycast_e2e::workloads::wait_keys_compiled(&gateways, "gateway", keys, deadline).await.unwrap();
    let pod = wait_pods_ready(&client, &namespace, "app.kubernetes.io/instance=gateway", 1, Duration::from_secs(300))
        .await
        .unwrap();
    let ip = pod[0].status.as_ref().unwrap().pod_ip.clone().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut texts = BTreeMap::new();
    // Each look lists every Secret again: no pause between them.
    await_condition("every key Secret", Patience::by(deadline).every(Duration::ZERO), async || {
        for secret in secrets.list(&ListParams::default()).await.unwrap().items {
            let (Some(name), Some(data)) = (secret.metadata.name, secret.data) else { continue };
            if let (Some(key), Some(text)) =
                (name.strip_suffix("-key"), data.get(waycast_crds::api_key::GENERATED_DATA_KEY))
            {
                texts.insert(key.to_owned(), String::from_utf8(text.0.clone()).unwrap());
            }
        }
        Seen::when(texts.len() >= keys, format_args!("{} of {keys}", texts.len()))
    })
    .await
    .unwrap();
    // The last key served: the pod has every key.
    let last = &texts[&format!("key-{}", keys - 1)];
    await_condition(
        "the pod serves the last key",
        Patience::by(deadline).every(Duration::from_millis(250)),
        async || chat(&ip, last).await == Some(200),
    )
    .await
    .unwrap();
    // Every status the reconcilers write settles before the usage's are
    // counted: the watch below starts from a quiet API server.
    let patience = Patience::by(deadline).every(Duration::from_secs(2));
    await_condition(format!("all {keys} ApiKeys say Ready"), patience, async || {
        // From the API server's watch cache (resourceVersion 0), not etcd.
        let listed = key_api.list(&ListParams::default().match_any()).await.unwrap().items;
        let ready = listed
            .iter()
            .filter(|k| k.status.as_ref().is_some_and(|s| waycast_e2e::harness::condition_true(&s.conditions, "Ready")))
            .count();
        Seen::when(ready >= keys, format_args!("{ready} Ready"))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Every write of an ApiKey from here on, by second (a watch event is one
    // write), and whether it carried usage.
    let watch_for = Duration::from_secs(env_number("WAYCAST_USAGE_WATCH_SECONDS", 120) as u64);
    let watch_api = key_api.clone();
    let watch_end = tokio::time::Instant::now() + watch_for + Duration::from_secs(2);
    let watching = tokio::spawn(async move {
        let mut writes = Vec::new();
        let mut usage_seen = std::collections::HashMap::new();
        let mut stream = watcher::watcher(watch_api, watcher::Config::default()).boxed();
        let mut wrong = Vec::new();
        while let Ok(Ok(Some(event))) = tokio::time::timeout_at(watch_end, stream.try_next()).await {
            // The initial list comes as Init* events; each Apply after it is
            // a write, a usage write when the key's usage changed.
            let (watcher::Event::Apply(key) | watcher::Event::InitApply(key)) = &event else { continue };
            let usage = key.status.as_ref().and_then(|s| s.usage.clone());
            let name = key.metadata.name.clone().unwrap_or_default();
            // Each of the 10,000 sent one request.
            if name.starts_with("key-") && usage.as_ref().is_some_and(|u| u.requests != 1 || u.input_tokens == 0) {
                wrong.push(format!("{name}: {usage:?}"));
            }
            let changed = usage_seen.insert(name, usage.clone()).is_some_and(|before| before != usage);
            if matches!(event, watcher::Event::Apply(_)) {
                writes.push((Instant::now(), changed));
            }
        }
        (writes, wrong)
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let watch_start = Instant::now();
    let operator_pid = operator.0.id();
    let rss_before = status_mib(operator_pid, "VmRSS:");
    let sampler = RssSampler::start(operator_pid);

    // Every key sends one request.
    let sent_at = Instant::now();
    let all: Vec<String> = texts.values().cloned().collect();
    let failures = futures_util::stream::iter(all.iter())
        .map(|text| chat(&ip, text))
        .buffer_unordered(32)
        .filter(|status| std::future::ready(*status != Some(200)))
        .count()
        .await;
    assert_eq!(failures, 0, "every key is served");
    println!("{keys} keys sent a request each in {:.1}s", sent_at.elapsed().as_secs_f64());

    // Apply → served for one more key while the usage is written.
    let mut latencies = Vec::new();
    for trial in 0..env_number("WAYCAST_SCALE_TRIALS", 20) {
        let name = format!("extra-{trial}");
        let extra = waycast_mock::fixtures::objects::api_key(&namespace, &name);
        let applied = Instant::now();
        key_api.create(&post, &extra).await.unwrap();
        let served = Patience::by(applied + Duration::from_secs(30)).every(Duration::from_millis(5));
        let text =
            waycast_e2e::workloads::generated_key(&client, &namespace, &name, Duration::from_secs(30)).await.unwrap();
        await_condition(format!("{name} is served"), served, async || chat(&ip, &text).await == Some(200))
            .await
            .unwrap();
        latencies.push(applied.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    latencies.sort_by(f64::total_cmp);
    let p99 = p99(&latencies);
    println!(
        "apply → served, one more key among {keys} while usage is written: p50 {:.3}s p99 {p99:.3}s",
        latencies[latencies.len() / 2]
    );

    let (writes, wrong) = watching.await.unwrap();
    assert!(wrong.is_empty(), "keys whose usage is not their one request: {:?}", &wrong[..wrong.len().min(5)]);
    let watched = watch_start.elapsed();
    let with_usage = writes.iter().filter(|(_, usage)| *usage).count();
    let per_window = |window: Duration| {
        let mut counts = vec![0_usize; (watched.as_secs_f64() / window.as_secs_f64()).ceil() as usize + 1];
        for (at, _) in writes.iter().filter(|(_, usage)| *usage) {
            let index = (at.saturating_duration_since(watch_start).as_secs_f64() / window.as_secs_f64()) as usize;
            if let Some(count) = counts.get_mut(index) {
                *count += 1;
            }
        }
        let busiest = counts.iter().copied().max().unwrap_or(0);
        busiest as f64 / window.as_secs_f64()
    };
    let (busiest_second, busiest_ten) = (per_window(Duration::from_secs(1)), per_window(Duration::from_secs(10)));
    let (peak, last) = sampler.finish().peak_and_last(watch_start, Instant::now());
    let whole_run = status_mib(operator_pid, "VmHWM:");
    println!(
        "ApiKey writes over {:.0}s: {} in all, {with_usage} of them usage: busiest second {busiest_second:.0}/s, busiest 10 s {busiest_ten:.1}/s of usage",
        watched.as_secs_f64(),
        writes.len()
    );
    println!(
        "operator RSS: {rss_before:.1} MiB before the requests, peak {peak:.1} MiB while the usage was written, {last:.1} MiB at the end (peak of the whole run {whole_run:.1} MiB)"
    );

    assert!(peak > 0.0, "the operator is gone");
    let mut missed = Vec::new();
    if busiest_ten > 20.0 {
        missed.push(format!("{busiest_ten:.1} usage writes a second over 10 s (target ≤ 20)"));
    }
    if with_usage < keys.min(watched.as_secs() as usize * 15) {
        missed.push(format!("only {with_usage} usage writes in {:.0}s: the writer stalls", watched.as_secs_f64()));
    }
    if p99 > 1.0 {
        missed.push(format!("apply → served p99 {p99:.3} s (target ≤ 1 s)"));
    }
    if peak > 100.0 {
        missed.push(format!("operator peak RSS {peak:.1} MiB while usage was written (target ≤ 100 MiB)"));
    }
    assert!(missed.is_empty(), "targets missed: {}", missed.join("; "));
}
