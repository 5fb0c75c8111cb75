//! One request's bookkeeping, from its first byte to its last: created
//! when the request arrives, finished exactly once — by the handler for an
//! error or the gateway's own answer, by the relay when a relayed body ends,
//! or on drop when the client left first — into the metrics, the token
//! charge and one access log line. Every metric of a request is written
//! here, from what the pipeline noted ([`Facts`]) and how it ended
//! ([`Outcome`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Method};

use super::connection::ConnectionActivity;
use super::usage::Usage;
use crate::error::GatewayError;
use crate::limit::Ending;
use crate::metrics::Metrics;
use crate::shared::WorkerShared;

/// Status logged when the client left before the response was complete
/// (as nginx does).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

/// One request's bookkeeping: metrics and the access log line.
pub struct Exchange {
    shared: Arc<WorkerShared>,
    started: Instant,
    method: Method,
    path: &'static str,
    request_id: HeaderValue,
    activity: Arc<ConnectionActivity>,
    /// What the pipeline decided, read when the request ends.
    pub facts: Facts,
    finished: bool,
}

/// What the pipeline decided about a request, noted as each stage decides
/// it; the exchange reads it once, when the request ends, and writes every
/// metric and the access line from it and the [`Outcome`].
pub struct Facts {
    /// Configured model name, once known.
    pub model: Option<Arc<str>>,
    /// Key id, once known.
    pub key: Option<Arc<str>>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Log this request (the config's `accessLog`).
    pub access_log: bool,
    /// The rate limits admitted it (counted in its series).
    pub admitted: bool,
    /// Token limits to charge with the response's usage.
    pub charge: Option<crate::limit::Charge>,
    /// The endpoint answering, counted in flight until the exchange ends.
    pub endpoint: Option<crate::upstream::pick::InFlight>,
    /// What the request reserved against token limits and its model's
    /// queue: settled from its usage when it ends.
    pub reservation: Option<crate::limit::Reservation>,
    /// Concurrency it holds until the exchange ends.
    pub held: crate::limit::Held,
    /// Its place at a model with a capacity, given back (with the tokens
    /// used) when the exchange ends.
    pub seat: Option<crate::sharing::Seat>,
    /// The key's namespace, where a model's queue counts it.
    pub tenant: Option<Arc<str>>,
    /// The model's prices and their currency, when it is priced.
    pub priced: Option<(waycast_crds::money::TokenPrices, Arc<str>)>,
    /// What it reserved in its budgets, settled when it ends.
    pub budget: Option<Box<crate::limit::BudgetHold>>,
    /// Where its key's usage this month is counted, once it was admitted.
    pub usage: Option<UsageTap>,
    /// How long it waited for a model's queue, and in which class (index
    /// into the names).
    pub queued: Option<(Arc<[String]>, usize, Duration)>,
    /// Gateway time before the upstream was asked; once a relayed
    /// response has ended, the gateway's time in all (what the overhead
    /// histogram records).
    pub overhead_before: Duration,
    /// Events counted besides the request itself.
    pub tallies: Tallies,
    /// Its trace, when telemetry is on (`crate::telemetry`).
    pub trace: Option<Box<crate::telemetry::RequestTrace>>,
    /// The output bound the client asked for.
    pub max_tokens: Option<u64>,
    /// Handed to the upstream client: a client that leaves before the
    /// answer's head from here on leaves a request the upstream may finish
    /// and bill.
    pub forwarded: bool,
}

impl Default for Facts {
    fn default() -> Self {
        Self {
            model: None,
            key: None,
            stream: false,
            access_log: true,
            admitted: false,
            charge: None,
            endpoint: None,
            reservation: None,
            held: crate::limit::Held::default(),
            seat: None,
            tenant: None,
            priced: None,
            budget: None,
            usage: None,
            queued: None,
            overhead_before: Duration::ZERO,
            tallies: Tallies::default(),
            trace: None,
            max_tokens: None,
            forwarded: false,
        }
    }
}

/// Where a request's use is counted in its key's usage this month.
pub struct UsageTap {
    /// The key's counts.
    pub counts: Arc<crate::limit::key_usage::KeyUsage>,
    /// The zone months start in.
    pub zone: jiff::tz::TimeZone,
    /// Whether its cost is in the budget currency (counted) or not.
    pub counts_cost: bool,
}

/// An event of a request counted in a metric of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// A limit refused the request (its `limit` label).
    RateLimited(&'static str),
    /// The rate-limit store failed (its label), the request refused or let on.
    StoreFailed(&'static str),
    /// The upstream failed the request, or sent what could not be relayed (why).
    UpstreamError(&'static str),
    /// Another endpoint was tried (why).
    Retry(&'static str),
    /// An endpoint was ejected after failures in a row.
    Ejection,
    /// A full model's queue refused the request (why).
    QueueShed(&'static str),
}

impl Tally {
    /// What an error the gateway answers with counts as, besides its status.
    pub fn of_error(error: &GatewayError) -> Option<Self> {
        match error {
            GatewayError::RateLimited(refusal) => Some(Self::RateLimited(refusal.label())),
            GatewayError::RateLimitUnavailable(failure) => Some(Self::StoreFailed(failure.label())),
            GatewayError::ModelBusy { reason, .. } => Some(Self::QueueShed(reason.label())),
            GatewayError::InsufficientQuota(exhausted) => Some(Self::RateLimited(exhausted.label())),
            GatewayError::UpstreamNotJson(..) => Some(Self::UpstreamError("not_json")),
            GatewayError::UpstreamUnreachable(_)
            | GatewayError::UpstreamFailed(_)
            | GatewayError::EgressDenied(_)
            | GatewayError::UpstreamTimeout(_) => Some(Self::UpstreamError(error.code())),
            _ => None,
        }
    }
}

/// A request's [`Tally`]s, in the order they happened (most requests have
/// none, and then nothing is allocated).
#[derive(Debug, Default)]
pub struct Tallies(Vec<Tally>);

impl Tallies {
    /// Notes one.
    pub fn note(&mut self, tally: Tally) {
        self.0.push(tally);
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
    /// What the upstream did with it, for its charge.
    pub ending: Ending,
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
        Self { shared, activity, started, method, path, request_id, facts: Facts::default(), finished: false }
    }

    /// Records the request: metrics, then one access log line.
    pub fn finish(mut self, outcome: Outcome) {
        self.record(&outcome);
    }

    /// Records a request answered without a body of the upstream's: the
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
        let facts = &self.facts;
        let model_name = facts.model.as_ref().unwrap_or_else(|| super::series::unknown_model());
        let key_name = facts.key.as_ref().unwrap_or_else(|| super::series::no_key());
        let (model, key) = (&**model_name, &**key_name);
        let elapsed = ended.saturating_duration_since(self.started);
        // Taken once, for the metrics and the trace.
        let first_byte = outcome.first_byte.map(|at| at.saturating_duration_since(self.started));
        let series = super::series::pair(metrics, model_name, key_name);
        series.count_status(outcome.status);
        if facts.model.is_some() {
            series.observe_duration(elapsed.as_secs_f64());
            if let Some(first_byte) = first_byte {
                series.observe_first_byte(first_byte.as_secs_f64());
            }
        }
        if outcome.upstream.is_some() {
            series.observe_overhead(facts.overhead_before.as_secs_f64());
        }
        if facts.admitted {
            series.count_admitted();
        }
        let tenant = facts.tenant.as_deref().unwrap_or("none");
        for tally in &facts.tallies.0 {
            count(metrics, (model, key, tenant), *tally);
        }
        if let Some((classes, class, waited)) = &facts.queued {
            let class = classes.get(*class).map_or("", String::as_str);
            metrics.queue_wait.with_label_values(&[model, class]).observe(waited.as_secs_f64());
        }
        // The wall clock, read once for the key's month and the record.
        let read = std::cell::OnceCell::new();
        let wall = || {
            *read.get_or_init(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default())
        };
        let mut cost = None;
        // What the record says was used: what was charged when anything
        // counts it (the upstream's usage, or the estimate for a client
        // that left before it), so the records sum to every count.
        let mut billed = None;
        if facts.charge.is_some()
            || facts.seat.is_some()
            || facts.priced.is_some()
            || facts.budget.is_some()
            || facts.usage.is_some()
        {
            // What the upstream will bill is charged (`Reservation::charged`).
            let reservation = facts.charge.as_ref().map(|charge| charge.reservation).or(facts.reservation);
            let charged = reservation.map_or_else(crate::limit::Charged::default, |reservation| {
                let relayed = crate::limit::Relayed { bytes: outcome.bytes, events: outcome.events };
                let usage = outcome.usage.map(|u| (u.prompt, u.cached, u.completion));
                reservation.charged(outcome.ending, usage, relayed)
            });
            let used = charged.prompt.saturating_add(charged.completion);
            billed = Some(charged);
            if let Some(charge) = &facts.charge {
                charge.settle(used);
                series.count_rate_limit_tokens(used);
            }
            if let Some(seat) = &facts.seat {
                seat.settle(used);
            }
            if let Some((prices, currency)) = &facts.priced {
                let money = prices.cost(charged.prompt, charged.cached, charged.completion);
                series.count_cost(money.0, currency);
                cost = Some((money, &**currency));
            }
            if let Some(budget) = &facts.budget {
                budget.settle(used, cost.map_or(0, |(money, _)| money.0));
            }
            if let Some(tap) = &facts.usage {
                let used = waycast_crds::usage::UsageTotals {
                    requests: 1,
                    input_tokens: charged.prompt,
                    output_tokens: charged.completion,
                    cached_input_tokens: charged.cached,
                    cost_nanos: cost.filter(|_| tap.counts_cost).map_or(0, |(money, _)| money.0),
                };
                let second = i64::try_from(wall().as_secs()).unwrap_or(i64::MAX);
                let now = jiff::Timestamp::from_second(second).unwrap_or_else(|_| jiff::Timestamp::now());
                tap.counts.count(used, now, &tap.zone);
            }
        }
        // The record, the token counters and the key's month all say what
        // was charged, so they sum to one another.
        let usage = billed.map_or_else(
            || outcome.usage.map(|u| (u.prompt, u.cached, u.completion)).unwrap_or_default(),
            |charged| (charged.prompt, charged.cached, charged.completion),
        );
        if usage != (0, 0, 0) {
            series.count_tokens(usage.0, usage.2);
            if usage.1 > 0 {
                series.count_cached_tokens(usage.1);
            }
            series.observe_request_tokens(usage.0, usage.2);
            // The pace of a stream: its tokens after the first, over the time
            // from the first byte to the last.
            if facts.stream
                && usage.2 >= 2
                && let Some(first_byte) = outcome.first_byte
            {
                #[allow(clippy::cast_precision_loss)]
                let per_token = ended.saturating_duration_since(first_byte).as_secs_f64() / (usage.2 - 1) as f64;
                series.observe_per_output_token(per_token);
            }
        }
        // Counts go out now when no other request of this worker is in
        // flight (so a client that reads /metrics after its answer sees
        // them), else with the worker's next flush.
        super::series::written(&series, metrics.inflight.mine() == 0);
        // Checked once, for the record and the access line.
        let request_id = self.request_id.to_str().unwrap_or("-");
        if let Some(trace) = facts.trace.as_deref()
            && let Some(exporter) = self.shared.telemetry.exporter()
        {
            let done = crate::telemetry::Done {
                wall: wall(),
                ended,
                took: elapsed,
                first_byte,
                path: self.path,
                request_id,
                model: model_name,
                key: key_name,
                tenant: facts.tenant.as_deref(),
                class: facts.queued.as_ref().and_then(|(names, class, _)| names.get(*class)).map(String::as_str),
                queued: facts.queued.as_ref().map(|(_, _, waited)| *waited),
                stream: facts.stream,
                status: outcome.status,
                error: outcome.error,
                tokens: usage,
                max_tokens: facts.max_tokens,
                cost: cost.map(|(money, currency)| (money.to_string(), currency)),
                budgeted: facts.budget.is_some(),
                routed: facts.model.is_some(),
            };
            crate::telemetry::finish(trace, &done, exporter);
        }
        if facts.access_log && crate::access_log::enabled() {
            let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            crate::access_log::record(&crate::access_log::AccessLine {
                at: wall(),
                request_id,
                method: self.method.as_str(),
                path: self.path,
                model,
                key,
                endpoint: facts.endpoint.as_ref().map(|e| e.endpoint().address),
                stream: facts.stream,
                status: outcome.status,
                bytes: outcome.bytes,
                duration_us: micros(elapsed),
                upstream_us: outcome.upstream.map_or(0, micros),
                prompt_tokens: usage.0,
                completion_tokens: usage.2,
                cached_tokens: usage.1,
                cost,
                error: outcome.error,
            });
        }
    }
}

/// Writes one tally's metric: a limit's refusal and the upstream's errors
/// under the request's model (`unknown` before it was known) and key; a
/// queue's refusal under the model and the key's namespace.
fn count(metrics: &Metrics, (model, key, namespace): (&str, &str, &str), tally: Tally) {
    match tally {
        Tally::QueueShed(reason) => metrics.queue_shed.with_label_values(&[model, namespace, reason]).inc(),
        Tally::RateLimited(limit) => metrics.rate_limit_requests.with_label_values(&[model, key, limit]).inc(),
        Tally::StoreFailed(label) => metrics.rate_limit_store_errors.with_label_values(&[label]).inc(),
        Tally::UpstreamError(reason) => metrics.upstream_errors.with_label_values(&[model, reason]).inc(),
        Tally::Retry(reason) => metrics.upstream_retries.with_label_values(&[model, reason]).inc(),
        Tally::Ejection => metrics.endpoint_ejections.with_label_values(&[model]).inc(),
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
            self.record(&outcome);
        }
    }
}
