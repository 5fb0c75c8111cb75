//! Where the config comes from and how it is swapped in.
//!
//! ```text
//! file.rs   (--config-file: poll + SIGHUP) ─┐
//! secret.rs (--config-secret: kube watch,  ─┴─► ConfigUpdate (bytes, or a manifest's
//!   parts.rs: a manifest's parts by name)        parts, gzipped) ─► apply_updates (one task, owns the Registry)
//!                                                 ─► load.rs (parse, validate, lend, build; a config in parts
//!                                                    a shard at a time, a change from the serving table)
//!                                                 ─► ConfigStore (one ArcSwap)
//! ```
//!
//! The endpoints document's sources and applier are in `endpoints.rs`, built
//! the same way.
//!
//! Sources only produce bytes, sent as [`Update`]s. A bad config is logged, counted in
//! `waycast_gateway_config_reload_errors_total`, and never reaches the store:
//! the last good one keeps serving. Requests hold the snapshot they
//! started with (through their worker's own handle on it), so a swap never
//! changes a request mid-flight.

pub mod builder;
pub mod endpoints;
pub mod file;
pub mod gzip;
pub mod load;
pub mod parts;
pub mod secret;
pub mod usage;

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::snapshot::Snapshot;
use load::LoadError;

/// What a source read: the config bytes, or why it has none.
pub struct Update {
    /// Where from (`file:PATH`, `secret:NS/NAME`), for logs.
    pub source: Arc<str>,
    /// The bytes, or why the source could not give them.
    pub bytes: Result<Vec<u8>, LoadError>,
}

/// What the config's applier is handed.
pub enum ConfigUpdate {
    /// A whole config's bytes (a file, a single config Secret).
    Whole(Update),
    /// The parts of a config in parts a source holds (`parts.rs`), each
    /// the one its manifest names, known by the manifest's digest.
    Parts {
        /// Where from, for logs.
        source: Arc<str>,
        /// The parts.
        parts: Box<parts::HeldParts>,
        /// Its manifest's digest.
        identity: String,
    },
    /// A manifest whose parts did not make a config: why, for the logs,
    /// the metrics and the heartbeat.
    Unassembled {
        /// Where from, for logs.
        source: Arc<str>,
        /// The manifest's digest.
        identity: String,
        /// Why.
        reason: String,
    },
}

impl From<Update> for ConfigUpdate {
    fn from(update: Update) -> Self {
        Self::Whole(update)
    }
}

/// How many updates may wait for the applier; a source waits beyond.
pub const UPDATE_QUEUE: usize = 4;

/// Applies each update in turn until every source has ended; the only
/// owner of the [`Registry`].
pub async fn apply_updates<S>(mut updates: mpsc::Receiver<ConfigUpdate>, serving: Arc<S>)
where
    S: AsRef<ConfigStore> + AsRef<Metrics> + AsRef<crate::usage::Ledger> + Send + Sync + 'static,
{
    let (store, metrics): (&ConfigStore, &Metrics) = ((*serving).as_ref(), (*serving).as_ref());
    let ledger: &crate::usage::Ledger = (*serving).as_ref();
    let mut registry = Registry::reporting(metrics.queue_depth.clone());
    while let Some(update) = updates.recv().await {
        // Errors are logged and counted by the store.
        let applied = match update {
            ConfigUpdate::Whole(Update { source, bytes: Ok(bytes) }) => {
                store.apply(&mut registry, &bytes, &source, metrics)
            }
            ConfigUpdate::Parts { source, parts, identity } => {
                store.apply_parts(&mut registry, &parts, identity, &source, metrics)
            }
            ConfigUpdate::Whole(Update { source, bytes: Err(error) }) => {
                metrics.config_reload_errors.inc();
                tracing::error!(%source, %error, "config source gave no usable config; keeping the last good config");
                continue;
            }
            ConfigUpdate::Unassembled { source, identity, reason } => {
                metrics.config_reload_errors.inc();
                tracing::error!(%source, config.manifest = %identity, %reason, "config parts refused; keeping the last good config");
                store.refuse(identity, &reason);
                continue;
            }
        };
        if let Ok(Applied::Changed(_)) = applied
            && let Some(snapshot) = store.current()
        {
            // The fleet's spend for budgets this config adds.
            ledger.reapply(&snapshot);
        }
    }
}

