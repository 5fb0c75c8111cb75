//! One request's trace as the request path holds it: its context, its
//! upstream attempts, and what it was once it ended. A leaf: the encoder
//! and the rest of `telemetry` read it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::destination::Destination;
use super::trace_context::{self, SpanContext};

/// One request's trace, from its start to its record.
pub struct RequestTrace {
    pub destination: Arc<Destination>,
    /// The request's own (server) span.
    pub context: SpanContext,
    /// The client's span it continues.
    pub parent: Option<[u8; 8]>,
    /// The client's `tracestate`, passed on.
    pub state: Option<String>,
    /// Each upstream attempt, in order (nearly every request makes one:
    /// held inline, not allocated).
    pub attempts: smallvec::SmallVec<[Attempt; 1]>,
}

/// One upstream attempt (a child span).
pub struct Attempt {
    pub span_id: [u8; 8],
    /// When its request was sent.
    pub started: Instant,
    /// When its response head came, or it failed.
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
    /// Its span, in the request's trace.
    pub span: SpanContext,
    /// The client's trace is continued: its `baggage` goes upstream too.
    pub trusted: bool,
    pub tracestate: Option<http::HeaderValue>,
}

impl Upstream {
    /// The `traceparent` header line (hex digits and dashes: always a
    /// valid value), written into the request head as it is: no
    /// `HeaderValue` to check and allocate for each attempt.
    pub fn traceparent_line(&self) -> [u8; 70] {
        let mut line = [0; 70];
        line[..13].copy_from_slice(b"traceparent: ");
        line[13..68].copy_from_slice(&self.span.traceparent_bytes());
        line[68..].copy_from_slice(b"\r\n");
        line
    }
}

impl RequestTrace {
    /// A new attempt's span and headers.
    pub fn begin_attempt(&self) -> Upstream {
        Upstream {
            span: SpanContext { span_id: trace_context::new_span_id(), ..self.context },
            trusted: self.parent.is_some() && self.destination.trust_client,
            tracestate: self.state.as_deref().and_then(|state| http::HeaderValue::from_str(state).ok()),
        }
    }

    /// The attempt `begun` at `endpoint`, from its request sent to its
    /// answer or failure (`started`, `ended`: the clock readings the
    /// forwarding path takes anyway), with a response's `status`, or an
    /// `error`.
    pub fn end_attempt(
        &mut self,
        begun: Upstream,
        endpoint: http::uri::Authority,
        (started, ended): (Instant, Instant),
        status: Option<u16>,
        error: Option<&'static str>,
    ) {
        self.attempts.push(Attempt {
            span_id: begun.span.span_id,
            started,
            ended,
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

/// What the request was, once it ended: the record's fields.
pub struct Done<'a> {
    /// The wall clock at `ended`, since the Unix epoch.
    pub wall: Duration,
    pub ended: Instant,
    /// From its start to `ended` (the durations the metrics took, not
    /// taken again).
    pub took: Duration,
    /// From its start to its first byte out.
    pub first_byte: Option<Duration>,
    pub path: &'a str,
    pub request_id: &'a str,
    /// The worker's own copies of the names (what its encoded fixed parts
    /// are found by).
    pub model: &'a Arc<str>,
    pub key: &'a Arc<str>,
    /// Who a verified token names (`user.id`); its grant is `key`.
    pub user: Option<&'a str>,
    /// Who the client says its end user is (`waycast.client_user`,
    /// unverified).
    pub client_user: Option<&'a str>,
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

/// The GenAI operation a path is (its API's, `crate::dialect::APIS`).
pub fn operation(path: &str) -> &'static str {
    crate::dialect::api_at(path).map_or("other", |index| crate::dialect::APIS[index].operation)
}
