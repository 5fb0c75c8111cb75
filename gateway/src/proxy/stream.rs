//! The response relay: upstream frames go to the client as they arrive,
//! one for one — no buffering, no re-chunking — while the idle timeout
//! watches the gaps and the usage tap keeps references for later.
//!
//! Each request's bookkeeping (`Exchange`) is finished exactly once: when the
//! body ends, when the upstream breaks or idles out, or — if the client goes
//! away — when hyper drops the body, which also drops the upstream body and
//! so cancels the upstream request.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use super::sse::UsageChunkFilter;
use super::usage::{Usage, UsageTap};
use crate::Shared;

/// The error a relayed body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream sent nothing for longer than the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream idle for longer than {0:?}")]
pub struct IdleTimeout(pub Duration);

/// Status logged when the client left before the response was complete
/// (as nginx does).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

/// A response body: either the gateway's own or a relayed upstream body.
#[allow(
    clippy::large_enum_variant,
    reason = "Relay is the common case; boxing it would cost an allocation per request"
)]
pub enum ProxyBody {
    /// A body the gateway produced (errors, `/v1/models`).
    Full(Option<Bytes>),
    /// An upstream body being relayed.
    Relay(RelayBody),
}

impl From<Bytes> for ProxyBody {
    fn from(bytes: Bytes) -> Self {
        ProxyBody::Full(Some(bytes))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ProxyBody::Relay(relay) => Pin::new(relay).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(data) => data.is_none(),
            ProxyBody::Relay(relay) => relay.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(data)) => SizeHint::with_exact(data.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Relay(relay) => relay.inner.size_hint(),
        }
    }
}

/// One request's bookkeeping: metrics and the access log line.
pub struct Exchange {
    shared: Arc<Shared>,
    started: Instant,
    method: Method,
    path: &'static str,
    request_id: HeaderValue,
    /// Configured model name, once known.
    pub model: Option<Arc<str>>,
    /// Key id, once known.
    pub key: Option<Arc<str>>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Log this request (the config's `accessLog`).
    pub access_log: bool,
    /// Gateway time before the upstream was asked.
    pub overhead_before: Duration,
    /// Token limits to charge with the response's usage.
    pub charge: Option<crate::limit::Charge>,
    activity: Arc<ConnectionActivity>,
    finished: bool,
}

/// One client connection's requests: how many are in flight (until their
/// response has ended) and when the last one ended, for the idle timeout.
#[derive(Debug)]
pub struct ConnectionActivity {
    started: AtomicBool,
    active: AtomicUsize,
    /// Nanoseconds on [`crate::limit::now_nanos`]'s clock.
    last_end: AtomicU64,
}

impl Default for ConnectionActivity {
    fn default() -> Self {
        Self {
            started: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(crate::limit::now_nanos()),
        }
    }
}

impl ConnectionActivity {
    fn began(&self) {
        self.started.store(true, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a request has begun on the connection.
    pub fn has_started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    fn ended(&self) {
        self.last_end.store(crate::limit::now_nanos(), Ordering::Relaxed);
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    /// How long the connection has had no request in flight (zero while it has one).
    pub fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(crate::limit::now_nanos().saturating_sub(self.last_end.load(Ordering::Relaxed)))
    }
}

/// How a request ended.
pub struct Outcome {
    /// Status sent (or [`CLIENT_CLOSED_REQUEST`]).
    pub status: u16,
    /// Response body bytes relayed.
    pub bytes: u64,
    /// When the first body byte went out.
    pub first_byte: Option<Instant>,
    /// Upstream time: request sent → response headers.
    pub upstream: Option<Duration>,
    /// Tokens the response reported.
    pub usage: Option<Usage>,
    /// Why it ended, if not normally.
    pub error: Option<&'static str>,
}

impl Exchange {
    /// Starts the bookkeeping of a request (counts it in flight).
    pub fn new(
        shared: Arc<Shared>,
        activity: Arc<ConnectionActivity>,
        started: Instant,
        method: Method,
        path: &'static str,
        request_id: HeaderValue,
    ) -> Self {
        shared.metrics.inflight.inc();
        activity.began();
        Self {
            shared,
            activity,
            started,
            method,
            path,
            request_id,
            model: None,
            key: None,
            stream: false,
            access_log: true,
            overhead_before: Duration::ZERO,
            charge: None,
            finished: false,
        }
    }

    /// Records the request: metrics, then one access log line.
    pub fn finish(mut self, outcome: Outcome) {
        self.record(&outcome);
    }

    fn record(&mut self, outcome: &Outcome) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.activity.ended();
        let metrics = &self.shared.metrics;
        metrics.inflight.dec();
        let model = self.model.as_deref().unwrap_or("unknown");
        let key = self.key.as_deref().unwrap_or("none");
        let elapsed = self.started.elapsed();
        let mut code_buffer = itoa_buffer();
        let code = format_status(&mut code_buffer, outcome.status);
        metrics.requests.with_label_values(&[model, key, code]).inc();
        if self.model.is_some() {
            metrics.request_duration.with_label_values(&[model]).observe(elapsed.as_secs_f64());
            if let Some(first_byte) = outcome.first_byte {
                metrics
                    .time_to_first_byte
                    .with_label_values(&[model])
                    .observe((first_byte - self.started).as_secs_f64());
            }
        }
        if let Some(usage) = outcome.usage {
            metrics.tokens.with_label_values(&[model, key, "prompt"]).inc_by(usage.prompt);
            metrics.tokens.with_label_values(&[model, key, "completion"]).inc_by(usage.completion);
        }
        if let Some(charge) = &self.charge {
            // What was served is charged: a response that went out (whole,
            // or until the client left) by its usage or an estimate; one the
            // upstream refused or never sent, nothing.
            let served = (200..300).contains(&outcome.status) || outcome.status == CLIENT_CLOSED_REQUEST;
            let used = if served {
                charge.reservation.used(outcome.usage.map(|u| (u.prompt, u.completion)), outcome.bytes)
            } else {
                0
            };
            charge.settle(used);
            metrics.rate_limit_tokens.with_label_values(&[model, key]).inc_by(used);
        }
        if self.access_log && crate::access_log::enabled() {
            let usage = outcome.usage.unwrap_or_default();
            let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            crate::access_log::record(&crate::access_log::AccessLine {
                at: std::time::SystemTime::now(),
                request_id: self.request_id.to_str().unwrap_or("-"),
                method: self.method.as_str(),
                path: self.path,
                model,
                key,
                stream: self.stream,
                status: outcome.status,
                bytes: outcome.bytes,
                duration_us: micros(elapsed),
                upstream_us: outcome.upstream.map_or(0, micros),
                prompt_tokens: usage.prompt,
                completion_tokens: usage.completion,
                error: outcome.error,
            });
        }
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
                first_byte: None,
                upstream: None,
                usage: None,
                error: Some("client_closed"),
            };
            self.record(&outcome);
        }
    }
}

