//! `--config-secret` against a real API server: the gateway follows its
//! config Secret using a ServiceAccount token whose Role grants that one
//! Secret and nothing else, and applies updates within a second.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use waycast_crds::GatewayConfig;
use waycast_crds::config::KeyConfig;
use waycast_crds::shards;
use waycast_e2e::control_plane::client_from_kubeconfig;
use waycast_e2e::harness::{shared_cluster, test_namespace};
use waycast_e2e::wait::{await_condition, within};
use waycast_gateway::{ConfigSource, GatewayOptions};
use waycast_mock::fixtures::{self as fixture, ALICE_KEY, BOB_KEY};
use waycast_mock::upstream::{self as mock_upstream, MockOptions};

const CHAT: &str = r#"{"model":"mistral-7b","messages":[]}"#;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn config_secret(name: &str, config: &GatewayConfig) -> Secret {
    let json = config.to_canonical_json().unwrap();
    Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        data: Some([("config.json.gz".to_owned(), ByteString(gzip(&json)))].into()),
        ..Secret::default()
    }
}

/// A client that authenticates as `namespace/account` with a fresh token.
async fn service_account_client(
    admin: &Client,
    namespace: &str,
    account: &str,
    kubeconfig: &std::path::Path,
) -> Client {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..TokenRequestSpec::default() },
        ..TokenRequest::default()
    };
    let token = accounts.create_token_request(account, &PostParams::default(), &request).await.unwrap();
    let token = token.status.unwrap().token;
    let admin_config = std::fs::read_to_string(kubeconfig).unwrap();
    let server = admin_config.lines().find_map(|l| l.trim().strip_prefix("server: ")).unwrap();
    let ca = admin_config.lines().find_map(|l| l.trim().strip_prefix("certificate-authority: ")).unwrap();
    let path = fixture::temp_dir("sa-kubeconfig").join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: {server}, certificate-authority: {ca}}}}}]\n\
             users: [{{name: u, user: {{token: {token}}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    client_from_kubeconfig(&path).await.unwrap()
}

/// A ServiceAccount `gateway` whose Role may read the Secrets `readable`
/// and nothing else.
async fn restrict(admin: &Client, namespace: &str, readable: Vec<String>) {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    accounts
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta { name: Some("gateway".into()), ..ObjectMeta::default() },
                ..ServiceAccount::default()
            },
        )
        .await
        .unwrap();
    let role = Role {
        metadata: ObjectMeta { name: Some("gateway".into()), ..ObjectMeta::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(readable),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), namespace).create(&PostParams::default(), &role).await.unwrap();
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("gateway".into()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "gateway".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "gateway".into(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace).create(&PostParams::default(), &binding).await.unwrap();
}

/// A gateway following config Secret `gw-config` with `restricted`.
async fn start_gateway(restricted: Client, namespace: &str) -> waycast_gateway::RunningGateway {
    waycast_gateway::start(GatewayOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        config: ConfigSource::Secret { client: restricted, namespace: namespace.to_owned(), name: "gw-config".into() },
        endpoints: None,
        usage: None,
        tls: None,
        drain_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(5),
        header_read_timeout: Duration::from_secs(5),
        max_connections: waycast_gateway::DEFAULT_MAX_CONNECTIONS,
        idle_timeout: waycast_gateway::DEFAULT_IDLE_TIMEOUT,
        heartbeat: None,
        workers: None,
        telemetry: None,
    })
    .await
    .unwrap()
}

/// The status a chat request with a key gets from the gateway at `addr`.
fn status_probe(
    addr: SocketAddr,
) -> impl Fn(&'static str) -> std::pin::Pin<Box<dyn Future<Output = Option<StatusCode>>>> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let url = format!("http://{addr}/v1/chat/completions");
    move |key| {
        let (client, url) = (client.clone(), url.clone());
        Box::pin(
            async move { client.request(fixture::post_request(&url, Some(key), CHAT)).await.map(|r| r.status()).ok() },
        )
    }
}

/// The shared cluster, an admin client, a fresh namespace `prefix-…`, a
/// mock upstream and a config whose one key is Alice's.
async fn cluster_and_config(
    prefix: &str,
) -> (&'static waycast_e2e::harness::SharedCluster, Client, String, mock_upstream::MockUpstream, GatewayConfig) {
    let cluster = shared_cluster(env!("CARGO_BIN_EXE_waycast-cluster"));
    let admin = cluster.client().await;
    let namespace = test_namespace(&admin, prefix).await.unwrap();
    let mock = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap();
    let mut config = fixture::default_config(&mock.base_url());
    config.keys.retain(|k| k.id == "team-a/alice");
    (cluster, admin, namespace, mock, config)
}

#[tokio::test]
async fn follows_its_secret_with_a_token_that_can_read_only_that_secret() {
    let (cluster, admin, namespace, _mock, mut config) = cluster_and_config("config-secret").await;

    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &namespace);
    secrets.create(&PostParams::default(), &config_secret("gw-config", &config)).await.unwrap();
    secrets.create(&PostParams::default(), &config_secret("someone-elses", &config)).await.unwrap();
    restrict(&admin, &namespace, vec!["gw-config".into()]).await;
    let restricted = service_account_client(&admin, &namespace, "gateway", &cluster.kubeconfig).await;
    // The token is as narrow as promised.
    let visible: Api<Secret> = Api::namespaced(restricted.clone(), &namespace);
    let refused = visible.get("someone-elses").await.unwrap_err();
    assert!(matches!(refused, kube::Error::Api(ref status) if status.code == 403), "{refused}");

    let gateway = start_gateway(restricted, &namespace).await;
    let status_for = status_probe(gateway.public_addr);
    let patience = within(Duration::from_secs(10)).every(Duration::from_millis(20));
    await_condition("the gateway loads its config from the Secret", patience, async || {
        status_for(ALICE_KEY).await == Some(StatusCode::OK)
    })
    .await
    .unwrap();

    // Each update is served within a second: add Bob, then remove him, five times.
    let mut latencies = Vec::new();
    for round in 0..10 {
        let adding = round % 2 == 0;
        if adding {
            let mut bob = KeyConfig::new("team-b/bob", fixture::sha256_hex(BOB_KEY));
            bob.models = Some(vec!["*".into()]);
            config.keys.push(bob);
        } else {
            config.keys.retain(|k| k.id != "team-b/bob");
        }
        let expected = if adding { StatusCode::OK } else { StatusCode::UNAUTHORIZED };
        let applied = Instant::now();
        secrets
            .patch(
                "gw-config",
                &PatchParams::apply("waycast-e2e").force(),
                &Patch::Apply(config_secret("gw-config", &config)),
            )
            .await
            .unwrap();
        let patience = within(Duration::from_secs(5)).every(Duration::from_millis(5));
        await_condition(format!("update {round} is applied"), patience, async || {
            status_for(BOB_KEY).await == Some(expected)
        })
        .await
        .unwrap();
        latencies.push(applied.elapsed());
    }
    latencies.sort();
    eprintln!(
        "config Secret update → served: p50 {:?}, max {:?} over {} updates",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
        latencies.len()
    );
    assert!(latencies[latencies.len() - 1] < Duration::from_secs(1), "{latencies:?}");

    // A broken config in the Secret leaves the last good one serving.
    let broken = Secret {
        metadata: ObjectMeta { name: Some("gw-config".into()), ..ObjectMeta::default() },
        data: Some([("config.json.gz".to_owned(), ByteString(gzip(b"{\"apiVersion\":\"nope\"}")))].into()),
        ..Secret::default()
    };
    secrets.patch("gw-config", &PatchParams::apply("waycast-e2e").force(), &Patch::Apply(broken)).await.unwrap();
    let patience = within(Duration::from_secs(5)).every(Duration::from_millis(10));
    await_condition("the broken config is noticed", patience, async || {
        gateway.shared.metrics.config_reload_errors.get() > 0
    })
    .await
    .unwrap();
    assert_eq!(status_for(ALICE_KEY).await, Some(StatusCode::OK));
    gateway.shutdown().await;
}

