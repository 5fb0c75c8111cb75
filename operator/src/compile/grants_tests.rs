//! Table-driven tests of identity providers and AccessGrants in compile.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use waycast_crds::common::ParentReference;
use waycast_crds::condition::reasons;
use waycast_crds::gateway::{NamespaceFrom, NamespacePolicy, RouteSelector};
use waycast_crds::identity::{
    ConfigMapKeyRef, GatewayIdentity, IdentityClaims, IdentityProvider, ServiceAccountIssuer,
};
use waycast_crds::sharing::{KeyLimits, TenantPolicy};
use waycast_crds::spend::Budget;
use waycast_crds::{AccessGrant, AccessGrantSpec, Gateway};
use waycast_mock::fixtures::objects;

use super::*;
use crate::catalog::Catalog;
use crate::compile::Compiled;

fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(2_000_000_000).unwrap()
}

fn corp() -> IdentityProvider {
    IdentityProvider {
        name: "corp".into(),
        issuer: Some("https://sso.example.com/realms/corp".into()),
        audiences: vec!["waycast".into()],
        ..IdentityProvider::default()
    }
}

fn cluster() -> IdentityProvider {
    IdentityProvider {
        name: "cluster".into(),
        service_account_issuer: Some(ServiceAccountIssuer {}),
        audiences: vec!["waycast".into()],
        ..IdentityProvider::default()
    }
}

/// The Gateway `platform/gw`, admitting every namespace's grants (by its
/// `apiKeys` rules), trusting `providers`.
fn gateway(providers: Vec<IdentityProvider>) -> Gateway {
    let mut gateway = objects::gateway("platform", "gw");
    gateway.spec.api_keys = Some(RouteSelector {
        namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
        selector: None,
    });
    gateway.spec.identity = Some(GatewayIdentity { providers });
    gateway
}

/// A grant in `namespace` naming `platform/gw`, for the group `ml` of `provider`.
fn grant(namespace: &str, name: &str, provider: &str) -> AccessGrant {
    let spec = AccessGrantSpec {
        parent_refs: vec![ParentReference { name: "gw".into(), namespace: Some("platform".into()) }],
        provider: provider.into(),
        groups: vec!["ml".into()],
        ..AccessGrantSpec::default()
    };
    let mut grant = AccessGrant::new(name, spec);
    grant.metadata = ObjectMeta { namespace: Some(namespace.into()), name: Some(name.into()), ..ObjectMeta::default() };
    grant
}

fn compile(gateway: &Gateway, grants: Vec<AccessGrant>, issuer: Option<&str>) -> Compiled {
    let namespaces: Vec<Namespace> = ["platform", "team-a", "team-b"]
        .iter()
        .map(|name| Namespace {
            metadata: ObjectMeta { name: Some((*name).into()), ..ObjectMeta::default() },
            ..Namespace::default()
        })
        .collect();
    let mut catalog = Catalog::from_objects(&namespaces, &[], &[], &[], &[]);
    catalog.grants = grants.into_iter().map(Arc::new).collect();
    catalog.service_account_issuer = issuer.map(str::to_owned);
    catalog.compile(gateway, now())
}

fn id(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey { namespace: namespace.into(), name: name.into() }
}

#[test]
fn providers_compile_with_their_defaults_and_the_gateways_namespace() {
    let mut pinned = corp();
    pinned.name = "air-gapped".into();
    pinned.config_map_ref = Some(ConfigMapKeyRef { name: "corp-jwks".into(), key: "jwks.json".into() });
    pinned.claims = Some(IdentityClaims { user: Some("email".into()), groups: None });
    let compiled = compile(&gateway(vec![corp(), pinned]), Vec::new(), None);
    assert_eq!(compiled.gateway, None);
    let [discovered, air_gapped] = &compiled.config.providers[..] else { panic!("{:?}", compiled.config.providers) };
    assert_eq!((discovered.jwks_uri.as_deref(), discovered.jwks_config_map.as_ref()), (None, None), "discovery");
    assert_eq!((discovered.claims.user.as_str(), discovered.claims.groups.as_str()), ("sub", "groups"));
    let config_map = air_gapped.jwks_config_map.as_ref().unwrap();
    assert_eq!((config_map.namespace.as_str(), config_map.name.as_str()), ("platform", "corp-jwks"));
    assert_eq!(air_gapped.claims.user, "email");
    assert!(compiled.config.validate().is_ok());
}

