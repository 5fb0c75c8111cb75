//! Table-driven tests of compile, with fixture builders.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use waycast_crds::common::{Limits, SecretKeyRef};
use waycast_crds::condition::reasons;
use waycast_crds::gateway::{NamespaceFrom, NamespacePolicy, RouteSelector};
use waycast_crds::model_endpoint::{Backend, BackendAuth, ServiceBackend};
use waycast_crds::{ApiKey, ApiKeySpec, Gateway, GatewaySpec, ModelEndpoint, ModelEndpointSpec};

use super::*;

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
    Gateway { metadata: meta(namespace, "gw"), spec, status: None }
}

fn service_backend(name: &str, port: i32) -> Backend {
    Backend { service: Some(ServiceBackend { name: name.into(), port, base_path: None }), ..Backend::default() }
}

fn model_endpoint(namespace: &str, name: &str, created: i64, model: &str, backends: Vec<Backend>) -> ModelEndpoint {
    let mut metadata = meta(namespace, name);
    metadata.creation_timestamp = Some(at(created));
    ModelEndpoint {
        metadata,
        spec: ModelEndpointSpec { model: model.into(), backends, ..ModelEndpointSpec::default() },
        status: None,
    }
}

fn service(namespace: &str, name: &str, ip: &str, port: i32) -> Service {
    Service {
        metadata: meta(namespace, name),
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            ports: Some(vec![ServicePort { port, ..ServicePort::default() }]),
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
    ApiKey { metadata: meta(namespace, name), spec, status: None }
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
            secrets: vec![secret("demo", "alice-key", "api-key", KEY_A)],
        }
    }

    fn compile(&self) -> Compiled {
        let namespaces: Vec<&Namespace> = self.namespaces.iter().collect();
        let models: Vec<&ModelEndpoint> = self.models.iter().collect();
        let keys: Vec<&ApiKey> = self.keys.iter().collect();
        let services: Vec<&Service> = self.services.iter().collect();
        let secrets: Vec<&Secret> = self.secrets.iter().collect();
        let inputs = Inputs {
            gateway: &self.gateway,
            namespaces: &namespaces,
            model_endpoints: &models,
            api_keys: &keys,
            services: &services,
            secrets: &secrets,
        };
        let compiled = super::gateway(&inputs, now());
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
    assert_eq!(entry.sha256, keys::sha256_hex(KEY_A.as_bytes()));
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
    world.namespaces.push(namespace("team-b", &[]));
    world.gateway.spec.model_endpoints = Some(RouteSelector {
        namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
        selector: None,
    });
    world.services.push(service("team-b", "ollama", "10.96.0.60", 11434));
    let mut copy = model_endpoint("team-b", "llama-copy", 200, "llama3", vec![service_backend("ollama", 11434)]);
    copy.spec.aliases = vec!["other".into()];
    world.models.push(copy);
    let compiled = world.compile();
    let loser = &compiled.models[&key("team-b", "llama-copy")];
    assert_eq!(loser.reason, reasons::MODEL_NAME_CONFLICT);
    assert!(loser.message.contains("demo/llama"), "{}", loser.message);
    assert_eq!(compiled.config.models.len(), 1);

    world.models.remove(0);
    let compiled = world.compile();
    assert!(compiled.models[&key("team-b", "llama-copy")].accepted);
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
        ("headless", reasons::BACKEND_NOT_FOUND),
        ("no-secret", reasons::AUTH_SECRET_MISSING),
    ] {
        let verdict = &compiled.models[&key("demo", name)];
        assert_eq!((verdict.accepted, verdict.reason), (false, reason), "{name}: {}", verdict.message);
    }
    assert!(compiled.models[&key("demo", "llama")].accepted, "the good route is untouched");
    assert_eq!(compiled.config.models.len(), 1);
}

#[test]
fn upstream_credentials_go_into_headers() {
    let mut world = World::quickstart();
    world.secrets.push(secret("demo", "openai", "api-key", "sk-upstream\n"));
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
    world.secrets.push(secret("demo", "off-key", "api-key", KEY_B));
    world.secrets.push(secret("demo", "old-key", "api-key", "wc_cccccccccccccccccccccccccccccccccccccccccccc"));
    world.keys.extend([
        api_key("demo", "missing", ApiKeySpec::default()),
        api_key("demo", "short", user_key("short")),
        api_key(
            "demo",
            "partner",
            ApiKeySpec {
                limits: Some(Limits { requests_per_minute: Some(60), tokens_per_minute: None }),
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
    let compiled = world.compile();
    assert!(compiled.config.models.is_empty() && compiled.config.keys.is_empty(), "demo is not a team namespace");
    world.namespaces = vec![namespace("demo", &[("waycast.dev/team", "enabled")])];
    let compiled = world.compile();
    assert_eq!((compiled.config.models.len(), compiled.config.keys.len()), (1, 1));
}

#[test]
fn gateway_settings_reach_the_config() {
    let mut world = World::quickstart();
    world.gateway.spec.limits = Some(waycast_crds::gateway::GatewayLimits { max_request_body_bytes: Some(1024) });
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
            timeout: Some("50ms".into()),
        }),
        failure_mode: Some(FailureMode::Closed),
    });
    let fetched = {
        let gateway = &world.gateway;
        let inputs =
            Inputs { gateway, namespaces: &[], model_endpoints: &[], api_keys: &[], services: &[], secrets: &[] };
        models::credential_secrets(&inputs)
    };
    assert!(fetched.contains(&("demo".to_owned(), "redis".to_owned())), "the shell fetches the password Secret");

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
            timeout: std::time::Duration::from_millis(50),
            fail_closed: true,
        })
    );
}
