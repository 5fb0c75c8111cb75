//! `waycast-operator`: reconciles Gateways, ModelEndpoints and ApiKeys.
//!
//! ```text
//! waycast-operator [--gateway-image IMAGE] [--admin-listen 0.0.0.0:8080] [--leader-elect]
//!                  [--otlp-endpoint URL [--otlp-sampling 1] [--otlp-headers name=value,...]]
//! ```
//!
//! Flags can also be set by environment variable; the cluster is found the
//! usual way (in-cluster config, else `KUBECONFIG`). Bad arguments exit 64.
//! SIGTERM or SIGINT stops it, after the reconcile spans still queued are sent.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: with 10,000 objects churning through
/// the stores, glibc's per-thread arenas held on to freed memory (operator
/// peak RSS at 10,000 ApiKeys: docs/performance.md). The
/// `system-allocator` feature leaves malloc in place for heap profilers
/// (heaptrack), which see only malloc's allocations.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "waycast-operator", version, about = "waycast's Kubernetes operator")]
struct Args {
    /// Gateway image for Gateways that do not set spec.image.
    #[arg(long, env = "WAYCAST_GATEWAY_IMAGE", default_value = "docker.io/waycast/gateway:dev")]
    gateway_image: String,
    /// Admin listener: /metrics, /healthz, /readyz.
    #[arg(long, env = "WAYCAST_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    admin_listen: SocketAddr,
    /// Elect a leader on a Lease so that several replicas are safe.
    #[arg(long, env = "WAYCAST_LEADER_ELECT")]
    leader_elect: bool,
    /// Namespace of the leader Lease (default: the pod's namespace, POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "waycast-system")]
    leader_namespace: String,
    /// This replica's identity in the Lease (default: POD_NAME, else the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Log filter.
    #[arg(long, env = "WAYCAST_LOG", default_value = "info")]
    log: String,
    /// The cluster's Service and Pod ranges, closed to `url` backends unless
    /// a Gateway opens them (comma-separated CIDRs). Empty: found from the
    /// ServiceCIDRs and the Nodes' podCIDRs.
    #[arg(long, env = "WAYCAST_CLUSTER_CIDRS", value_delimiter = ',')]
    cluster_cidrs: Vec<String>,
    /// Give every Gateway's pods a NetworkPolicy: the proxy port open, the
    /// admin port only from --gateway-metrics-from.
    #[arg(long, env = "WAYCAST_GATEWAY_NETWORK_POLICY")]
    gateway_network_policy: bool,
    /// Who may reach the gateway pods' admin port (/metrics): a JSON list
    /// of NetworkPolicy peers, e.g.
    /// [{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}].
    #[arg(long, env = "WAYCAST_GATEWAY_METRICS_FROM", default_value = "[]")]
    gateway_metrics_from: String,
    /// The gateway pods' egress rules: a JSON list of NetworkPolicy egress
    /// rules; empty: egress is not restricted.
    #[arg(long, env = "WAYCAST_GATEWAY_EGRESS", default_value = "[]")]
    gateway_egress: String,
    /// Where a span per Gateway reconcile goes (sampling: all by default,
    /// a reconcile is rare next to a request).
    #[command(flatten)]
    otlp: waycast_otlp::flags::OtlpFlags,
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
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_target(false).init();
    // One thread: the operator waits on the API server far more than it
    // computes, and one allocator heap instead of one per worker kept its
    // memory lower at 10,000 ApiKeys (docs/performance.md).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("waycast-operator: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let client = match kube::Client::try_default().await {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)");
                return ExitCode::FAILURE;
            }
        };
        let identity = args.identity.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "waycast-operator".into())
        });
        let network_policy = match network_policy_settings(&args) {
            Ok(settings) => settings,
            Err(error) => {
                eprintln!("waycast-operator: {error}");
                return ExitCode::from(64);
            }
        };
        let telemetry = match telemetry_settings(&args) {
            Ok(settings) => settings,
            Err(error) => {
                eprintln!("waycast-operator: {error}");
                return ExitCode::from(64);
            }
        };
        let options = waycast_operator::OperatorOptions {
            gateway_image: args.gateway_image,
            admin_listen: args.admin_listen,
            leader_election: args.leader_elect.then(|| (args.leader_namespace.clone(), identity)),
            cluster_cidrs: args.cluster_cidrs.clone(),
            network_policy,
            telemetry,
        };
        match waycast_operator::run(client, options, termination_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, "operator stopped");
                ExitCode::FAILURE
            }
        }
    })
}

/// SIGTERM (the kubelet stopping the pod) or SIGINT.
async fn termination_signal() {
    let Ok(mut terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Where the reconcile spans go, from the flags: `None` without
/// `--otlp-endpoint`. Errors name a flag and a header, never a value.
fn telemetry_settings(args: &Args) -> Result<Option<waycast_crds::telemetry::TelemetryConfig>, String> {
    let Some(otlp) = args.otlp.read()? else { return Ok(None) };
    let config = waycast_crds::telemetry::TelemetryConfig {
        endpoint: otlp.endpoint,
        sampling: waycast_crds::telemetry::Ratio(otlp.sampling),
        headers: otlp.headers,
        ..waycast_crds::telemetry::TelemetryConfig::default()
    };
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(format!("--otlp-*: {}", problems.join("; ")));
    }
    Ok(Some(config))
}

/// The NetworkPolicy settings the flags give.
fn network_policy_settings(
    args: &Args,
) -> Result<Option<waycast_operator::render::network_policy::NetworkPolicySettings>, String> {
    if !args.gateway_network_policy {
        return Ok(None);
    }
    let mut metrics_from: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer> =
        serde_json::from_str(&args.gateway_metrics_from)
            .map_err(|error| format!("--gateway-metrics-from is not a JSON list of NetworkPolicy peers: {error}"))?;
    // The operator collects the pods' usage from the admin port.
    if let Ok(namespace) = std::env::var("POD_NAMESPACE") {
        metrics_from.push(waycast_operator::render::network_policy::operator_peer(&namespace));
    }
    let egress = serde_json::from_str(&args.gateway_egress)
        .map_err(|error| format!("--gateway-egress is not a JSON list of NetworkPolicy egress rules: {error}"))?;
    Ok(Some(waycast_operator::render::network_policy::NetworkPolicySettings { metrics_from, egress }))
}
