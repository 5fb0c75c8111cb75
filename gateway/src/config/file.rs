//! `--config-file`: a YAML or JSON file, re-read when it changes (polled,
//! which also follows the symlink swaps of mounted ConfigMaps and Secrets)
//! and on SIGHUP.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::Update;
use super::load::LoadError;

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

/// Reads `path` now, then again whenever it changes or SIGHUP comes, until
/// the applier is gone.
pub async fn watch(path: PathBuf, updates: mpsc::Sender<Update>) {
    let source: Arc<str> = Arc::from(format!("file:{}", path.display()));
    let mut last = stamp(&path);
    if updates.send(read(&path, &source)).await.is_err() {
        return;
    }
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
            if updates.send(read(&path, &source)).await.is_err() {
                return;
            }
        }
    }
}

fn read(path: &PathBuf, source: &Arc<str>) -> Update {
    let bytes = std::fs::read(path).map_err(|error| LoadError::Unreadable(error.to_string()));
    Update { source: source.clone(), bytes }
}
