use super::*;
use crate::config::{GatewayConfig, Settings};

/// A case: what it is, a change to a valid entry, the paths refused.
type Case<'a, T> = (&'a str, Box<dyn Fn(&mut T)>, &'a [&'a str]);

fn provider(name: &str) -> ProviderConfig {
    ProviderConfig::new(name, "https://sso.example.com/realms/corp", "waycast")
}

fn grant(id: &str, provider: &str) -> GrantConfig {
    let mut grant = GrantConfig::new(id, provider);
    grant.groups = vec!["ml-research".into()];
    grant
}

fn paths(result: Result<(), Problems>) -> Vec<String> {
    result.err().map(|problems| problems.0.into_iter().map(|p| p.path).collect()).unwrap_or_default()
}

#[test]
fn a_provider_is_checked_field_by_field() {
    let cases: Vec<Case<'_, ProviderConfig>> = vec![
        ("valid", Box::new(|_| {}), &[]),
        ("name not a label", Box::new(|p| p.name = "Corp".into()), &["name"]),
        ("http issuer", Box::new(|p| p.issuer = "http://sso.example.com".into()), &["issuer"]),
        ("issuer with a query", Box::new(|p| p.issuer = "https://sso.example.com/?a=b".into()), &["issuer"]),
        ("issuer without host", Box::new(|p| p.issuer = "https:///realms".into()), &["issuer"]),
        ("no audience", Box::new(|p| p.audiences.clear()), &["audiences"]),
        ("17 audiences", Box::new(|p| p.audiences = (0..17).map(|i| format!("a{i}")).collect()), &["audiences"]),
        ("audience twice", Box::new(|p| p.audiences = vec!["a".into(), "a".into()]), &["audiences[1]"]),
        ("audience with a space", Box::new(|p| p.audiences = vec!["a b".into()]), &["audiences[0]"]),
        ("jwksUri over http", Box::new(|p| p.jwks_uri = Some("http://sso/keys".into())), &["jwksUri"]),
        ("jwksUri with a query", Box::new(|p| p.jwks_uri = Some("https://sso/keys?v=2".into())), &[]),
        (
            "two key sources",
            Box::new(|p| {
                p.jwks_uri = Some("https://sso/keys".into());
                p.jwks_config_map = Some(ConfigMapKeyConfig {
                    namespace: "platform".into(),
                    name: "corp-jwks".into(),
                    key: "jwks.json".into(),
                });
            }),
            &["jwksConfigMap"],
        ),
        (
            "a ConfigMap without a key",
            Box::new(|p| {
                p.jwks_config_map =
                    Some(ConfigMapKeyConfig { namespace: "platform".into(), name: "corp-jwks".into(), key: "".into() })
            }),
            &["jwksConfigMap"],
        ),
        ("empty user claim", Box::new(|p| p.claims.user = String::new()), &["claims.user"]),
        ("groups claim with a space", Box::new(|p| p.claims.groups = "my groups".into()), &["claims.groups"]),
    ];
    for (what, change, expected) in cases {
        let mut entry = provider("corp");
        change(&mut entry);
        assert_eq!(paths(entry.validate()), *expected, "{what}");
    }
}

#[test]
fn a_grant_is_checked_field_by_field() {
    let cases: Vec<Case<'_, GrantConfig>> = vec![
        ("valid", Box::new(|_| {}), &[]),
        ("id without a namespace", Box::new(|g| g.id = "team".into()), &["id"]),
        ("no subject", Box::new(|g| g.groups.clear()), &[""]),
        (
            "a user only",
            Box::new(|g| {
                g.groups.clear();
                g.users = vec!["alice@example.com".into()];
            }),
            &[],
        ),
        ("a group with a space is a group", Box::new(|g| g.groups = vec!["ML Research".into()]), &[]),
        ("a group with a newline", Box::new(|g| g.groups = vec!["ml\nresearch".into()]), &["groups[0]"]),
        ("a user with a space", Box::new(|g| g.users = vec!["alice smith".into()]), &["users[0]"]),
        ("a bare service account", Box::new(|g| g.service_accounts = vec!["runner".into()]), &["serviceAccounts[0]"]),
        ("a service account", Box::new(|g| g.service_accounts = vec!["team-a/runner".into()]), &[]),
        (
            "another namespace's service account",
            Box::new(|g| g.service_accounts = vec!["ci/runner".into()]),
            &["serviceAccounts[0]"],
        ),
        (
            "another namespace's service account named as a user",
            Box::new(|g| g.users = vec!["system:serviceaccount:ci:runner".into()]),
            &["users[0]"],
        ),
        ("257 users", Box::new(|g| g.users = (0..257).map(|i| format!("u{i}")).collect()), &["users"]),
        ("a model glob with a space", Box::new(|g| g.models = Some(vec!["llama *".into()])), &["models[0]"]),
        ("a class not a label", Box::new(|g| g.class = Some("Gold".into())), &["class"]),
        ("empty limits", Box::new(|g| g.limits = Some(LimitsConfig::default())), &["limits"]),
        (
            "per-user concurrency of 0",
            Box::new(|g| {
                g.per_user = Some(PerUserConfig { limits: Some(LimitsConfig::concurrent(0)), budgets: Vec::new() })
            }),
            &["perUser.limits.maxConcurrent"],
        ),
        (
            "per-user budget of nothing",
            Box::new(|g| {
                g.per_user = Some(PerUserConfig {
                    limits: None,
                    budgets: vec![BudgetConfig { period: crate::period::Period::Month, tokens: None, cost: None }],
                })
            }),
            &["perUser.budgets[0]"],
        ),
    ];
    for (what, change, expected) in cases {
        let mut entry = grant("team-a/researchers", "corp");
        change(&mut entry);
        assert_eq!(paths(entry.validate()), *expected, "{what}");
    }
}

