//! The tenancy promise on a real cluster: what one team writes cannot
//! freeze, read or redirect what another team gets from a shared Gateway.
//! One test per way a team could try, so that each failure is named.
//!
//! Most of them share one "home" namespace with the quickstart and a
//! Gateway that takes keys and models from every namespace (that name it),
//! set up once ([`home`]); each such test brings its own keys and team
//! namespaces and leaves the others' alone. The tests that need a Gateway to
//! themselves (one that refuses its config on purpose) or only the API
//! server have their own namespace.
//!
//! The operator runs in this test process (one per test binary); the
//! gateways it creates run as real pods.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::sync::OnceLock;
use std::time::Duration;

use http::StatusCode;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use waycast_crds::{ApiKey, Gateway, ModelEndpoint};
use waycast_e2e::harness::{SharedCluster, shared_cluster_with_node, shared_setup, test_namespace};
use waycast_e2e::manifest::{self, object};
use waycast_e2e::wait::{
    ConditionIs, Namespaced, Seen, await_absent, await_answer, await_condition, await_condition_of, condition, within,
};
use waycast_e2e::workloads::{gateway_pod_urls, wait_pods_ready};
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

/// Waits until every pod answers `key`'s chat for `model` with `wanted`.
async fn wait_model_status(urls: &[String], key: &str, model: &str, wanted: StatusCode) {
    let patience = within(Duration::from_secs(30)).every(Duration::from_millis(50));
    await_answer(urls, key, model, wanted, patience).await.unwrap();
}

/// The key the operator generated for ApiKey `namespace/name`, read once:
/// its Secret exists by the time the ApiKey is Programmed.
async fn generated_key(client: &Client, namespace: &str, name: &str) -> String {
    waycast_e2e::workloads::generated_key(client, namespace, name, Duration::ZERO).await.unwrap()
}

/// An ApiKey `name` (its key generated) naming the home Gateway.
fn key_of_home(name: &str, home: &str) -> kube::api::DynamicObject {
    object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": name},
        "spec": {"parentRefs": [{"name": "gateway", "namespace": home}]}}))
}

/// Applies ApiKey `name` into `namespace` and returns its generated key once
/// it is Programmed.
async fn programmed_key(client: &Client, namespace: &str, key: kube::api::DynamicObject) -> String {
    let name = key.metadata.name.clone().unwrap();
    manifest::apply_all(client, &[key], namespace).await.unwrap();
    wait_for::<ApiKey>(client, namespace, &name, condition("Programmed").because("Programmed")).await;
    generated_key(client, namespace, &name).await
}

/// The mock pod that answered `key`'s `model` on `url` (a 200 first).
async fn served_by(url: &str, key: &str, model: &str) -> String {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
    let response = http.request(fixture::post_request(url, Some(key), &body)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{model} on {url}");
    response.headers()[waycast_mock::upstream::POD_HEADER].to_str().unwrap().to_owned()
}

/// The shared home: the quickstart, its Gateway taking keys and models from
/// every namespace (that names it), served on both pods.
struct Home {
    namespace: String,
    /// Each gateway pod's own chat URL.
    urls: Vec<String>,
    /// The quickstart's key (only [`what_only_the_gateway_checks_is_left_out_alone_while_other_changes_propagate`]
    /// uses it: it disables it).
    alice: String,
}

fn home() -> &'static Home {
    static HOME: OnceLock<Result<Home, String>> = OnceLock::new();
    let cluster = cluster();
    shared_setup(&HOME, move || async move {
        let client = cluster.client().await;
        let home = test_namespace(&client, "home").await?;
        let path = waycast_e2e::workloads::repository_root().join("examples/quickstart/quickstart.yaml");
        manifest::apply_all(&client, &manifest::parse_documents(&std::fs::read_to_string(path)?)?, &home).await?;
        let all = json!({"namespaces": {"from": "All"}});
        let gateway = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
            "spec": {"replicas": 2, "apiKeys": all, "modelEndpoints": all}});
        manifest::apply_all(&client, &[serde_json::from_value(gateway)?], &home).await?;
        let programmed = condition("Programmed").because("Programmed");
        await_condition_of::<ApiKey>(&client, &home, "alice", &programmed, within(OPERATOR_PACE)).await?;
        let alice = waycast_e2e::workloads::generated_key(&client, &home, "alice", Duration::ZERO).await?;
        let urls = gateway_pod_urls(&client, &home, 2, Duration::from_secs(90)).await?;
        let patience = within(Duration::from_secs(30)).every(Duration::from_millis(10));
        await_answer(&urls, &alice, "llama3", StatusCode::OK, patience).await?;
        Ok(Home { namespace: home, urls, alice })
    })
}

