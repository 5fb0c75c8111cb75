//! waycast's data plane: an OpenAI-compatible proxy that checks bearer keys
//! and streams responses from the model's backends.
//!
//! ```text
//! config source (file | Secret watch) ─► validate ─► Snapshot ─► ArcSwap
//! request: accept ─► auth ─► body ─► model ─► allowed? ─► backend ─► forward ─► relay frames
//! ```
//!
//! [`start`] binds the listeners and runs the control plane (config and
//! endpoint sources, admin, heartbeat) on the current tokio runtime and the
//! data plane either there too or, with [`GatewayOptions::workers`], on
//! worker threads of its own (`worker.rs`); the binary (`main.rs`) adds
//! argument parsing, logging and signals. Tests start gateways in-process
//! the same way.

pub(crate) mod access_log;
pub(crate) mod admin;
pub(crate) mod cluster;
pub(crate) mod config;
pub(crate) mod dialect;
pub(crate) mod error;
#[allow(dead_code, unused_imports, reason = "verification core, not yet wired into the request path")]
pub mod identity;
pub(crate) mod json_text;
pub use cluster::PodIdentity;
pub(crate) mod limit;
pub mod metrics;
pub(crate) mod per_worker;
pub(crate) mod proxy;
pub(crate) mod registry;
pub(crate) mod request_id;
pub(crate) mod server;
pub(crate) mod shared;
pub(crate) mod sharing;
pub(crate) mod snapshot;
pub(crate) mod telemetry;
pub(crate) mod tls;
pub(crate) mod upstream;
pub(crate) mod usage;
pub(crate) mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use metrics::Metrics;
use shared::{ConnectionLimits, Shared};

/// Client connections open at once by default (`--max-connections`): far
/// above what one pod serves well, low enough that descriptors and memory
/// hold.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// How long a client connection may stay open with no request in flight, by
/// default (`--idle-timeout`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Where the config comes from.
pub enum ConfigSource {
    /// A YAML or JSON file.
    File(PathBuf),
    /// One Secret, watched through the API.
    Secret {
        /// Client (in-cluster config or KUBECONFIG).
        client: kube::Client,
        /// Secret namespace.
        namespace: String,
        /// Secret name.
        name: String,
    },
}

/// Where the endpoints document comes from (`waycast_crds::endpoints`).
pub enum EndpointsSource {
    /// A JSON file, re-read when it changes.
    File(PathBuf),
    /// One ConfigMap (the operator writes one per Gateway), watched.
    ConfigMap {
        /// Client (in-cluster config or KUBECONFIG).
        client: kube::Client,
        /// ConfigMap namespace.
        namespace: String,
        /// ConfigMap name.
        name: String,
    },
}

/// Watches `source` (a file, or the `data_key` of a ConfigMap) and sends
/// each new document to `updates`.
fn watch_document(
    source: EndpointsSource,
    data_key: &'static str,
    updates: mpsc::Sender<config::Update>,
) -> JoinHandle<()> {
    match source {
        EndpointsSource::File(path) => tokio::spawn(config::file::watch(path, updates)),
        EndpointsSource::ConfigMap { client, namespace, name } => {
            tokio::spawn(config::endpoints::watch_config_map(client, namespace, name, data_key, updates))
        }
    }
}

/// How to run a gateway.
pub struct GatewayOptions {
    /// Public listener address.
    pub listen: SocketAddr,
    /// Admin listener address.
    pub admin_listen: SocketAddr,
    /// Config source.
    pub config: ConfigSource,
    /// Where the endpoints of `endpoints` backends come from, if anywhere.
    pub endpoints: Option<EndpointsSource>,
    /// Where the fleet's budget spend comes from (the operator's usage
    /// ConfigMap, `waycast_crds::usage`), if anywhere.
    pub usage: Option<EndpointsSource>,
    /// TLS certificate and key files.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Longest wait for in-flight requests on shutdown.
    pub drain_timeout: Duration,
    /// Longest a client may take to send its body.
    pub body_timeout: Duration,
    /// Longest a client may take to send its request headers.
    pub header_read_timeout: Duration,
    /// Most client connections open at once.
    pub max_connections: usize,
    /// Longest a client connection stays open with no request in flight.
    pub idle_timeout: Duration,
    /// In a cluster: heartbeat the served config hash as this pod.
    pub heartbeat: Option<(kube::Client, cluster::PodIdentity)>,
    /// Data-plane worker threads, each with its own runtime, listener and
    /// upstream pools (`--workers`); None: serve on the current runtime.
    pub workers: Option<std::num::NonZeroUsize>,
    /// Where traces and usage records go when the config says nothing
    /// (`--otlp-endpoint`; the config's `settings.telemetry` wins).
    pub telemetry: Option<waycast_crds::telemetry::TelemetryConfig>,
}

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not bind.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// TLS files unusable.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// Metrics registration failed (a bug).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The telemetry flags are not usable.
    #[error("telemetry flags: {0}")]
    Telemetry(String),
    /// A worker thread or its runtime could not start.
    #[error("cannot start the data-plane workers: {0}")]
    Workers(std::io::Error),
}

