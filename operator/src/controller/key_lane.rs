//! The key lane: a change of a few ApiKeys (or of their key Secrets)
//! written as a patch of the shards holding them, ahead of the Gateway's
//! whole reconcile — which still follows, for the statuses and everything
//! else, and stays the authority: what the lane cannot patch is left to it.
//!
//! ```text
//! key log (stores::key_log) ─► for each Gateway with a kept config (render::key_patch::Kept):
//!     its spec as kept, no Unknown since ─► the changed ApiKeys compiled alone (their key Secrets,
//!     selection, checks) ─► Kept::patch ─► changed shards, then the manifest ─► pods swap
//!     anything else ─► the kept config dropped: the whole reconcile writes, and keeps anew
//! whole reconcile: inputs read at log position p ─► compile (off the runtime's thread) ─► before it
//!     writes: the ApiKeys the lane patched after p patched into its parts too (catch_up), so that
//!     a whole compile never writes back what the lane already changed (a revoked key served again)
//! ```
//!
//! At 100,000 keys a whole reconcile is about a second of compile; a
//! patch compiles the changed keys alone and writes one shard.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use waycast_crds::Gateway;
use waycast_crds::condition::reasons;
use waycast_crds::config::KeyConfig;

use super::memory::{gateway_exists, remember, verified_as};
use super::referenced::fetch_referenced;
use crate::catalog::Catalog;
use crate::compile::keys::KeyVerdict;
use crate::compile::{Compiled, ObjectKey};
use crate::context::{Context, Written};
use crate::error::Error;
use crate::render::Desired;
use crate::render::key_patch::{Basis, Kept, KeptConfigs, Unpatchable};
use crate::stores::key_log::Changed;

/// How long the lane gathers changes before it patches: an ApiKey and
/// the key Secret made for it land in one patch.
const GATHER: Duration = Duration::from_millis(10);

/// The least time between two of the lane's writes: a burst of keys is a
/// few patches of many keys, not one patch per key (each is a swap in
/// every pod), while a lone change waits only [`GATHER`].
const BETWEEN_WRITES: Duration = Duration::from_millis(500);

/// The least time between two of the lane's rounds that did work: a
/// tenant annotating key Secrets in a loop costs a round a tenth of a
/// second at most.
const BETWEEN_ROUNDS: Duration = Duration::from_millis(100);

/// The most ApiKeys one patch takes: more (a namespace deleted, say) are
/// the whole reconcile's, which compiles every key anyway.
const MOST_KEYS_PER_PATCH: usize = 4096;

