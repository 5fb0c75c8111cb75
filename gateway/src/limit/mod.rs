//! Rate limits: requests and tokens per minute, per key and per model.
//!
//! ```text
//! request ─► admit(key limits, model limits, shares) ──refused──► 429 + Retry-After + x-ratelimit-*
//!                │ admitted: x-ratelimit-* on the response
//!                ▼
//! response ends ─► Charge::tokens(usage) ─► the token limiters
//! ```
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
        let cost = gcra::unit_cost(self.per_minute, shares);
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

    fn budget(&self, now: u64, shares: u32) -> Verdict {
        let unit = gcra::unit_cost(self.per_minute, shares);
        gcra::has_budget(self.tat.load(Ordering::Relaxed), now, self.per_minute, unit)
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

/// The token limiters an admitted request is charged to once its usage is
/// known.
#[derive(Debug, Clone)]
pub struct Charge {
    key: Option<Arc<LimitSet>>,
    model: Option<Arc<LimitSet>>,
    shares: u32,
    /// Counted in Redis: the counter and the token limiters' Redis keys
    /// with their limits.
    redis: Option<RedisCharge>,
}

/// The counter and the token limiters (Redis key, limit) to charge in it.
type RedisCharge = (Arc<RedisCounter>, Vec<(String, u64)>);

impl Charge {
    /// Whether any token limit applies (the response's usage is needed).
    pub fn wants_tokens(&self) -> bool {
        self.redis.is_some() || [&self.key, &self.model].into_iter().flatten().any(|set| set.tokens.is_some())
    }

    /// Charges `tokens` to every token limiter of the request.
    pub fn tokens(&self, tokens: u64) {
        if let Some((counter, limiters)) = &self.redis {
            let limiters: Vec<(&str, u64)> = limiters.iter().map(|(key, limit)| (key.as_str(), *limit)).collect();
            counter.charge(&limiters, tokens);
            return;
        }
        let now = now_nanos();
        for set in [&self.key, &self.model].into_iter().flatten() {
            if let Some(limiter) = &set.tokens {
                limiter.charge(now, tokens, self.shares);
            }
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

/// Admits a request under the key's and the model's limits, each pod
/// enforcing `1 / shares` of them. A request refused by one limit is not
/// charged to another.
///
/// # Errors
/// The first limit that refused, with its retry time.
pub fn admit(key: Option<&Arc<LimitSet>>, model: Option<&Arc<LimitSet>>, shares: u32) -> Result<Admitted, Refusal> {
    let now = now_nanos();
    let mut headers = RateHeaders::default();
    let mut charged: [Option<(&Limiter, u64)>; 2] = [None, None];
    let sets = [(Owner::Key, key), (Owner::Model, model)];
    let mut refusal = None;
    'check: for (slot, (owner, set)) in sets.iter().enumerate() {
        let Some(set) = set else { continue };
        if let Some(limiter) = &set.tokens {
            let verdict = limiter.budget(now, shares);
            headers.note(Unit::Tokens, limiter.per_minute, verdict);
            if !verdict.allowed {
                refusal = Some((*owner, Unit::Tokens, limiter.per_minute, verdict.retry_after_nanos));
                break 'check;
            }
        }
        if let Some(limiter) = &set.requests {
            let (verdict, cost) = limiter.admit(now, shares);
            headers.note(Unit::Requests, limiter.per_minute, verdict);
            if !verdict.allowed {
                refusal = Some((*owner, Unit::Requests, limiter.per_minute, verdict.retry_after_nanos));
                break 'check;
            }
            charged[slot] = Some((limiter, cost));
        }
    }
    if let Some((owner, unit, limit, retry_after_nanos)) = refusal {
        for (limiter, cost) in charged.into_iter().flatten() {
            limiter.refund(cost);
        }
        return Err(Refusal { owner, unit, limit, retry_after_nanos, headers });
    }
    let charge = Charge { key: key.cloned(), model: model.cloned(), shares, redis: None };
    Ok(Admitted { headers, charge: charge.wants_tokens().then_some(charge) })
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
) -> Result<Result<Admitted, Refusal>, StoreError> {
    // (owner, unit, Redis key, limit): token limits first, as `admit` checks them.
    let mut limiters: Vec<(Owner, Unit, String, u64)> = Vec::with_capacity(4);
    for (owner, (id, set)) in [(Owner::Key, subject.key), (Owner::Model, subject.model)] {
        let Some(set) = set else { continue };
        let scope = if owner == Owner::Key { "key" } else { "model" };
        if let Some(limiter) = &set.tokens {
            limiters.push((owner, Unit::Tokens, format!("waycast:{scope}:{id}:tokens"), limiter.per_minute));
        }
        if let Some(limiter) = &set.requests {
            limiters.push((owner, Unit::Requests, format!("waycast:{scope}:{id}:requests"), limiter.per_minute));
        }
    }
    let script: Vec<ScriptLimiter<'_>> = limiters
        .iter()
        .map(|(_, unit, key, per_minute)| ScriptLimiter {
            key,
            charged_now: *unit == Unit::Requests,
            per_minute: *per_minute,
        })
        .collect();
    let verdicts = counter.admit(&script).await?;
    let mut headers = RateHeaders::default();
    let mut refusal = None;
    for ((owner, unit, _, limit), verdict) in limiters.iter().zip(&verdicts) {
        headers.note(*unit, *limit, *verdict);
        if !verdict.allowed && refusal.is_none() {
            refusal = Some((*owner, *unit, *limit, verdict.retry_after_nanos));
        }
    }
    if let Some((owner, unit, limit, retry_after_nanos)) = refusal {
        return Ok(Err(Refusal { owner, unit, limit, retry_after_nanos, headers }));
    }
    let tokens: Vec<(String, u64)> = limiters
        .into_iter()
        .filter(|(_, unit, _, _)| *unit == Unit::Tokens)
        .map(|(_, _, key, limit)| (key, limit))
        .collect();
    let charge = (!tokens.is_empty()).then(|| Charge {
        key: None,
        model: None,
        shares: 1,
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
            let admitted = admit(Some(&key), None, 1).unwrap();
            assert_eq!(admitted.headers.requests.map(|(l, v)| (l, v.remaining)), Some((3, left)));
            assert!(admitted.charge.is_none(), "no token limit: nothing to charge");
        }
        let refusal = admit(Some(&key), None, 1).unwrap_err();
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
        admit(Some(&key), Some(&model), 1).unwrap();
        let refusal = admit(Some(&key), Some(&model), 1).unwrap_err();
        assert_eq!(refusal.owner, Owner::Model);
        // The key still has its second request.
        assert_eq!(admit(Some(&key), None, 1).unwrap().headers.requests.map(|(_, v)| v.remaining), Some(0));
    }

    #[test]
    fn tokens_are_charged_after_and_refuse_once_spent() {
        let key = set(None, Some(100));
        let admitted = admit(Some(&key), None, 1).unwrap();
        let charge = admitted.charge.expect("a token limit wants the usage");
        charge.tokens(150);
        let refusal = admit(Some(&key), None, 1).unwrap_err();
        assert_eq!(refusal.unit, Unit::Tokens);
        assert_eq!(refusal.headers.tokens.map(|(l, v)| (l, v.remaining)), Some((100, 0)));
    }

    #[test]
    fn a_pods_share_is_its_part_of_the_limit() {
        let key = set(Some(30), None);
        let admitted = (0..30).filter(|_| admit(Some(&key), None, 3).is_ok()).count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn state_carries_over_to_the_next_snapshot() {
        let key = set(Some(1), None);
        admit(Some(&key), None, 1).unwrap();
        let next = Arc::new(LimitSet::new(
            &LimitsConfig { requests_per_minute: Some(1), tokens_per_minute: None },
            Some(&key),
        ));
        assert!(admit(Some(&next), None, 1).is_err());
    }

    #[test]
    fn durations_read_like_openais() {
        assert_eq!(duration_text(20_000_000), "20ms");
        assert_eq!(duration_text(1_000_000_000), "1s");
        assert_eq!(duration_text(1_000_000_001), "2s");
        assert_eq!(duration_text(360_000_000_000), "6m0s");
    }
}
