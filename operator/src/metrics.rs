//! The operator's Prometheus metrics, prefixed `waycast_operator_`.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Every metric the operator exports.
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Reconciles by kind.
    pub reconciles: IntCounterVec,
    /// Failed reconciles by reason.
    pub reconcile_errors: IntCounterVec,
    /// Reconcile durations by kind.
    pub reconcile_duration: HistogramVec,
    /// Reconcile spans the collector accepted, by signal (`--otlp-endpoint`).
    pub telemetry_exported: IntCounterVec,
    /// Reconcile spans dropped, by signal and reason.
    pub telemetry_dropped: IntCounterVec,
    /// The size of each Gateway's config: its parts' JSON, uncompressed.
    pub config_bytes: IntGaugeVec,
    /// Data bytes of config Secrets written per Gateway: what a change
    /// costs (a key change writes one shard and the manifest).
    pub config_bytes_written: IntCounterVec,
    /// Config writes (a new hash) per Gateway.
    pub config_writes: IntCounterVec,
    /// Key changes the key lane wrote as a patch, and those it left to the
    /// whole reconcile.
    pub key_patches: IntCounterVec,
    /// From writing a config to every pod of the Gateway reporting it.
    pub propagation: prometheus::Histogram,
    /// Each Gateway's conditions as last written: 1 true, 0 false.
    pub gateway_condition: IntGaugeVec,
    /// Pods' usage reports refused whole, by the rule they broke.
    pub usage_reports_refused: IntCounterVec,
    /// Identity providers' key set fetches, by result.
    pub key_set_fetches: IntCounterVec,
}

