//! The snapshot's indexes: keys by digest, routes by name and alias,
//! allow-lists and visibility bits, pools kept across reloads.

use super::*;
use waycast_crds::config::{BackendConfig, ClientTlsConfig, KeyConfig, ModelConfig};

fn config(models: Vec<ModelConfig>, keys: Vec<KeyConfig>) -> GatewayConfig {
    GatewayConfig { models, keys, ..GatewayConfig::empty() }
}

fn model(name: &str, aliases: &[&str], weights: &[u32]) -> ModelConfig {
    let mut model = ModelConfig::to(name, "http://unused/v1");
    model.aliases = aliases.iter().map(|a| (*a).into()).collect();
    model.backends = weights
        .iter()
        .enumerate()
        .map(|(i, weight)| {
            let mut backend = BackendConfig::to(format!("http://10.0.0.{i}:8000/v1/"));
            backend.weight = *weight;
            backend
        })
        .collect();
    model
}

/// A key whose sha256 is the length of its id, zero-padded.
fn key(id: &str, models: Option<&[&str]>) -> KeyConfig {
    let mut key = KeyConfig::new(id, format!("{:0>64}", id.len()));
    key.models = models.map(|m| m.iter().map(|s| (*s).to_owned()).collect());
    key
}

fn key_of<'s>(snapshot: &'s Snapshot, id: &str) -> &'s KeyEntry {
    snapshot.key(&waycast_crds::digest::parse_sha256_hex(&format!("{:0>64}", id.len())).unwrap()).unwrap()
}

#[test]
fn resolves_names_aliases_and_allow_lists() {
    let snapshot = Snapshot::standalone(
        &config(
            vec![model("llama-3", &["llama"], &[1]), model("mistral", &[], &[1])],
            vec![key("a", Some(&["llama"])), key("bb", None)],
        ),
        "h".into(),
    )
    .unwrap();
    let (restricted, open) = (key_of(&snapshot, "a"), key_of(&snapshot, "bb"));
    assert_eq!(snapshot.resolve(open, "llama"), Some(0));
    assert_eq!(snapshot.resolve(open, "mistral"), Some(1));
    assert_eq!(snapshot.resolve(open, "gpt"), None);
    assert!(restricted.allows(0), "an alias in the allow-list allows the model");
    assert!(!restricted.allows(1));
    assert!(open.allows(0) && open.allows(1));
    assert_eq!(snapshot.route(0).backends[0].base_path, "/v1");
}

/// A name is its owner's: a key resolves it in its own namespace, then
/// among the platform's models, and reaches another team's model of that
/// name only by opting in to it (`namespace/pattern`).
#[test]
fn a_name_resolves_in_the_keys_own_namespace_then_the_platform_then_opt_ins() {
    let team = |name: &str, namespace: &str, shared: Option<&[&str]>| {
        let mut team = model(name, &[], &[1]);
        team.namespace = Some(namespace.into());
        team.source = Some(format!("{namespace}/{name}"));
        team.key_namespaces = shared.map(|s| s.iter().map(|n| (*n).to_owned()).collect());
        team
    };
    let models = vec![
        model("llama-70b", &[], &[1]),                  // 0: the platform's
        team("llama-70b", "squatter", None),            // 1: shared with every namespace
        team("llama-70b", "team-a", Some(&["team-a"])), // 2: team-a's own
        team("vision", "team-c", None),                 // 3: only by opt-in
    ];
    let keys = vec![
        key("team-a/alice", None),
        key("team-b/bob", None),
        key("team-b/carolyn", Some(&["squatter/llama-*", "vision", "team-c/*"])),
    ];
    let snapshot = Snapshot::standalone(&config(models, keys), "h".into()).unwrap();
    let (alice, bob, carol) =
        (key_of(&snapshot, "team-a/alice"), key_of(&snapshot, "team-b/bob"), key_of(&snapshot, "team-b/carolyn"));
    assert_eq!(snapshot.resolve(alice, "llama-70b"), Some(2), "its own namespace's first");
    assert_eq!(snapshot.resolve(bob, "llama-70b"), Some(0), "then the platform's: the squatter gets nothing");
    assert_eq!(snapshot.resolve(bob, "vision"), None, "another team's model without an opt-in does not exist");
    assert_eq!(snapshot.resolve(carol, "llama-70b"), Some(0), "the platform's still comes before an opt-in");
    assert_eq!(snapshot.resolve(carol, "vision"), Some(3), "opted in");
    assert!(carol.allows(3) && carol.allows(1), "an opt-in allows");
    assert!(!carol.allows(0), "a bare pattern allows only the home models it matches");
    assert_eq!(&*snapshot.route(2).name, "team-a/llama-70b", "team models are told apart in metrics");
    // A model name with a `/` in an allow-list still allows that model.
    let hugging = Snapshot::standalone(
        &config(
            vec![model("meta-llama/Llama-3.1-8B", &[], &[1])],
            vec![key("team-a/hf", Some(&["meta-llama/Llama-3.1-8B"]))],
        ),
        "h".into(),
    )
    .unwrap();
    let hf = key_of(&hugging, "team-a/hf");
    assert_eq!(hugging.resolve(hf, "meta-llama/Llama-3.1-8B"), Some(0));
    assert!(hf.allows(0));
    assert_eq!(&*snapshot.route(0).name, "llama-70b");
}