/// What the schema can refuse, the API server refuses with the field named.
#[tokio::test]
async fn the_api_server_refuses_what_the_schema_can_with_the_field_named() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "schema").await.unwrap();
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
        let error = manifest::apply_all(&client, &[bad], &namespace).await.expect_err(what);
        assert!(format!("{error:#}").contains(expected), "{what}: {error:#}");
    }
}

/// What only the gateway's own check sees (a control character in a
/// credential, a CA that does not parse) is left out on its own, with the
/// field named, and an unlabelled Secret never reaches the config; an
/// Azure-style URL serves with its query; meanwhile everyone else's changes
/// keep propagating: a disabled key answers 401 and a new key 200 on every
/// pod within seconds.
#[tokio::test]
async fn what_only_the_gateway_checks_is_left_out_alone_while_other_changes_propagate() {
    let Home { namespace: home, urls, alice } = home();
    let client = cluster().client().await;
    let team = test_namespace(&client, "tenant").await.unwrap();
    let credential = |name: &str, value: &str, labelled: bool| {
        let labels = if labelled { json!({"waycast.dev/credential": "true"}) } else { json!({}) };
        object(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels},
            "stringData": {"k": value}}))
    };
    manifest::apply_all(
        &client,
        &[credential("bell", "sk-\u{7}", true), credential("unlabelled", "sk-never-sent", false)],
        home,
    )
    .await
    .unwrap();
    let vllm = Api::<Service>::namespaced(client.clone(), home).get("vllm").await.unwrap();
    let vllm_ip = vllm.spec.unwrap().cluster_ip.unwrap();
    // A url backend to a ClusterIP: the platform team opens that address.
    waycast_e2e::workloads::open_egress(&client, home, "gateway", &[&vllm_ip]).await.unwrap();
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
    manifest::apply_all(&client, &endpoints, home).await.unwrap();
    wait_for::<ModelEndpoint>(&client, home, "control", condition("Accepted").is("False").because("Invalid")).await;
    wait_for::<ModelEndpoint>(&client, &team, "poisoned", condition("Accepted").is("False").because("Invalid")).await;
    let not_labelled = condition("ResolvedRefs").is("False").because("SecretNotLabelled");
    wait_for::<ModelEndpoint>(&client, home, "unlabelled", not_labelled).await;
    wait_for::<ModelEndpoint>(&client, home, "azure", condition("Programmed").because("Programmed")).await;
    // ... while everyone else's changes keep propagating: a disabled key
    // answers 401 and a new key 200 on every pod.
    let bob = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "bob"}, "spec": {}});
    manifest::apply_all(&client, &[object(bob)], home).await.unwrap();
    Api::<ApiKey>::namespaced(client.clone(), home)
        .patch("alice", &PatchParams::default(), &Patch::Merge(json!({"spec": {"disabled": true}})))
        .await
        .unwrap();
    wait_for::<ApiKey>(&client, home, "bob", condition("Programmed").because("Programmed")).await;
    let bob = generated_key(&client, home, "bob").await;
    let every_10_ms = |timeout| within(timeout).every(Duration::from_millis(10));
    await_answer(urls, &bob, "llama3", StatusCode::OK, every_10_ms(Duration::from_secs(5))).await.unwrap();
    // The disable was applied before bob was Programmed: at once.
    await_answer(urls, alice, "llama3", StatusCode::UNAUTHORIZED, every_10_ms(Duration::from_secs(2))).await.unwrap();
    // (alice's allow-list is llama-*; bob may call any model of his namespace.)
    wait_model_status(urls, &bob, "azure-style", StatusCode::OK).await;
    wait_for::<Gateway>(&client, home, "gateway", condition("Programmed").because("ConfigWritten")).await;
    // An unlabelled Secret's value never reaches the config's Secrets.
    let written = waycast_e2e::config_secrets::read_config(&client, home, "gateway-config").await.unwrap();
    let text = String::from_utf8(written.config.to_canonical_json().unwrap()).unwrap();
    assert!(!text.contains("sk-never-sent") && text.contains("api-version=2024-06-01"), "{text}");
}

