//! Usage and budgets on the e2e node without Redis: the operator collects
//! each gateway pod's usage, shows it in `ApiKey.status.usage` and in
//! `Gateway.status.usage` (per namespace) equal to what the answers
//! reported, and hands the fleet's spend back to the pods, so a
//! namespace's daily budget holds across two pods and a pod killed and
//! replaced mid-period does not start its spend over. The same holds for
//! a person's own budget in an AccessGrant (`perUser`), here a workload
//! known by its ServiceAccount token.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use waycast_crds::{AccessGrant, ApiKey, Gateway};
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::wait::{Patience, Seen, await_condition, await_object, await_object_condition, condition, within};
use waycast_e2e::workloads::{deploy_mock, wait_pods_ready};
use waycast_mock::fixtures as fixture;

const CHAT: &str = r#"{"model":"priced-llm","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;
/// The namespace's daily budget, in tokens: about 25 requests of ~40.
const BUDGET: u64 = 1_000;

fn object(value: Value) -> kube::api::DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// One chat through the pod at `ip`: its status and answer.
async fn chat(ip: &str, key: &str) -> (StatusCode, Value) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut request = fixture::post_request(&format!("http://{ip}:8080/v1/chat/completions"), Some(key), CHAT);
    request.headers_mut().insert("x-mock-chunks", "20".parse().unwrap());
    let response = tokio::time::timeout(Duration::from_secs(30), http.request(request)).await.unwrap().unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// `GET /v1/usage` on the pod at `ip`: what the namespace's budget spent.
async fn namespace_spent(ip: &str, key: &str) -> u64 {
    spent(ip, key, "namespace").await
}

