//! The refresher: every slot's key set fetched when due, each fetch a task
//! of its own, each answer settled and published as it arrives — so an
//! issuer that hangs (10 s a request) holds back only its own slot, never
//! the round of every other provider. At most [`AT_ONCE`] fetches run at
//! once; due slots start earliest-due first, so none waits behind ones
//! due later. A gateway pod may ask for a slot sooner (a token named a
//! `kid` its set lacks, as right after the issuer rotated: `nudges.rs`):
//! granted at most once per [`MIN_REFRESH`] per slot, whatever the pods
//! say, so no pod can make the operator hammer an issuer.
//!
//! ```text
//! Gateways ─► sync ─► slots ─► start (due, in flight ≤ AT_ONCE) ─► Flights (a task each)
//!   nudges ─► nudge (≥ MIN_REFRESH after the last start)          │
//!   answers, one at a time ◄──────────────────────────────────────┘
//!     ─► take: settle (slot.rs) ─► Outcome ─► the shell: publish, announce, Events, metrics
//! ```
//!
//! What this does not do: read the stores or write anything (the shell,
//! `controller/key_sets.rs`, does), or decide what an answer means
//! (`slot.rs`).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use super::document::{MIN_REFRESH, REFRESH};
use super::fetch::{Answer, Etag, FetchError, Fetcher, Want};
use super::slot::Slot;
use super::{Published, SlotKey};
use crate::compile::key_source::{HeldKeySet, KeySetIndex};

/// Fetches in flight at once.
pub const AT_ONCE: usize = 16;

/// What fetches a key set: the operator's [`Fetcher`], or a test's.
pub trait Fetch: Clone + Send + Sync + 'static {
    /// The key set of `want`, conditional on `etag`.
    fn key_set(&self, want: Want, etag: Option<Etag>) -> impl Future<Output = Result<Answer, FetchError>> + Send;
    /// The cluster's ServiceAccount issuer.
    fn cluster_issuer(&self) -> impl Future<Output = Result<String, FetchError>> + Send;
}

impl Fetch for Fetcher {
    fn key_set(&self, want: Want, etag: Option<Etag>) -> impl Future<Output = Result<Answer, FetchError>> + Send {
        let fetcher = self.clone();
        async move { Fetcher::key_set(&fetcher, &want, etag.as_ref()).await }
    }

    fn cluster_issuer(&self) -> impl Future<Output = Result<String, FetchError>> + Send {
        let fetcher = self.clone();
        async move { Fetcher::cluster_issuer(&fetcher).await }
    }
}

/// A fetch started: which one, so that its answer finds its slot (and
/// only the slot it was started for: a slot replaced meanwhile, its source
/// edited, ignores it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// A slot's key set; `u64` numbers the fetch.
    KeySet(SlotKey, u64),
    /// The cluster's issuer.
    Issuer,
}

/// What a slot's fetch asks for: its source, and the ETag of the set held.
pub type Request = (Want, Option<Etag>);

/// A fetch's answer.
#[derive(Debug)]
pub enum Done {
    /// A key set's.
    KeySet(SlotKey, u64, Result<Answer, FetchError>),
    /// The cluster's issuer.
    Issuer(Result<String, FetchError>),
    /// A fetch whose task ended without an answer (it panicked).
    Lost(Job),
}

/// What one answer changed, for the shell to act on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The published state changed: publish it.
    pub changed: bool,
    /// A Gateway to compile again (its key set or fetch error changed).
    pub announce: Option<crate::compile::ObjectKey>,
    /// For `waycast_operator_key_set_fetches_total{result}`.
    pub result: Option<&'static str>,
    /// A slot took a new document, of this many signing keys (logged).
    pub fetched: Option<(SlotKey, usize)>,
    /// A slot whose error appeared, changed or cleared, as held now: its Event.
    pub moved: Option<(SlotKey, HeldKeySet)>,
    /// The cluster's issuer became known or changed: every Gateway that
    /// trusts it compiles again.
    pub issuer_changed: bool,
    /// Why the issuer's fetch failed, when that is news (logged).
    pub issuer_error: Option<String>,
}

