//! Traces and usage records over OTLP/HTTP.
//!
//! ```text
//! request ─► start: traceparent (trusted?) → trace id, parent, sampled?
//!   forward ─► each attempt: a span id, `traceparent` sent upstream
//!   record ─► finish: server span + attempt spans (sampled) and the usage
//!             record (every request) ─► Exporter queue (bounded, try_send)
//!                                        └─► thread: batch ─► POST /v1/traces, /v1/logs
//! ```
//!
//! Off (no endpoint in the config or the flags), a request pays one
//! branch. Every attribute comes from what the gateway decided or
//! counted: no client-controlled text but the model name the route
//! matched and the ids it logs anyway.

mod destination;
pub mod trace_context;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;

pub use destination::Destination;
// The encoder and the exporter are waycast-otlp's (the operator sends its
// reconciles through them too); the rest of the gateway names them here.
use otlp::{Attributes, RecordHead, SpanHead, SpanKind};
use trace_context::SpanContext;
pub use waycast_otlp::proto as otlp;
pub use waycast_otlp::{Counts, Exporter, Item};

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

/// One request's trace, from its start to its record.
pub struct RequestTrace {
    pub destination: Arc<Destination>,
    /// The request's own (server) span.
    pub context: SpanContext,
    /// The client's span it continues.
    pub parent: Option<[u8; 8]>,
    /// The client's `tracestate`, passed on.
    pub state: Option<String>,
    /// Each upstream attempt, in order.
    pub attempts: Vec<Attempt>,
}

/// One upstream attempt (a child span).
pub struct Attempt {
    pub span_id: [u8; 8],
    pub started: Instant,
    pub ended: Instant,
    /// `host:port` tried.
    pub endpoint: http::uri::Authority,
    /// The status it answered, if it did.
    pub status: Option<u16>,
    /// Why it failed, if it did.
    pub error: Option<&'static str>,
    /// Why another attempt followed it, if one did.
    pub retried: Option<&'static str>,
}

/// An attempt begun: its span, and the headers that make it the
/// upstream's parent.
pub struct Upstream {
    pub span_id: [u8; 8],
    pub started: Instant,
    /// The client's trace is continued: its `baggage` goes upstream too.
    pub trusted: bool,
    pub traceparent: http::HeaderValue,
    pub tracestate: Option<http::HeaderValue>,
}

impl RequestTrace {
    /// A new attempt's span and headers.
    pub fn begin_attempt(&self) -> Upstream {
        let span_id = trace_context::new_span_id();
        let traceparent = SpanContext { span_id, ..self.context }.traceparent_bytes();
        Upstream {
            span_id,
            started: Instant::now(),
            trusted: self.parent.is_some() && self.destination.trust_client,
            // Hex and dashes: always a valid header value.
            traceparent: http::HeaderValue::from_bytes(&traceparent).unwrap_or(http::HeaderValue::from_static("")),
            tracestate: self.state.as_deref().and_then(|state| http::HeaderValue::from_str(state).ok()),
        }
    }

    /// The attempt `begun` at `endpoint` ended now: with a response's
    /// `status`, or an `error`.
    pub fn end_attempt(
        &mut self,
        begun: Upstream,
        endpoint: http::uri::Authority,
        status: Option<u16>,
        error: Option<&'static str>,
    ) {
        self.attempts.push(Attempt {
            span_id: begun.span_id,
            started: begun.started,
            ended: Instant::now(),
            endpoint,
            status,
            error,
            retried: None,
        });
    }

    /// Another attempt follows the last one, for `reason`.
    pub fn note_retry(&mut self, reason: &'static str) {
        if let Some(last) = self.attempts.last_mut() {
            last.retried = Some(reason);
        }
    }
}

static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
static TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// The trace a request starts (or continues), when telemetry is on.
pub fn start(destination: Option<&Arc<Destination>>, headers: &HeaderMap) -> Option<Box<RequestTrace>> {
    let destination = destination?;
    let mut parents = headers.get_all(&TRACEPARENT).iter();
    // Two traceparent headers: a trace of its own, as the recommendation says.
    let parent = match (parents.next(), parents.next()) {
        (Some(value), None) if destination.trust_client => trace_context::parse_traceparent(value.as_bytes()),
        _ => None,
    };
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
    let sampled = parent.map_or_else(|| trace_context::sampled_at(destination.sampling, &trace_id), |p| p.sampled);
    Some(Box::new(RequestTrace {
        destination: destination.clone(),
        context: SpanContext { trace_id, span_id: trace_context::new_span_id(), sampled },
        parent: parent.map(|p| p.span_id),
        state,
        attempts: Vec::new(),
    }))
}

