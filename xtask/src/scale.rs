//! The control plane at scale: [`compile_figures`] times the operator's
//! pure compile and render of a many-object fleet
//! (`waycast_mock::fixtures::fleet`, also applied to a real API server by the
//! scale benchmark).

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::ObjectMeta;
use serde::Serialize;
pub use waycast_mock::fixtures::fleet::{Fleet, fleet};
use waycast_operator::catalog::Catalog;
use waycast_operator::programmed;
use waycast_operator::render::config_parts;

/// What compiling one Gateway's fleet costs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompileFigures {
    /// ApiKeys.
    pub keys: usize,
    /// ModelEndpoints.
    pub models: usize,
    /// `compile::gateway`, median of the runs, in milliseconds.
    pub compile_ms: f64,
    /// Rendering the config's Secrets (split into a manifest, a base and key
    /// shards: canonical JSON, SHA-256, gzip), median, in milliseconds.
    pub render_ms: f64,
    /// Listing the Secrets the served objects reference (what a reconcile
    /// looks up before compiling), median, in milliseconds.
    pub referenced_ms: f64,
    /// The `Programmed` bookkeeping after a compile (`programmed::settle`
    /// and `programmed::next` against the previous compile's), median, in
    /// milliseconds.
    pub bookkeeping_ms: f64,
    /// A gateway pod's build of the whole config from its parts (held
    /// gzipped, as a starting pod holds them: each unpacked, parsed,
    /// checked and built a shard at a time), median, in milliseconds.
    pub pod_ms: f64,
    /// A gateway pod's side of a one-key change (one shard): the next
    /// config built from the serving one's table, only the changed shard
    /// read, median, in milliseconds.
    pub pod_change_ms: f64,
    /// The key lane's own work for one key revoked: the key compiled alone
    /// and the shard holding it patched (`Kept::patch`: parsed, replaced,
    /// encoded, digests and manifest), median, in milliseconds; its API
    /// calls (the key Secret's read, two writes) not counted.
    pub lane_ms: f64,
    /// The config's parts as canonical JSON, in bytes.
    pub json_bytes: usize,
    /// The config Secrets' data in all, in bytes (the parts gzipped; each
    /// Secret holds at most 1 MiB).
    pub secret_bytes: usize,
}

/// The shard count of `split`.
fn parts_count(split: &waycast_crds::shards::Parts) -> u32 {
    u32::try_from(split.shards.len()).unwrap_or(u32::MAX)
}

/// The key lane's work for the `nth` key revoked, in milliseconds: it
/// compiled alone (the Gateway's other inputs, its key Secret) and
/// patched into `parts`, kept as written for `keys`.
fn lane_ms(
    catalog: &Catalog,
    fleet: &Fleet,
    keys: &[waycast_crds::config::KeyConfig],
    parts: config_parts::ConfigParts,
    nth: usize,
) -> anyhow::Result<f64> {
    use waycast_operator::render::key_patch::{Basis, Kept};
    let basis = Basis { gateway: (String::new(), 0), position: 0, tenants: false };
    let mut kept = Kept::new(Arc::new(parts), keys, basis);
    let mut revoked = (*catalog.keys[nth % catalog.keys.len()]).clone();
    revoked.spec.disabled = true;
    let (namespace, name) = (revoked.metadata.namespace.clone(), revoked.metadata.name.clone().unwrap_or_default());
    let secret_name = waycast_operator::compile::keys::generated_secret_name(&name);
    let key_secrets: Vec<_> = catalog
        .key_secrets
        .iter()
        .filter(|kept| Some(&kept.namespace) == namespace.as_ref() && kept.name == secret_name)
        .cloned()
        .collect();
    let started = Instant::now();
    let alone = Catalog {
        namespaces: catalog.namespaces.clone(),
        keys: vec![Arc::new(revoked)],
        key_secrets,
        ..Catalog::default()
    };
    let compiled = alone.compile(&fleet.gateway, jiff::Timestamp::now());
    let id = format!("{}/{name}", namespace.unwrap_or_default());
    let entry = compiled.config.keys.into_iter().find(|key| key.id == id);
    anyhow::ensure!(entry.is_none(), "a disabled key compiled to an entry");
    let touched = kept.patch(vec![(id, entry)]).map_err(|why| anyhow::anyhow!("not patched: {why}"))?;
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(touched.len() == 1, "a revoke touched {} shards", touched.len());
    Ok(elapsed)
}

