//! The gateway's Prometheus metrics, all prefixed `waycast_gateway_`.
//!
//! Labels are bounded: `model` is a configured model name (or `unknown`),
//! `key` a configured key id (`namespace/name`, or `none`), `code` an HTTP
//! status, `kind` and `reason` fixed words. Raw user input never becomes a
//! label.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, PullingGauge,
    Registry,
};

use crate::per_worker::PerWorker;

/// Latency buckets: sub-millisecond resolution for the proxy's own time,
/// minutes for long generations.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Time between output tokens: a fast model streams a token every few
/// milliseconds, a loaded one every few hundred.
const PER_TOKEN_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5];
/// Tokens in one request's prompt or completion: one to a long context.
const TOKEN_COUNT_BUCKETS: &[f64] =
    &[1.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 131_072.0, 1_048_576.0];
/// Buckets for the gateway's own overhead per request.
const OVERHEAD_BUCKETS: &[f64] =
    &[0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1];

/// A gauge each data-plane worker moves on a cache line of its own
/// (`per_worker::PerWorker`); `/metrics` shows the sum. For the gauges every request
/// or connection moves twice.
#[derive(Clone)]
pub struct WorkerGauge {
    counts: Arc<PerWorker<AtomicI64>>,
    collector: PullingGauge,
}

impl WorkerGauge {
    fn new(name: &str, help: &str) -> Result<Self, prometheus::Error> {
        let counts = Arc::new(PerWorker::<AtomicI64>::default());
        let read = counts.clone();
        let collector = PullingGauge::new(name, help, Box::new(move || sum(&read) as f64))?;
        Ok(Self { counts, collector })
    }

