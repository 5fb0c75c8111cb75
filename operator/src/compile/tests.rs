//! Table-driven tests of compile, with fixture builders.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use waycast_crds::common::{ParentReference, SecretKeyRef};
use waycast_crds::condition::reasons;
use waycast_crds::config::RedisConfig;
use waycast_crds::gateway::{NamespaceFrom, NamespacePolicy, RouteSelector};
use waycast_crds::model_endpoint::{Backend, BackendAuth, ServiceBackend};
use waycast_crds::period::Period;
use waycast_crds::sharing::KeyLimits;
use waycast_crds::spend::{Budget, BudgetConfig, GatewayBudgets};
use waycast_crds::{ApiKey, ApiKeySpec, Gateway, GatewaySpec, ModelEndpoint};

use super::*;
use crate::catalog::Catalog;
use waycast_mock::fixtures::objects;

const KEY_A: &str = "wc_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const KEY_B: &str = "wc_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta { namespace: Some(namespace.into()), name: Some(name.into()), ..ObjectMeta::default() }
}

fn at(seconds: i64) -> Time {
    Time(jiff::Timestamp::from_second(seconds).unwrap())
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(2_000_000_000).unwrap()
}

fn gateway(namespace: &str, spec: GatewaySpec) -> Gateway {
    let mut gateway = objects::gateway(namespace, "gw");
    gateway.spec = spec;
    gateway
}

fn service_backend(name: &str, port: i32) -> Backend {
    Backend { service: Some(ServiceBackend { name: name.into(), port, base_path: None }), ..Backend::default() }
}

fn model_endpoint(namespace: &str, name: &str, created: i64, model: &str, backends: Vec<Backend>) -> ModelEndpoint {
    let mut endpoint = objects::model_endpoint(namespace, name, model);
    endpoint.metadata.creation_timestamp = Some(at(created));
    endpoint.spec.backends = backends;
    endpoint
}

fn service(namespace: &str, name: &str, ip: &str, port: i32) -> Service {
    Service {
        metadata: meta(namespace, name),
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            ports: Some(vec![ServicePort { port, ..ServicePort::default() }]),
            selector: Some([("app".to_owned(), name.to_owned())].into()),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn secret(namespace: &str, name: &str, key: &str, value: &str) -> Secret {
    Secret {
        metadata: meta(namespace, name),
        data: Some([(key.to_owned(), ByteString(value.as_bytes().to_vec()))].into()),
        ..Secret::default()
    }
}

fn api_key(namespace: &str, name: &str, spec: ApiKeySpec) -> ApiKey {
    let mut key = objects::api_key(namespace, name);
    // The uid its generated key Secret names as owner (`key_secret`).
    key.metadata.uid = Some(format!("uid-{name}"));
    key.spec = spec;
    key
}

/// The generated key Secret of ApiKey `api_key`, owned by it.
fn key_secret(namespace: &str, api_key: &str, value: &str) -> Secret {
    let mut secret = secret(namespace, &format!("{api_key}-key"), "api-key", value);
    secret.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        uid: format!("uid-{api_key}"),
        controller: Some(true),
        ..Default::default()
    }]);
    secret
}

/// A Secret its team opted in as an upstream credential.
fn credential(namespace: &str, name: &str, key: &str, value: &str) -> Secret {
    let mut secret = secret(namespace, name, key, value);
    secret.metadata.labels = Some([(secrets::CREDENTIAL_LABEL.to_owned(), "true".to_owned())].into());
    secret
}

fn parent(namespace: &str, name: &str) -> Vec<ParentReference> {
    vec![ParentReference { name: name.into(), namespace: Some(namespace.into()) }]
}

fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    let mut metadata = ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() };
    metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    Namespace { metadata, ..Namespace::default() }
}

struct World {
    gateway: Gateway,
    namespaces: Vec<Namespace>,
    models: Vec<ModelEndpoint>,
    keys: Vec<ApiKey>,
    services: Vec<Service>,
    secrets: Vec<Secret>,
}

impl World {
    fn quickstart() -> Self {
        let mut llama = model_endpoint("demo", "llama", 100, "llama-3.1-8b", vec![service_backend("vllm", 8000)]);
        llama.spec.aliases = vec!["llama3".into()];
        llama.spec.backends[0].model = Some("meta-llama/Llama-3.1-8B-Instruct".into());
        Self {
            gateway: gateway("demo", GatewaySpec::default()),
            namespaces: vec![namespace("demo", &[])],
            models: vec![llama],
            keys: vec![api_key(
                "demo",
                "alice",
                ApiKeySpec { models: Some(vec!["llama-*".into()]), ..ApiKeySpec::default() },
            )],
            services: vec![service("demo", "vllm", "10.96.0.50", 8000)],
            secrets: vec![key_secret("demo", "alice", KEY_A)],
        }
    }

    /// The Gateway takes ModelEndpoints from every namespace, and team-b
    /// runs an Ollama Service.
    fn with_team_b(mut self) -> Self {
        self.namespaces.push(namespace("team-b", &[]));
        self.gateway.spec.model_endpoints = Some(RouteSelector {
            namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
            selector: None,
        });
        self.services.push(service("team-b", "ollama", "10.96.0.60", 11434));
        self
    }

    fn compile(&self) -> Compiled {
        let catalog = Catalog::from_objects(&self.namespaces, &self.models, &self.keys, &self.services, &self.secrets);
        let compiled = catalog.compile(&self.gateway, now());
        compiled.config.validate().unwrap_or_else(|problems| panic!("compile produced an invalid config: {problems}"));
        compiled
    }
}

fn key(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey { namespace: namespace.into(), name: name.into() }
}

#[test]
fn the_quickstart_compiles_to_a_served_route_and_key() {
    let world = World::quickstart();
    let compiled = world.compile();
    let route = &compiled.config.models[0];
    assert_eq!(route.name, "llama-3.1-8b");
    assert_eq!(route.aliases, ["llama3"]);
    assert_eq!(route.backends[0].url, "http://10.96.0.50:8000/v1");
    assert_eq!(route.backends[0].model.as_deref(), Some("meta-llama/Llama-3.1-8B-Instruct"));
    assert_eq!(route.source.as_deref(), Some("demo/llama"));
    let entry = &compiled.config.keys[0];
    assert_eq!(entry.id, "demo/alice");
    assert_eq!(entry.sha256, waycast_crds::digest::sha256_hex(KEY_A.as_bytes()));
    assert_eq!(entry.models.as_deref(), Some(&["llama-*".to_owned()][..]));
    assert!(compiled.models[&key("demo", "llama")].accepted);
    let verdict = &compiled.keys[&key("demo", "alice")];
    assert_eq!((verdict.verdict.reason, verdict.key_prefix.as_deref()), (reasons::KEY_READY, Some("wc_aaa")));
    // Its status names the Secret it reads (generated: `<name>-key`).
    assert_eq!(keys::generated_secret_name("alice"), "alice-key");
}

