use std::io::Read as _;

use waycast_crds::config::{KeyConfig, ModelConfig};
use waycast_crds::shards::{Manifest, assemble};

use super::*;
use crate::render::fixtures;
use crate::render::meta::labels;

const SALT: &str = "0123456789abcdef";
const FRESH: &str = "fedcba9876543210";

fn config(keys: usize) -> GatewayConfig {
    let mut config = GatewayConfig::empty();
    config.models.push(ModelConfig::to("llama", "http://10.0.0.1/v1"));
    config.keys = (0..keys).map(|n| KeyConfig::new(format!("team-{}/key-{n}", n % 7), format!("{n:064x}"))).collect();
    config
}

fn fresh(current: Option<Layout>) -> Layouts {
    Layouts { current, fresh_salt: FRESH.into() }
}

fn render(config: &GatewayConfig, layouts: &Layouts) -> ConfigParts {
    config_parts(&fixtures::gateway(Default::default()), config, layouts).unwrap().unwrap()
}

fn gunzip(secret: &Secret) -> Vec<u8> {
    let compressed = &secret.data.as_ref().unwrap()[SECRET_KEY_PART].0;
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&compressed[..]).read_to_end(&mut json).unwrap();
    json
}

/// Every shard's Secret, gzipped.
fn shard_secrets(parts: &ConfigParts) -> Vec<Secret> {
    (0..parts.shards.len()).map(|index| parts.shard_secret(index).unwrap().unwrap()).collect()
}

fn manifest_of(parts: &ConfigParts) -> Manifest {
    Manifest::parse(&parts.manifest.data.as_ref().unwrap()[SECRET_KEY_MANIFEST].0).unwrap()
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> &'a str {
    &secret.metadata.annotations.as_ref().unwrap()[key]
}

/// What a pod does: the manifest, then each part it names, assembled.
#[test]
fn the_manifest_base_and_shards_assemble_to_the_config() {
    let original = config(3000);
    let parts = render(&original, &fresh(None));
    assert_eq!(parts.layout, Layout { shards: 4, salt: FRESH.into() }, "3000 keys: 4 shards, the fresh salt");
    assert_eq!(parts.manifest.metadata.name.as_deref(), Some("shared-config"));
    assert_eq!(parts.base.metadata.name.as_deref(), Some("shared-config-base"));
    let names: Vec<_> = parts.shards.iter().map(|meta| meta.name.clone().unwrap()).collect();
    assert_eq!(names, (0..4).map(|i| format!("shared-config-keys-4-{i}")).collect::<Vec<_>>());
    let manifest = manifest_of(&parts);
    assert_eq!(annotation(&parts.manifest, CONFIG_HASH_ANNOTATION), manifest.hash().unwrap());
    assert_eq!(parts.hash, manifest.hash().unwrap());
    assert_eq!(annotation(&parts.manifest, SHARDS_ANNOTATION), "4");
    assert_eq!(annotation(&parts.manifest, SALT_ANNOTATION), FRESH);
    let base = gunzip(&parts.base);
    assert_eq!(annotation(&parts.base, PART_DIGEST_ANNOTATION), manifest.base);
    let shards: Vec<Vec<u8>> = shard_secrets(&parts).iter().map(gunzip).collect();
    for (shard, digest) in shard_secrets(&parts).iter().zip(&manifest.shards) {
        assert_eq!(annotation(shard, PART_DIGEST_ANNOTATION), digest);
    }
    let held: Vec<Option<&[u8]>> = shards.iter().map(|s| Some(s.as_slice())).collect();
    let assembled = assemble(&manifest, &base, &held).unwrap();
    let mut by_id = original.clone();
    by_id.keys.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(assembled, by_id);
    for meta in parts.in_write_order() {
        assert_eq!(meta.labels.as_ref(), Some(&labels(&fixtures::gateway(Default::default()))));
        assert_eq!(meta.owner_references.as_ref().unwrap()[0].kind, "Gateway");
        assert_eq!(meta.owner_references.as_ref().unwrap()[0].controller, Some(true));
        let secret = parts.secret(meta.name.as_ref().unwrap()).unwrap().unwrap();
        assert_eq!(&secret.metadata, meta, "a Secret is built with the metadata the plan compares");
    }
    let order: Vec<_> = parts.in_write_order().map(|meta| meta.name.clone().unwrap()).collect();
    assert_eq!(order.first().map(String::as_str), Some("shared-config-base"));
    assert_eq!(order.last().map(String::as_str), Some("shared-config"), "the manifest last");
    assert!(fits(&original, &fresh(None)));
}

#[test]
fn equal_inputs_give_byte_identical_secrets() {
    let a = render(&config(500), &fresh(None));
    let b = render(&config(500), &fresh(None));
    assert_eq!(a.manifest, b.manifest);
    assert_eq!(a.base, b.base);
    assert_eq!(shard_secrets(&a), shard_secrets(&b));
}

