//! Rate limits: requests and tokens per minute, per key and per model.
//!
//! ```text
//! request ─► admit(key limits, model limits, shares, reservation) ──refused──► 429 + Retry-After + x-ratelimit-*
//!                │ admitted: the request counted, its tokens reserved; x-ratelimit-* on the response
//!                ▼
//! response ends ─► Charge::settle(usage, capped | estimate) ─► the token limiters: + more used, − reserved back
//! ```
//!
//! Tokens are reserved at admission — a prompt estimate (body bytes / 4)
//! plus the output bound (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`, else the model's `outputTokenReservation`, else
//! [`DEFAULT_OUTPUT_RESERVATION`]) — so parallel requests cannot all pass
//! one remaining budget; at the end the reservation is settled against what
//! was used: the reported usage, capped at what is plausible for the bytes
//! that went each way, or, when none was reported (a client that left, a
//! stream without usage), an estimate from the bytes relayed.
//!
//! Each pod enforces `1 / shares` of every limit, `shares` being the number
//! of live pods of its Gateway (their heartbeat Leases, see [`fleet`]), so
//! the fleet together admits the configured rate. Limiter state lives in the
//! config snapshot and is carried from one snapshot to the next by key and
//! model id, so a config change does not reset a limit.

pub mod fleet;
pub mod gcra;
pub mod redis;
pub mod resp;

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use waycast_crds::config::LimitsConfig;

pub use gcra::Verdict;
use redis::{RedisCounter, ScriptLimiter, StoreError};

/// Nanoseconds on the limiters' clock (monotonic, from the first call).
pub fn now_nanos() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// One limit and its state.
#[derive(Debug)]
pub struct Limiter {
    /// The limit, for the whole fleet.
    pub per_minute: u64,
    tat: AtomicU64,
}

impl Limiter {
    fn new(per_minute: u64, previous: Option<&Limiter>) -> Self {
        let tat = previous.map_or(0, |p| p.tat.load(Ordering::Relaxed));
        Self { per_minute, tat: AtomicU64::new(tat) }
    }

    /// Admits one request if its cost fits (charging it), else refuses.
    fn admit(&self, now: u64, shares: u32) -> (Verdict, u64) {
        self.take(now, gcra::unit_cost(self.per_minute, shares))
    }

    /// Reserves `units` (tokens) if they fit, else refuses. A reservation
    /// larger than the whole window is cut to it (it would never fit).
    fn reserve(&self, now: u64, units: u64, shares: u32) -> (Verdict, u64) {
        self.take(now, gcra::unit_cost(self.per_minute, shares).saturating_mul(units).min(gcra::WINDOW_NANOS))
    }

    /// Charges `cost` (ns of window) if it fits: one compare-and-swap loop.
    fn take(&self, now: u64, cost: u64) -> (Verdict, u64) {
        let mut current = self.tat.load(Ordering::Relaxed);
        loop {
            let (next, verdict) = gcra::admit(current, now, cost, self.per_minute);
            let Some(next) = next else { return (verdict, 0) };
            match self.tat.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return (verdict, cost),
                Err(actual) => current = actual,
            }
        }
    }

    fn refund(&self, cost: u64) {
        let _ = self.tat.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| Some(gcra::refund(tat, cost)));
    }

    fn charge(&self, now: u64, units: u64, shares: u32) {
        let unit = gcra::unit_cost(self.per_minute, shares);
        let _ = self
            .tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| Some(gcra::charge(tat, now, units, unit)));
    }
}

/// The limits of one key or one model.
#[derive(Debug)]
pub struct LimitSet {
    /// Requests per minute.
    pub requests: Option<Limiter>,
    /// Tokens per minute.
    pub tokens: Option<Limiter>,
}

impl LimitSet {
    /// The limiters for `config`, continuing the state of `previous` (the
    /// same key or model in the last snapshot).
    pub fn new(config: &LimitsConfig, previous: Option<&LimitSet>) -> Self {
        Self {
            requests: config
                .requests_per_minute
                .map(|limit| Limiter::new(limit, previous.and_then(|p| p.requests.as_ref()))),
            tokens: config.tokens_per_minute.map(|limit| Limiter::new(limit, previous.and_then(|p| p.tokens.as_ref()))),
        }
    }
}