/// A model whose runtime state cannot be built, or that fails its own
/// checks, is left out alone and listed; the rest of the config serves.
#[test]
fn an_entry_that_cannot_be_built_is_left_out_alone() {
    let mut bad_ca = model("vision", &[], &[1]);
    bad_ca.backends[0].url = "https://vision.example/v1".into();
    bad_ca.backends[0].tls = Some(ClientTlsConfig { ca_pem: Some("not pem".into()), ..Default::default() });
    let mut bad_name = model("other", &[], &[1]);
    bad_name.backends[0].tls = Some(ClientTlsConfig { server_name: Some("a..b".into()), ..Default::default() });
    let mut bad_hash = key("team-a/broken", None);
    bad_hash.sha256 = "zz".repeat(32);
    let models = vec![model("llama", &[], &[1]), bad_ca, bad_name];
    let snapshot =
        Snapshot::standalone(&config(models, vec![key("team-a/alice", None), bad_hash]), "h".into()).unwrap();
    assert_eq!(snapshot.routes().len(), 1);
    assert_eq!(snapshot.key_count(), 1);
    let entries: Vec<&str> = snapshot.dropped.iter().map(|d| d.entry.as_str()).collect();
    assert_eq!(entries, ["model vision", "model other", "key team-a/broken"], "{:?}", snapshot.dropped);
    assert!(snapshot.dropped[0].reason.contains("caPem"), "{:?}", snapshot.dropped[0]);
    assert_eq!(snapshot.resolve(key_of(&snapshot, "team-a/alice"), "llama"), Some(0));
}

/// A model that passes its checks but whose client fails to set up (a
/// key rustls will not use) is left out at build time.
#[test]
fn a_model_whose_client_cannot_be_made_is_left_out_at_build() {
    let mut unusable = model("vision", &[], &[1]);
    unusable.backends[0].url = "https://vision.example/v1".into();
    // PEM that parses, DER that no signer accepts.
    let certificate = "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n";
    let key = "-----BEGIN PRIVATE KEY-----\nMA==\n-----END PRIVATE KEY-----\n";
    unusable.backends[0].tls = Some(ClientTlsConfig {
        client_cert_pem: Some(certificate.into()),
        client_key_pem: Some(key.into()),
        ..Default::default()
    });
    let config = config(vec![unusable, model("llama", &[], &[1])], vec![]);
    let (screened, dropped) = screen(config).unwrap();
    assert!(dropped.is_empty(), "it passes the config's checks: {dropped:?}");
    let snapshot =
        Snapshot::build(screened.clone(), "h".into(), &Registry::default().lend(&screened).unwrap(), dropped).unwrap();
    assert_eq!(snapshot.routes().len(), 1);
    assert_eq!(snapshot.dropped[0].entry, "model vision");
    assert!(snapshot.dropped[0].reason.contains("backends[0].tls"), "{:?}", snapshot.dropped[0]);
}

#[test]
fn spreads_by_weight_and_fails_over_to_fallbacks_last() {
    let snapshot = Snapshot::standalone(&config(vec![model("m", &[], &[3, 1, 0])], vec![]), "h".into()).unwrap();
    let route = snapshot.route(0);
    let mut first_picks = [0; 3];
    for _ in 0..400 {
        let order: Vec<usize> = route.backend_order().collect();
        assert_eq!(order.len(), 3);
        assert_eq!(order[2], 2, "the weight-0 backend is only a fallback: {order:?}");
        first_picks[order[0]] += 1;
    }
    assert_eq!(first_picks, [300, 100, 0]);
}