#[test]
fn output_is_deterministic_and_carries_no_plaintext_key() {
    let mut world = World::quickstart();
    let first = world.compile().config.to_canonical_json().unwrap();
    // Same objects in another order: same bytes.
    world.models.push(model_endpoint(
        "demo",
        "mistral",
        50,
        "mistral",
        vec![Backend { url: Some("https://api.example.com/v1".into()), ..Backend::default() }],
    ));
    world.models.reverse();
    let reordered = world.compile().config.to_canonical_json().unwrap();
    world.models.reverse();
    assert_eq!(world.compile().config.to_canonical_json().unwrap(), reordered);
    assert_ne!(first, reordered);
    assert!(!String::from_utf8_lossy(&reordered).contains(KEY_A));
}

#[test]
fn the_oldest_claim_to_a_model_name_wins_and_the_next_takes_over_when_it_goes() {
    let mut world = World::quickstart();
    let mut copy = model_endpoint("demo", "llama-copy", 200, "llama3", vec![service_backend("ollama", 11434)]);
    copy.spec.aliases = vec!["other".into()];
    world.services.push(service("demo", "ollama", "10.96.0.60", 11434));
    world.models.push(copy);
    let compiled = world.compile();
    let loser = &compiled.models[&key("demo", "llama-copy")];
    assert_eq!(loser.reason, reasons::MODEL_NAME_CONFLICT);
    assert!(loser.message.contains("demo/llama"), "{}", loser.message);
    assert_eq!(compiled.config.models.len(), 1);

    world.models.remove(0);
    let compiled = world.compile();
    assert!(compiled.models[&key("demo", "llama-copy")].accepted);
    assert_eq!(compiled.config.models[0].backends[0].url, "http://10.96.0.60:11434/v1");
}

#[test]
fn bad_backend_references_fail_only_their_own_route() {
    let mut world = World::quickstart();
    world.models.push(model_endpoint("demo", "no-service", 300, "a", vec![service_backend("missing", 80)]));
    world.models.push(model_endpoint("demo", "no-port", 301, "b", vec![service_backend("vllm", 9999)]));
    let mut headless = service("demo", "headless", "None", 80);
    headless.metadata.name = Some("headless".into());
    world.services.push(headless);
    world.models.push(model_endpoint("demo", "headless", 302, "c", vec![service_backend("headless", 80)]));
    let mut no_secret = model_endpoint(
        "demo",
        "no-secret",
        303,
        "d",
        vec![Backend { url: Some("https://x.example/v1".into()), ..Backend::default() }],
    );
    no_secret.spec.backends[0].auth =
        Some(BackendAuth { secret_ref: SecretKeyRef { name: "creds".into(), key: "k".into() }, header: None });
    world.models.push(no_secret);
    let compiled = world.compile();
    for (name, reason) in [
        ("no-service", reasons::BACKEND_NOT_FOUND),
        ("no-port", reasons::BACKEND_NOT_FOUND),
        ("no-secret", reasons::AUTH_SECRET_MISSING),
    ] {
        let verdict = &compiled.models[&key("demo", name)];
        assert_eq!((verdict.accepted, verdict.reason), (false, reason), "{name}: {}", verdict.message);
    }
    assert!(compiled.models[&key("demo", "llama")].accepted, "the good route is untouched");
    // A headless Service is served through its endpoints, its DNS name the fallback.
    assert!(compiled.models[&key("demo", "headless")].accepted);
    let headless = compiled.config.models.iter().find(|m| m.name == "c").unwrap();
    assert_eq!(headless.backends[0].url, "http://headless.demo.svc:80/v1");
    assert_eq!(headless.backends[0].endpoints.as_deref(), Some("demo/headless:80"));
    assert_eq!(compiled.config.models.len(), 2);
}

#[test]
fn upstream_credentials_go_into_headers() {
    let mut world = World::quickstart();
    world.secrets.push(credential("demo", "openai", "api-key", "sk-upstream\n"));
    let auth = |header: Option<&str>| BackendAuth {
        secret_ref: SecretKeyRef { name: "openai".into(), key: "api-key".into() },
        header: header.map(Into::into),
    };
    let mut openai = model_endpoint(
        "demo",
        "gpt",
        10,
        "gpt-4o",
        vec![Backend { url: Some("https://api.openai.com/v1".into()), auth: Some(auth(None)), ..Backend::default() }],
    );
    openai.spec.backends.push(Backend {
        url: Some("https://proxy.example/v1".into()),
        auth: Some(auth(Some("X-Api-Key"))),
        weight: Some(0),
        ..Backend::default()
    });
    world.models.push(openai);
    let compiled = world.compile();
    let route = compiled.config.models.iter().find(|m| m.name == "gpt-4o").unwrap();
    assert_eq!(
        route.backends[0].headers,
        BTreeMap::from([("authorization".to_owned(), "Bearer sk-upstream".to_owned())])
    );
    assert_eq!(route.backends[1].headers, BTreeMap::from([("x-api-key".to_owned(), "sk-upstream".to_owned())]));
    assert_eq!(route.backends[1].weight, 0);
}

#[test]
fn key_verdicts() {
    let mut world = World::quickstart();
    let user_key = |name: &str| ApiKeySpec {
        secret_ref: Some(SecretKeyRef { name: name.into(), key: "key".into() }),
        ..ApiKeySpec::default()
    };
    world.secrets.push(secret("demo", "short", "key", "too-short"));
    world.secrets.push(secret("demo", "partner", "key", KEY_B));
    world.secrets.push(secret("demo", "same-as-alice", "key", KEY_A));
    world.secrets.push(key_secret("demo", "off", KEY_B));
    world.secrets.push(key_secret("demo", "old", "wc_cccccccccccccccccccccccccccccccccccccccccccc"));
    world.keys.extend([
        api_key("demo", "missing", ApiKeySpec::default()),
        api_key("demo", "short", user_key("short")),
        api_key(
            "demo",
            "partner",
            ApiKeySpec {
                limits: Some(KeyLimits { requests_per_minute: Some(60), ..KeyLimits::default() }),
                ..user_key("partner")
            },
        ),
        api_key("demo", "same-as-alice", user_key("same-as-alice")),
        api_key("demo", "off", ApiKeySpec { disabled: true, ..ApiKeySpec::default() }),
        api_key("demo", "old", ApiKeySpec { expires_at: Some(at(1_000)), ..ApiKeySpec::default() }),
    ]);
    let compiled = world.compile();
    let reason = |name: &str| compiled.keys[&key("demo", name)].verdict.reason;
    assert_eq!(reason("missing"), reasons::SECRET_MISSING);
    assert_eq!(reason("short"), reasons::KEY_TOO_SHORT);
    assert_eq!(reason("partner"), reasons::KEY_READY);
    assert_eq!(reason("same-as-alice"), reasons::DUPLICATE_KEY);
    assert_eq!(reason("off"), reasons::DISABLED);
    assert_eq!(reason("old"), reasons::EXPIRED);
    let served: Vec<&str> = compiled.config.keys.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(served, ["demo/alice", "demo/partner"]);
    assert_eq!(compiled.config.keys[1].limits.unwrap().requests_per_minute, Some(60));
}

