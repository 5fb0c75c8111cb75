//! Picking the endpoint (an inference pod) a request goes to, in the hop
//! that already checks the key — no extra endpoint-picker service.
//!
//! ```text
//! LeastRequest    the endpoint with the fewest requests in flight (streams count until they end):
//!                 all of them compared up to FULL_SCAN_UP_TO, else two at random (O(1), no herding)
//! RoundRobin      each in turn
//! PrefixAffinity  a hash of the prompt's first bytes (or a session header) on a ring of virtual
//!                 nodes: the same prefix goes to the same pod — its KV cache hits — unless that
//!                 pod carries more than `load_factor` × the mean load (consistent hashing with
//!                 bounded loads), then the next on the ring
//! ```
//!
//! Passive outlier ejection: `CONSECUTIVE_FAILURES` failures in a row take
//! an endpoint out for a backoff that doubles with each ejection (capped);
//! a success brings its count back to zero. Ejection never empties a set:
//! when every endpoint is out, all are eligible again (a fleet that is all
//! failing is better tried than refused).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::per_worker::PerWorker;

/// Failures in a row that eject an endpoint.
pub const CONSECUTIVE_FAILURES: u32 = 5;
/// The first ejection's length; each further one doubles it.
pub const BASE_EJECTION: Duration = Duration::from_secs(5);
/// The longest ejection.
pub const MAX_EJECTION: Duration = Duration::from_secs(300);
/// Up to this many endpoints, least-request looks at every one (cheap,
/// and measurably better balanced than two random choices: on the e2e
/// node's routing benchmark the busiest pod carried 1.37 × the mean with two
/// choices); beyond, two random choices.
pub const FULL_SCAN_UP_TO: usize = 8;
/// Spaces the workers' turns: worker `i`'s turn starts `i` × this along,
/// which, modulo a set's size, is `i` for sizes that are powers of two
/// and some other offset for most others (no prime below 641 divides it,
/// where a golden-ratio constant can be a multiple of 3); its high half
/// keeps the workers' random choices apart.
const WORKER_STRIDE: u64 = (1 << 32) + 1;
/// Virtual nodes per endpoint on the prefix-affinity ring.
const RING_POINTS_PER_ENDPOINT: usize = 64;

/// How a backend's endpoints share its requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// Power of two choices over requests in flight.
    LeastRequest,
    /// Each endpoint in turn.
    RoundRobin,
    /// Same prefix, same endpoint, while its load stays within
    /// `load_factor` × the mean.
    PrefixAffinity {
        /// At least 1.0; 1.25 leaves a pod 25 % above the mean before its
        /// prefixes spill to the next one.
        load_factor: f64,
    },
}

/// One endpoint and what the gateway knows of it.
#[derive(Debug)]
pub struct Endpoint {
    /// `ip:port`.
    pub address: std::net::SocketAddr,
    /// The same, as a URI authority (formatted once, not per request).
    pub authority: Option<http::uri::Authority>,
    traffic: Traffic,
    consecutive_failures: AtomicU32,
    ejections: AtomicU32,
    /// Nanoseconds on [`crate::limit::now_nanos`]'s clock; 0: not ejected.
    ejected_until: AtomicU64,
}

/// What every request to an endpoint writes, kept together: its in-flight
/// count must be global (every worker's pick reads it), so the lines it is
/// on move between cores anyway; the request count and the answer times
/// ride on them rather than on shared metric series of their own.
/// `/metrics` reads them ([`super::endpoints::EndpointSeries`]).
#[derive(Debug, Default)]
#[repr(align(64))]
struct Traffic {
    inflight: AtomicU32,
    sent: AtomicU64,
    /// Answers within each of [`ANSWER_BUCKETS`] and no lower one (not
    /// cumulative: one write per answer).
    answered_within: [AtomicU64; ANSWER_BUCKETS.len()],
    answered: AtomicU64,
    answer_nanos: AtomicU64,
}

