use super::*;

fn config(keys: usize) -> GatewayConfig {
    let mut config = GatewayConfig::empty();
    config.keys = (0..keys)
        .map(|n| KeyConfig::new(format!("team-{}/key-{n}", n % 7), sha256_hex(format!("key {n}").as_bytes())))
        .collect();
    config
}

fn held(parts: &Parts) -> Vec<Option<&[u8]>> {
    parts.shards.iter().map(|shard| Some(shard.as_slice())).collect()
}

#[test]
fn a_split_config_assembles_to_the_same_keys_and_settings() {
    let original = config(5000);
    let parts = split(&original, 8).unwrap();
    assert_eq!(parts.shards.len(), 8);
    let assembled = assemble(&parts.manifest, &parts.base, &held(&parts)).unwrap();
    assert_eq!(
        GatewayConfig { keys: Vec::new(), ..assembled.clone() },
        GatewayConfig { keys: Vec::new(), ..original.clone() }
    );
    let ids = |config: &GatewayConfig| {
        let mut ids: Vec<String> = config.keys.iter().map(|k| k.id.clone()).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&assembled), ids(&original));
    // Spread: no shard holds more than twice its share.
    for shard in &parts.shards {
        let shard: KeyShard = serde_json::from_slice(shard).unwrap();
        assert!(shard.keys.len() < 2 * 5000 / 8, "shard {} holds {}", shard.index, shard.keys.len());
    }
}

#[test]
fn one_key_changed_rewrites_one_shard_and_the_manifest() {
    let mut config = config(3000);
    let before = split(&config, 4).unwrap();
    config.keys[1234].disabled = true;
    let after = split(&config, 4).unwrap();
    assert_eq!(before.base, after.base);
    let changed: Vec<usize> = (0..4).filter(|&i| before.shards[i] != after.shards[i]).collect();
    assert_eq!(changed, vec![shard_of(&config.keys[1234].id, 4) as usize]);
    assert_ne!(before.manifest.hash(), after.manifest.hash());
    // A model change rewrites the base alone.
    config.settings.max_request_body_bytes = 1234;
    let settings = split(&config, 4).unwrap();
    assert_ne!(settings.base, after.base);
    assert_eq!(settings.shards, after.shards);
}

/// A pod holding the new manifest with an old shard (the operator stopped
/// between two writes, or the watch has not delivered the second) has no
/// config to swap to: it keeps the one it serves.
#[test]
fn a_set_with_a_part_of_another_version_does_not_assemble() {
    let mut config = config(3000);
    let old = split(&config, 4).unwrap();
    config.keys[7].disabled = true;
    let new = split(&config, 4).unwrap();
    let changed = shard_of(&config.keys[7].id, 4);
    let mut mixed = held(&new);
    mixed[changed as usize] = Some(&old.shards[changed as usize]);
    assert_eq!(assemble(&new.manifest, &new.base, &mixed), Err(AssembleError::ShardNotNamed(changed)));
    // Missing.
    let mut missing = held(&new);
    missing[changed as usize] = None;
    assert_eq!(assemble(&new.manifest, &new.base, &missing), Err(AssembleError::ShardMissing(changed)));
    assert_eq!(assemble(&new.manifest, &new.base, &held(&new)[..3]), Err(AssembleError::ShardMissing(3)));
    // The old manifest with the new base.
    config.settings.max_request_body_bytes = 99;
    let rebased = split(&config, 4).unwrap();
    assert_eq!(assemble(&new.manifest, &rebased.base, &held(&new)), Err(AssembleError::BaseNotNamed));
}