/// Of two ApiKeys holding the same key text, the older is served, whatever
/// their names; the config still lists keys in name order.
#[test]
fn a_duplicate_key_is_decided_by_age_not_by_name() {
    let mut world = World::quickstart();
    let shared = "wc_dddddddddddddddddddddddddddddddddddddddddddd";
    world.secrets.push(secret("demo", "a-new", "key", shared));
    world.secrets.push(secret("demo", "z-old", "key", shared));
    let user_key = |name: &str, created: i64| {
        let mut api_key = api_key(
            "demo",
            name,
            ApiKeySpec {
                secret_ref: Some(SecretKeyRef { name: name.into(), key: "key".into() }),
                ..ApiKeySpec::default()
            },
        );
        api_key.metadata.creation_timestamp = Some(at(created));
        api_key
    };
    world.keys.extend([user_key("a-new", 9_000), user_key("z-old", 1_000)]);
    let compiled = world.compile();
    assert_eq!(compiled.keys[&key("demo", "z-old")].verdict.reason, reasons::KEY_READY);
    assert_eq!(compiled.keys[&key("demo", "a-new")].verdict.reason, reasons::DUPLICATE_KEY);
    let served: Vec<&str> = compiled.config.keys.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(served, ["demo/alice", "demo/z-old"]);
}

#[test]
fn namespace_selectors_pick_team_namespaces() {
    let mut world = World::quickstart();
    world.gateway = gateway("platform", GatewaySpec::default());
    let teams = RouteSelector {
        namespaces: Some(NamespacePolicy {
            from: NamespaceFrom::Selector,
            selector: Some(LabelSelector {
                match_labels: Some([("waycast.dev/team".to_owned(), "enabled".to_owned())].into()),
                ..LabelSelector::default()
            }),
        }),
        selector: None,
    };
    world.gateway.spec.model_endpoints = Some(teams.clone());
    world.gateway.spec.api_keys = Some(teams);
    for model in &mut world.models {
        model.spec.parent_refs = parent("platform", "gw");
    }
    for key in &mut world.keys {
        key.spec.parent_refs = parent("platform", "gw");
    }
    let compiled = world.compile();
    assert!(compiled.config.models.is_empty() && compiled.config.keys.is_empty(), "demo is not a team namespace");
    world.namespaces = vec![namespace("demo", &[("waycast.dev/team", "enabled")])];
    let compiled = world.compile();
    assert_eq!((compiled.config.models.len(), compiled.config.keys.len()), (1, 1));
}

#[test]
fn gateway_settings_reach_the_config() {
    let mut world = World::quickstart();
    world.gateway.spec.limits =
        Some(waycast_crds::gateway::GatewayLimits { max_request_body_bytes: Some(1024), max_connections: None });
    world.gateway.spec.logging = Some(waycast_crds::gateway::GatewayLogging { level: None, access_log: Some(false) });
    let settings = world.compile().config.settings;
    assert_eq!((settings.max_request_body_bytes, settings.access_log), (1024, false));
}

#[test]
fn redis_counting_reaches_the_config_with_its_password_or_the_gateway_says_why_not() {
    use waycast_crds::gateway::{FailureMode, GatewayRateLimit, RedisRateLimit};
    let mut world = World::quickstart();
    world.gateway.spec.rate_limit = Some(GatewayRateLimit {
        redis: Some(RedisRateLimit {
            address: "redis.infra:6379".into(),
            password_secret_ref: Some(SecretKeyRef { name: "redis".into(), key: "password".into() }),
            username: Some("limiter".into()),
            timeout: Some("50ms".into()),
            tls: None,
        }),
        failure_mode: Some(FailureMode::Closed),
    });
    assert_eq!(
        secrets::redis_secrets(&world.gateway),
        vec![("demo".to_owned(), "redis".to_owned())],
        "the shell fetches the password Secret"
    );

    let missing = world.compile();
    assert_eq!(missing.config.settings.redis, None, "no password: the pods keep counting their shares");
    let refused = missing.gateway.expect("the Gateway says why");
    assert_eq!(refused.reason, reasons::AUTH_SECRET_MISSING);
    assert!(refused.message.contains("demo/redis"), "{}", refused.message);

    world.secrets.push(secret("demo", "redis", "password", "s3cret\n"));
    let compiled = world.compile();
    assert_eq!(compiled.gateway, None);
    assert_eq!(
        compiled.config.settings.redis,
        Some(RedisConfig {
            address: "redis.infra:6379".into(),
            password: Some("s3cret".into()),
            username: Some("limiter".into()),
            timeout: std::time::Duration::from_millis(50),
            fail_closed: true,
            tls: None,
            key_prefix: Some("waycast:demo/gw:".into()),
        })
    );

    // TLS: the CA and the client pair come from the Gateway's namespace,
    // each named in the refusal while missing.
    let redis = world.gateway.spec.rate_limit.as_mut().and_then(|limits| limits.redis.as_mut()).unwrap();
    redis.tls = Some(waycast_crds::common::ClientTls {
        ca_secret_ref: Some(SecretKeyRef { name: "redis-ca".into(), key: "ca.crt".into() }),
        client_cert_secret_ref: Some(waycast_crds::common::SecretRef { name: "redis-client".into() }),
        server_name: Some("redis.infra.svc".into()),
    });
    assert_eq!(
        secrets::redis_secrets(&world.gateway),
        ["redis", "redis-ca", "redis-client"].map(|name| ("demo".to_owned(), name.to_owned())).to_vec()
    );
    let refused = world.compile().gateway.expect("the CA is missing");
    assert!(
        refused.message.contains("tls.caSecretRef") && refused.message.contains("demo/redis-ca"),
        "{}",
        refused.message
    );
    world.secrets.push(secret("demo", "redis-ca", "ca.crt", "CA PEM"));
    let refused = world.compile().gateway.expect("the client pair is missing");
    assert!(refused.message.contains("tls.clientCertSecretRef"), "{}", refused.message);
    let mut pair = secret("demo", "redis-client", "tls.crt", "CERT PEM");
    pair.data.as_mut().unwrap().insert("tls.key".into(), k8s_openapi::ByteString(b"KEY PEM".to_vec()));
    world.secrets.push(pair);
    let compiled = world.compile();
    assert_eq!(compiled.gateway, None);
    let tls = compiled.config.settings.redis.and_then(|redis| redis.tls).unwrap();
    assert_eq!(tls.ca_pem.as_deref(), Some("CA PEM"));
    assert_eq!(tls.client_cert_pem.as_deref(), Some("CERT PEM"));
    assert_eq!(tls.client_key_pem.as_deref(), Some("KEY PEM"));
    assert_eq!(tls.server_name.as_deref(), Some("redis.infra.svc"));
}

/// Two-way consent: a Gateway in any namespace with `from: All` takes only
/// what names it; what names it from a namespace it does not admit is not
/// served either.
#[test]
fn a_gateway_takes_only_objects_that_name_it_from_namespaces_it_admits() {
    let mut world = World::quickstart();
    world.gateway = gateway("rogue", GatewaySpec::default());
    let all = RouteSelector {
        namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
        selector: None,
    };
    world.gateway.spec.model_endpoints = Some(all.clone());
    world.gateway.spec.api_keys = Some(all);
    let compiled = world.compile();
    assert!(compiled.config.models.is_empty() && compiled.config.keys.is_empty());
    assert!(compiled.models.is_empty() && compiled.keys.is_empty(), "no verdicts: it is no one's parent");
    world.models[0].spec.parent_refs = parent("rogue", "gw");
    world.keys[0].spec.parent_refs = parent("rogue", "gw");
    let compiled = world.compile();
    assert_eq!((compiled.config.models.len(), compiled.config.keys.len()), (1, 1), "named: served");
    world.gateway.spec.model_endpoints = None;
    world.gateway.spec.api_keys = None;
    let compiled = world.compile();
    assert!(compiled.config.models.is_empty() && compiled.config.keys.is_empty(), "named, but not admitted");
}