/// What the request was, once it ended: the record's fields.
pub struct Done<'a> {
    /// The wall clock at `ended`, since the Unix epoch.
    pub wall: Duration,
    pub started: Instant,
    pub ended: Instant,
    pub first_byte: Option<Instant>,
    pub path: &'a str,
    pub request_id: &'a str,
    pub model: &'a str,
    pub key: &'a str,
    pub tenant: Option<&'a str>,
    pub class: Option<&'a str>,
    pub queued: Option<Duration>,
    pub stream: bool,
    pub status: u16,
    pub error: Option<&'a str>,
    /// (prompt, cached, completion).
    pub tokens: (u64, u64, u64),
    pub max_tokens: Option<u64>,
    /// Decimal text and currency.
    pub cost: Option<(String, &'a str)>,
    /// Whether budgets were reserved for it.
    pub budgeted: bool,
    /// Whether it was routed to a model (else it has no usage record).
    pub routed: bool,
}

impl Done<'_> {
    /// Nanoseconds since the Unix epoch of `at` (at or before `ended`).
    fn unix_nanos(&self, at: Instant) -> u64 {
        let wall = u64::try_from(self.wall.as_nanos()).unwrap_or(u64::MAX);
        let before = u64::try_from(self.ended.saturating_duration_since(at).as_nanos()).unwrap_or(u64::MAX);
        wall.saturating_sub(before)
    }
}

/// The GenAI operation a path is.
pub fn operation(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" | "/v1/responses" | "/v1/messages" => "chat",
        "/v1/completions" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "other",
    }
}

/// Sends what the request leaves: its spans when sampled, its usage record
/// when usage logs are on.
pub fn finish(trace: &RequestTrace, done: &Done<'_>, exporter: &Exporter) {
    if let Some(item) = encoded(trace, done) {
        exporter.send(&trace.destination.export, item);
    }
}

/// What [`finish`] sends, encoded: `None` when nothing is.
fn encoded(trace: &RequestTrace, done: &Done<'_>) -> Option<Item> {
    let mut item = Item::default();
    if trace.context.sampled {
        item.spans = Vec::with_capacity(1024);
        server_span(&mut item.spans, trace, done);
        for attempt in &trace.attempts {
            attempt_span(&mut item.spans, trace, attempt, done);
        }
        item.span_count = 1 + trace.attempts.len();
    }
    // A request that never reached a model used nothing: no usage record.
    if trace.destination.usage_logs && done.routed {
        item.records = Vec::with_capacity(512);
        let traced = trace.context.sampled.then_some((&trace.context.trace_id, &trace.context.span_id));
        let backend = trace.attempts.last().map(|attempt| attempt.endpoint.as_str());
        usage_record(&mut item.records, done, traced, backend);
    }
    (!item.spans.is_empty() || !item.records.is_empty()).then_some(item)
}