/// The cluster's issuer, fetched like a slot.
#[derive(Debug)]
struct Issuer {
    known: Option<String>,
    error: Option<String>,
    due: Instant,
    in_flight: bool,
}

/// Every slot, the seeds not yet taken, the cluster's issuer.
pub struct Refresher {
    slots: BTreeMap<SlotKey, Slot>,
    seeds: BTreeMap<SlotKey, HeldKeySet>,
    issuer: Issuer,
    /// Numbers fetches, so a late answer finds no slot it was not for.
    fetches: u64,
}

impl Refresher {
    /// A refresher holding `seeds` for the first slots of their sources.
    /// NB: the cluster's issuer is never seeded — it is the issuer every
    /// Gateway is compiled with, and a seed comes from one Gateway's
    /// config Secret; each Gateway's seeds carry the one its own config
    /// named (`HeldKeySet::seeded_issuer`) until the API server's is known.
    pub fn new(seeds: BTreeMap<SlotKey, HeldKeySet>, now: Instant) -> Self {
        let issuer = Issuer { known: None, error: None, due: now, in_flight: false };
        Self { slots: BTreeMap::new(), seeds, issuer, fetches: 0 }
    }

    /// Makes the slots those `wanted`: a new one (or one whose source
    /// changed) starts from its seed when the seed is of the same source,
    /// else from nothing, due now; one no longer wanted is dropped (its
    /// fetch in flight, if any, is then ignored). Whether the slots changed.
    pub fn sync(&mut self, wanted: BTreeMap<SlotKey, Want>, now: Instant) -> bool {
        let before = self.slots.len();
        self.slots.retain(|key, slot| wanted.get(key).is_some_and(|want| slot.same_source(want)));
        let mut changed = before != self.slots.len();
        for (key, want) in wanted {
            if let Some(slot) = self.slots.get_mut(&key) {
                // A new CA bundle: the next fetch uses it.
                slot.want = want;
                continue;
            }
            let mut slot = Slot::new(want, now);
            if let Some(seed) = self.seeds.remove(&key).filter(|seed| seed.source == slot.want.source) {
                slot.held = seed;
            }
            self.slots.insert(key, slot);
            changed = true;
        }
        // Seeds serve a starting operator's first slots only.
        self.seeds.clear();
        changed
    }

    /// The fetches to start at `now`: the cluster's issuer when `cluster`
    /// (a provider trusts it) and it is due, then the slots due, earliest
    /// first, at most `room` in all; each marked in flight.
    pub fn start(&mut self, now: Instant, cluster: bool, room: usize) -> Vec<(Job, Option<Request>)> {
        let mut jobs = Vec::new();
        if room == 0 {
            return jobs;
        }
        if cluster && !self.issuer.in_flight && self.issuer.due <= now {
            self.issuer.in_flight = true;
            jobs.push((Job::Issuer, None));
        }
        let mut due: Vec<(Instant, &SlotKey)> = self
            .slots
            .iter()
            .filter(|(_, slot)| slot.in_flight.is_none() && slot.due <= now)
            .map(|(key, slot)| (slot.due, key))
            .collect();
        due.sort();
        let keys: Vec<SlotKey> = due.into_iter().take(room - jobs.len()).map(|(_, key)| key.clone()).collect();
        for key in keys {
            let Some(slot) = self.slots.get_mut(&key) else { continue };
            self.fetches += 1;
            slot.in_flight = Some(self.fetches);
            slot.started = Some(now);
            let fetch = (slot.want.clone(), slot.etag.clone());
            jobs.push((Job::KeySet(key, self.fetches), Some(fetch)));
        }
        jobs
    }

