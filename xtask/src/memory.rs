//! What a key costs in memory, measured with a counting allocator (the
//! `xtask` binary installs one: `main.rs`): an ApiKey object, the
//! operator's kept form of a key Secret, a compile's result, the key
//! lane's kept config, a gateway
//! pod's built config and the parsed config it builds from.
//!
//! ```text
//! fleet(N keys) ─► for each part: live bytes once built − before ─► bytes per key
//! ```

use std::sync::Arc;

use serde::Serialize;
use waycast_mock::fixtures::fleet::Fleet;
use waycast_operator::compile::key_secret::KeySecret;

/// One part's cost.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    /// What was measured.
    pub part: &'static str,
    /// Bytes held once built, per key.
    pub bytes_per_key: f64,
}

/// What holding `value` costs, per key of `keys`; `live` is the bytes the
/// allocator counts live.
#[allow(clippy::cast_precision_loss, reason = "sizes for display")]
fn cost<T>(live: &dyn Fn() -> usize, part: &'static str, keys: usize, build: impl FnOnce() -> T) -> (Cost, T) {
    let before = live();
    let value = build();
    let held = live().saturating_sub(before);
    (Cost { part, bytes_per_key: held as f64 / keys.max(1) as f64 }, value)
}

/// The costs of `fleet`'s keys.
///
/// # Errors
/// The fleet not compiling whole, or a pod refusing its config.
pub fn memory_figures(live: &dyn Fn() -> usize, fleet: &Fleet) -> anyhow::Result<Vec<Cost>> {
    let keys = fleet.keys.len();
    let mut costs = Vec::new();
    let (api_keys, kept_api_keys) = cost(live, "ApiKey objects (as applied, no status)", keys, || {
        fleet.keys.iter().cloned().map(Arc::new).collect::<Vec<_>>()
    });
    costs.push(api_keys);
    let (stored_keys, kept_stored_keys) =
        cost(live, "ApiKeys as the operator's store keeps them (with their status)", keys, || {
            let namespace = fleet.gateway.metadata.namespace.as_deref().unwrap_or_default();
            (0..keys)
                .filter_map(|index| {
                    serde_json::from_value::<waycast_crds::ApiKey>(api_key_as_sent(namespace, index)).ok()
                })
                .map(|key| waycast_operator::stored_form(key, waycast_operator::store_views::api_key))
                .collect::<Vec<_>>()
        });
    anyhow::ensure!(kept_stored_keys.len() == keys, "not every ApiKey as sent parses");
    costs.push(stored_keys);
    drop(kept_stored_keys);
    let (key_secrets, kept_secrets) = cost(live, "key Secrets as the operator keeps them (digests)", keys, || {
        fleet.secrets.iter().filter_map(KeySecret::of).map(Arc::new).collect::<Vec<_>>()
    });
    costs.push(key_secrets);
    drop((kept_api_keys, kept_secrets));
    let catalog = crate::scale::catalog_of(fleet);
    let (compiled_cost, compiled) = cost(live, "a compile's result (config and verdicts)", keys, || {
        catalog.compile(&fleet.gateway, jiff::Timestamp::now())
    });
    costs.push(compiled_cost);
    anyhow::ensure!(compiled.config.keys.len() == keys, "not every key compiled");
    let config = compiled.config;
    drop((compiled.keys, compiled.models, catalog));
    let (kept_cost, kept) = cost(live, "the key lane's kept config (parts' JSON, counts)", keys, || {
        use waycast_operator::render::{config_parts, key_patch};
        let layouts = config_parts::Layouts { current: None, fresh_salt: "0123456789abcdef".into() };
        let parts = config_parts::config_parts(&fleet.gateway, &config, &layouts)?
            .map_err(|too_large| anyhow::anyhow!("the config does not fit: {too_large}"))?;
        let basis = key_patch::Basis { gateway: (String::new(), 0), position: 0, tenants: false };
        anyhow::Ok(key_patch::Kept::new(Arc::new(parts), &config.keys, basis))
    });
    drop(kept?);
    costs.push(kept_cost);
    let (built_cost, built) =
        cost(live, "a gateway pod's built config", keys, || waycast_gateway::build_config(&config));
    built.map_err(|reason| anyhow::anyhow!("a pod refuses the config: {reason}"))?;
    costs.push(built_cost);
    let (config_cost, parsed) = cost(live, "a gateway pod's parsed config (while it builds)", keys, || {
        serde_json::from_slice::<waycast_crds::GatewayConfig>(&config.to_canonical_json().unwrap_or_default())
    });
    drop(parsed);
    costs.push(config_cost);
    Ok(costs)
}

