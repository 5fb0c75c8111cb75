//! Limits counted in Redis, for the whole fleet: one script call per
//! admission, checking and charging every limiter of the request at once
//! (rates, and concurrency held until the request ends).

use std::sync::Arc;

use super::charge::{Charge, Reservation};
use super::decision::{
    Admitted, Counted, CountedIn, Held, Owner, RateHeaders, Refusal, Unit, concurrency_refusal, counted_or_refused,
};
use super::limiter::LimitSet;
use super::redis::{RedisCounter, RedisHold, ScriptLimiter, StoreError};

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
    let verdict = counter.admit(&script, &[], &holder).await?.verdicts.first().copied().ok_or(StoreError::Reply)?;
    Ok(counted_or_refused(limiter.per_minute, verdict, CountedIn::Redis(counter.clone(), redis_key)))
}

/// Whose limits a request is under, for counting in Redis.
pub struct Subject<'a> {
    /// The key's id and limits.
    pub key: (&'a str, Option<&'a Arc<LimitSet>>),
    /// The tenant's namespace and limits (all its keys together).
    pub tenant: (&'a str, Option<&'a Arc<LimitSet>>),
    /// The model's name and limits.
    pub model: (&'a str, Option<&'a Arc<LimitSet>>),
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
) -> Result<Result<Admitted, Refusal>, StoreError> {
    // (owner, unit, Redis key, limit): token limits first, as `admit` checks them.
    let mut limiters: Vec<(Owner, Unit, String, u64)> = Vec::with_capacity(6);
    let mut concurrent: Vec<(Owner, String, u64)> = Vec::new();
    let prefix = counter.config.key_prefix();
    let owned = [(Owner::Key, subject.key), (Owner::Tenant, subject.tenant), (Owner::Model, subject.model)];
    for (owner, (id, set)) in owned {
        let Some(set) = set else { continue };
        let scope = match owner {
            Owner::Key => "key",
            Owner::Tenant => "tenant",
            Owner::Model => "model",
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
    let admission = if script.is_empty() && held_keys.is_empty() {
        None
    } else {
        Some(counter.admit(&script, &held_keys, &holder).await?)
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
    if let Some(mut refusal) = refusal {
        // The script counted nothing: nothing to release.
        pending.keys.clear();
        if let Some(counted) = counted {
            counted.refund();
        }
        refusal.headers = headers;
        return Ok(Err(refusal));
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
    let held = Held { local: Vec::new(), redis: (!pending.keys.is_empty()).then_some(pending) };
    Ok(Ok(Admitted { headers, charge, held }))
}