/// Parts a hostile or broken writer made consistent by digest still do not
/// assemble when a key sits in a shard it does not hash to (it could
/// shadow a key of another shard) or a shard claims another place.
#[test]
fn a_key_in_the_wrong_shard_is_refused() {
    let config = config(100);
    let mut parts = split(&config, 4).unwrap();
    let mut first: KeyShard = serde_json::from_slice(&parts.shards[0]).unwrap();
    let stray = config.keys.iter().find(|k| shard_of(&k.id, 4) != 0).unwrap().clone();
    first.keys.push(stray.clone());
    parts.shards[0] = serde_json::to_vec(&first).unwrap();
    parts.manifest.shards[0] = sha256_hex(&parts.shards[0]);
    let refused = assemble(&parts.manifest, &parts.base, &held(&parts));
    assert_eq!(
        refused,
        Err(AssembleError::Misplaced { index: 0, id: stray.id.clone(), belongs: shard_of(&stray.id, 4) })
    );

    let mut parts = split(&config, 4).unwrap();
    let (zero, one) = (parts.shards[0].clone(), parts.shards[1].clone());
    parts.shards[0] = one;
    parts.shards[1] = zero;
    parts.manifest.shards.swap(0, 1);
    let refused = assemble(&parts.manifest, &parts.base, &held(&parts)).unwrap_err();
    assert!(matches!(refused, AssembleError::Unreadable { ref part, .. } if part == "shard 0"), "{refused}");
}

#[test]
fn manifests_are_checked_before_any_part_is_read() {
    let good = split(&config(10), 2).unwrap().manifest;
    assert_eq!(Manifest::parse(&good.to_canonical_json()), Ok(good.clone()));
    for (bad, says) in [
        (Manifest { api_version: "waycast.dev/config-manifest-v9".into(), ..good.clone() }, "apiVersion"),
        (Manifest { shards: Vec::new(), ..good.clone() }, "0 shards"),
        (Manifest { shards: vec![good.base.clone(); MAX_SHARDS as usize + 1], ..good.clone() }, "1025 shards"),
        (Manifest { base: "not-hex".into(), ..good.clone() }, "64 hex"),
    ] {
        let Err(AssembleError::Manifest(reason)) = Manifest::parse(&bad.to_canonical_json()) else {
            panic!("{bad:?} accepted")
        };
        assert!(reason.contains(says), "{reason}");
    }
    assert!(matches!(Manifest::parse(b"{\"apiVersion\":1}"), Err(AssembleError::Manifest(_))));
}

#[test]
fn the_shard_count_follows_the_keys_in_powers_of_two_and_holds_against_small_changes() {
    assert_eq!(shard_count(0, None), 1);
    assert_eq!(shard_count(1000, None), 1);
    assert_eq!(shard_count(10_000, None), 16);
    assert_eq!(shard_count(100_000, None), 128);
    assert_eq!(shard_count(u32::MAX as usize, None), MAX_SHARDS);
    // Kept while each shard holds a quarter to twice the aim.
    assert_eq!(shard_count(100_001, Some(128)), 128);
    assert_eq!(shard_count(70_000, Some(128)), 128);
    assert_eq!(shard_count(2 * KEYS_PER_SHARD * 128 + 128, Some(128)), 512);
    assert_eq!(shard_count(KEYS_PER_SHARD / 4 * 128 - 128, Some(128)), 32);
    assert_eq!(shard_count(10, Some(1)), 1);
    // A count that is not one this version writes is chosen afresh.
    assert_eq!(shard_count(10_000, Some(3)), 16);
}

/// The layout is a contract between builds (an operator and pods of
/// different versions must put a key in the same shard): its digests are
/// pinned here.
#[test]
fn the_layout_is_stable_across_builds() {
    let placed: Vec<u32> =
        ["team-a/alice", "team-a/bob", "team-b/carol", "default/ci-1"].iter().map(|id| shard_of(id, 16)).collect();
    assert_eq!(placed, GOLDEN_PLACES);
    let parts = split(&config(20), 4).unwrap();
    // The keys' part only: the base follows the settings' defaults.
    assert_eq!(parts.manifest.shards[0], GOLDEN_FIRST_SHARD);
}

const GOLDEN_PLACES: [u32; 4] = [10, 10, 11, 0];
const GOLDEN_FIRST_SHARD: &str = "18d881bcbc51763f49cef67097bfab2a939790e4d4fa70a58dabf1798609245e";
