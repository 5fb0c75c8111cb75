//! What a controller is to reconcile — the objects its store announced as
//! changed, and every object at each pass — handed to it a window at a
//! time instead of all at once.
//!
//! NB: kube's controller queues what it is given in its scheduler at once,
//! and the scheduler's tables keep the room they grew to. A pass over
//! 100,000 ApiKeys (`reconcile_all_on`), or a compile announcing that all
//! of them moved, left those tables at 100,000 entries for the rest of the
//! process (heaptrack at 20,000 keys: ~590 bytes a key for the two ApiKey
//! controllers). Here what waits is names in our own queues, given back
//! once drained, and at most [`WINDOW`] objects are in the controller at
//! once: it reports each reconcile it finishes (`Paced::finished`), and
//! that makes room for the next.
//!
//! ```text
//! announce(ref) ──► changed ─┐
//!                            ├─► room in the window? ─► ObjectRef ─► controller
//! pass trigger ───► pass ────┘            ▲                              │
//!                                         └──── finished(its output) ◄───┘
//! ```

use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasher as _;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt as _, Stream, StreamExt as _};
use kube::Resource;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;

/// Objects in a controller at once, handed out here.
pub const WINDOW: usize = 1024;
/// How long a full window waits for a report before it counts itself
/// empty (a safety net, with a warning: every object handed out is
/// reported once, reconciled, failed or gone).
pub const STALL: Duration = Duration::from_secs(30);
/// Queues that grew past this are given back their room once drained.
const KEPT_ROOM: usize = 1024;

/// An object's namespace and name.
type Name = (Option<Box<str>>, Box<str>);

/// What waits to be handed to one controller, and what it holds; each
/// object by a digest of its namespace and name, keyed per process (no one
/// can make two names collide on purpose).
#[derive(Debug, Default)]
struct Queues {
    identities: std::hash::RandomState,
    /// Objects announced as changed: handed out first.
    changed: VecDeque<Name>,
    in_changed: HashSet<u64>,
    /// Objects of a pass over every object.
    pass: VecDeque<Name>,
    in_pass: HashSet<u64>,
    /// Objects handed out and not yet reported.
    handed: HashSet<u64>,
    /// Changed objects handed out in a row while a pass waited.
    changed_in_a_row: usize,
}

/// Of this many objects handed out while both queues wait, one is a pass's:
/// a tenant changing objects in a loop cannot hold every pass back.
const PASS_SHARE: usize = 4;

impl Queues {
    fn with_identities(identities: std::hash::RandomState) -> Self {
        Self { identities, ..Self::default() }
    }

    fn identity(&self, namespace: Option<&str>, name: &str) -> u64 {
        self.identities.hash_one((namespace, name))
    }

    /// Queues a changed object, unless it already waits as one.
    fn announce(&mut self, (namespace, name): Name) {
        if self.in_changed.insert(self.identity(namespace.as_deref(), &name)) {
            self.changed.push_back((namespace, name));
        }
    }

    /// Queues every object of `names` not already waiting for a pass.
    fn pass(&mut self, names: Vec<Name>) {
        for (namespace, name) in names {
            if self.in_pass.insert(self.identity(namespace.as_deref(), &name)) {
                self.pass.push_back((namespace, name));
            }
        }
    }

    /// Whether an object waits, and whether it may go now: the window has
    /// room, or the object is in the controller already (its request is
    /// merged there).
    fn ready(&self, limit: usize) -> (bool, bool) {
        let front = if self.pass_next() { self.pass.front() } else { self.changed.front() };
        let Some((namespace, name)) = front else { return (false, false) };
        let identity = self.identity(namespace.as_deref(), name);
        (true, self.handed.len() < limit || self.handed.contains(&identity))
    }

    /// Whether the next object is a pass's: changed ones go first, but
    /// one in [`PASS_SHARE`] is a pass's while both wait.
    fn pass_next(&self) -> bool {
        !self.pass.is_empty() && (self.changed.is_empty() || self.changed_in_a_row + 1 >= PASS_SHARE)
    }

    /// Takes the next object into the window.
    fn hand_out(&mut self) -> Option<Name> {
        let (next, waiting) = if self.pass_next() {
            self.changed_in_a_row = 0;
            (self.pass.pop_front()?, &mut self.in_pass)
        } else {
            self.changed_in_a_row += 1;
            (self.changed.pop_front()?, &mut self.in_changed)
        };
        let identity = self.identities.hash_one((next.0.as_deref(), &*next.1));
        waiting.remove(&identity);
        self.handed.insert(identity);
        self.shrink_when_drained();
        Some(next)
    }

    /// Gives back the room of queues that grew large and are empty again.
    fn shrink_when_drained(&mut self) {
        if self.changed.is_empty() && self.changed.capacity() > KEPT_ROOM {
            self.changed.shrink_to_fit();
            self.in_changed.shrink_to_fit();
        }
        if self.pass.is_empty() && self.pass.capacity() > KEPT_ROOM {
            self.pass.shrink_to_fit();
            self.in_pass.shrink_to_fit();
        }
    }
}

/// The handle to one controller's queues: what to announce, and the
/// reconciles it reports. The queues themselves belong to one task
/// (`handed_out`), which these messages reach.
#[derive(Debug, Clone)]
pub struct Paced {
    identities: std::hash::RandomState,
    announced: mpsc::UnboundedSender<Name>,
    reported: mpsc::UnboundedSender<u64>,
}