/// Whose keys may call a model: the model's namespace by default, every
/// namespace with `All`, labelled namespaces with `Selector`.
#[test]
fn model_visibility_becomes_key_namespaces() {
    use waycast_crds::model_endpoint::ModelVisibility;
    let mut world = World::quickstart();
    world.namespaces.extend([namespace("team-a", &[("share", "yes")]), namespace("team-b", &[])]);
    let visible = |world: &World| world.compile().config.models[0].key_namespaces.clone();
    assert_eq!(visible(&world), Some(vec!["demo".to_owned()]));
    let policy = |from, selector: Option<&str>| {
        Some(ModelVisibility {
            namespaces: Some(NamespacePolicy {
                from,
                selector: selector.map(|value| LabelSelector {
                    match_labels: Some([("share".to_owned(), value.to_owned())].into()),
                    ..LabelSelector::default()
                }),
            }),
        })
    };
    world.models[0].spec.api_keys = policy(NamespaceFrom::All, None);
    assert_eq!(visible(&world), None);
    world.models[0].spec.api_keys = policy(NamespaceFrom::Selector, Some("yes"));
    assert_eq!(visible(&world), Some(vec!["team-a".to_owned()]));
}

/// A name is its namespace's own: a team's model named like the
/// platform's is another model (its entry names its namespace), not a
/// conflict.
#[test]
fn a_teams_model_name_never_conflicts_with_another_namespaces() {
    let mut world = World::quickstart().with_team_b();
    let mut squatter = model_endpoint("team-b", "squat", 1, "llama3", vec![service_backend("ollama", 11434)]);
    squatter.spec.parent_refs = parent("demo", "gw");
    world.models.push(squatter);
    let compiled = world.compile();
    assert!(compiled.models[&key("demo", "llama")].accepted);
    assert!(compiled.models[&key("team-b", "squat")].accepted);
    let owners: Vec<(Option<&str>, &str)> =
        compiled.config.models.iter().map(|m| (m.namespace.as_deref(), m.name.as_str())).collect();
    assert_eq!(owners, [(None, "llama-3.1-8b"), (Some("team-b"), "llama3")]);
}

/// Every case seen to freeze a shared Gateway is left out on its own, with
/// the field named, while the rest of the config keeps being served.
#[test]
fn an_object_the_gateway_would_refuse_is_left_out_alone() {
    let mut world = World::quickstart();
    world.secrets.push(credential("demo", "bad-cred", "k", "sk-\u{7}bell"));
    let url = |u: &str| Backend { url: Some(u.into()), ..Backend::default() };
    let mut idle = model_endpoint("demo", "idle", 1, "idle", vec![url("https://a.example/v1")]);
    idle.spec.timeouts = Some(waycast_crds::model_endpoint::Timeouts { idle: Some("0s".into()), ..Default::default() });
    let nbsp = model_endpoint("demo", "nbsp", 2, "llama\u{a0}4", vec![url("https://a.example/v1")]);
    let mut host = model_endpoint("demo", "host", 3, "host", vec![url("https://a.example/v1")]);
    host.spec.backends[0].auth = Some(BackendAuth {
        secret_ref: SecretKeyRef { name: "bad-cred".into(), key: "k".into() },
        header: Some("Host".into()),
    });
    let mut control = model_endpoint("demo", "control", 4, "control", vec![url("https://a.example/v1")]);
    control.spec.backends[0].auth =
        Some(BackendAuth { secret_ref: SecretKeyRef { name: "bad-cred".into(), key: "k".into() }, header: None });
    let metadata = model_endpoint("demo", "metadata", 5, "metadata", vec![url("http://169.254.169.254/latest")]);
    let azure = model_endpoint(
        "demo",
        "azure",
        6,
        "gpt-4o",
        vec![url("https://res.openai.azure.com/openai/deployments/gpt4o?api-version=2024-06-01")],
    );
    let mut glob =
        api_key("demo", "glob", ApiKeySpec { models: Some(vec!["llama\u{2003}*".into()]), ..ApiKeySpec::default() });
    glob.spec.secret_ref = Some(SecretKeyRef { name: "glob".into(), key: "k".into() });
    world.secrets.push(secret("demo", "glob", "k", KEY_B));
    world.keys.push(glob);
    world.models.extend([idle, nbsp, host, control, metadata, azure]);
    // World::compile also checks that the whole config passes the gateway's validation.
    let compiled = world.compile();
    for (name, field) in [
        ("idle", "spec.timeouts.idle"),
        ("nbsp", "spec.model"),
        ("host", "spec.backends[0].auth"),
        ("control", "spec.backends[0].auth"),
        ("metadata", "spec.backends[0].url"),
    ] {
        let verdict = &compiled.models[&key("demo", name)];
        assert_eq!((verdict.accepted, verdict.reason), (false, reasons::INVALID), "{name}");
        assert!(verdict.message.contains(field), "{name}: {}", verdict.message);
        assert!(!verdict.message.contains("bell"), "a credential leaked: {}", verdict.message);
    }
    assert_eq!(compiled.keys[&key("demo", "glob")].verdict.reason, reasons::INVALID);
    let served: Vec<&str> = compiled.config.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        served,
        ["gpt-4o", "llama-3.1-8b"],
        "the good routes (oldest first), the Azure URL with its query among them"
    );
    assert_eq!(compiled.config.keys.len(), 1);
}

/// Only opted-in Secrets are sent upstream; a key Secret can never be.
#[test]
fn credentials_need_the_opt_in_label() {
    let mut world = World::quickstart();
    world.secrets.push(secret("demo", "plain", "k", "sk-plain"));
    let with_auth = |name: &str, secret: &str, key: &str| {
        let mut endpoint = model_endpoint(
            "demo",
            name,
            10,
            name,
            vec![Backend { url: Some("https://api.example.com/v1".into()), ..Backend::default() }],
        );
        endpoint.spec.backends[0].auth =
            Some(BackendAuth { secret_ref: SecretKeyRef { name: secret.into(), key: key.into() }, header: None });
        endpoint
    };
    // A key Secret opted in as a credential too: kept as digests, never
    // sent upstream.
    let mut both = secret("demo", "both", "k", "sk-both-labels");
    both.metadata.labels = Some(
        [(waycast_crds::api_key::KEY_SECRET_LABEL, "true"), (super::secrets::CREDENTIAL_LABEL, "true")]
            .map(|(label, value)| (label.to_owned(), value.to_owned()))
            .into(),
    );
    world.secrets.push(both);
    world.models.push(with_auth("plain", "plain", "k"));
    world.models.push(with_auth("steal", "alice-key", "api-key"));
    world.models.push(with_auth("both", "both", "k"));
    let compiled = world.compile();
    for name in ["plain", "steal", "both"] {
        let verdict = &compiled.models[&key("demo", name)];
        assert_eq!((verdict.accepted, verdict.reason), (false, reasons::SECRET_NOT_LABELLED), "{name}");
    }
    let config = String::from_utf8_lossy(&compiled.config.to_canonical_json().unwrap()).into_owned();
    assert!(!config.contains("sk-plain") && !config.contains("sk-both-labels"));
}

