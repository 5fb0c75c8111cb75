//! The refresher's state (which slots are held, which fetches start when,
//! what a late answer does) and its loop, run against a fetcher of the
//! test's own on tokio's paused clock: an issuer that hangs holds back only
//! its own slot, no more than `AT_ONCE` fetches are ever in flight, a pod's
//! nudge brings a fetch forward, and no stream of nudges gets a slot
//! fetched more than once per 10 s.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use tokio::sync::Mutex;
use waycast_crds::identity::ConfigMapKeyRef;

use super::*;
use crate::compile::ObjectKey;
use crate::compile::key_source::KeySource;
use crate::key_sets::fetch::FETCH_TIMEOUT;

const ISSUER: &str = "https://sso.example.com";
const SET: &str = r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#;

fn key(provider: &str) -> SlotKey {
    (ObjectKey { namespace: "platform".into(), name: "gw".into() }, provider.to_owned())
}

fn discovery(issuer: &str) -> Want {
    Want { source: KeySource::Discovery { issuer: issuer.into() }, ca: None }
}

fn held(source: KeySource) -> HeldKeySet {
    HeldKeySet { source, document: Some(SET.into()), keys: 1, fetched_at: None, error: None, seeded_issuer: None }
}

fn wanted(entries: &[(&str, Want)]) -> BTreeMap<SlotKey, Want> {
    entries.iter().map(|(name, want)| (key(name), want.clone())).collect()
}

/// A starting operator holds the sets its pods serve, for the sources
/// the providers still name; later a provider keeps its set while its
/// source is the same, starts afresh when it changes, and goes when it is
/// gone.
#[test]
fn slots_follow_the_providers_wanted_and_seeds_serve_the_first_only() {
    let start = Instant::now();
    let seeds = [
        (key("corp"), held(KeySource::Discovery { issuer: ISSUER.into() })),
        // Its issuer was edited while the operator was down.
        (key("edited"), held(KeySource::Discovery { issuer: "https://old.example.com".into() })),
        (key("unwanted"), held(KeySource::Cluster)),
    ];
    let mut refresher = Refresher::new(seeds.into_iter().collect(), start);
    refresher.sync(wanted(&[("corp", discovery(ISSUER)), ("edited", discovery("https://new.example.com"))]), start);
    assert_eq!(refresher.slots[&key("corp")].held.document.as_deref(), Some(SET), "seeded");
    assert_eq!(refresher.slots[&key("edited")].held.document, None, "a seed of another source is not used");
    assert!(!refresher.slots.contains_key(&key("unwanted")) && refresher.seeds.is_empty());
    assert!(refresher.slots.values().all(|slot| slot.due == start), "every new slot is fetched at once");
    assert_eq!(refresher.published().index.len(), 2);

    // A CA bundle named later keeps the set; another issuer starts afresh.
    let mut with_ca = discovery(ISSUER);
    with_ca.ca = Some(("platform".into(), ConfigMapKeyRef { name: "ca".into(), key: "ca.crt".into() }));
    refresher.slots.get_mut(&key("corp")).unwrap().due = start + Duration::from_secs(30);
    refresher.sync(wanted(&[("corp", with_ca.clone()), ("edited", discovery("https://newer.example.com"))]), start);
    let corp = &refresher.slots[&key("corp")];
    assert_eq!((corp.held.document.as_deref(), &corp.want), (Some(SET), &with_ca));
    assert_eq!(corp.due, start + Duration::from_secs(30), "not fetched again for it");
    assert_eq!(
        refresher.slots[&key("edited")].want.source,
        KeySource::Discovery { issuer: "https://newer.example.com".into() }
    );
    assert_eq!(refresher.next_due(false), Some(start), "the new slot is due");

    assert!(refresher.sync(BTreeMap::new(), start));
    assert!(refresher.slots.is_empty() && refresher.published().index.is_empty());
    assert_eq!(refresher.next_due(false), None, "nothing wanted");
}

fn document() -> Result<Answer, FetchError> {
    Ok(Answer::Document { from: "x".into(), body: Bytes::from_static(SET.as_bytes()), etag: None, cache_control: None })
}