impl Paced {
    fn announce(&self, namespace: Option<&str>, name: &str) {
        let _ = self.announced.send((namespace.map(Box::from), Box::from(name)));
    }

    /// The controller reported `result`: its object, if handed out here,
    /// leaves the window (a request merged in the controller with another
    /// is reported once, and frees its place then).
    pub fn finished<K, E, Q>(&self, result: &Result<(ObjectRef<K>, Action), controller::Error<E, Q>>)
    where
        K: Resource,
    {
        let (namespace, name) = match result {
            Ok((object, _)) => (object.namespace.as_deref(), object.name.as_str()),
            Err(controller::Error::ObjectNotFound(object) | controller::Error::ReconcilerFailed(_, object)) => {
                (object.namespace.as_deref(), object.name.as_str())
            }
            Err(_) => return,
        };
        let _ = self.reported.send(self.identities.hash_one((namespace, name)));
    }
}

/// Where a store announces the objects whose relevant fields changed, to
/// the controller that reconciles them once it runs. Nothing is queued
/// before: a standby replica waiting for the leader Lease would otherwise
/// queue every change it sees.
pub struct Feed<K>(Arc<arc_swap::ArcSwapOption<Paced>>, PhantomData<fn() -> K>);

impl<K> Clone for Feed<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone(), PhantomData)
    }
}

impl<K> Default for Feed<K> {
    fn default() -> Self {
        Self(Arc::new(arc_swap::ArcSwapOption::empty()), PhantomData)
    }
}

impl<K: Resource> Feed<K> {
    pub(crate) fn announce(&self, reference: ObjectRef<K>) {
        if let Some(paced) = self.0.load().as_ref() {
            paced.announce(reference.namespace.as_deref(), &reference.name);
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static> Feed<K> {
    /// What the controller is to reconcile from now on (replacing an
    /// earlier subscriber): the announced objects, and every object of
    /// `store` each time `passes` fires, a window at a time. The controller
    /// reports each reconcile to the returned `Paced` (`finished`).
    pub(crate) fn subscribe(
        &self,
        store: Store<K>,
        passes: impl Stream<Item = ()> + Send + 'static,
    ) -> (impl Stream<Item = ObjectRef<K>> + Send + 'static, Arc<Paced>) {
        let (objects, paced) = handed_out(store, passes, WINDOW, STALL);
        let paced = Arc::new(paced);
        self.0.store(Some(paced.clone()));
        (objects, paced)
    }
}

/// The task that owns a controller's queues: it takes announcements,
/// reports and passes as they come, and hands the next object out when the
/// controller takes one and the window has room.
fn handed_out<K>(
    store: Store<K>,
    passes: impl Stream<Item = ()> + Send + 'static,
    limit: usize,
    stall: Duration,
) -> (impl Stream<Item = ObjectRef<K>> + Send + 'static, Paced)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let identities = std::hash::RandomState::new();
    let (announced, mut announcements) = mpsc::unbounded_channel::<Name>();
    let (reported, mut reports) = mpsc::unbounded_channel::<u64>();
    let paced = Paced { identities: identities.clone(), announced, reported };
    let (sender, mut receiver) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut queues = Queues::with_identities(identities);
        let mut passes = std::pin::pin!(passes.fuse());
        // Since when an object has waited for room (the stall's clock).
        let mut full_since: Option<tokio::time::Instant> = None;
        loop {
            if full_since.is_some_and(|since| since.elapsed() >= stall) {
                // Every object handed out is reported once; a full window
                // nothing reported on for so long has lost count.
                tracing::warn!(
                    handed = queues.handed.len(),
                    "no reconcile reported for {stall:?}: counting the window as empty"
                );
                queues.handed.clear();
                full_since = None;
            }
            let (waiting, may_go) = queues.ready(limit);
            if !waiting || may_go {
                full_since = None;
            } else if full_since.is_none() {
                full_since = Some(tokio::time::Instant::now());
            }
            let stall_ends = full_since.map_or_else(tokio::time::Instant::now, |since| since + stall);
            tokio::select! {
                biased;
                Some(identity) = reports.recv() => {
                    queues.handed.remove(&identity);
                }
                Some(name) = announcements.recv() => queues.announce(name),
                Some(()) = passes.next() => {
                    // Triggers already waiting are the same pass.
                    while let Some(Some(())) = passes.next().now_or_never() {}
                    queues.pass(names(&store));
                }
                permit = sender.reserve(), if may_go => {
                    let Ok(permit) = permit else { return };
                    if let Some((namespace, name)) = queues.hand_out() {
                        let mut object = ObjectRef::new(&name);
                        object.namespace = namespace.map(String::from);
                        permit.send(object);
                    }
                }
                () = tokio::time::sleep_until(stall_ends), if full_since.is_some() => {}
                else => return,
            }
        }
    });
    (futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx)), paced)
}

/// The namespace and name of every object in `store`, not the objects: a
/// pass holding them would keep the old copy of each one replaced before
/// the pass reaches it.
fn names<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Vec<Name> {
    store
        .state()
        .iter()
        .map(|object| {
            let meta = object.meta();
            (meta.namespace.as_deref().map(Box::from), Box::from(meta.name.as_deref().unwrap_or_default()))
        })
        .collect()
}

#[cfg(test)]
#[path = "paced_tests.rs"]
mod tests;
