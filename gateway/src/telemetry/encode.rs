//! A finished request's spans and usage record, encoded where it ends.
//!
//! What its operation, model, key and endpoint alone decide comes from the
//! worker's [`fixed`](super::fixed) parts, copied in; the rest (ids,
//! times, counts, the request id) is written per request. The copied
//! parts come first: the order of a message's fields and attributes means
//! nothing to a protobuf reader.

use std::time::{Duration, Instant};

use waycast_otlp::Item;
use waycast_otlp::proto::{self as otlp, Attributes, RecordHead, SpanHead, SpanKind};

use super::fixed::{self, Fixed};
use super::request::{Attempt, Done, RequestTrace};
use super::trace_context;

/// Instants as Unix nanoseconds: the wall clock is read once, at `ended`,
/// and every other instant placed by its distance from it.
struct Clock {
    ended: Instant,
    /// `ended`, since the Unix epoch.
    end: u64,
}

impl Clock {
    /// Nanoseconds since the Unix epoch of `at` (at or before `ended`).
    fn unix_nanos(&self, at: Instant) -> u64 {
        self.end.saturating_sub(nanos(self.ended.saturating_duration_since(at)))
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The request's own times, as Unix nanoseconds, from the durations the
/// metrics took (no `Instant` subtraction of their own: each is some 50
/// instructions).
struct Times {
    started: u64,
    ended: u64,
    first_byte: Option<u64>,
}

/// What `telemetry::finish` sends, encoded: `None` when nothing is.
pub(super) fn encoded(trace: &RequestTrace, done: &Done<'_>) -> Option<Item> {
    let sampled = trace.context.sampled;
    // A request that never reached a model used nothing: no usage record.
    let recorded = trace.destination.usage_logs && done.routed;
    if !sampled && !recorded {
        return None;
    }
    let clock = Clock { ended: done.ended, end: nanos(done.wall) };
    let started = clock.end.saturating_sub(nanos(done.took));
    let times = Times {
        started,
        ended: clock.end,
        first_byte: done.first_byte.map(|after| started.saturating_add(nanos(after))),
    };
    let operation = super::request::operation(done.path);
    let backend = trace.attempts.last().map(|attempt| &attempt.endpoint);
    let mut item = Item::default();
    fixed::with(operation, done.model, done.key, backend, |fixed| {
        if sampled {
            item.spans = Vec::with_capacity(1024);
            server_span(&mut item.spans, trace, done, &times, fixed);
            for attempt in &trace.attempts {
                attempt_span(&mut item.spans, trace, attempt, &clock, fixed);
            }
            item.span_count = 1 + trace.attempts.len();
        }
        if recorded {
            item.records = Vec::with_capacity(512);
            let traced = sampled.then_some((&trace.context.trace_id, &trace.context.span_id));
            usage_record(&mut item.records, done, &times, traced, fixed);
        }
    });
    Some(item)
}

fn server_span(out: &mut Vec<u8>, trace: &RequestTrace, done: &Done<'_>, times: &Times, fixed: &Fixed) {
    let first_token = times.first_byte.map(|at| [(at, "gen_ai.first_token")]);
    let head = SpanHead {
        trace_id: &trace.context.trace_id,
        span_id: &trace.context.span_id,
        parent_span_id: trace.parent.as_ref(),
        // NB: the client's `tracestate` is passed upstream, never written
        // into our spans (its text would reach the platform's collector).
        trace_state: None,
        name: (fixed.operation(), done.model),
        kind: SpanKind::Server,
        start_unix_nanos: times.started,
        end_unix_nanos: times.ended,
        events: first_token.as_ref().map_or(&[], |event| event.as_slice()),
        error: done.error.filter(|_| done.status >= 500 || done.status == 0),
    };
    otlp::span(out, &head, |attributes| {
        // gen_ai.operation.name, .provider.name, .request.model,
        // .response.model, waycast.key.
        attributes.encoded(fixed.server());
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
        identity(attributes, done);
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

/// A token's holder as `user.id` and the grant that served them as
/// `waycast.grant` (`namespace/name`; also its `waycast.key`); who the
/// client says its user is, unverified, as `waycast.client_user`.
#[inline(always)]
fn identity(attributes: &mut Attributes<'_>, done: &Done<'_>) {
    if let Some(user) = done.user {
        attributes.text("user.id", user);
        attributes.text("waycast.grant", done.key);
    }
    if let Some(said) = done.client_user {
        attributes.text("waycast.client_user", said);
    }
}

#[inline(always)]
fn cost_and_error(attributes: &mut Attributes<'_>, done: &Done<'_>) {
    if let Some((cost, currency)) = &done.cost {
        attributes.text("waycast.cost", cost);
        attributes.text("waycast.currency", currency);
    }
    if let Some(error) = done.error {
        attributes.text("error.type", error);
    }
}

fn attempt_span(out: &mut Vec<u8>, trace: &RequestTrace, attempt: &Attempt, clock: &Clock, fixed: &Fixed) {
    let head = SpanHead {
        trace_id: &trace.context.trace_id,
        span_id: &attempt.span_id,
        parent_span_id: Some(&trace.context.span_id),
        // NB: the client's `tracestate` is passed upstream, never written
        // into our spans (its text would reach the platform's collector).
        trace_state: None,
        name: (fixed.operation(), fixed.model()),
        kind: SpanKind::Client,
        start_unix_nanos: clock.unix_nanos(attempt.started),
        end_unix_nanos: clock.unix_nanos(attempt.ended),
        events: &[],
        error: attempt.error,
    };
    otlp::span(out, &head, |attributes| {
        // gen_ai.operation.name, server.address, server.port: the fixed
        // parts hold them for the endpoint that answered last.
        match fixed.attempt(&attempt.endpoint) {
            Some(encoded) => attributes.encoded(encoded),
            None => fixed::endpoint_attributes(attributes, fixed.operation(), &attempt.endpoint),
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
fn usage_record(
    out: &mut Vec<u8>,
    done: &Done<'_>,
    times: &Times,
    traced: Option<(&[u8; 16], &[u8; 8])>,
    fixed: &Fixed,
) {
    let record_id = trace_context::new_record_id();
    // Hex digits only: always UTF-8.
    let record_id = std::str::from_utf8(&record_id).unwrap_or_default();
    let head = RecordHead { time_unix_nanos: times.ended, event_name: "waycast.usage", body: record_id, trace: traced };
    otlp::record(out, &head, |attributes| {
        // waycast.key, gen_ai.request.model, waycast.backend (the endpoint
        // that answered last, when one was tried).
        attributes.encoded(fixed.record());
        attributes.text("waycast.request_id", done.request_id);
        identity(attributes, done);
        attributes.int("http.response.status_code", u64::from(done.status));
        attributes.int("gen_ai.usage.input_tokens", done.tokens.0);
        attributes.int("gen_ai.usage.output_tokens", done.tokens.2);
        if done.tokens.1 > 0 {
            attributes.int("gen_ai.usage.cache_read.input_tokens", done.tokens.1);
        }
        attributes.double("waycast.duration_seconds", done.took.as_secs_f64());
        if let Some(first) = done.first_byte {
            attributes.double("waycast.time_to_first_token_seconds", first.as_secs_f64());
        }
        cost_and_error(attributes, done);
    });
}
