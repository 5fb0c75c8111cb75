//! State every request and background task shares, one instance per
//! process: the served config, metrics, request ids, the connection limits,
//! the fleet size and the drain flag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::ConfigStore;
use crate::limit;
use crate::metrics::Metrics;
use crate::request_id::RequestIds;

/// State every request shares.
pub struct Shared {
    /// The config being served.
    pub config: ConfigStore,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Request id generator.
    pub request_ids: RequestIds,
    /// Longest a client may take to send its body.
    pub body_timeout: Duration,
    /// What bounds a client connection.
    pub connections: ConnectionLimits,
    /// The endpoints of the Services the config routes to.
    pub endpoints: Arc<crate::upstream::endpoints::EndpointTable>,
    /// How many pods share each rate limit.
    pub fleet: Arc<limit::fleet::Fleet>,
    /// Data-plane workers (`crate::worker`): each gets its own upstream
    /// pools. 1 when the gateway serves on its caller's runtime.
    pub workers: usize,
    /// The usage reports of this process (`crate::usage`).
    pub ledger: crate::usage::Ledger,
    /// Where traces and usage records go (`crate::telemetry`).
    pub telemetry: crate::telemetry::Telemetry,
    draining: AtomicBool,
}

impl AsRef<ConfigStore> for Shared {
    fn as_ref(&self) -> &ConfigStore {
        &self.config
    }
}

impl AsRef<crate::usage::Ledger> for Shared {
    fn as_ref(&self) -> &crate::usage::Ledger {
        &self.ledger
    }
}

impl AsRef<Metrics> for Shared {
    fn as_ref(&self) -> &Metrics {
        &self.metrics
    }
}

impl AsRef<crate::upstream::endpoints::EndpointTable> for Shared {
    fn as_ref(&self) -> &crate::upstream::endpoints::EndpointTable {
        &self.endpoints
    }
}

/// A data-plane worker's own handle on [`Shared`]. Every request takes a
/// clone of it: clones of the one `Arc<Shared>` would write the reference
/// count every core shares, twice per request; this count is the worker's.
pub struct WorkerShared(Arc<Shared>);

impl WorkerShared {
    /// A handle for one worker.
    pub fn new(shared: Arc<Shared>) -> Arc<Self> {
        Arc::new(Self(shared))
    }
}

impl std::ops::Deref for WorkerShared {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What bounds each client connection (`--header-timeout`,
/// `--max-connections`, `--idle-timeout`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Longest a client may take to send its request headers, and its first
    /// request on a new connection.
    pub header_read_timeout: Duration,
    /// Most client connections open at once.
    pub max_connections: usize,
    /// Longest a client connection stays open with no request in flight.
    pub idle_timeout: Duration,
}

impl Shared {
    /// Fresh state: no config yet, not draining.
    pub fn new(
        metrics: Metrics,
        connections: ConnectionLimits,
        body_timeout: Duration,
        workers: usize,
        instance: String,
        telemetry: Option<Arc<crate::telemetry::Destination>>,
    ) -> Self {
        let endpoints = metrics.endpoint_series.table().clone();
        let counts = crate::telemetry::Counts {
            exported: metrics.telemetry_exported.clone(),
            dropped: metrics.telemetry_dropped.clone(),
        };
        Self {
            workers: workers.max(1),
            config: ConfigStore::default(),
            metrics,
            request_ids: RequestIds::new(),
            body_timeout,
            connections,
            endpoints,
            fleet: Arc::default(),
            ledger: crate::usage::Ledger::new(instance),
            telemetry: crate::telemetry::Telemetry::new(telemetry, counts),
            draining: AtomicBool::new(false),
        }
    }

    /// From now on the gateway reports not-ready and stops accepting.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// A config is loaded and the gateway is not draining.
    pub fn is_ready(&self) -> bool {
        !self.is_draining() && self.config.current().is_some() && self.ledger.settled()
    }

    /// SIGTERM (or [`crate::RunningGateway::shutdown`]) was received.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
