//! `GET /v1/usage`'s reads of budget spends counted in Redis: from a short
//! cache, and bounded, so that a client asking in a loop can neither flood
//! Redis nor crowd the admissions out of the pod's one Redis link (where a
//! full queue fails them open, or closed).
//!
//! ```text
//! budgets_spent(hashes) ─► plan: fresh (≤ FRESH old) ─► answered, no read
//!                          │ being read by another answer ─► its last spend
//!                          │ missing or older
//!                          ▼
//!                 a lookup slot free (≤ MAX_LOOKUPS_IN_FLIGHT at once)
//!                 and a lookup left this second (≤ MAX_LOOKUPS_PER_SECOND)?
//!                   yes ─► claimed; one HMGET per budget, pipelined ─► keep
//!                   no  ─► the last spend read, if at most STALE_LIMIT old; else unknown
//! ```
//!
//! So a budget is read at most once a `FRESH` however often it is asked
//! for, one pod begins at most `MAX_LOOKUPS_PER_SECOND` lookups of at most
//! `MAX_BUDGETS_PER_LOOKUP` budgets a second, and at most
//! `MAX_LOOKUPS_IN_FLIGHT × MAX_BUDGETS_PER_LOOKUP` of its reads ever wait
//! in the link's queue beside the admissions (of its `MAX_QUEUED`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, Semaphore, SemaphorePermit};

/// How long a spend read is served without reading it again (and how long
/// a claim to read it stands, should its reader be cancelled).
pub const FRESH: Duration = Duration::from_secs(1);
/// How old a spend may be to stand in for one not read now.
pub const STALE_LIMIT: Duration = Duration::from_secs(10);
/// Lookups (one `/v1/usage` answer's budgets to read) in flight at once.
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 2;
/// Lookups begun per second.
pub const MAX_LOOKUPS_PER_SECOND: u32 = 50;
/// Budgets one answer reads: a key's and its namespace's.
pub const MAX_BUDGETS_PER_LOOKUP: usize = 2 * waycast_crds::spend::MAX_BUDGETS;
/// Budgets remembered; past this the old ones are forgotten.
const MAX_CACHED: usize = 4096;

/// A spend: tokens, nano-units.
pub type Spend = (u64, u64);

/// Where an answer's spend of a budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read from Redis for this answer.
    Redis,
    /// Read under [`FRESH`] ago.
    Cache,
    /// Not read (past the bounds, or Redis did not answer): the last spend
    /// read, under [`STALE_LIMIT`] old.
    Stale,
    /// Not known: answered `null`.
    Unknown,
}

impl Source {
    /// The metric's `source` label.
    pub fn label(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Cache => "cache",
            Source::Stale => "stale",
            Source::Unknown => "unknown",
        }
    }
}

/// The cache and the bounds of `/v1/usage`'s reads.
pub struct SpendReads {
    slots: Semaphore,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    budgets: HashMap<String, Entry>,
    /// The second lookups are counted in, and how many began in it.
    second: Option<Instant>,
    begun: u32,
}

/// What is remembered of one budget.
#[derive(Default)]
struct Entry {
    /// When it was last read, and what it held.
    read: Option<(Instant, Spend)>,
    /// When an answer set out to read it.
    claimed: Option<Instant>,
}

/// What an answer has of its budgets, and what it is to read.
pub struct Plan<'a> {
    /// Per budget asked for, its spend (`None`: to read, or unknown).
    pub spends: Vec<Option<Spend>>,
    /// Per budget asked for, where its spend comes from (`Stale` or
    /// `Unknown` for one to read, until it is read).
    pub sources: Vec<Source>,
    /// The budgets to read (their places in `spends`), when this answer
    /// holds a lookup slot for them.
    pub to_read: Vec<usize>,
    /// Held while the reads are awaited.
    pub slot: Option<SemaphorePermit<'a>>,
}

impl Default for SpendReads {
    fn default() -> Self {
        Self { slots: Semaphore::new(MAX_LOOKUPS_IN_FLIGHT), state: Mutex::new(State::default()) }
    }
}