    /// Takes in one answer at `now` (`at` on the wall clock).
    pub fn take(&mut self, done: Done, now: Instant, at: jiff::Timestamp) -> Outcome {
        match done {
            Done::KeySet(key, fetch, answer) => {
                let Some(slot) = self.slots.get_mut(&key).filter(|slot| slot.in_flight == Some(fetch)) else {
                    return Outcome::default();
                };
                slot.in_flight = None;
                let settled = slot.settle(answer, at);
                slot.due = now + settled.after;
                if std::mem::take(&mut slot.nudged) {
                    slot.due = slot.due.min(slot.earliest(now));
                }
                let changed = settled.document_changed || settled.error_changed;
                Outcome {
                    changed,
                    announce: changed.then(|| key.0.clone()),
                    result: Some(settled.result),
                    fetched: settled.document_changed.then(|| (key.clone(), slot.held.keys)),
                    moved: settled.error_changed.then(|| (key, slot.held.clone())),
                    ..Outcome::default()
                }
            }
            Done::Issuer(answer) => self.take_issuer(answer, now),
            Done::Lost(Job::KeySet(key, fetch)) => {
                if let Some(slot) = self.slots.get_mut(&key).filter(|slot| slot.in_flight == Some(fetch)) {
                    slot.in_flight = None;
                    slot.due = now + MIN_REFRESH;
                }
                Outcome { result: Some("failed"), ..Outcome::default() }
            }
            Done::Lost(Job::Issuer) => self.take_issuer(Err(FetchError::Tls("the fetch ended early".into())), now),
        }
    }

    fn take_issuer(&mut self, answer: Result<String, FetchError>, now: Instant) -> Outcome {
        self.issuer.in_flight = false;
        match answer {
            Ok(issuer) => {
                self.issuer.due = now + REFRESH;
                self.issuer.error = None;
                let changed = self.issuer.known.as_deref() != Some(issuer.as_str());
                if changed {
                    self.issuer.known = Some(issuer);
                }
                Outcome { changed, issuer_changed: changed, ..Outcome::default() }
            }
            Err(error) => {
                self.issuer.due = now + MIN_REFRESH;
                let error = error.to_string();
                let news = self.issuer.error.as_deref() != Some(error.as_str());
                self.issuer.error = Some(error.clone());
                Outcome { issuer_error: news.then_some(error), ..Outcome::default() }
            }
        }
    }

    /// A pod asks for `key` to be fetched soon: at once when its last
    /// fetch started [`MIN_REFRESH`] ago or more, else then; with one in
    /// flight, after its answer at the soonest the rule allows (it may
    /// have started before the rotation). Whether it is due sooner now.
    pub fn nudge(&mut self, key: &SlotKey, now: Instant) -> bool {
        let Some(slot) = self.slots.get_mut(key) else { return false };
        if slot.in_flight.is_some() {
            slot.nudged = true;
            return false;
        }
        let earliest = slot.earliest(now);
        let sooner = earliest < slot.due;
        slot.due = slot.due.min(earliest);
        sooner
    }

    /// When the next fetch is due (of a slot or the cluster's issuer when
    /// `cluster`), not counting those in flight; `None`: nothing is.
    pub fn next_due(&self, cluster: bool) -> Option<Instant> {
        let slots = self.slots.values().filter(|slot| slot.in_flight.is_none()).map(|slot| slot.due);
        let issuer = (cluster && !self.issuer.in_flight).then_some(self.issuer.due);
        slots.chain(issuer).min()
    }

    /// The cluster's issuer, once known.
    pub fn cluster_issuer(&self) -> Option<&str> {
        self.issuer.known.as_deref()
    }

    /// What compile and the status are to read.
    pub fn published(&self) -> Published {
        let index: KeySetIndex = self.slots.iter().map(|(key, slot)| (key.clone(), slot.held.clone())).collect();
        Published { index: Arc::new(index), cluster_issuer: self.issuer.known.clone() }
    }
}

// === impl Flights ===

/// The fetches in flight, each a task of its own (so one that hangs
/// holds back no other, and one that panics loses only its answer).
pub struct Flights<F> {
    fetcher: F,
    tasks: tokio::task::JoinSet<Done>,
    jobs: HashMap<tokio::task::Id, Job>,
}

impl<F: Fetch> Flights<F> {
    /// None in flight yet.
    pub fn new(fetcher: F) -> Self {
        Self { fetcher, tasks: tokio::task::JoinSet::new(), jobs: HashMap::new() }
    }

