//! A config in parts built a shard at a time, and a change of some shards
//! built from the serving table: the same snapshot as a whole build.

use super::*;
use std::sync::Arc;
use waycast_crds::config::{KeyConfig, LimitsConfig, ModelConfig};
use waycast_crds::shards::Manifest;

const SALT: &str = "0123456789abcdef";

/// A key of `team-N` whose text is `text` (its digest is that number).
fn key(name: &str, text: u64) -> KeyConfig {
    KeyConfig::new(format!("team-{}/{name}", text % 3), format!("{text:064x}"))
}

fn config(keys: Vec<KeyConfig>) -> GatewayConfig {
    let mut config = GatewayConfig::empty();
    config.models = vec![ModelConfig::to("m", "http://unused/v1")];
    config.keys = keys;
    config
}

/// 60 keys, every fifth with a rate limit.
fn keys() -> Vec<KeyConfig> {
    (1..=60)
        .map(|text| {
            let mut key = key(&format!("key-{text}"), text);
            key.limits = (text % 5 == 0).then(|| LimitsConfig::requests(60));
            key
        })
        .collect()
}

fn held(config: &GatewayConfig, shards: u32) -> HeldParts {
    HeldParts::of_split("c", &shards::split(config, SALT, shards).unwrap()).unwrap()
}

fn identity(held: &HeldParts) -> String {
    held.manifest.hash().unwrap()
}

fn whole(held: &HeldParts) -> Snapshot {
    load_parts(held, identity(held), None, &mut Registry::default()).unwrap().unwrap()
}

fn shard_of(manifest: &Manifest, id: &str) -> u32 {
    shards::shard_of(&manifest.salt, id, u32::try_from(manifest.shards.len()).unwrap())
}

/// The serving config's snapshot, and the next one built from it.
fn swapped(first: &HeldParts, next: &HeldParts) -> (Snapshot, Snapshot) {
    let mut registry = Registry::default();
    let serving = load_parts(first, identity(first), None, &mut registry).unwrap().unwrap();
    let built = load_parts(next, identity(next), Some(&serving), &mut registry).unwrap().unwrap();
    (serving, built)
}

fn assert_serve_alike(built: &Snapshot, whole: &Snapshot) {
    assert_eq!(built.hash, whole.hash);
    assert_eq!(built.key_count(), whole.key_count());
    assert_eq!(built.described_keys(), whole.described_keys(), "the tables differ");
    let entries = |snapshot: &Snapshot| {
        let mut dropped: Vec<(String, String)> =
            snapshot.dropped.iter().map(|d| (d.entry.clone(), d.reason.clone())).collect();
        dropped.sort();
        dropped
    };
    assert_eq!(entries(built), entries(whole), "what is left out differs");
    assert_eq!(built.part_sizes(), whole.part_sizes(), "the parts' sizes differ");
    let counted = |snapshot: &Snapshot| {
        let mut ids: Vec<String> = snapshot.counts.usage.keys().map(|id| id.to_string()).collect();
        ids.sort();
        ids
    };
    assert_eq!(counted(built), counted(whole), "the usage counts lent differ");
}

#[test]
fn a_change_of_some_shards_builds_the_table_a_whole_build_does() {
    let before = config(keys());
    let mut after = before.clone();
    after.keys[2].disabled = true;
    after.keys[9].limits = Some(LimitsConfig::requests(120));
    after.keys.remove(6);
    after.keys.push(key("new", 1_000));
    // A key of a namespace no key had.
    after.keys.push(KeyConfig::new("fresh-team/key", format!("{:064x}", 1_002)));
    // A key the next config refuses (its class is no class of the
    // Gateway's) is left out, as a whole build leaves it out.
    let mut refused = key("refused", 1_001);
    refused.class = Some("gold".into());
    after.keys.push(refused);
    let (first, next) = (held(&before, 8), held(&after, 8));
    let changed: Vec<u32> =
        (0..8).filter(|i| first.manifest.shards[*i as usize] != next.manifest.shards[*i as usize]).collect();
    assert!(!changed.is_empty() && changed.len() < 8, "some shards change, not all: {changed:?}");
    let (serving, built) = swapped(&first, &next);
    assert_eq!(serving.changed_shards(&next.manifest), Some(changed.clone()));
    assert_serve_alike(&built, &whole(&next));
    assert_eq!(built.key_shards_read(), Some(changed.len()));
    assert_eq!(whole(&next).key_shards_read(), Some(8));
    assert!(built.dropped.iter().any(|d| d.entry == "key team-2/refused"), "{:?}", built.dropped);

    // And back: the refused key's shard changes again, and it is no longer listed.
    let mut registry = Registry::default();
    let serving = load_parts(&next, identity(&next), None, &mut registry).unwrap().unwrap();
    let back = load_parts(&first, identity(&first), Some(&serving), &mut registry).unwrap().unwrap();
    assert_serve_alike(&back, &whole(&first));
    assert!(back.dropped.is_empty(), "{:?}", back.dropped);
}

