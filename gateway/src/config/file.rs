//! `--config-file`: a YAML or JSON file, re-read when it changes (polled,
//! which also follows the symlink swaps of mounted ConfigMaps and Secrets)
//! and on SIGHUP.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::Update;
use super::gzip::MAX_CONFIG_BYTES;
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
pub async fn watch<T: From<Update>>(path: PathBuf, updates: mpsc::Sender<T>) {
    let source: Arc<str> = Arc::from(format!("file:{}", path.display()));
    let mut last = stamp(&path);
    if updates.send(read(&path, &source).into()).await.is_err() {
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
            if updates.send(read(&path, &source).into()).await.is_err() {
                return;
            }
        }
    }
}

fn read(path: &Path, source: &Arc<str>) -> Update {
    let bytes = read_at_most(path, MAX_CONFIG_BYTES).map_err(|error| LoadError::Unreadable(error.to_string()));
    Update { source: source.clone(), bytes }
}

/// The file's bytes, refused past `limit`: a file that grew without bound
/// (or a device path given by mistake) is not read into memory whole.
fn read_at_most(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("larger than {limit} bytes")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_over_the_limit_is_refused_not_read_whole() {
        let path = std::env::temp_dir().join(format!("waycast-read-at-most-{}", std::process::id()));
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_at_most(&path, 10).unwrap(), b"0123456789");
        let refused = read_at_most(&path, 9).unwrap_err();
        assert_eq!(refused.to_string(), "larger than 9 bytes");
        std::fs::remove_file(&path).unwrap();
        // Endless sources end at the limit too.
        assert!(read_at_most(Path::new("/dev/zero"), 1 << 20).is_err());
    }
}
