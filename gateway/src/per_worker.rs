//! What each data-plane worker keeps of its own (see `worker.rs` for the
//! layout): its index, a shard per worker of what every request writes
//! ([`PerWorker`]), its own handles on shared values every request holds
//! ([`Handle`], [`Handles`]), its own copies of the names and authorities a
//! request clones ([`Copies`]), and the batching of what it publishes
//! ([`publish_batches`]). A leaf: everything above it may use it.

use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's worker index: 0 on any thread that is not a worker
/// (a gateway served on the caller's runtime uses one pool per model).
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Makes the calling thread worker `index`.
pub fn become_worker(index: usize) {
    INDEX.set(index);
}

/// Shards of a [`PerWorker`]: a 4-core pod runs 4 workers; twice that
/// keeps bigger pods mostly apart.
pub const SHARDS: usize = 8;

/// One `T` per worker, each on a cache line of its own, for what every
/// request writes: a value shared by every worker would be a line every
/// core writes per request. Workers past [`SHARDS`] share; readers see
/// [`PerWorker::all`].
#[derive(Debug, Default)]
pub struct PerWorker<T> {
    shards: [Padded<T>; SHARDS],
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> PerWorker<T> {
    /// The calling worker's own.
    pub fn mine(&self) -> &T {
        &self.shards[index() % SHARDS].0
    }

    /// Every shard.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.shards.iter().map(|shard| &shard.0)
    }
}

/// A worker's own handle on a shared value that every request holds (the
/// served snapshot, an endpoint set): the request clones the handle, whose
/// count only this worker writes, not the shared `Arc`, whose count every
/// core would write twice per request.
#[derive(Debug)]
pub struct Handle<T>(Arc<T>);

impl<T> Handle<T> {
    /// A handle on `shared`.
    pub fn new(shared: Arc<T>) -> Arc<Self> {
        Arc::new(Self(shared))
    }

    /// Whether it is a handle on `shared`.
    pub fn is_on(&self, shared: &Arc<T>) -> bool {
        Arc::ptr_eq(&self.0, shared)
    }
}

impl<T> std::ops::Deref for Handle<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// A thread's handles, direct-mapped: a slot keeps the handle on the value
/// last asked for in it, and lets the one before go (so a value that was
/// replaced is let go at the thread's next request for its slot).
pub struct Handles<T> {
    slots: Vec<Option<Arc<Handle<T>>>>,
}

impl<T> Handles<T> {
    /// `slots` empty slots (at least one).
    pub fn new(slots: usize) -> Self {
        Self { slots: (0..slots.max(1)).map(|_| None).collect() }
    }

    /// This thread's handle on `shared`, from slot `slot` (modulo the
    /// slots). The slot's handle holds its value, so an equal address is
    /// the same value.
    pub fn on(&mut self, slot: usize, shared: &Arc<T>) -> Arc<Handle<T>> {
        let count = self.slots.len();
        let entry = &mut self.slots[slot % count];
        match entry {
            Some(handle) if handle.is_on(shared) => handle.clone(),
            _ => {
                let handle = Handle::new(shared.clone());
                *entry = Some(handle.clone());
                handle
            }
        }
    }
}

/// Slots of a [`Copies`] table (a power of two; two a set).
const COPY_SLOTS: usize = 64;

/// A worker's own copies of shared values each request clones (a model
/// name, a key id, an upstream's authority): a clone of the shared value
/// writes its reference count, a line every core writes per request; a
/// worker's copy has a count only that worker writes. Direct-mapped by the
/// address and length of what is copied, and bounded: a value that loses
/// its slot is copied again when next asked for. An entry holds the
/// original, so the address it is found by is not reused while it lives
/// (and a config that changed keeps, per worker, at most a table's worth of
/// old names alive until they are displaced).
pub struct Copies<T> {
    slots: Vec<Option<CopyEntry<T>>>,
}

/// Where the original's bytes are, the original, and the worker's copy.
type CopyEntry<T> = ((usize, usize), T, T);

impl<T: Clone> Copies<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self { slots: (0..COPY_SLOTS).map(|_| None).collect() }
    }

    /// This worker's copy of `original`, whose shared bytes are at
    /// `address` (start and length); `copy` makes one on a miss.
    ///
    /// Two ways a set: a request asks for its key's and its model's names,
    /// and with one slot each, two names that met in it displaced each
    /// other on every request (a new copy of each, so a metric-series cache
    /// miss and seven labelled lookups a request, some 1,900 instructions,
    /// in about one process layout of 64).
    pub fn of(&mut self, original: &T, address: (usize, usize), copy: impl FnOnce(&T) -> T) -> T {
        let set = set_of(address);
        for way in set..set + 2 {
            if let Some((at, _, own)) = &self.slots[way]
                && *at == address
            {
                return own.clone();
            }
        }
        // The newest goes first; the older of the two moves over (and the
        // other one it displaces is let go).
        let own = copy(original);
        self.slots[set + 1] = self.slots[set].take();
        self.slots[set] = Some((address, original.clone(), own.clone()));
        own
    }
}

/// The first slot of the set of a value at `address` (start and length).
fn set_of((start, length): (usize, usize)) -> usize {
    // Allocations are 16-byte aligned: the bits above tell them apart (a
    // full mix cost more than the rest of the lookup).
    (((start >> 4) ^ (start >> 10) ^ length) % COPY_SLOTS) & !1
}

