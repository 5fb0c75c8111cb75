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
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(1024);
    builder
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
    let builder = Arc::new(builder(shared.header_read_timeout));
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
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let builder = builder.clone();
        let drain = drain.clone();
        let alive = alive.clone();
        let tls = tls.as_ref().map(|files| files.acceptor());
        tokio::spawn(async move {
            let service = service_fn(move |request| crate::proxy::handle(shared.clone(), request));
            match tls {
                None => serve_until_drained(&builder, TokioIo::new(stream), service, drain).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                    let Ok(Ok(stream)) = handshake else {
                        tracing::debug!(%peer, "TLS handshake failed or timed out");
                        return;
                    };
                    serve_until_drained(&builder, TokioIo::new(stream), service, drain).await;
                }
            }
            drop(alive);
        });
    }
}

/// Runs one connection; when draining starts, lets its in-flight requests
/// finish and then closes it (HTTP/1: no more keep-alive; HTTP/2: GOAWAY).
async fn serve_until_drained<I, S>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    mut drain: watch::Receiver<bool>,
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
    tokio::select! {
        _ = connection.as_mut() => {}
        () = async { let _ = drain.wait_for(|&draining| draining).await; } => {
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
