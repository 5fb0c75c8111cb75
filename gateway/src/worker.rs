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
//! set's turn). What stays shared is read-mostly (the snapshot, the
//! endpoint table) or counted with atomics where the count must be global
//! (in-flight per endpoint, with that endpoint's request count and answer
//! times beside it on the same lines; rate limits).

use std::cell::Cell;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::shared::Shared;
use crate::tls::TlsFiles;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's worker index: 0 on any thread that is not a worker
/// (a gateway served on the caller's runtime uses one pool per model).
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Makes the calling thread worker `index`.
pub(crate) fn become_worker(index: usize) {
    INDEX.set(index);
}

/// Shards of a [`PerWorker`]: a 4-core pod runs 4 workers; twice that
/// keeps bigger pods mostly apart.
pub const SHARDS: usize = 8;

/// One `T` per worker, each on a cache line of its own, for what every
/// request writes: a value shared by every worker would be a line every
/// core writes per request. Workers past [`SHARDS`] share; readers see
/// [`PerWorker::all`].
#[derive(Debug, Default)]
pub struct PerWorker<T> {
    shards: [Padded<T>; SHARDS],
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> PerWorker<T> {
    /// The calling worker's own.
    pub fn mine(&self) -> &T {
        &self.shards[index() % SHARDS].0
    }

    /// Every shard.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.shards.iter().map(|shard| &shard.0)
    }
}

/// Runs `publish` `window` after the first write since its last run, for
/// as long as it runs: what a worker batches (access lines, metric counts)
/// waits at most `window`, and an idle worker does nothing.
pub async fn publish_batches(first: Arc<tokio::sync::Notify>, window: std::time::Duration, publish: fn()) {
    loop {
        first.notified().await;
        tokio::time::sleep(window).await;
        publish();
    }
}

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
        let mut closing = closing.clone();
        let thread = std::thread::Builder::new().name(format!("waycast-worker-{index}")).spawn(move || {
            become_worker(index);
            runtime.block_on(async move {
                let sweeper =
                    tokio::spawn(crate::upstream::Pool::sweep_while_idle(crate::upstream::http1::SWEEP_EVERY));
                // Spawned on this thread's runtime: it gathers this thread's lines.
                let access_lines = tokio::spawn(crate::access_log::gather_on_this_thread());
                let metric_counts = tokio::spawn(crate::proxy::series::flush_on_this_thread());
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
            });
            // Connections dropped with the runtime log their last lines.
            drop(runtime);
            crate::access_log::send_gathered();
            crate::proxy::series::flush_this_thread();
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
