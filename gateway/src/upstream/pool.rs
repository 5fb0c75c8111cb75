//! Idle upstream connections, per thread (so per data-plane worker, with
//! no lock): keyed by client, scheme and authority, last in first out,
//! dropped after [`POOL_IDLE_TIMEOUT`], when their client is dropped, and
//! whenever one is no longer fit to carry a request ([`Io::is_reusable`]:
//! the upstream closed it, or sent bytes nobody asked for).
//!
//! ```text
//! body ended, connection kept ─► Checkin::put ─► Pool (per thread) ─► Pool::take ─► checked again ─► next request
//!                                                 └─ sweep every SWEEP_EVERY: expired, closed, unasked bytes
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Weak;
use std::time::{Duration, Instant};

use http::uri::Authority;

use super::io::Io;

/// How long an idle upstream connection stays pooled.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// At most this many idle connections per upstream address and worker.
const MAX_IDLE_PER_KEY: usize = 512;

/// How often a worker's pool drops its expired and closed connections.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// What a pooled connection is kept under: its client, TLS or not,
/// guarded or not, and the authority, compared byte for byte (an authority spelled in another
/// case only gets a pool of its own).
#[derive(Clone)]
pub(super) struct PoolKey {
    pub(super) client: u64,
    pub(super) tls: bool,
    /// Opened under the egress policy: a connection the policy never
    /// checked is never lent to a request it applies to.
    pub(super) guarded: bool,
    pub(super) authority: Authority,
}

impl PartialEq for PoolKey {
    fn eq(&self, other: &Self) -> bool {
        self.client == other.client
            && self.tls == other.tls
            && self.guarded == other.guarded
            && self.authority.as_str() == other.authority.as_str()
    }
}

impl Eq for PoolKey {}

impl std::hash::Hash for PoolKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.client ^ u64::from(self.tls) << 63 ^ u64::from(self.guarded) << 62);
        state.write(self.authority.as_str().as_bytes());
    }
}

/// A SplitMix-mixed hash for the pool's keys (every request looks its
/// authority up twice, on take and on return; SipHash, which also hashes
/// `Authority` byte by byte, cost 4 % of a request). Keys come from the
/// config and the endpoint table, never from a client, so flooding the
/// table with colliding keys is not open to a caller.
#[derive(Default)]
pub(super) struct PoolHasher(u64);

impl std::hash::Hasher for PoolHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        let mut tail = [0; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.write_u64(u64::from_le_bytes(tail) ^ bytes.len() as u64);
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = super::pick::mix(self.0 ^ word);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A client's identity in the pools (ids are never reused).
pub(super) struct ClientId(pub(super) u64);

/// An idle connection and since when.
struct Idle {
    io: Io,
    since: Instant,
}

impl Idle {
    /// Young enough, and still fit for a request (this may read what
    /// arrived on it: see [`Io::is_reusable`]).
    fn is_fresh(&mut self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) < POOL_IDLE_TIMEOUT && self.io.is_reusable()
    }
}

/// One client's idle connections to one authority, on one thread.
struct Entry {
    /// Gone when the client is: its connections are then dropped.
    client: Weak<ClientId>,
    idle: Vec<Idle>,
}

/// The calling thread's idle connections, of every client.
pub struct Pool {
    entries: HashMap<PoolKey, Entry, BuildHasherDefault<PoolHasher>>,
    swept_at: Instant,
}

thread_local! {
    // One pool per thread: a worker's connections stay on its runtime and
    // its reactor, and taking one needs no lock.
    static POOL: RefCell<Pool> = RefCell::new(Pool { entries: HashMap::default(), swept_at: Instant::now() });
}

impl Pool {
    /// On the request path, at most every [`SWEEP_EVERY`]: drops expired
    /// connections and those of dropped clients, by age alone (no system
    /// call per idle connection while a request waits).
    fn sweep(&mut self, now: Instant) {
        if now.saturating_duration_since(self.swept_at) < SWEEP_EVERY {
            return;
        }
        self.swept_at = now;
        self.entries.retain(|_, entry| {
            entry.idle.retain(|idle| now.saturating_duration_since(idle.since) < POOL_IDLE_TIMEOUT);
            entry.client.strong_count() > 0 && !entry.idle.is_empty()
        });
    }

    /// Off the request path: drops expired, closed and unfit connections
    /// and those of dropped clients, so that an upstream or a config that
    /// went away leaves no sockets behind for long.
    fn sweep_now(&mut self, now: Instant) {
        self.swept_at = now;
        self.entries.retain(|_, entry| {
            if entry.client.strong_count() == 0 {
                return false;
            }
            entry.idle.retain_mut(|idle| idle.is_fresh(now));
            !entry.idle.is_empty()
        });
    }

    /// Sweeps this thread's pool every `every` for as long as the task
    /// runs (a worker runs it with [`SWEEP_EVERY`]), so that a worker with
    /// no requests does not keep the sockets its upstreams have closed.
    pub async fn sweep_while_idle(every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            POOL.with(|pool| {
                if let Ok(mut pool) = pool.try_borrow_mut() {
                    pool.sweep_now(Instant::now());
                }
            });
        }
    }

    /// This thread's idle connections.
    #[cfg(test)]
    pub(super) fn idle_connections() -> usize {
        POOL.with_borrow(|pool| pool.entries.values().map(|entry| entry.idle.len()).sum())
    }

    /// A live idle connection for `key`, the most recently used first.
    pub(super) fn take(key: &PoolKey) -> Option<Io> {
        POOL.with(|pool| {
            let mut pool = pool.try_borrow_mut().ok()?;
            let now = Instant::now();
            pool.sweep(now);
            let entry = pool.entries.get_mut(key)?;
            while let Some(mut idle) = entry.idle.pop() {
                if idle.is_fresh(now) {
                    return Some(idle.io);
                }
            }
            None
        })
    }

    fn put(client: Weak<ClientId>, key: PoolKey, io: Io) {
        POOL.with(|pool| {
            let Ok(mut pool) = pool.try_borrow_mut() else { return };
            let now = Instant::now();
            pool.sweep(now);
            let entry = pool.entries.entry(key).or_insert_with(|| Entry { client, idle: Vec::new() });
            if entry.idle.len() < MAX_IDLE_PER_KEY {
                entry.idle.push(Idle { io, since: now });
            }
        });
    }
}

/// Where a connection goes back once its response has been read.
pub(super) struct Checkin {
    pub(super) client: Weak<ClientId>,
    pub(super) key: PoolKey,
}

impl Checkin {
    pub(super) fn put(self, io: Io) {
        if self.client.strong_count() > 0 {
            Pool::put(self.client, self.key, io);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_keys_hash_by_client_scheme_guard_and_exact_authority() {
        use std::hash::BuildHasher;
        let hasher = BuildHasherDefault::<PoolHasher>::default();
        let key = |client, tls, guarded, authority: &str| PoolKey {
            client,
            tls,
            guarded,
            authority: authority.parse().unwrap(),
        };
        let base = key(1, false, true, "10.0.0.5:8000");
        assert!(base == key(1, false, true, "10.0.0.5:8000"));
        assert_eq!(hasher.hash_one(&base), hasher.hash_one(key(1, false, true, "10.0.0.5:8000")));
        for other in [
            key(2, false, true, "10.0.0.5:8000"),
            key(1, true, true, "10.0.0.5:8000"),
            key(1, false, false, "10.0.0.5:8000"),
            key(1, false, true, "10.0.0.5:8001"),
        ] {
            assert!(base != other);
            assert_ne!(hasher.hash_one(&base), hasher.hash_one(&other));
        }
    }
}