/// A started gateway.
pub struct RunningGateway {
    /// Where the public listener is bound.
    pub public_addr: SocketAddr,
    /// Where the admin listener is bound.
    pub admin_addr: SocketAddr,
    /// Shared state (metrics, config).
    pub shared: Arc<Shared>,
    drain: watch::Sender<bool>,
    accept: Acceptors,
    alive: mpsc::Receiver<()>,
    background: Vec<JoinHandle<()>>,
    drain_timeout: Duration,
}

/// The public listener: one served on the caller's runtime, or one per
/// worker on the same address.
enum Listeners {
    One(tokio::net::TcpListener),
    PerWorker(Vec<tokio::net::TcpListener>),
}

/// Where the public listener is served.
enum Acceptors {
    /// A task on the runtime [`start`] was called on.
    Task(JoinHandle<()>),
    /// Worker threads.
    Workers(worker::Workers),
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every in-flight request finished.
    Gracefully,
    /// The drain timeout cut the rest off.
    TimedOut,
}

/// Resolves on SIGTERM or SIGINT: the signals that start a drain (or, for
/// a pause process, an exit).
pub async fn termination_signal() {
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// A config built as a pod builds it to serve it (checked, its keys'
/// table made), held until dropped: for tools that measure what a config
/// costs a pod (`xtask memory-figures`).
pub struct BuiltConfig {
    _snapshot: snapshot::Snapshot,
}

/// A pod's configs in turn, swapped as its config applier swaps them: the
/// next built while the last still serves, then the last let go (tools
/// that measure what a swap costs; `xtask swap-figures`).
#[derive(Default)]
pub struct ConfigSwaps {
    registry: registry::Registry,
    serving: Option<snapshot::Snapshot>,
}

/// A config in parts as a pod holds it ([`ConfigSwaps::hold`]).
pub struct HeldConfig(config::parts::HeldParts);

impl ConfigSwaps {
    /// The config in parts `split` as a pod holds it: each part gzipped.
    ///
    /// # Errors
    /// Compression failing.
    pub fn hold(split: &waycast_crds::shards::Parts) -> Result<HeldConfig, String> {
        config::parts::HeldParts::of_split("config", split).map(HeldConfig).map_err(|e| e.to_string())
    }

    /// Builds the config in parts `held` (known by `identity`) beside the
    /// one serving, as a pod builds it (from the serving one's table when
    /// only key shards changed), and serves it.
    ///
    /// # Errors
    /// The config not being servable, as a pod would refuse it.
    pub fn swap(&mut self, held: &HeldConfig, identity: String) -> Result<(), String> {
        let built = config::load::load_parts(&held.0, identity, self.serving.as_ref(), &mut self.registry)
            .map_err(|e| e.to_string())?;
        if let Some(next) = built {
            self.serving = Some(next);
        }
        Ok(())
    }

    /// Keys served.
    pub fn keys(&self) -> usize {
        self.serving.as_ref().map_or(0, snapshot::Snapshot::key_count)
    }
}

/// Builds `config` as a pod would serve it.
///
/// # Errors
/// The config not being servable, as a pod would refuse it.
pub fn build_config(config: &waycast_crds::GatewayConfig) -> Result<BuiltConfig, String> {
    let snapshot = snapshot::Snapshot::standalone(config, String::new()).map_err(|e| e.to_string())?;
    Ok(BuiltConfig { _snapshot: snapshot })
}

/// Binds the listeners and starts serving on the current runtime.
///
/// # Errors
/// [`StartError`] when a listener cannot bind or TLS files are unusable.
pub async fn start(options: GatewayOptions) -> Result<RunningGateway, StartError> {
    let connections = ConnectionLimits {
        header_read_timeout: options.header_read_timeout,
        max_connections: options.max_connections,
        idle_timeout: options.idle_timeout,
    };
    let workers = options.workers.map_or(1, std::num::NonZeroUsize::get);
    let instance = usage::Ledger::instance_name(
        options.heartbeat.as_ref().map_or("gateway", |(_, identity)| identity.pod.as_str()),
    );
    let telemetry = match options.telemetry.as_ref().map(telemetry::Destination::of) {
        None => None,
        Some(Ok(destination)) => Some(Arc::new(destination)),
        Some(Err(problems)) => return Err(StartError::Telemetry(problems)),
    };
    let shared =
        Arc::new(Shared::new(Metrics::new()?, connections, options.body_timeout, workers, instance, telemetry));
    let bind = |address| server::bind(address).map_err(|source| StartError::Bind { address, source });
    let bind_error = |source| StartError::Bind { address: options.listen, source };
    let (public, public_addr) = match options.workers {
        None => {
            let listener = bind(options.listen)?;
            let address = listener.local_addr().map_err(bind_error)?;
            (Listeners::One(listener), address)
        }
        Some(_) => {
            let (address, listeners) = server::bind_shared(options.listen, workers).map_err(bind_error)?;
            (Listeners::PerWorker(listeners), address)
        }
    };
    let admin = bind(options.admin_listen)?;
    let admin_addr = admin.local_addr().map_err(|source| StartError::Bind { address: options.admin_listen, source })?;
    let tls = match options.tls {
        Some((cert, key)) => Some(Arc::new(tls::TlsFiles::load(cert, key)?)),
        None => None,
    };

    let mut background = Vec::new();
    let (updates, updated) = mpsc::channel(config::UPDATE_QUEUE);
    background.push(tokio::spawn(config::apply_updates(updated, shared.clone())));
    background.push(match options.config {
        ConfigSource::File(path) => tokio::spawn(config::file::watch(path, updates)),
        ConfigSource::Secret { client, namespace, name } => {
            tokio::spawn(config::secret::watch(client, namespace, name, updates))
        }
    });
    if let Some(source) = options.endpoints {
        let (updates, updated) = mpsc::channel(config::UPDATE_QUEUE);
        background.push(tokio::spawn(config::endpoints::apply_updates(updated, shared.clone())));
        background.push(watch_document(source, waycast_crds::endpoints::ENDPOINTS_DATA_KEY, updates));
    }
    if let Some(source) = options.usage {
        shared.ledger.expect_baseline();
        let (updates, updated) = mpsc::channel(config::UPDATE_QUEUE);
        background.push(tokio::spawn(config::usage::apply_updates(updated, shared.clone())));
        background.push(watch_document(source, waycast_crds::usage::BASELINE_DATA_KEY, updates));
    }
    if let Some(tls) = &tls {
        background.push(tokio::spawn(tls.clone().watch(Duration::from_secs(1))));
    }
    if let Some((client, identity)) = options.heartbeat {
        background.push(tokio::spawn(cluster::fleet::watch(client.clone(), identity.clone(), shared.clone())));
        background.push(tokio::spawn(cluster::heartbeat::run(client, identity, shared.clone())));
    }
    background.push(tokio::spawn(server::serve_admin(admin, shared.clone())));
    let (drain, draining) = watch::channel(false);
    let (alive_sender, alive) = mpsc::channel(1);
    let accept = match public {
        Listeners::One(listener) => {
            Acceptors::Task(tokio::spawn(server::serve_public(listener, shared.clone(), tls, draining, alive_sender)))
        }
        Listeners::PerWorker(listeners) => Acceptors::Workers(
            worker::spawn(listeners, &shared, tls.as_ref(), &draining, &alive_sender).map_err(StartError::Workers)?,
        ),
    };
    tracing::info!(%public_addr, %admin_addr, workers, "gateway listening");
    Ok(RunningGateway {
        public_addr,
        admin_addr,
        shared,
        drain,
        accept,
        alive,
        background,
        drain_timeout: options.drain_timeout,
    })
}

impl RunningGateway {
    /// Drains: report not-ready, stop accepting, let in-flight requests and
    /// streams finish (up to the drain timeout), then stop everything.
    pub async fn shutdown(mut self) -> Drained {
        let started = Instant::now();
        self.shared.start_draining();
        let _ = self.drain.send(true);
        if let Acceptors::Task(accept) = &mut self.accept {
            let _ = accept.await;
        }
        // Every acceptor and connection holds an `alive` sender; `recv`
        // returns None once the last one has closed.
        let drained = match tokio::time::timeout(self.drain_timeout, self.alive.recv()).await {
            Ok(_) => Drained::Gracefully,
            Err(_) => Drained::TimedOut,
        };
        if let Acceptors::Workers(workers) = self.accept {
            workers.close().await;
        }
        for task in self.background {
            task.abort();
        }
        let inflight = self.shared.metrics.inflight.get();
        match drained {
            Drained::Gracefully => {
                tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "drained gracefully")
            }
            Drained::TimedOut => tracing::warn!(inflight, "drain timeout reached; closing remaining connections"),
        }
        // The access log is written in batches; nothing queued is lost on a graceful stop.
        tokio::task::spawn_blocking(access_log::flush).await.ok();
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.telemetry.flush(Duration::from_secs(5))).await.ok();
        drained
    }
}