/// Due slots start earliest first within the room given; one in flight
/// is not started again; an answer for a slot replaced meanwhile (its
/// source edited) is ignored; a fetch lost is tried again in 10 s.
#[test]
fn fetches_start_earliest_first_within_the_room_and_a_late_answer_finds_no_slot() {
    let start = Instant::now();
    let mut refresher = Refresher::new(BTreeMap::new(), start);
    refresher.sync(wanted(&[("a", discovery("https://a")), ("b", discovery("https://b"))]), start);
    refresher.slots.get_mut(&key("b")).unwrap().due = start - Duration::from_secs(5);
    let jobs = refresher.start(start, false, 1);
    assert!(matches!(&jobs[..], [(Job::KeySet(k, _), Some(_))] if *k == key("b")), "{jobs:?}");
    let jobs = refresher.start(start, true, 8);
    assert!(matches!(&jobs[..], [(Job::Issuer, None), (Job::KeySet(k, _), Some(_))] if *k == key("a")), "{jobs:?}");
    assert!(refresher.start(start, true, 8).is_empty(), "all in flight");
    assert_eq!(refresher.next_due(true), None, "nothing due but what is in flight");
    let Job::KeySet(_, a_fetch) = jobs[1].0.clone() else { unreachable!() };

    // `a`'s issuer is edited while its fetch is out.
    refresher.sync(wanted(&[("a", discovery("https://a2")), ("b", discovery("https://b"))]), start);
    let late = refresher.take(Done::KeySet(key("a"), a_fetch, document()), start, jiff::Timestamp::UNIX_EPOCH);
    assert_eq!(late, Outcome::default(), "for the slot it was started for only");
    assert_eq!(refresher.slots[&key("a")].held.document, None);

    let lost = refresher.take(Done::Lost(Job::KeySet(key("b"), 1)), start, jiff::Timestamp::UNIX_EPOCH);
    assert_eq!(lost.result, Some("failed"));
    assert_eq!(refresher.slots[&key("b")].due, start + Duration::from_secs(10));
}

/// What the fake issuers did, on the paused clock.
#[derive(Default)]
struct Log {
    /// Each fetch started: the issuer and when.
    started: Mutex<Vec<(String, Instant)>>,
    /// Fetches in flight now, and the most ever.
    in_flight: AtomicUsize,
    most: AtomicUsize,
    /// Each publish: when, and which providers held a document.
    published: Mutex<Vec<(Instant, Vec<String>)>>,
}

/// Issuers whose name starts `slow` answer nothing until the fetch times
/// out; the others answer a key set at once.
#[derive(Clone)]
struct Issuers(Arc<Log>);

impl Fetch for Issuers {
    fn key_set(&self, want: Want, _: Option<Etag>) -> impl Future<Output = Result<Answer, FetchError>> + Send {
        let log = self.0.clone();
        async move {
            let KeySource::Discovery { issuer } = want.source else { unreachable!() };
            log.started.lock().await.push((issuer.clone(), Instant::now()));
            let now = log.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            log.most.fetch_max(now, Ordering::SeqCst);
            let answer = if issuer.starts_with("slow") {
                tokio::time::sleep(FETCH_TIMEOUT).await;
                Err(FetchError::Timeout(issuer))
            } else {
                document()
            };
            log.in_flight.fetch_sub(1, Ordering::SeqCst);
            answer
        }
    }

    fn cluster_issuer(&self) -> impl Future<Output = Result<String, FetchError>> + Send {
        std::future::ready(Ok("https://kubernetes.default.svc".to_owned()))
    }
}

struct Recorder {
    log: Arc<Log>,
    wanted: BTreeMap<SlotKey, Want>,
    /// Pods ask for every slot at each nudge wake.
    nudging: bool,
}

impl Shell for Recorder {
    fn wanted(&self) -> (BTreeMap<SlotKey, Want>, bool) {
        (self.wanted.clone(), false)
    }

    async fn settled(&self, _: Outcome, published: Option<Published>) {
        if let Some(published) = published {
            let holding = published.index.iter().filter(|(_, held)| held.document.is_some());
            let names = holding.map(|((_, provider), _)| provider.clone()).collect();
            self.log.published.lock().await.push((Instant::now(), names));
        }
    }

    fn nudges(&mut self) -> Vec<SlotKey> {
        if self.nudging { self.wanted.keys().cloned().collect() } else { Vec::new() }
    }
}

/// Runs the refresher over `providers` (each fetched from the issuer of
/// its name) for `seconds` of the paused clock, pods nudging every slot
/// at each of `nudges`.
async fn run_for(providers: &[&str], seconds: u64) -> Arc<Log> {
    run_nudged(providers, seconds, futures_util::stream::pending().boxed()).await
}

async fn run_nudged(providers: &[&str], seconds: u64, nudges: BoxStream<'static, Wake>) -> Arc<Log> {
    let log = Arc::new(Log::default());
    let wanted = providers.iter().map(|name| (key(name), discovery(name))).collect();
    let shell = Recorder { log: log.clone(), wanted, nudging: true };
    let refresher = Refresher::new(BTreeMap::new(), Instant::now());
    let running = tokio::spawn(run(refresher, Issuers(log.clone()), shell, nudges));
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    running.abort();
    log
}

async fn starts(log: &Log, issuer: &str, origin: Instant) -> Vec<u64> {
    let started = log.started.lock().await;
    started.iter().filter(|(of, _)| of == issuer).map(|(_, at)| (*at - origin).as_secs()).collect()
}

