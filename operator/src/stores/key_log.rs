//! Which ApiKeys changed, in order: what the key lane
//! (`controller::key_lane`) writes as a patch of a Gateway's config
//! without a compile of every key.
//!
//! ```text
//! ApiKey store ──────► Key(namespace/name) ──┐
//! key Secret store ──► Secret(namespace/name) ┼─► channel (bounded) ─► Log { position, entries }
//! Namespace store ───► Unknown ───────────────┘       (drained under its lock; a full channel: Unknown)
//! ```
//!
//! A position is a count of entries: a reader that holds position `p` has
//! seen the stores after the changes before `p` (a change is logged after
//! its store has it). `Unknown` is a change that cannot be pinned to some
//! ApiKeys — a namespace's labels, or changes the channel had no room for
//! (nothing drains it on a replica that does not lead) — and closes the
//! log to patches across it: only a whole compile reads past it.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Mutex, MutexGuard, Notify, mpsc};

use crate::compile::ObjectKey;

/// The most entries kept: a reader further behind compiles whole.
const KEPT_ENTRIES: usize = 16_384;

/// One change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logged {
    /// This ApiKey changed.
    Key(ObjectKey),
    /// This key Secret changed: the ApiKeys reading it did.
    Secret(ObjectKey),
    /// Something a key's entry depends on changed, not known which.
    Unknown,
}

/// What changed between two positions.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// ApiKeys.
    pub keys: BTreeSet<ObjectKey>,
    /// Key Secrets.
    pub secrets: BTreeSet<ObjectKey>,
}

impl Changed {
    /// Nothing.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.secrets.is_empty()
    }
}

/// The log, and the channel the stores' listeners write to.
pub struct KeyLog {
    sender: mpsc::Sender<Logged>,
    /// A change found the channel full.
    overflowed: AtomicBool,
    log: Mutex<Log>,
    arrived: Notify,
}

/// The entries, once drained from the channel.
pub struct Log {
    receiver: mpsc::Receiver<Logged>,
    /// The position of `entries[0]`.
    first: u64,
    entries: VecDeque<Logged>,
}

impl Default for KeyLog {
    fn default() -> Self {
        let (sender, receiver) = mpsc::channel(KEPT_ENTRIES);
        let log = Mutex::new(Log { receiver, first: 0, entries: VecDeque::new() });
        Self { sender, overflowed: AtomicBool::new(false), log, arrived: Notify::new() }
    }
}

impl KeyLog {
    /// Logs a change (from a store's listener: never blocks).
    pub fn push(&self, change: Logged) {
        if self.sender.try_send(change).is_err() {
            self.overflowed.store(true, Ordering::Release);
        }
        self.arrived.notify_one();
    }

    /// Waits until something was logged since the last wait returned.
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// The log, with everything sent so far in it.
    pub async fn drained(&self) -> MutexGuard<'_, Log> {
        let mut log = self.log.lock().await;
        while let Ok(change) = log.receiver.try_recv() {
            log.append(change);
        }
        // Changes were lost somewhere before here: no patch reads past.
        if self.overflowed.swap(false, Ordering::Acquire) {
            log.append(Logged::Unknown);
        }
        log
    }
}

impl Log {
    fn append(&mut self, change: Logged) {
        self.entries.push_back(change);
        if self.entries.len() > KEPT_ENTRIES {
            self.entries.pop_front();
            self.first += 1;
        }
    }

    /// The position after the last entry.
    pub fn position(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    /// What changed from position `from` up to `to` (each once); `None`
    /// when an `Unknown` lies between, or `from` is no longer kept.
    pub fn changed_between(&self, from: u64, to: u64) -> Option<Changed> {
        let skip = usize::try_from(from.checked_sub(self.first)?).ok()?;
        let take = usize::try_from(to.min(self.position()).saturating_sub(from)).ok()?;
        let mut changed = Changed::default();
        for change in self.entries.iter().skip(skip).take(take) {
            match change {
                Logged::Key(key) => {
                    changed.keys.insert(key.clone());
                }
                Logged::Secret(secret) => {
                    changed.secrets.insert(secret.clone());
                }
                Logged::Unknown => return None,
            }
        }
        Some(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> ObjectKey {
        ObjectKey { namespace: "team".into(), name: name.into() }
    }

    fn key(name: &str) -> Logged {
        Logged::Key(id(name))
    }

    fn names(changed: Changed) -> Vec<String> {
        changed.keys.into_iter().map(|k| k.name).collect()
    }

    #[tokio::test]
    async fn changes_between_positions_once_each_and_closed_by_an_unknown() {
        let log = KeyLog::default();
        for change in [key("a"), key("b"), key("a"), Logged::Secret(id("a-key")), Logged::Unknown, key("c")] {
            log.push(change);
        }
        let drained = log.drained().await;
        assert_eq!(drained.position(), 6);
        assert_eq!(drained.changed_between(0, 3).map(names), Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(drained.changed_between(1, 2).map(names), Some(vec!["b".to_owned()]));
        let secrets = drained.changed_between(2, 4).unwrap().secrets;
        assert_eq!(secrets.into_iter().map(|s| s.name).collect::<Vec<_>>(), ["a-key"]);
        assert_eq!(drained.changed_between(2, 6), None, "an unknown change between");
        assert_eq!(drained.changed_between(5, 9).map(names), Some(vec!["c".to_owned()]));
        assert!(drained.changed_between(6, 6).unwrap().is_empty());
    }

    #[tokio::test]
    async fn changes_the_channel_had_no_room_for_close_the_log() {
        let log = KeyLog::default();
        for n in 0..KEPT_ENTRIES + 5 {
            log.push(key(&format!("k{n}")));
        }
        let drained = log.drained().await;
        assert_eq!(drained.position(), KEPT_ENTRIES as u64 + 1, "what fit, then an unknown");
        assert_eq!(drained.changed_between(0, drained.position()), None);
        assert_eq!(drained.changed_between(1, 11).map(|c| c.keys.len()), Some(10));
    }

    #[tokio::test]
    async fn a_reader_behind_what_is_kept_reads_nothing() {
        let log = KeyLog::default();
        for round in 0..2 {
            for n in 0..KEPT_ENTRIES / 2 + 5 {
                log.push(key(&format!("k{round}-{n}")));
            }
            drop(log.drained().await);
        }
        let drained = log.drained().await;
        assert_eq!(drained.position(), KEPT_ENTRIES as u64 + 10);
        assert_eq!(drained.changed_between(3, 20), None, "no longer kept");
        assert_eq!(drained.changed_between(10, 11).map(|c| c.keys.len()), Some(1));
    }
}
