//! The data plane's share-nothing layout (`--workers N`): N threads, each
//! with its own single-threaded tokio runtime, its own listener on the
//! public address (`SO_REUSEPORT`: the kernel spreads new connections over
//! them) and its own upstream pools ([`crate::upstream::UpstreamClient`]).
//! A client connection, its requests, their upstream connections and the
//! tasks and timers of all of them stay on the thread that accepted it: no
//! work stealing moves them, no pool lock or task wake-up crosses cores.
//!
//! ```text
//! control thread (config, endpoints, admin, heartbeat) ─► Arc<Shared> (ArcSwap snapshot) ◄─ read by every worker
//! worker i: listener i ─► connections ─► requests ─► upstream pool i
//! ```
//!
//! What every request writes is per worker where a global figure is only
//! read now and then ([`PerWorker`]: the in-flight and open-connection
//! gauges, the retry budget; the per-model and per-key counters and
//! histograms, published now and then by `proxy::series`; each endpoint
//! set's turn; handles on the snapshot and the endpoint sets, and copies
//! of the names and authorities a request holds, [`Copies`]). What stays
//! shared is read-mostly (the snapshot, the endpoint table) or counted
//! with atomics where the count must be global (in-flight per endpoint,
//! with that endpoint's request count and answer times beside it on the
//! same lines; rate limits).

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::per_worker::become_worker;
use crate::shared::Shared;
use crate::tls::TlsFiles;

/// The running workers.
pub struct Workers {
    threads: Vec<std::thread::JoinHandle<()>>,
    close: watch::Sender<bool>,
}

/// Starts one worker per listener. Each serves its listener until `drain`
/// turns true, then keeps its runtime (and so its open connections) until
/// [`Workers::close`].
///
/// # Errors
/// A runtime or thread cannot be created, or a listener cannot be moved to
/// its runtime.
pub fn spawn(
    listeners: Vec<tokio::net::TcpListener>,
    shared: &Arc<Shared>,
    tls: Option<&Arc<TlsFiles>>,
    drain: &watch::Receiver<bool>,
    alive: &mpsc::Sender<()>,
) -> std::io::Result<Workers> {
    let (close, closing) = watch::channel(false);
    let mut threads = Vec::with_capacity(listeners.len());
    for (index, listener) in listeners.into_iter().enumerate() {
        // Taken off the caller's runtime, registered again on the worker's.
        let listener = listener.into_std()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (shared, tls, drain, alive) = (shared.clone(), tls.cloned(), drain.clone(), alive.clone());
        // Kept past the runtime: the worker hands its last records over.
        let kept = shared.clone();
        let mut closing = closing.clone();
        let thread = std::thread::Builder::new().name(format!("waycast-worker-{index}")).spawn(move || {
            become_worker(index);
            runtime.block_on(async move {
                let sweeper = tokio::spawn(crate::upstream::Pool::sweep_while_idle(crate::upstream::pool::SWEEP_EVERY));
                // Spawned on this thread's runtime: it gathers this thread's lines.
                let access_lines = tokio::spawn(crate::access_log::gather_on_this_thread());
                let metric_counts = tokio::spawn(crate::proxy::series::flush_on_this_thread());
                let records =
                    tokio::spawn(crate::telemetry::gather_on_this_thread(shared.clone(), |s| s.telemetry.exporter()));
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => crate::server::serve_public(listener, shared, tls, drain, alive).await,
                    Err(error) => tracing::error!(%error, worker = index, "cannot serve the public listener"),
                }
                // Accepting has stopped; connections still open run here
                // until the drain is over.
                let _ = closing.wait_for(|&closed| closed).await;
                sweeper.abort();
                access_lines.abort();
                metric_counts.abort();
                records.abort();
            });
            // Connections dropped with the runtime log their last lines.
            drop(runtime);
            crate::access_log::send_gathered();
            crate::proxy::series::flush_this_thread();
            crate::telemetry::send_gathered(|| kept.telemetry.exporter());
        })?;
        threads.push(thread);
    }
    Ok(Workers { threads, close })
}

impl Workers {
    /// Ends every worker: what is still open is dropped with its runtime.
    pub async fn close(self) {
        let _ = self.close.send(true);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}
