//! The upstream connection: HTTP/1.1 over TCP or rustls, written for the
//! relay's needs rather than hyper-util's general client.
//!
//! - No connection task: the response body reads its socket itself, on
//!   the task that writes it to the client, so a relayed chunk costs one
//!   wake-up, not two.
//! - No buffers kept per connection: the request is written from one
//!   buffer that is dropped once sent, the response head is read into one
//!   that is dropped once parsed ([`super::wire`]), and each body read
//!   lands in a scratch buffer on the stack whose data bytes are copied
//!   out at their own size ([`super::framing`]). An idle or waiting stream
//!   holds a socket and a few integers.
//! - Pools per thread ([`super::pool`]). A byte an upstream sends reaches
//!   only the request it answers: a response framed two ways is refused,
//!   the `Content-Length` relayed is the length read, a connection with
//!   bytes after its answer is not kept, and one that received anything
//!   while idle is closed when taken ([`super::io`]).
//! - A request is sent again on a new connection only when writing it to
//!   a pooled one failed: once written, the upstream may be executing it.
//!
//! What it does not do: HTTP/2 to upstreams (TLS offers only `http/1.1`
//! in ALPN), `Expect: 100-continue` (never sent), pipelining.

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HeaderValue};
use http::uri::Authority;
use http::{HeaderMap, Response, Version};
use http_body::{Body, Frame, SizeHint};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use waycast_crds::egress::EgressPolicy;

use super::body_rest::RestError;
use super::egress::{EgressDenied, allowed_addresses};
use super::framing::{Decoder, Framing, FramingError, check_version, framing, header_tokens};
use super::io::{Io, Records};
use super::pool::{Checkin, ClientId, Pool, PoolKey};
use super::wire::{HeadError, UpstreamRequest, read_head};

/// One body read: a TLS record's worth.
const READ_SIZE: usize = 16 * 1024;

