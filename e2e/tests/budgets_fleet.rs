//! Budgets under load on the e2e node: three gateway pods, 20 parallel
//! streams, a key's 100,000-token month and a namespace's 100,000-token
//! month spread over five keys — first with the budgets counted in a real
//! Redis (Debian's, on the node's bridge), then the same run without
//! Redis, where the operator hands the fleet's spend back to the pods.
//!
//! Each run spends until every stream is refused, then checks: what was
//! charged (the answers' usage) stays within the documented bound — the
//! budget plus what the requests in flight when it ran out could use —
//! every refusal is a 429 `insufficient_quota` naming the first instant
//! of next month, `GET /v1/usage` and `status.usage` equal what the
//! answers reported, and a pod killed and replaced mid-period refuses
//! instead of starting the month over.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use waycast_crds::period::Period;
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest::{self, object};
use waycast_e2e::redis::HostRedis;
use waycast_e2e::wait::{Patience, Seen, await_condition, await_condition_of, await_object, condition, within};
use waycast_e2e::workloads::{deploy_mock, generated_key, wait_pods_ready};
use waycast_mock::fixtures as fixture;

/// Every budget here: a month of this many tokens.
const BUDGET: u64 = 100_000;
const PARALLEL: usize = 20;
const PODS: usize = 3;
/// Each stream's output: this many tokens, one chunk each, 2 ms apart.
const OUTPUT: u64 = 500;
/// A stream is refused for this long without a break: the budget is spent
/// (without Redis a pod refuses for a while when its share of what was
/// left is spent, until the next collection, every 5 s).
const SPENT_AFTER: Duration = Duration::from_secs(12);

fn chat() -> String {
    format!(
        r#"{{"model":"fleet-llm","stream":true,"stream_options":{{"include_usage":true}},"max_tokens":{OUTPUT},"messages":[{{"role":"user","content":"how much is left?"}}]}}"#
    )
}

/// What one stream answered: its usage when served, the refusal's body
/// and `Retry-After` when refused.
enum Answer {
    Served { prompt: u64, completion: u64 },
    Refused { body: Value, retry_after: Option<String> },
}

async fn stream_once(ip: &str, key: &str) -> Answer {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut request = fixture::post_request(&format!("http://{ip}:8080/v1/chat/completions"), Some(key), &chat());
    request.headers_mut().insert("x-mock-chunks", OUTPUT.to_string().parse().unwrap());
    request.headers_mut().insert("x-mock-interval-ms", "2".parse().unwrap());
    let response = tokio::time::timeout(Duration::from_secs(60), http.request(request)).await.unwrap().unwrap();
    let status = response.status();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    match status {
        StatusCode::OK => {
            let usage = text
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .filter_map(|data| serde_json::from_str::<Value>(data).ok())
                .find_map(|event| event.get("usage").filter(|u| !u.is_null()).cloned())
                .unwrap_or_else(|| panic!("a served stream without its usage: {text}"));
            Answer::Served {
                prompt: usage["prompt_tokens"].as_u64().unwrap(),
                completion: usage["completion_tokens"].as_u64().unwrap(),
            }
        }
        StatusCode::TOO_MANY_REQUESTS => {
            Answer::Refused { body: serde_json::from_slice(&body).unwrap_or(Value::Null), retry_after }
        }
        other => panic!("{other}: {text}"),
    }
}

/// What a run's streams were charged, per key.
#[derive(Default)]
struct Charged {
    requests: Vec<AtomicU64>,
    input: Vec<AtomicU64>,
    output: Vec<AtomicU64>,
    /// Streams in flight when the first refusal came.
    in_flight_at_first_refusal: AtomicUsize,
}

impl Charged {
    fn new(keys: usize) -> Self {
        let zeros = || (0..keys).map(|_| AtomicU64::new(0)).collect();
        Self {
            requests: zeros(),
            input: zeros(),
            output: zeros(),
            in_flight_at_first_refusal: AtomicUsize::new(usize::MAX),
        }
    }

