//! Which of a config's Secrets to write and which to retire, decided from
//! what the operator's store holds (metadata only): a part is written only
//! when the store does not show the Gateway's own Secret of that name with
//! the same digest, so a key change writes one shard and the manifest.
//!
//! ```text
//! desired parts + store (name, digest annotation, controller uid)
//!   ─► write: base, changed shards by index, the manifest last (a pod that
//!             sees a manifest can fetch every part it names)
//!   ─► retire: the Gateway's shards no manifest names now (another count),
//!              emptied (the operator may not delete Secrets), only once
//!              the manifest is written
//! ```
//!
//! Pure: the writes are `apply::apply_all`'s.

use std::collections::{BTreeMap, BTreeSet};

use crate::render::config_parts::ConfigParts;
use crate::render::meta::digest_of;
use kube::api::ObjectMeta;

/// A config Secret the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Existing<'a> {
    /// Its name.
    pub name: &'a str,
    /// The digest it is annotated with ([`digest_of`]).
    pub digest: Option<&'a str>,
    /// Its controller owner's uid.
    pub owner: Option<&'a str>,
}

impl<'a> Existing<'a> {
    /// What the store's metadata of a Secret says.
    pub fn of(meta: &'a ObjectMeta) -> Option<Self> {
        let owner = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        Some(Self { name: meta.name.as_deref()?, digest: digest_of(meta), owner: owner.map(|o| o.uid.as_str()) })
    }
}

/// What to write and retire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The Secrets to write, in order: the base, the shards by index, the
    /// manifest last.
    pub write: Vec<String>,
    /// The manifest Secret's name (written last when in `write`).
    pub manifest: String,
    /// The Gateway's key shard Secrets no longer named and not yet emptied
    /// (`ConfigParts::retired`), emptied once the manifest is written.
    pub retire: Vec<String>,
    /// The Secrets in `write` the store does not show as the Gateway's own:
    /// checked for another owner before anything is written (server-side
    /// apply with force would take another's Secret over).
    pub unseen: Vec<String>,
}

impl Plan {
    /// The parts to write before the manifest, in order.
    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.write.iter().map(String::as_str).filter(|name| *name != self.manifest)
    }

    /// Whether the manifest is written.
    pub fn writes_manifest(&self) -> bool {
        self.write.last() == Some(&self.manifest)
    }
}

