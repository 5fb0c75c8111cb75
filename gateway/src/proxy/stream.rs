//! The response relay: upstream frames go to the client as they arrive,
//! one for one — no buffering, no re-chunking — while the idle timeout
//! watches the gaps and the usage tap keeps copies of the start and the end
//! (the last frame it reads where it lies, at the finish).
//!
//! The request's `Exchange` is finished here exactly once: when the body
//! ends, when the upstream breaks or idles out, or — if the client goes away
//! — when hyper drops the body, which also drops the upstream body and so
//! cancels the upstream request.

use std::pin::Pin;

use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::limit::Ending;
use crate::upstream::UpstreamBody;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::exchange::{CLIENT_CLOSED_REQUEST, Exchange};
use super::facts::{Outcome, Tally};
use super::sse::UsageChunkFilter;
use super::usage::UsageTap;
use crate::dialect::translate::answer::StreamTranslator;

/// The error a relayed body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream sent nothing for longer than the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream idle for longer than {0:?}")]
pub struct IdleTimeout(pub Duration);

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
            ProxyBody::Relay(relay) => relay.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(data)) => SizeHint::with_exact(data.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Relay(relay) => relay.size_hint(),
        }
    }
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
    inner: UpstreamBody,
    idle_timeout: Duration,
    /// Set the first time the upstream keeps the relay waiting: a body
    /// read whole with its head (most non-streaming answers) never needs
    /// one.
    idle: Option<Pin<Box<Sleep>>>,
    /// When the upstream last sent a frame (or the relay began). The idle
    /// timer is moved to `last_frame + idle_timeout` only when it fires, not
    /// on every chunk: re-arming a timer per chunk was a measurable share of
    /// a stream's cost.
    last_frame: tokio::time::Instant,
    tap: Option<UsageTap>,
    /// Takes out the usage chunk the gateway asked for on the client's behalf.
    strip: Option<UsageChunkFilter>,
    exchange: Option<Exchange>,
    status: u16,
    bytes: u64,
    /// Counts the events of a stream whose tokens are charged: what an
    /// early leaver is charged by.
    events: Option<EventCounter>,
    /// The answer is a stream: cut short, the upstream stops generating
    /// when its connection closes (else it finishes and bills it all).
    event_stream: bool,
    first_byte: Option<Instant>,
    upstream: Duration,
    returned_at: Instant,
    headers_at: Instant,
    /// Makes the upstream's stream the client's dialect's, event by event
    /// (`crate::dialect::plan`); `None`: relayed as it is.
    translator: Option<Box<StreamTranslator>>,
}

impl RelayBody {
    /// Wraps `inner`; `exchange` is finished when the relay ends.
    pub fn new(
        inner: UpstreamBody,
        exchange: Exchange,
        head: &http::response::Parts,
        idle_timeout: Duration,
        usage: UsageWatch,
        (upstream, headers_at): (Duration, Instant),
        translator: Option<Box<StreamTranslator>>,
    ) -> Self {
        // One clock read for both (each is a few dozen cycles, per request).
        let returned_at = Instant::now();
        // Counted only for a stream under a token limit that is answered
        // as one: what an early leaver is charged by.
        let event_stream = is_event_stream(&head.headers);
        let counted = exchange.facts.stream && exchange.held.charge.is_some() && event_stream;
        let events = counted.then(EventCounter::default);
        let status = head.status.as_u16();
        Self {
            inner,
            idle_timeout,
            idle: None,
            last_frame: tokio::time::Instant::from_std(returned_at),
            tap: (usage != UsageWatch::Off).then(UsageTap::default),
            strip: (usage == UsageWatch::TapAndStripChunk).then(UsageChunkFilter::default),
            exchange: Some(exchange),
            status,
            bytes: 0,
            events,
            event_stream,
            first_byte: None,
            upstream,
            returned_at,
            headers_at,
            translator,
        }
    }

    fn count_upstream_error(&mut self, reason: &'static str) {
        if let Some(exchange) = &mut self.exchange {
            exchange.facts.tallies.note(Tally::UpstreamError(reason));
        }
    }