/// TLS to a Service backend: https to the Service's DNS name, through its
/// endpoints, with PEMs from opted-in Secrets only; priority carried over.
#[test]
fn backend_tls_reads_opted_in_secrets_and_serves_the_service_over_https() {
    let mut world = World::quickstart();
    let (ca_pem, cert_pem, key_pem) = waycast_mock::pki::pem_ca_and_client().unwrap();
    world.secrets.push(credential("demo", "models-ca", "ca.crt", &ca_pem));
    let mut pair = credential("demo", "gateway-client", "tls.crt", &cert_pem);
    pair.data.get_or_insert_with(BTreeMap::new).insert("tls.key".into(), ByteString(key_pem.as_bytes().to_vec()));
    world.secrets.push(pair);
    world.secrets.push(secret("demo", "unlabelled-ca", "ca.crt", "OTHER CA"));
    let tls = |ca: &str| waycast_crds::common::ClientTls {
        ca_secret_ref: Some(SecretKeyRef { name: ca.into(), key: "ca.crt".into() }),
        client_cert_secret_ref: Some(waycast_crds::common::SecretRef { name: "gateway-client".into() }),
        server_name: None,
    };
    world.models[0].spec.backends[0].tls = Some(tls("models-ca"));
    world.models[0].spec.backends[0].priority = Some(2);
    let mut refused = model_endpoint("demo", "unlabelled", 20, "u", vec![service_backend("vllm", 8000)]);
    refused.spec.backends[0].tls = Some(tls("unlabelled-ca"));
    world.models.push(refused);
    let compiled = world.compile();
    let backend = &compiled.config.models[0].backends[0];
    assert_eq!(backend.url, "https://vllm.demo.svc:8000/v1");
    assert_eq!(backend.endpoints.as_deref(), Some("demo/vllm:8000"));
    assert_eq!(backend.priority, 2);
    let pems = backend.tls.as_ref().unwrap();
    assert_eq!(
        (pems.ca_pem.as_deref(), pems.client_cert_pem.as_deref(), pems.client_key_pem.as_deref()),
        (Some(ca_pem.as_str()), Some(cert_pem.as_str()), Some(key_pem.as_str()))
    );
    let verdict = &compiled.models[&key("demo", "unlabelled")];
    assert_eq!((verdict.accepted, verdict.reason), (false, reasons::SECRET_NOT_LABELLED));
    assert!(verdict.message.contains("spec.backends[0].tls.caSecretRef"), "{}", verdict.message);
    assert!(!format!("{:?}", compiled.config).contains("KEY PEM"), "the key never reaches Debug output");
}

#[test]
fn egress_rules_of_the_gateway_apply_to_url_backends() {
    let mut world = World::quickstart();
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        denied_cidrs: vec!["10.0.0.0/8".into()],
        allowed_hosts: vec!["*.openai.azure.com".into(), "10.1.2.3".into()],
        ..Default::default()
    });
    let url = |name: &str, u: &str| {
        model_endpoint("demo", name, 10, name, vec![Backend { url: Some(u.into()), ..Backend::default() }])
    };
    world.models.extend([
        url("azure", "https://res.openai.azure.com/v1"),
        url("elsewhere", "https://api.example.com/v1"),
        url("internal", "http://10.1.2.3/v1"),
    ]);
    let compiled = world.compile();
    assert!(compiled.models[&key("demo", "azure")].accepted);
    for name in ["elsewhere", "internal"] {
        assert_eq!(compiled.models[&key("demo", name)].reason, reasons::NOT_ALLOWED_BY_GATEWAY, "{name}");
    }
    assert!(compiled.models[&key("demo", "llama")].accepted, "Service backends are not url backends");
    assert_eq!(compiled.config.settings.denied_cidrs, ["10.0.0.0/8"]);
}

/// Egress is closed by default: a `url` backend naming loopback, the
/// cluster's ranges or the API server is not served unless the Gateway
/// opens them; the closed ranges are written for the gateway to check
/// every address a name resolves to.
#[test]
fn loopback_the_cluster_and_the_api_server_are_closed_to_url_backends_by_default() {
    let mut world = World::quickstart();
    let url = |name: &str, u: &str| {
        model_endpoint("demo", name, 10, name, vec![Backend { url: Some(u.into()), ..Backend::default() }])
    };
    world.models.extend([
        url("loopback", "http://127.0.0.1:8000/v1"),
        url("mapped", "http://[::ffff:127.0.0.1]:8000/v1"),
        url("service-ip", "http://10.96.0.20:8000/v1"),
        url("pod-ip", "http://10.244.0.7:8000/v1"),
        url("apiserver", "https://192.168.49.2:6443/v1"),
        url("external", "https://api.openai.com/v1"),
        url("private", "http://172.16.5.5:8000/v1"),
    ]);
    let catalog_world = |world: &World, ranges: &[&str], api_server: &[&str]| {
        let mut catalog =
            Catalog::from_objects(&world.namespaces, &world.models, &world.keys, &world.services, &world.secrets);
        catalog.cluster_ranges = std::sync::Arc::new(ranges.iter().map(|r| (*r).to_owned()).collect());
        catalog.api_server = api_server.iter().map(|r| (*r).to_owned()).collect();
        catalog.compile(&world.gateway, now())
    };
    let compiled = catalog_world(&world, &["10.96.0.0/12", "10.244.0.0/16"], &["192.168.49.2/32"]);
    for name in ["loopback", "mapped", "service-ip", "pod-ip", "apiserver"] {
        assert_eq!(compiled.models[&key("demo", name)].reason, reasons::NOT_ALLOWED_BY_GATEWAY, "{name}");
    }
    assert!(compiled.models[&key("demo", "external")].accepted);
    assert!(compiled.models[&key("demo", "llama")].accepted, "the model's own Service is not a url backend");
    let closed = &compiled.config.settings.closed_cidrs;
    for range in ["127.0.0.0/8", "::1/128", "10.96.0.0/12", "10.244.0.0/16", "192.168.49.2/32"] {
        assert!(closed.iter().any(|c| c == range), "{range} not closed: {closed:?}");
    }
    // Not known, or known in part: every private range is closed still.
    let unknown = catalog_world(&world, &[], &[]);
    assert_eq!(unknown.models[&key("demo", "pod-ip")].reason, reasons::NOT_ALLOWED_BY_GATEWAY);
    let public = catalog_world(&world, &["198.18.0.0/15"], &[]);
    assert!(public.config.settings.closed_cidrs.iter().any(|c| c == "198.18.0.0/15"), "a public cluster range");
    for known in [&compiled, &unknown, &public] {
        let closed = &known.config.settings.closed_cidrs;
        for range in waycast_crds::egress::PRIVATE_RANGES {
            assert!(closed.iter().any(|c| c == range), "{range} not closed: {closed:?}");
        }
        // A private address outside every range the operator found.
        assert_eq!(known.models[&key("demo", "private")].reason, reasons::NOT_ALLOWED_BY_GATEWAY);
    }
    // Opened by the Gateway.
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        allowed_cidrs: vec!["10.244.0.0/16".into()],
        ..Default::default()
    });
    let opened = catalog_world(&world, &["10.96.0.0/12", "10.244.0.0/16"], &["192.168.49.2/32"]);
    assert!(opened.models[&key("demo", "pod-ip")].accepted);
    assert!(!opened.models[&key("demo", "service-ip")].accepted);
    assert!(!opened.models[&key("demo", "loopback")].accepted);
    assert_eq!(opened.config.settings.allowed_cidrs, ["10.244.0.0/16"]);
}

