//! The operator writes a Gateway's config in parts, the manifest last. Here
//! the API server refuses one part's write (a ValidatingAdmissionPolicy)
//! after another part of the same change was written, and the operator is
//! then killed there: the manifest is still the last one (it is written
//! only after every part), the running gateway keeps serving the last
//! whole config, a gateway started meanwhile never serves the written
//! part without the rest, and a restarted operator finishes the change
//! once the write is allowed.
//!
//! A key change is written by the operator's key lane as a patch of the
//! shard holding the key: one shard and the manifest, nothing more from
//! the whole reconcile that follows; a key whose digest another key
//! serves is left to the whole compile, which refuses it.
//!
//! Against the real API server, with the operator and the gateway as
//! processes (the operator must be killable, so not the in-process one).

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use waycast_crds::shards::{self, PART_DIGEST_ANNOTATION};
use waycast_crds::{ApiKey, Gateway, ModelEndpoint};
use waycast_e2e::control_plane::free_port;
use waycast_e2e::harness::{shared_cluster, test_namespace};
use waycast_e2e::process::{KilledOnDrop, workspace_binary};
use waycast_e2e::wait::{Seen, await_condition, await_object, holds_for, within};
use waycast_e2e::workloads::chat_status;
use waycast_mock::sink::{self, SinkOptions};
use waycast_operator::render::CONFIG_HASH_ANNOTATION;
use waycast_xtask::scale;

const CONFIG: &str = "gateway-config";

fn start(binary: &str, args: &[&str], kubeconfig: &std::path::Path, log: &str) -> KilledOnDrop {
    KilledOnDrop(
        Command::new(workspace_binary(binary).unwrap())
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::fs::File::create(std::env::temp_dir().join(log)).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn start_operator(kubeconfig: &std::path::Path, namespace: &str, run: u32) -> KilledOnDrop {
    start_operator_at(kubeconfig, namespace, run).0
}

/// A gateway serving `namespace`'s config, and where it listens; its log
/// is `waycast-<namespace>-<log>.log`.
fn start_gateway(kubeconfig: &std::path::Path, namespace: &str, log: &str) -> (KilledOnDrop, SocketAddr) {
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST.into()).unwrap()));
    let admin = format!("127.0.0.1:{}", free_port(Ipv4Addr::LOCALHOST.into()).unwrap());
    let config = format!("{namespace}/{CONFIG}");
    let args = ["--config-secret", &config, "--listen", &listen.to_string(), "--admin-listen", &admin];
    (start("waycast-gateway", &args, kubeconfig, &format!("waycast-{namespace}-{log}.log")), listen)
}

/// An operator, and its admin address (metrics).
fn start_operator_at(kubeconfig: &std::path::Path, namespace: &str, run: u32) -> (KilledOnDrop, String) {
    let admin = format!("127.0.0.1:{}", free_port(Ipv4Addr::LOCALHOST.into()).unwrap());
    let log = format!("waycast-{namespace}-operator-{run}.log");
    (start("waycast-operator", &["--admin-listen", &admin, "--log", "info"], kubeconfig, &log), admin)
}

/// The value of the series `series` (name and labels, as exposed) the
/// operator at `admin` shows; 0 when it shows none.
async fn operator_metric(admin: &str, series: &str) -> f64 {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let response = http.get(format!("http://{admin}/metrics").parse().unwrap()).await.unwrap();
    let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    let prefix = format!("{series} ");
    text.lines().find_map(|line| line.strip_prefix(prefix.as_str())?.trim().parse().ok()).unwrap_or(0.0)
}

/// The data bytes of the Secret `name`.
async fn data_bytes(secrets: &Api<Secret>, name: &str) -> f64 {
    let secret = secrets.get(name).await.unwrap();
    secret.data.iter().flatten().map(|(_, value)| value.0.len()).sum::<usize>() as f64
}

async fn until_status(gateway: SocketAddr, key: &str, model: &str, status: u16, timeout: Duration) {
    let patience = within(timeout).every(Duration::from_millis(50));
    await_condition(format!("{model}: {status}"), patience, async || {
        let got = chat_status(gateway, key, model).await;
        Seen::when(got == Some(status), got)
    })
    .await
    .unwrap();
}