/// Upper bounds, in seconds, of the answer-time histogram: fewer buckets
/// than the per-model ones, as there is a series set per pod.
pub const ANSWER_BUCKETS: [f64; 10] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 120.0];

/// An endpoint's traffic as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficReading {
    /// Requests in flight.
    pub inflight: u32,
    /// Requests sent.
    pub sent: u64,
    /// Cumulative answers within each of [`ANSWER_BUCKETS`].
    pub answered_within: [u64; ANSWER_BUCKETS.len()],
    /// Answers (response headers) in all.
    pub answered: u64,
    /// Their sum, in seconds.
    pub answer_seconds: f64,
}

impl Endpoint {
    /// A fresh endpoint: nothing in flight, never failed.
    pub fn new(address: std::net::SocketAddr) -> Self {
        Self {
            address,
            authority: http::uri::Authority::try_from(address.to_string()).ok(),
            traffic: Traffic::default(),
            consecutive_failures: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
        }
    }

    /// Notes how long it took to answer with headers.
    pub fn observe_response(&self, took: std::time::Duration) {
        let traffic = &self.traffic;
        let seconds = took.as_secs_f64();
        if let Some(bucket) = ANSWER_BUCKETS.iter().position(|bound| seconds <= *bound) {
            traffic.answered_within[bucket].fetch_add(1, Ordering::Relaxed);
        }
        traffic.answered.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        traffic.answer_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Its traffic so far, for `/metrics`.
    pub fn traffic(&self) -> TrafficReading {
        let traffic = &self.traffic;
        let mut answered_within = [0; ANSWER_BUCKETS.len()];
        let mut below = 0;
        for (cumulative, within) in answered_within.iter_mut().zip(&traffic.answered_within) {
            below += within.load(Ordering::Relaxed);
            *cumulative = below;
        }
        // Read last, so the total is never below a bucket read before it.
        let answered = traffic.answered.load(Ordering::Relaxed).max(below);
        #[allow(clippy::cast_precision_loss, reason = "a sum in seconds; f64 is what the exposition carries")]
        let answer_seconds = traffic.answer_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        TrafficReading {
            inflight: self.inflight(),
            sent: traffic.sent.load(Ordering::Relaxed),
            answered_within,
            answered,
            answer_seconds,
        }
    }

    /// Requests in flight to it now.
    pub fn inflight(&self) -> u32 {
        self.traffic.inflight.load(Ordering::Relaxed)
    }

    /// Whether it is ejected at `now`.
    pub fn is_ejected(&self, now: u64) -> bool {
        self.ejected_until.load(Ordering::Relaxed) > now
    }

    /// A request to it went well: its failure count starts over.
    pub fn record_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// A request to it failed (connect error, reset or 5xx before the first
    /// byte). Returns true when this failure ejected it.
    pub fn record_failure(&self, now: u64) -> bool {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < CONSECUTIVE_FAILURES || self.is_ejected(now) {
            return false;
        }
        let ejections = self.ejections.fetch_add(1, Ordering::Relaxed);
        let length = BASE_EJECTION.saturating_mul(1 << ejections.min(16)).min(MAX_EJECTION);
        let length = u64::try_from(length.as_nanos()).unwrap_or(u64::MAX);
        self.ejected_until.store(now.saturating_add(length), Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        true
    }

    /// Counts a request sent and in flight.
    fn begin(&self) {
        self.traffic.inflight.fetch_add(1, Ordering::Relaxed);
        self.traffic.sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// A worker's own handle on an endpoint set
/// (`endpoints::EndpointTable::get_here`, `per_worker::Handle`): each request
/// to an endpoint holds the set until it ends.
pub type SetHandle = crate::per_worker::Handle<EndpointSet>;

impl SetHandle {
    /// Counts a request to endpoint `index` in flight until the guard drops.
    pub fn start(self: &Arc<Self>, index: usize) -> InFlight {
        self.endpoints[index].begin();
        InFlight { set: self.clone(), index }
    }
}

/// One request in flight to an endpoint; dropping it (when the response,
/// stream included, has ended however it ended) ends the count.
#[derive(Debug)]
pub struct InFlight {
    set: Arc<SetHandle>,
    index: usize,
}

impl InFlight {
    /// The endpoint.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.set.endpoints[self.index]
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.endpoint().traffic.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The endpoints of one backend, as last resolved.
#[derive(Debug, Default)]
pub struct EndpointSet {
    endpoints: Vec<Arc<Endpoint>>,
    /// (hash, endpoint index), sorted by hash.
    ring: Vec<(u64, usize)>,
    /// Each worker's own turn (round-robin, ties, the two random choices):
    /// one counter for all would be a line every core writes per request.
    /// Each worker still takes the endpoints in turn, so the sum does too.
    turns: PerWorker<AtomicU64>,
}

impl EndpointSet {
    /// A set of `endpoints`; an endpoint of `previous` at the same address
    /// is kept as it is (its requests in flight, failures and ejection).
    pub fn new(addresses: &[std::net::SocketAddr], previous: Option<&EndpointSet>) -> Self {
        let mut endpoints: Vec<Arc<Endpoint>> = addresses
            .iter()
            .map(|address| {
                // `previous` is sorted by address: a lookup, not a scan.
                previous
                    .and_then(|p| p.endpoint_at(*address))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Endpoint::new(*address)))
            })
            .collect();
        endpoints.sort_by_key(|e| e.address);
        endpoints.dedup_by_key(|e| e.address);
        let mut ring = Vec::with_capacity(endpoints.len() * RING_POINTS_PER_ENDPOINT);
        for (index, endpoint) in endpoints.iter().enumerate() {
            let seed = address_hash(&endpoint.address);
            for point in 0..RING_POINTS_PER_ENDPOINT as u64 {
                ring.push((mix(seed ^ mix(point)), index));
            }
        }
        ring.sort_unstable();
        Self { endpoints, ring, turns: PerWorker::default() }
    }

    /// The endpoints, sorted by address.
    pub fn endpoints(&self) -> &[Arc<Endpoint>] {
        &self.endpoints
    }

    /// The endpoint at `address`, if the set has it.
    pub fn endpoint_at(&self, address: std::net::SocketAddr) -> Option<&Arc<Endpoint>> {
        self.endpoints.binary_search_by_key(&address, |e| e.address).ok().map(|index| &self.endpoints[index])
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint for the next request under `policy`, skipping those in
    /// `tried` (a retry goes elsewhere) and ejected ones (unless every
    /// untried one is ejected). `affinity` is the request's prefix hash.
    pub fn pick(&self, policy: Policy, affinity: Option<u64>, tried: &[usize], now: u64) -> Option<usize> {
        let untried = |index: &usize| !tried.contains(index);
        let healthy = |index: &usize| untried(index) && !self.endpoints[*index].is_ejected(now);
        let any_healthy = (0..self.endpoints.len()).any(|i| healthy(&i));
        let eligible = |index: usize| if any_healthy { healthy(&index) } else { untried(&index) };
        let count = (0..self.endpoints.len()).filter(|i| eligible(*i)).count();
        if count == 0 {
            return None;
        }
        // A retry does not take a turn: under round-robin it goes to the
        // next endpoint, and the next request still gets its own turn (else
        // with two endpoints every request would meet a failing one first).
        let turn = self.turns.mine();
        let turn = if tried.is_empty() { turn.fetch_add(1, Ordering::Relaxed) } else { turn.load(Ordering::Relaxed) };
        // Workers start apart: in step, they would pick alike.
        let ticket = turn.wrapping_add(crate::per_worker::index() as u64 * WORKER_STRIDE);
        let chosen = match policy {
            Policy::RoundRobin => nth_eligible(self.endpoints.len(), ticket, &eligible),
            Policy::LeastRequest if self.endpoints.len() <= FULL_SCAN_UP_TO => {
                // Few endpoints: the least loaded of all, ties taken in turn.
                // Each load is read once: other workers move them meanwhile,
                // and a second reading may find none at the least any more.
                let mut loads = [u32::MAX; FULL_SCAN_UP_TO];
                for (index, load) in loads.iter_mut().enumerate().take(self.endpoints.len()) {
                    if eligible(index) {
                        *load = self.endpoints[index].inflight();
                    }
                }
                let least = loads.iter().copied().min()?;
                nth_eligible(self.endpoints.len(), ticket, &|index| loads[index] == least && eligible(index))
            }
            Policy::LeastRequest => {
                let random = mix(ticket ^ 0x9e37_79b9_7f4a_7c15);
                let first = nth_eligible(self.endpoints.len(), random, &eligible)?;
                if count == 1 {
                    return Some(first);
                }
                // A second, distinct, eligible endpoint.
                let offset = 1 + (random >> 32) % (count as u64 - 1);
                let second = nth_eligible(self.endpoints.len(), position(first, &eligible) + offset, &eligible)?;
                let load = |index: usize| self.endpoints[index].inflight();
                Some(if load(second) < load(first) { second } else { first })
            }
            Policy::PrefixAffinity { load_factor } => match affinity {
                None => self.pick(Policy::LeastRequest, None, tried, now),
                Some(hash) => self.bounded_ring_pick(hash, load_factor, count, &eligible),
            },
        };
        // An ejection that began or ended while choosing can leave the
        // choice empty: any untried endpoint beats failing the request.
        chosen.or_else(|| (0..self.endpoints.len()).find(untried))
    }

    /// The first eligible endpoint clockwise from `hash` whose load stays
    /// within `load_factor` × the mean after this request; if none does,
    /// the least loaded eligible one.
    fn bounded_ring_pick(
        &self,
        hash: u64,
        load_factor: f64,
        count: usize,
        eligible: &impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let total: u64 = self.endpoints.iter().map(|e| u64::from(e.inflight())).sum();
        #[allow(clippy::cast_precision_loss, reason = "in-flight counts are far below 2^52")]
        let bound = (load_factor.max(1.0) * (total + 1) as f64 / count as f64).ceil();
        let start = self.ring.partition_point(|(point, _)| *point < hash);
        let walk = self.ring[start..].iter().chain(&self.ring[..start]);
        for &(_, index) in walk {
            if eligible(index) && f64::from(self.endpoints[index].inflight() + 1) <= bound {
                return Some(index);
            }
        }
        (0..self.endpoints.len()).filter(|i| eligible(*i)).min_by_key(|i| self.endpoints[*i].inflight())
    }
}

/// The index of the `n`-th (mod their count) endpoint that is eligible.
fn nth_eligible(len: usize, n: u64, eligible: &impl Fn(usize) -> bool) -> Option<usize> {
    let count = (0..len).filter(|i| eligible(*i)).count() as u64;
    if count == 0 {
        return None;
    }
    let wanted = usize::try_from(n % count).ok()?;
    (0..len).filter(|i| eligible(*i)).nth(wanted)
}

/// How many eligible endpoints come before `index`.
fn position(index: usize, eligible: &impl Fn(usize) -> bool) -> u64 {
    (0..index).filter(|i| eligible(*i)).count() as u64
}

/// SplitMix64's finalizer: a cheap, well-spread 64-bit mix.
pub fn mix(mut value: u64) -> u64 {
    value = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

/// FNV-1a over `bytes`, then mixed: the affinity hash of a prompt prefix.
pub fn affinity_hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(hash)
}

fn address_hash(address: &std::net::SocketAddr) -> u64 {
    affinity_hash(address.to_string().as_bytes())
}

#[cfg(test)]
#[path = "pick_tests.rs"]
mod tests;