impl Metrics {
    /// Creates and registers the metrics.
    ///
    /// # Errors
    /// Only on a duplicate registration (a bug).
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconciles =
            IntCounterVec::new(Opts::new("waycast_operator_reconciles_total", "Reconciles by kind."), &["kind"])?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new("waycast_operator_reconcile_errors_total", "Failed reconciles by reason."),
            &["reason"],
        )?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new("waycast_operator_reconcile_duration_seconds", "Reconcile durations by kind.")
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            &["kind"],
        )?;
        let telemetry_exported = IntCounterVec::new(
            Opts::new(
                "waycast_operator_telemetry_exported_total",
                "Reconcile spans the OTLP collector accepted (--otlp-endpoint), by signal.",
            ),
            &["signal"],
        )?;
        let telemetry_dropped = IntCounterVec::new(
            Opts::new(
                "waycast_operator_telemetry_dropped_total",
                "Reconcile spans dropped: queue_full (the collector is slower than the reconciles), export_failed (down, refusing, past the deadline) or shutdown (ended as the operator stopped).",
            ),
            &["signal", "reason"],
        )?;
        let config_bytes = IntGaugeVec::new(
            Opts::new(
                "waycast_operator_config_bytes",
                "Size of each Gateway's config: its parts' JSON in all, uncompressed (each part is gzipped into a Secret of its own; waycast_operator_config_bytes_written_total counts what is written).",
            ),
            &["gateway"],
        )?;
        let config_bytes_written = IntCounterVec::new(
            Opts::new(
                "waycast_operator_config_bytes_written_total",
                "Data bytes of config Secrets (manifest, base, key shards) written, per Gateway: only changed parts are written.",
            ),
            &["gateway"],
        )?;
        let config_writes = IntCounterVec::new(
            Opts::new("waycast_operator_config_writes_total", "Config manifest writes with a new config, per Gateway."),
            &["gateway"],
        )?;
        let key_patches = IntCounterVec::new(
            Opts::new(
                "waycast_operator_key_patches_total",
                "ApiKey changes written as a patch of the key shards holding them, ahead of the Gateway's whole reconcile (outcome written), and those left to the whole reconcile (outcome left: a duplicate digest, a namespace's first or last key under tenant policies, a new shard count, a failed write).",
            ),
            &["outcome"],
        )?;
        let propagation = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "waycast_operator_propagation_seconds",
                "From writing a Gateway's config to every one of its pods reporting it (heartbeats).",
            )
            .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]),
        )?;
        let gateway_condition = IntGaugeVec::new(
            Opts::new(
                "waycast_operator_gateway_condition",
                "Each Gateway's status conditions as last written (Accepted, Programmed, Ready): 1 true, 0 false or unknown, by Gateway (namespace/name) and condition.",
            ),
            &["gateway", "condition"],
        )?;
        let usage_reports_refused = IntCounterVec::new(
            Opts::new(
                "waycast_operator_usage_reports_refused_total",
                "Gateway pods' usage reports refused whole, by the rule broken: too_large, too_many_keys, foreign_key (a key or tenant the Gateway does not serve), out_of_bounds (a negative, fractional or too large number), foreign_instance (a process of another pod), malformed.",
            ),
            &["reason"],
        )?;
        let key_set_fetches = IntCounterVec::new(
            Opts::new(
                "waycast_operator_key_set_fetches_total",
                "Identity providers' key set fetches (each provider of each Gateway, every 10 to 30 s), by result: changed (a new key set, written into the config), unchanged (the same document, or 304), invalid (not a key set with a signing key, or too large: the last good one keeps serving) or failed (unreachable, an HTTP error, a redirect, a timeout, a missing ConfigMap: the last good one keeps serving).",
            ),
            &["result"],
        )?;
        let metrics = Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            telemetry_exported,
            telemetry_dropped,
            config_bytes,
            config_bytes_written,
            config_writes,
            key_patches,
            propagation,
            gateway_condition,
            usage_reports_refused,
            key_set_fetches,
        };
        for collector in metrics.collectors() {
            metrics.registry.register(collector)?;
        }
        Ok(metrics)
    }

    /// The counters the reconcile spans' exporter keeps.
    pub fn telemetry_counts(&self) -> waycast_otlp::Counts {
        waycast_otlp::Counts { exported: self.telemetry_exported.clone(), dropped: self.telemetry_dropped.clone() }
    }

    /// Every metric, for registering and for the generated reference
    /// (`docs/metrics.md`).
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.config_writes.clone()),
            Box::new(self.key_patches.clone()),
            Box::new(self.propagation.clone()),
            Box::new(self.reconciles.clone()),
            Box::new(self.reconcile_errors.clone()),
            Box::new(self.reconcile_duration.clone()),
            Box::new(self.telemetry_exported.clone()),
            Box::new(self.telemetry_dropped.clone()),
            Box::new(self.config_bytes.clone()),
            Box::new(self.config_bytes_written.clone()),
            Box::new(self.gateway_condition.clone()),
            Box::new(self.usage_reports_refused.clone()),
            Box::new(self.key_set_fetches.clone()),
        ]
    }

    /// Shows the Gateway `gateway`'s `conditions`.
    pub fn show_conditions(
        &self,
        gateway: &str,
        conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) {
        for condition in conditions {
            let value = i64::from(condition.status == "True");
            self.gateway_condition.with_label_values(&[gateway, condition.type_.as_str()]).set(value);
        }
    }

    /// Forgets the series of Gateways not in `live` (namespace/name): one
    /// deleted while refused was never reconciled again to forget them.
    pub fn keep_gateways(&self, live: &std::collections::HashSet<String>) {
        let mut gone = std::collections::BTreeSet::new();
        use prometheus::core::Collector as _;
        let families = [self.gateway_condition.collect(), self.config_bytes.collect()];
        for family in families.iter().flatten() {
            for metric in family.get_metric() {
                for label in metric.get_label() {
                    if label.name() == "gateway" && !live.contains(label.value()) {
                        gone.insert(label.value().to_owned());
                    }
                }
            }
        }
        for gateway in gone {
            self.forget_gateway(&gateway);
        }
    }

    /// Forgets a deleted Gateway's series.
    pub fn forget_gateway(&self, gateway: &str) {
        for condition in ["Accepted", "Programmed", "Ready"] {
            let _ = self.gateway_condition.remove_label_values(&[gateway, condition]);
        }
        let _ = self.config_bytes.remove_label_values(&[gateway]);
        let _ = self.config_bytes_written.remove_label_values(&[gateway]);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new().encode_to_string(&self.registry.gather()).unwrap_or_default()
    }
}