/// A Service without a selector has endpoints written by hand (any
/// address): it is held to the egress rules like a `url` to its ClusterIP,
/// so in the closed cluster range it is not served.
#[test]
fn a_service_without_a_selector_is_held_to_the_egress_rules() {
    let mut world = World::quickstart();
    let mut manual = service("demo", "manual", "10.96.0.99", 8000);
    if let Some(spec) = manual.spec.as_mut() {
        spec.selector = None;
    }
    // An empty selector selects no pods either.
    let mut empty = service("demo", "empty", "10.96.0.98", 8000);
    if let Some(spec) = empty.spec.as_mut() {
        spec.selector = Some(BTreeMap::new());
    }
    world.services.extend([manual, empty]);
    world.models.push(model_endpoint("demo", "manual", 10, "manual", vec![service_backend("manual", 8000)]));
    world.models.push(model_endpoint("demo", "empty", 11, "empty", vec![service_backend("empty", 8000)]));
    let compiled = world.compile();
    for name in ["manual", "empty"] {
        let verdict = &compiled.models[&key("demo", name)];
        assert_eq!(verdict.reason, reasons::NOT_ALLOWED_BY_GATEWAY, "{name}");
        assert!(verdict.message.contains("selects no pods"), "{name}: {}", verdict.message);
    }
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        allowed_cidrs: vec!["10.96.0.99/32".into()],
        ..Default::default()
    });
    let compiled = world.compile();
    let backend = &compiled.config.models.iter().find(|m| m.name == "manual").unwrap().backends[0];
    assert_eq!((backend.url.as_str(), backend.endpoints.as_deref()), ("http://10.96.0.99:8000/v1", None));
}

/// An ExternalName Service names a host the team chose: it is held to the
/// Gateway's allowed hosts and served as a `url` backend (no endpoints, so
/// the gateway checks every address it resolves to).
#[test]
fn an_external_name_service_is_held_to_the_egress_rules() {
    let mut world = World::quickstart();
    let mut external = service("demo", "outside", "", 443);
    if let Some(spec) = external.spec.as_mut() {
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some("api.example.com".into());
        spec.cluster_ip = None;
    }
    world.services.push(external);
    world.models.push(model_endpoint("demo", "outside", 10, "outside", vec![service_backend("outside", 443)]));
    let compiled = world.compile();
    assert!(compiled.models[&key("demo", "outside")].accepted);
    let backend = &compiled.config.models.iter().find(|m| m.name == "outside").unwrap().backends[0];
    assert_eq!((backend.url.as_str(), backend.endpoints.as_deref()), ("http://api.example.com:443/v1", None));
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        allowed_hosts: vec!["api.openai.com".into()],
        ..Default::default()
    });
    let refused = &world.compile().models[&key("demo", "outside")];
    assert_eq!(refused.reason, reasons::NOT_ALLOWED_BY_GATEWAY);
    assert!(refused.message.contains("ExternalName"), "{}", refused.message);
}

/// A referenced Secret over the size the operator reads is refused by name
/// (its data never read); every other object is served.
#[test]
fn an_object_naming_a_secret_too_large_to_read_is_refused_alone() {
    let mut world = World::quickstart();
    world.keys.push(api_key("demo", "bob", ApiKeySpec::default()));
    world.secrets.push(key_secret("demo", "bob", KEY_A));
    let mut endpoint = model_endpoint(
        "demo",
        "external",
        10,
        "external",
        vec![Backend { url: Some("https://api.example.com/v1".into()), ..Backend::default() }],
    );
    endpoint.spec.backends[0].auth =
        Some(BackendAuth { secret_ref: SecretKeyRef { name: "huge".into(), key: "k".into() }, header: None });
    world.models.push(endpoint);
    world.secrets.push(credential("demo", "huge", "k", "sk-whatever"));
    let mut catalog =
        Catalog::from_objects(&world.namespaces, &world.models, &world.keys, &world.services, &world.secrets);
    let referenced = catalog.with_inputs(&world.gateway, referenced_secrets);
    assert!(referenced.contains(&("demo".to_owned(), "bob-key".to_owned())), "{referenced:?}");
    assert!(referenced.contains(&("demo".to_owned(), "huge".to_owned())), "{referenced:?}");
    catalog.too_large = [("demo".to_owned(), "bob-key".to_owned()), ("demo".to_owned(), "huge".to_owned())].into();
    let compiled = catalog.compile(&world.gateway, now());
    assert_eq!(compiled.keys[&key("demo", "bob")].verdict.reason, reasons::SECRET_TOO_LARGE);
    assert_eq!(compiled.models[&key("demo", "external")].reason, reasons::SECRET_TOO_LARGE);
    assert!(compiled.keys[&key("demo", "alice")].verdict.accepted);
    assert!(compiled.models[&key("demo", "llama")].accepted);
}

#[test]
fn a_key_secret_the_api_key_does_not_own_is_not_used() {
    let labelled = |mut secret: Secret| {
        secret.metadata.labels = Some([(waycast_crds::api_key::KEY_SECRET_LABEL.to_owned(), "true".to_owned())].into());
        secret
    };
    let owned_by = |uid: &str, controller: bool| {
        let mut secret = secret("demo", "alice-key", "api-key", &format!("  {KEY_A}\n"));
        secret.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            uid: uid.into(),
            controller: Some(controller),
            ..Default::default()
        }]);
        secret
    };
    // As read, and as the operator keeps a labelled one (its digests).
    for foreign in [
        secret("demo", "alice-key", "api-key", KEY_A),
        labelled(secret("demo", "alice-key", "api-key", KEY_A)),
        labelled(owned_by("uid-mallory", true)),
        labelled(owned_by("uid-alice", false)),
        owned_by("uid-alice", false),
    ] {
        let mut world = World::quickstart();
        world.secrets = vec![foreign];
        let compiled = world.compile();
        assert_eq!(compiled.keys[&key("demo", "alice")].verdict.reason, reasons::SECRET_NOT_OWNED);
        assert!(compiled.config.keys.is_empty());
    }
    // Its own, as read and as kept: the text trimmed either way.
    for own in [owned_by("uid-alice", true), labelled(owned_by("uid-alice", true))] {
        let mut world = World::quickstart();
        world.secrets = vec![own];
        let compiled = world.compile();
        assert_eq!(compiled.keys[&key("demo", "alice")].verdict.reason, reasons::KEY_READY);
        assert_eq!(compiled.config.keys[0].sha256, waycast_crds::digest::sha256_hex(KEY_A.as_bytes()));
    }
}

