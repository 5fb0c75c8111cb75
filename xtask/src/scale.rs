//! The control plane at scale: [`compile_figures`] times the operator's
//! pure compile and render of a many-object fleet
//! (`waycast_operator::fleet`, also applied to a real API server by the
//! scale benchmark).

use std::time::Instant;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::ObjectMeta;
use serde::Serialize;
use waycast_operator::catalog::Catalog;
pub use waycast_operator::fleet::{Fleet, fleet};
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
    /// The config's parts as canonical JSON, in bytes.
    pub json_bytes: usize,
    /// The config Secrets' data in all, in bytes (the parts gzipped; each
    /// Secret holds at most 1 MiB).
    pub secret_bytes: usize,
}

/// Times compile and render of `fleet`, `runs` times each (median).
///
/// # Errors
/// Render failing.
pub fn compile_figures(fleet: &Fleet, runs: usize) -> anyhow::Result<CompileFigures> {
    let name = fleet.gateway.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let namespace =
        Namespace { metadata: ObjectMeta { name: Some(name), ..ObjectMeta::default() }, ..Namespace::default() };
    let catalog = Catalog::from_objects(&[namespace], &fleet.models, &fleet.keys, &[], &fleet.secrets);
    let now = jiff::Timestamp::now();
    let mut compile_times = Vec::new();
    let mut render_times = Vec::new();
    let mut sizes = (0, 0);
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let compiled = catalog.compile(&fleet.gateway, now);
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
        json_bytes: sizes.0,
        secret_bytes: sizes.1,
    })
}