/// The cluster's own issuer is compiled once the operator knows it; until
/// then that provider alone is left out, and the Gateway says why.
#[test]
fn the_clusters_own_issuer_is_left_out_until_it_is_known() {
    let gateway = gateway(vec![cluster(), corp()]);
    let unknown = compile(&gateway, Vec::new(), None);
    assert_eq!(unknown.config.providers.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["corp"]);
    let refused = unknown.gateway.unwrap();
    assert_eq!(refused.reason, reasons::INVALID);
    assert!(refused.message.contains("providers[0] (cluster)"), "{}", refused.message);
    let known = compile(&gateway, Vec::new(), Some("https://kubernetes.default.svc.cluster.local"));
    assert_eq!(known.gateway, None);
    let own = &known.config.providers[0];
    assert!(own.service_accounts);
    assert_eq!(own.issuer, "https://kubernetes.default.svc.cluster.local");
}

/// A provider the gateway would refuse (here: two key sources, which the
/// API server also refuses) is left out alone; the Gateway says which.
#[test]
fn a_provider_the_gateway_would_refuse_is_left_out_alone() {
    let mut both = corp();
    both.name = "both".into();
    both.jwks_uri = Some("https://sso.example.com/keys".into());
    both.config_map_ref = Some(ConfigMapKeyRef { name: "jwks".into(), key: "jwks.json".into() });
    let mut plain = corp();
    plain.issuer = Some("http://sso.example.com".into());
    plain.name = "plain".into();
    for (bad, expected) in [(both, "providers[1] (both)"), (plain, "providers[1] (plain): issuer")] {
        let compiled = compile(&gateway(vec![corp(), bad]), Vec::new(), None);
        assert_eq!(compiled.config.providers.len(), 1, "{expected}");
        let message = compiled.gateway.unwrap().message;
        assert!(message.contains(expected), "{message}");
    }
}

#[test]
fn grants_compile_with_the_same_two_way_consent_as_keys() {
    let mut limited = grant("team-a", "researchers", "corp");
    limited.spec.models = Some(vec!["llama-*".into()]);
    limited.spec.limits = Some(KeyLimits { requests_per_minute: Some(600), ..KeyLimits::default() });
    limited.spec.budgets = vec![Budget { period: waycast_crds::period::Period::Month, tokens: Some(10), cost: None }];
    limited.spec.per_user = Some(waycast_crds::access_grant::PerUser {
        limits: Some(KeyLimits { max_concurrent: Some(2), ..KeyLimits::default() }),
        budgets: Vec::new(),
    });
    let mut unnamed = grant("team-b", "elsewhere", "corp");
    unnamed.spec.parent_refs.clear();
    let mut own = grant("platform", "admins", "corp");
    own.spec.parent_refs.clear();
    let mut gateway = gateway(vec![corp()]);
    let compiled = compile(&gateway, vec![limited, unnamed, own.clone()], None);
    let ids: Vec<&str> = compiled.config.grants.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(ids, ["platform/admins", "team-a/researchers"], "a grant naming no Gateway is its namespace's");
    assert_eq!(
        compiled.grants.keys().cloned().collect::<Vec<_>>(),
        [id("platform", "admins"), id("team-a", "researchers")]
    );
    let entry = &compiled.config.grants[1];
    assert_eq!(entry.models.as_deref(), Some(&["llama-*".to_owned()][..]));
    assert_eq!(entry.limits.unwrap().requests_per_minute, Some(600));
    assert_eq!(entry.per_user.as_ref().unwrap().limits.unwrap().max_concurrent, Some(2));
    assert_eq!(entry.budgets[0].tokens, Some(10));
    assert!(compiled.config.validate().is_ok());
    // The Gateway's rules no longer admit team-a: only its own namespace's grant.
    gateway.spec.api_keys = None;
    let compiled = compile(&gateway, vec![grant("team-a", "researchers", "corp"), own], None);
    assert_eq!(compiled.config.grants.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(), ["platform/admins"]);
}

