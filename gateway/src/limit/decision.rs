//! What admission decides: a request admitted, with the `x-ratelimit-*`
//! headers of its tightest limits, what to charge and the concurrency it
//! holds, or refused by one limit, with its retry time.

use std::sync::Arc;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use super::charge::Charge;
use super::gcra::Verdict;
use super::limiter::LimitSet;
use super::redis::RedisCounter;

/// Why a request was not admitted.
#[derive(Debug)]
pub enum Refused {
    /// A limit refused it (429).
    Limit(Refusal),
    /// A budget is spent for its period (429 `insufficient_quota`).
    Budget(super::budget::Exhausted),
    /// The store did not answer and the Gateway fails closed (503).
    StoreFailed(super::redis::StoreError),
}

/// Whose limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The API key's.
    Key,
    /// The tenant's: every key of the key's namespace together.
    Tenant,
    /// The model's (over all keys).
    Model,
    /// One member's of a grant (a token's holder, each on their own).
    User,
}

/// Which unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Requests.
    Requests,
    /// Tokens.
    Tokens,
    /// Requests in flight at once.
    Concurrent,
}

impl Unit {
    /// `requests` or `tokens` (OpenAI's error type, header suffix); a
    /// concurrency limit counts requests.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Requests | Unit::Concurrent => "requests",
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
    pub(super) fn note(&mut self, unit: Unit, limit: u64, verdict: Verdict) {
        let slot = match unit {
            Unit::Requests => &mut self.requests,
            Unit::Tokens => &mut self.tokens,
            Unit::Concurrent => return,
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

    /// The `limit` label of the metric: `key_requests`, `model_tokens`,
    /// `tenant_concurrent`, ...
    pub fn label(&self) -> &'static str {
        match (self.owner, self.unit) {
            (Owner::Key, Unit::Requests) => "key_requests",
            (Owner::Key, Unit::Tokens) => "key_tokens",
            (Owner::Key, Unit::Concurrent) => "key_concurrent",
            (Owner::Tenant, Unit::Requests) => "tenant_requests",
            (Owner::Tenant, Unit::Tokens) => "tenant_tokens",
            (Owner::Tenant, Unit::Concurrent) => "tenant_concurrent",
            (Owner::Model, Unit::Requests) => "model_requests",
            (Owner::Model, Unit::Tokens) => "model_tokens",
            (Owner::Model, Unit::Concurrent) => "model_concurrent",
            (Owner::User, Unit::Requests) => "user_requests",
            (Owner::User, Unit::Tokens) => "user_tokens",
            (Owner::User, Unit::Concurrent) => "user_concurrent",
        }
    }

    /// What ran out, for the error message: "the API key's limit of 3
    /// requests per minute", "the namespace's limit of 8 concurrent requests".
    pub fn describe(&self) -> String {
        let owner = match self.owner {
            Owner::Key => "API key's",
            Owner::Tenant => "namespace's",
            Owner::Model => "model's",
            Owner::User => "per-person",
        };
        match self.unit {
            Unit::Concurrent => format!("the {owner} limit of {} concurrent requests", self.limit),
            unit => format!("the {owner} limit of {} {} per minute", self.limit, unit.as_str()),
        }
    }
}

/// A refusal by a concurrency limit: retried after a second (a request in
/// flight may end any time).
pub(super) fn concurrency_refusal(owner: Owner, limit: u64, headers: RateHeaders) -> Refusal {
    Refusal { owner, unit: Unit::Concurrent, limit, retry_after_nanos: 1_000_000_000, headers }
}

/// The places an admitted request holds under concurrency limits:
/// counted out when they are dropped (the request has ended).
#[derive(Debug, Default)]
pub struct Places {
    pub(super) local: Vec<super::limiter::LocalHold>,
    #[allow(dead_code, reason = "held for its Drop, which releases the places in Redis")]
    pub(super) redis: Option<super::redis::RedisHold>,
}

/// An admitted request: headers for its response, what to charge, the
/// concurrency it holds and what it reserved in its budgets.
#[derive(Debug, Default)]
pub struct Admitted {
    /// `x-ratelimit-*` for the response.
    pub headers: RateHeaders,
    /// Token charging, when a token limit applies.
    pub charge: Option<Charge>,
    /// Concurrency held until the request ends.
    pub places: Places,
    /// Budgets reserved, settled when the request ends (boxed: most keys
    /// have none, and every admission and request carries the field).
    pub budget: Option<Box<super::budget::BudgetHold>>,
}

/// A key's request, counted before its body was read (so a key over its
/// request limit costs no body read), to be merged into [`admit`] once the
/// model is known — or given back if another limit refuses.
#[derive(Debug, Clone)]
pub struct Counted {
    /// Its limit and the verdict, for the headers.
    pub(super) limit: u64,
    pub(super) verdict: Verdict,
    /// Where it was counted: locally (the limiter's set and the cost) or in
    /// Redis (the counter and the limiter's key).
    pub(super) place: CountedIn,
}

/// Where a [`Counted`] request was counted.
#[derive(Debug, Clone)]
pub(super) enum CountedIn {
    Local(Arc<LimitSet>, u64),
    Redis(Arc<RedisCounter>, String),
}

impl Counted {
    /// Gives the request back (a later limit refused it).
    pub(super) fn refund(&self) {
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

pub(super) fn counted_or_refused(limit: u64, verdict: Verdict, place: CountedIn) -> Result<Option<Counted>, Refusal> {
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