/// The plan for `desired`, of the Gateway with uid `gateway_uid`, given
/// the config Secrets the store holds in its namespace.
pub fn plan(desired: &ConfigParts, existing: &[Existing<'_>], gateway_uid: &str) -> Plan {
    let ours: BTreeMap<&str, Option<&str>> = existing
        .iter()
        .filter(|secret| secret.owner == Some(gateway_uid))
        .map(|secret| (secret.name, secret.digest))
        .collect();
    let manifest = desired.manifest.metadata.name.clone().unwrap_or_default();
    let mut plan = Plan { manifest: manifest.clone(), ..Plan::default() };
    let mut named = BTreeSet::new();
    for meta in desired.in_write_order() {
        let Some(name) = meta.name.as_deref() else { continue };
        named.insert(name);
        let held = ours.get(name);
        if held.is_none() {
            plan.unseen.push(name.to_owned());
        }
        if held.copied().flatten() != digest_of(meta) {
            plan.write.push(name.to_owned());
        }
    }
    // An emptied shard has no digest left: not emptied again.
    plan.retire = ours
        .iter()
        .filter(|(name, digest)| digest.is_some() && !named.contains(*name) && is_shard_of(name, &manifest))
        .map(|(name, _)| (*name).to_owned())
        .collect();
    plan
}

/// Whether `name` is that of a key shard of config Secret `config`, of any
/// count (`C-keys-N-I`).
fn is_shard_of(name: &str, config: &str) -> bool {
    let Some(rest) = name.strip_prefix(config).and_then(|rest| rest.strip_prefix("-keys-")) else { return false };
    let number = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    rest.split_once('-').is_some_and(|(of, index)| number(of) && number(index))
}

#[cfg(test)]
mod tests {
    use waycast_crds::GatewayConfig;
    use waycast_crds::config::KeyConfig;

    use super::*;
    use crate::render::config_parts::{Layout, Layouts, config_parts};
    use crate::render::fixtures;

    const UID: &str = "0f0e0d0c-0000-4000-8000-000000000001";
    const SALT: &str = "0123456789abcdef";

    fn parts(keys: usize, shards: u32) -> ConfigParts {
        let mut config = GatewayConfig::empty();
        config.keys = (0..keys).map(|n| KeyConfig::new(format!("team/key-{n}"), format!("{n:064x}"))).collect();
        let layouts = Layouts { current: Some(Layout { shards, salt: SALT.into() }), fresh_salt: SALT.into() };
        config_parts(&fixtures::gateway(Default::default()), &config, &layouts).unwrap().unwrap()
    }

    /// The store as it is once `parts` are written.
    fn written(parts: &ConfigParts) -> Vec<(String, Option<String>)> {
        parts.in_write_order().map(|meta| (meta.name.clone().unwrap(), digest_of(meta).map(str::to_owned))).collect()
    }

    fn existing<'a>(secrets: &'a [(String, Option<String>)], owner: &'a str) -> Vec<Existing<'a>> {
        secrets.iter().map(|(name, digest)| Existing { name, digest: digest.as_deref(), owner: Some(owner) }).collect()
    }

    #[test]
    fn a_first_write_writes_every_part_then_the_manifest_and_retires_nothing() {
        let desired = parts(1200, 2);
        let plan = plan(&desired, &[], UID);
        assert_eq!(
            plan.write,
            ["shared-config-base", "shared-config-keys-2-0", "shared-config-keys-2-1", "shared-config"]
        );
        assert!(plan.writes_manifest());
        assert_eq!(plan.parts().count(), 3);
        assert_eq!(plan.unseen, plan.write, "none is known to be the Gateway's own");
        assert!(plan.retire.is_empty());
    }

    #[test]
    fn a_part_whose_digest_the_store_shows_is_not_written_again() {
        let desired = parts(1200, 2);
        let store = written(&desired);
        let plan = plan(&desired, &existing(&store, UID), UID);
        assert_eq!(plan, Plan { manifest: "shared-config".into(), ..Plan::default() });
        // Another Gateway's Secrets of the same names (one deleted and made
        // again under its name) are not the Gateway's own.
        let foreign = plan_for_other_owner(&desired, &store);
        assert_eq!(foreign.write.len(), 4);
        assert_eq!(foreign.unseen.len(), 4);
    }

    fn plan_for_other_owner(desired: &ConfigParts, store: &[(String, Option<String>)]) -> Plan {
        plan(desired, &existing(store, "another-uid"), UID)
    }

    #[test]
    fn one_key_changed_writes_its_shard_and_the_manifest_last() {
        let before = parts(3000, 4);
        let store = written(&before);
        let mut config = GatewayConfig::empty();
        config.keys = (0..3000).map(|n| KeyConfig::new(format!("team/key-{n}"), format!("{n:064x}"))).collect();
        config.keys[1234].disabled = true;
        let layouts = Layouts { current: Some(before.layout.clone()), fresh_salt: "fedcba9876543210".into() };
        let after = config_parts(&fixtures::gateway(Default::default()), &config, &layouts).unwrap().unwrap();
        let plan = plan(&after, &existing(&store, UID), UID);
        assert_eq!(plan.write.len(), 2, "{plan:?}");
        assert!(plan.write[0].starts_with("shared-config-keys-4-"));
        assert_eq!(plan.write[1], "shared-config");
        assert!(plan.unseen.is_empty() && plan.retire.is_empty());
    }

    #[test]
    fn a_new_count_writes_a_new_set_and_retires_the_old_shards_only() {
        let before = parts(1200, 2);
        let mut store = written(&before);
        // Secrets of the Gateway that are no shards of this config stay.
        store.push(("shared-config-keys-x".into(), None));
        store.push(("shared-endpoints".into(), None));
        // A shard of an older count, emptied already: not emptied again.
        store.push(("shared-config-keys-1-0".into(), None));
        let after = parts(1200, 4);
        let plan = plan(&after, &existing(&store, UID), UID);
        let shards: Vec<String> = (0..4).map(|i| format!("shared-config-keys-4-{i}")).collect();
        assert_eq!(plan.write[..4], shards[..], "the base did not change: not written");
        assert_eq!(plan.write[4..], ["shared-config"]);
        assert_eq!(plan.unseen, shards);
        assert_eq!(plan.retire, ["shared-config-keys-2-0", "shared-config-keys-2-1"]);
        // Another owner's stale-looking Secrets are never touched.
        let foreign = plan_for_other_owner(&after, &store);
        assert!(foreign.retire.is_empty());
    }

    /// DESIGN's target: a key change among 100,000 writes at most 64 KB
    /// (one shard and the manifest, at the count chosen for 100,000 keys).
    ///
    /// NB: `shard_count` keeps a count while shards hold up to twice
    /// `KEYS_PER_SHARD`; near that bound a shard is some 94 KB gzipped.
    #[test]
    fn a_key_change_among_100_000_writes_at_most_64_kb() {
        let mut config = GatewayConfig::empty();
        config.keys = (0..100_000_u32)
            .map(|n| KeyConfig::new(format!("team/key-{n}"), waycast_crds::digest::sha256_hex(&n.to_le_bytes())))
            .collect();
        let layouts = Layouts { current: None, fresh_salt: SALT.into() };
        let gateway = fixtures::gateway(Default::default());
        let before = config_parts(&gateway, &config, &layouts).unwrap().unwrap();
        let store = written(&before);
        config.keys[4321].disabled = true;
        let layouts = Layouts { current: Some(before.layout.clone()), fresh_salt: "fedcba9876543210".into() };
        let after = config_parts(&gateway, &config, &layouts).unwrap().unwrap();
        let plan = plan(&after, &existing(&store, UID), UID);
        assert_eq!(plan.write.len(), 2, "{:?}", plan.write);
        let bytes: usize = plan
            .write
            .iter()
            .map(|name| crate::render::config_parts::data_bytes(&after.secret(name).unwrap().unwrap()))
            .sum();
        assert!(bytes <= 64_000, "{bytes} bytes written for one key's change");
    }

    #[test]
    fn shard_names_are_told_apart_from_other_names() {
        assert!(is_shard_of("gw-config-keys-8-7", "gw-config"));
        assert!(!is_shard_of("gw-config-base", "gw-config"));
        assert!(!is_shard_of("gw-config-keys-8", "gw-config"));
        assert!(!is_shard_of("gw-config-keys-8-x", "gw-config"));
        assert!(!is_shard_of("gw-config-keys--1", "gw-config"));
        assert!(!is_shard_of("other-config-keys-8-1", "gw-config"));
    }
}
