//! The operator's traces: one INTERNAL span per Gateway reconcile, sent over
//! OTLP/HTTP (`--otlp-endpoint`) through the gateway's own exporter
//! (waycast-otlp: a bounded queue, one thread batching, counted drops).
//!
//! ```text
//! reconcile_gateway ─► Reconcile::begin ─► (the reconcile learns hash, keys, models) ─► Traces::reconciled
//!   └─► a new trace id, sampled at --otlp-sampling ─► span "reconcile Gateway" ─► Exporter ─► POST /v1/traces
//! ```
//!
//! Off (no endpoint) nothing is started: the reconcile keeps an `Arc` of its
//! Gateway and reads two clocks. A reconcile is a trace of its own: nothing
//! calls the operator with a trace to continue, and the gateway pods'
//! requests are not caused by a reconcile.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use waycast_crds::Gateway;
use waycast_crds::telemetry::TelemetryConfig;
use waycast_otlp::proto::{self, SpanHead, SpanKind};
use waycast_otlp::{Counts, Destination, Exporter, Item, ids};

use crate::compile::ObjectKey;
use crate::error::Error;

/// The resource's `service.name`.
pub const SERVICE: &str = "waycast-operator";

/// Where reconcile spans go, and the exporter that sends them.
pub struct Traces {
    destination: Arc<Destination>,
    sampling: f64,
    exporter: Exporter,
}

impl Traces {
    /// Starts the exporter's thread for the collector `config` names (its
    /// settings already checked: `TelemetryConfig::problems`), counting on
    /// `counts`.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start(config: &TelemetryConfig, counts: Counts) -> std::io::Result<Self> {
        let destination = Destination::new(&config.endpoint, &config.headers, &config.resource_attributes, SERVICE);
        Ok(Self { destination: Arc::new(destination), sampling: config.sampling.0, exporter: Exporter::start(counts)? })
    }

    /// Queues the span of `reconcile`, ending now with `outcome`, when its
    /// new trace is sampled. Never waits: a full queue drops it (counted).
    pub fn reconciled(&self, reconcile: &Reconcile, outcome: Result<(), &Error>) {
        let trace_id = ids::new_trace_id();
        if !ids::sampled_at(self.sampling, &trace_id) {
            return;
        }
        let ended = reconcile.started + reconcile.clock.elapsed();
        let item = span(reconcile, outcome, (&trace_id, &ids::new_span_id()), ended);
        self.exporter.send(&self.destination, item);
    }

    /// Sends what is queued, waiting at most `deadline` (on shutdown).
    pub fn flush(&self, deadline: Duration) {
        self.exporter.flush(deadline);
    }
}

/// One reconcile of a Gateway, as its span tells it: what it learns is
/// filled in as it goes, so a failed reconcile still says how far it got.
pub struct Reconcile {
    gateway: Arc<Gateway>,
    /// The wall clock at the start, for the span's times.
    started: SystemTime,
    /// The monotonic clock at the start, for its duration.
    clock: Instant,
    /// The config hash the pods are to serve, once known.
    pub config_hash: Option<String>,
    /// The keys in the compiled config, once known.
    pub keys: Option<usize>,
    /// The models in the compiled config, once known.
    pub models: Option<usize>,
}

impl Reconcile {
    /// A reconcile of `gateway` starting now.
    pub fn begin(gateway: &Arc<Gateway>) -> Self {
        Self {
            gateway: gateway.clone(),
            started: SystemTime::now(),
            clock: Instant::now(),
            config_hash: None,
            keys: None,
            models: None,
        }
    }
}

/// The word a reconcile ended with: `ok`, or its error's label (the
/// `reason` of `waycast_operator_reconcile_errors_total`).
pub fn outcome(outcome: Result<(), &Error>) -> &'static str {
    outcome.err().map_or("ok", Error::metric_label)
}

/// The span of `reconcile`, ended at `ended` with `outcome`, under `ids`
/// (trace, span), encoded.
fn span(reconcile: &Reconcile, result: Result<(), &Error>, ids: (&[u8; 16], &[u8; 8]), ended: SystemTime) -> Item {
    let unix_nanos = |at: SystemTime| {
        let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    };
    let word = outcome(result);
    let head = SpanHead {
        trace_id: ids.0,
        span_id: ids.1,
        parent_span_id: None,
        trace_state: None,
        name: ("reconcile", "Gateway"),
        kind: SpanKind::Internal,
        start_unix_nanos: unix_nanos(reconcile.started),
        end_unix_nanos: unix_nanos(ended),
        events: &[],
        // The label, not the error's text: an API server's message may
        // quote what was sent (a Secret's fields), and the collector may be
        // another team's. The full error is in the operator's log.
        error: result.err().map(Error::metric_label),
    };
    let meta = &reconcile.gateway.metadata;
    let (namespace, name) = ObjectKey::sort_key(meta);
    let mut item = Item { spans: Vec::with_capacity(512), span_count: 1, records: Vec::new() };
    proto::span(&mut item.spans, &head, |attributes| {
        attributes.text("k8s.namespace.name", namespace);
        attributes.text("waycast.gateway", &format!("{namespace}/{name}"));
        if let Some(generation) = meta.generation.and_then(|g| u64::try_from(g).ok()) {
            attributes.int("waycast.generation", generation);
        }
        attributes.text("waycast.outcome", word);
        if result.is_err() {
            attributes.text("error.type", word);
        }
        if let Some(hash) = &reconcile.config_hash {
            attributes.text("waycast.config.hash", hash);
        }
        if let Some(keys) = reconcile.keys {
            attributes.int("waycast.keys", keys as u64);
        }
        if let Some(models) = reconcile.models {
            attributes.int("waycast.models", models as u64);
        }
    });
    item
}

#[cfg(test)]
#[path = "telemetry_tests.rs"]
mod tests;