/// Each grant the Gateway cannot serve is left out with a verdict saying
/// why; the others are served.
#[test]
fn grant_verdicts() {
    let mut workloads = grant("team-a", "workloads", "cluster");
    workloads.spec.groups.clear();
    workloads.spec.service_accounts = vec!["team-a/runner".into()];
    let mut confused = grant("team-a", "confused", "corp");
    confused.spec.service_accounts = vec!["team-a/runner".into()];
    let mut gold = grant("team-a", "gold", "corp");
    gold.spec.class = Some("interactive".into());
    let cases: Vec<(AccessGrant, Option<&str>, &str, &str)> = vec![
        (grant("team-a", "served", "corp"), None, reasons::ACCEPTED, "the grant is served"),
        (grant("team-a", "unknown", "nobody"), None, reasons::UNKNOWN_PROVIDER, "no identity provider \"nobody\""),
        (workloads.clone(), None, reasons::UNKNOWN_PROVIDER, "\"cluster\""),
        (workloads, Some("https://kubernetes.default.svc"), reasons::ACCEPTED, "served"),
        (confused, None, reasons::INVALID, "not the cluster's ServiceAccount issuer"),
        (gold, None, reasons::CLASS_NOT_ALLOWED, "\"interactive\""),
    ];
    let gateway = gateway(vec![corp(), cluster()]);
    for (grant, issuer, reason, words) in cases {
        let key = ObjectKey::of(&grant.metadata);
        let compiled = compile(&gateway, vec![grant, self::grant("team-b", "bystander", "corp")], issuer);
        let verdict = &compiled.grants[&key];
        assert_eq!(verdict.reason, reason, "{key}: {verdict:?}");
        assert!(verdict.message.contains(words), "{key}: {verdict:?}");
        let served = compiled.config.grants.iter().any(|g| g.id == key.to_string());
        assert_eq!(served, verdict.accepted, "{key}");
        assert!(compiled.config.grants.iter().any(|g| g.id == "team-b/bystander"), "{key}: the others are served");
        assert!(compiled.config.validate().is_ok(), "{key}");
    }
}

/// A grant's namespace is a tenant: a policy opening a class to it
/// serves its grant in that class, and reaches the config's tenants.
#[test]
fn a_grants_namespace_is_a_tenant_like_a_keys() {
    let mut gateway = gateway(vec![corp()]);
    gateway.spec.tenants = vec![TenantPolicy {
        namespaces: NamespacePolicy { from: NamespaceFrom::All, selector: None },
        classes: vec!["interactive".into(), "standard".into()],
        ..TenantPolicy::default()
    }];
    let mut gold = grant("team-a", "gold", "corp");
    gold.spec.class = Some("interactive".into());
    let compiled = compile(&gateway, vec![gold], None);
    assert!(compiled.grants[&id("team-a", "gold")].accepted, "{:?}", compiled.grants);
    assert_eq!(compiled.config.settings.tenants.iter().map(|t| t.namespace.as_str()).collect::<Vec<_>>(), ["team-a"]);
    assert!(compiled.config.validate().is_ok());
}

/// A Gateway without identity compiles as before: no providers, no grants.
#[test]
fn without_identity_nothing_changes() {
    let mut gateway = gateway(Vec::new());
    gateway.spec.identity = None;
    let compiled = compile(&gateway, vec![grant("team-a", "researchers", "corp")], None);
    assert!(compiled.config.providers.is_empty() && compiled.config.grants.is_empty());
    assert_eq!(compiled.grants[&id("team-a", "researchers")].reason, reasons::UNKNOWN_PROVIDER);
    let json = String::from_utf8(compiled.config.to_canonical_json().unwrap()).unwrap();
    assert!(!json.contains("providers") && !json.contains("grants"), "{json}");
}

