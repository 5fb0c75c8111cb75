//! Limits counted in Redis, for the whole fleet: one script call per
//! admission, checking and charging every limiter of the request at once
//! (rates, and concurrency held until the request ends).

use std::sync::Arc;

use super::budget::{Budget, BudgetHold, BudgetOwner, Exhausted, Need};
use super::charge::{Charge, Reservation};
use super::decision::{
    Admitted, Counted, CountedIn, Owner, Places, RateHeaders, Refusal, Unit, concurrency_refusal, counted_or_refused,
};
use super::limiter::LimitSet;
use super::redis::{RedisCounter, RedisHold, RedisSpend, ScriptBudget, ScriptLimiter, StoreError};

/// A key's request counted before its body is read, in Redis (the local
/// form: `local::count_key_request`).
///
/// # Errors
/// `Ok(Err(refusal))` when the limit refused; `Err` when Redis did not answer.
pub async fn count_key_request(
    counter: &Arc<RedisCounter>,
    key_id: &str,
    key: Option<&Arc<LimitSet>>,
) -> Result<Result<Option<Counted>, Refusal>, StoreError> {
    let Some(limiter) = key.and_then(|set| set.requests.as_ref()) else { return Ok(Ok(None)) };
    let redis_key = format!("{}key:{key_id}:requests", counter.config.key_prefix());
    let script = [ScriptLimiter { key: &redis_key, units: 1, per_minute: limiter.per_minute }];
    let holder = counter.holder();
    let verdict =
        counter.admit(&script, &[], &[], &holder, "").await?.verdicts.first().copied().ok_or(StoreError::Reply)?;
    Ok(counted_or_refused(limiter.per_minute, verdict, CountedIn::Redis(counter.clone(), redis_key)))
}

/// Never called: a refusal was found before this is reached.
fn unreachable_refusal() -> super::decision::Refused {
    super::decision::Refused::StoreFailed(StoreError::Reply)
}

/// Whose limits a request is under, for counting in Redis.
pub struct Subject<'a> {
    /// The key's id and limits.
    pub key: (&'a str, Option<&'a Arc<LimitSet>>),
    /// The tenant's namespace and limits (all its keys together).
    pub tenant: (&'a str, Option<&'a Arc<LimitSet>>),
    /// The model's name and limits.
    pub model: (&'a str, Option<&'a Arc<LimitSet>>),
    /// A grant member's own state id and limits (`("", None)` for a key).
    pub user: (&'a str, Option<&'a Arc<LimitSet>>),
    /// The key's and the tenant's budgets and the request's worst case,
    /// when either has a budget.
    pub budgets: Option<BudgetAsk<'a>>,
}

impl Subject<'_> {
    /// Whether no limit and no budget applies: nothing to admit (the
    /// request path then skips admission altogether).
    pub fn asks_nothing(&self) -> bool {
        self.key.1.is_none()
            && self.tenant.1.is_none()
            && self.model.1.is_none()
            && self.user.1.is_none()
            && self.budgets.is_none()
    }
}

/// What a request asks of its budgets.
pub struct BudgetAsk<'a> {
    /// The key's budgets.
    pub key: &'a [Budget],
    /// The tenant's budgets.
    pub tenant: &'a [Budget],
    /// A grant member's own budgets (none for a key).
    pub user: &'a [Budget],
    /// The request's worst case.
    pub need: Need,
    /// The time zone periods start in.
    pub zone: &'a jiff::tz::TimeZone,
    /// Now.
    pub now: jiff::Timestamp,
}

impl BudgetAsk<'_> {
    /// Whose budgets, in the order they are checked.
    pub(super) fn owned(&self) -> [(BudgetOwner, &[Budget]); 3] {
        [(BudgetOwner::User, self.user), (BudgetOwner::Key, self.key), (BudgetOwner::Tenant, self.tenant)]
    }
}

