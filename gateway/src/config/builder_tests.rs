//! The builder driven directly: a change of some key shards gives the
//! snapshot a whole build gives, and keeps the state of the keys it keeps.

use super::*;
use std::sync::Arc;
use waycast_crds::config::{LimitsConfig, ModelConfig};

const SHARDS: u32 = 4;

/// A key of `team-N` whose text is `text` (its digest is that number).
fn key(name: &str, text: u64) -> KeyConfig {
    KeyConfig::new(format!("team-{}/{name}", text % 3), format!("{text:064x}"))
}

fn base() -> GatewayConfig {
    let mut config = GatewayConfig::empty();
    config.models = vec![ModelConfig::to("m", "http://unused/v1")];
    config
}

/// 40 keys, every fifth with a rate limit, in `SHARDS` shards by text.
fn shards() -> Vec<Vec<KeyConfig>> {
    let mut shards = vec![Vec::new(); SHARDS as usize];
    for text in 1..=40 {
        let mut key = key(&format!("key-{text}"), text);
        key.limits = (text % 5 == 0).then(|| LimitsConfig::requests(60));
        shards[(text % u64::from(SHARDS)) as usize].push(key);
    }
    shards
}

/// The first key of `keys` with a rate limit.
fn limited(keys: &[KeyConfig]) -> usize {
    keys.iter().position(|key| key.limits.is_some()).unwrap()
}

fn whole(registry: &mut Registry, shards: &[Vec<KeyConfig>]) -> Snapshot {
    let mut builder = SnapshotBuilder::new(registry, base(), "next".into()).unwrap();
    for (index, keys) in (0..).zip(shards) {
        builder.add_shard(keys.clone(), index).unwrap();
    }
    builder.finish()
}

fn changed(registry: &mut Registry, serving: &Snapshot, shards: &[Vec<KeyConfig>], changed: &[u32]) -> Snapshot {
    let mut builder = SnapshotBuilder::from_serving(registry, serving, "next".into(), changed);
    for &index in changed {
        builder.add_shard(shards[index as usize].clone(), index).unwrap();
    }
    assert!(!builder.is_contested());
    builder.finish()
}

fn assert_alike(built: &Snapshot, whole: &Snapshot) {
    assert_eq!(built.hash, whole.hash);
    assert_eq!(built.key_count(), whole.key_count());
    assert_eq!(built.described_keys(), whole.described_keys(), "the tables differ");
    let dropped = |snapshot: &Snapshot| {
        let mut dropped: Vec<(String, String)> =
            snapshot.dropped.iter().map(|d| (d.entry.clone(), d.reason.clone())).collect();
        dropped.sort();
        dropped
    };
    assert_eq!(dropped(built), dropped(whole), "what is left out differs");
    let counted = |snapshot: &Snapshot| {
        let mut ids: Vec<String> = snapshot.counts.usage.keys().map(|id| id.to_string()).collect();
        ids.sort();
        ids
    };
    assert_eq!(counted(built), counted(whole), "the usage counts lent differ");
}

fn limits(snapshot: &Snapshot, key: &KeyConfig) -> Arc<crate::limit::LimitSet> {
    let digest = waycast_crds::digest::parse_sha256_hex(&key.sha256).unwrap();
    snapshot.key(&digest).unwrap().limits().unwrap().clone()
}

#[test]
fn a_change_of_some_shards_builds_the_snapshot_a_whole_build_does() {
    let before = shards();
    let mut after = before.clone();
    after[1][0].disabled = true;
    after[1][1].limits = Some(LimitsConfig::requests(120));
    after[1].remove(2);
    after[1].push(key("new", 1_001));
    after[1].push(KeyConfig::new("fresh-team/key", format!("{:064x}", 1_005)));
    let mut refused = key("refused", 1_009);
    refused.class = Some("gold".into());
    after[1].push(refused);
    let mut registry = Registry::default();
    let serving = whole(&mut registry, &before);
    let built = changed(&mut registry, &serving, &after, &[1]);
    let rebuilt = whole(&mut Registry::default(), &after);
    assert_alike(&built, &rebuilt);
    assert!(built.dropped.iter().any(|d| d.entry == "key team-1/refused"), "{:?}", built.dropped);
    // And a whole config at once (not in parts) is the same table.
    let mut config = base();
    config.keys = after.concat();
    let at_once = SnapshotBuilder::new(&mut Registry::default(), config, "next".into()).unwrap().finish();
    assert_eq!(at_once.key_count(), rebuilt.key_count());
}

#[test]
fn a_key_keeps_its_limiter_state_across_a_shard_change() {
    let before = shards();
    let (kept, beside) = (before[0][limited(&before[0])].clone(), before[1][limited(&before[1])].clone());
    let mut after = before.clone();
    let other = (0..after[1].len()).find(|index| after[1][*index].id != beside.id).unwrap();
    after[1][other].disabled = true;
    let mut registry = Registry::default();
    let serving = whole(&mut registry, &before);
    let built = changed(&mut registry, &serving, &after, &[1]);
    assert!(Arc::ptr_eq(&limits(&serving, &kept), &limits(&built, &kept)), "a key of a shard not read");
    assert!(Arc::ptr_eq(&limits(&serving, &beside), &limits(&built, &beside)), "a key of the shard read again");
    // And through the next whole build, from what the change kept.
    let again = whole(&mut registry, &after);
    assert!(Arc::ptr_eq(&limits(&serving, &beside), &limits(&again, &beside)));
}

/// The registry keeps a loan only once its snapshot is finished: a change
/// given up (two keys hold one text) leaves it as the serving build left it.
#[test]
fn a_change_given_up_keeps_nothing() {
    let before = shards();
    let at = limited(&before[1]);
    let limited = before[1][at].clone();
    let mut registry = Registry::default();
    let serving = whole(&mut registry, &before);
    let mut after = before.clone();
    after[1][at].limits = Some(LimitsConfig::requests(5));
    // Another key of shard 1 takes the text of a key of shard 0.
    let other = usize::from(at == 0);
    after[1][other].sha256 = before[0][0].sha256.clone();
    let mut builder = SnapshotBuilder::from_serving(&mut registry, &serving, "next".into(), &[1]);
    builder.add_shard(after[1].clone(), 1).unwrap();
    assert!(builder.is_contested());
    drop(builder);
    let again = whole(&mut registry, &before);
    assert!(Arc::ptr_eq(&limits(&serving, &limited), &limits(&again, &limited)), "the serving state, unchanged");
}