/// What the operator's stores would hold for `fleet`: its objects and the
/// Gateway's namespace.
pub fn catalog_of(fleet: &Fleet) -> Catalog {
    let name = fleet.gateway.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let namespace =
        Namespace { metadata: ObjectMeta { name: Some(name), ..ObjectMeta::default() }, ..Namespace::default() };
    Catalog::from_objects(&[namespace], &fleet.models, &fleet.keys, &[], &fleet.secrets)
}

/// Times compile and render of `fleet`, `runs` times each (median).
///
/// # Errors
/// Render failing.
pub fn compile_figures(fleet: &Fleet, runs: usize) -> anyhow::Result<CompileFigures> {
    let catalog = catalog_of(fleet);
    let now = jiff::Timestamp::now();
    let mut compile_times = Vec::new();
    let mut render_times = Vec::new();
    let mut referenced_times = Vec::new();
    let mut bookkeeping_times = Vec::new();
    let mut pod_times = Vec::new();
    let mut pod_change_times = Vec::new();
    let mut lane_times = Vec::new();
    let mut sizes = (0, 0);
    let mut previous = None;
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let referenced = catalog.with_inputs(&fleet.gateway, waycast_operator::compile::referenced_secrets);
        referenced_times.push(started.elapsed().as_secs_f64() * 1e3);
        drop(referenced);
        let started = Instant::now();
        let mut compiled = catalog.compile(&fleet.gateway, now);
        compile_times.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            compiled.config.keys.len() == fleet.keys.len(),
            "not every key compiled: {:?}",
            compiled.keys.values().find(|v| !v.verdict.accepted)
        );
        let started = Instant::now();
        // A layout chosen afresh (a fixed salt: the operator draws one).
        let layouts = config_parts::Layouts { current: None, fresh_salt: "0123456789abcdef".into() };
        let parts = config_parts::config_parts(&fleet.gateway, &compiled.config, &layouts)?
            .map_err(|too_large| anyhow::anyhow!("the config does not fit its Secrets: {too_large}"))?;
        render_times.push(started.elapsed().as_secs_f64() * 1e3);
        sizes = (parts.json_bytes, parts.data_bytes_in_all()?);
        let started = Instant::now();
        let reporting = [parts.hash.clone()];
        let settled = programmed::settle(&catalog, &mut compiled, &[], &parts.hash, true);
        let pods = programmed::Pods { reporting: &reporting, ready: 1 };
        let (next, moved) = programmed::next(previous.as_ref(), settled.decisions, &pods);
        bookkeeping_times.push(started.elapsed().as_secs_f64() * 1e3);
        drop(moved);
        previous = Some(next);
        let split = waycast_crds::shards::split(&compiled.config, &parts.layout.salt, parts.layout.shards)?;
        lane_times.push(lane_ms(&catalog, fleet, &compiled.config.keys, parts, lane_times.len())?);
        let refused = |reason: String| anyhow::anyhow!("a pod refuses it: {reason}");
        let held = waycast_gateway::ConfigSwaps::hold(&split).map_err(refused)?;
        let mut changed = compiled.config.clone();
        let nth = pod_times.len() % changed.keys.len().max(1);
        if let Some(key) = changed.keys.get_mut(nth) {
            key.disabled = true;
        }
        let changed = waycast_crds::shards::split(&changed, &split.manifest.salt, parts_count(&split))?;
        let changed = waycast_gateway::ConfigSwaps::hold(&changed).map_err(refused)?;
        let mut pod = waycast_gateway::ConfigSwaps::default();
        let started = Instant::now();
        pod.swap(&held, "whole".into()).map_err(refused)?;
        pod_times.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        pod.swap(&changed, "changed".into()).map_err(refused)?;
        pod_change_times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(CompileFigures {
        keys: fleet.keys.len(),
        models: fleet.models.len(),
        compile_ms: median(compile_times),
        render_ms: median(render_times),
        referenced_ms: median(referenced_times),
        bookkeeping_ms: median(bookkeeping_times),
        pod_ms: median(pod_times),
        pod_change_ms: median(pod_change_times),
        lane_ms: median(lane_times),
        json_bytes: sizes.0,
        secret_bytes: sizes.1,
    })
}
