//! One request's bookkeeping, from its first byte to its last: created
//! when the request arrives, ended exactly once — by the handler for an
//! error or the gateway's own answer, by the relay when a relayed body ends,
//! or on drop when the client left first. The end is two steps:
//!
//! ```text
//! Exchange::end ─► limit::settle(Held, Ended) ─► Settled   charge, seat, budgets, key's month, cost
//!               ─► report(Facts, End, Settled)              series, span, access line, usage record
//! ```
//!
//! What the stages decided is the request's [`Facts`]; what it holds until
//! it ends (and what settling needs) its [`Held`]; how it ended its
//! [`Outcome`] (`facts.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::connection::ConnectionActivity;
use super::facts::{Asked, Facts, Outcome, Tally};
use crate::error::GatewayError;
use crate::limit::{Ending, Held, Wall};
use crate::shared::WorkerShared;

/// Status logged when the client left before the response was complete
/// (as nginx does).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

/// One request's bookkeeping, from its first byte to its last.
pub struct Exchange {
    shared: Arc<WorkerShared>,
    activity: Arc<ConnectionActivity>,
    asked: Asked,
    /// What the request holds until it ends, settled when it does.
    pub held: Held,
    /// What the pipeline decided, reported when the request ends.
    pub facts: Facts,
    finished: bool,
}

impl Exchange {
    /// Starts the bookkeeping of a request (counts it in flight).
    pub fn new(shared: Arc<WorkerShared>, activity: Arc<ConnectionActivity>, asked: Asked) -> Self {
        shared.metrics.inflight.inc();
        activity.began();
        Self { shared, activity, asked, held: Held::default(), facts: Facts::default(), finished: false }
    }

    /// Ends the request: settles it, then reports it.
    pub fn finish(mut self, outcome: Outcome) {
        self.end(&outcome);
    }

    /// Ends a request answered without a body of the upstream's: the
    /// gateway's own answer (`error` None) or an error.
    pub fn finish_without_body(mut self, status: u16, error: Option<&GatewayError>) {
        if let Some(tally) = error.and_then(Tally::of_error) {
            self.facts.tallies.note(tally);
        }
        let outcome = Outcome {
            status,
            bytes: 0,
            events: None,
            first_byte: None,
            upstream: None,
            usage: None,
            error: error.map(GatewayError::code),
            ended: None,
            // The first-byte timeout closes a request the upstream may be
            // generating: it finishes and bills it all the same.
            ending: match error {
                Some(GatewayError::UpstreamTimeout(_)) => Ending::Unfinished,
                _ => Ending::Unserved,
            },
        };
        self.end(&outcome);
    }

    /// The end, exactly once: out of flight, then `settle` (the request's
    /// accounts, `crate::limit`), then `report` (its metrics, span, access
    /// line and usage record, from its facts and what was settled).
    fn end(&mut self, outcome: &Outcome) {
        if self.finished {
            return;
        }
        self.finished = true;
        let ended = outcome.ended.unwrap_or_else(Instant::now);
        self.activity.ended(ended);
        self.shared.metrics.inflight.dec();
        // The wall clock, read once for the key's month and the report.
        let wall = Wall::default();
        let settled = crate::limit::settle(&self.held, outcome.for_accounts(), &wall);
        let endpoint = self.held.endpoint.as_ref().map(|in_flight| in_flight.endpoint().address);
        let end = super::report::End { outcome, at: ended, wall: &wall, endpoint };
        super::report::report(&self.shared, &self.asked, &self.facts, &end, &settled);
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // The response future was dropped before a response existed: the
        // client went away while we waited on the upstream.
        if !self.finished {
            let outcome = Outcome {
                status: CLIENT_CLOSED_REQUEST,
                bytes: 0,
                events: None,
                first_byte: None,
                upstream: None,
                usage: None,
                error: Some("client_closed"),
                ended: None,
                // Left before the answer's head: a request the upstream
                // was handed may be finished and billed whole.
                ending: if self.facts.forwarded { Ending::Unfinished } else { Ending::Unserved },
            };
            self.end(&outcome);
        }
    }
}