/// Whose limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The API key's.
    Key,
    /// The model's (over all keys).
    Model,
}

/// Which unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Requests.
    Requests,
    /// Tokens.
    Tokens,
}

impl Unit {
    /// `requests` or `tokens` (OpenAI's error type, header suffix).
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
        }
    }
}

/// The state of the tightest limit of each unit, for `x-ratelimit-*`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    /// (limit, verdict) for requests.
    pub requests: Option<(u64, Verdict)>,
    /// (limit, verdict) for tokens.
    pub tokens: Option<(u64, Verdict)>,
}

static LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
static LIMIT_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-limit-tokens");
static REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
static REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");
static RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
static RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");
static RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

impl RateHeaders {
    fn note(&mut self, unit: Unit, limit: u64, verdict: Verdict) {
        let slot = match unit {
            Unit::Requests => &mut self.requests,
            Unit::Tokens => &mut self.tokens,
        };
        // The tightest: fewest left relative to its limit.
        let tighter = slot.is_none_or(|(old_limit, old)| {
            u128::from(verdict.remaining) * u128::from(old_limit) < u128::from(old.remaining) * u128::from(limit)
        });
        if tighter {
            *slot = Some((limit, verdict));
        }
    }

    /// Sets the `x-ratelimit-*` headers OpenAI's SDKs read.
    pub fn apply(&self, headers: &mut HeaderMap) {
        let sets = [
            (self.requests, &LIMIT_REQUESTS, &REMAINING_REQUESTS, &RESET_REQUESTS),
            (self.tokens, &LIMIT_TOKENS, &REMAINING_TOKENS, &RESET_TOKENS),
        ];
        for (state, limit_name, remaining_name, reset_name) in sets {
            if let Some((limit, verdict)) = state {
                headers.insert(limit_name.clone(), HeaderValue::from(limit));
                headers.insert(remaining_name.clone(), HeaderValue::from(verdict.remaining));
                if let Ok(reset) = HeaderValue::try_from(duration_text(verdict.reset_nanos)) {
                    headers.insert(reset_name.clone(), reset);
                }
            }
        }
    }
}

/// A limit that refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Whose limit.
    pub owner: Owner,
    /// Which unit.
    pub unit: Unit,
    /// The limit (for the whole fleet).
    pub limit: u64,
    /// Nanoseconds until the request would be admitted.
    pub retry_after_nanos: u64,
    /// Headers for the refusal.
    pub headers: RateHeaders,
}

impl Refusal {
    /// `Retry-After` (whole seconds, rounded up), `retry-after-ms` and `x-ratelimit-*`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        self.headers.apply(headers);
        let millis = self.retry_after_nanos.div_ceil(1_000_000).max(1);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(millis.div_ceil(1000)));
        headers.insert(RETRY_AFTER_MS.clone(), HeaderValue::from(millis));
    }

    /// The `limit` label of the metric: `key_requests`, `model_tokens`, ...
    pub fn label(&self) -> &'static str {
        match (self.owner, self.unit) {
            (Owner::Key, Unit::Requests) => "key_requests",
            (Owner::Key, Unit::Tokens) => "key_tokens",
            (Owner::Model, Unit::Requests) => "model_requests",
            (Owner::Model, Unit::Tokens) => "model_tokens",
        }
    }
}

/// The output reserved for a request that names no bound and whose model
/// sets no `outputTokenReservation`.
pub const DEFAULT_OUTPUT_RESERVATION: u64 = 1024;

/// Prompt tokens a response may report beyond one per request byte (images
/// and tool definitions count more tokens than their bytes).
pub const PROMPT_ALLOWANCE: u64 = 8192;

