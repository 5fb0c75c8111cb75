//! A request's report, once it has ended and was settled: its metric
//! series, its span and usage record (with telemetry on), its access line.
//! Built only from what the stages decided ([`Facts`]), how and where it
//! ended ([`End`]) and what was settled ([`Settled`]); it changes no count a
//! limit, a queue or a budget reads.
//!
//! ```text
//! Facts + End + Settled ─► series (status, durations, tokens, cost, tallies; flushed when idle)
//!                       ─► telemetry::finish (span, usage record)
//!                       ─► access_log::record (one line)
//! ```

use std::time::{Duration, Instant};

use super::facts::{Asked, Facts, Outcome, Tally};
use crate::limit::{Settled, Wall};
use crate::metrics::Metrics;
use crate::shared::WorkerShared;

/// When, how and where a request ended.
pub struct End<'a> {
    /// How.
    pub outcome: &'a Outcome,
    /// When.
    pub at: Instant,
    /// The wall clock as the end read it (at most once).
    pub wall: &'a Wall,
    /// The endpoint that answered, if one did.
    pub endpoint: Option<std::net::SocketAddr>,
}

/// Reports a request that `asked`, decided `facts`, ended at `end` and
/// was settled as `settled`.
pub fn report(shared: &WorkerShared, asked: &Asked, facts: &Facts, end: &End<'_>, settled: &Settled<'_>) {
    let (outcome, ended) = (end.outcome, end.at);
    let metrics = &shared.metrics;
    // A request refused before its model or key was known counts, and
    // is logged, under `unknown` and `none`: its series are cached like
    // any pair's (a flood of bad keys costs a worker a cache hit, not a
    // labelled lookup).
    let model_name = facts.model.as_ref().unwrap_or_else(|| super::series::unknown_model());
    let key_name = facts.key.as_ref().unwrap_or_else(|| super::series::no_key());
    let (model, key) = (&**model_name, &**key_name);
    let elapsed = ended.saturating_duration_since(asked.started);
    // Taken once, for the metrics and the trace.
    let first_byte = outcome.first_byte.map(|at| at.saturating_duration_since(asked.started));
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
    for tally in facts.tallies.each() {
        count(metrics, (model, key, tenant), tally);
    }
    if let Some((classes, class, waited)) = &facts.queued {
        let class = classes.get(*class).map_or("", String::as_str);
        metrics.queue_wait.with_label_values(&[model, class]).observe(waited.as_secs_f64());
    }
    if let Some(limited) = settled.limited {
        series.count_rate_limit_tokens(limited);
    }
    if let Some((money, currency)) = settled.cost {
        series.count_cost(money.0, currency);
    }
    // The record, the token counters and the key's month all say what
    // was charged, so they sum to one another.
    let tokens = settled.tokens;
    let usage = (tokens.prompt, tokens.cached, tokens.completion);
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
    let request_id = asked.request_id.to_str().unwrap_or("-");
    if let Some(trace) = facts.trace.as_deref()
        && let Some(exporter) = shared.telemetry.exporter()
    {
        let done = crate::telemetry::Done {
            wall: end.wall.now(),
            ended,
            took: elapsed,
            first_byte,
            path: asked.path,
            request_id,
            model: model_name,
            key: key_name,
            user: facts.user.as_deref().map(|verified| &*verified.user),
            client_user: facts.client_user.as_deref(),
            tenant: facts.tenant.as_deref(),
            class: facts.queued.as_ref().and_then(|(names, class, _)| names.get(*class)).map(String::as_str),
            queued: facts.queued.as_ref().map(|(_, _, waited)| *waited),
            stream: facts.stream,
            status: outcome.status,
            error: outcome.error,
            tokens: usage,
            max_tokens: facts.max_tokens,
            cost: settled.cost.map(|(money, currency)| (money.to_string(), &**currency)),
            budgeted: settled.budgeted,
            routed: facts.model.is_some(),
        };
        crate::telemetry::finish(trace, &done, exporter);
    }
    if facts.access_log && crate::access_log::enabled() {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        crate::access_log::record(&crate::access_log::AccessLine {
            at: end.wall.now(),
            request_id,
            method: asked.method.as_str(),
            path: asked.path,
            model,
            key,
            user: facts.user.as_deref().map(|verified| &*verified.user),
            client_user: facts.client_user.as_deref(),
            endpoint: end.endpoint,
            stream: facts.stream,
            status: outcome.status,
            bytes: outcome.bytes,
            duration_us: micros(elapsed),
            upstream_us: outcome.upstream.map_or(0, micros),
            prompt_tokens: usage.0,
            completion_tokens: usage.2,
            cached_tokens: usage.1,
            cost: settled.cost.map(|(money, currency)| (money, &**currency)),
            error: outcome.error,
        });
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
