//! The snapshot's indexes: keys by digest, routes by name and alias,
//! allow-lists and visibility bits, pools kept across reloads.

use super::*;
use waycast_crds::config::BackendConfig;

fn config(models: Vec<ModelConfig>, keys: Vec<KeyConfig>) -> GatewayConfig {
    GatewayConfig { models, keys, ..GatewayConfig::empty() }
}

fn model(name: &str, aliases: &[&str], weights: &[u32]) -> ModelConfig {
    ModelConfig {
        name: name.into(),
        aliases: aliases.iter().map(|a| (*a).into()).collect(),
        backends: weights
            .iter()
            .enumerate()
            .map(|(i, w)| BackendConfig { weight: *w, ..BackendConfig::to(format!("http://10.0.0.{i}:8000/v1/")) })
            .collect(),
        timeouts: TimeoutsConfig::default(),
        limits: None,
        source: None,
        key_namespaces: None,
        forward_headers: Vec::new(),
        output_token_reservation: None,
        load_balancing: Default::default(),
    }
}

fn key(id: &str, models: Option<&[&str]>) -> KeyConfig {
    KeyConfig {
        id: id.into(),
        sha256: format!("{:0>64}", id.len()),
        models: models.map(|m| m.iter().map(|s| (*s).to_owned()).collect()),
        expires_at: None,
        disabled: false,
        limits: None,
    }
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
    assert_eq!(snapshot.route_index("llama"), Some(0));
    assert_eq!(snapshot.route_index("mistral"), Some(1));
    assert_eq!(snapshot.route_index("gpt"), None);
    let restricted = snapshot.key(&waycast_crds::digest::parse_sha256_hex(&format!("{:0>64}", 1)).unwrap()).unwrap();
    assert!(restricted.allows(0), "an alias in the allow-list allows the model");
    assert!(!restricted.allows(1));
    let open = snapshot.key(&waycast_crds::digest::parse_sha256_hex(&format!("{:0>64}", 2)).unwrap()).unwrap();
    assert!(open.allows(0) && open.allows(1));
    assert_eq!(snapshot.route(0).backends[0].base_path, "/v1");
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