/// How an upstream request failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The host name did not resolve.
    #[error("resolving {host}: {source}")]
    Resolve {
        /// The host name.
        host: String,
        /// Why.
        source: io::Error,
    },
    /// The egress guard refused every address of the host.
    #[error(transparent)]
    EgressDenied(#[from] EgressDenied),
    /// No address accepted the connection.
    #[error("connecting to {authority}: {source}")]
    Connect {
        /// Where.
        authority: String,
        /// Why.
        source: io::Error,
    },
    /// Connecting (TCP and TLS) took longer than the connect timeout.
    #[error("connecting to {authority}: no connection within {timeout:?}")]
    ConnectTimeout {
        /// Where.
        authority: String,
        /// The connect timeout.
        timeout: Duration,
    },
    /// The TLS handshake failed.
    #[error("TLS with {authority}: {source}")]
    Tls {
        /// Where.
        authority: String,
        /// Why.
        source: io::Error,
    },
    /// Reading or writing the connection failed.
    #[error("upstream connection: {0}")]
    Io(#[source] io::Error),
    /// No response head: the upstream closed first, or sent one that
    /// breaks HTTP/1.1 or its bounds.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// The response body broke its framing.
    #[error("upstream body: {0}")]
    Body(#[from] FramingError),
    /// The request body's streamed rest could not be sent whole.
    #[error(transparent)]
    RequestBody(#[from] RestError),
}

impl UpstreamError {
    /// Whether no connection was made: nothing reached the upstream.
    pub fn is_connect(&self) -> bool {
        matches!(
            self,
            UpstreamError::Resolve { .. }
                | UpstreamError::EgressDenied(_)
                | UpstreamError::Connect { .. }
                | UpstreamError::ConnectTimeout { .. }
                | UpstreamError::Tls { .. }
        )
    }

    /// Whether the egress guard refused every address.
    pub fn is_egress_denied(&self) -> bool {
        matches!(self, UpstreamError::EgressDenied(_))
    }
}

/// An HTTP/1.1 client whose connections are pooled per thread (so per
/// data-plane worker). Cloning shares its pooled connections.
#[derive(Clone)]
pub struct UpstreamClient {
    connect_timeout: Duration,
    egress: Arc<EgressPolicy>,
    tls: tokio_rustls::TlsConnector,
    server_name: Option<ServerName<'static>>,
    id: Arc<ClientId>,
}

impl UpstreamClient {
    /// A client whose connects (TCP and TLS) give up after
    /// `connect_timeout`, reach no link-local/metadata address and, for
    /// guarded requests (`url` backends), none `egress` refuses, and check
    /// certificates with `tls`, against `server_name` when set (else the
    /// URL's host).
    pub fn new(
        connect_timeout: Duration,
        egress: Arc<EgressPolicy>,
        mut tls: rustls::ClientConfig,
        server_name: Option<ServerName<'static>>,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Self {
            connect_timeout,
            egress,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            server_name,
            id: Arc::new(ClientId(NEXT_ID.fetch_add(1, Ordering::Relaxed))),
        }
    }

    /// The egress policy its `url` backends' connects are held to.
    #[cfg(test)]
    pub fn egress_policy(&self) -> Arc<EgressPolicy> {
        self.egress.clone()
    }

    /// Sends `request` on a pooled connection of the calling worker, or a
    /// new one, and reads the response head.
    ///
    /// # Guarantees
    /// The request is written to at most two connections, and to the
    /// second only when writing it to the first (a pooled one) failed.
    ///
    /// # Errors
    /// See [`UpstreamError`]; [`UpstreamError::is_connect`] tells whether the
    /// request can have reached the upstream.
    pub async fn request(&self, request: UpstreamRequest) -> Result<Response<UpstreamBody>, UpstreamError> {
        let key = PoolKey {
            client: self.id.0,
            tls: request.tls,
            guarded: request.guarded,
            authority: request.authority.clone(),
        };
        // A streamed body goes on a new connection: on a pooled one that
        // turns out closed, it could not be sent again.
        if let Some(io) = request.rest.is_none().then(|| Pool::take(&key)).flatten() {
            match exchange(io, &request).await {
                Ok(answer) => return Ok(self.respond(answer, key)),
                Err(Failed { error, written: false }) => {
                    tracing::debug!(%error, "writing on a pooled upstream connection failed; sending on a new one");
                }
                // NB: written, the request may be executing upstream even
                // though no answer came: never sent twice.
                Err(Failed { error, written: true }) => return Err(error),
            }
        }
        let io = self.connect(&key).await?;
        let answer = exchange(io, &request).await.map_err(|failed| failed.error)?;
        Ok(self.respond(answer, key))
    }

    fn respond(&self, answer: Answer, key: PoolKey) -> Response<UpstreamBody> {
        let Answer { head, decoder, first, io, keep_alive } = answer;
        let checkin = keep_alive.then(|| Checkin { client: Arc::downgrade(&self.id), key });
        let mut body = UpstreamBody {
            decoder,
            first: (!first.is_empty()).then_some(first),
            io: Some(io),
            checkin,
            just_relayed: false,
            failed: None,
        };
        if body.decoder.is_done() {
            body.release();
        }
        Response::from_parts(head, body)
    }

    async fn connect(&self, key: &PoolKey) -> Result<Io, UpstreamError> {
        let PoolKey { tls, guarded, authority, .. } = key;
        let connecting = async {
            let host = authority.host();
            let port = authority.port_u16().unwrap_or(if *tls { 443 } else { 80 });
            let egress = guarded.then_some(self.egress.as_ref());
            let addresses = resolve(host, port, egress).await?;
            let tcp = connect_any(&addresses, authority).await?;
            // NB: without TCP_NODELAY a body written after its head waits
            // for a delayed ACK: 40 ms per request on reused connections.
            tcp.set_nodelay(true)
                .map_err(|source| UpstreamError::Connect { authority: authority.to_string(), source })?;
            if !tls {
                return Ok(Io::Plain(tcp));
            }
            let name = match &self.server_name {
                Some(name) => name.clone(),
                None => ServerName::try_from(unbracketed(host).to_owned()).map_err(|e| UpstreamError::Tls {
                    authority: authority.to_string(),
                    source: io::Error::new(io::ErrorKind::InvalidInput, e),
                })?,
            };
            let stream = self
                .tls
                .connect(name, Records::new(tcp))
                .await
                .map_err(|source| UpstreamError::Tls { authority: authority.to_string(), source })?;
            Ok(Io::Tls(Box::new(stream)))
        };
        tokio::time::timeout(self.connect_timeout, connecting).await.map_err(|_| UpstreamError::ConnectTimeout {
            authority: authority.to_string(),
            timeout: self.connect_timeout,
        })?
    }
}

/// `[::1]` → `::1`.
fn unbracketed(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// The addresses `host` may be reached at: an IP literal as it is, a name
/// resolved on the blocking pool; every address the fixed guard refuses,
/// and under `egress` (a `url` backend) every one it refuses, left out.
async fn resolve(host: &str, port: u16, egress: Option<&EgressPolicy>) -> Result<Vec<SocketAddr>, UpstreamError> {
    let name = unbracketed(host);
    let resolved: Vec<SocketAddr> = match name.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|source| UpstreamError::Resolve { host: host.to_owned(), source })?
            .collect(),
    };
    let (allowed, why) = allowed_addresses(resolved, name, egress);
    if allowed.is_empty() {
        return Err(EgressDenied::new(host, why).into());
    }
    Ok(allowed)
}

/// The first of `addresses` that accepts a connection.
async fn connect_any(addresses: &[SocketAddr], authority: &Authority) -> Result<TcpStream, UpstreamError> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(tcp) => return Ok(tcp),
            Err(error) => last = error,
        }
    }
    Err(UpstreamError::Connect { authority: authority.to_string(), source: last })
}