/// What a request reserves against token limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation {
    /// Tokens reserved: prompt estimate + output bound.
    pub tokens: u64,
    /// The request body's size.
    pub request_bytes: u64,
    /// The output bound in it.
    pub output: u64,
}

impl Reservation {
    /// For a body of `request_bytes` asking for at most `max_tokens` (or,
    /// without, the model's `default_output`).
    pub fn for_request(request_bytes: usize, max_tokens: Option<u64>, default_output: Option<u64>) -> Self {
        let request_bytes = u64::try_from(request_bytes).unwrap_or(u64::MAX);
        let output = max_tokens.or(default_output).unwrap_or(DEFAULT_OUTPUT_RESERVATION);
        Self { tokens: request_bytes.div_ceil(4).saturating_add(output), request_bytes, output }
    }

    /// The tokens a finished response is charged: its reported `usage`
    /// (prompt, completion) capped at what is plausible — a prompt token per
    /// request byte plus [`PROMPT_ALLOWANCE`], a completion token per byte
    /// relayed — or, without usage, an estimate: the prompt estimate plus a
    /// token per four bytes relayed, at most the output reserved.
    pub fn used(&self, usage: Option<(u64, u64)>, relayed_bytes: u64) -> u64 {
        match usage {
            Some((prompt, completion)) => prompt
                .min(self.request_bytes.saturating_add(PROMPT_ALLOWANCE))
                .saturating_add(completion.min(relayed_bytes)),
            None => self.request_bytes.div_ceil(4).saturating_add(relayed_bytes.div_ceil(4).min(self.output)),
        }
    }
}

/// The token limiters an admitted request reserved its tokens with, to
/// settle once the response has ended.
#[derive(Debug, Clone)]
pub struct Charge {
    /// Each local token limiter and the window (ns) reserved in it.
    reserved: Vec<(Arc<LimitSet>, u64)>,
    shares: u32,
    /// What was reserved, in tokens.
    pub reservation: Reservation,
    /// Counted in Redis: the counter and the token limiters' Redis keys
    /// with their limits (the reservation is the same in each).
    redis: Option<RedisCharge>,
}

/// The counter and the token limiters (Redis key, limit) to charge in it.
type RedisCharge = (Arc<RedisCounter>, Vec<(String, u64)>);

impl Charge {
    /// Settles the reservation: charges what `used` (tokens) exceeds it
    /// by, or gives back what was not used. Returns the tokens charged in all.
    pub fn settle(&self, used: u64) -> u64 {
        if let Some((counter, limiters)) = &self.redis {
            let limiters: Vec<(&str, u64)> = limiters.iter().map(|(key, limit)| (key.as_str(), *limit)).collect();
            let delta = i128::from(used) - i128::from(self.reservation.tokens);
            counter.settle(&limiters, delta);
            return used;
        }
        let now = now_nanos();
        for (set, reserved_cost) in &self.reserved {
            let Some(limiter) = &set.tokens else { continue };
            let unit = gcra::unit_cost(limiter.per_minute, self.shares);
            let used_cost = unit.saturating_mul(used);
            if used_cost >= *reserved_cost {
                let more = (used_cost - reserved_cost) / unit;
                limiter.charge(now, more, self.shares);
            } else {
                limiter.refund(reserved_cost - used_cost);
            }
        }
        used
    }
}

/// An admitted request: headers for its response, and what to charge.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// `x-ratelimit-*` for the response.
    pub headers: RateHeaders,
    /// Token charging, when a token limit applies.
    pub charge: Option<Charge>,
}

/// A key's request, counted before its body was read (so a key over its
/// request limit costs no body read), to be merged into [`admit`] once the
/// model is known — or given back if another limit refuses.
#[derive(Debug, Clone)]
pub struct Counted {
    /// Its limit and the verdict, for the headers.
    limit: u64,
    verdict: Verdict,
    /// Where it was counted: locally (the limiter's set and the cost) or in
    /// Redis (the counter and the limiter's key).
    place: CountedIn,
}

#[derive(Debug, Clone)]
enum CountedIn {
    Local(Arc<LimitSet>, u64),
    Redis(Arc<RedisCounter>, String),
}