/// In a whole config a provider name and a grant id are kept once, and a
/// grant is left out when its provider is unknown or left out, or when it
/// names ServiceAccounts of a provider that is not the cluster's.
#[test]
fn a_config_leaves_out_each_bad_entry_alone() {
    let mut config = GatewayConfig::empty();
    let mut cluster = ProviderConfig::new("cluster", "https://kubernetes.default.svc", "waycast");
    cluster.service_accounts = true;
    let mut broken = provider("broken");
    broken.issuer = "http://insecure".into();
    config.providers = vec![provider("corp"), provider("corp"), cluster, broken];
    let mut workloads = GrantConfig::new("ci/runners", "cluster");
    workloads.service_accounts = vec!["ci/runner".into()];
    let mut confused = GrantConfig::new("ci/confused", "corp");
    confused.service_accounts = vec!["ci/runner".into()];
    config.grants = vec![
        grant("team-a/researchers", "corp"),
        grant("team-a/researchers", "corp"),
        grant("team-a/unknown", "nobody"),
        grant("team-a/broken", "broken"),
        workloads,
        confused,
    ];
    let review = config.review();
    assert_eq!(review.providers.keys().copied().collect::<Vec<_>>(), [1, 3]);
    assert_eq!(review.grants.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 5]);
    let messages: Vec<String> = review.grants.values().flatten().map(ToString::to_string).collect();
    assert!(messages.iter().any(|m| m == "grants[2].provider: no provider \"nobody\""), "{messages:?}");
    assert!(messages.iter().any(|m| m.contains("is not the cluster's ServiceAccount issuer")), "{messages:?}");
    assert!(config.validate().is_err(), "a hand-written config with a bad entry is refused whole");
}

/// A grant's class must be one its namespace may use, as a key's.
#[test]
fn a_grants_class_is_checked_against_its_tenant() {
    let mut config = GatewayConfig::empty();
    config.providers = vec![provider("corp")];
    let mut gold = grant("team-a/researchers", "corp");
    gold.class = Some("interactive".into());
    config.grants = vec![gold];
    let review = config.review();
    assert!(review.grants[&0][0].message.contains("not one this namespace may use"), "{review:?}");
    config.settings = Settings {
        tenants: vec![crate::sharing::TenantConfig {
            classes: Some(vec!["interactive".into()]),
            ..crate::sharing::TenantConfig::new("team-a")
        }],
        ..Settings::default()
    };
    assert!(config.review().grants.is_empty());
}

/// Old configs (no providers, no grants) read as before, and a config
/// with them round-trips through the canonical JSON with defaults filled.
#[test]
fn identity_entries_are_optional_and_round_trip() {
    let old = GatewayConfig::from_slice(b"{\"apiVersion\":\"waycast.dev/config-v1\",\"keys\":[]}").unwrap();
    assert!(old.providers.is_empty() && old.grants.is_empty());
    assert!(!String::from_utf8(old.to_canonical_json().unwrap()).unwrap().contains("providers"));
    let yaml = "apiVersion: waycast.dev/config-v1\nproviders:\n  - {name: corp, issuer: 'https://sso.example.com', audiences: [waycast], claims: {user: email}}\ngrants:\n  - {id: team-a/r, provider: corp, users: [alice@example.com], perUser: {limits: {maxConcurrent: 2}}}\n";
    let config = GatewayConfig::from_slice(yaml.as_bytes()).unwrap();
    assert_eq!(config.providers[0].claims.groups, "groups");
    assert_eq!(config.providers[0].claims.user, "email");
    let json = config.to_canonical_json().unwrap();
    assert_eq!(GatewayConfig::from_slice(&json).unwrap(), config);
    let unknown = yaml.replace("perUser", "perPerson");
    assert!(GatewayConfig::from_slice(unknown.as_bytes()).is_err(), "unknown fields are refused");
}