impl<T: Clone> Default for Copies<T> {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    static NAMES: std::cell::RefCell<Copies<Arc<str>>> = std::cell::RefCell::new(Copies::new());
    static AUTHORITIES: std::cell::RefCell<Copies<http::uri::Authority>> = std::cell::RefCell::new(Copies::new());
}

/// This thread's own copy of `name` (equal text, its own allocation).
pub fn own_name(name: &Arc<str>) -> Arc<str> {
    let address = (name.as_ptr() as usize, name.len());
    NAMES.with_borrow_mut(|names| names.of(name, address, |name| Arc::from(&**name)))
}

/// This thread's own copy of `authority` (its bytes are reference-counted
/// like a name's).
pub fn own_authority(authority: &http::uri::Authority) -> http::uri::Authority {
    let text = authority.as_str();
    let address = (text.as_ptr() as usize, text.len());
    AUTHORITIES.with_borrow_mut(|authorities| {
        authorities.of(authority, address, |authority| {
            let bytes = bytes::Bytes::copy_from_slice(authority.as_str().as_bytes());
            http::uri::Authority::from_maybe_shared(bytes).unwrap_or_else(|_| authority.clone())
        })
    })
}

/// Runs `publish` `window` after the first write since its last run, for
/// as long as it runs: what a worker batches (access lines, metric counts)
/// waits at most `window`, and an idle worker does nothing.
pub async fn publish_batches(first: Arc<tokio::sync::Notify>, window: std::time::Duration, publish: fn()) {
    loop {
        first.notified().await;
        tokio::time::sleep(window).await;
        publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal text in an allocation of the thread's own, the same one each
    /// time on a thread, another on another thread.
    #[test]
    fn a_thread_clones_its_own_copy_of_a_name() {
        let name: Arc<str> = Arc::from("team/key");
        let mine = own_name(&name);
        assert_eq!(&*mine, "team/key");
        assert!(!Arc::ptr_eq(&mine, &name), "a copy, with a count of its own");
        assert!(Arc::ptr_eq(&mine, &own_name(&name)), "the same copy each time");
        let theirs = std::thread::spawn({
            let name = name.clone();
            move || own_name(&name)
        })
        .join()
        .unwrap();
        assert!(!Arc::ptr_eq(&mine, &theirs) && *mine == *theirs);
        // Equal text elsewhere is another entry (found by address).
        let other: Arc<str> = Arc::from("team/key");
        assert!(!Arc::ptr_eq(&own_name(&other), &mine));
    }

    #[test]
    fn a_thread_clones_its_own_copy_of_an_authority() {
        let authority = http::uri::Authority::from_static("vllm.models:8000");
        let uri: http::Uri = "http://vllm.models:8000/v1".parse().unwrap();
        let parsed = uri.authority().unwrap().clone();
        let mine = own_authority(&parsed);
        assert_eq!(mine, authority);
        assert_ne!(mine.as_str().as_ptr(), parsed.as_str().as_ptr(), "its own bytes");
        assert_eq!(own_authority(&parsed).as_str().as_ptr(), mine.as_str().as_ptr(), "the same each time");
    }

    /// Two values whose addresses meet in one set both stay, whichever is
    /// asked for in turn; a third displaces the older.
    #[test]
    fn two_values_of_one_set_do_not_displace_each_other() {
        let mut table = Copies::<Arc<str>>::new();
        let names: Vec<Arc<str>> = ["model", "team/key", "third"].into_iter().map(Arc::from).collect();
        // Made-up addresses of one set (the table only compares them).
        let addresses: Vec<(usize, usize)> =
            (0..).map(|at| (0x1000 + 16 * at, 5)).filter(|&a| set_of(a) == set_of((0x1000, 5))).take(3).collect();
        let copies = std::cell::Cell::new(0);
        let ask = |table: &mut Copies<Arc<str>>, which: usize| {
            table.of(&names[which], addresses[which], |name| {
                copies.set(copies.get() + 1);
                Arc::from(&**name)
            })
        };
        let (model, key) = (ask(&mut table, 0), ask(&mut table, 1));
        for _ in 0..3 {
            assert!(Arc::ptr_eq(&ask(&mut table, 0), &model) && Arc::ptr_eq(&ask(&mut table, 1), &key));
        }
        assert_eq!(copies.get(), 2, "each copied once");
        assert_eq!(*ask(&mut table, 2), *"third");
        assert!(Arc::ptr_eq(&ask(&mut table, 1), &key), "the newer of the two stays");
        assert_eq!(copies.get(), 3);
        assert!(!Arc::ptr_eq(&ask(&mut table, 0), &model), "the older was displaced");
    }

    /// A table holds at most its slots; an entry that lost its slot is
    /// copied again, and every answer is a copy of what was asked for.
    #[test]
    fn the_copies_are_bounded() {
        let mut table = Copies::<Arc<str>>::new();
        let names: Vec<Arc<str>> = (0..4 * COPY_SLOTS).map(|i| Arc::from(format!("name-{i}"))).collect();
        for name in &names {
            let address = (name.as_ptr() as usize, name.len());
            assert_eq!(*table.of(name, address, |n| Arc::from(&**n)), **name);
        }
        let held = names.iter().filter(|name| Arc::strong_count(name) > 1).count();
        assert!(held > 0 && held <= COPY_SLOTS, "{held} originals held: displaced ones are let go");
        for name in &names {
            let address = (name.as_ptr() as usize, name.len());
            assert_eq!(*table.of(name, address, |n| Arc::from(&**n)), **name);
        }
    }
}
