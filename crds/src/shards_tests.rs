use super::*;

const SALT: &str = "0123456789abcdef";
const OTHER_SALT: &str = "fedcba9876543210";

fn config(keys: usize) -> GatewayConfig {
    let mut config = GatewayConfig::empty();
    config.keys = (0..keys).map(|n| key(&format!("team-{}/key-{n}", n % 7))).collect();
    config
}

fn key(id: &str) -> KeyConfig {
    KeyConfig::new(id, sha256_hex(id.as_bytes()))
}

fn split_at(config: &GatewayConfig, shards: u32) -> Parts {
    split(config, SALT, shards).unwrap()
}

fn held(parts: &Parts) -> Vec<Option<&[u8]>> {
    parts.shards.iter().map(|shard| Some(shard.as_slice())).collect()
}

fn assembled(parts: &Parts) -> Result<GatewayConfig, AssembleError> {
    assemble(&parts.manifest, &parts.base, &held(parts))
}

fn shard(parts: &Parts, index: usize) -> KeyShard {
    serde_json::from_slice(&parts.shards[index]).unwrap()
}

/// Shard `index` edited as a hostile or broken writer would, with the
/// manifest naming the result, so that only the checks of what a shard
/// holds stand in the way.
fn rewrite_shard(parts: &mut Parts, index: usize, edit: impl FnOnce(&mut KeyShard)) {
    let mut edited = shard(parts, index);
    edit(&mut edited);
    parts.shards[index] = serde_json::to_vec(&edited).unwrap();
    parts.manifest.shards[index] = sha256_hex(&parts.shards[index]);
}

/// The first `count` ids with `pad` in their name that land in shard 0 of
/// `shards` under `salt`: what a tenant who knows the salt can make.
fn ground(salt: &str, shards: u32, count: usize, pad: &str) -> Vec<String> {
    (0..).map(|n| format!("tenant/{pad}{n}")).filter(|id| shard_of(salt, id, shards) == 0).take(count).collect()
}

/// Keys come back by id whatever the config's order, so equal key sets
/// assemble to equal configs and split again to the same bytes.
#[test]
fn a_split_config_assembles_to_the_same_keys_and_settings() {
    let original = config(5000);
    let parts = split_at(&original, 8);
    assert_eq!(parts.shards.len(), 8);
    let assembled = assembled(&parts).unwrap();
    assert_eq!(
        GatewayConfig { keys: Vec::new(), ..assembled.clone() },
        GatewayConfig { keys: Vec::new(), ..original.clone() }
    );
    let mut by_id = original.keys.clone();
    by_id.sort_by(|a, b| a.id.cmp(&b.id));
    assert_ne!(by_id, original.keys, "the fixture must not already be in id order");
    assert_eq!(assembled.keys, by_id);
    assert_eq!(split_at(&assembled, 8), parts);
    let mut reversed = original.clone();
    reversed.keys.reverse();
    assert_eq!(split_at(&reversed, 8), parts);
    // Spread: no shard holds more than twice its share.
    for index in 0..8 {
        let keys = shard(&parts, index).keys.len();
        assert!(keys < 2 * 5000 / 8, "shard {index} holds {keys}");
    }
}

#[test]
fn one_key_changed_rewrites_one_shard_and_the_manifest() {
    let mut config = config(3000);
    let before = split_at(&config, 4);
    config.keys[1234].disabled = true;
    let after = split_at(&config, 4);
    assert_eq!(before.base, after.base);
    let changed: Vec<usize> = (0..4).filter(|&i| before.shards[i] != after.shards[i]).collect();
    assert_eq!(changed, vec![shard_of(SALT, &config.keys[1234].id, 4) as usize]);
    assert_ne!(before.manifest.hash().unwrap(), after.manifest.hash().unwrap());
    // A settings change rewrites the base alone.
    config.settings.max_request_body_bytes = 1234;
    let settings = split_at(&config, 4);
    assert_ne!(settings.base, after.base);
    assert_eq!(settings.shards, after.shards);
}