impl Counted {
    /// Gives the request back (a later limit refused it).
    fn refund(&self) {
        match &self.place {
            CountedIn::Local(set, cost) => {
                if let Some(limiter) = &set.requests {
                    limiter.refund(*cost);
                }
            }
            CountedIn::Redis(counter, key) => counter.settle(&[(key.as_str(), self.limit)], -1),
        }
    }
}

/// Counts a request against the key's request limit, before its body is
/// read. `None` when the key has no request limit.
///
/// # Errors
/// The key's limit refused.
pub fn count_key_request(key: Option<&Arc<LimitSet>>, shares: u32) -> Result<Option<Counted>, Refusal> {
    let Some((set, limiter)) = key.and_then(|set| Some((set, set.requests.as_ref()?))) else { return Ok(None) };
    let (verdict, cost) = limiter.admit(now_nanos(), shares);
    counted_or_refused(limiter.per_minute, verdict, CountedIn::Local(set.clone(), cost))
}

/// [`count_key_request`] in Redis.
///
/// # Errors
/// `Ok(Err(refusal))` when the limit refused; `Err` when Redis did not answer.
pub async fn count_key_request_in_redis(
    counter: &Arc<RedisCounter>,
    key_id: &str,
    key: Option<&Arc<LimitSet>>,
) -> Result<Result<Option<Counted>, Refusal>, StoreError> {
    let Some(limiter) = key.and_then(|set| set.requests.as_ref()) else { return Ok(Ok(None)) };
    let redis_key = format!("waycast:key:{key_id}:requests");
    let script = [ScriptLimiter { key: &redis_key, units: 1, per_minute: limiter.per_minute }];
    let verdict = counter.admit(&script).await?.first().copied().ok_or(StoreError::Reply)?;
    Ok(counted_or_refused(limiter.per_minute, verdict, CountedIn::Redis(counter.clone(), redis_key)))
}

fn counted_or_refused(limit: u64, verdict: Verdict, place: CountedIn) -> Result<Option<Counted>, Refusal> {
    if verdict.allowed {
        return Ok(Some(Counted { limit, verdict, place }));
    }
    let mut headers = RateHeaders::default();
    headers.note(Unit::Requests, limit, verdict);
    Err(Refusal {
        owner: Owner::Key,
        unit: Unit::Requests,
        limit,
        retry_after_nanos: verdict.retry_after_nanos,
        headers,
    })
}

/// Admits a request under the key's and the model's limits, each pod
/// enforcing `1 / shares` of them: counts it against request limits and
/// reserves `reservation` against token limits. A request refused by one
/// limit is charged to none.
///
/// # Errors
/// The first limit that refused, with its retry time.
pub fn admit(
    key: Option<&Arc<LimitSet>>,
    model: Option<&Arc<LimitSet>>,
    shares: u32,
    reservation: Reservation,
    counted: Option<&Counted>,
) -> Result<Admitted, Refusal> {
    let now = now_nanos();
    let mut headers = RateHeaders::default();
    if let Some(counted) = counted {
        headers.note(Unit::Requests, counted.limit, counted.verdict);
    }
    // At most four limiters: (limiter, cost charged), to give back on a refusal.
    let mut charged: [Option<(&Limiter, u64)>; 4] = [None; 4];
    let mut reserved = Vec::new();
    let sets = [(Owner::Key, key), (Owner::Model, model)];
    let mut refusal = None;
    'check: for (slot, (owner, set)) in sets.iter().enumerate() {
        let Some(set) = set else { continue };
        if let Some(limiter) = &set.tokens {
            let (verdict, cost) = limiter.reserve(now, reservation.tokens, shares);
            headers.note(Unit::Tokens, limiter.per_minute, verdict);
            if !verdict.allowed {
                refusal = Some((*owner, Unit::Tokens, limiter.per_minute, verdict.retry_after_nanos));
                break 'check;
            }
            charged[slot * 2] = Some((limiter, cost));
            reserved.push(((*set).clone(), cost));
        }
        if let Some(limiter) = set.requests.as_ref().filter(|_| *owner != Owner::Key || counted.is_none()) {
            let (verdict, cost) = limiter.admit(now, shares);
            headers.note(Unit::Requests, limiter.per_minute, verdict);
            if !verdict.allowed {
                refusal = Some((*owner, Unit::Requests, limiter.per_minute, verdict.retry_after_nanos));
                break 'check;
            }
            charged[slot * 2 + 1] = Some((limiter, cost));
        }
    }
    if let Some((owner, unit, limit, retry_after_nanos)) = refusal {
        for (limiter, cost) in charged.into_iter().flatten() {
            limiter.refund(cost);
        }
        if let Some(counted) = counted {
            counted.refund();
        }
        return Err(Refusal { owner, unit, limit, retry_after_nanos, headers });
    }
    let charge = (!reserved.is_empty()).then_some(Charge { reserved, shares, reservation, redis: None });
    Ok(Admitted { headers, charge })
}

