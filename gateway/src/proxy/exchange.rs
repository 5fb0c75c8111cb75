//! One request's bookkeeping, from its first byte to its last: created
//! when the request arrives, finished exactly once — by the handler for an
//! error or the gateway's own answer, by the relay when a relayed body ends,
//! or on drop when the client left first — into the metrics, the token
//! charge and one access log line.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{HeaderValue, Method};

use super::usage::Usage;
use crate::shared::WorkerShared;

/// Status logged when the client left before the response was complete
/// (as nginx does).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

/// One request's bookkeeping: metrics and the access log line.
pub struct Exchange {
    pub(super) shared: Arc<WorkerShared>,
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
    /// Gateway time before the upstream was asked; once a relayed
    /// response has ended, the gateway's time in all (what the overhead
    /// histogram records).
    pub overhead_before: Duration,
    /// Token limits to charge with the response's usage.
    pub charge: Option<crate::limit::Charge>,
    /// The endpoint answering, counted in flight until the exchange ends.
    pub endpoint: Option<crate::upstream::pick::InFlight>,
    activity: Arc<ConnectionActivity>,
    finished: bool,
}

/// One client connection's requests: how many are in flight (until their
/// response has ended) and when the last one ended, for the idle timeout.
#[derive(Debug)]
pub struct ConnectionActivity {
    started: AtomicBool,
    /// The connection speaks HTTP/2 (known from its first request).
    http2: AtomicBool,
    active: AtomicUsize,
    /// Nanoseconds on [`crate::limit::now_nanos`]'s clock.
    last_end: AtomicU64,
}

impl Default for ConnectionActivity {
    fn default() -> Self {
        Self {
            started: AtomicBool::new(false),
            http2: AtomicBool::new(false),
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

    /// Notes the version of a request on the connection.
    pub fn note_version(&self, version: http::Version) {
        if version == http::Version::HTTP_2 && !self.http2.load(Ordering::Relaxed) {
            self.http2.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the connection speaks HTTP/2.
    pub fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// Whether a request has begun on the connection.
    pub fn has_started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    fn ended(&self, at: Instant) {
        self.last_end.store(crate::limit::nanos_at(at), Ordering::Relaxed);
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
    /// Server-sent events relayed, where counted (see [`crate::limit::Relayed`]).
    pub events: Option<u64>,
    /// When the first body byte went out.
    pub first_byte: Option<Instant>,
    /// Upstream time: request sent → response headers.
    pub upstream: Option<Duration>,
    /// Tokens the response reported.
    pub usage: Option<Usage>,
    /// Why it ended, if not normally.
    pub error: Option<&'static str>,
    /// When it ended, where the caller has read the clock already (the
    /// relay, at the last frame); else it is read here.
    pub ended: Option<Instant>,
}

impl Exchange {
    /// Starts the bookkeeping of a request (counts it in flight).
    pub fn new(
        shared: Arc<WorkerShared>,
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
            endpoint: None,
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
        let ended = outcome.ended.unwrap_or_else(Instant::now);
        self.activity.ended(ended);
        let metrics = &self.shared.metrics;
        metrics.inflight.dec();
        // A request refused before its model or key was known counts, and
        // is logged, under `unknown` and `none`: its series are cached like
        // any pair's (a flood of bad keys costs a worker a cache hit, not a
        // labelled lookup).
        let model_name = self.model.as_ref().unwrap_or_else(|| super::series::unknown_model());
        let key_name = self.key.as_ref().unwrap_or_else(|| super::series::no_key());
        let (model, key) = (&**model_name, &**key_name);
        let elapsed = ended.saturating_duration_since(self.started);
        let series = super::series::pair(metrics, model_name, key_name);
        series.count_status(outcome.status);
        if self.model.is_some() {
            series.observe_duration(elapsed.as_secs_f64());
            if let Some(first_byte) = outcome.first_byte {
                series.observe_first_byte((first_byte - self.started).as_secs_f64());
            }
        }
        if outcome.upstream.is_some() {
            series.observe_overhead(self.overhead_before.as_secs_f64());
        }
        if let Some(usage) = outcome.usage {
            series.count_tokens(usage.prompt, usage.completion);
        }
        if let Some(charge) = &self.charge {
            // What was served is charged: a response that went out (whole,
            // or until the client left) by its usage or an estimate; one the
            // upstream refused or never sent, nothing.
            let served = (200..300).contains(&outcome.status) || outcome.status == CLIENT_CLOSED_REQUEST;
            let used = if served {
                let relayed = crate::limit::Relayed { bytes: outcome.bytes, events: outcome.events };
                charge.reservation.used(outcome.usage.map(|u| (u.prompt, u.completion)), relayed)
            } else {
                0
            };
            charge.settle(used);
            series.count_rate_limit_tokens(used);
        }
        // Counts go out now when no other request of this worker is in
        // flight (so a client that reads /metrics after its answer sees
        // them), else with the worker's next flush.
        super::series::written(&series, metrics.inflight.mine() == 0);
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
                endpoint: self.endpoint.as_ref().map(|e| e.endpoint().address),
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
                events: None,
                first_byte: None,
                upstream: None,
                usage: None,
                error: Some("client_closed"),
                ended: None,
            };
            self.record(&outcome);
        }
    }
}