fn server_span(out: &mut Vec<u8>, trace: &RequestTrace, done: &Done<'_>) {
    let operation = operation(done.path);
    let first_token = done.first_byte.map(|at| [(done.unix_nanos(at), "gen_ai.first_token")]);
    let head = SpanHead {
        trace_id: &trace.context.trace_id,
        span_id: &trace.context.span_id,
        parent_span_id: trace.parent.as_ref(),
        trace_state: trace.state.as_deref(),
        name: (operation, done.model),
        kind: SpanKind::Server,
        start_unix_nanos: done.unix_nanos(done.started),
        end_unix_nanos: done.unix_nanos(done.ended),
        events: first_token.as_ref().map_or(&[], |event| event.as_slice()),
        error: done.error.filter(|_| done.status >= 500 || done.status == 0),
    };
    otlp::span(out, &head, |attributes| {
        attributes.text("gen_ai.operation.name", operation);
        attributes.text("gen_ai.provider.name", "waycast");
        attributes.text("gen_ai.request.model", done.model);
        attributes.text("gen_ai.response.model", done.model);
        attributes.int("gen_ai.usage.input_tokens", done.tokens.0);
        attributes.int("gen_ai.usage.output_tokens", done.tokens.2);
        if done.tokens.1 > 0 {
            attributes.int("gen_ai.usage.cache_read.input_tokens", done.tokens.1);
        }
        if let Some(max) = done.max_tokens {
            attributes.int("gen_ai.request.max_tokens", max);
        }
        attributes.int("http.response.status_code", u64::from(done.status));
        attributes.text("waycast.request_id", done.request_id);
        attributes.text("waycast.key", done.key);
        attributes.flag("waycast.stream", done.stream);
        if let Some(tenant) = done.tenant {
            attributes.text("waycast.tenant", tenant);
        }
        if let Some(class) = done.class {
            attributes.text("waycast.class", class);
        }
        if let Some(waited) = done.queued {
            attributes.double("waycast.queue_wait_seconds", waited.as_secs_f64());
        }
        if done.budgeted {
            attributes.text("waycast.budget", "reserved");
        }
        cost_and_error(attributes, done);
    });
}

fn cost_and_error(attributes: &mut Attributes<'_>, done: &Done<'_>) {
    if let Some((cost, currency)) = &done.cost {
        attributes.text("waycast.cost", cost);
        attributes.text("waycast.currency", currency);
    }
    if let Some(error) = done.error {
        attributes.text("error.type", error);
    }
}

fn attempt_span(out: &mut Vec<u8>, trace: &RequestTrace, attempt: &Attempt, done: &Done<'_>) {
    let operation = operation(done.path);
    let head = SpanHead {
        trace_id: &trace.context.trace_id,
        span_id: &attempt.span_id,
        parent_span_id: Some(&trace.context.span_id),
        trace_state: trace.state.as_deref(),
        name: (operation, done.model),
        kind: SpanKind::Client,
        start_unix_nanos: done.unix_nanos(attempt.started),
        end_unix_nanos: done.unix_nanos(attempt.ended),
        events: &[],
        error: attempt.error,
    };
    // `host:port` (an address in brackets for IPv6), as picked.
    let (address, port) = attempt.endpoint.as_str().rsplit_once(':').unwrap_or((attempt.endpoint.as_str(), ""));
    otlp::span(out, &head, |attributes| {
        attributes.text("gen_ai.operation.name", operation);
        attributes.text("server.address", address.trim_start_matches('[').trim_end_matches(']'));
        if let Some(port) = crate::json_text::non_negative_integer(port.as_bytes()) {
            attributes.int("server.port", port);
        }
        if let Some(status) = attempt.status {
            attributes.int("http.response.status_code", u64::from(status));
        }
        if let Some(error) = attempt.error {
            attributes.text("error.type", error);
        }
        if let Some(reason) = attempt.retried {
            attributes.text("waycast.retry_reason", reason);
        }
    });
}

/// The usage record: the access line's fields, as a log record.
fn usage_record(out: &mut Vec<u8>, done: &Done<'_>, traced: Option<(&[u8; 16], &[u8; 8])>, backend: Option<&str>) {
    let head = RecordHead {
        time_unix_nanos: done.unix_nanos(done.ended),
        event_name: "waycast.usage",
        body: done.request_id,
        trace: traced,
    };
    otlp::record(out, &head, |attributes| {
        attributes.text("waycast.request_id", done.request_id);
        attributes.text("waycast.key", done.key);
        attributes.text("gen_ai.request.model", done.model);
        attributes.int("http.response.status_code", u64::from(done.status));
        attributes.int("gen_ai.usage.input_tokens", done.tokens.0);
        attributes.int("gen_ai.usage.output_tokens", done.tokens.2);
        if done.tokens.1 > 0 {
            attributes.int("gen_ai.usage.cache_read.input_tokens", done.tokens.1);
        }
        attributes.double("waycast.duration_seconds", done.ended.saturating_duration_since(done.started).as_secs_f64());
        if let Some(backend) = backend {
            attributes.text("waycast.backend", backend);
        }
        if let Some(first) = done.first_byte {
            let seconds = first.saturating_duration_since(done.started).as_secs_f64();
            attributes.double("waycast.time_to_first_token_seconds", seconds);
        }
        cost_and_error(attributes, done);
    });
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
