use waycast_crds::GatewayConfig;
use waycast_crds::config::{KeyConfig, ModelConfig};

use super::*;
use crate::render::config_parts::{Layout, Layouts, config_parts};
use crate::render::fixtures;

const SALT: &str = "0123456789abcdef";

fn key(namespace: &str, n: usize) -> KeyConfig {
    KeyConfig::new(format!("{namespace}/key-{n}"), format!("{n:064x}"))
}

fn config(keys: impl IntoIterator<Item = KeyConfig>) -> GatewayConfig {
    let mut config = GatewayConfig::empty();
    config.models.push(ModelConfig::to("llama", "http://10.0.0.1/v1"));
    config.keys = keys.into_iter().collect();
    config.keys.sort_by(|a, b| a.id.cmp(&b.id));
    config
}

/// The parts of `config` in 4 shards under `SALT`, as a whole split writes them.
fn written(config: &GatewayConfig) -> ConfigParts {
    let layouts = Layouts { current: Some(Layout { shards: 4, salt: SALT.into() }), fresh_salt: SALT.into() };
    config_parts(&fixtures::gateway(Default::default()), config, &layouts).unwrap().unwrap()
}

fn kept(config: &GatewayConfig, tenants: bool) -> Kept {
    let basis = Basis { gateway: ("uid".into(), 1), position: 0, tenants };
    Kept::new(std::sync::Arc::new(written(config)), &config.keys, basis)
}

fn fleet() -> Vec<KeyConfig> {
    (0..3000).map(|n| key(if n % 2 == 0 { "team-a" } else { "team-b" }, n)).collect()
}

/// The parts as a patch leaves them equal those a split of the same keys gives.
fn assert_same(patched: &ConfigParts, split: &ConfigParts) {
    assert_eq!(patched.hash, split.hash);
    assert_eq!(patched.manifest, split.manifest);
    assert_eq!(patched.shards, split.shards);
    assert_eq!(patched.json_bytes, split.json_bytes);
    for index in 0..split.shards.len() {
        assert_eq!(patched.shard_json(index), split.shard_json(index), "shard {index}");
    }
}

#[test]
fn a_patch_writes_the_bytes_a_whole_split_writes() {
    let before = config(fleet());
    let mut kept = kept(&before, false);
    let mut changed_key = key("team-a", 10);
    changed_key.disabled = true;
    let added = key("team-c", 5000);
    let changes = vec![
        (added.id.clone(), Some(added.clone())),
        (changed_key.id.clone(), Some(changed_key.clone())),
        ("team-b/key-11".to_owned(), None),
        ("team-b/never-there".to_owned(), None),
    ];
    let touched = kept.patch(changes).unwrap();
    let after = config(
        fleet()
            .into_iter()
            .filter(|k| k.id != "team-b/key-11")
            .map(|k| if k.id == changed_key.id { changed_key.clone() } else { k })
            .chain([added]),
    );
    let split = written(&after);
    assert_same(&kept.parts, &split);
    let differ: Vec<usize> = (0..4).filter(|i| written(&before).shard_json(*i) != split.shard_json(*i)).collect();
    assert_eq!(touched, differ, "exactly the shards whose bytes moved are written");
    assert_ne!(kept.parts.hash, written(&before).hash);
}

#[test]
fn an_unchanged_entry_touches_nothing() {
    let before = config(fleet());
    let mut kept = kept(&before, false);
    let same = key("team-a", 10);
    assert_eq!(kept.patch(vec![(same.id.clone(), Some(same))]).unwrap(), Vec::<usize>::new());
    assert_same(&kept.parts, &written(&before));
}

#[test]
fn a_digest_another_key_serves_is_for_a_whole_compile() {
    let mut kept = kept(&config(fleet()), false);
    let copy = KeyConfig::new("team-c/copy", format!("{:064x}", 7));
    assert_eq!(kept.patch(vec![(copy.id.clone(), Some(copy))]), Err(Unpatchable::Duplicate));
    // The same key's own digest, kept while its other fields change, is not a duplicate.
    let mut kept = self::kept(&config(fleet()), false);
    let mut renamed_models = key("team-a", 8);
    renamed_models.models = Some(vec!["llama".into()]);
    assert!(kept.patch(vec![(renamed_models.id.clone(), Some(renamed_models))]).is_ok());
}

#[test]
fn a_namespace_first_or_last_key_under_tenant_policies_is_for_a_whole_compile() {
    let first = key("team-new", 9000);
    let mut with_policies = kept(&config(fleet()), true);
    let refused = with_policies.patch(vec![(first.id.clone(), Some(first.clone()))]);
    assert_eq!(refused, Err(Unpatchable::Tenant("team-new".into())));
    let mut without = kept(&config(fleet()), false);
    assert!(without.patch(vec![(first.id.clone(), Some(first.clone()))]).is_ok());
    // A namespace's only key changed (removed and added back) keeps its tenant.
    let lone = config(fleet().into_iter().chain([first.clone()]));
    let mut with_policies = kept(&lone, true);
    let mut changed = first.clone();
    changed.disabled = true;
    assert!(with_policies.patch(vec![(first.id.clone(), Some(changed))]).is_ok());
    assert_eq!(
        with_policies.patch(vec![(first.id.clone(), None)]),
        Err(Unpatchable::Tenant("team-new".into())),
        "its last key gone"
    );
}

#[test]
fn a_key_count_the_shard_count_no_longer_keeps_is_for_a_whole_compile() {
    // 4 shards keep keys while each holds at most 1,280 on average.
    let most = (0..4 * 1281 - 1).map(|n| key("team-a", n));
    let mut kept = kept(&config(most), false);
    let one_more = key("team-a", 99_999);
    assert_eq!(kept.patch(vec![(one_more.id.clone(), Some(one_more))]), Err(Unpatchable::Recount(4 * 1281)));
}
