//! The queue stage: a request for a model with a capacity takes its turn at
//! the model's gate (`crate::sharing`) before it goes upstream — at once
//! while the model has room, else after waiting in its fair queue, or a
//! 429 when the queue refuses it. Its class and tenant come from its key
//! (the key's `class` and namespace), never from the client; its line
//! within the tenant is its key's, or for a token its holder's own (so the
//! members of one grant take turns with one another, as keys do).

use std::time::Instant;

use super::facts::Facts;
use crate::error::GatewayError;
use crate::limit::Reservation;
use crate::per_worker::own_name;
use crate::shared::Shared;
use crate::sharing::fair_queue::Flow;
use crate::sharing::{Refused, Seat};
use crate::snapshot::{KeyEntry, Route};

/// Waits for the request's turn at `route`'s gate, if it has one, the
/// model's capacity divided among `shares` pods; returns the place it
/// takes, to hold until the request ends. Whose turn it was and how long
/// it waited are noted in `facts`, also when it is refused.
///
/// # Errors
/// [`GatewayError::ModelBusy`]: the queue was full, a higher class took
/// the request's place, or it waited `maxWait`.
pub async fn take_turn(
    route: &Route,
    (key, line): (&KeyEntry, u64),
    reservation: Reservation,
    (shared, shares): (&Shared, u32),
    facts: &mut Facts,
) -> Result<Option<Seat>, GatewayError> {
    let Some(gated) = &route.gate else { return Ok(None) };
    let tenant = &key.tenant;
    let flow = Flow {
        class: usize::from(key.class),
        tenant: tenant.fair_id,
        weight: tenant.weight,
        key: line,
        cost: reservation.tokens.max(1),
    };
    facts.tenant = Some(own_name(&tenant.namespace));
    let started = Instant::now();
    let bounds = gated.bounds(&shared.endpoints, shares);
    let entered = gated.gate.enter(flow, bounds, &gated.classes, gated.max_wait).await;
    facts.queued = Some((gated.classes.clone(), flow.class, started.elapsed()));
    match entered {
        Ok(seat) => Ok(Some(seat)),
        // The model lost its capacity meanwhile: nothing to wait for.
        Err(Refused::Closed) => Ok(None),
        Err(reason) => Err(GatewayError::ModelBusy {
            model: route.name.to_string(),
            reason,
            // Half the longest wait: the queue moves as requests end.
            retry_after: gated.max_wait.as_secs().div_ceil(2).clamp(1, 60),
        }),
    }
}
