//! waycast's operator: Gateways, ModelEndpoints and ApiKeys reconciled into
//! fleets of gateway pods.
//!
//! ```text
//! watch ──► reflector stores ──► compile() ──► render() ──► apply ──► status
//!            (controller.rs)      pure          pure        SSA       SSA
//! ```

pub(crate) mod apply;
pub mod catalog;
pub mod compile;
pub mod config_plan;
pub(crate) mod context;
pub(crate) mod controller;
pub mod error;
pub(crate) mod events;
pub mod heartbeats;
pub mod key_sets;
pub(crate) mod leader;
pub mod metrics;
pub mod networks;
pub(crate) mod ownership;
pub mod programmed;
pub mod render;
pub mod secret_data;
pub mod status;
pub(crate) mod stores;
pub(crate) mod telemetry;
pub mod usage;
/// What each store keeps of the objects it watches (the goldens apply the same views).
pub use stores::kept as stored_form;
pub use stores::views as store_views;

use std::net::SocketAddr;
use std::sync::Arc;

use context::Context;

/// How to run the operator.
pub struct OperatorOptions {
    /// The gateway image for Gateways that name none.
    pub gateway_image: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub admin_listen: SocketAddr,
    /// Elect a leader through this namespace's Lease before reconciling
    /// (with the replica's identity).
    pub leader_election: Option<(String, String)>,
    /// The cluster's Service and Pod ranges, closed to `url` backends;
    /// empty: found from the ServiceCIDRs and the Nodes.
    pub cluster_cidrs: Vec<String>,
    /// The gateway pods' NetworkPolicy; `None`: none.
    pub network_policy: Option<render::network_policy::NetworkPolicySettings>,
    /// The collector each Gateway reconcile's span goes to (OTLP/HTTP);
    /// `None`: no traces, and no exporter thread.
    pub telemetry: Option<waycast_crds::telemetry::TelemetryConfig>,
}

/// How long the reconcile spans still queued may take to send on shutdown
/// (the chart gives the pod 10 s to stop).
const FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the operator with `client` until `shutdown` completes (then the
/// reconcile spans still queued are sent, 5 s at most) or the returned
/// future is dropped.
///
/// # Errors
/// The admin listener cannot bind, the stores cannot be filled, the
/// exporter's thread cannot start, or the leader Lease was lost.
pub async fn run(
    client: kube::Client,
    options: OperatorOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), error::Error> {
    let metrics = metrics::Metrics::new().map_err(|_| error::Error::Incomplete("metrics registry"))?;
    let listener = tokio::net::TcpListener::bind(options.admin_listen).await?;
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stores = stores::stores(&client).await?;
    let instance = options.leader_election.as_ref().map(|(_, identity)| identity.clone());
    let events = events::Publisher::new(client.clone(), "waycast-operator", instance);
    let networks = if options.cluster_cidrs.is_empty() {
        networks::ClusterNetworks::discovered()
    } else {
        networks::ClusterNetworks::fixed(options.cluster_cidrs)
    };
    let traces = match &options.telemetry {
        Some(config) => Some(telemetry::Traces::start(config, metrics.telemetry_counts())?),
        None => None,
    };
    let context = Arc::new(Context {
        events,
        client,
        stores,
        networks,
        key_sets: key_sets::KeySets::default(),
        secret_data: secret_data::SecretData::default(),
        settings: render::RenderSettings {
            gateway_image: options.gateway_image,
            network_policy: options.network_policy,
        },
        metrics,
        gateways: tokio::sync::RwLock::default(),
        failures: arc_swap::ArcSwap::from_pointee(std::collections::BTreeMap::new()),
        traces,
    });
    tokio::spawn(admin(listener, context.clone(), ready.clone()));
    let discovering = context.clone();
    tokio::spawn(async move { discovering.networks.keep_current(discovering.client.clone()).await });
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let flushing = context.clone();
    let operating = async move {
        match options.leader_election {
            None => {
                tracing::info!("operator running");
                controller::run(context).await;
            }
            Some((namespace, identity)) => {
                let lost = leader::lead(context.client.clone(), &namespace, identity).await;
                tracing::info!("operator running as the leader");
                tokio::select! {
                    () = controller::run(context) => {}
                    () = lost => {
                        tracing::error!("lost the leader Lease; exiting so that only one replica reconciles");
                        return Err(error::Error::Incomplete("leadership"));
                    }
                }
            }
        }
        Ok(())
    };
    let stopped = tokio::select! {
        stopped = operating => stopped,
        () = shutdown => Ok(()),
    };
    // The last reconciles' spans, before the process exits (the flush
    // blocks: off the runtime's one thread).
    if flushing.traces.is_some() {
        let flushed = tokio::task::spawn_blocking(move || {
            if let Some(traces) = &flushing.traces {
                traces.flush(FLUSH_DEADLINE);
            }
        });
        let _ = flushed.await;
    }
    stopped
}

async fn admin(listener: tokio::net::TcpListener, context: Arc<Context>, ready: Arc<std::sync::atomic::AtomicBool>) {
    use http_body_util::Full;
    use hyper::service::service_fn;
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let context = context.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let (status, body) = match request.uri().path() {
                    "/metrics" => {
                        let live = context
                            .stores
                            .gateways
                            .state()
                            .iter()
                            .map(|gateway| crate::compile::verdict::ObjectKey::of(&gateway.metadata).to_string())
                            .collect();
                        context.metrics.keep_gateways(&live);
                        (200, context.metrics.render())
                    }
                    "/healthz" => (200, "ok\n".to_owned()),
                    "/readyz" if ready.load(std::sync::atomic::Ordering::Relaxed) => (200, "ready\n".to_owned()),
                    "/readyz" => (503, "starting\n".to_owned()),
                    _ => (404, "not found\n".to_owned()),
                };
                let mut response = http::Response::new(Full::new(bytes::Bytes::from(body)));
                *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
                // Prometheus 3 refuses a scrape without one.
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}