/// A response head read off a connection.
struct Answer {
    head: http::response::Parts,
    decoder: Decoder,
    /// The body's first data bytes, read with the head.
    first: Bytes,
    io: Io,
    keep_alive: bool,
}

/// An exchange that failed, and whether the request was written whole
/// (then it may be executing upstream, and is never sent again).
struct Failed {
    error: UpstreamError,
    written: bool,
}

/// Writes the request and reads the response head off `io`.
async fn exchange(mut io: Io, request: &UpstreamRequest) -> Result<Answer, Failed> {
    let unwritten = |error| Failed { error: UpstreamError::Io(error), written: false };
    io.write_all(request.wire()).await.map_err(unwritten)?;
    if let Some(body) = request.body_after_head() {
        io.write_all(body).await.map_err(unwritten)?;
    }
    let written = |error| Failed { error, written: true };
    if let Some(rest) = &request.rest {
        rest.send(&mut io).await.map_err(|error| written(error.into()))?;
    }
    let begun = request.rest.is_some();
    io.flush().await.map_err(|error| Failed { error: UpstreamError::Io(error), written: begun })?;
    let head = match read_head(&mut io).await {
        Err(error) => return Err(written(UpstreamError::Io(error))),
        Ok(Err(error)) => return Err(written(error.into())),
        Ok(Ok(head)) => head,
    };
    answer(io, head.parts, &head.rest, request.head_only).map_err(written)
}

/// The framing of a final head, and the body bytes read with it. A
/// `Content-Length` goes on only as the one length the body is read by.
fn answer(io: Io, mut head: http::response::Parts, rest: &Bytes, head_only: bool) -> Result<Answer, UpstreamError> {
    check_version(head.version, &head.headers)?;
    let framing = framing(head_only, head.status.as_u16(), &head.headers)?;
    if let Framing::Length(length) = framing {
        keep_only_length(&mut head.headers, length);
    }
    let mut decoder = Decoder::new(framing);
    let (first, used) = decoder.decode_shared(rest)?;
    let keep_alive = head.version == Version::HTTP_11
        && !wants_close(&head.headers)
        && framing != Framing::UntilClose
        // Bytes after the body are no answer to anything we asked.
        && used == rest.len();
    Ok(Answer { head, decoder, first, io, keep_alive })
}