    /// Adds one, on the calling worker's shard.
    pub fn inc(&self) {
        self.counts.mine().fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one off, on the calling worker's shard (a request or
    /// connection ends on the thread it began on).
    pub fn dec(&self) {
        self.counts.mine().fetch_sub(1, Ordering::Relaxed);
    }

    /// The calling worker's shard (its own, with up to
    /// `per_worker::SHARDS` workers).
    pub fn mine(&self) -> i64 {
        self.counts.mine().load(Ordering::Relaxed)
    }

    /// The sum over every worker.
    pub fn get(&self) -> i64 {
        sum(&self.counts)
    }
}

fn sum(counts: &PerWorker<AtomicI64>) -> i64 {
    counts.all().map(|count| count.load(Ordering::Relaxed)).sum()
}

/// Every metric the gateway exports.
pub struct Metrics {
    /// This set's own number in the process: a worker's cached series
    /// (`proxy::series`) belong to one set.
    pub id: u64,
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Requests by model, key and status code.
    pub requests: IntCounterVec,
    /// Request duration (arrival → last response byte) by model.
    pub request_duration: HistogramVec,
    /// Arrival → first response body byte, by model.
    pub time_to_first_byte: HistogramVec,
    /// Mean time between output tokens after the first, per streamed
    /// response of two tokens or more, by model.
    pub time_per_output_token: HistogramVec,
    /// Tokens of one request, by model and kind (`prompt`, `completion`).
    pub tokens_per_request: HistogramVec,
    /// Time spent in the gateway itself per request (excluding waiting on the
    /// client's upload and on the upstream).
    pub overhead: Histogram,
    /// Tokens by model, key and kind (`prompt`, `completion`, `cached_prompt`).
    pub tokens: IntCounterVec,
    /// What requests of priced models cost, in nano-units, by model, key
    /// and currency.
    pub cost: IntCounterVec,
    /// Requests being served now.
    pub inflight: WorkerGauge,
    /// Upstream failures by model and reason.
    pub upstream_errors: IntCounterVec,
    /// Requests sent again to another endpoint before any byte reached the
    /// client, by model and reason.
    pub upstream_retries: IntCounterVec,
    /// Endpoints taken out after failures in a row, by model.
    pub endpoint_ejections: IntCounterVec,
    /// Endpoints known, over every Service the config routes to.
    pub endpoints_known: IntGauge,
    /// Requests in flight to each endpoint, sent to each, and the time to
    /// their response headers: read from the endpoint table it holds
    /// (`Shared::endpoints`) when rendered.
    pub endpoint_series: crate::upstream::endpoints::EndpointSeries,
    /// Endpoints documents refused (the previous one kept).
    pub endpoints_update_errors: IntCounter,
    /// Client connections open now.
    pub connections_open: WorkerGauge,
    /// Client connections closed on arrival because `--max-connections` were open.
    pub connections_refused: IntCounter,
    /// Configs applied.
    pub config_reloads: IntCounter,
    /// Configs rejected (the previous one kept serving).
    pub config_reload_errors: IntCounter,
    /// 1 for the config hash being served.
    pub config_info: IntGaugeVec,
    /// Unix time of the last applied config.
    pub config_last_reload: IntGauge,
    /// Entries of the served config left out, by kind (`model`, `key`).
    pub config_entries_dropped: IntGaugeVec,
    /// Requests under a rate limit by model, key and decision (`admitted`,
    /// or the limit that refused: `key_requests`, `key_tokens`,
    /// `model_requests`, `model_tokens`).
    pub rate_limit_requests: IntCounterVec,
    /// Tokens charged to rate limits, by model and key.
    pub rate_limit_tokens: IntCounterVec,
    /// Pods sharing each rate limit (live pods of this Gateway).
    pub rate_limit_pods: IntGauge,
    /// Rate-limit checks Redis did not answer, by reason.
    pub rate_limit_store_errors: IntCounterVec,
    /// Budget spends `GET /v1/usage` answered in Redis mode, by source.
    pub usage_spend_reads: IntCounterVec,
    /// 1 while the connection to Redis is up (0 when down or not used).
    pub rate_limit_store_up: IntGauge,
    /// Failed attempts to connect to the rate-limit Redis.
    pub rate_limit_store_failed_connects: IntGauge,
    /// Requests waiting for a full model, by model and class.
    pub queue_depth: IntGaugeVec,
    /// Time requests of a model with a capacity waited for their turn, by
    /// model and class (0 for those sent at once).
    pub queue_wait: HistogramVec,
    /// Requests a full model's queue refused, by model, the key's
    /// namespace and reason (`queue_full`, `displaced`, `timeout`).
    pub queue_shed: IntCounterVec,
    /// Budgets of keys and tenants half spent or more, by scope and period
    /// (set when `/metrics` is read).
    pub budget_used: prometheus::GaugeVec,
    /// Spans and usage records the collector accepted, by signal.
    pub telemetry_exported: IntCounterVec,
    /// Spans and usage records dropped, by signal and reason.
    pub telemetry_dropped: IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Errors
    /// Only on a duplicate registration, which would be a bug.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("waycast_gateway_requests_total", "Requests by model, key id and HTTP status code."),
            &["model", "key", "code"],
        )?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "waycast_gateway_request_duration_seconds",
                "Request arrival to last response byte, by model.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["model"],
        )?;
        let time_to_first_byte = HistogramVec::new(
            HistogramOpts::new(
                "waycast_gateway_time_to_first_byte_seconds",
                "Request arrival to the first response body byte, by model (time to first token for streams).",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["model"],
        )?;
        let time_per_output_token = HistogramVec::new(
            HistogramOpts::new(
                "waycast_gateway_time_per_output_token_seconds",
                "Mean time between output tokens after the first (first token to last byte, over completion tokens less one), per streamed response of two tokens or more, by model.",
            )
            .buckets(PER_TOKEN_BUCKETS.to_vec()),
            &["model"],
        )?;
        let tokens_per_request = HistogramVec::new(
            HistogramOpts::new(
                "waycast_gateway_tokens_per_request",
                "Tokens of one served request (what it was charged), by model and kind (prompt, completion).",
            )
            .buckets(TOKEN_COUNT_BUCKETS.to_vec()),
            &["model", "kind"],
        )?;
        let overhead = Histogram::with_opts(
            HistogramOpts::new(
                "waycast_gateway_overhead_seconds",
                "Time spent in the gateway per request, excluding the client's upload and the upstream's answer.",
            )
            .buckets(OVERHEAD_BUCKETS.to_vec()),
        )?;
        let tokens = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_tokens_total",
                "Tokens charged (a response's usage; for a client that left before it, the estimate it was charged; nothing for an upstream's refusal), by model, key id and kind (prompt, completion, cached_prompt: prompt tokens the server read from its cache).",
            ),
            &["model", "key", "kind"],
        )?;
        let cost = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_cost_nanos_total",
                "What requests of priced models cost (ModelEndpoint pricing), in nano-units of the currency (1e-9), by model, key id and currency: an integer, so sums are exact.",
            ),
            &["model", "key", "currency"],
        )?;
        let inflight = WorkerGauge::new("waycast_gateway_inflight_requests", "Requests being served now.")?;
        let upstream_errors = IntCounterVec::new(
            Opts::new("waycast_gateway_upstream_errors_total", "Upstream failures by model and reason."),
            &["model", "reason"],
        )?;
        let upstream_retries = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_upstream_retries_total",
                "Requests sent again to another endpoint before any byte reached the client, by model and reason.",
            ),
            &["model", "reason"],
        )?;
        let endpoint_ejections = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_endpoint_ejections_total",
                "Endpoints taken out after failures in a row, by model.",
            ),
            &["model"],
        )?;
        let endpoints_known =
            IntGauge::new("waycast_gateway_endpoints", "Endpoints known, over every Service the config routes to.")?;
        let endpoint_series = crate::upstream::endpoints::EndpointSeries::new(Arc::default())?;
        let endpoints_update_errors = IntCounter::new(
            "waycast_gateway_endpoints_update_errors_total",
            "Endpoints documents refused (the previous one kept).",
        )?;
        let connections_open = WorkerGauge::new("waycast_gateway_connections_open", "Client connections open now.")?;
        let connections_refused = IntCounter::new(
            "waycast_gateway_connections_refused_total",
            "Client connections closed on arrival because --max-connections were open.",
        )?;
        let config_reloads = IntCounter::new("waycast_gateway_config_reloads_total", "Configs applied.")?;
        let config_reload_errors = IntCounter::new(
            "waycast_gateway_config_reload_errors_total",
            "Configs rejected as invalid; the previous config kept serving.",
        )?;
        let config_info = IntGaugeVec::new(
            Opts::new("waycast_gateway_config_info", "1 for the config hash being served."),
            &["hash"],
        )?;
        let config_last_reload = IntGauge::new(
            "waycast_gateway_config_last_reload_timestamp_seconds",
            "Unix time the current config was applied.",
        )?;
        let config_entries_dropped = IntGaugeVec::new(
            Opts::new(
                "waycast_gateway_config_entries_dropped",
                "Entries of the served config left out because they cannot be served (each is logged and reported in the heartbeat), by kind.",
            ),
            &["kind"],
        )?;
        let rate_limit_requests = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_rate_limit_requests_total",
                "Requests under a rate limit, by model, key id and decision (admitted, or the limit that refused: key_requests, key_tokens, key_concurrent, tenant_requests, tenant_tokens, tenant_concurrent, model_requests, model_tokens).",
            ),
            &["model", "key", "decision"],
        )?;
        let rate_limit_tokens = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_rate_limit_tokens_total",
                "Tokens charged to token rate limits, by model and key id.",
            ),
            &["model", "key"],
        )?;
        let rate_limit_pods = IntGauge::new(
            "waycast_gateway_rate_limit_pods",
            "Pods sharing each rate limit and budget: the live pods of this Gateway, at least the fewest it runs (each enforces its share).",
        )?;
        rate_limit_pods.set(1);
        let rate_limit_store_errors = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_rate_limit_store_errors_total",
                "Rate-limit checks Redis did not answer (unreachable, timeout, error_reply); the request was admitted or refused as the Gateway's failureMode says.",
            ),
            &["reason"],
        )?;
        let usage_spend_reads = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_usage_spend_reads_total",
                "Budget spends GET /v1/usage answered with budgets counted in Redis, by source: redis (read now), cache (read under a second ago), stale (its reads were past their bounds: the last spend read, at most 10 s old), unknown (answered null).",
            ),
            &["source"],
        )?;
        let rate_limit_store_up = IntGauge::new(
            "waycast_gateway_rate_limit_store_up",
            "1 while the connection to the rate-limit Redis is up.",
        )?;
        let rate_limit_store_failed_connects = IntGauge::new(
            "waycast_gateway_rate_limit_store_failed_connects",
            "Attempts to connect to (and authenticate with) the rate-limit Redis that failed since its settings last changed: connection refused, TLS or authentication refused.",
        )?;
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "waycast_gateway_queue_depth",
                "Requests waiting in this pod for a full model (one with a capacity), by model and class.",
            ),
            &["model", "class"],
        )?;
        let queue_wait = HistogramVec::new(
            HistogramOpts::new(
                "waycast_gateway_queue_wait_seconds",
                "Time requests of a model with a capacity waited for their turn (0 when sent at once), by model and class.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["model", "class"],
        )?;
        let queue_shed = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_queue_shed_total",
                "Requests a full model's queue answered with 429, by model, the key's namespace and reason (queue_full, displaced by a higher class, timeout after maxWait).",
            ),
            &["model", "namespace", "reason"],
        )?;
        let budget_used = prometheus::GaugeVec::new(
            Opts::new(
                "waycast_gateway_budget_used_ratio",
                "How much of each budget the fleet has spent in its current period (1 is all of it; the larger of its token and cost parts), for the budgets of keys and tenants half spent or more (the bound on its series), by scope (key:<namespace/name> or tenant:<namespace>) and period (day, week, month).",
            ),
            &["scope", "period"],
        )?;
        let telemetry_exported = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_telemetry_exported_total",
                "Spans (signal traces) and usage records (signal logs) the OTLP collector accepted.",
            ),
            &["signal"],
        )?;
        let telemetry_dropped = IntCounterVec::new(
            Opts::new(
                "waycast_gateway_telemetry_dropped_total",
                "Spans and usage records dropped, by signal and reason: queue_full (the collector is slower than the requests), export_failed (spans: down, refusing or past the deadline; usage records: refused for good or still failing after 15 tries), retry_full (usage records kept for another try past 16 MiB), shutdown (left undelivered when the pod stopped, or sent after).",
            ),
            &["signal", "reason"],
        )?;
        static SETS: AtomicU64 = AtomicU64::new(0);
        let metrics = Self {
            id: SETS.fetch_add(1, Ordering::Relaxed),
            registry,
            requests,
            request_duration,
            time_to_first_byte,
            time_per_output_token,
            tokens_per_request,
            overhead,
            tokens,
            cost,
            inflight,
            upstream_errors,
            upstream_retries,
            endpoint_ejections,
            endpoints_known,
            endpoint_series,
            endpoints_update_errors,
            connections_open,
            connections_refused,
            config_reloads,
            config_reload_errors,
            config_info,
            config_last_reload,
            config_entries_dropped,
            rate_limit_requests,
            rate_limit_tokens,
            rate_limit_pods,
            rate_limit_store_errors,
            usage_spend_reads,
            rate_limit_store_up,
            rate_limit_store_failed_connects,
            queue_depth,
            queue_wait,
            queue_shed,
            budget_used,
            telemetry_exported,
            telemetry_dropped,
        };
        for collector in metrics.collectors() {
            metrics.registry.register(collector)?;
        }
        Ok(metrics)
    }

    /// Every metric, for registering and for the generated reference
    /// (`docs/metrics.md`).
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.request_duration.clone()),
            Box::new(self.time_to_first_byte.clone()),
            Box::new(self.time_per_output_token.clone()),
            Box::new(self.tokens_per_request.clone()),
            Box::new(self.overhead.clone()),
            Box::new(self.tokens.clone()),
            Box::new(self.cost.clone()),
            Box::new(self.inflight.collector.clone()),
            Box::new(self.upstream_errors.clone()),
            Box::new(self.upstream_retries.clone()),
            Box::new(self.endpoint_ejections.clone()),
            Box::new(self.endpoints_known.clone()),
            Box::new(self.endpoint_series.clone()),
            Box::new(self.endpoints_update_errors.clone()),
            Box::new(self.connections_open.collector.clone()),
            Box::new(self.connections_refused.clone()),
            Box::new(self.config_reloads.clone()),
            Box::new(self.config_reload_errors.clone()),
            Box::new(self.config_info.clone()),
            Box::new(self.config_last_reload.clone()),
            Box::new(self.config_entries_dropped.clone()),
            Box::new(self.rate_limit_requests.clone()),
            Box::new(self.rate_limit_tokens.clone()),
            Box::new(self.rate_limit_pods.clone()),
            Box::new(self.rate_limit_store_errors.clone()),
            Box::new(self.usage_spend_reads.clone()),
            Box::new(self.rate_limit_store_up.clone()),
            Box::new(self.rate_limit_store_failed_connects.clone()),
            Box::new(self.queue_depth.clone()),
            Box::new(self.queue_wait.clone()),
            Box::new(self.queue_shed.clone()),
            Box::new(self.budget_used.clone()),
            Box::new(self.telemetry_exported.clone()),
            Box::new(self.telemetry_dropped.clone()),
        ]
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let families = self.registry.gather();
        prometheus::TextEncoder::new().encode_to_string(&families).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_gauge_is_the_sum_of_every_workers_shard() {
        let metrics = Metrics::new().unwrap();
        let gauge = metrics.inflight.clone();
        // Workers 0..10: past the shard count, workers share a shard.
        let threads: Vec<_> = (0..10)
            .map(|worker| {
                let gauge = gauge.clone();
                std::thread::spawn(move || {
                    crate::per_worker::become_worker(worker);
                    for _ in 0..=worker {
                        gauge.inc();
                    }
                    gauge.dec();
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        // Σ (worker + 1) − 10 = 45.
        assert_eq!(gauge.get(), 45);
        assert!(metrics.render().contains("\nwaycast_gateway_inflight_requests 45\n"), "{}", metrics.render());
        let distinct = gauge.counts.all().filter(|count| count.load(Ordering::Relaxed) != 0).count();
        assert_eq!(distinct, crate::per_worker::SHARDS, "each worker wrote its own shard");
    }
}
