//! `waycast-gateway`: the data plane binary.
//!
//! ```text
//! waycast-gateway [--listen 0.0.0.0:8080] [--admin-listen 0.0.0.0:9090]
//!                 (--config-file PATH | --config-secret NS/NAME)
//!                 [--endpoints-file PATH | --endpoints-configmap NS/NAME]
//!                 [--tls-cert F --tls-key F] [--drain-timeout 30s]
//! waycast-gateway keygen
//! ```
//!
//! Every flag can also be set by environment variable (`WAYCAST_LISTEN`, ...).
//! Bad arguments exit with 64 (EX_USAGE).

/// mimalloc instead of glibc's malloc (docs/performance.md has the
/// measurements): more requests per core for the same work. The
/// `system-allocator` feature leaves malloc in place for heap profilers
/// (heaptrack), which see only malloc's allocations.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use waycast_crds::gateway_pod::flag;
use waycast_gateway::{ConfigSource, Drained, EndpointsSource, GatewayOptions};

#[derive(Parser, Debug)]
#[command(name = "waycast-gateway", version, about = "waycast's OpenAI-compatible AI gateway")]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Public listener.
    #[arg(long = flag::LISTEN, env = "WAYCAST_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Admin listener: /metrics, /healthz, /readyz.
    #[arg(long = flag::ADMIN_LISTEN, env = "WAYCAST_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    admin_listen: SocketAddr,
    /// A YAML or JSON GatewayConfig file, reloaded when it changes and on SIGHUP.
    #[arg(long, env = "WAYCAST_CONFIG_FILE", conflicts_with = "config_secret")]
    config_file: Option<PathBuf>,
    /// A Secret NAMESPACE/NAME holding the config, followed through the Kubernetes API.
    #[arg(long = flag::CONFIG_SECRET, env = "WAYCAST_CONFIG_SECRET", value_parser = parse_secret_ref)]
    config_secret: Option<(String, String)>,
    /// A JSON endpoints document (the ready addresses of the Services that
    /// backends name in `endpoints`), reloaded when it changes and on SIGHUP.
    #[arg(long, env = "WAYCAST_ENDPOINTS_FILE", conflicts_with = "endpoints_configmap")]
    endpoints_file: Option<PathBuf>,
    /// A ConfigMap NAMESPACE/NAME holding the endpoints document, followed through the Kubernetes API.
    #[arg(long = flag::ENDPOINTS_CONFIGMAP, env = "WAYCAST_ENDPOINTS_CONFIGMAP", value_parser = parse_secret_ref)]
    endpoints_configmap: Option<(String, String)>,
    /// A JSON usage baseline (the fleet's spend of each budget, as the
    /// operator hands it back), reloaded when it changes and on SIGHUP.
    #[arg(long, env = "WAYCAST_USAGE_FILE", conflicts_with = "usage_configmap")]
    usage_file: Option<PathBuf>,
    /// A ConfigMap NAMESPACE/NAME holding the usage baseline, followed through the Kubernetes API.
    #[arg(long = flag::USAGE_CONFIGMAP, env = "WAYCAST_USAGE_CONFIGMAP", value_parser = parse_secret_ref)]
    usage_configmap: Option<(String, String)>,
    /// PEM certificate chain for TLS (re-read when it changes).
    #[arg(long = flag::TLS_CERT, env = "WAYCAST_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long = flag::TLS_KEY, env = "WAYCAST_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How long in-flight requests and streams may run after SIGTERM.
    #[arg(long = flag::DRAIN_TIMEOUT, env = "WAYCAST_DRAIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// How long a client may take to send its request body.
    #[arg(long, env = "WAYCAST_BODY_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    body_timeout: Duration,
    /// How long a client may take to send its request headers.
    #[arg(long, env = "WAYCAST_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// Most client connections open at once; more are closed as they
    /// arrive (and counted).
    #[arg(long = flag::MAX_CONNECTIONS, env = "WAYCAST_MAX_CONNECTIONS", default_value_t = waycast_gateway::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// How long a client connection may stay open with no request in
    /// flight (HTTP/2 above all: HTTP/1 keep-alive ends at the header timeout).
    #[arg(long, env = "WAYCAST_IDLE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// Data-plane worker threads, each with its own runtime, listener
    /// (SO_REUSEPORT) and upstream pools. Default: the CPUs this process may
    /// use (its cgroup's CPU limit, else the node's cores).
    #[arg(long = flag::WORKERS, env = "WAYCAST_WORKERS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    workers: Option<u16>,
    /// Where traces and usage records go when the config names no
    /// `settings.telemetry`.
    #[command(flatten)]
    otlp: waycast_otlp::flags::OtlpFlags,
    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long = flag::LOG, env = "WAYCAST_LOG", default_value = "info")]
    log: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a new API key and the line to paste into a standalone config.
    Keygen,
}

