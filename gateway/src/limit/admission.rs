//! Admission: every limit of a request, asked where the Gateway counts
//! them (this pod's share, or Redis), with one policy for a store that
//! fails. The request path asks twice: the key's request limit before the
//! body is read ([`Counters::count_key_request`]), then the rest once the
//! model is known ([`Counters::admit`]).

use std::sync::Arc;

use super::budget::{self, BudgetHold};
use super::charge::Reservation;
use super::decision::{Admitted, Counted, Refused};
use super::in_redis::{self, Subject};
use super::limiter::LimitSet;
use super::local;
use super::redis::{RedisCounter, StoreError};

/// Where a Gateway's limits are counted.
#[derive(Clone, Copy)]
pub enum Counters<'a> {
    /// By each pod, `1 / shares` of every limit.
    Local {
        /// Live pods of the Gateway (at least 1).
        shares: u32,
    },
    /// In Redis, for the whole fleet.
    Redis(&'a Arc<RedisCounter>),
}

/// An admission decision that let the request on, and the store failure it
/// was let on despite (the Gateway fails open), to be counted.
#[derive(Debug)]
pub struct Passed<T> {
    /// What was decided.
    pub value: T,
    /// The label of the store failure passed over, if one was.
    pub store_failure: Option<&'static str>,
}

impl<T> Passed<T> {
    fn clean(value: T) -> Self {
        Self { value, store_failure: None }
    }
}

impl<'a> Counters<'a> {
    /// The config's Redis counter if it names one, else this pod's share.
    pub fn of(redis: Option<&'a Arc<RedisCounter>>, shares: u32) -> Self {
        redis.map_or(Self::Local { shares }, Self::Redis)
    }

    /// Counts the key's request against its request limit, before the body
    /// is read. `None` when the key has no request limit.
    ///
    /// # Errors
    /// [`Refused`]: the limit refused, or the store failed closed.
    pub async fn count_key_request(
        self,
        key_id: &str,
        limits: Option<&Arc<LimitSet>>,
    ) -> Result<Passed<Option<Counted>>, Refused> {
        if limits.is_none_or(|set| set.requests.is_none()) {
            return Ok(Passed::clean(None));
        }
        match self {
            Self::Local { shares } => {
                local::count_key_request(limits, shares).map(Passed::clean).map_err(Refused::Limit)
            }
            Self::Redis(counter) => match in_redis::count_key_request(counter, key_id, limits).await {
                Ok(decision) => decision.map(Passed::clean).map_err(Refused::Limit),
                Err(error) => on_store_failure(counter, error, None),
            },
        }
    }

    /// Admits the request under the key's, its tenant's and the model's
    /// limits (the key's request already counted, if `counted`), reserving
    /// `reservation` against token limits and holding a place under
    /// concurrency limits. `None` when none of them has limits.
    ///
    /// # Errors
    /// [`Refused`]: a limit refused (nothing is charged to any), or the
    /// store failed closed.
    pub async fn admit(
        self,
        subject: &Subject<'_>,
        reservation: Reservation,
        counted: Option<&Counted>,
    ) -> Result<Passed<Option<Admitted>>, Refused> {
        let sets =
            local::Sets { key: subject.key.1, tenant: subject.tenant.1, model: subject.model.1, user: subject.user.1 };
        if subject.asks_nothing() {
            return Ok(Passed::clean(None));
        }
        match self {
            Self::Local { shares } => {
                // Budgets first: a refusal by one charges no limit; a
                // refusal by a limit drops the reservations (given back).
                let budget = match &subject.budgets {
                    None => None,
                    Some(ask) => {
                        let reserved = budget::reserve(&ask.owned(), ask.need, shares, ask.now, ask.zone)
                            .map_err(Refused::Budget)?;
                        Some(Box::new(BudgetHold::local(reserved, ask.zone)))
                    }
                };
                let mut admitted = if sets.is_empty() {
                    Admitted::default()
                } else {
                    local::admit(sets, shares, reservation, counted).map_err(Refused::Limit)?
                };
                admitted.budget = budget;
                Ok(Passed::clean(Some(admitted)))
            }
            Self::Redis(counter) => match in_redis::admit(counter, subject, reservation, counted).await {
                Ok(decision) => decision.map(|admitted| Passed::clean(Some(admitted))),
                Err(error) => on_store_failure(counter, error, Some(Admitted::default())),
            },
        }
    }
}

/// The one policy for a store that failed: closed, the request is refused;
/// open, it goes on with `when_open` (uncounted), the failure noted.
fn on_store_failure<T>(counter: &RedisCounter, error: StoreError, when_open: T) -> Result<Passed<T>, Refused> {
    if counter.config.fail_closed {
        Err(Refused::StoreFailed(error))
    } else {
        Ok(Passed { value: when_open, store_failure: Some(error.label()) })
    }
}