#[test]
fn load_balancing_keeps_the_defaults_and_takes_what_is_set() {
    use waycast_crds::model_endpoint::{LoadBalancing, LoadBalancingPolicy};
    let defaults = models::load_balancing(None);
    assert_eq!(defaults, waycast_crds::config::LoadBalancingConfig::default());
    assert_eq!(defaults.retry_on_status, [429, 503]);
    let set = LoadBalancing {
        policy: Some(LoadBalancingPolicy::PrefixAffinity),
        prefix_bytes: Some(512),
        retry_on_status: Some(vec![500, 502]),
        ..LoadBalancing::default()
    };
    let compiled = models::load_balancing(Some(&set));
    assert_eq!(compiled.policy, waycast_crds::config::LoadBalancingPolicy::PrefixAffinity);
    assert_eq!((compiled.prefix_bytes, compiled.load_factor_percent), (512, defaults.load_factor_percent));
    assert_eq!(compiled.retry_on_status, [500, 502]);
    let none = LoadBalancing { retry_on_status: Some(Vec::new()), ..LoadBalancing::default() };
    assert!(models::load_balancing(Some(&none)).retry_on_status.is_empty(), "[] retries no status");
}

/// A Gateway's tenant policies: the first that selects a namespace applies
/// to it (weight, classes, caps); a key whose class its namespace may not
/// use is left out (`ClassNotAllowed`) and its neighbours are served; the
/// status lists what each policy matched.
#[test]
fn tenant_policies_give_each_namespace_its_weight_classes_and_caps() {
    use waycast_crds::sharing::{GatewaySharing, SharingQueue, TenantPolicy};
    let mut world = World::quickstart();
    world.gateway = gateway("platform", GatewaySpec::default());
    world.namespaces = vec![
        namespace("platform", &[]),
        namespace("gold-team", &[("tier", "gold")]),
        namespace("batch-team", &[]),
        namespace("other", &[]),
    ];
    world.gateway.spec.api_keys = Some(RouteSelector {
        namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
        selector: None,
    });
    let gold = NamespacePolicy {
        from: NamespaceFrom::Selector,
        selector: Some(LabelSelector {
            match_labels: Some([("tier".to_owned(), "gold".to_owned())].into()),
            ..LabelSelector::default()
        }),
    };
    world.gateway.spec.tenants = vec![
        TenantPolicy {
            namespaces: gold,
            weight: Some(4),
            classes: vec!["interactive".into(), "standard".into()],
            limits: Some(KeyLimits {
                requests_per_minute: Some(6000),
                max_concurrent: Some(200),
                ..KeyLimits::default()
            }),
            budgets: vec![Budget { period: Period::Month, tokens: Some(50_000_000), cost: Some("1250.00".into()) }],
            max_api_keys: None,
        },
        TenantPolicy {
            namespaces: NamespacePolicy { from: NamespaceFrom::All, selector: None },
            classes: vec!["batch".into()],
            ..TenantPolicy::default()
        },
        // Never reached: the policy before it selects every namespace.
        TenantPolicy { namespaces: NamespacePolicy::default(), weight: Some(9), ..TenantPolicy::default() },
    ];
    world.gateway.spec.sharing = Some(GatewaySharing {
        queue: Some(SharingQueue { max_wait: Some("2s".into()), max_queued: Some(50) }),
        burst_percent: Some(25),
        inference_headers: Some(true),
        ..GatewaySharing::default()
    });
    let team_key = |namespace: &str, name: &str, class: Option<&str>| {
        let mut key = api_key(namespace, name, ApiKeySpec { class: class.map(str::to_owned), ..ApiKeySpec::default() });
        key.spec.parent_refs = parent("platform", "gw");
        key
    };
    world.gateway.spec.budgets =
        Some(GatewayBudgets { time_zone: Some("Europe/Berlin".into()), currency: Some("EUR".into()) });
    let mut chat = team_key("gold-team", "chat", Some("interactive"));
    chat.spec.budgets = vec![Budget { period: Period::Day, tokens: Some(200_000), cost: None }];
    world.keys = vec![
        chat,
        team_key("gold-team", "plain", None),
        team_key("batch-team", "jobs", None),
        team_key("batch-team", "sneaky", Some("interactive")),
        team_key("batch-team", "unknown", Some("gold")),
    ];
    let texts = [
        KEY_A,
        KEY_B,
        "wc_ccccccccccccccccccccccccccccccccccccccccccc",
        "wc_ddddddddddddddddddddddddddddddddddddddddddd",
        "wc_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
    ];
    world.secrets = world
        .keys
        .iter()
        .zip(texts)
        .map(|(key, text)| {
            key_secret(&key.metadata.namespace.clone().unwrap(), &key.metadata.name.clone().unwrap(), text)
        })
        .collect();
    let compiled = world.compile();
    let verdict = |namespace: &str, name: &str| compiled.keys[&key(namespace, name)].verdict.clone();
    assert!(verdict("gold-team", "chat").accepted && verdict("gold-team", "plain").accepted);
    assert!(verdict("batch-team", "jobs").accepted, "no class: the lowest its namespace may use");
    for (name, says) in [("sneaky", "not one this namespace may use"), ("unknown", "not one of the Gateway's classes")]
    {
        let refused = verdict("batch-team", name);
        assert_eq!((refused.accepted, refused.reason), (false, reasons::CLASS_NOT_ALLOWED), "{name}");
        assert!(refused.message.contains(says), "{name}: {}", refused.message);
    }
    let settings = &compiled.config.settings;
    assert_eq!(settings.sharing.max_wait, std::time::Duration::from_secs(2));
    assert_eq!((settings.sharing.max_queued, settings.sharing.burst_percent), (50, 25));
    assert!(settings.sharing.inference_headers);
    let tenants: Vec<(&str, u32, Option<u64>)> = settings
        .tenants
        .iter()
        .map(|t| (t.namespace.as_str(), t.weight, t.limits.and_then(|l| l.max_concurrent)))
        .collect();
    assert_eq!(tenants, [("batch-team", 1, None), ("gold-team", 4, Some(200))]);
    assert_eq!(settings.tenants[0].classes.as_deref(), Some(&["batch".to_owned()][..]));
    // Budgets: the namespace's and the key's, in the Gateway's zone and currency.
    let month = BudgetConfig { period: Period::Month, tokens: Some(50_000_000), cost: Some("1250.00".into()) };
    assert_eq!((settings.tenants[0].budgets.as_slice(), &settings.tenants[1].budgets[..]), (&[][..], &[month][..]));
    let day = BudgetConfig { period: Period::Day, tokens: Some(200_000), cost: None };
    let chat = compiled.config.keys.iter().find(|k| k.id == "gold-team/chat").unwrap();
    assert_eq!(chat.budgets, [day]);
    assert_eq!((settings.budgets.time_zone.as_str(), settings.budgets.currency.as_str()), ("Europe/Berlin", "EUR"));
    let matched: Vec<(i32, Vec<String>)> = compiled.tenants.iter().map(|t| (t.index, t.namespaces.clone())).collect();
    assert_eq!(matched, [(0, vec!["gold-team".to_owned()]), (1, vec!["batch-team".to_owned()]), (2, vec![])]);
    assert!(compiled.gateway.is_none(), "{:?}", compiled.gateway);

    // A time zone the database does not know: UTC stands in, and the Gateway says so.
    world.gateway.spec.budgets = Some(GatewayBudgets { time_zone: Some("Mars/Olympus".into()), currency: None });
    let compiled = world.compile();
    assert_eq!(compiled.config.settings.budgets.time_zone, "UTC");
    let refused = compiled.gateway.clone().expect("the Gateway names the unknown zone");
    assert!(refused.message.contains("spec.budgets.timeZone"), "{}", refused.message);
    assert!(compiled.keys[&key("gold-team", "chat")].verdict.accepted, "the keys are served in UTC");
    world.gateway.spec.budgets = None;

    // A class the Gateway lacks in a policy: ignored, and the Gateway says so.
    world.gateway.spec.tenants[1].classes.push("gold".into());
    let compiled = world.compile();
    let refused = compiled.gateway.expect("the Gateway names the unknown class");
    assert!(refused.message.contains("spec.tenants[1].classes[1]"), "{}", refused.message);
    assert!(compiled.keys[&key("batch-team", "jobs")].verdict.accepted);
}