fn itoa_buffer() -> [u8; 3] {
    [b'0'; 3]
}

fn format_status(buffer: &mut [u8; 3], status: u16) -> &str {
    let status = status.min(999);
    buffer[0] = b'0' + u8::try_from(status / 100).unwrap_or(0);
    buffer[1] = b'0' + u8::try_from(status / 10 % 10).unwrap_or(0);
    buffer[2] = b'0' + u8::try_from(status % 10).unwrap_or(0);
    std::str::from_utf8(buffer).unwrap_or("000")
}

/// What the relay does about the response's token usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageWatch {
    /// Nothing (error responses).
    Off,
    /// Reads it as it goes by.
    Tap,
    /// Reads it and takes the usage-only chunk out of the stream (the
    /// gateway asked for it; the client did not).
    TapAndStripChunk,
}

/// Relays an upstream body.
pub struct RelayBody {
    inner: Incoming,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
    /// When the upstream last sent a frame. The idle timer is moved to
    /// `last_frame + idle_timeout` only when it fires, not on every chunk:
    /// re-arming a timer per chunk was a measurable share of a stream's cost.
    last_frame: tokio::time::Instant,
    tap: Option<UsageTap>,
    /// Takes out the usage chunk the gateway asked for on the client's behalf.
    strip: Option<UsageChunkFilter>,
    exchange: Option<Exchange>,
    status: u16,
    bytes: u64,
    first_byte: Option<Instant>,
    upstream: Duration,
    returned_at: Instant,
    headers_at: Instant,
}