#[test]
fn a_change_reads_only_the_shards_it_changed() {
    let before = config(keys());
    let mut after = before.clone();
    after.keys[0].disabled = true;
    let (first, mut next) = (held(&before, 8), held(&after, 8));
    let changed = shard_of(&next.manifest, &after.keys[0].id);
    let unchanged = (changed + 1) % 8;
    // An unchanged shard's bytes no longer unpack: a build that read it
    // would fail.
    next.replace(unchanged as usize + 1, b"not gzip");
    let (_, built) = swapped(&first, &next);
    assert_serve_alike(&built, &whole(&held(&after, 8)));
    assert_eq!(built.key_shards_read(), Some(1));
    let error = load_parts(&next, identity(&next), None, &mut Registry::default()).err().unwrap();
    assert!(error.to_string().contains(&format!("c-keys-8-{unchanged}")), "a whole build reads it: {error}");
}

#[test]
fn a_new_base_or_shard_count_is_built_whole() {
    let before = config(keys());
    let mut models_changed = before.clone();
    models_changed.models.push(ModelConfig::to("n", "http://unused/v1"));
    models_changed.keys[0].disabled = true;
    let first = held(&before, 8);
    let serving = whole(&first);
    assert_eq!(serving.changed_shards(&held(&models_changed, 8).manifest), None, "another base");
    assert_eq!(serving.changed_shards(&held(&before, 4).manifest), None, "another shard count");
    let salted = HeldParts::of_split("c", &shards::split(&before, "fedcba9876543210", 8).unwrap()).unwrap();
    assert_eq!(serving.changed_shards(&salted.manifest), None, "another salt");
    let (_, built) = swapped(&first, &held(&models_changed, 8));
    assert_serve_alike(&built, &whole(&held(&models_changed, 8)));
    assert_eq!(built.routes().len(), 2);
}

/// Two keys holding one text: the one with the lower id is served, the
/// other left out, as a whole config checked in id order does; a change
/// that makes or unmakes such a pair is built whole.
#[test]
fn a_key_text_two_keys_hold_is_served_for_the_lower_id_only() {
    let before = config(keys());
    let manifest = held(&before, 8).manifest;
    // Two keys of one namespace in different shards; the second takes the
    // first's text.
    let (first_index, second_index) = (0..before.keys.len())
        .flat_map(|a| (a + 1..before.keys.len()).map(move |b| (a, b)))
        .find(|(a, b)| {
            let (a, b) = (&before.keys[*a], &before.keys[*b]);
            a.namespace() == b.namespace() && a.id < b.id && shard_of(&manifest, &a.id) != shard_of(&manifest, &b.id)
        })
        .unwrap();
    let (lower, higher) = (before.keys[first_index].id.clone(), before.keys[second_index].id.clone());
    let mut after = before.clone();
    after.keys[second_index].sha256 = after.keys[first_index].sha256.clone();
    let (first, next) = (held(&before, 8), held(&after, 8));
    let (_, built) = swapped(&first, &next);
    let whole_next = whole(&next);
    assert_serve_alike(&built, &whole_next);
    assert_eq!(built.key_shards_read(), Some(8), "a change that makes a pair is built whole");
    assert!(whole_next.is_contested());
    assert_eq!(whole_next.key_count(), 59, "one of the two is left out");
    assert!(whole_next.dropped.iter().any(|d| d.entry == format!("key {higher}")), "{:?}", whole_next.dropped);
    // From a table with such a pair, every change is built whole: here the
    // lower key's text changes (its shard alone), and the higher key, whose
    // shard did not change, is served again.
    let mut later = after.clone();
    later.keys[first_index].sha256 = format!("{:064x}", 5_000);
    assert_eq!(whole_next.changed_shards(&held(&later, 8).manifest), None);
    let (_, mended) = swapped(&next, &held(&later, 8));
    assert_serve_alike(&mended, &whole(&held(&later, 8)));
    assert_eq!(mended.key_count(), 60, "both served again: {lower} and {higher}");
}