/// Each provider carries the key set held for it, only when that set was
/// fetched from the source it names now: an edited issuer never serves
/// the old issuer's keys, and a provider without one is still compiled.
#[test]
fn a_provider_carries_the_key_set_held_for_its_current_source() {
    use crate::compile::key_source::{HeldKeySet, KeySetIndex, KeySource};
    let mut pinned = corp();
    pinned.name = "pinned".into();
    pinned.config_map_ref = Some(ConfigMapKeyRef { name: "jwks".into(), key: "jwks.json".into() });
    let mut moved = corp();
    moved.name = "moved".into();
    moved.issuer = Some("https://new-sso.example.com".into());
    let mut fresh = corp();
    fresh.name = "fresh".into();
    let gateway = gateway(vec![corp(), pinned, moved, fresh, cluster()]);
    let gw = id("platform", "gw");
    let held = |source: KeySource, document: &str| HeldKeySet {
        source,
        document: Some(document.into()),
        keys: 1,
        fetched_at: None,
        error: Some("a later fetch failed".into()),
        seeded_issuer: None,
    };
    let corp_source = KeySource::Discovery { issuer: "https://sso.example.com/realms/corp".into() };
    let pinned_source =
        KeySource::ConfigMap { namespace: "platform".into(), name: "jwks".into(), key: "jwks.json".into() };
    let index: KeySetIndex = [
        ("corp", held(corp_source.clone(), r#"{"keys":["corp"]}"#)),
        ("pinned", held(pinned_source, r#"{"keys":["pinned"]}"#)),
        // Held from the issuer it named before its edit.
        ("moved", held(corp_source, r#"{"keys":["old"]}"#)),
        ("cluster", held(KeySource::Cluster, r#"{"keys":["cluster"]}"#)),
    ]
    .into_iter()
    .map(|(name, held)| ((gw.clone(), name.to_owned()), held))
    .collect();
    let mut catalog = Catalog::from_objects(&[], &[], &[], &[], &[]);
    catalog.key_sets = Arc::new(index);
    catalog.service_account_issuer = Some("https://kubernetes.default.svc".into());
    let compiled = catalog.compile(&gateway, now());
    let key_set = |name: &str| {
        let provider = compiled.config.providers.iter().find(|p| p.name == name).unwrap();
        provider.key_set.as_deref()
    };
    assert_eq!(key_set("corp"), Some(r#"{"keys":["corp"]}"#), "the last good set serves through a failing fetch");
    assert_eq!(key_set("pinned"), Some(r#"{"keys":["pinned"]}"#));
    assert_eq!(key_set("cluster"), Some(r#"{"keys":["cluster"]}"#));
    assert_eq!(key_set("moved"), None, "fetched from another issuer");
    assert_eq!(key_set("fresh"), None, "none fetched yet: compiled without one");
    assert_eq!(compiled.gateway, None, "a provider without a key set is no refusal of the Gateway");
    assert!(compiled.config.validate().is_ok());
}

/// The refresher finds a provider's source from its spec, compile from
/// its config entry: the two agree for every kind of source.
#[test]
fn a_providers_source_reads_the_same_from_its_spec_and_its_config_entry() {
    use crate::compile::key_source::KeySource;
    let pin = |mut provider: IdentityProvider| {
        provider.name = format!("{}-pinned", provider.name);
        provider.config_map_ref = Some(ConfigMapKeyRef { name: "jwks".into(), key: "jwks.json".into() });
        provider
    };
    let mut listed = corp();
    listed.name = "listed".into();
    listed.jwks_uri = Some("https://sso.example.com/keys".into());
    let specs = [corp(), listed, pin(corp()), cluster(), pin(cluster())];
    let gateway = gateway(specs.to_vec());
    let compiled = compile(&gateway, Vec::new(), Some("https://kubernetes.default.svc"));
    assert_eq!(compiled.config.providers.len(), specs.len());
    let mut kinds = std::collections::HashSet::new();
    for (spec, entry) in specs.iter().zip(&compiled.config.providers) {
        let source = KeySource::of_spec(spec, "platform").unwrap();
        assert_eq!(source, KeySource::of_config(entry), "{}", spec.name);
        kinds.insert(std::mem::discriminant(&source));
    }
    assert_eq!(kinds.len(), 4, "every kind of source");
}