/// A Gateway in another namespace with `from: All` gets nothing that did
/// not name it, and shows in no one's status.
#[tokio::test]
async fn a_gateway_taking_from_all_namespaces_gets_nothing_that_did_not_name_it() {
    let Home { namespace: home, .. } = home();
    let client = cluster().client().await;
    let rogue = test_namespace(&client, "rogue").await.unwrap();
    programmed_key(&client, home, key_of_home("grace", home)).await;
    let all = json!({"namespaces": {"from": "All"}});
    let grab = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "grab"},
        "spec": {"replicas": 1, "modelEndpoints": all, "apiKeys": all}});
    manifest::apply_all(&client, &[object(grab)], &rogue).await.unwrap();
    wait_for::<Gateway>(&client, &rogue, "grab", condition("Programmed").because("ConfigWritten")).await;
    let grabbed = Api::<Gateway>::namespaced(client.clone(), &rogue).get("grab").await.unwrap().status.unwrap();
    assert_eq!((grabbed.model_count, grabbed.api_key_count), (Some(0), Some(0)));
    let grace = Api::<ApiKey>::namespaced(client.clone(), home).get("grace").await.unwrap().status.unwrap();
    assert_eq!(grace.gateways, [format!("{home}/gateway")]);
    assert!(grace.parents.iter().all(|p| !p.gateway.starts_with(&rogue)), "{:?}", grace.parents);
}

/// Another team's key sees only what is shared with it: 404 (as for a
/// model that does not exist), then 200 once the model is shared. Then
/// squatting: the tenant publishes its own `llama3`, shared with every
/// namespace. Keys of other namespaces still get the platform's llama3
/// (its pods answer), and its own keys get its own: a name is its
/// namespace's, and nobody else's prompts reach the squatter.
#[tokio::test]
async fn another_teams_key_sees_only_what_is_shared_and_a_squatted_name_stays_its_namespaces() {
    let Home { namespace: home, urls, .. } = home();
    let client = cluster().client().await;
    let team = test_namespace(&client, "tenant").await.unwrap();
    let rogue = test_namespace(&client, "rogue").await.unwrap();
    let carol = programmed_key(&client, &team, key_of_home("carol", home)).await;
    wait_model_status(urls, &carol, "llama3", StatusCode::NOT_FOUND).await;
    Api::<ModelEndpoint>::namespaced(client.clone(), home)
        .patch(
            "llama-3-1-8b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"apiKeys": {"namespaces": {"from": "All"}}}})),
        )
        .await
        .unwrap();
    wait_model_status(urls, &carol, "llama3", StatusCode::OK).await;

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
    wait_for::<ModelEndpoint>(&client, &team, "squat", condition("Programmed").because("Programmed")).await;
    wait_pods_ready(&client, &team, "app=squatter", 1, Duration::from_secs(90)).await.unwrap();
    let heidi = programmed_key(&client, home, key_of_home("heidi", home)).await;
    let dave = programmed_key(&client, &rogue, key_of_home("dave", home)).await;
    for url in urls {
        for (who, key, pod_prefix) in
            [("heidi", &heidi, "vllm-"), ("dave", &dave, "vllm-"), ("carol", &carol, "squatter-")]
        {
            let pod = served_by(url, key, "llama3").await;
            assert!(pod.starts_with(pod_prefix), "{who}'s llama3 was served by {pod} on {url}");
        }
    }
}

/// Egress is closed by default: a url backend naming another namespace's
/// Service by its address is not served (the operator sees the literal),
/// and one naming a host that resolves into a closed range (loopback: the
/// pod's own admin port) gets a 502 egress_denied from the pods, which
/// check every address they connect to.
#[tokio::test]
async fn egress_is_closed_to_another_namespaces_service_and_to_loopback() {
    let Home { namespace: home, urls, .. } = home();
    let client = cluster().client().await;
    let team = test_namespace(&client, "tenant").await.unwrap();
    let erin = programmed_key(&client, &team, key_of_home("erin", home)).await;
    // The home gateway's own Service (no test opens its address).
    let home_service = Api::<Service>::namespaced(client.clone(), home).get("gateway").await.unwrap();
    let home_service_ip = home_service.spec.unwrap().cluster_ip.unwrap();
    let reach = |name: &str, url: String| {
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": name},
            "spec": {"model": name, "parentRefs": [{"name": "gateway", "namespace": home}], "backends": [{"url": url}]}}))
    };
    let steal = reach("steal", format!("http://{home_service_ip}:80/v1"));
    let loopback = reach("loopback", "http://localhost:9090".into());
    manifest::apply_all(&client, &[steal, loopback], &team).await.unwrap();
    let not_allowed = condition("Accepted").is("False").because("NotAllowedByGateway");
    wait_for::<ModelEndpoint>(&client, &team, "steal", not_allowed).await;
    wait_for::<ModelEndpoint>(&client, &team, "loopback", condition("Programmed").because("Programmed")).await;
    for url in urls {
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let request = fixture::post_request(url, Some(&erin), r#"{"model":"loopback","messages":[]}"#);
        let response = http.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY, "{url}");
        let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(error["error"]["code"], "egress_denied", "{url}: {error}");
    }
}