/// A key keeps its state (its limiter) through changes of its shard, each
/// built from the last.
#[test]
fn a_key_keeps_its_state_through_changes_of_its_shard() {
    let before = config(keys());
    let mut added = before.clone();
    let mut limited = key("limited", 3_000);
    limited.limits = Some(LimitsConfig::requests(30));
    added.keys.push(limited.clone());
    let mut touched = added.clone();
    let neighbour = touched
        .keys
        .iter()
        .position(|key| {
            key.id != limited.id
                && shard_of(&held(&added, 8).manifest, &key.id) == shard_of(&held(&added, 8).manifest, &limited.id)
        })
        .unwrap();
    touched.keys[neighbour].disabled = true;
    let (first, second, third) = (held(&before, 8), held(&added, 8), held(&touched, 8));
    let mut registry = Registry::default();
    let one = load_parts(&first, identity(&first), None, &mut registry).unwrap().unwrap();
    let two = load_parts(&second, identity(&second), Some(&one), &mut registry).unwrap().unwrap();
    let three = load_parts(&third, identity(&third), Some(&two), &mut registry).unwrap().unwrap();
    assert_eq!((two.key_shards_read(), three.key_shards_read()), (Some(1), Some(1)));
    let digest = waycast_crds::digest::parse_sha256_hex(&limited.sha256).unwrap();
    let limits = |snapshot: &Snapshot| snapshot.key(&digest).unwrap().limits().unwrap().clone();
    assert!(Arc::ptr_eq(&limits(&two), &limits(&three)), "the limiter state carries over");
    assert_serve_alike(&three, &whole(&third));
}

#[test]
fn the_parts_together_stay_within_what_a_whole_config_may_be() {
    let parts = shards::split(&config(keys()), SALT, 4).unwrap();
    let total = (parts.base.len() + parts.shards.iter().map(Vec::len).sum::<usize>()) as u64;
    let held = HeldParts::of_split("c", &parts).unwrap();
    let built = load_every_part(&held, identity(&held), &mut Registry::default(), total).unwrap();
    assert_eq!(built.key_count(), 60);
    // Each part alone is within its bound; all of them together are a byte over.
    let error = load_every_part(&held, identity(&held), &mut Registry::default(), total - 1).err().unwrap();
    assert!(error.to_string().contains("c-keys-4-3"), "the part that crossed the bound is named: {error}");
    // A change is held to the same bound.
    let mut after = config(keys());
    after.keys.push(key("one-more", 2_000));
    let next = self::held(&after, 4);
    let grown = shards::split(&after, SALT, 4).unwrap();
    let grown_total = (grown.base.len() + grown.shards.iter().map(Vec::len).sum::<usize>()) as u64;
    let changed = built.changed_shards(&next.manifest).unwrap();
    let mut registry = Registry::default();
    let serving = load_every_part(&held, identity(&held), &mut registry, total).unwrap();
    let error = load_changed(&next, identity(&next), &serving, &changed, &mut registry, grown_total - 1).err().unwrap();
    assert!(matches!(error, LoadError::Parts(PartsError::Unreadable { .. })), "{error}");
    assert!(load_changed(&next, identity(&next), &serving, &changed, &mut registry, grown_total).unwrap().is_some());
}