/// An ApiKey as the API server sends it once the operator has written its
/// status: its server-set metadata, the managed fields of its creator and
/// of the operator's status, and a Ready, programmed status.
fn api_key_as_sent(namespace: &str, index: usize) -> serde_json::Value {
    let name = format!("key-{index}");
    let time = "2026-11-26T00:00:00Z";
    let condition = |kind: &str, reason: &str, message: &str| {
        serde_json::json!({"type": kind, "status": "True", "reason": reason, "message": message,
                           "observedGeneration": 1, "lastTransitionTime": time})
    };
    serde_json::json!({
        "apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey",
        "metadata": {
            "name": name, "namespace": namespace, "generation": 1,
            "uid": format!("00000000-0000-4000-8000-{index:012}"),
            "resourceVersion": format!("{}", 1_000_000 + index), "creationTimestamp": time,
            "managedFields": [
                {"manager": "kubectl", "operation": "Update", "apiVersion": "waycast.dev/v1alpha1", "time": time,
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}, "f:parentRefs": {}}}},
                {"manager": "waycast-operator", "operation": "Apply", "apiVersion": "waycast.dev/v1alpha1",
                 "time": time, "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:gateways": {}, "f:keyPrefix": {},
                              "f:observedGeneration": {}, "f:parents": {}, "f:secretName": {}}}}
            ]
        },
        "spec": {"parentRefs": [{"name": "gateway", "namespace": namespace}]},
        "status": {
            "conditions": [
                condition("Ready", "KeyReady", "the key is served"),
                condition("Programmed", "Programmed", "every pod of 1 Gateway(s) serves its current version"),
            ],
            "secretName": format!("{name}-key"), "keyPrefix": "wc_abc",
            "gateways": [format!("{namespace}/gateway")],
            "parents": [{"gateway": format!("{namespace}/gateway"), "accepted": true, "reason": "KeyReady",
                         "message": "the key is served"}],
            "observedGeneration": 1
        }
    })
}

/// What a gateway pod holds for its config, and what a swap to the next
/// config adds on top while the last one still serves.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapFigures {
    /// Keys served.
    pub keys: usize,
    /// Bytes held at rest per key: the snapshot and what the registry keeps
    /// for it (limiter, usage and budget states).
    pub rest_bytes_per_key: f64,
    /// The same in all, in MiB.
    pub rest_mib: f64,
    /// The most a swap to a config that changed one key held above the
    /// bytes at rest: the changed shard parsed, the new snapshot and the
    /// registry's new loan, beside the snapshot serving, in MiB.
    pub swap_peak_above_rest_mib: f64,
    /// What the kernel saw of the same swap: the process's peak resident
    /// memory (VmHWM) above its resident memory just before the swap, in
    /// MiB (what a pod's RSS limit meets). The allocator counts a table
    /// sized at once in full; its pages are resident only once written.
    pub swap_rss_peak_above_rest_mib: Option<f64>,
}

/// A field of /proc/self/status in MiB (`VmRSS:`, `VmHWM:`); none off Linux.
#[allow(clippy::cast_precision_loss, reason = "sizes for display")]
fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 =
        status.lines().find_map(|line| line.strip_prefix(field))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib as f64 / 1024.0)
}

/// Swaps a pod to the config `first`, then to `second` (one key changed),
/// both canonical JSON as assembled from their parts, each split in parts
/// as the operator writes them (the same salt and shard count) and held
/// gzipped as a pod holds them; `live` and `peak` are the bytes the
/// allocator counts live and the most it counted since the process began
/// (so this runs in a process of its own: see `xtask swap-figures`).
///
/// # Errors
/// A config that does not parse or split, or that a pod refuses.
#[allow(clippy::cast_precision_loss, reason = "sizes for display")]
pub fn swap_figures(
    live: &dyn Fn() -> usize,
    peak: &dyn Fn() -> usize,
    first: &[u8],
    second: &[u8],
) -> anyhow::Result<SwapFigures> {
    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    let held = |bytes: &[u8]| -> anyhow::Result<waycast_gateway::HeldConfig> {
        let config = waycast_crds::GatewayConfig::parse(bytes)?;
        let count = waycast_crds::shards::shard_count(config.keys.len(), None);
        let split = waycast_crds::shards::split(&config, "0123456789abcdef", count)?;
        waycast_gateway::ConfigSwaps::hold(&split).map_err(|reason| anyhow::anyhow!("holding the parts: {reason}"))
    };
    let (first, second) = (held(first)?, held(second)?);
    let mut swaps = waycast_gateway::ConfigSwaps::default();
    let before = live();
    swaps.swap(&first, "first".into()).map_err(|reason| anyhow::anyhow!("a pod refuses the config: {reason}"))?;
    let keys = swaps.keys();
    let rest = live().saturating_sub(before);
    let held = live();
    let resident = status_mib("VmRSS:");
    swaps.swap(&second, "second".into()).map_err(|reason| anyhow::anyhow!("a pod refuses the config: {reason}"))?;
    let resident_peak = status_mib("VmHWM:");
    anyhow::ensure!(swaps.keys() == keys, "the second config serves {} keys, not {keys}", swaps.keys());
    Ok(SwapFigures {
        keys,
        rest_bytes_per_key: rest as f64 / keys.max(1) as f64,
        rest_mib: mib(rest),
        swap_peak_above_rest_mib: mib(peak().saturating_sub(held)),
        swap_rss_peak_above_rest_mib: resident.zip(resident_peak).map(|(rest, peak)| peak - rest),
    })
}

/// The compiled config of `fleet` as canonical JSON, and the same with its
/// first key changed (disabled): what [`swap_figures`] swaps between.
///
/// # Errors
/// The fleet not compiling whole.
pub fn swap_configs(fleet: &Fleet) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let catalog = crate::scale::catalog_of(fleet);
    let mut config = catalog.compile(&fleet.gateway, jiff::Timestamp::now()).config;
    anyhow::ensure!(config.keys.len() == fleet.keys.len(), "not every key compiled");
    let first = config.to_canonical_json()?;
    if let Some(key) = config.keys.first_mut() {
        key.disabled = true;
    }
    Ok((first, config.to_canonical_json()?))
}
