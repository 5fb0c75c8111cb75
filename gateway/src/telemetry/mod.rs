//! Traces and usage records over OTLP/HTTP.
//!
//! ```text
//! request ─► start: traceparent (trusted?) → trace id, parent, sampled?
//!   forward ─► each attempt: a span id, `traceparent` sent upstream
//!   record ─► finish: server span + attempt spans (sampled) and the usage
//!             record (every request), encoded (what the route, key and
//!             endpoint decide copied from the worker's `fixed` parts)
//!             ─► the worker's batch (≤ 20 ms) ─► Exporter queue (bounded, try_send)
//!                                                 └─► thread: batch ─► POST /v1/traces, /v1/logs
//! ```
//!
//! Off (no endpoint in the config or the flags), a request pays one
//! branch. Every attribute comes from what the gateway decided or
//! counted: no client-controlled text but the model name the route
//! matched and the ids it logs anyway.

mod destination;
mod encode;
mod fixed;
mod gather;
mod request;
pub mod trace_context;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

pub use destination::Destination;
pub use gather::{gather_on_this_thread, send_gathered};
pub use request::{Done, RequestTrace, Upstream};
// The encoder and the exporter are waycast-otlp's (the operator sends its
// reconciles through them too); the rest of the gateway names them here.
use trace_context::SpanContext;
pub use waycast_otlp::{Counts, Exporter};

/// A gateway's telemetry: the flags' destination, and the exporter,
/// started when the first record is sent.
pub struct Telemetry {
    flags: Option<Arc<Destination>>,
    counts: Counts,
    exporter: std::sync::OnceLock<Option<Exporter>>,
}

impl Telemetry {
    pub fn new(flags: Option<Arc<Destination>>, counts: Counts) -> Self {
        Self { flags, counts, exporter: std::sync::OnceLock::new() }
    }

    /// Where this request's records go: the config's destination, else
    /// the flags'.
    pub fn destination<'a>(&'a self, configured: Option<&'a Arc<Destination>>) -> Option<&'a Arc<Destination>> {
        configured.or(self.flags.as_ref())
    }

    /// Sends what is queued, waiting at most `deadline` (on drain).
    pub fn flush(&self, deadline: Duration) {
        if let Some(Some(exporter)) = self.exporter.get() {
            exporter.flush(deadline);
        }
    }

    /// The exporter (`None` when its thread could not start: logged once).
    pub fn exporter(&self) -> Option<&Exporter> {
        self.exporter
            .get_or_init(|| {
                Exporter::start(self.counts.clone())
                    .inspect_err(|error| tracing::error!(%error, "telemetry: cannot start the exporter"))
                    .ok()
            })
            .as_ref()
    }
}

static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
static TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// A request's `traceparent` when it has exactly one (two: a trace of its
/// own, as the recommendation says). A request has a few headers, and
/// comparing their names (a standard one differs at once) costs less than
/// hashing this one for the map's lookup: the lookup is left to requests
/// that have one, and to long lists.
fn only_traceparent(headers: &HeaderMap) -> Option<&http::HeaderValue> {
    const SCANNED: usize = 16;
    if headers.len() <= SCANNED && !headers.keys().any(|name| name == TRACEPARENT) {
        return None;
    }
    let mut values = headers.get_all(&TRACEPARENT).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => Some(value),
        _ => None,
    }
}

/// The trace a request starts (or continues), when telemetry is on.
pub fn start(destination: Option<&Arc<Destination>>, headers: &HeaderMap) -> Option<Box<RequestTrace>> {
    let destination = destination?;
    // Not looked up when the client is not trusted.
    let parent = destination.trust_client.then(|| only_traceparent(headers)).flatten();
    let parent = parent.and_then(|value| trace_context::parse_traceparent(value.as_bytes()));
    // Several tracestate headers are one list.
    let state = parent.and_then(|_| {
        let mut values = headers.get_all(&TRACESTATE).iter();
        let first = values.next()?;
        let mut joined = first.as_bytes().to_vec();
        for value in values {
            joined.push(b',');
            joined.extend_from_slice(value.as_bytes());
        }
        trace_context::usable_trace_state(&joined).map(str::to_owned)
    });
    let trace_id = parent.map_or_else(trace_context::new_trace_id, |p| p.trace_id);
    // The platform's ratio decides unless the Gateway lets the client's
    // flag: a client that sets it on every request would otherwise have
    // each one recorded and exported. NB: a continued trace's id is the
    // client's choice, and the ratio reads its last bytes, so a client
    // could pick ids that always fall under it: a continued trace is drawn
    // on an id of our own instead.
    let sampled = match parent {
        Some(parent) if destination.honor_client_sampling => parent.sampled,
        Some(_) => trace_context::sampled_at(destination.sampling, &trace_context::new_trace_id()),
        None => trace_context::sampled_at(destination.sampling, &trace_id),
    };
    Some(Box::new(RequestTrace {
        destination: destination.clone(),
        context: SpanContext { trace_id, span_id: trace_context::new_span_id(), sampled },
        parent: parent.map(|p| p.span_id),
        state,
        attempts: smallvec::SmallVec::new(),
    }))
}

/// Sends what the request leaves: its spans when sampled, its usage record
/// when usage logs are on.
pub fn finish(trace: &RequestTrace, done: &Done<'_>, exporter: &Exporter) {
    if let Some(item) = encode::encoded(trace, done) {
        gather::send(exporter, &trace.destination.export, item);
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