    /// `error`: why the body was cut short, if it was; `ended`: the clock
    /// as read for the last frame, if it was; `last_data`: that frame's
    /// data, which the usage tap has not seen.
    fn finish(&mut self, status: u16, error: Option<&'static str>, ended: Option<Instant>, last_data: Option<&[u8]>) {
        if let Some(mut exchange) = self.exchange.take() {
            let ending = match (error, self.event_stream) {
                _ if !(200..300).contains(&self.status) => Ending::Unserved,
                (None, _) => Ending::Whole,
                (Some(_), true) => Ending::Cancelled,
                (Some(_), false) => Ending::Unfinished,
            };
            let overhead = exchange.facts.overhead_before + self.returned_at.saturating_duration_since(self.headers_at);
            exchange.facts.overhead_before = overhead;
            let usage = self.tap.as_mut().and_then(|tap| match last_data {
                Some(last) => tap.usage_ending_with(last),
                None => tap.usage(),
            });
            exchange.finish(Outcome {
                status,
                bytes: self.bytes,
                events: self.events.as_ref().map(|counter| counter.events),
                first_byte: self.first_byte,
                upstream: Some(self.upstream),
                usage,
                error,
                ended,
                ending,
            });
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.translator.is_some() {
            return this.poll_translated(cx);
        }
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
                            && let Some(exchange) = &mut this.exchange
                        {
                            // The upstream sent an event longer than the filter holds.
                            exchange.facts.tallies.note(Tally::UpstreamError("sse_event_too_long"));
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
        if let Some(translator) = &self.translator {
            return translator.is_closed();
        }
        self.inner.is_end_stream() && self.strip.as_ref().is_none_or(UsageChunkFilter::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        if self.strip.is_some() || self.translator.is_some() { SizeHint::default() } else { self.inner.size_hint() }
    }
}

impl RelayBody {
    /// The upstream's frames given to the translator; what it writes goes
    /// to the client as soon as there is some. An upstream that breaks or
    /// idles out ends the client's stream with an error event in its
    /// dialect (the request is finished as cut short all the same).
    fn poll_translated(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(mut translator) = self.translator.take() else { return Poll::Ready(None) };
        let polled = loop {
            if translator.is_closed() {
                break Poll::Ready(None);
            }
            let mut out = Vec::new();
            match self.poll_upstream(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        translator.push(data, &mut out);
                    }
                    if self.inner.is_end_stream() {
                        translator.close(&mut out);
                    } else if translator.overflowed() {
                        // The backend's event outgrew the bound: its fault,
                        // and the client's stream ends here (the upstream
                        // is dropped with the body).
                        self.count_upstream_error("sse_event_too_long");
                        self.finish(self.status, Some("upstream_event_too_long"), None, None);
                    }
                }
                Poll::Ready(Some(Err(_)) | None) => translator.close(&mut out),
                Poll::Pending => break Poll::Pending,
            }
            if !out.is_empty() {
                break Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
            }
        };
        self.translator = Some(translator);
        polled
    }

    fn poll_upstream(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // One clock read per frame serves the first byte, the idle
                // timer and, for the last frame, the end.
                let now = Instant::now();
                let ends = this.inner.is_end_stream();
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                    if let Some(counter) = &mut this.events {
                        counter.observe(data);
                    }
                    if this.first_byte.is_none() {
                        this.first_byte = Some(now);
                    }
                    // The last frame is read where it lies, at the finish.
                    if !ends && let Some(tap) = &mut this.tap {
                        tap.observe(data);
                    }
                }
                if ends {
                    // NB: hyper stops polling once the body says it has
                    // ended, so the last frame is also the finish line.
                    this.finish(this.status, None, Some(now), frame.data_ref().map(|data| &data[..]));
                } else {
                    this.last_frame = tokio::time::Instant::from_std(now);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.count_upstream_error("body");
                this.finish(this.status, Some("upstream_body_error"), None, None);
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Ready(None) => {
                this.finish(this.status, None, None, None);
                Poll::Ready(None)
            }
            Poll::Pending => {
                let (last_frame, idle_timeout) = (this.last_frame, this.idle_timeout);
                let idle =
                    this.idle.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(last_frame + idle_timeout)));
                loop {
                    ready!(idle.as_mut().poll(cx));
                    let deadline = this.last_frame + this.idle_timeout;
                    if deadline <= tokio::time::Instant::now() {
                        break;
                    }
                    // Frames came since the timer was set: wait out the rest.
                    idle.as_mut().reset(deadline);
                }
                this.count_upstream_error("idle_timeout");
                this.finish(this.status, Some("upstream_idle_timeout"), None, None);
                Poll::Ready(Some(Err(Box::new(IdleTimeout(this.idle_timeout)))))
            }
        }
    }
}

/// Whether a response says it is a server-sent event stream.
pub(super) fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers.get(http::header::CONTENT_TYPE).is_some_and(|value| {
        let essence = value.as_bytes().split(|b| *b == b';').next().unwrap_or_default().trim_ascii();
        essence.eq_ignore_ascii_case(b"text/event-stream")
    })
}

/// Counts the server-sent events of a stream as its bytes go by: each
/// blank line that ends a non-blank one ends an event (`\n\n`, `\r\n\r\n`),
/// whatever the frames' split points. Looks at line ends only (memchr).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EventCounter {
    /// Events ended so far.
    pub events: u64,
    /// The current line has had a byte other than `\r`.
    line_has_content: bool,
    /// A non-blank line was seen since the last event ended.
    in_event: bool,
}

impl EventCounter {
    /// Follows `data`, the next bytes of the stream.
    pub fn observe(&mut self, data: &[u8]) {
        let mut line_start = 0;
        for at in memchr::memchr_iter(b'\n', data) {
            let line = &data[line_start..at];
            let blank = !self.line_has_content && line.iter().all(|&byte| byte == b'\r');
            if blank {
                if self.in_event {
                    self.events += 1;
                    self.in_event = false;
                }
            } else {
                self.in_event = true;
            }
            self.line_has_content = false;
            line_start = at + 1;
        }
        self.line_has_content |= data[line_start..].iter().any(|&byte| byte != b'\r');
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        // Dropped before the end: the client went away mid-response. Dropping
        // `inner` right after this closes the upstream connection.
        if self.exchange.is_some() {
            if self.inner.is_end_stream() {
                self.finish(self.status, None, None, None);
            } else {
                self.finish(CLIENT_CLOSED_REQUEST, Some("client_closed"), None, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::EventCounter;

    /// The events of a stream are counted whatever the frames' split
    /// points, with either line end; blank lines in a row end one event.
    #[test]
    fn events_are_counted_whatever_the_split_points() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            ": a comment line\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n",
            "event: x\ndata: two\ndata: lines\n\n\n\n",
            "data: [DONE]\n\n",
            "data: unterminated",
        )
        .as_bytes();
        for step in 1..=stream.len() {
            let mut counter = EventCounter::default();
            for piece in stream.chunks(step) {
                counter.observe(piece);
            }
            assert_eq!(counter.events, 5, "split every {step} bytes");
        }
    }
}
