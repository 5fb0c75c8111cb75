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
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::shared::{Shared, WorkerShared};
use crate::tls::TlsFiles;

/// Default longest time a client may take to send its request headers (slowloris guard).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// hyper's read buffer, which bounds the request head; requests whose
/// headers exceed [`crate::proxy::route::MAX_HEADER_BYTES`] but fit here get a
/// 431 in the path's dialect, larger ones hyper's own 431.
pub const MAX_BUF_SIZE: usize = 64 * 1024;

/// `header_read_timeout`: hyper's own, for a listener without a
/// connection watchdog (the admin one).
fn builder(header_read_timeout: Option<Duration>) -> auto::Builder<TokioExecutor> {
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

/// Connections the kernel may hold, handshake done, until the gateway
/// accepts them (clamped by `net.core.somaxconn`, 4096 by default on Linux
/// 5.4 and later). The usual 128 is far too few: a burst past it while every
/// core is busy has its SYNs dropped (the client retries after 1 s, 3 s, …)
/// or its handshake's last ACK dropped, which leaves a client that waits to
/// be spoken to holding a connection the gateway never sees.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `address` with a listen queue of [`LISTEN_BACKLOG`].
///
/// # Errors
/// When the socket cannot be created, bound or put in listening state.
pub fn bind(address: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    listen(address, false)
}

/// `count` listeners on one address (`SO_REUSEPORT`), one per worker, and
/// that address: the kernel hands each new connection to one of them. A
/// port of 0 is chosen by the first and shared by the rest.
///
/// # Errors
/// As [`bind`]; also when another process holds the port.
pub fn bind_shared(
    address: std::net::SocketAddr,
    count: usize,
) -> std::io::Result<(std::net::SocketAddr, Vec<TcpListener>)> {
    let first = listen(address, true)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..count {
        listeners.push(listen(bound, true)?);
    }
    Ok((bound, listeners))
}

fn listen(address: std::net::SocketAddr, shared: bool) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    // As std and tokio do: a restarted gateway can bind while connections
    // of the previous one linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(shared)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Streams one HTTP/2 connection may have open at once.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// How often an HTTP/2 connection is pinged; a peer that does not answer
/// within [`H2_KEEP_ALIVE_TIMEOUT`] is gone and the connection is closed.
pub const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// See [`H2_KEEP_ALIVE_INTERVAL`].
pub const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

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
    let shared = WorkerShared::new(shared);
    let header_read_timeout = shared.connections.header_read_timeout;
    // NB: without hyper's header timer, a boxed timer armed and dropped
    // for every request (about 800 instructions each): the connection's
    // watchdog (`Watch`) enforces the same deadline once per idle spell.
    let builder = Arc::new(builder(None));
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
        if shared.metrics.connections_open.get()
            >= i64::try_from(shared.connections.max_connections).unwrap_or(i64::MAX)
        {
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
        let client = crate::proxy::connection::Client::new(peer.ip(), tls.is_some());
        // Ends the connection if no request comes within the header timeout
        // (a client silent from the start, stalled in the HTTP/2 preface, or
        // silent after its TLS handshake), if an HTTP/1 connection's next
        // request does not come within it (an idle keep-alive connection, or
        // one whose next head is sent slowly), or if none is in flight for
        // the idle timeout.
        let watch = Watch {
            activity: client.activity.clone(),
            header_timeout: header_read_timeout,
            idle_timeout: shared.connections.idle_timeout,
        };
        tokio::spawn(async move {
            // Boxed: hyper keeps room for one request's future per HTTP/1
            // connection for as long as the connection lives, so a stream
            // that is only relaying would hold the whole (several KiB)
            // request future; boxed, that is freed once the response head
            // is out.
            let service =
                service_fn(move |request| Box::pin(crate::proxy::handle(shared.clone(), client.clone(), request)));
            match tls {
                None => serve_until_drained(&builder, TokioIo::new(stream), service, drain, watch).await,
                // Boxed so that the cleartext connections' tasks are not
                // sized for a TLS session.
                Some(acceptor) => {
                    Box::pin(async move {
                        let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                        let Ok(Ok(stream)) = handshake else {
                            tracing::debug!(%peer, "TLS handshake failed or timed out");
                            return;
                        };
                        serve_until_drained(&builder, TokioIo::new(stream), service, drain, watch).await;
                    })
                    .await
                }
            }
            drop(alive);
            drop(open);
        });
    }
}

/// One open client connection, counted in `waycast_gateway_connections_open`
/// from accept until its task ends (whichever way it ends).
struct OpenConnection(Arc<WorkerShared>);

impl OpenConnection {
    fn count(shared: &Arc<WorkerShared>) -> Self {
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
/// request in time, on HTTP/1 no next request in time, or no request in
/// flight for `idle_timeout`.
struct Watch {
    activity: Arc<crate::proxy::connection::ConnectionActivity>,
    header_timeout: Duration,
    idle_timeout: Duration,
}

impl Watch {
    /// Resolves when the first request did not come in time; never otherwise.
    async fn no_first_request(&self) {
        tokio::time::sleep(self.header_timeout).await;
        if self.activity.has_started() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the connection has been idle too long: for the idle
    /// timeout, or on HTTP/1 for the header timeout if that is shorter
    /// (an HTTP/1 client sends its next request's head within it, as it
    /// sent the first; HTTP/2 clients keep idle connections open).
    async fn idle(&self) {
        loop {
            // Before the first request, `no_first_request` watches.
            let limit = if self.activity.is_http2() || !self.activity.has_started() {
                self.idle_timeout
            } else {
                self.idle_timeout.min(self.header_timeout)
            };
            let idle = self.activity.idle_for();
            if idle >= limit {
                return;
            }
            // Until a request shows the protocol, look again within the
            // header timeout: an HTTP/1 connection's limit is that one.
            let wait = if self.activity.has_started() { limit - idle } else { (limit - idle).min(self.header_timeout) };
            tokio::time::sleep(wait).await;
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
    // The watchers run as a task of their own: inside this select they
    // were polled on every wake-up of the connection (three a request),
    // two timers and a channel each time, to learn nothing.
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let grace = watch.header_timeout;
    let watchdog = AbortOnDrop(tokio::spawn(async move {
        let why = tokio::select! {
            () = watch.no_first_request() => Stop::NoFirstRequest,
            () = async { let _ = drain.wait_for(|&draining| draining).await; } => Stop::Drain,
            () = watch.idle() => Stop::Idle,
        };
        let _ = stop.send(why);
    }));
    tokio::select! {
        biased;
        _ = connection.as_mut() => {}
        why = stopped => match why {
            // Nothing asked in time (a TLS client silent after its
            // handshake, or stalled in the HTTP/2 preface): dropped.
            Ok(Stop::NoFirstRequest) | Err(_) => {}
            // In-flight requests run to their end (HTTP/2 GOAWAY).
            Ok(Stop::Drain) => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
            // Nothing in flight for too long (so a client with many idle
            // connections cannot hold them): closed gracefully, and dropped
            // if that takes longer than the header timeout (an HTTP/1
            // client stalled inside its next request's head).
            Ok(Stop::Idle) => {
                connection.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(grace, connection).await;
            }
        },
    }
    drop(watchdog);
}

/// Why a connection's watchdog ends it.
enum Stop {
    NoFirstRequest,
    Drain,
    Idle,
}

/// A task that ends with its handle's owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends.
pub async fn serve_admin(listener: TcpListener, shared: Arc<Shared>) {
    let builder = Arc::new(builder(Some(HEADER_READ_TIMEOUT)));
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