async fn key_text(secrets: &Api<Secret>, key: &str) -> String {
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(50));
    await_object(secrets, &format!("{key}-key"), "the operator generates it", patience, |secret| {
        secret.data.as_ref().map(|data| String::from_utf8(data["api-key"].0.clone()).unwrap())
    })
    .await
    .unwrap()
}

async fn annotation(secrets: &Api<Secret>, name: &str, key: &str) -> Option<String> {
    let secret = secrets.get_opt(name).await.unwrap()?;
    secret.metadata.annotations?.get(key).cloned()
}

async fn part_digest(secrets: &Api<Secret>, name: &str) -> Option<String> {
    annotation(secrets, name, PART_DIGEST_ANNOTATION).await
}

/// The manifest's own digest: the config's identity.
async fn manifest_hash(secrets: &Api<Secret>) -> Option<String> {
    annotation(secrets, CONFIG, CONFIG_HASH_ANNOTATION).await
}

/// Refuses updates of the Secrets `names` in `namespace` until deleted.
async fn refuse_updates(client: &Client, namespace: &str, names: &[String]) -> String {
    let name = format!("hold-{namespace}");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["secrets"], "resourceNames": names,
            }]},
            "validations": [{"expression": "false", "message": "held back by the test"}],
        },
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(client.clone()).create(&PostParams::default(), &policy).await.unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // In force once a dry-run update of one of them is refused by it.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let probe = serde_json::json!({"metadata": {"annotations": {"e2e/probe": "1"}}});
    await_condition("the admission policy is in force", within(Duration::from_secs(30)), async || {
        match secrets.patch(&names[0], &PatchParams::default().dry_run(), &Patch::Merge(&probe)).await {
            Err(kube::Error::Api(refusal)) if refusal.message.contains("held back by the test") => Seen::Done(()),
            other => Seen::NotYet(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    name
}

async fn allow_updates(client: &Client, name: &str) {
    let delete = DeleteParams::default();
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()).delete(name, &delete).await.unwrap();
    Api::<ValidatingAdmissionPolicy>::all(client.clone()).delete(name, &delete).await.unwrap();
}

#[tokio::test]
async fn an_operator_killed_between_two_part_writes_leaves_the_last_config_serving() {
    let cluster = shared_cluster(env!("CARGO_BIN_EXE_waycast-cluster"));
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "parts").await.unwrap();
    let upstream = sink::start("127.0.0.1:0".parse().unwrap(), SinkOptions::default()).await.unwrap();
    let fleet = scale::fleet(&namespace, 2, 2, &format!("http://{upstream}/v1"));
    let post = PostParams::default();
    let (gateways, models, keys): (Api<Gateway>, Api<ModelEndpoint>, Api<ApiKey>) = (
        Api::namespaced(client.clone(), &namespace),
        Api::namespaced(client.clone(), &namespace),
        Api::namespaced(client.clone(), &namespace),
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);

    let mut operator = start_operator(&cluster.kubeconfig, &namespace, 1);
    let mut opened = fleet.gateway.clone();
    opened.spec.egress.get_or_insert_default().allowed_cidrs = vec!["127.0.0.0/8".into()];
    gateways.create(&post, &opened).await.unwrap();
    models.create(&post, &fleet.models[0]).await.unwrap();
    keys.create(&post, &fleet.keys[0]).await.unwrap();
    let (_gateway, gateway_addr) = start_gateway(&cluster.kubeconfig, &namespace, "gateway");
    let first_key = key_text(&secrets, "key-0").await;
    until_status(gateway_addr, &first_key, "model-0", 200, Duration::from_secs(60)).await;

    // The shard may not be written: a change to the base and to the shard
    // gets its base written and stops at its shard, before the manifest.
    let (base, shard) = (shards::base_secret_name(CONFIG), shards::shard_secret_name(CONFIG, 0, 1));
    let base_before = part_digest(&secrets, &base).await.unwrap();
    let shard_before = part_digest(&secrets, &shard).await.unwrap();
    let manifest_before = manifest_hash(&secrets).await.unwrap();
    let hold = refuse_updates(&client, &namespace, std::slice::from_ref(&shard)).await;
    // The key first: every compile from then on carries its refused shard.
    // (The model first, a compile between the two could write the model's
    // base and a manifest whole, a change of its own — seen in CI.)
    keys.create(&post, &fleet.keys[1]).await.unwrap();
    models.create(&post, &fleet.models[1]).await.unwrap();
    let second_key = key_text(&secrets, "key-1").await;
    let patience = within(Duration::from_secs(30)).every(Duration::from_millis(50));
    await_condition("the operator writes the new base", patience, async || {
        part_digest(&secrets, &base).await.as_ref() != Some(&base_before)
    })
    .await
    .unwrap();
    // Its shard refused (it tries again meanwhile), then killed there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(operator);
    assert_eq!(part_digest(&secrets, &shard).await.as_ref(), Some(&shard_before), "the shard write was refused");
    assert_eq!(
        manifest_hash(&secrets).await.as_ref(),
        Some(&manifest_before),
        "the manifest is written only after every part"
    );

    // The last whole config is served: the new model is unknown, the new
    // key is refused, the old key still works — for a while, not once. A
    // gateway started now finds the manifest's base rewritten: it serves
    // nothing rather than the new base without its shard.
    let (fresh, fresh_addr) = start_gateway(&cluster.kubeconfig, &namespace, "gateway-fresh");
    let mut fresh_answered = false;
    holds_for("the last whole config serves", Duration::from_secs(4), Duration::from_millis(100), async || {
        assert_eq!(chat_status(gateway_addr, &first_key, "model-0").await, Some(200), "the old config stopped serving");
        assert_eq!(
            chat_status(gateway_addr, &first_key, "model-1").await,
            Some(404),
            "the written base alone was served"
        );
        assert_eq!(
            chat_status(gateway_addr, &second_key, "model-0").await,
            Some(401),
            "a key no manifest names was served"
        );
        let fresh_model = chat_status(fresh_addr, &first_key, "model-1").await;
        assert_ne!(fresh_model, Some(200), "a gateway started meanwhile served the written base alone");
        fresh_answered |= fresh_model.is_some();
        true
    })
    .await
    .unwrap();
    assert!(fresh_answered, "the gateway started meanwhile never answered");

    // Allowed again, a new operator finishes the change.
    allow_updates(&client, &hold).await;
    operator = start_operator(&cluster.kubeconfig, &namespace, 2);
    until_status(gateway_addr, &second_key, "model-1", 200, Duration::from_secs(60)).await;
    until_status(gateway_addr, &first_key, "model-1", 200, Duration::from_secs(5)).await;
    // The gateway started during the hold was following the manifest all
    // along: it serves the finished change.
    until_status(fresh_addr, &second_key, "model-1", 200, Duration::from_secs(10)).await;
    drop((operator, fresh));
}

#[tokio::test]
async fn a_key_change_is_one_shard_and_the_manifest_and_a_duplicate_is_left_to_the_whole_compile() {
    let cluster = shared_cluster(env!("CARGO_BIN_EXE_waycast-cluster"));
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "lane").await.unwrap();
    let upstream = sink::start("127.0.0.1:0".parse().unwrap(), SinkOptions::default()).await.unwrap();
    let fleet = scale::fleet(&namespace, 3, 1, &format!("http://{upstream}/v1"));
    let post = PostParams::default();
    let (gateways, models, keys): (Api<Gateway>, Api<ModelEndpoint>, Api<ApiKey>) = (
        Api::namespaced(client.clone(), &namespace),
        Api::namespaced(client.clone(), &namespace),
        Api::namespaced(client.clone(), &namespace),
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let (_operator, admin) = start_operator_at(&cluster.kubeconfig, &namespace, 1);
    let mut opened = fleet.gateway.clone();
    opened.spec.egress.get_or_insert_default().allowed_cidrs = vec!["127.0.0.0/8".into()];
    gateways.create(&post, &opened).await.unwrap();
    models.create(&post, &fleet.models[0]).await.unwrap();
    for key in &fleet.keys {
        keys.create(&post, key).await.unwrap();
    }
    let (_gateway, gateway_addr) = start_gateway(&cluster.kubeconfig, &namespace, "lane-gateway");
    let last_key = key_text(&secrets, "key-2").await;
    until_status(gateway_addr, &last_key, "model-0", 200, Duration::from_secs(60)).await;
    // The whole reconciles the creation started have run.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let written = "waycast_operator_key_patches_total{outcome=\"written\"}";
    let left = "waycast_operator_key_patches_total{outcome=\"left\"}";
    let bytes = format!("waycast_operator_config_bytes_written_total{{gateway=\"{namespace}/gateway\"}}");
    // Four keys: one shard.
    let shard = shards::shard_secret_name(CONFIG, 0, 1);
    let one_change = async || data_bytes(&secrets, &shard).await + data_bytes(&secrets, CONFIG).await;

    // One more key, then that key revoked: each is its shard and the
    // manifest, written by the lane; the whole reconcile after it writes
    // nothing more.
    let (patches_before, bytes_before) =
        (operator_metric(&admin, written).await, operator_metric(&admin, &bytes).await);
    keys.create(&post, &waycast_mock::fixtures::objects::api_key(&namespace, "extra")).await.unwrap();
    let extra = key_text(&secrets, "extra").await;
    until_status(gateway_addr, &extra, "model-0", 200, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(operator_metric(&admin, written).await > patches_before, "the key lane wrote no patch");
    let added = operator_metric(&admin, &bytes).await - bytes_before;
    assert_eq!(added, one_change().await, "one key added: its shard and the manifest, once");

    let (patches_before, bytes_before) =
        (operator_metric(&admin, written).await, operator_metric(&admin, &bytes).await);
    let disable = serde_json::json!({"spec": {"disabled": true}});
    keys.patch("extra", &PatchParams::default(), &Patch::Merge(&disable)).await.unwrap();
    until_status(gateway_addr, &extra, "model-0", 401, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(operator_metric(&admin, written).await > patches_before, "the key lane wrote no patch");
    let revoked = operator_metric(&admin, &bytes).await - bytes_before;
    assert_eq!(revoked, one_change().await, "one key revoked: its shard and the manifest, once");
    assert_eq!(chat_status(gateway_addr, &extra, "model-0").await, Some(401), "the revoked key came back");

    // A key whose text another key serves: its Secret first (read by no
    // ApiKey yet: nothing to patch), then the ApiKey naming it, which the
    // lane refuses to patch in.
    let copy = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "copy-text", "labels": {"waycast.dev/api-key": "true"}},
        "stringData": {"key": last_key}});
    secrets.create(&post, &serde_json::from_value(copy).unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left_before = operator_metric(&admin, left).await;
    let duplicate = serde_json::json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey",
        "metadata": {"name": "copy", "namespace": namespace},
        "spec": {"secretRef": {"name": "copy-text", "key": "key"}}});
    keys.create(&post, &serde_json::from_value(duplicate).unwrap()).await.unwrap();
    let refused = await_object(&keys, "copy", "Ready says DuplicateKey", within(Duration::from_secs(30)), |key| {
        let status = key.status.clone().unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").cloned();
        match ready.filter(|c| c.reason == "DuplicateKey") {
            Some(ready) => Seen::Done(ready),
            None => Seen::NotYet(format!("{:?}", status.conditions)),
        }
    })
    .await
    .unwrap();
    assert_eq!(refused.status, "False");
    assert!(operator_metric(&admin, left).await > left_before, "the lane patched in a duplicate digest");
    let config = waycast_e2e::config_secrets::read_config(&client, &namespace, CONFIG).await.unwrap().config;
    let ids: Vec<&str> = config.keys.iter().map(|key| key.id.as_str()).collect();
    assert!(!ids.contains(&format!("{namespace}/copy").as_str()), "the duplicate was written: {ids:?}");
    assert!(ids.contains(&format!("{namespace}/key-2").as_str()), "the older key went: {ids:?}");
    assert_eq!(chat_status(gateway_addr, &last_key, "model-0").await, Some(200));
}