/// Only a gateway pod's own heartbeat counts. A forged one — a Lease
/// labelled for the Gateway, naming no live pod of it, claiming a refusal —
/// changes neither Programmed nor the pods' count of their fleet (each
/// shares the rate limits by it). A pod that really refuses the written
/// config says so in its own heartbeat, and the Gateway stops claiming
/// "written": here the platform's Redis CA does not parse, which only the
/// pods find out. (A Gateway of its own: it refuses its config on purpose.)
#[tokio::test]
async fn only_a_pods_own_heartbeat_counts_forged_ones_change_nothing_and_a_refusal_shows() {
    let client = cluster().client().await;
    let home = test_namespace(&client, "heartbeats").await.unwrap();
    manifest::apply_all(&client, &waycast_e2e::workloads::quickstart().unwrap(), &home).await.unwrap();
    wait_for::<ApiKey>(&client, &home, "alice", condition("Programmed").because("Programmed")).await;
    let urls = gateway_pod_urls(&client, &home, 2, Duration::from_secs(90)).await.unwrap();

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
    let patience = within(Duration::from_secs(30)).every(Duration::from_millis(500));
    await_condition("every gateway pod looks at the forged Leases", patience, async || {
        let logs = waycast_e2e::workloads::pod_logs(&client, &home, "app.kubernetes.io/instance=gateway", 200).await;
        Seen::when(logs.matches("no live pod's own is not counted").count() >= 4, logs)
    })
    .await
    .unwrap();
    let eve = json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": "eve"}, "spec": {}});
    manifest::apply_all(&client, &[object(eve)], &home).await.unwrap();
    wait_for::<ApiKey>(&client, &home, "eve", condition("Programmed").because("Programmed")).await;
    wait_for::<Gateway>(&client, &home, "gateway", condition("Programmed").because("ConfigWritten")).await;
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

    // A real refusal, by the pods.
    let redis_ca = object(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-ca"},
        "stringData": {"ca.crt": "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"}}));
    manifest::apply_all(&client, &[redis_ca], &home).await.unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &home);
    let redis = json!({"spec": {"rateLimit": {"redis": {"address": "redis.invalid:6379",
        "tls": {"caSecretRef": {"name": "redis-ca", "key": "ca.crt"}}}}}});
    gateways.patch("gateway", &PatchParams::default(), &Patch::Merge(redis)).await.unwrap();
    let refused = condition("Programmed").is("False").because("ConfigRefused");
    wait_for::<Gateway>(&client, &home, "gateway", refused).await;
    let refused = gateways.get("gateway").await.unwrap().status.unwrap();
    let message = &refused.conditions.iter().find(|c| c.type_ == "Programmed").unwrap().message;
    assert!(message.contains("redis") && !message.contains("forged"), "{message}");
    gateways
        .patch("gateway", &PatchParams::default(), &Patch::Merge(json!({"spec": {"rateLimit": null}})))
        .await
        .unwrap();
    wait_for::<Gateway>(&client, &home, "gateway", condition("Programmed").because("ConfigWritten")).await;
}

/// No takeover: a Gateway named like an existing ServiceAccount leaves it
/// alone and says so; deleting the Gateway does not collect it.
#[tokio::test]
async fn a_gateway_named_like_an_existing_service_account_leaves_it_alone() {
    let client = cluster().client().await;
    let home = test_namespace(&client, "takeover").await.unwrap();
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &home);
    let account = object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "taken"}}));
    manifest::apply_all(&client, &[account], &home).await.unwrap();
    let taken =
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "taken"}, "spec": {}});
    manifest::apply_all(&client, &[object(taken)], &home).await.unwrap();
    wait_for::<Gateway>(&client, &home, "taken", condition("Accepted").is("False").because("NameConflict")).await;
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
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(200));
    await_absent(&maps, "taken-canary", patience).await.unwrap();
    assert!(accounts.get_opt("taken").await.unwrap().is_some(), "the ServiceAccount survived its namesake");
}
