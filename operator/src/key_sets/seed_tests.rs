//! A starting operator's seeds: each Gateway's from the config written
//! for it, and for it alone. A config Secret lives in its Gateway's
//! namespace, where others than the platform team may write Secrets: what
//! one says of the cluster's ServiceAccount issuer must not become the
//! issuer every other Gateway is compiled with.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::sync::Arc;

use waycast_crds::config::ProviderConfig;
use waycast_crds::identity::{GatewayIdentity, IdentityProvider, ServiceAccountIssuer};

use super::refresher::Refresher;
use super::*;
use crate::catalog::Catalog;

const CLUSTER: &str = "https://kubernetes.default.svc.cluster.local";
const PLANTED: &str = "https://planted.example.com";
const SET: &str = r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#;

fn gateway(namespace: &str) -> Arc<Gateway> {
    let mut gateway = waycast_mock::fixtures::objects::gateway(namespace, "gw");
    let cluster = IdentityProvider {
        name: "cluster".into(),
        service_account_issuer: Some(ServiceAccountIssuer {}),
        audiences: vec!["waycast".into()],
        ..IdentityProvider::default()
    };
    gateway.spec.identity = Some(GatewayIdentity { providers: vec![cluster] });
    Arc::new(gateway)
}

/// The cluster's provider as a config Secret says it.
fn written(issuer: &str) -> Vec<ProviderConfig> {
    let mut provider = ProviderConfig::new("cluster", issuer, "waycast");
    provider.service_accounts = true;
    provider.key_set = Some(SET.into());
    vec![provider]
}

/// What a starting operator publishes before any Gateway compiles, the
/// configs written for the Gateways being `read` (as `controller/key_sets.rs`'s
/// `seeded` does).
fn starting(read: &[(Arc<Gateway>, Vec<ProviderConfig>)]) -> Published {
    let now = tokio::time::Instant::now();
    let mut refresher = Refresher::new(seed::seeds_of(read), now);
    refresher.sync(wanted(read.iter().map(|(gateway, _)| gateway.as_ref())).0, now);
    refresher.published()
}

/// The issuer `gateway`'s cluster provider compiles with over `published`.
fn compiled_issuer(gateway: &Gateway, published: &Published) -> Option<String> {
    let mut catalog = Catalog::from_objects(&[], &[], &[], &[], &[]);
    catalog.key_sets = published.index.clone();
    catalog.service_account_issuer = published.cluster_issuer.clone();
    let compiled = catalog.compile(gateway, jiff::Timestamp::from_second(2_000_000_000).unwrap());
    compiled.config.providers.iter().find(|p| p.name == "cluster").map(|p| p.issuer.clone())
}

#[test]
fn a_gateways_written_config_seeds_its_own_cluster_issuer_and_no_other_gateways() {
    // The tenant's config Secret was edited to name an issuer of theirs;
    // read first (its namespace sorts first), it was the issuer every
    // Gateway compiled with until the API server answered.
    let (tenant, platform, fresh) = (gateway("apps"), gateway("platform"), gateway("team-y"));
    let read = vec![(tenant.clone(), written(PLANTED)), (platform.clone(), written(CLUSTER)), (fresh.clone(), vec![])];
    let published = starting(&read);
    assert_eq!(published.cluster_issuer, None, "no config names the issuer every Gateway compiles with");
    assert_eq!(compiled_issuer(&platform, &published).as_deref(), Some(CLUSTER), "its own, not the tenant's");
    assert_eq!(compiled_issuer(&tenant, &published).as_deref(), Some(PLANTED), "the tenant's Gateway alone");
    assert_eq!(compiled_issuer(&fresh, &published), None, "no config written: it waits for the API server's");
    // Once the API server names its issuer, it serves every Gateway.
    let known = Published { cluster_issuer: Some(CLUSTER.into()), ..published };
    assert_eq!(compiled_issuer(&tenant, &known).as_deref(), Some(CLUSTER));
}