impl RelayBody {
    /// Wraps `inner`; `exchange` is finished when the relay ends.
    pub fn new(
        inner: Incoming,
        exchange: Exchange,
        status: u16,
        idle_timeout: Duration,
        usage: UsageWatch,
        upstream: Duration,
        headers_at: Instant,
    ) -> Self {
        Self {
            inner,
            idle_timeout,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            last_frame: tokio::time::Instant::now(),
            tap: (usage != UsageWatch::Off).then(UsageTap::default),
            strip: (usage == UsageWatch::TapAndStripChunk).then(UsageChunkFilter::default),
            exchange: Some(exchange),
            status,
            bytes: 0,
            first_byte: None,
            upstream,
            returned_at: Instant::now(),
            headers_at,
        }
    }

    fn count_upstream_error(&self, reason: &str) {
        if let Some(exchange) = &self.exchange
            && let Some(model) = &exchange.model
        {
            exchange.shared.metrics.upstream_errors.with_label_values(&[model, reason]).inc();
        }
    }

    fn finish(&mut self, status: u16, error: Option<&'static str>) {
        if let Some(mut exchange) = self.exchange.take() {
            let overhead = exchange.overhead_before + self.returned_at.saturating_duration_since(self.headers_at);
            exchange.shared.metrics.overhead.observe(overhead.as_secs_f64());
            exchange.overhead_before = overhead;
            let usage = self.tap.as_ref().and_then(UsageTap::usage);
            exchange.finish(Outcome {
                status,
                bytes: self.bytes,
                first_byte: self.first_byte,
                upstream: Some(self.upstream),
                usage,
                error,
            });
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let polled = this.poll_upstream(cx);
            let Some(filter) = &mut this.strip else { return polled };
            return match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let held_on = !filter.gave_up();
                        let mut passed = filter.pass(&data);
                        if held_on
                            && filter.gave_up()
                            && let Some(exchange) = &this.exchange
                        {
                            // The upstream sent an event longer than the filter holds.
                            let model = exchange.model.as_deref().unwrap_or("unknown");
                            let reason = "sse_event_too_long";
                            exchange.shared.metrics.upstream_errors.with_label_values(&[model, reason]).inc();
                        }
                        if this.inner.is_end_stream() {
                            let rest = filter.finish();
                            if !rest.is_empty() {
                                passed = [passed, rest].concat().into();
                            }
                        } else if passed.is_empty() {
                            // Only part of an event, or the dropped chunk: wait for more.
                            continue;
                        }
                        Poll::Ready(Some(Ok(Frame::data(passed))))
                    }
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(None) => {
                    let rest = filter.finish();
                    if rest.is_empty() { Poll::Ready(None) } else { Poll::Ready(Some(Ok(Frame::data(rest)))) }
                }
                other => other,
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.strip.as_ref().is_none_or(UsageChunkFilter::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        if self.strip.is_some() { SizeHint::default() } else { self.inner.size_hint() }
    }
}

impl RelayBody {
    fn poll_upstream(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                    if this.first_byte.is_none() {
                        this.first_byte = Some(Instant::now());
                    }
                    if let Some(tap) = &mut this.tap {
                        tap.observe(data);
                    }
                }
                if this.inner.is_end_stream() {
                    // NB: hyper stops polling once the body says it has
                    // ended, so the last frame is also the finish line.
                    this.finish(this.status, None);
                } else {
                    this.last_frame = tokio::time::Instant::now();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.count_upstream_error("body");
                this.finish(this.status, Some("upstream_body_error"));
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Ready(None) => {
                this.finish(this.status, None);
                Poll::Ready(None)
            }
            Poll::Pending => {
                loop {
                    ready!(this.idle.as_mut().poll(cx));
                    let deadline = this.last_frame + this.idle_timeout;
                    if deadline <= tokio::time::Instant::now() {
                        break;
                    }
                    // Frames came since the timer was set: wait out the rest.
                    this.idle.as_mut().reset(deadline);
                }
                this.count_upstream_error("idle_timeout");
                this.finish(this.status, Some("upstream_idle_timeout"));
                Poll::Ready(Some(Err(Box::new(IdleTimeout(this.idle_timeout)))))
            }
        }
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        // Dropped before the end: the client went away mid-response. Dropping
        // `inner` right after this closes the upstream connection.
        if self.exchange.is_some() {
            if self.inner.is_end_stream() {
                self.finish(self.status, None);
            } else {
                self.finish(CLIENT_CLOSED_REQUEST, Some("client_closed"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_format_without_allocating() {
        let mut buffer = itoa_buffer();
        assert_eq!(format_status(&mut buffer, 200), "200");
        assert_eq!(format_status(&mut buffer, 499), "499");
        assert_eq!(format_status(&mut buffer, 1200), "999");
    }
}