/// One issuer hangs until each of its fetches times out (10 s): the
/// other's key set is published at once and fetched again every 30 s, as
/// if the hanging one were not there.
#[tokio::test(start_paused = true)]
async fn a_hanging_issuer_holds_back_only_its_own_slot() {
    let origin = Instant::now();
    let log = run_for(&["slow", "fast"], 65).await;
    let published = log.published.lock().await;
    let first = published.iter().find(|(_, holding)| holding.contains(&"fast".to_owned())).unwrap();
    assert!(first.0 - origin < Duration::from_secs(1), "fast published after {:?}", first.0 - origin);
    assert_eq!(starts(&log, "fast", origin).await, [0, 30, 60], "fast keeps its own pace");
    // Each of slow's fetches times out after 10 s, and is tried 10 s later.
    assert_eq!(starts(&log, "slow", origin).await, [0, 20, 40, 60]);
}

/// Thirty issuers that all hang: never more than `AT_ONCE` fetches out.
#[tokio::test(start_paused = true)]
async fn no_more_than_at_once_fetches_are_in_flight() {
    let names: Vec<String> = (0..30).map(|i| format!("slow-{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let log = run_for(&names, 25).await;
    assert_eq!(log.most.load(Ordering::SeqCst), AT_ONCE);
    let started = log.started.lock().await;
    assert!(started.len() >= 30, "every slot had its turn: {}", started.len());
}

/// A nudge brings the next fetch forward to 10 s after the last one
/// started at the soonest; one during a fetch, to after its answer; no
/// number of them sooner.
#[test]
fn a_nudge_is_granted_at_most_once_per_ten_seconds_a_slot() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut refresher = Refresher::new(BTreeMap::new(), t0);
    refresher.sync(wanted(&[("a", discovery("https://a"))]), t0);
    let fetch = |refresher: &mut Refresher, at: Instant| {
        let jobs = refresher.start(at, false, 8);
        let [(Job::KeySet(_, number), _)] = &jobs[..] else { panic!("{jobs:?}") };
        *number
    };
    let answer = |refresher: &mut Refresher, number, at| {
        refresher.take(Done::KeySet(key("a"), number, document()), at, jiff::Timestamp::UNIX_EPOCH);
    };
    let first = fetch(&mut refresher, t0);
    answer(&mut refresher, first, t0);
    assert_eq!(refresher.slots[&key("a")].due, t0 + s(30));
    assert!(refresher.nudge(&key("a"), t0 + s(3)));
    assert_eq!(refresher.slots[&key("a")].due, t0 + s(10), "10 s after the last start, not at once");
    assert!(!refresher.nudge(&key("a"), t0 + s(4)), "no sooner for asking again");
    assert!(refresher.start(t0 + s(9), false, 8).is_empty());
    let second = fetch(&mut refresher, t0 + s(10));
    answer(&mut refresher, second, t0 + s(10));
    assert!(refresher.nudge(&key("a"), t0 + s(25)));
    assert_eq!(refresher.slots[&key("a")].due, t0 + s(25), "10 s since the last: at once");

    // Asked while a fetch is out: the next comes 10 s after it started.
    let third = fetch(&mut refresher, t0 + s(25));
    assert!(!refresher.nudge(&key("a"), t0 + s(26)));
    answer(&mut refresher, third, t0 + s(26));
    assert_eq!(refresher.slots[&key("a")].due, t0 + s(35));
    assert!(!refresher.nudge(&key("z"), t0 + s(26)), "no such slot");
}

fn nudges_every(period: Duration) -> BoxStream<'static, Wake> {
    futures_util::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some((Wake::Nudges, ()))
    })
    .boxed()
}

/// Pods name a provider without end (a flood of tokens naming made-up
/// keys, or a hostile pod): its issuer is asked once per 10 s, no more.
#[tokio::test(start_paused = true)]
async fn nudges_without_end_fetch_a_slot_once_per_ten_seconds() {
    let origin = Instant::now();
    let log = run_nudged(&["fast"], 65, nudges_every(Duration::from_millis(100))).await;
    assert_eq!(starts(&log, "fast", origin).await, [0, 10, 20, 30, 40, 50, 60]);
}

/// One nudge, 15 s after a fetch (a key rotated in at the issuer and a
/// token of it refused): fetched then, not at the 30 s round.
#[tokio::test(start_paused = true)]
async fn a_nudge_fetches_a_rotated_set_sooner_than_the_round() {
    let origin = Instant::now();
    let once = futures_util::stream::once(async {
        tokio::time::sleep(Duration::from_secs(15)).await;
        Wake::Nudges
    });
    let log = run_nudged(&["fast"], 50, once.chain(futures_util::stream::pending()).boxed()).await;
    assert_eq!(starts(&log, "fast", origin).await, [0, 15, 45]);
}