/// The Redis hash of the budget of `owner` `id` (a key id, a namespace)
/// over `period` in its window `window`.
pub fn budget_hash(
    prefix: &str,
    owner: BudgetOwner,
    id: &str,
    period: waycast_crds::period::Period,
    window: &str,
) -> String {
    let scope = match owner {
        BudgetOwner::Key => "key",
        BudgetOwner::Tenant => "tenant",
        BudgetOwner::User => "user",
    };
    format!("{prefix}budget:{scope}:{id}:{period:?}:{window}")
}

/// Admission counted in Redis for the whole fleet (no shares; the local
/// form: `local::admit`).
///
/// # Errors
/// `Ok(Err(refusal))` when a limit refused; `Err` when Redis did not answer.
pub async fn admit(
    counter: &Arc<RedisCounter>,
    subject: &Subject<'_>,
    reservation: Reservation,
    counted: Option<&Counted>,
) -> Result<Result<Admitted, super::decision::Refused>, StoreError> {
    // (owner, unit, Redis key, limit): token limits first, as `admit` checks them.
    let mut limiters: Vec<(Owner, Unit, String, u64)> = Vec::with_capacity(8);
    let mut concurrent: Vec<(Owner, String, u64)> = Vec::new();
    let prefix = counter.config.key_prefix();
    let owned = [
        (Owner::User, subject.user),
        (Owner::Key, subject.key),
        (Owner::Tenant, subject.tenant),
        (Owner::Model, subject.model),
    ];
    for (owner, (id, set)) in owned {
        let Some(set) = set else { continue };
        let scope = match owner {
            Owner::Key => "key",
            Owner::Tenant => "tenant",
            Owner::Model => "model",
            Owner::User => "user",
        };
        if let Some(limiter) = &set.tokens {
            limiters.push((owner, Unit::Tokens, format!("{prefix}{scope}:{id}:tokens"), limiter.per_minute));
        }
        if let Some(limiter) = set.requests.as_ref().filter(|_| owner != Owner::Key || counted.is_none()) {
            limiters.push((owner, Unit::Requests, format!("{prefix}{scope}:{id}:requests"), limiter.per_minute));
        }
        if let Some(concurrency) = &set.concurrent {
            concurrent.push((owner, format!("{prefix}{scope}:{id}:concurrent"), concurrency.limit));
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
    let held_keys: Vec<(&str, u64)> = concurrent.iter().map(|(_, key, limit)| (key.as_str(), *limit)).collect();
    // (owner, the budget, its hash in the current period, the period's end).
    let mut budgets: Vec<(BudgetOwner, &Budget, String, jiff::Timestamp)> = Vec::new();
    let mut starts: Vec<i64> = Vec::new();
    if let Some(ask) = &subject.budgets {
        let ids = [subject.user.0, subject.key.0, subject.tenant.0];
        for ((owner, list), id) in ask.owned().into_iter().zip(ids) {
            for budget in list {
                let window = budget.period.window(ask.now, ask.zone);
                let key = budget_hash(prefix, owner, id, budget.period, &window.key);
                starts.push(window.start.as_second());
                budgets.push((owner, budget, key, window.end));
            }
        }
    }
    let need = subject.budgets.as_ref().map(|ask| ask.need).unwrap_or_default();
    let now = subject.budgets.as_ref().map_or_else(jiff::Timestamp::now, |ask| ask.now);
    // A day past the period's end: a late settlement still finds its hash.
    let ttl_ms = |end: jiff::Timestamp| {
        u64::try_from(end.as_millisecond().saturating_sub(now.as_millisecond())).unwrap_or(0) + 86_400_000
    };
    let script_budgets: Vec<ScriptBudget<'_>> = budgets
        .iter()
        .map(|(_, budget, key, end)| ScriptBudget {
            key,
            tokens: budget.tokens,
            cost: budget.cost,
            // Nothing reserved where the budget sets no limit.
            need_tokens: if budget.tokens.is_some() { need.tokens } else { 0 },
            need_cost: if budget.cost.is_some() { need.cost } else { 0 },
            ttl_ms: ttl_ms(*end),
        })
        .collect();
    // The places the script may count are released unless it is known that
    // it did not count them: when its answer is lost (a timeout, the client
    // gone, the connection broken) a release is owed all the same (one of a
    // place never counted removes nothing: counts at or below 0 are deleted).
    let holder = counter.holder();
    let mut pending = RedisHold {
        counter: counter.clone(),
        keys: concurrent.iter().map(|(_, key, _)| key.clone()).collect(),
        holder: holder.clone(),
    };
    // The same for budgets: a reservation whose answer is lost is given
    // back (one never made gives back nothing: each request's reservation
    // is its own field, and the give-back reaches Redis after the
    // admission it answers, `redis_link::serve`).
    let request = if script_budgets.is_empty() { String::new() } else { counter.request_name(&holder) };
    let mut hold = BudgetHold::default();
    let admission = if script.is_empty() && held_keys.is_empty() && script_budgets.is_empty() {
        None
    } else {
        let asked = counter.admit(&script, &held_keys, &script_budgets, &holder, &request);
        // Armed while the answer is awaited (its drop settles 0: a give-back).
        hold.redis = Some(RedisSpend {
            counter: counter.clone(),
            request: request.clone(),
            budgets: script_budgets.iter().map(|b| (b.key.to_owned(), b.ttl_ms)).collect(),
        });
        Some(asked.await?)
    };
    let mut headers = RateHeaders::default();
    if let Some(counted) = counted {
        headers.note(Unit::Requests, counted.limit, counted.verdict);
    }
    let mut refusal = None;
    let verdicts = admission.as_ref().map(|a| a.verdicts.as_slice()).unwrap_or_default();
    for ((owner, unit, _, limit), verdict) in limiters.iter().zip(verdicts) {
        headers.note(*unit, *limit, *verdict);
        if !verdict.allowed && refusal.is_none() {
            refusal = Some(Refusal {
                owner: *owner,
                unit: *unit,
                limit: *limit,
                retry_after_nanos: verdict.retry_after_nanos,
                headers,
            });
        }
    }
    let held = admission.as_ref().map(|a| a.held.as_slice()).unwrap_or_default();
    if refusal.is_none()
        && let Some(((owner, _, limit), _)) = concurrent.iter().zip(held).find(|(_, (admitted, _))| !admitted)
    {
        refusal = Some(concurrency_refusal(*owner, *limit, headers));
    }
    let budget_verdicts = admission.as_ref().map(|a| a.budgets.as_slice()).unwrap_or_default();
    // What Redis had counted in each budget is what the fleet spent: the
    // budget gauge (`waycast_gateway_budget_used_ratio`) reads it.
    for (((_, budget, _, _), start), (_, tokens, cost)) in budgets.iter().zip(&starts).zip(budget_verdicts) {
        budget.state.set_fleet(super::budget::FleetSpend { start: *start, total: (*tokens, *cost), mine: (0, 0) });
    }
    let exhausted =
        budgets.iter().zip(script_budgets.iter()).zip(budget_verdicts).find(|(_, (admitted, ..))| !admitted).map(
            |(((owner, budget, _, end), asked), (_, tokens, _))| {
                let over_tokens = budget.tokens.is_some_and(|limit| tokens.saturating_add(asked.need_tokens) > limit);
                let what = if over_tokens { "tokens" } else { "cost" };
                Exhausted { owner: *owner, period: budget.period, resets_at: *end, what }
            },
        );
    if refusal.is_some() || exhausted.is_some() {
        // The script counted nothing: nothing to release or give back.
        pending.keys.clear();
        if let Some(spend) = hold.redis.as_mut() {
            spend.budgets.clear();
        }
        if let Some(counted) = counted {
            counted.refund();
        }
        return Ok(Err(match (refusal, exhausted) {
            (Some(mut refusal), _) => {
                refusal.headers = headers;
                super::decision::Refused::Limit(refusal)
            }
            (None, Some(exhausted)) => super::decision::Refused::Budget(exhausted),
            (None, None) => unreachable_refusal(),
        }));
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
    let places = Places { local: Vec::new(), redis: (!pending.keys.is_empty()).then_some(pending) };
    let budget = hold.redis.as_ref().is_some_and(|spend| !spend.budgets.is_empty()).then(|| Box::new(hold));
    Ok(Ok(Admitted { headers, charge, places, budget }))
}