/// `GET /v1/usage` on the pod at `ip`: what the budget of `owner` spent.
async fn spent(ip: &str, bearer: &str, owner: &str) -> u64 {
    let body = waycast_e2e::workloads::key_usage(ip, bearer).await.unwrap();
    let budgets = body["budgets"].as_array().unwrap();
    budgets.iter().find(|b| b["owner"] == owner).unwrap()["spent_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn usage_reaches_the_statuses_and_a_budget_holds_across_pods_and_a_replaced_pod() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, "usage").await.unwrap();
    let team = test_namespace(&client, "team-u").await.unwrap();
    deploy_mock(&client, &home).await.unwrap();
    let gateway = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 2, "apiKeys": {"namespaces": {"from": "All"}},
                 "budgets": {"timeZone": "UTC", "currency": "USD"},
                 "tenants": [{"namespaces": {"from": "Selector", "selector": {"matchLabels": {"kubernetes.io/metadata.name": team}}},
                              "budgets": [{"period": "Day", "tokens": BUDGET}]}]}}),
    );
    let model = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "priced-llm"},
        "spec": {"model": "priced-llm", "backends": [{"service": {"name": "mock", "port": 8000}}],
                 "forwardHeaders": ["x-mock-*"], "apiKeys": {"namespaces": {"from": "All"}},
                 "pricing": {"currency": "USD", "inputPerMillionTokens": "1000", "outputPerMillionTokens": "2000"}}}),
    );
    manifest::apply_all(&client, &[gateway, model], &home).await.unwrap();
    let parent = json!([{"name": "gateway", "namespace": home}]);
    let keys: Vec<_> = ["one", "two"]
        .iter()
        .map(|name| {
            object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": name},
                          "spec": {"parentRefs": parent}}))
        })
        .collect();
    manifest::apply_all(&client, &keys, &team).await.unwrap();
    let api_keys: Api<ApiKey> = Api::namespaced(client.clone(), &team);
    let programmed = Patience::by(Instant::now() + Duration::from_secs(180)).every(Duration::from_millis(250));
    for name in ["one", "two"] {
        await_object_condition(&api_keys, name, &condition("Programmed"), programmed).await.unwrap();
    }
    let pods = wait_pods_ready(&client, &home, "app.kubernetes.io/instance=gateway", 2, Duration::from_secs(120))
        .await
        .unwrap();
    let ips: Vec<String> = pods.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();
    let texts = [
        waycast_e2e::workloads::generated_key(&client, &team, "one", Duration::from_secs(60)).await.unwrap(),
        waycast_e2e::workloads::generated_key(&client, &team, "two", Duration::from_secs(60)).await.unwrap(),
    ];

    // What each pod counts of its fleet as the spending starts (printed: a
    // budget passed shows why).
    let mut fleet_seen = Vec::new();
    for ip in &ips {
        let admin = format!("http://{ip}:9090/metrics");
        fleet_seen.push(waycast_e2e::workloads::metric_sample(&admin, "waycast_gateway_rate_limit_pods").await);
    }
    println!("pods sharing the limits, as each pod counts them as the spending starts: {fleet_seen:?}");
    assert_eq!(fleet_seen, [Some(2.0), Some(2.0)], "each pod divides by the Gateway's two pods from the start");

    // Spend the namespace's day over both pods and both keys, until refused.
    let mut used = [(0_u64, 0_u64, 0_u64); 2];
    let mut refused = None;
    for round in 0..60 {
        // Pods in turn, keys every other round: each key on both pods.
        let key = (round / 2) % 2;
        let (status, body) = chat(&ips[round % 2], &texts[key]).await;
        match status {
            StatusCode::OK => {
                let entry = &mut used[key];
                entry.0 += 1;
                entry.1 += body["usage"]["prompt_tokens"].as_u64().unwrap();
                entry.2 += body["usage"]["completion_tokens"].as_u64().unwrap();
            }
            StatusCode::TOO_MANY_REQUESTS => {
                refused = Some(body);
                break;
            }
            other => panic!("round {round}: {other}: {body}"),
        }
    }
    let refusal = refused.expect("the namespace's budget never refused");
    assert_eq!(refusal["error"]["code"], "insufficient_quota", "{refusal}");
    let spent: u64 = used.iter().map(|(_, prompt, completion)| prompt + completion).sum();
    println!("spent {spent} of the namespace's {BUDGET} tokens over two pods, then {refusal}");
    if spent > BUDGET {
        let logs = waycast_e2e::workloads::pod_logs(&client, &home, "app.kubernetes.io/instance=gateway", 60).await;
        panic!("spent {spent}: the budget passed without Redis (pods counted {fleet_seen:?})\n{logs}");
    }
    // Refused only when the rest could not hold another request's worst
    // case (about 40 tokens) on the pod that refused it, whose share of
    // what is left is half.
    assert!(spent + 2 * 45 > BUDGET, "refused at {spent}: too early");

    // The operator collects it: each key's month in its status, the
    // namespace's on the Gateway, equal to what the answers reported.
    let collected = Patience::by(Instant::now() + Duration::from_secs(60)).every(Duration::from_millis(500));
    for (index, name) in ["one", "two"].iter().enumerate() {
        let (requests, input, output) = used[index];
        let what = format!("status.usage shows {requests} requests");
        let usage = await_object(&api_keys, name, what, collected, |key| {
            let usage = key.status.as_ref().and_then(|s| s.usage.clone());
            usage.filter(|u| u.requests == requests)
        })
        .await
        .unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (input, output), "{name}: {usage:?}");
        let cost = waycast_crds::money::Money::parse(&usage.cost).unwrap().0;
        assert_eq!(cost, input * 1_000_000 + output * 2_000_000, "{name}: {usage:?}");
        assert_eq!(usage.currency, "USD");
    }
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &home);
    let status = gateways.get("gateway").await.unwrap().status.unwrap().usage.unwrap();
    let line = status.namespaces.iter().find(|n| n.namespace == team).unwrap();
    assert_eq!(line.requests, used[0].0 + used[1].0);
    assert_eq!(line.input_tokens + line.output_tokens, spent);

    // A pod is killed and replaced: the new process starts from the
    // fleet's spend (handed back by the operator), not from nothing.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &home);
    let victim = pods[0].metadata.name.clone().unwrap();
    pods_api.delete(&victim, &DeleteParams::default().grace_period(0)).await.unwrap();
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(500));
    let fresh_ip = await_condition("a replacement pod is ready", patience, async || {
        let ready = wait_pods_ready(&client, &home, "app.kubernetes.io/instance=gateway", 2, Duration::from_secs(120))
            .await
            .unwrap();
        let fresh = ready.iter().find(|p| {
            p.metadata.name.as_deref() != Some(victim.as_str())
                && p.status.as_ref().and_then(|s| s.pod_ip.clone()).is_some_and(|ip| ip != ips[1])
        });
        fresh.map(|pod| pod.status.as_ref().unwrap().pod_ip.clone().unwrap())
    })
    .await
    .unwrap();
    let replaced = Instant::now();
    // Exactly the fleet's spend: neither from nothing nor counted twice.
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(250));
    await_condition("the new pod counts the fleet's spend", patience, async || {
        let counted = namespace_spent(&fresh_ip, &texts[0]).await;
        Seen::when(counted == spent, counted)
    })
    .await
    .unwrap();
    println!("a replacement pod counted the fleet's spend {:?} after it was ready", replaced.elapsed());
    // It spends at most what the fleet left (a process starting the day
    // over would have its share of the whole budget: about 12 requests).
    let mut more = 0;
    let mut refusal = None;
    for _ in 0..10 {
        let (status, body) = chat(&fresh_ip, &texts[1]).await;
        match status {
            StatusCode::OK => more += body["usage"]["total_tokens"].as_u64().unwrap(),
            _ => {
                refusal = Some(body);
                break;
            }
        }
    }
    let refusal = refusal.expect("the replacement started the day over: it never refused");
    assert_eq!(refusal["error"]["code"], "insufficient_quota", "{refusal}");
    assert!(spent + more <= BUDGET, "the replacement spent {more} more of the {} left", BUDGET - spent);
}