/// The config being served, and the newest one refused.
#[derive(Default)]
pub struct ConfigStore {
    current: ArcSwapOption<Snapshot>,
    refused: ArcSwapOption<Refused>,
}

/// A config this pod refused; reported in its heartbeat so the Gateway
/// shows `Programmed=False` instead of "written".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// SHA-256 of the refused bytes (the operator's config hash).
    pub hash: String,
    /// Why, cut to `waycast_crds::heartbeat::MAX_REASON_BYTES`.
    pub reason: String,
}

/// What applying new bytes did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A new config is serving; its hash.
    Changed(String),
    /// Same bytes as the current config.
    Unchanged,
}

/// A worker's own handle on a snapshot (`per_worker::Handle`).
pub type WorkerSnapshot = crate::per_worker::Handle<Snapshot>;

thread_local! {
    /// This thread's handle on the snapshot it served last.
    static HANDLE: std::cell::RefCell<crate::per_worker::Handles<Snapshot>> =
        std::cell::RefCell::new(crate::per_worker::Handles::new(1));
}

impl ConfigStore {
    /// The config being served, if one was loaded.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.current.load_full()
    }

    /// The same, through this thread's own handle on it (made when the
    /// thread first serves a snapshot; the one it replaces is let go then,
    /// so an idle worker keeps the previous snapshot alive until its next
    /// request).
    pub fn current_here(&self) -> Option<Arc<WorkerSnapshot>> {
        let current = self.current.load();
        let snapshot = current.as_ref()?;
        Some(HANDLE.with_borrow_mut(|handles| handles.on(0, snapshot)))
    }

    /// Remembers that the config known by `hash` was refused, for the
    /// heartbeat (the current one keeps serving).
    pub fn refuse(&self, hash: String, reason: &str) {
        let reason = waycast_crds::heartbeat::truncate(reason, waycast_crds::heartbeat::MAX_REASON_BYTES);
        self.refused.store(Some(Arc::new(Refused { hash, reason: reason.to_owned() })));
    }

    /// The newest config refused since the last one applied, if any.
    pub fn refused(&self) -> Option<Arc<Refused>> {
        self.refused.load_full()
    }

    /// Parses, validates and swaps in `bytes` from `source`; on failure the
    /// current config stays. Logs and counts either way.
    ///
    /// # Errors
    /// [`LoadError`] when the bytes are not a valid config.
    pub fn apply(
        &self,
        registry: &mut Registry,
        bytes: &[u8],
        source: &str,
        metrics: &Metrics,
    ) -> Result<Applied, LoadError> {
        let previous = self.current.load_full();
        let loaded = load::load(bytes, previous.as_deref(), registry);
        self.settle(loaded, previous, || waycast_crds::digest::config_hash(bytes), source, metrics)
    }

    /// The same for a config in parts, known by its manifest's digest
    /// `identity`.
    ///
    /// # Errors
    /// [`LoadError`] when the parts do not make a valid config.
    pub fn apply_parts(
        &self,
        registry: &mut Registry,
        parts: &parts::HeldParts,
        identity: String,
        source: &str,
        metrics: &Metrics,
    ) -> Result<Applied, LoadError> {
        let previous = self.current.load_full();
        let refused_hash = identity.clone();
        let loaded = load::load_parts(parts, identity, previous.as_deref(), registry);
        self.settle(loaded, previous, || refused_hash, source, metrics)
    }

    /// Swaps in what was loaded, or keeps the current config and remembers
    /// the refusal (under `refused_hash`, what the operator knows it by).
    fn settle(
        &self,
        loaded: Result<Option<Snapshot>, LoadError>,
        previous: Option<Arc<Snapshot>>,
        refused_hash: impl FnOnce() -> String,
        source: &str,
        metrics: &Metrics,
    ) -> Result<Applied, LoadError> {
        match loaded {
            Ok(None) => Ok(Applied::Unchanged),
            Ok(Some(snapshot)) => {
                let hash = snapshot.hash.clone();
                tracing::info!(
                    source,
                    config.hash = %hash,
                    models = snapshot.routes().len(),
                    keys = snapshot.key_count(),
                    key_shards_read = snapshot.key_shards_read(),
                    dropped = snapshot.dropped.len(),
                    "config applied"
                );
                metrics.config_reloads.inc();
                metrics.config_info.reset();
                metrics.config_info.with_label_values(&[&hash]).set(1);
                metrics.config_last_reload.set(jiff::Timestamp::now().as_second());
                for kind in ["model", "key"] {
                    let dropped = snapshot.dropped.iter().filter(|d| d.entry.starts_with(kind)).count();
                    metrics
                        .config_entries_dropped
                        .with_label_values(&[kind])
                        .set(i64::try_from(dropped).unwrap_or(i64::MAX));
                }
                self.current.store(Some(Arc::new(snapshot)));
                self.refused.store(None);
                Ok(Applied::Changed(hash))
            }
            Err(error) => {
                metrics.config_reload_errors.inc();
                let keeping = previous.map_or_else(|| "none yet".to_owned(), |p| p.hash.clone());
                tracing::error!(source, %error, config.kept = %keeping, "config rejected; keeping the last good config");
                self.refuse(refused_hash(), &error.to_string());
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_config_is_remembered_until_one_applies() {
        let store = ConfigStore::default();
        let metrics = Metrics::new().unwrap();
        let mut registry = Registry::default();
        let bad = br#"{"apiVersion":"waycast.dev/config-v1","settings":{"maxRequestBodyBytes":0}}"#;
        assert!(store.apply(&mut registry, bad, "test", &metrics).is_err());
        let refused = store.refused().expect("the refusal is kept for the heartbeat");
        assert_eq!(refused.hash, waycast_crds::digest::config_hash(bad));
        assert!(refused.reason.contains("settings.maxRequestBodyBytes"), "{}", refused.reason);
        let good = br#"{"apiVersion":"waycast.dev/config-v1"}"#;
        assert!(matches!(store.apply(&mut registry, good, "test", &metrics), Ok(Applied::Changed(_))));
        assert_eq!(store.refused(), None, "a config that applies clears it");
    }

    /// A thread serves the current snapshot through one handle of its own
    /// until the snapshot changes; another thread has another handle.
    #[test]
    fn each_thread_serves_through_its_own_handle() {
        let store = ConfigStore::default();
        let metrics = Metrics::new().unwrap();
        let mut registry = Registry::default();
        assert!(store.current_here().is_none(), "no config yet");
        store.apply(&mut registry, br#"{"apiVersion":"waycast.dev/config-v1"}"#, "test", &metrics).unwrap();
        let first = store.current_here().unwrap();
        assert!(Arc::ptr_eq(&first, &store.current_here().unwrap()), "one handle per thread");
        assert!(first.is_on(&store.current().unwrap()), "on the served snapshot");
        let elsewhere = std::thread::scope(|scope| scope.spawn(|| store.current_here().unwrap()).join().unwrap());
        assert!(!Arc::ptr_eq(&first, &elsewhere) && elsewhere.is_on(&store.current().unwrap()));

        let changed = br#"{"apiVersion":"waycast.dev/config-v1","settings":{"accessLog":false}}"#;
        store.apply(&mut registry, changed, "test", &metrics).unwrap();
        let second = store.current_here().unwrap();
        assert!(!second.settings.access_log && first.settings.access_log, "the new snapshot, not the old");
        assert_eq!(Arc::strong_count(&first), 1, "the thread let the old handle go");
    }
}