fn parse_secret_ref(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err("expected NAMESPACE/NAME".to_owned()),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    waycast_crds::duration::parse(text).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let code = if error.use_stderr() { 64 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    if let Some(Command::Keygen) = args.command {
        return keygen();
    }
    if args.config_file.is_none() && args.config_secret.is_none() {
        eprintln!("waycast-gateway: one of --config-file or --config-secret is required");
        return ExitCode::from(64);
    }
    init_logging(&args.log);
    // The control plane (config and endpoint sources, admin, heartbeat)
    // runs on this thread; requests on the workers' own threads.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("waycast-gateway: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(args))
}

async fn run(args: Args) -> ExitCode {
    let mut heartbeat = None;
    let config = match (args.config_file, args.config_secret) {
        (Some(path), _) => ConfigSource::File(path),
        (None, Some((namespace, name))) => match kube::Client::try_default().await {
            Ok(client) => {
                heartbeat = waycast_gateway::PodIdentity::from_env().map(|identity| (client.clone(), identity));
                ConfigSource::Secret { client, namespace, name }
            }
            Err(error) => {
                tracing::error!(%error, "cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)");
                return ExitCode::FAILURE;
            }
        },
        (None, None) => return ExitCode::from(64),
    };
    let Ok(endpoints) = document_source(args.endpoints_file, args.endpoints_configmap).await else {
        return ExitCode::FAILURE;
    };
    let Ok(usage) = document_source(args.usage_file, args.usage_configmap).await else {
        return ExitCode::FAILURE;
    };
    let otlp = match args.otlp.read() {
        Ok(otlp) => otlp,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(64);
        }
    };
    let options = GatewayOptions {
        listen: args.listen,
        admin_listen: args.admin_listen,
        config,
        endpoints,
        usage,
        tls: args.tls_cert.zip(args.tls_key),
        drain_timeout: args.drain_timeout,
        body_timeout: args.body_timeout,
        header_read_timeout: args.header_timeout,
        max_connections: args.max_connections,
        idle_timeout: args.idle_timeout,
        heartbeat,
        workers: Some(workers(args.workers)),
        telemetry: otlp.map(|otlp| waycast_crds::telemetry::TelemetryConfig {
            endpoint: otlp.endpoint,
            sampling: waycast_crds::telemetry::Ratio(otlp.sampling),
            headers: otlp.headers,
            ..waycast_crds::telemetry::TelemetryConfig::default()
        }),
    };
    let gateway = match waycast_gateway::start(options).await {
        Ok(gateway) => gateway,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    waycast_gateway::termination_signal().await;
    tracing::info!("shutdown signal received; draining");
    match gateway.shutdown().await {
        Drained::Gracefully => ExitCode::SUCCESS,
        // Not a failure of ours: the drain timeout is the operator's choice.
        Drained::TimedOut => ExitCode::SUCCESS,
    }
}

fn workers(asked: Option<u16>) -> std::num::NonZeroUsize {
    let one = std::num::NonZeroUsize::MIN;
    match asked {
        Some(count) => std::num::NonZeroUsize::new(usize::from(count)).unwrap_or(one),
        None => std::thread::available_parallelism().unwrap_or(one),
    }
}

fn init_logging(filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_target(false).init();
}

fn keygen() -> ExitCode {
    let mut random = [0_u8; 32];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random).is_err() {
        eprintln!("waycast-gateway: the operating system's random number generator failed");
        return ExitCode::FAILURE;
    }
    let key = waycast_crds::api_key::key_text_from_bytes(&random);
    let hash = waycast_crds::digest::sha256_hex(key.as_bytes());
    println!("key:    {key}");
    println!("sha256: {hash}");
    println!();
    println!("# paste under `keys:` in the gateway config:");
    println!("  - id: local/new-key");
    println!("    sha256: {hash}");
    ExitCode::SUCCESS
}

/// A document read from a file, or watched in a ConfigMap (`namespace`,
/// `name`); neither: none.
///
/// # Errors
/// A ConfigMap named and the Kubernetes API out of reach (logged).
async fn document_source(
    file: Option<std::path::PathBuf>,
    configmap: Option<(String, String)>,
) -> Result<Option<EndpointsSource>, ()> {
    match (file, configmap) {
        (Some(path), _) => Ok(Some(EndpointsSource::File(path))),
        (None, Some((namespace, name))) => match kube::Client::try_default().await {
            Ok(client) => Ok(Some(EndpointsSource::ConfigMap { client, namespace, name })),
            Err(error) => {
                tracing::error!(%error, "cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)");
                Err(())
            }
        },
        (None, None) => Ok(None),
    }
}