/// Whose limits a request is under, for counting in Redis.
pub struct Subject<'a> {
    /// The key's id and limits.
    pub key: (&'a str, Option<&'a Arc<LimitSet>>),
    /// The model's name and limits.
    pub model: (&'a str, Option<&'a Arc<LimitSet>>),
}

/// [`admit`], counted in Redis for the whole fleet (no shares).
///
/// # Errors
/// `Ok(Err(refusal))` when a limit refused; `Err` when Redis did not answer.
pub async fn admit_in_redis(
    counter: &Arc<RedisCounter>,
    subject: &Subject<'_>,
    reservation: Reservation,
    counted: Option<&Counted>,
) -> Result<Result<Admitted, Refusal>, StoreError> {
    // (owner, unit, Redis key, limit): token limits first, as `admit` checks them.
    let mut limiters: Vec<(Owner, Unit, String, u64)> = Vec::with_capacity(4);
    for (owner, (id, set)) in [(Owner::Key, subject.key), (Owner::Model, subject.model)] {
        let Some(set) = set else { continue };
        let scope = if owner == Owner::Key { "key" } else { "model" };
        if let Some(limiter) = &set.tokens {
            limiters.push((owner, Unit::Tokens, format!("waycast:{scope}:{id}:tokens"), limiter.per_minute));
        }
        if let Some(limiter) = set.requests.as_ref().filter(|_| owner != Owner::Key || counted.is_none()) {
            limiters.push((owner, Unit::Requests, format!("waycast:{scope}:{id}:requests"), limiter.per_minute));
        }
    }
    let script: Vec<ScriptLimiter<'_>> = limiters
        .iter()
        .map(|(_, unit, key, per_minute)| ScriptLimiter {
            key,
            units: if *unit == Unit::Requests { 1 } else { reservation.tokens },
            per_minute: *per_minute,
        })
        .collect();
    let verdicts = if script.is_empty() { Vec::new() } else { counter.admit(&script).await? };
    let mut headers = RateHeaders::default();
    if let Some(counted) = counted {
        headers.note(Unit::Requests, counted.limit, counted.verdict);
    }
    let mut refusal = None;
    for ((owner, unit, _, limit), verdict) in limiters.iter().zip(&verdicts) {
        headers.note(*unit, *limit, *verdict);
        if !verdict.allowed && refusal.is_none() {
            refusal = Some((*owner, *unit, *limit, verdict.retry_after_nanos));
        }
    }
    if let Some((owner, unit, limit, retry_after_nanos)) = refusal {
        if let Some(counted) = counted {
            counted.refund();
        }
        return Ok(Err(Refusal { owner, unit, limit, retry_after_nanos, headers }));
    }
    let tokens: Vec<(String, u64)> = limiters
        .into_iter()
        .filter(|(_, unit, _, _)| *unit == Unit::Tokens)
        .map(|(_, _, key, limit)| (key, limit))
        .collect();
    let charge = (!tokens.is_empty()).then(|| Charge {
        reserved: Vec::new(),
        shares: 1,
        reservation,
        redis: Some((counter.clone(), tokens)),
    });
    Ok(Ok(Admitted { headers, charge }))
}

