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
//! [`charge::DEFAULT_OUTPUT_RESERVATION`]) — so parallel requests cannot all pass
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

mod charge;
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

pub use charge::{Charge, Relayed, Reservation};
pub use gcra::Verdict;
use redis::{RedisCounter, ScriptLimiter, StoreError};

/// Nanoseconds on the limiters' clock (monotonic, from the first call).
pub fn now_nanos() -> u64 {
    nanos_at(Instant::now())
}

/// `at` on [`now_nanos`]'s clock (for a caller that has read the time
/// already: each reading costs a few dozen cycles).
pub fn nanos_at(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| at);
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
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
    let redis_key = format!("{}key:{key_id}:requests", counter.config.key_prefix());
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
    let prefix = counter.config.key_prefix();
    for (owner, (id, set)) in [(Owner::Key, subject.key), (Owner::Model, subject.model)] {
        let Some(set) = set else { continue };
        let scope = if owner == Owner::Key { "key" } else { "model" };
        if let Some(limiter) = &set.tokens {
            limiters.push((owner, Unit::Tokens, format!("{prefix}{scope}:{id}:tokens"), limiter.per_minute));
        }
        if let Some(limiter) = set.requests.as_ref().filter(|_| owner != Owner::Key || counted.is_none()) {
            limiters.push((owner, Unit::Requests, format!("{prefix}{scope}:{id}:requests"), limiter.per_minute));
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
mod tests;
