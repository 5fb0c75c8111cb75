//! Routes: what a ModelEndpoint becomes, conflicts, per-entry refusals, load balancing.

use super::*;

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
    no_secret.spec.backends[0].auth = Some(BackendAuth {
        secret_ref: SecretKeyRef { name: "creds".into(), key: "k".into() },
        header: None,
        style: None,
    });
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
        style: None,
    });
    let mut control = model_endpoint("demo", "control", 4, "control", vec![url("https://a.example/v1")]);
    control.spec.backends[0].auth = Some(BackendAuth {
        secret_ref: SecretKeyRef { name: "bad-cred".into(), key: "k".into() },
        header: None,
        style: None,
    });
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