/// A duration as OpenAI writes it in `x-ratelimit-reset-*`: `20ms`, `1s`,
/// `6m0s`.
pub fn duration_text(nanos: u64) -> String {
    let millis = nanos.div_ceil(1_000_000);
    if millis < 1000 {
        return format!("{millis}ms");
    }
    let seconds = millis.div_ceil(1000);
    if seconds < 60 { format!("{seconds}s") } else { format!("{}m{}s", seconds / 60, seconds % 60) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(requests: Option<u64>, tokens: Option<u64>) -> Arc<LimitSet> {
        Arc::new(LimitSet::new(&LimitsConfig { requests_per_minute: requests, tokens_per_minute: tokens }, None))
    }

    #[test]
    fn a_key_gets_its_limit_and_then_a_refusal_with_headers() {
        let key = set(Some(3), None);
        for left in [2, 1, 0] {
            let admitted = admit(Some(&key), None, 1, Reservation::default(), None).unwrap();
            assert_eq!(admitted.headers.requests.map(|(l, v)| (l, v.remaining)), Some((3, left)));
            assert!(admitted.charge.is_none(), "no token limit: nothing to charge");
        }
        let refusal = admit(Some(&key), None, 1, Reservation::default(), None).unwrap_err();
        assert_eq!((refusal.owner, refusal.unit, refusal.limit), (Owner::Key, Unit::Requests, 3));
        assert!(refusal.retry_after_nanos > 19_000_000_000 && refusal.retry_after_nanos <= 20_000_000_000);
        let mut headers = HeaderMap::new();
        refusal.apply(&mut headers);
        assert_eq!(headers["retry-after"], "20");
        assert_eq!(headers["x-ratelimit-limit-requests"], "3");
        assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
        assert!(headers["x-ratelimit-reset-requests"].to_str().unwrap().ends_with('s'));
    }

    #[test]
    fn a_refusal_by_the_model_does_not_use_up_the_key() {
        let key = set(Some(2), None);
        let model = set(Some(1), None);
        let none = Reservation::default();
        admit(Some(&key), Some(&model), 1, none, None).unwrap();
        let refusal = admit(Some(&key), Some(&model), 1, none, None).unwrap_err();
        assert_eq!(refusal.owner, Owner::Model);
        // The key still has its second request.
        assert_eq!(admit(Some(&key), None, 1, none, None).unwrap().headers.requests.map(|(_, v)| v.remaining), Some(0));
    }

    fn reserve(tokens: u64) -> Reservation {
        Reservation { tokens, request_bytes: 0, output: tokens }
    }

    #[test]
    fn tokens_are_reserved_then_settled() {
        let key = set(None, Some(100));
        let admitted = admit(Some(&key), None, 1, reserve(40), None).unwrap();
        assert_eq!(admitted.headers.tokens.map(|(_, v)| v.remaining), Some(60), "reserved at admission");
        let charge = admitted.charge.expect("a token limit wants the usage");
        charge.settle(10);
        let after = admit(Some(&key), None, 1, reserve(0), None).unwrap();
        assert_eq!(after.headers.tokens.map(|(_, v)| v.remaining), Some(90), "30 of the 40 given back");
        after.charge.unwrap().settle(150);
        let refusal = admit(Some(&key), None, 1, reserve(1), None).unwrap_err();
        assert_eq!(refusal.unit, Unit::Tokens);
        assert_eq!(refusal.headers.tokens.map(|(l, v)| (l, v.remaining)), Some((100, 0)));
    }

    /// Twenty parallel requests on a 1,000-tokens-per-minute key, each
    /// reserving 100 and using 500: only what fits is admitted, so the
    /// overshoot is bounded by what the admitted ones use beyond their
    /// reservations, not by the number of requests.
    #[test]
    fn parallel_requests_cannot_all_pass_one_budget() {
        let key = set(None, Some(1000));
        let admitted: Vec<Charge> =
            (0..20).filter_map(|_| admit(Some(&key), None, 1, reserve(100), None).ok()?.charge).collect();
        assert_eq!(admitted.len(), 10, "1,000 tokens hold ten reservations of 100");
        let with_max_tokens: Vec<_> =
            (0..20).filter_map(|_| admit(Some(&key), None, 1, reserve(100), None).ok()).collect();
        assert!(with_max_tokens.is_empty(), "nothing left until they settle");
        for charge in &admitted {
            charge.settle(100);
        }
        assert!(admit(Some(&key), None, 1, reserve(1), None).is_err(), "used as reserved: still full");
    }

    /// The key's request is counted before the body is read; a later
    /// refusal (here the model's) gives it back.
    #[test]
    fn a_request_counted_early_is_merged_or_given_back() {
        let key = set(Some(2), None);
        let model = set(Some(1), None);
        let counted = count_key_request(Some(&key), 1).unwrap().expect("a request limit");
        let admitted = admit(Some(&key), Some(&model), 1, Reservation::default(), Some(&counted)).unwrap();
        assert_eq!(admitted.headers.requests.map(|(_, v)| v.remaining), Some(0), "the model's, the tighter");
        let counted = count_key_request(Some(&key), 1).unwrap().expect("the key's second request");
        let refusal = admit(Some(&key), Some(&model), 1, Reservation::default(), Some(&counted)).unwrap_err();
        assert_eq!(refusal.owner, Owner::Model);
        assert!(count_key_request(Some(&key), 1).is_ok(), "the key's second request was given back");
        assert_eq!(count_key_request(Some(&key), 1).unwrap_err().owner, Owner::Key);
        assert!(count_key_request(None, 1).unwrap().is_none());
    }

    #[test]
    fn a_reservation_larger_than_the_limit_is_admitted_on_a_full_bucket() {
        let key = set(None, Some(100));
        assert!(admit(Some(&key), None, 1, reserve(10_000), None).is_ok());
        assert!(admit(Some(&key), None, 1, reserve(1), None).is_err());
    }

    #[test]
    fn usage_is_capped_and_estimated() {
        let reservation = Reservation::for_request(400, Some(50), None);
        assert_eq!(reservation.tokens, 150);
        assert_eq!(Reservation::for_request(400, None, Some(7)).output, 7);
        assert_eq!(Reservation::for_request(400, None, None).output, DEFAULT_OUTPUT_RESERVATION);
        // Reported: taken as it is when plausible, capped when not.
        assert_eq!(reservation.used(Some((90, 40)), 2000), 130);
        assert_eq!(reservation.used(Some((u64::MAX, u64::MAX)), 2000), 400 + PROMPT_ALLOWANCE + 2000);
        // Not reported: the prompt estimate and a token per 4 bytes relayed, at most the output bound.
        assert_eq!(reservation.used(None, 80), 100 + 20);
        assert_eq!(reservation.used(None, 1_000_000), 100 + 50);
    }

    #[test]
    fn a_pods_share_is_its_part_of_the_limit() {
        let key = set(Some(30), None);
        let admitted = (0..30).filter(|_| admit(Some(&key), None, 3, Reservation::default(), None).is_ok()).count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn state_carries_over_to_the_next_snapshot() {
        let key = set(Some(1), None);
        admit(Some(&key), None, 1, Reservation::default(), None).unwrap();
        let next = Arc::new(LimitSet::new(
            &LimitsConfig { requests_per_minute: Some(1), tokens_per_minute: None },
            Some(&key),
        ));
        assert!(admit(Some(&next), None, 1, Reservation::default(), None).is_err());
    }

    #[test]
    fn durations_read_like_openais() {
        assert_eq!(duration_text(20_000_000), "20ms");
        assert_eq!(duration_text(1_000_000_000), "1s");
        assert_eq!(duration_text(1_000_000_001), "2s");
        assert_eq!(duration_text(360_000_000_000), "6m0s");
    }
}