/// A pod holding the new manifest with an old shard (the operator stopped
/// between two writes, or the watch has not delivered the second) has no
/// config to swap to: it keeps the one it serves.
#[test]
fn a_set_with_a_part_of_another_version_does_not_assemble() {
    let mut config = config(3000);
    let old = split_at(&config, 4);
    config.keys[7].disabled = true;
    let new = split_at(&config, 4);
    let changed = shard_of(SALT, &config.keys[7].id, 4);
    let mut mixed = held(&new);
    mixed[changed as usize] = Some(&old.shards[changed as usize]);
    assert_eq!(assemble(&new.manifest, &new.base, &mixed), Err(AssembleError::ShardNotNamed(changed)));
    // Missing.
    let mut missing = held(&new);
    missing[changed as usize] = None;
    assert_eq!(assemble(&new.manifest, &new.base, &missing), Err(AssembleError::ShardMissing(changed)));
    assert_eq!(assemble(&new.manifest, &new.base, &held(&new)[..3]), Err(AssembleError::ShardMissing(3)));
    // More than named: the caller did not pick the shards by this manifest.
    let mut extra = held(&new);
    extra.push(Some(&old.shards[0]));
    assert_eq!(assemble(&new.manifest, &new.base, &extra), Err(AssembleError::ShardsNotNamed { named: 4, given: 5 }));
    // The old manifest with the new base.
    config.settings.max_request_body_bytes = 99;
    let rebased = split_at(&config, 4);
    assert_eq!(assemble(&new.manifest, &rebased.base, &held(&new)), Err(AssembleError::BaseNotNamed));
}

/// Parts a hostile or broken writer made consistent by digest still do not
/// assemble when a key sits in a shard it does not hash to (it could
/// shadow a key of another shard) or a shard claims another place.
#[test]
fn a_key_in_the_wrong_shard_is_refused() {
    let config = config(100);
    let mut parts = split_at(&config, 4);
    let stray = config.keys.iter().find(|k| shard_of(SALT, &k.id, 4) != 0).unwrap().clone();
    rewrite_shard(&mut parts, 0, |shard| shard.keys.push(stray.clone()));
    assert_eq!(
        assembled(&parts),
        Err(AssembleError::Misplaced { index: 0, id: stray.id.clone(), belongs: shard_of(SALT, &stray.id, 4) })
    );

    let mut parts = split_at(&config, 4);
    parts.shards.swap(0, 1);
    parts.manifest.shards.swap(0, 1);
    let refused = assembled(&parts).unwrap_err();
    assert!(matches!(refused, AssembleError::Unreadable { ref part, .. } if part == "shard 0"), "{refused}");
}

/// Two entries with one id would leave which of them is served to the
/// order of the set.
#[test]
fn a_key_id_given_twice_is_refused() {
    let config = config(100);
    let mut parts = split_at(&config, 4);
    let mut twin = shard(&parts, 0).keys[0].clone();
    twin.sha256 = sha256_hex(b"another key text");
    rewrite_shard(&mut parts, 0, |shard| shard.keys.push(twin.clone()));
    assert_eq!(assembled(&parts), Err(AssembleError::DuplicateKey { index: 0, id: twin.id.clone() }));
    // Across shards: an id places its key in one shard, so the copy in
    // another is misplaced.
    let mut parts = split_at(&config, 4);
    let other = shard(&parts, 1).keys[0].clone();
    rewrite_shard(&mut parts, 0, |shard| shard.keys.push(other.clone()));
    assert_eq!(assembled(&parts), Err(AssembleError::Misplaced { index: 0, id: other.id.clone(), belongs: 1 }));
    // What assemble refuses, split does not write.
    let mut twice = config.clone();
    twice.keys.push(twin.clone());
    assert!(matches!(split(&twice, SALT, 4), Err(SplitError::DuplicateKey(id)) if id == twin.id));
}

/// Unsalted, names ground into one shard stayed there at every smaller
/// power of two; another salt (the operator's next, or one the tenant does
/// not know) spreads them.
#[test]
fn names_ground_against_one_salt_spread_under_another() {
    let ground = ground(SALT, 16, 64, "");
    for shards in [1, 2, 4, 8, 16] {
        assert!(ground.iter().all(|id| shard_of(SALT, id, shards) == 0), "{shards}");
    }
    let mut per_shard = [0; 16];
    for id in &ground {
        per_shard[shard_of(OTHER_SALT, id, 16) as usize] += 1;
    }
    assert!(per_shard.iter().all(|&keys| keys <= 16), "{per_shard:?}");
    assert!(per_shard.iter().filter(|&&keys| keys > 0).count() >= 8, "{per_shard:?}");
}

/// A reader places keys by the salt of the manifest it holds, not by one
/// of its own.
#[test]
fn keys_are_placed_by_the_manifests_salt() {
    let mut parts = split_at(&config(100), 4);
    assert!(assembled(&parts).is_ok());
    parts.manifest.salt = OTHER_SALT.into();
    assert!(matches!(assembled(&parts), Err(AssembleError::Misplaced { .. })), "{:?}", assembled(&parts));
}

/// Should a tenant learn the salt, the bound keeps a pile of keys out of a
/// Secret the API server would refuse (and the set with it).
#[test]
fn a_shard_too_large_for_a_secret_is_refused_not_written() {
    let mut config = GatewayConfig::empty();
    config.keys = ground(SALT, 16, 2500, &"x".repeat(240)).iter().map(|id| key(id)).collect();
    let Err(SplitError::ShardTooLarge { index, bytes }) = split(&config, SALT, 16) else {
        panic!("a shard of 2500 long keys was written")
    };
    assert_eq!(index, 0);
    assert!(bytes > MAX_SHARD_BYTES, "{bytes}");
    config.keys.truncate(1000);
    assert!(split(&config, SALT, 16).is_ok());
}