/// A part of a config in parts, as the operator writes it.
fn part_secret(name: &str, json: &[u8]) -> Secret {
    let digest = waycast_crds::digest::sha256_hex(json);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some([(shards::PART_DIGEST_ANNOTATION.to_owned(), digest)].into()),
            ..ObjectMeta::default()
        },
        data: Some([(shards::SECRET_KEY_PART.to_owned(), ByteString(gzip(json)))].into()),
        ..Secret::default()
    }
}

fn manifest_secret(name: &str, manifest: &shards::Manifest) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        data: Some(
            [(shards::SECRET_KEY_MANIFEST.to_owned(), ByteString(manifest.to_canonical_json().unwrap()))].into(),
        ),
        ..Secret::default()
    }
}

async fn put(secrets: &Api<Secret>, secret: &Secret) {
    let name = secret.metadata.name.clone().unwrap();
    secrets.patch(&name, &PatchParams::apply("waycast-e2e").force(), &Patch::Apply(secret)).await.unwrap();
}

/// A config in parts: the gateway reads the base and the key shards a
/// manifest names, by name, with a token that may read only those; it
/// swaps a new config in only once every part the manifest names is the
/// one named (a manifest ahead of its shard leaves the last good config
/// serving), and a one-shard change reaches it within a second.
#[tokio::test]
async fn a_config_in_parts_is_served_only_whole() {
    const SALT: &str = "0123456789abcdef";
    const SHARDS: u32 = 4;
    let (cluster, admin, namespace, _mock, mut config) = cluster_and_config("config-parts").await;
    for filler in 0..200 {
        config.keys.push(KeyConfig::new(format!("team-c/filler-{filler}"), fixture::sha256_hex(&format!("k{filler}"))));
    }
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &namespace);
    let names: Vec<String> = std::iter::once(shards::base_secret_name("gw-config"))
        .chain((0..SHARDS).map(|index| shards::shard_secret_name("gw-config", index, SHARDS)))
        .collect();
    // Writes the parts (those in `only` when given), then the manifest.
    let write = |config: GatewayConfig, only: Option<Vec<usize>>, manifest: bool| {
        let (secrets, names) = (secrets.clone(), names.clone());
        async move {
            let parts = shards::split(&config, SALT, SHARDS).unwrap();
            let bodies: Vec<&Vec<u8>> = std::iter::once(&parts.base).chain(&parts.shards).collect();
            for (at, (name, body)) in names.iter().zip(bodies).enumerate() {
                if only.as_ref().is_none_or(|only| only.contains(&at)) {
                    put(&secrets, &part_secret(name, body)).await;
                }
            }
            if manifest {
                put(&secrets, &manifest_secret("gw-config", &parts.manifest)).await;
            }
            parts
        }
    };
    write(config.clone(), None, true).await;
    let mut readable = names.clone();
    readable.push("gw-config".into());
    restrict(&admin, &namespace, readable).await;
    let restricted = service_account_client(&admin, &namespace, "gateway", &cluster.kubeconfig).await;
    let gateway = start_gateway(restricted, &namespace).await;
    let status_for = status_probe(gateway.public_addr);
    let patience = within(Duration::from_secs(10)).every(Duration::from_millis(20));
    await_condition("the gateway assembles its config from its parts", patience, async || {
        status_for(ALICE_KEY).await == Some(StatusCode::OK)
    })
    .await
    .unwrap();
    let served = gateway.shared.config.current().unwrap();
    let first = shards::split(&config, SALT, SHARDS).unwrap().manifest.hash().unwrap();
    assert_eq!(served.hash, first, "known by its manifest's digest");

    // Bob's shard changes; the manifest naming it is written first.
    let mut bob = KeyConfig::new("team-b/bob", fixture::sha256_hex(BOB_KEY));
    bob.models = Some(vec!["*".into()]);
    config.keys.push(bob);
    let bobs = 1 + shards::shard_of(SALT, "team-b/bob", SHARDS) as usize;
    let parts = write(config.clone(), Some(vec![]), true).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(status_for(BOB_KEY).await, Some(StatusCode::UNAUTHORIZED), "a manifest ahead of its shard");
    assert_eq!(status_for(ALICE_KEY).await, Some(StatusCode::OK), "the last good config serves meanwhile");
    assert_eq!(gateway.shared.config.current().unwrap().hash, first);
    // Its shard, then: the config is whole.
    write(config.clone(), Some(vec![bobs]), false).await;
    let patience = within(Duration::from_secs(5)).every(Duration::from_millis(10));
    await_condition("the whole set is swapped in", patience, async || {
        status_for(BOB_KEY).await == Some(StatusCode::OK)
    })
    .await
    .unwrap();
    assert_eq!(gateway.shared.config.current().unwrap().hash, parts.manifest.hash().unwrap());

    // One key at a time, its shard then the manifest, as the operator does.
    let mut latencies = Vec::new();
    for round in 0..6 {
        let adding = round % 2 == 1;
        if adding {
            config.keys.push(KeyConfig::new("team-b/bob", fixture::sha256_hex(BOB_KEY)));
            if let Some(key) = config.keys.last_mut() {
                key.models = Some(vec!["*".into()]);
            }
        } else {
            config.keys.retain(|k| k.id != "team-b/bob");
        }
        let expected = if adding { StatusCode::OK } else { StatusCode::UNAUTHORIZED };
        let applied = Instant::now();
        write(config.clone(), Some(vec![bobs]), true).await;
        let patience = within(Duration::from_secs(5)).every(Duration::from_millis(5));
        await_condition(format!("change {round} is served"), patience, async || {
            status_for(BOB_KEY).await == Some(expected)
        })
        .await
        .unwrap();
        latencies.push(applied.elapsed());
    }
    latencies.sort();
    eprintln!("one-shard change → served: p50 {:?}, max {:?}", latencies[latencies.len() / 2], latencies[5]);
    assert!(latencies[5] < Duration::from_secs(1), "{latencies:?}");

    // A shard that is not gzip: refused, counted, the last config serves.
    let errors = gateway.shared.metrics.config_reload_errors.get();
    let mut broken = part_secret(&names[bobs], b"{}");
    broken.data = Some([(shards::SECRET_KEY_PART.to_owned(), ByteString(b"not gzip".to_vec()))].into());
    put(&secrets, &broken).await;
    let mut manifest = shards::split(&config, SALT, SHARDS).unwrap().manifest;
    manifest.shards[bobs - 1] = waycast_crds::digest::sha256_hex(b"another");
    put(&secrets, &manifest_secret("gw-config", &manifest)).await;
    let patience = within(Duration::from_secs(5)).every(Duration::from_millis(10));
    await_condition("the unreadable shard is noticed", patience, async || {
        gateway.shared.metrics.config_reload_errors.get() != errors
    })
    .await
    .unwrap();
    assert_eq!(status_for(ALICE_KEY).await, Some(StatusCode::OK));
    // Refused under the manifest's digest: the heartbeat says why.
    let refused = gateway.shared.config.refused().expect("the refusal is kept for the heartbeat");
    assert_eq!(refused.hash, manifest.hash().unwrap());
    assert!(refused.reason.contains(&names[bobs]), "{}", refused.reason);
    gateway.shutdown().await;
}