    fn tokens(&self) -> u64 {
        let sum = |values: &[AtomicU64]| values.iter().map(|v| v.load(Ordering::Relaxed)).sum::<u64>();
        sum(&self.input) + sum(&self.output)
    }
}

/// 20 streams at once over the pods and `keys`, each starting another when
/// it ends, until each has been refused for [`SPENT_AFTER`] without a break.
async fn spend_until_refused(ips: &[String], keys: &[String]) -> Arc<Charged> {
    let charged = Arc::new(Charged::new(keys.len()));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let next_month = Period::Month.window(jiff::Timestamp::now(), &jiff::tz::TimeZone::UTC).end.to_string();
    let workers: Vec<_> = (0..PARALLEL)
        .map(|worker| {
            let (ips, keys, charged, in_flight) = (ips.to_vec(), keys.to_vec(), charged.clone(), in_flight.clone());
            let next_month = next_month.clone();
            tokio::spawn(async move {
                // A load worker, not a wait: it stops once refused for a
                // while, and must do so within 300 s (see `wait`'s NB on
                // `tokio::spawn`).
                let deadline = Instant::now() + Duration::from_secs(300);
                let mut refused_since: Option<Instant> = None;
                for round in 0.. {
                    assert!(Instant::now() < deadline, "worker {worker} still spending after 300 s");
                    let key = (worker + round) % keys.len();
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    let answer = stream_once(&ips[(worker + round) % ips.len()], &keys[key]).await;
                    match answer {
                        Answer::Served { prompt, completion } => {
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            charged.requests[key].fetch_add(1, Ordering::Relaxed);
                            charged.input[key].fetch_add(prompt, Ordering::Relaxed);
                            charged.output[key].fetch_add(completion, Ordering::Relaxed);
                            refused_since = None;
                        }
                        Answer::Refused { body, retry_after } => {
                            let others = in_flight.fetch_sub(1, Ordering::SeqCst) - 1;
                            let _ = charged.in_flight_at_first_refusal.compare_exchange(
                                usize::MAX,
                                others,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            );
                            assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
                            let message = body["error"]["message"].as_str().unwrap();
                            assert!(message.contains(&next_month), "the reset ({next_month}) is named: {message}");
                            let seconds: u64 = retry_after.expect("Retry-After").parse().unwrap();
                            assert!(seconds > 0, "Retry-After {seconds}");
                            let since = *refused_since.get_or_insert_with(Instant::now);
                            if since.elapsed() >= SPENT_AFTER {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    charged
}

/// `GET /v1/usage` on the pod at `ip`: the spend of the budget `owner`
/// (`key` or `namespace`) says, `None` when it does not know (Redis away).
async fn spent(ip: &str, key: &str, owner: &str) -> Option<u64> {
    let body = waycast_e2e::workloads::key_usage(ip, key).await.unwrap();
    let budget = body["budgets"].as_array().unwrap().iter().find(|b| b["owner"] == owner).cloned().unwrap();
    budget["spent_tokens"].as_u64()
}

/// Waits until every pod's `GET /v1/usage` says `expected` for `owner`.
async fn wait_spent_everywhere(ips: &[String], key: &str, owner: &str, expected: u64) {
    let patience = Patience::by(Instant::now() + Duration::from_secs(60)).every(Duration::from_millis(250));
    for ip in ips {
        await_condition(format!("{ip} says {owner} spent {expected}"), patience, async || {
            let seen = spent(ip, key, owner).await;
            Seen::when(seen == Some(expected), seen)
        })
        .await
        .unwrap();
    }
}

async fn pod_ips(client: &kube::Client, namespace: &str) -> Vec<(String, String)> {
    wait_pods_ready(client, namespace, "app.kubernetes.io/instance=gateway", PODS, Duration::from_secs(180))
        .await
        .unwrap()
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p.status.as_ref().unwrap().pod_ip.clone().unwrap()))
        .collect()
}

/// The bound both modes are held to: the budget, plus what the streams in
/// flight when it ran out could each use (at most one request per stream:
/// a stream is admitted only while the budget is not spent).
fn bound(prompt_per_request: u64) -> u64 {
    BUDGET + PARALLEL as u64 * (prompt_per_request + OUTPUT)
}

async fn run(mode: &str, redis: Option<&HostRedis>) {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, &format!("fleet-{mode}")).await.unwrap();
    let solo_team = test_namespace(&client, &format!("solo-{mode}")).await.unwrap();
    let team = test_namespace(&client, &format!("team-{mode}")).await.unwrap();
    deploy_mock(&client, &home).await.unwrap();
    let mut spec = json!({"replicas": PODS, "apiKeys": {"namespaces": {"from": "All"}},
        "budgets": {"timeZone": "UTC", "currency": "USD"},
        "tenants": [{"namespaces": {"from": "Selector", "selector": {"matchLabels": {"kubernetes.io/metadata.name": team}}},
                     "budgets": [{"period": "Month", "tokens": BUDGET}]}]});
    if let Some(redis) = redis {
        spec["rateLimit"] = json!({"redis": {"address": redis.address, "timeout": "500ms"}});
    }
    let gateway = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"}, "spec": spec}),
    );
    let model = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "fleet-llm"},
        "spec": {"model": "fleet-llm", "backends": [{"service": {"name": "mock", "port": 8000}}],
                 "forwardHeaders": ["x-mock-*"], "apiKeys": {"namespaces": {"from": "All"}}}}),
    );
    manifest::apply_all(&client, &[gateway, model], &home).await.unwrap();
    let parent = json!([{"name": "gateway", "namespace": home}]);
    let key = |name: &str, spec: Value| {
        let mut spec = spec;
        spec["parentRefs"] = parent.clone();
        object(
            json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": name}, "spec": spec}),
        )
    };
    manifest::apply_all(
        &client,
        &[key("solo", json!({"budgets": [{"period": "Month", "tokens": BUDGET}]}))],
        &solo_team,
    )
    .await
    .unwrap();
    let team_keys: Vec<String> = (0..5).map(|n| format!("key-{n}")).collect();
    let objects: Vec<_> = team_keys.iter().map(|name| key(name, json!({}))).collect();
    manifest::apply_all(&client, &objects, &team).await.unwrap();
    let programmed = Patience::by(Instant::now() + Duration::from_secs(180)).every(Duration::from_millis(250));
    for (namespace, name) in std::iter::once((&solo_team, "solo")).chain(team_keys.iter().map(|n| (&team, n.as_str())))
    {
        await_condition_of::<ApiKey>(&client, namespace, name, &condition("Programmed"), programmed).await.unwrap();
    }
    let pods = pod_ips(&client, &home).await;
    let ips: Vec<String> = pods.iter().map(|(_, ip)| ip.clone()).collect();
    let solo = vec![generated_key(&client, &solo_team, "solo", Duration::from_secs(60)).await.unwrap()];
    let mut texts = Vec::new();
    for name in &team_keys {
        texts.push(generated_key(&client, &team, name, Duration::from_secs(60)).await.unwrap());
    }

    // With Redis, every pod counts there (a Redis left out would leave the
    // budgets to the collector, which also holds them).
    if redis.is_some() {
        for ip in &ips {
            let admin = format!("http://{ip}:9090/metrics");
            let patience = within(Duration::from_secs(30)).every(Duration::from_millis(250));
            await_condition(format!("{ip} is connected to Redis"), patience, async || {
                let up = waycast_e2e::workloads::metric_sample(&admin, "waycast_gateway_rate_limit_store_up").await;
                Seen::when(up == Some(1.0), up)
            })
            .await
            .unwrap();
        }
    }

    // A key's month, then a namespace's over five keys: each spent by 20
    // streams over the three pods until refused.
    let mut results = Vec::new();
    for (what, keys, owner) in [("a key", &solo, "key"), ("a namespace's five keys", &texts, "namespace")] {
        let started = Instant::now();
        let charged = spend_until_refused(&ips, keys).await;
        let total = charged.tokens();
        let requests: u64 = charged.requests.iter().map(|r| r.load(Ordering::Relaxed)).sum();
        let prompt_per_request = charged.input.iter().map(|v| v.load(Ordering::Relaxed)).sum::<u64>() / requests.max(1);
        let in_flight = charged.in_flight_at_first_refusal.load(Ordering::SeqCst);
        println!(
            "{mode}: {what}: {requests} streams charged {total} tokens of {BUDGET} ({:+} against it; {in_flight} in flight at the first refusal) in {:.1?}",
            total as i64 - BUDGET as i64,
            started.elapsed()
        );
        assert!(
            total <= bound(prompt_per_request),
            "{mode}: {what} charged {total}, past {}",
            bound(prompt_per_request)
        );
        // Refused only once (nearly) all of it was spent. In Redis, less
        // than one request's reservation is left (and what the last
        // settlements gave back); without it, each pod's share of what is
        // left can fall below one request while the rest is left.
        let requests_left = if redis.is_some() { 2 } else { PODS as u64 + 1 };
        assert!(total + requests_left * (prompt_per_request + OUTPUT) > BUDGET, "{mode}: {what} refused at {total}");
        // Every pod tells the key holder what the answers said.
        wait_spent_everywhere(&ips, &keys[0], owner, total).await;
        results.push(charged);
    }

    // The operator's view equals the answers': the solo key's month in its
    // status, the namespace's on the Gateway.
    let collected = Patience::by(Instant::now() + Duration::from_secs(60)).every(Duration::from_millis(500));
    let solo_api: Api<ApiKey> = Api::namespaced(client.clone(), &solo_team);
    let (input, output) = (results[0].input[0].load(Ordering::Relaxed), results[0].output[0].load(Ordering::Relaxed));
    let what = format!("{mode}: status.usage is {input} + {output}");
    await_object(&solo_api, "solo", what, collected, |key| {
        let usage = key.status.as_ref().and_then(|s| s.usage.as_ref());
        Seen::when(usage.is_some_and(|u| (u.input_tokens, u.output_tokens) == (input, output)), usage)
    })
    .await
    .unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &home);
    let what = format!("{mode}: the namespace's line says {}", results[1].tokens());
    await_object(&gateways, "gateway", what, collected, |gateway| {
        let usage = gateway.status.as_ref().and_then(|s| s.usage.as_ref());
        let line = usage.and_then(|u| u.namespaces.iter().find(|n| n.namespace == team));
        Seen::when(line.is_some_and(|l| l.input_tokens + l.output_tokens == results[1].tokens()), line)
    })
    .await
    .unwrap();

    // A pod killed mid-period: its replacement refuses both budgets and
    // counts what the fleet spent.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &home);
    let (victim, victim_ip) = pods[0].clone();
    pods_api.delete(&victim, &DeleteParams::default().grace_period(0)).await.unwrap();
    let patience = within(Duration::from_secs(180)).every(Duration::from_millis(500));
    let what = format!("{mode}: a replacement for {victim} ({victim_ip})");
    let fresh_ip = await_condition(what, patience, async || {
        let pods = pod_ips(&client, &home).await;
        pods.into_iter().find(|(name, ip)| name != &victim && !ips.contains(ip)).map(|(_, ip)| ip)
    })
    .await
    .unwrap();
    for (charged, keys, owner) in [(&results[0], &solo, "key"), (&results[1], &texts, "namespace")] {
        assert_eq!(
            spent(&fresh_ip, &keys[0], owner).await,
            Some(charged.tokens()),
            "{mode}: the replacement's {owner}"
        );
        match stream_once(&fresh_ip, &keys[keys.len() - 1]).await {
            Answer::Refused { body, .. } => assert_eq!(body["error"]["code"], "insufficient_quota", "{body}"),
            Answer::Served { .. } => panic!("{mode}: the replacement started the {owner}'s month over"),
        }
    }
}

#[tokio::test]
async fn budgets_hold_under_parallel_streams_over_three_pods_with_redis_and_without() {
    // The node's bridge, where Redis listens for the pods, comes with the cluster.
    shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    let redis = HostRedis::start(waycast_e2e::node::bridge_address()).unwrap();
    run("redis", Some(&redis)).await;
    run("local", None).await;
}