#[test]
fn split_refuses_a_salt_or_count_no_manifest_may_hold() {
    let config = config(10);
    for salt in ["", "0123456789abcde", "0123456789ABCDEF", "0123456789abcdeg", "0123456789abcdef0"] {
        assert!(matches!(split(&config, salt, 4), Err(SplitError::Salt)), "{salt:?}");
    }
    for shards in [0, 3, 12, 2 * MAX_SHARDS] {
        assert!(matches!(split(&config, SALT, shards), Err(SplitError::ShardCount(n)) if n == shards), "{shards}");
    }
}

/// Parsed or not, a manifest is checked before any part is read: assemble
/// does not trust its caller to have parsed it.
#[test]
fn manifests_are_checked_before_any_part_is_read() {
    let parts = split_at(&config(10), 2);
    let good = parts.manifest.clone();
    assert_eq!(Manifest::parse(&good.to_canonical_json().unwrap()), Ok(good.clone()));
    for (bad, says) in [
        (Manifest { api_version: "waycast.dev/config-manifest-v9".into(), ..good.clone() }, "apiVersion"),
        (Manifest { salt: String::new(), ..good.clone() }, "salt"),
        (Manifest { salt: SALT.to_uppercase(), ..good.clone() }, "salt"),
        (Manifest { shards: Vec::new(), ..good.clone() }, "0 shards"),
        (Manifest { shards: vec![good.base.clone(); 3], ..good.clone() }, "3 shards"),
        (Manifest { shards: vec![good.base.clone(); MAX_SHARDS as usize + 1], ..good.clone() }, "1025 shards"),
        (Manifest { base: "not-hex".into(), ..good.clone() }, "64 hex"),
    ] {
        let Err(AssembleError::Manifest(reason)) = Manifest::parse(&bad.to_canonical_json().unwrap()) else {
            panic!("{bad:?} parsed")
        };
        assert!(reason.contains(says), "{reason}");
        assert_eq!(assemble(&bad, &parts.base, &held(&parts)), Err(AssembleError::Manifest(reason)));
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
    // Kept while each shard holds a quarter to a quarter more than the aim.
    assert_eq!(shard_count(100_001, Some(128)), 128);
    assert_eq!(shard_count(70_000, Some(128)), 128);
    assert_eq!(shard_count(MOST_PER_SHARD * 64, Some(64)), 64);
    // Past it the count is chosen afresh: 100,000 keys do not stay in 64
    // shards of some 73 KB gzipped each (a key change would write more
    // than 64 KB).
    assert_eq!(shard_count(MOST_PER_SHARD * 64 + 64, Some(64)), 128);
    assert_eq!(shard_count(100_000, Some(64)), 128);
    assert_eq!(shard_count(MOST_PER_SHARD * 128 + 128, Some(128)), 256);
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
    let placed: Vec<u32> = ["team-a/alice", "team-a/bob", "team-b/carol", "default/ci-1"]
        .iter()
        .map(|id| shard_of(SALT, id, 16))
        .collect();
    assert_eq!(placed, GOLDEN_PLACES);
    let parts = split_at(&config(20), 4);
    // The keys' part only: the base follows the settings' defaults.
    assert_eq!(parts.manifest.shards[0], GOLDEN_FIRST_SHARD);
}

const GOLDEN_PLACES: [u32; 4] = [11, 1, 12, 14];
const GOLDEN_FIRST_SHARD: &str = "3e71af2c84aebcae44e9220d097e630049c88558d9f46cdd6bf6ea7833b3540c";

/// The key list is sized from the first shard, but no further than a
/// shard the writer makes: a forged first shard of many keys in a
/// manifest of many shards reserves no more than that bound.
#[test]
fn a_forged_first_shard_does_not_size_the_key_list_past_the_bound() {
    let of = 4;
    let mut parts = split_at(&config(0), of);
    let many = ground(SALT, of, 3 * MOST_PER_SHARD, "forged-");
    rewrite_shard(&mut parts, 0, |shard| shard.keys = many.iter().map(|id| key(id)).collect());
    let config = assembled(&parts).unwrap();
    assert_eq!(config.keys.len(), 3 * MOST_PER_SHARD, "what it holds is read");
    let bound = 2 * MOST_PER_SHARD * of as usize * 9 / 8;
    assert!(config.keys.capacity() <= bound, "reserved {} over {bound}", config.keys.capacity());
}