/// A member's own daily budget (`perUser`) without Redis: spent over two
/// pods it is never passed, and a pod killed and replaced starts from what
/// the fleet spent of it, not from nothing. The member is a workload: the
/// token is its ServiceAccount's, asked for through the API server.
#[tokio::test]
async fn a_members_budget_holds_across_pods_and_a_replaced_pod() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    const MEMBER_BUDGET: u64 = 400;
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, "member-usage").await.unwrap();
    let team = test_namespace(&client, "member-team").await.unwrap();
    deploy_mock(&client, &home).await.unwrap();
    let gateway = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 2, "apiKeys": {"namespaces": {"from": "All"}},
                 "budgets": {"timeZone": "UTC", "currency": "USD"},
                 "identity": {"providers": [{"name": "cluster", "serviceAccountIssuer": {}, "audiences": ["waycast"]}]}}}),
    );
    let model = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "priced-llm"},
        "spec": {"model": "priced-llm", "backends": [{"service": {"name": "mock", "port": 8000}}],
                 "forwardHeaders": ["x-mock-*"], "apiKeys": {"namespaces": {"from": "All"}}}}),
    );
    manifest::apply_all(&client, &[gateway, model], &home).await.unwrap();
    let grant =
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "AccessGrant", "metadata": {"name": "batch"},
        "spec": {"parentRefs": [{"name": "gateway", "namespace": home}], "provider": "cluster",
                 "serviceAccounts": [format!("{team}/batch")], "models": ["priced-llm"],
                 "perUser": {"budgets": [{"period": "Day", "tokens": MEMBER_BUDGET}]}}}));
    let account = object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "batch"}}));
    manifest::apply_all(&client, &[grant, account], &team).await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &team);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["waycast".into()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued = accounts.create_token_request("batch", &kube::api::PostParams::default(), &request).await.unwrap();
    let token = issued.status.unwrap().token;
    let pods = wait_pods_ready(&client, &home, "app.kubernetes.io/instance=gateway", 2, Duration::from_secs(180))
        .await
        .unwrap();
    let ips: Vec<String> = pods.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();
    // Served by both once the grant and the cluster's key set reach them.
    let mut used = 0;
    for ip in &ips {
        let patience = within(Duration::from_secs(120)).every(Duration::from_millis(250));
        let body = await_condition("the member is served", patience, async || {
            let (status, body) = chat(ip, &token).await;
            (status == StatusCode::OK).then_some(body)
        })
        .await
        .unwrap();
        used += body["usage"]["total_tokens"].as_u64().unwrap();
    }

    // Spend the member's day over both pods until refused: never past it.
    let mut refused = None;
    for round in 0..40 {
        let (status, body) = chat(&ips[round % 2], &token).await;
        match status {
            StatusCode::OK => used += body["usage"]["total_tokens"].as_u64().unwrap(),
            StatusCode::TOO_MANY_REQUESTS => {
                refused = Some(body);
                break;
            }
            other => panic!("round {round}: {other}: {body}"),
        }
    }
    let refusal = refused.expect("the member's budget never refused");
    assert_eq!(refusal["error"]["code"], "insufficient_quota", "{refusal}");
    println!("the member spent {used} of their {MEMBER_BUDGET} tokens over two pods, then {refusal}");
    assert!(used <= MEMBER_BUDGET, "spent {used}: the member's budget passed without Redis");

    // Collected: the pod that stays counts the whole of it (the other's
    // part through the operator's baseline).
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(250));
    await_condition("the operator collects the member's spend", patience, async || {
        let counted = spent(&ips[1], &token, "user").await;
        Seen::when(counted == used, counted)
    })
    .await
    .unwrap();

    // A pod is killed and replaced: the new process counts the member's
    // spend as the fleet's (the operator's ledger handed back), once.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &home);
    let victim = pods[0].metadata.name.clone().unwrap();
    pods_api.delete(&victim, &DeleteParams::default().grace_period(0)).await.unwrap();
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(500));
    let fresh_ip = await_condition("a replacement pod is ready", patience, async || {
        let ready = wait_pods_ready(&client, &home, "app.kubernetes.io/instance=gateway", 2, Duration::from_secs(120))
            .await
            .unwrap();
        let fresh = ready.iter().find(|p| {
            p.metadata.name.as_deref() != Some(victim.as_str())
                && p.status.as_ref().and_then(|s| s.pod_ip.clone()).is_some_and(|ip| ip != ips[1])
        });
        fresh.map(|pod| pod.status.as_ref().unwrap().pod_ip.clone().unwrap())
    })
    .await
    .unwrap();
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(250));
    await_condition("the new pod counts the member's spend", patience, async || {
        let counted = spent(&fresh_ip, &token, "user").await;
        Seen::when(counted == used, counted)
    })
    .await
    .unwrap();
    // It spends at most what the fleet left (a process starting the day
    // over would have half of the whole budget: about 5 requests).
    let mut more = 0;
    let mut refusal = None;
    for _ in 0..10 {
        let (status, body) = chat(&fresh_ip, &token).await;
        if status == StatusCode::OK {
            more += body["usage"]["total_tokens"].as_u64().unwrap();
        } else {
            refusal = Some(body);
            break;
        }
    }
    let refusal = refusal.expect("the replacement started the member's day over: it never refused");
    assert_eq!(refusal["error"]["code"], "insufficient_quota", "{refusal}");
    assert!(used + more <= MEMBER_BUDGET, "the replacement spent {more} more of the {} left", MEMBER_BUDGET - used);

    // The grant's own status: its members' month together (the killed
    // pod's part included, from the ledger) and one member who spent.
    let grants: Api<AccessGrant> = Api::namespaced(client.clone(), &team);
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(500));
    let shown = await_condition("the AccessGrant's status shows its usage", patience, async || {
        let usage = grants.get("batch").await.ok().and_then(|grant| grant.status?.usage);
        usage.filter(|u| u.used.input_tokens + u.used.output_tokens >= used + more)
    })
    .await
    .unwrap();
    assert_eq!(shown.members, Some(1), "{shown:?}");
    assert!(shown.used.requests > 0, "{shown:?}");
}