/// `Content-Length: length`, once: a list of equal values (`5, 5`) or a
/// value spelled otherwise (`05`) is written again as the length it means,
/// so that whoever reads the relayed response frames it as the gateway did.
fn keep_only_length(headers: &mut HeaderMap, length: u64) {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let mut canonical = itoa::Buffer::new();
    let canonical = canonical.format(length);
    let first = values.next().map(HeaderValue::as_bytes);
    if first == Some(canonical.as_bytes()) && values.next().is_none() {
        return;
    }
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
}

/// Whether `Connection` says `close`.
fn wants_close(headers: &HeaderMap) -> bool {
    header_tokens(headers, &CONNECTION).any(|token| token.eq_ignore_ascii_case("close"))
}

/// A response body read straight off its connection, which goes back to
/// its worker's pool when the body has ended (and may be kept), and is
/// closed when the body is dropped before that.
pub struct UpstreamBody {
    decoder: Decoder,
    /// Data read with the head, not yet handed out.
    first: Option<Bytes>,
    io: Option<Io>,
    /// Where the connection goes back; `None` when it may not be kept.
    checkin: Option<Checkin>,
    /// A frame was handed out by the last poll.
    just_relayed: bool,
    /// An error held back for one poll (see [`UpstreamBody::fail`]).
    failed: Option<UpstreamError>,
}

impl UpstreamBody {
    /// The body has ended: the connection goes back to its pool.
    fn release(&mut self) {
        if let (Some(io), Some(checkin)) = (self.io.take(), self.checkin.take()) {
            checkin.put(io);
        }
    }

    /// The body failed: the connection is closed and nothing more is read.
    /// Right after a frame (`after_frame`), the error waits for the next
    /// poll: hyper drops a response that errs without flushing what it
    /// holds, and what the upstream did send (an SSE event before a reset)
    /// should reach the client.
    fn fail(
        &mut self,
        cx: &Context<'_>,
        error: UpstreamError,
        after_frame: bool,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        self.decoder.end();
        self.io = None;
        self.checkin = None;
        if after_frame {
            self.failed = Some(error);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Some(Err(error)))
    }

    fn relay(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        self.just_relayed = true;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = self.get_mut();
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Some(Err(error)));
        }
        if let Some(first) = this.first.take() {
            return this.relay(first);
        }
        let after_frame = std::mem::take(&mut this.just_relayed);
        loop {
            if this.decoder.is_done() {
                this.release();
                return Poll::Ready(None);
            }
            let Some(io) = this.io.as_mut() else { return this.fail(cx, FramingError::Truncated.into(), after_frame) };
            let mut scratch = [MaybeUninit::<u8>::uninit(); READ_SIZE];
            let mut read = ReadBuf::uninit(&mut scratch);
            match Pin::new(io).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => return this.fail(cx, UpstreamError::Io(error), after_frame),
                Poll::Ready(Ok(())) => {}
            }
            let input = read.filled();
            if input.is_empty() {
                if let Err(error) = this.decoder.at_eof() {
                    return this.fail(cx, error.into(), after_frame);
                }
                this.io = None;
                return Poll::Ready(None);
            }
            let mut data = BytesMut::with_capacity(input.len());
            match this.decoder.decode(input, &mut data) {
                Err(error) => return this.fail(cx, error.into(), after_frame),
                // Bytes after the body: the connection is not kept.
                Ok(used) if used < input.len() => this.checkin = None,
                Ok(_) => {}
            }
            if this.decoder.is_done() {
                this.release();
            }
            if !data.is_empty() {
                return this.relay(data.freeze());
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.failed.is_none() && self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |first| first.len() as u64);
        match self.decoder.remaining() {
            Some(left) => SizeHint::with_exact(first + left),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
#[path = "http1_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "http1_properties.rs"]
mod properties;

#[cfg(test)]
#[path = "http1_oracle.rs"]
mod oracle;

#[cfg(test)]
#[path = "http1_servers.rs"]
mod servers;