impl SpendReads {
    /// What is known of `hashes` as of `now`, and which of them this answer
    /// reads (claimed, so no other answer reads them meanwhile); the ones
    /// it may not read stand in with their last spend, if recent.
    pub async fn plan(&self, hashes: &[String], now: Instant) -> Plan<'_> {
        let mut state = self.state.lock().await;
        let age = |at: Instant| now.saturating_duration_since(at);
        let mut plan = Plan {
            spends: vec![None; hashes.len()],
            sources: vec![Source::Unknown; hashes.len()],
            to_read: Vec::new(),
            slot: None,
        };
        let mut wanted = Vec::new();
        for (place, hash) in hashes.iter().enumerate() {
            let entry = state.budgets.get(hash);
            let read = entry.and_then(|entry| entry.read);
            match read {
                Some((at, spend)) if age(at) < FRESH => {
                    (plan.spends[place], plan.sources[place]) = (Some(spend), Source::Cache)
                }
                _ => {
                    plan.spends[place] = read.filter(|(at, _)| age(*at) < STALE_LIMIT).map(|(_, spend)| spend);
                    if plan.spends[place].is_some() {
                        plan.sources[place] = Source::Stale;
                    }
                    let claimed = entry.and_then(|entry| entry.claimed).is_some_and(|at| age(at) < FRESH);
                    if !claimed {
                        wanted.push(place);
                    }
                }
            }
        }
        if wanted.is_empty() || wanted.len() > MAX_BUDGETS_PER_LOOKUP {
            return plan;
        }
        let Ok(slot) = self.slots.try_acquire() else { return plan };
        if state.second.is_none_or(|start| age(start) >= Duration::from_secs(1)) {
            (state.second, state.begun) = (Some(now), 0);
        }
        if state.begun >= MAX_LOOKUPS_PER_SECOND {
            return plan;
        }
        state.begun += 1;
        forget_old(&mut state, now, wanted.len());
        for place in &wanted {
            state.budgets.entry(hashes[*place].clone()).or_default().claimed = Some(now);
        }
        (plan.to_read, plan.slot) = (wanted, Some(slot));
        plan
    }

    /// Keeps what was read at `now`.
    pub async fn keep(&self, read: Vec<(String, Spend)>, now: Instant) {
        let mut state = self.state.lock().await;
        for (hash, spend) in read {
            forget_old(&mut state, now, 1);
            let entry = state.budgets.entry(hash).or_default();
            (entry.read, entry.claimed) = (Some((now, spend)), None);
        }
    }
}

/// Makes room for `more` budgets: forgets those too old to stand in, and
/// everything if that is not enough.
fn forget_old(state: &mut State, now: Instant, more: usize) {
    if state.budgets.len() + more <= MAX_CACHED {
        return;
    }
    let recent = |at: Option<Instant>| at.is_some_and(|at| now.saturating_duration_since(at) < STALE_LIMIT);
    state.budgets.retain(|_, entry| recent(entry.read.map(|(at, _)| at)) || recent(entry.claimed));
    if state.budgets.len() + more > MAX_CACHED {
        state.budgets.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[tokio::test]
    async fn a_spend_is_served_fresh_then_stands_in_while_it_is_read_again_then_is_unknown() {
        let reads = SpendReads::default();
        let start = Instant::now();
        reads.keep(vec![("a".to_owned(), (5, 7))], start).await;
        let asked = hashes(&["a", "b"]);
        let fresh = reads.plan(&asked, start + Duration::from_millis(999)).await;
        assert_eq!((fresh.spends, fresh.to_read), (vec![Some((5, 7)), None], vec![1]));
        drop(fresh.slot);
        let stale = reads.plan(&asked, start + Duration::from_millis(1500)).await;
        assert_eq!(stale.spends, [Some((5, 7)), None], "the old spend stands in");
        assert_eq!(stale.sources, [Source::Stale, Source::Unknown]);
        assert_eq!(stale.to_read, [0], "b is still claimed by the first answer");
        drop(stale.slot);
        let old = reads.plan(&asked, start + STALE_LIMIT + FRESH).await;
        assert_eq!((old.spends, old.to_read), (vec![None, None], vec![0, 1]), "too old to stand in; claims lapsed");
    }

    #[tokio::test]
    async fn a_budget_being_read_is_not_read_twice() {
        let reads = SpendReads::default();
        let start = Instant::now();
        let asked = hashes(&["a"]);
        let first = reads.plan(&asked, start).await;
        assert_eq!(first.to_read, [0]);
        let second = reads.plan(&asked, start).await;
        assert!(second.to_read.is_empty() && second.slot.is_none(), "claimed by the first");
        reads.keep(vec![("a".to_owned(), (1, 2))], start).await;
        assert_eq!(reads.plan(&asked, start).await.spends, [Some((1, 2))]);
    }

    #[tokio::test]
    async fn lookups_are_bounded_at_once_and_per_second() {
        let reads = SpendReads::default();
        let start = Instant::now();
        let names: Vec<String> = (0..200).map(|n| n.to_string()).collect();
        let held: Vec<_> = (0..MAX_LOOKUPS_IN_FLIGHT).map(|n| reads.plan(&names[n..=n], start)).collect();
        let held = futures_util::future::join_all(held).await;
        assert!(held.iter().all(|plan| plan.slot.is_some()));
        assert!(reads.plan(&names[10..=10], start).await.slot.is_none(), "every slot is taken");
        drop(held);
        for n in MAX_LOOKUPS_IN_FLIGHT..MAX_LOOKUPS_PER_SECOND as usize {
            assert!(reads.plan(&names[n..=n], start).await.slot.is_some(), "lookup {n}");
        }
        let late = start + Duration::from_millis(999);
        assert!(reads.plan(&names[100..=100], late).await.slot.is_none(), "the second's lookups are spent");
        assert!(reads.plan(&names[100..=100], start + Duration::from_secs(1)).await.slot.is_some(), "a new second");
    }

    #[tokio::test]
    async fn the_cache_forgets_rather_than_grows() {
        let reads = SpendReads::default();
        let start = Instant::now();
        reads.keep((0..MAX_CACHED + 10).map(|n| (n.to_string(), (1, 1))).collect(), start).await;
        assert!(reads.state.lock().await.budgets.len() <= MAX_CACHED);
    }
}