    /// Fetches in flight.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Starts `job` (with its slot's want and ETag).
    pub fn start(&mut self, job: Job, fetch: Option<Request>) {
        let fetcher = self.fetcher.clone();
        let handle = match (job.clone(), fetch) {
            (Job::KeySet(key, number), Some((want, etag))) => self.tasks.spawn(async move {
                let answer = fetcher.key_set(want, etag).await;
                Done::KeySet(key, number, answer)
            }),
            (Job::Issuer, _) => self.tasks.spawn(async move { Done::Issuer(fetcher.cluster_issuer().await) }),
            (job @ Job::KeySet(..), None) => self.tasks.spawn(async move { Done::Lost(job) }),
        };
        self.jobs.insert(handle.id(), job);
    }

    /// The next answer, as soon as any fetch has one; `None` when none is
    /// in flight.
    pub async fn next(&mut self) -> Option<Done> {
        loop {
            match self.tasks.join_next_with_id().await? {
                Ok((id, done)) => {
                    self.jobs.remove(&id);
                    return Some(done);
                }
                Err(error) => {
                    if let Some(job) = self.jobs.remove(&error.id()) {
                        return Some(Done::Lost(job));
                    }
                }
            }
        }
    }
}

/// What wakes the refresher besides its answers and its timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The Gateways changed: the slots wanted may have.
    Gateways,
    /// Time to read the pods' nudges.
    Nudges,
}

/// What the refresher needs of the operator: the Gateways' wants, what to
/// do with each outcome, the pods' nudges.
pub trait Shell {
    /// What the Gateways want now, and whether any trusts the cluster's issuer.
    fn wanted(&self) -> (BTreeMap<SlotKey, Want>, bool);
    /// Acts on an outcome: publishes `published` (given when it changed),
    /// announces Gateways, Events, metrics.
    fn settled(&self, outcome: Outcome, published: Option<Published>) -> impl Future<Output = ()> + Send;
    /// The slots pods asked to be fetched soon, since last asked.
    fn nudges(&mut self) -> Vec<SlotKey>;
}

/// Keeps the key sets current for as long as `wakes` lasts.
pub async fn run<F, S, W>(mut refresher: Refresher, fetcher: F, mut shell: S, mut wakes: W)
where
    F: Fetch,
    S: Shell,
    W: futures_util::Stream<Item = Wake> + Unpin,
{
    use futures_util::StreamExt as _;
    let mut flights = Flights::new(fetcher);
    let (wanted, mut cluster) = shell.wanted();
    if refresher.sync(wanted, Instant::now()) {
        shell.settled(Outcome { changed: true, ..Outcome::default() }, Some(refresher.published())).await;
    }
    loop {
        for (job, fetch) in refresher.start(Instant::now(), cluster, AT_ONCE.saturating_sub(flights.len())) {
            flights.start(job, fetch);
        }
        // Nothing due: a Gateway change (or a nudge) wakes it sooner. NB: with every
        // place taken, slots due wait for an answer, not the clock (a due
        // time already past would wake the loop without end).
        let full = flights.len() >= AT_ONCE;
        let due = refresher.next_due(cluster).filter(|_| !full);
        let next = due.unwrap_or_else(|| Instant::now() + REFRESH);
        tokio::select! {
            Some(done) = flights.next(), if !flights.is_empty() => {
                let outcome = refresher.take(done, Instant::now(), jiff::Timestamp::now());
                let published = outcome.changed.then(|| refresher.published());
                shell.settled(outcome, published).await;
            }
            () = tokio::time::sleep_until(next) => {}
            wake = wakes.next() => match wake {
                None => return,
                Some(Wake::Gateways) => {
                    let wanted;
                    (wanted, cluster) = shell.wanted();
                    if refresher.sync(wanted, Instant::now()) {
                        let outcome = Outcome { changed: true, ..Outcome::default() };
                        shell.settled(outcome, Some(refresher.published())).await;
                    }
                }
                Some(Wake::Nudges) => {
                    let now = Instant::now();
                    for key in shell.nudges() {
                        refresher.nudge(&key, now);
                    }
                }
            },
        }
    }
}

#[cfg(test)]
#[path = "refresher_tests.rs"]
mod tests;
