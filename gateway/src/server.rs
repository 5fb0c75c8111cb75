//! Listeners and connections: the public listener (HTTP/1.1 and HTTP/2,
//! cleartext h2c or TLS with ALPN) and the admin listener, with graceful
//! drain.
//!
//! ```text
//! accept ─► TCP_NODELAY ─► [TLS handshake] ─► hyper auto (h1 | h2) ─► proxy::handle
//!   drain: stop accepting ─► each connection finishes its in-flight requests, then closes
//!          ─► the caller waits (≤ drain timeout) for the last connection's `alive` sender to drop
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::Shared;
use crate::tls::TlsFiles;

/// Default longest time a client may take to send its request headers (slowloris guard).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// hyper's read buffer, which bounds the request head; requests whose
/// headers exceed [`crate::proxy::MAX_HEADER_BYTES`] but fit here get an
/// OpenAI-shaped 431, larger ones hyper's own 431.
pub const MAX_BUF_SIZE: usize = 64 * 1024;

fn builder(header_read_timeout: Duration) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_BUF_SIZE)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .keep_alive_interval(Some(H2_KEEP_ALIVE_INTERVAL))
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
    builder
}

/// Streams one HTTP/2 connection may have open at once.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// How often an HTTP/2 connection is pinged; a peer that does not answer
/// within [`H2_KEEP_ALIVE_TIMEOUT`] is gone and the connection is closed.
pub const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// See [`H2_KEEP_ALIVE_INTERVAL`].
pub const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP/2 connection preface; protocol detection waits for all of it.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Waits, at most `timeout`, until the client has sent enough to tell its
/// protocol: a first byte that does not start the HTTP/2 preface (HTTP/1,
/// whose header timeout hyper enforces), or the whole preface. False when
/// the client sent nothing, or stalled inside the preface, in time — hyper's
/// own timers start only after that.
async fn first_bytes_in_time(stream: &tokio::net::TcpStream, timeout: Duration) -> bool {
    let waited = tokio::time::timeout(timeout, async {
        let mut seen = [0_u8; 24];
        loop {
            let n = stream.peek(&mut seen).await.unwrap_or(0);
            if n == 0 {
                return false;
            }
            if seen[..n] != H2_PREFACE[..n] || n == H2_PREFACE.len() {
                return true;
            }
            // A partial preface: wait for more of it.
            if stream.readable().await.is_err() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    waited.await.unwrap_or(false)
}

/// Accepts public connections until `drain` turns true, then returns. Each
/// connection holds a clone of `alive` until it has closed, so the caller
/// learns when the last one is gone.
pub async fn serve_public(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<Arc<TlsFiles>>,
    drain: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    let header_read_timeout = shared.header_read_timeout;
    let builder = Arc::new(builder(header_read_timeout));
    loop {
        let mut stop = drain.clone();
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = async { let _ = stop.wait_for(|&draining| draining).await; } => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: back off briefly
                // rather than spin.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        // Past the cap a new connection is closed at once (and counted):
        // the ones already open keep their share of the pod.
        if shared.metrics.connections_open.get() >= i64::try_from(shared.max_connections).unwrap_or(i64::MAX) {
            shared.metrics.connections_refused.inc();
            drop(stream);
            continue;
        }
        let open = OpenConnection::count(&shared);
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let builder = builder.clone();
        let drain = drain.clone();
        let alive = alive.clone();
        let tls = tls.as_ref().map(|files| files.acceptor());
        // Formatted once per connection, sent upstream with each request.
        let client = crate::proxy::Client::new(peer.ip(), tls.is_some());
        let watch = Watch { activity: client.activity.clone(), idle_timeout: shared.idle_timeout, first: None };
        tokio::spawn(async move {
            // Set by the first request: until then the header timeout also
            // bounds the wait (over TLS, where the bytes cannot be peeked).
            let requested = Arc::new(AtomicBool::new(false));
            let marker = requested.clone();
            let service = service_fn(move |request| {
                marker.store(true, Ordering::Relaxed);
                crate::proxy::handle(shared.clone(), client.clone(), request)
            });
            match tls {
                None => {
                    if !first_bytes_in_time(&stream, header_read_timeout).await {
                        tracing::debug!(%peer, "no request in time; closing the connection");
                        return;
                    }
                    serve_until_drained(&builder, TokioIo::new(stream), service, drain, watch).await;
                }
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                    let Ok(Ok(stream)) = handshake else {
                        tracing::debug!(%peer, "TLS handshake failed or timed out");
                        return;
                    };
                    let first = Some(FirstRequest { requested, within: header_read_timeout });
                    serve_until_drained(&builder, TokioIo::new(stream), service, drain, Watch { first, ..watch }).await;
                }
            }
            drop(alive);
            drop(open);
        });
    }
}

/// One open client connection, counted in `waycast_gateway_connections_open`
/// from accept until its task ends (whichever way it ends).
struct OpenConnection(Arc<Shared>);

impl OpenConnection {
    fn count(shared: &Arc<Shared>) -> Self {
        shared.metrics.connections_open.inc();
        Self(shared.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.metrics.connections_open.dec();
    }
}

/// What ends a connection besides its client and the drain: no first
/// request in time, or no request in flight for `idle_timeout`.
struct Watch {
    activity: Arc<crate::proxy::stream::ConnectionActivity>,
    idle_timeout: Duration,
    first: Option<FirstRequest>,
}

impl Watch {
    /// Resolves once the connection has been idle for `idle_timeout`.
    async fn idle(&self) {
        loop {
            let idle = self.activity.idle_for();
            if idle >= self.idle_timeout {
                return;
            }
            tokio::time::sleep(self.idle_timeout - idle).await;
        }
    }
}

/// A connection's first request must arrive `within` this long.
struct FirstRequest {
    requested: Arc<AtomicBool>,
    within: Duration,
}

impl FirstRequest {
    /// Resolves when the deadline passed without a request; never otherwise.
    async fn missed(&self) {
        tokio::time::sleep(self.within).await;
        if self.requested.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs one connection; when draining starts, lets its in-flight requests
/// finish and then closes it (HTTP/1: no more keep-alive; HTTP/2: GOAWAY).
async fn serve_until_drained<I, S>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    mut drain: watch::Receiver<bool>,
    watch: Watch,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<crate::proxy::stream::ProxyBody>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let missed = async {
        match &watch.first {
            Some(first) => first.missed().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = connection.as_mut() => {}
        // Nothing asked in time (a TLS client silent after its handshake,
        // or stalled in the HTTP/2 preface): the connection is dropped.
        () = missed => {}
        () = async { let _ = drain.wait_for(|&draining| draining).await; } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
        // Nothing in flight for the idle timeout: closed gracefully (HTTP/2
        // GOAWAY), so a client with many idle connections cannot hold them.
        () = watch.idle() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends.
pub async fn serve_admin(listener: TcpListener, shared: Arc<Shared>) {
    let builder = Arc::new(builder(HEADER_READ_TIMEOUT));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let shared = shared.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(crate::admin::respond(&shared, &request)) }
            });
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