#[test]
fn one_key_changed_changes_one_shard_secret_and_the_manifest() {
    let mut config = config(3000);
    let before = render(&config, &fresh(None));
    config.keys[1234].disabled = true;
    // The next reconcile keeps the layout the manifest Secret names.
    let current = Layout::from_annotations(before.manifest.metadata.annotations.as_ref().unwrap());
    assert_eq!(current.as_ref(), Some(&before.layout));
    let after = render(&config, &Layouts { current, fresh_salt: "00000000000000aa".into() });
    assert_eq!(after.layout, before.layout, "count and salt kept");
    assert_eq!(after.base, before.base);
    let changed = shard_secrets(&before).iter().zip(&shard_secrets(&after)).filter(|(a, b)| a != b).count();
    assert_eq!(changed, 1);
    let digests = before.shards.iter().zip(&after.shards).filter(|(a, b)| a != b).count();
    assert_eq!(digests, 1, "the metadata the plan compares moves with the data");
    assert_ne!(after.manifest, before.manifest);
    assert_ne!(after.hash, before.hash);
}

#[test]
fn the_salt_is_kept_with_the_count_and_drawn_anew_when_the_count_changes() {
    let kept = Layout { shards: 4, salt: SALT.into() };
    assert_eq!(render(&config(3000), &fresh(Some(kept.clone()))).layout, kept);
    // Hysteresis: 1,100 keys in 4 shards is still within bounds.
    assert_eq!(render(&config(1100), &fresh(Some(kept.clone()))).layout, kept);
    // 100 keys are too few for 4 shards: one, with the fresh salt.
    assert_eq!(render(&config(100), &fresh(Some(kept))).layout, Layout { shards: 1, salt: FRESH.into() });
}

#[test]
fn annotations_naming_no_valid_layout_are_ignored() {
    let annotations = |shards: &str, salt: &str| {
        BTreeMap::from([
            (SHARDS_ANNOTATION.to_owned(), shards.to_owned()),
            (SALT_ANNOTATION.to_owned(), salt.to_owned()),
        ])
    };
    assert_eq!(Layout::from_annotations(&annotations("8", SALT)), Some(Layout { shards: 8, salt: SALT.into() }));
    assert_eq!(Layout::from_annotations(&annotations("3", SALT)), None);
    assert_eq!(Layout::from_annotations(&annotations("2048", SALT)), None);
    assert_eq!(Layout::from_annotations(&annotations("8", "0123456789ABCDEF")), None);
    assert_eq!(Layout::from_annotations(&annotations("8", "short")), None);
    assert_eq!(Layout::from_annotations(&BTreeMap::new()), None);
}

#[test]
fn a_fresh_salt_is_sixteen_lowercase_hex_digits() {
    let random = ring::rand::SystemRandom::new();
    let (a, b) = (fresh_salt(&random).unwrap(), fresh_salt(&random).unwrap());
    assert!(salt_ok(&a) && salt_ok(&b), "{a} {b}");
    assert_ne!(a, b);
}

/// Keys of `bytes` of allow-list each.
fn large_keys(count: usize, bytes: usize) -> GatewayConfig {
    let mut config = config(0);
    config.keys = (0..count)
        .map(|n| {
            let mut key = KeyConfig::new(format!("team/large-{n}"), format!("{n:064x}"));
            key.models = Some((0..bytes / 100).map(|m| format!("{m:0>97}")).collect());
            key
        })
        .collect();
    config
}

/// 40 keys of 40 KB: one shard would be 1.6 MB. The count goes up (with
/// the fresh salt), and the next reconcile keeps what it went up to.
#[test]
fn a_shard_too_large_for_a_secret_moves_the_count_up() {
    let config = large_keys(40, 40_000);
    let parts = render(&config, &fresh(None));
    assert!(parts.layout.shards >= 4, "{:?}", parts.layout);
    assert_eq!(parts.layout.salt, FRESH);
    assert!(shard_secrets(&parts).iter().all(|shard| gunzip(shard).len() <= MAX_SHARD_BYTES));
    let again = render(&config, &Layouts { current: Some(parts.layout.clone()), fresh_salt: SALT.into() });
    assert_eq!(again.layout, parts.layout, "kept, not given a fresh salt every reconcile");
    assert_eq!(shard_secrets(&again), shard_secrets(&parts));
}

#[test]
fn a_key_too_large_for_any_shard_does_not_fit() {
    let config = large_keys(1, MAX_SHARD_BYTES + 1000);
    let refused = config_parts(&fixtures::gateway(Default::default()), &config, &fresh(None)).unwrap();
    assert!(matches!(refused, Err(TooLarge::Shard { .. })), "{refused:?}");
    assert!(!fits(&config, &fresh(None)));
}

#[test]
fn models_outgrowing_their_secret_do_not_fit() {
    let mut config = config(10);
    config.models[0].aliases = (0..40_000_u32).map(|n| waycast_crds::digest::sha256_hex(&n.to_le_bytes())).collect();
    let refused = config_parts(&fixtures::gateway(Default::default()), &config, &fresh(None)).unwrap();
    assert!(matches!(refused, Err(TooLarge::Base { gzipped }) if gzipped > MAX_BASE_BYTES), "{refused:?}");
    assert!(!fits(&config, &fresh(None)));
}

#[test]
fn a_retired_shard_keeps_its_owner_and_labels_and_loses_its_data_and_digest() {
    let parts = render(&config(10), &fresh(None));
    let retired = parts.retired("shared-config-keys-2-1");
    assert_eq!(retired.metadata.name.as_deref(), Some("shared-config-keys-2-1"));
    assert_eq!(retired.metadata.labels, parts.manifest.metadata.labels);
    assert_eq!(retired.metadata.owner_references, parts.manifest.metadata.owner_references);
    assert_eq!(retired.metadata.annotations, None);
    assert_eq!(retired.data, None);
}