#[test]
fn hex_digests() {
    assert!(waycast_crds::digest::parse_sha256_hex(&"ab".repeat(32)).is_some());
    assert!(waycast_crds::digest::parse_sha256_hex("abc").is_none());
    assert!(waycast_crds::digest::parse_sha256_hex(&"zz".repeat(32)).is_none());
}

#[test]
fn a_lower_priority_tier_comes_only_after_every_backend_of_the_tier_before() {
    let mut config = config(vec![model("m", &[], &[1, 1, 1])], vec![]);
    // The external provider first in the list, but in tier 1.
    config.models[0].backends[0].priority = 1;
    let snapshot = Snapshot::standalone(&config, "h".into()).unwrap();
    let route = snapshot.route(0);
    let tier_of = |index: usize| route.backends[index].priority;
    let mut firsts = [0; 3];
    for _ in 0..100 {
        let order: Vec<usize> = route.backend_order().collect();
        assert_eq!(order.len(), 3);
        assert_eq!(order.iter().map(|i| tier_of(*i)).collect::<Vec<_>>(), [0, 0, 1], "{order:?}");
        firsts[order[0]] += 1;
    }
    assert!(firsts[0] == 50 && firsts[1] == 50, "tier 0 shares its requests by weight: {firsts:?}");
}

/// A snapshot shares what the registry lent rather than copying it: each
/// key's id is the usage map's own text, and the counts are the loan's
/// maps (at 100,000 keys, a copy of each per snapshot was megabytes).
#[test]
fn a_snapshot_shares_the_ids_and_counts_it_was_lent() {
    let config = config(vec![model("m", &[], &[1])], vec![key("team/a", None), key("team/bb", None)]);
    let (screened, dropped) = screen(config).unwrap();
    let lent = Registry::default().lend(&screened).unwrap();
    let snapshot = Snapshot::build(screened, "h".into(), &lent, dropped).unwrap();
    let counts = lent.counts();
    assert!(Arc::ptr_eq(&snapshot.counts.usage, &counts.usage), "the usage counts are the loan's map");
    assert!(Arc::ptr_eq(&snapshot.counts.budgets, &counts.budgets), "the budget counts are the loan's map");
    assert_eq!(snapshot.key_count(), 2);
    for entry in snapshot.keys.entries() {
        let (held, usage) = counts.usage.get_key_value(&*entry.id).unwrap();
        assert!(Arc::ptr_eq(held, &entry.id), "{}: its id is the usage map's", entry.id);
        assert!(Arc::ptr_eq(usage, &entry.usage), "{}: its usage is the one lent", entry.id);
    }
}

/// A key with no allow-list, expiry, limits or budgets carries no box for
/// them (most keys: the table stays small); one with any of them does,
/// and reads them back.
#[test]
fn only_a_key_with_something_rare_carries_it_boxed() {
    let mut expiring = key("team/expiring", None);
    expiring.expires_at = Some("2030-01-01T00:00:00Z".parse().unwrap());
    let config = config(vec![model("m", &[], &[1])], vec![key("team/a", None), key("team/bb", Some(&["m"])), expiring]);
    let snapshot = Snapshot::standalone(&config, "h".into()).unwrap();
    let plain = key_of(&snapshot, "team/a");
    assert!(plain.rare.is_none(), "a plain key has no box");
    assert!(plain.allows(0) && plain.expires_at().is_none() && plain.limits().is_none() && plain.budgets().is_empty());
    assert!(key_of(&snapshot, "team/bb").rare.is_some(), "an allow-list is boxed");
    let expiring = key_of(&snapshot, "team/expiring");
    assert_eq!(expiring.expires_at(), Some("2030-01-01T00:00:00Z".parse().unwrap()));
}

/// A key's id text is allocated once: the next config's loan keeps the
/// one the last loan held (and the entries built on it share it).
#[test]
fn a_key_keeps_its_id_text_across_swaps() {
    let config = config(vec![model("m", &[], &[1])], vec![key("team/a", None)]);
    let (screened, _) = screen(config).unwrap();
    let mut registry = Registry::default();
    let first = registry.lend(&screened).unwrap();
    let held = first.counts().usage.keys().next().cloned().unwrap();
    registry.keep(first);
    let second = registry.lend(&screened).unwrap();
    let again = second.counts().usage.keys().next().cloned().unwrap();
    assert!(Arc::ptr_eq(&held, &again), "the second loan has its own copy of the id");
}
