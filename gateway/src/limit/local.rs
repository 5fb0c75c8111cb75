//! Limits counted by this pod: each enforces `1 / shares` of every limit
//! (`shares`: the live pods of its Gateway), with one compare-and-swap per
//! limiter.

use std::sync::Arc;

use super::charge::{Charge, Reservation};
use super::clock::now_nanos;
use super::decision::{
    Admitted, Counted, CountedIn, Owner, Places, RateHeaders, Refusal, Unit, concurrency_refusal, counted_or_refused,
};
use super::limiter::{LimitSet, Limiter};

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

/// The limit sets a request is under: its key's, its tenant's (every key
/// of the namespace together) and its model's.
#[derive(Clone, Copy, Default)]
pub struct Sets<'a> {
    /// The key's limits.
    pub key: Option<&'a Arc<LimitSet>>,
    /// The tenant's limits.
    pub tenant: Option<&'a Arc<LimitSet>>,
    /// The model's limits.
    pub model: Option<&'a Arc<LimitSet>>,
    /// A grant member's own limits.
    pub user: Option<&'a Arc<LimitSet>>,
}

impl Sets<'_> {
    /// Whether no limit applies.
    pub fn is_empty(&self) -> bool {
        self.key.is_none() && self.tenant.is_none() && self.model.is_none() && self.user.is_none()
    }
}

/// Admits a request under the key's, the tenant's and the model's limits,
/// each pod enforcing `1 / shares` of them: counts it against request
/// limits, reserves `reservation` against token limits, and holds a place
/// under concurrency limits. A request refused by one limit is charged to
/// none.
///
/// # Errors
/// The first limit that refused, with its retry time.
pub fn admit(
    sets: Sets<'_>,
    shares: u32,
    reservation: Reservation,
    counted: Option<&Counted>,
) -> Result<Admitted, Refusal> {
    let now = now_nanos();
    let mut headers = RateHeaders::default();
    if let Some(counted) = counted {
        headers.note(Unit::Requests, counted.limit, counted.verdict);
    }
    // At most eight limiters: (limiter, cost charged), to give back on a refusal.
    let mut charged: [Option<(&Limiter, u64)>; 8] = [None; 8];
    let mut reserved = Vec::new();
    let owned =
        [(Owner::User, sets.user), (Owner::Key, sets.key), (Owner::Tenant, sets.tenant), (Owner::Model, sets.model)];
    let mut refusal = None;
    'check: for (slot, (owner, set)) in owned.iter().enumerate() {
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
    let mut places = Places::default();
    let refusal = refusal.map(|(owner, unit, limit, retry_after_nanos)| Refusal {
        owner,
        unit,
        limit,
        retry_after_nanos,
        headers,
    });
    let refusal = refusal.or_else(|| {
        for (owner, set) in [(Owner::User, sets.user), (Owner::Key, sets.key), (Owner::Tenant, sets.tenant)] {
            let Some(concurrency) = set.and_then(|set| set.concurrent.as_ref()) else { continue };
            match concurrency.take(shares) {
                Some(hold) => places.local.push(hold),
                // Dropping `places` counts out what was taken.
                None => return Some(concurrency_refusal(owner, concurrency.limit, headers)),
            }
        }
        None
    });
    if let Some(refusal) = refusal {
        for (limiter, cost) in charged.into_iter().flatten() {
            limiter.refund(cost);
        }
        if let Some(counted) = counted {
            counted.refund();
        }
        return Err(refusal);
    }
    let charge = (!reserved.is_empty()).then_some(Charge { reserved, shares, reservation, redis: None });
    Ok(Admitted { headers, charge, places, budget: None })
}