#[test]
fn telemetry_reaches_the_config_with_its_headers_or_the_gateway_says_why_not() {
    use waycast_crds::telemetry::{GatewayTelemetry, Ratio};
    let mut world = World::quickstart();
    world.gateway.spec.telemetry = Some(GatewayTelemetry {
        endpoint: "http://otel-collector.observability:4318".into(),
        sampling: Some(0.25),
        headers_secret_ref: Some(waycast_crds::common::SecretRef { name: "otlp-auth".into() }),
        resource_attributes: [("deployment.environment".to_owned(), "prod".to_owned())].into(),
        trust_client_trace_context: Some(false),
        honor_client_sampling: Some(true),
        usage_logs: None,
    });
    assert!(secrets::redis_secrets(&world.gateway).contains(&("demo".to_owned(), "otlp-auth".to_owned())));
    let missing = world.compile();
    assert_eq!(missing.config.settings.telemetry, None, "nothing is sent without its headers");
    let refused = missing.gateway.expect("the Gateway says why");
    assert_eq!(refused.reason, reasons::AUTH_SECRET_MISSING);

    world.secrets.push(secret("demo", "otlp-auth", "Authorization", "Bearer t0ken\n"));
    let compiled = world.compile();
    assert_eq!(compiled.gateway, None);
    let telemetry = compiled.config.settings.telemetry.unwrap();
    assert_eq!(telemetry.endpoint, "http://otel-collector.observability:4318");
    assert_eq!(
        (telemetry.sampling, telemetry.trust_client_trace_context, telemetry.usage_logs),
        (Ratio(0.25), false, true)
    );
    assert!(telemetry.honor_client_sampling, "the Gateway's opt-in reaches the pods");
    assert_eq!(telemetry.headers, [("authorization".to_owned(), "Bearer t0ken".to_owned())].into());
    assert_eq!(telemetry.resource_attributes["deployment.environment"], "prod");

    // A header value that is not one is refused without showing it.
    world.secrets.retain(|s| s.metadata.name.as_deref() != Some("otlp-auth"));
    world.secrets.push(secret("demo", "otlp-auth", "authorization", "line\nbreak-s3cret"));
    let refused = world.compile().gateway.expect("refused");
    assert_eq!(refused.reason, reasons::INVALID);
    assert!(!refused.message.contains("s3cret"), "{}", refused.message);
}

/// `spec.tenants[].maxApiKeys`: per namespace, the oldest keys (creation
/// time, then name) are served up to the cap and each newer one is left
/// out (`TenantKeyLimit`); a key refused for another reason takes no
/// place; another namespace under the same policy counts its own keys.
#[test]
fn a_tenant_key_cap_leaves_out_the_newest_keys_of_that_namespace_only() {
    use waycast_crds::sharing::TenantPolicy;
    // (case, cap, team-a's keys as (name, created, disabled), served names)
    type Row = (&'static str, Option<i32>, &'static [(&'static str, i64, bool)], &'static [&'static str]);
    let rows: &[Row] = &[
        ("no cap", None, &[("x", 1, false), ("y", 2, false), ("z", 3, false)], &["x", "y", "z"]),
        ("newest out", Some(2), &[("z", 1, false), ("y", 2, false), ("x", 3, false)], &["y", "z"]),
        ("same time: by name", Some(2), &[("c", 5, false), ("a", 5, false), ("b", 5, false)], &["a", "b"]),
        (
            "a disabled key takes no place",
            Some(2),
            &[("d", 1, true), ("x", 2, false), ("y", 3, false), ("z", 4, false)],
            &["x", "y"],
        ),
        ("cap 0", Some(0), &[("x", 1, false)], &[]),
        ("under the cap", Some(5), &[("x", 1, false), ("y", 2, false)], &["x", "y"]),
    ];
    for (case, cap, keys, served) in rows {
        let mut world = World::quickstart();
        world.gateway = gateway("platform", GatewaySpec::default());
        world.namespaces = vec![namespace("platform", &[]), namespace("team-a", &[]), namespace("team-b", &[])];
        let all = NamespacePolicy { from: NamespaceFrom::All, selector: None };
        world.gateway.spec.api_keys = Some(RouteSelector { namespaces: Some(all.clone()), selector: None });
        world.gateway.spec.tenants =
            vec![TenantPolicy { namespaces: all, max_api_keys: *cap, ..TenantPolicy::default() }];
        let team_key = |namespace: &str, name: &str, created: i64, disabled: bool| {
            let mut key = api_key(namespace, name, ApiKeySpec { disabled, ..ApiKeySpec::default() });
            key.metadata.creation_timestamp = Some(at(created));
            key.spec.parent_refs = parent("platform", "gw");
            key
        };
        world.keys =
            keys.iter().map(|(name, created, disabled)| team_key("team-a", name, *created, *disabled)).collect();
        // team-b's key is the oldest of all, and alone in its namespace.
        world.keys.push(team_key("team-b", "only", 0, false));
        world.secrets = world
            .keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let (namespace, name) = (key.metadata.namespace.clone().unwrap(), key.metadata.name.clone().unwrap());
                key_secret(&namespace, &name, &format!("wc_{i:0>43}"))
            })
            .collect();
        let compiled = world.compile();
        let ids: Vec<&str> = compiled.config.keys.iter().map(|entry| entry.id.as_str()).collect();
        let mut expected: Vec<String> = served.iter().map(|name| format!("team-a/{name}")).collect();
        // A tenant of its own: only a cap of 0 leaves its one key out.
        let team_b_served = *cap != Some(0);
        if team_b_served {
            expected.push("team-b/only".into());
        }
        assert_eq!(ids, expected, "{case}: the config's keys");
        for (name, _, disabled) in *keys {
            let verdict = &compiled.keys[&key("team-a", name)].verdict;
            let reason = if served.contains(name) {
                reasons::KEY_READY
            } else if *disabled {
                reasons::DISABLED
            } else {
                reasons::TENANT_KEY_LIMIT
            };
            assert_eq!(verdict.reason, reason, "{case}: team-a/{name}");
            assert_eq!(verdict.accepted, served.contains(name), "{case}: team-a/{name}");
            if reason == reasons::TENANT_KEY_LIMIT {
                assert!(verdict.message.contains("spec.tenants[0].maxApiKeys"), "{case}: {}", verdict.message);
            }
        }
        assert_eq!(compiled.keys[&key("team-b", "only")].verdict.accepted, team_b_served, "{case}: team-b");
    }
}
