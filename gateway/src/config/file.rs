//! `--config-file`: a YAML or JSON file, re-read when it changes (polled,
//! which also follows the symlink swaps of mounted ConfigMaps and Secrets)
//! and on SIGHUP.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{SignalKind, signal};

use crate::Shared;

/// How often the file's metadata is checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

#[derive(PartialEq, Eq, Clone, Copy)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &PathBuf) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let metadata = std::fs::metadata(path).ok()?;
    Some(Stamp { modified: metadata.modified().ok(), len: metadata.len(), inode: metadata.ino() })
}

/// Loads `path` now, then keeps it applied until the process ends.
pub async fn watch(path: PathBuf, shared: Arc<Shared>) {
    let source = format!("file:{}", path.display());
    let mut last = stamp(&path);
    read_and_apply(&path, &source, &shared);
    let mut hangups = signal(SignalKind::hangup()).ok();
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = ticker.tick() => false,
            Some(()) = async { match hangups.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => true,
        };
        let now = stamp(&path);
        if forced || now != last {
            last = now;
            read_and_apply(&path, &source, &shared);
        }
    }
}

fn read_and_apply(path: &PathBuf, source: &str, shared: &Shared) {
    match std::fs::read(path) {
        Ok(bytes) => {
            // Errors are logged and counted by the store.
            let _ = shared.config.apply(&bytes, source, &shared.metrics);
        }
        Err(error) => {
            shared.metrics.config_reload_errors.inc();
            tracing::error!(source, %error, "cannot read config file; keeping the last good config");
        }
    }
}