/// Why the lane left a change to the whole reconcile.
#[derive(Debug, thiserror::Error)]
enum Left {
    #[error(transparent)]
    Unpatchable(#[from] Unpatchable),
    #[error("{0} ApiKeys changed at once")]
    TooMany(usize),
    #[error("a config Secret it would write is not the Gateway's own")]
    NotOwned,
    #[error(transparent)]
    Failed(#[from] Error),
}

/// Runs the lane until the process ends.
pub(crate) async fn key_lane(context: Arc<Context>) {
    let mut last_write: Option<tokio::time::Instant> = None;
    let mut last_round: Option<tokio::time::Instant> = None;
    loop {
        context.stores.key_log.arrived().await;
        let mut start = tokio::time::Instant::now() + GATHER;
        start = last_write.map_or(start, |at| start.max(at + BETWEEN_WRITES));
        start = last_round.map_or(start, |at| start.max(at + BETWEEN_ROUNDS));
        tokio::time::sleep_until(start).await;
        let mut kept = context.kept.lock().await;
        let kept = &mut *kept;
        kept.retain_gateways(|id| gateway_exists(&context.stores, id));
        let work = {
            let log = context.stores.key_log.drained().await;
            let position = log.position();
            let mut work = Vec::new();
            for (id, config) in kept.configs.iter().filter(|(_, config)| config.basis.position < position) {
                let Some(gateway) = context.stores.gateways.get(&ObjectRef::new(&id.name).within(&id.namespace)) else {
                    work.push((id.clone(), None));
                    continue;
                };
                // A new spec, or a change not pinned to some ApiKeys: the
                // whole reconcile it triggered writes.
                let changed = (verified_as(&gateway) == config.basis.gateway)
                    .then(|| log.changed_between(config.basis.position, position))
                    .flatten();
                work.push((id.clone(), changed.map(|changed| (gateway, changed, position))));
            }
            work
        };
        for (id, patchable) in work {
            let Some((gateway, changed, position)) = patchable else {
                kept.configs.remove(&id);
                continue;
            };
            last_round = Some(tokio::time::Instant::now());
            let keys = changed_keys(&context, changed);
            match patch_and_write(&context, kept, &gateway, &keys, position).await {
                Ok(true) => last_write = Some(tokio::time::Instant::now()),
                Ok(false) => {}
                Err(left) => {
                    tracing::debug!(gateway = %id, reason = %left, "key change left to the whole reconcile");
                    context.metrics.key_patches.with_label_values(&["left"]).inc();
                    kept.configs.remove(&id);
                }
            }
        }
    }
}

/// The ApiKeys `changed` names, and those reading its key Secrets (an
/// ApiKey's own generated Secret, or one it names in `secretRef`).
fn changed_keys(context: &Context, changed: Changed) -> BTreeSet<ObjectKey> {
    let Changed { mut keys, secrets } = changed;
    if secrets.is_empty() {
        return keys;
    }
    let namespaces: BTreeSet<&str> = secrets.iter().map(|secret| secret.namespace.as_str()).collect();
    for api_key in context.stores.keys.state() {
        let Some(namespace) = api_key.metadata.namespace.as_deref().filter(|n| namespaces.contains(n)) else {
            continue;
        };
        let secret = ObjectKey { namespace: namespace.to_owned(), name: crate::compile::keys::key_source(&api_key).0 };
        if secrets.contains(&secret) {
            keys.insert(ObjectKey::of(&api_key.metadata));
        }
    }
    keys
}

/// Patches the kept config of `gateway` with the ApiKeys `keys` as the
/// stores hold them and writes the shards that changed, then the
/// manifest; whether it wrote.
async fn patch_and_write(
    context: &Context,
    kept: &mut KeptConfigs,
    gateway: &Gateway,
    keys: &BTreeSet<ObjectKey>,
    position: u64,
) -> Result<bool, Left> {
    let started = std::time::Instant::now();
    let id = ObjectKey::of(&gateway.metadata);
    if keys.len() > MOST_KEYS_PER_PATCH {
        return Err(Left::TooMany(keys.len()));
    }
    let (changes, _) = compile_keys(context, gateway, keys).await?;
    let Some(config) = kept.configs.get_mut(&id) else { return Ok(false) };
    let touched = config.patch(changes)?;
    config.basis.position = position;
    if touched.is_empty() {
        return Ok(false);
    }
    let Some(config) = kept.configs.get(&id) else { return Ok(false) };
    let parts = config.parts.clone();
    let names: Vec<&str> = touched
        .iter()
        .filter_map(|index| parts.shards.get(*index)?.name.as_deref())
        .chain(parts.manifest.metadata.name.as_deref())
        .collect();
    // Only Secrets the store shows as this Gateway's own: one made or taken
    // over by someone else meanwhile is the whole reconcile's to refuse.
    let uid = gateway.metadata.uid.as_deref().unwrap_or_default();
    let own = |name: &&str| {
        let secret = context.stores.config_secrets.get(&ObjectRef::new(name).within(&id.namespace));
        secret.is_some_and(|secret| !crate::ownership::foreign(&secret.metadata, uid))
    };
    if !names.iter().all(own) {
        return Err(Left::NotOwned);
    }
    *kept.lane_writes.entry(id.clone()).or_default() += 1;
    match crate::apply::write_patch(&context.client, &parts, &touched).await {
        Ok(bytes) => {
            kept.note_written(&id, names, Some(&parts));
            let name = id.to_string();
            context.metrics.key_patches.with_label_values(&["written"]).inc();
            context.metrics.config_bytes_written.with_label_values(&[&name]).inc_by(bytes as u64);
            context.metrics.config_writes.with_label_values(&[&name]).inc();
        }
        Err(error) => {
            // What those Secrets hold now is not known: the next whole
            // reconcile writes them whatever the store shows.
            kept.note_written(&id, names, None);
            return Err(error.into());
        }
    }
    let hash = parts.hash.clone();
    tracing::info!(gateway = %id, config.hash = %hash, keys = keys.len(), shards = touched.len(), "key change written as a patch");
    remember(context, &id, |memory| memory.written = Some(Written { hash, at: started, measured: false })).await;
    Ok(true)
}

/// The entry (`None`: not served) and verdict of each of `keys`, compiled
/// alone over the Gateway's other inputs as the stores hold them.
async fn compile_keys(
    context: &Context,
    gateway: &Gateway,
    keys: &BTreeSet<ObjectKey>,
) -> Result<(Vec<(String, Option<KeyConfig>)>, BTreeMap<ObjectKey, KeyVerdict>), Left> {
    let stores = &context.stores;
    // A key's entry reads its ApiKey, its Secret, the namespaces (for
    // selection) and the Gateway's spec — no model, Service or credential.
    let mut catalog = Catalog {
        namespaces: stores.namespaces.state(),
        keys: keys.iter().filter_map(|k| stores.keys.get(&ObjectRef::new(&k.name).within(&k.namespace))).collect(),
        ..Catalog::default()
    };
    fetch_referenced(&mut catalog, context, gateway).await?;
    let compiled = catalog.compile(gateway, jiff::Timestamp::now());
    if compiled.keys.values().any(|key| key.verdict.reason == reasons::DUPLICATE_KEY) {
        return Err(Unpatchable::Duplicate.into());
    }
    let mut served: HashMap<String, KeyConfig> =
        compiled.config.keys.into_iter().map(|key| (key.id.clone(), key)).collect();
    let changes = keys
        .iter()
        .map(|key| {
            let id = key.to_string();
            let entry = served.remove(&id);
            (id, entry)
        })
        .collect();
    Ok((changes, compiled.keys))
}

/// What a whole reconcile read at `read_at`, when the lane had begun
/// `lane_writes` patches of its Gateway.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadAt {
    /// The key log's position.
    pub position: u64,
    /// The lane's patches begun.
    pub lane_writes: u64,
}

/// A whole reconcile's config as it is to be kept once written (`None`:
/// one the lane cannot patch), brought up to the key changes logged since
/// it read its inputs: those ApiKeys are compiled again and patched in,
/// and their verdicts replace the compile's.
///
/// # Errors
/// [`Behind`]: the lane wrote patches meanwhile and this reconcile cannot
/// take them in; it must not write its config (it would undo them). The
/// lane's kept config is then dropped, so the next try writes.
pub(super) async fn catch_up(
    context: &Context,
    gateway: &Gateway,
    kept: &mut KeptConfigs,
    read: ReadAt,
    compiled: &mut Compiled,
    desired: &mut Desired,
    left_out: usize,
) -> Result<Option<Kept>, Behind> {
    let id = ObjectKey::of(&gateway.metadata);
    let lane_wrote = kept.lane_writes(&id) != read.lane_writes;
    let behind = |kept: &mut KeptConfigs| {
        kept.configs.remove(&id);
        Behind
    };
    let (changed, now) = {
        let log = context.stores.key_log.drained().await;
        (log.changed_between(read.position, log.position()), log.position())
    };
    let duplicates = compiled.keys.values().any(|key| key.verdict.reason == reasons::DUPLICATE_KEY);
    let basis = Basis { gateway: verified_as(gateway), position: now, tenants: !gateway.spec.tenants.is_empty() };
    // NB: which keys a `maxApiKeys` cap serves is decided among all of a
    // namespace's keys, oldest first (a key compiled alone would take a
    // place it may not have): a Gateway with a cap is written by whole
    // reconciles only.
    let capped = gateway.spec.tenants.iter().any(|policy| policy.max_api_keys.is_some());
    let mut fresh = match &desired.config {
        Ok(parts) if left_out == 0 && !duplicates && !capped => {
            Some(Kept::new(parts.clone(), &compiled.config.keys, basis))
        }
        _ => None,
    };
    let keys = changed.map(|changed| changed_keys(context, changed));
    match &keys {
        Some(keys) if keys.is_empty() => return Ok(fresh),
        Some(keys) if keys.len() <= MOST_KEYS_PER_PATCH => {}
        // What was logged since cannot be patched in: as written by a
        // whole compile, unless the lane wrote meanwhile.
        _ if lane_wrote => return Err(behind(kept)),
        _ => {
            return Ok(fresh.map(|mut config| {
                config.basis.position = read.position;
                config
            }));
        }
    }
    let keys = keys.unwrap_or_default();
    let patched = match fresh.as_mut() {
        Some(config) => match compile_keys(context, gateway, &keys).await {
            Ok((changes, verdicts)) => config.patch(changes).ok().map(|_| verdicts),
            Err(_) => None,
        },
        None => None,
    };
    let Some(verdicts) = patched else {
        return if lane_wrote { Err(behind(kept)) } else { Ok(None) };
    };
    for key in &keys {
        compiled.keys.remove(key);
    }
    compiled.keys.extend(verdicts);
    if let Some(config) = &fresh {
        desired.config = Ok(config.parts.clone());
    }
    Ok(fresh)
}

/// The key lane wrote changes a whole reconcile cannot take in.
#[derive(Debug)]
pub(super) struct Behind;
