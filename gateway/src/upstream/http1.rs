//! The upstream connection: HTTP/1.1 over TCP or rustls, written for the
//! relay's needs rather than hyper-util's general client (issue 18, item 4).
//!
//! - No connection task: the response body reads its socket itself, on
//!   the task that writes it to the client, so a relayed chunk costs one
//!   wake-up, not two.
//! - No buffers kept per connection: the request is written from one
//!   buffer that is dropped once sent, the response head is read into one
//!   that is dropped once parsed, and each body read lands in a scratch
//!   buffer on the stack whose data bytes are copied out at their own size
//!   ([`super::framing`]). An idle or waiting stream holds a socket and a
//!   few integers.
//! - Pools per thread, so per data-plane worker (`crate::worker`), with
//!   no lock: keyed by client, scheme and authority, last in first out,
//!   idle connections dropped after [`POOL_IDLE_TIMEOUT`], when the
//!   upstream has closed them or when their client is dropped. A request
//!   that fails on a reused connection before any byte of an answer (the
//!   upstream closed it as it was taken) is sent once more on a new one.
//!
//! What it does not do: HTTP/2 to upstreams (TLS offers only `http/1.1`
//! in ALPN), `Expect: 100-continue` (never sent), pipelining.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{CONNECTION, HeaderName, HeaderValue};
use http::uri::Authority;
use http::{HeaderMap, Method, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use waycast_crds::egress::Cidr;

use super::egress::{EgressDenied, allowed_addresses};
use super::framing::{Decoder, FramingError, framing, header_tokens};

/// How long an idle upstream connection stays pooled.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// At most this many idle connections per upstream address and worker.
const MAX_IDLE_PER_KEY: usize = 512;

/// How often a worker's pool drops its expired and closed connections.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The longest response head read: an upstream that sends more is broken.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The most response header fields read (hyper's default too).
const MAX_HEADERS: usize = 100;

/// Room left in a response's header map for the headers the gateway adds
/// before it goes out (its request id, up to six rate-limit headers): a
/// map sized to the upstream's fields alone grew, moving every entry, on
/// the gateway's first insert.
const ADDED_HEADERS: usize = 7;

/// One body read: a TLS record's worth.
const READ_SIZE: usize = 16 * 1024;

/// Bodies up to this size are written with the head, in one write.
const BODY_WITH_HEAD: usize = 64 * 1024;

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
    /// The upstream closed the connection before a response head.
    #[error("upstream closed the connection before answering")]
    Closed,
    /// The response head broke HTTP/1.1.
    #[error("upstream response: {0}")]
    Response(&'static str),
    /// The response body broke its framing.
    #[error("upstream body: {0}")]
    Body(#[from] FramingError),
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

/// A connection's byte stream.
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    /// Whether an idle connection can carry another request: the upstream
    /// has not closed it, and (cleartext) has sent nothing unasked. A TLS
    /// connection may hold a session ticket, so unread bytes are allowed.
    fn is_reusable(&self) -> bool {
        let tcp = match self {
            Io::Plain(tcp) => tcp,
            Io::Tls(tls) => tls.get_ref().0,
        };
        let mut byte = [MaybeUninit::uninit(); 1];
        let mut peeked = ReadBuf::uninit(&mut byte);
        match tcp.poll_peek(&mut Context::from_waker(Waker::noop()), &mut peeked) {
            Poll::Pending => true,
            Poll::Ready(Ok(0) | Err(_)) => false,
            Poll::Ready(Ok(_)) => matches!(self, Io::Tls(_)),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What a pooled connection is kept under: its client, TLS or not, and
/// the authority, compared byte for byte (an authority spelled in another
/// case only gets a pool of its own).
#[derive(Clone)]
struct PoolKey {
    client: u64,
    tls: bool,
    authority: Authority,
}

impl PartialEq for PoolKey {
    fn eq(&self, other: &Self) -> bool {
        self.client == other.client && self.tls == other.tls && self.authority.as_str() == other.authority.as_str()
    }
}

impl Eq for PoolKey {}

impl std::hash::Hash for PoolKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.client ^ u64::from(self.tls) << 63);
        state.write(self.authority.as_str().as_bytes());
    }
}

/// A SplitMix-mixed hash for the pool's keys (every request looks its
/// authority up twice, on take and on return; SipHash, which also hashes
/// `Authority` byte by byte, cost 4 % of a request). Keys come from the
/// config and the endpoint table, never from a client, so flooding the
/// table with colliding keys is not open to a caller.
#[derive(Default)]
struct PoolHasher(u64);

impl std::hash::Hasher for PoolHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        let mut tail = [0; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.write_u64(u64::from_le_bytes(tail) ^ bytes.len() as u64);
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = super::pick::mix(self.0 ^ word);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// An idle connection and since when.
struct Idle {
    io: Io,
    since: Instant,
}

/// One client's idle connections to one authority, on one thread.
struct Entry {
    /// Gone when the client is: its connections are then dropped.
    client: Weak<ClientId>,
    idle: Vec<Idle>,
}

/// The calling thread's idle connections, of every client.
pub struct Pool {
    entries: HashMap<PoolKey, Entry, BuildHasherDefault<PoolHasher>>,
    swept_at: Instant,
}

thread_local! {
    // One pool per thread: a worker's connections stay on its runtime and
    // its reactor, and taking one needs no lock.
    static POOL: RefCell<Pool> = RefCell::new(Pool { entries: HashMap::default(), swept_at: Instant::now() });
}

impl Pool {
    /// Drops expired and closed connections and those of dropped clients,
    /// at most every [`SWEEP_EVERY`]: an upstream or a config that went
    /// away leaves no sockets behind for long.
    fn sweep(&mut self, now: Instant) {
        if now.saturating_duration_since(self.swept_at) < SWEEP_EVERY {
            return;
        }
        self.sweep_now(now);
    }

    fn sweep_now(&mut self, now: Instant) {
        self.swept_at = now;
        self.entries.retain(|_, entry| {
            if entry.client.strong_count() == 0 {
                return false;
            }
            entry.idle.retain(|idle| idle.is_fresh(now));
            !entry.idle.is_empty()
        });
    }

    /// Sweeps this thread's pool every `every` for as long as the task
    /// runs (a worker runs it with [`SWEEP_EVERY`]), so that a worker with
    /// no requests does not keep the sockets its upstreams have closed.
    pub async fn sweep_while_idle(every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            POOL.with(|pool| {
                if let Ok(mut pool) = pool.try_borrow_mut() {
                    pool.sweep_now(Instant::now());
                }
            });
        }
    }

    /// This thread's idle connections.
    #[cfg(test)]
    fn idle_connections() -> usize {
        POOL.with_borrow(|pool| pool.entries.values().map(|entry| entry.idle.len()).sum())
    }

    /// A live idle connection for `key`, the most recently used first.
    fn take(key: &PoolKey) -> Option<Io> {
        POOL.with(|pool| {
            let mut pool = pool.try_borrow_mut().ok()?;
            let now = Instant::now();
            pool.sweep(now);
            let entry = pool.entries.get_mut(key)?;
            while let Some(idle) = entry.idle.pop() {
                if idle.is_fresh(now) {
                    return Some(idle.io);
                }
            }
            None
        })
    }

    fn put(client: Weak<ClientId>, key: PoolKey, io: Io) {
        POOL.with(|pool| {
            let Ok(mut pool) = pool.try_borrow_mut() else { return };
            let now = Instant::now();
            pool.sweep(now);
            let entry = pool.entries.entry(key).or_insert_with(|| Entry { client, idle: Vec::new() });
            if entry.idle.len() < MAX_IDLE_PER_KEY {
                entry.idle.push(Idle { io, since: now });
            }
        });
    }
}

impl Idle {
    fn is_fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) < POOL_IDLE_TIMEOUT && self.io.is_reusable()
    }
}

/// Where a connection goes back once its response has been read.
struct Checkin {
    client: Weak<ClientId>,
    key: PoolKey,
}

impl Checkin {
    fn put(self, io: Io) {
        if self.client.strong_count() > 0 {
            Pool::put(self.client, self.key, io);
        }
    }
}

/// A client's identity in the pools (ids are never reused).
struct ClientId(u64);

/// An HTTP/1.1 client whose connections are pooled per thread (so per
/// data-plane worker). Cloning shares its pooled connections.
#[derive(Clone)]
pub struct UpstreamClient {
    connect_timeout: Duration,
    denied: Arc<[Cidr]>,
    tls: tokio_rustls::TlsConnector,
    server_name: Option<ServerName<'static>>,
    id: Arc<ClientId>,
}

impl UpstreamClient {
    /// A client whose connects (TCP and TLS) give up after
    /// `connect_timeout`, reach no address in `denied` (nor
    /// link-local/metadata ones) and check certificates with `tls`, against
    /// `server_name` when set (else the URL's host).
    pub fn new(
        connect_timeout: Duration,
        denied: Arc<[Cidr]>,
        mut tls: rustls::ClientConfig,
        server_name: Option<ServerName<'static>>,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Self {
            connect_timeout,
            denied,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            server_name,
            id: Arc::new(ClientId(NEXT_ID.fetch_add(1, Ordering::Relaxed))),
        }
    }

    /// Sends `request` on a pooled connection of the calling worker, or a
    /// new one, and reads the response head.
    ///
    /// # Errors
    /// See [`UpstreamError`]; [`UpstreamError::is_connect`] tells whether the
    /// request can have reached the upstream.
    pub async fn request(&self, request: UpstreamRequest) -> Result<Response<UpstreamBody>, UpstreamError> {
        let UpstreamRequest { tls, authority, head_only, wire, body } = request;
        let key = PoolKey { client: self.id.0, tls, authority };
        if let Some(io) = Pool::take(&key) {
            match exchange(io, &wire, &body, head_only).await {
                Ok(answer) => return Ok(self.respond(answer, key)),
                Err(failed) if failed.nothing_read => {
                    tracing::debug!(error = %failed.error, "pooled upstream connection was closed; sending on a new one");
                }
                Err(failed) => return Err(failed.error),
            }
        }
        let io = self.connect(&key).await?;
        let answer = exchange(io, &wire, &body, head_only).await.map_err(|failed| failed.error)?;
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
        let PoolKey { tls, authority, .. } = key;
        let connecting = async {
            let host = authority.host();
            let port = authority.port_u16().unwrap_or(if *tls { 443 } else { 80 });
            let addresses = resolve(host, port, &self.denied).await?;
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
                .connect(name, tcp)
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

/// The addresses `host` may be reached at. IP literals are taken as they
/// are (config validation and the operator check those); names resolve on
/// the blocking pool and lose every address the egress guard refuses.
async fn resolve(host: &str, port: u16, denied: &[Cidr]) -> Result<Vec<SocketAddr>, UpstreamError> {
    if let Ok(ip) = unbracketed(host).parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| UpstreamError::Resolve { host: host.to_owned(), source })?
        .collect();
    let (allowed, why) = allowed_addresses(resolved, denied);
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

/// A request for [`UpstreamClient::request`]: its head already in wire
/// form, with the body too when that is small (one write).
pub struct UpstreamRequest {
    tls: bool,
    authority: Authority,
    head_only: bool,
    wire: Vec<u8>,
    body: Bytes,
}

impl UpstreamRequest {
    /// Starts `method target HTTP/1.1` to `authority` (over TLS when
    /// `tls`), carrying `body`. The head is written as it is built: no
    /// header map stands between the client's request and the bytes sent.
    pub fn build(method: &Method, tls: bool, authority: Authority, target: &str, body: Bytes) -> RequestHead {
        const HEAD_ROOM: usize = 512;
        let inline_body = if body.len() <= BODY_WITH_HEAD { body.len() } else { 0 };
        let mut wire = Vec::with_capacity(HEAD_ROOM + target.len() + inline_body);
        wire.extend_from_slice(method.as_str().as_bytes());
        wire.push(b' ');
        wire.extend_from_slice(target.as_bytes());
        wire.extend_from_slice(b" HTTP/1.1\r\n");
        RequestHead { request: Self { tls, authority, head_only: method == Method::HEAD, wire, body } }
    }
}

#[cfg(test)]
impl UpstreamRequest {
    /// What is written first: the head, with the body when it is small.
    pub fn wire(&self) -> &[u8] {
        &self.wire
    }
}

/// An [`UpstreamRequest`] whose header fields are being written.
pub struct RequestHead {
    request: UpstreamRequest,
}

impl RequestHead {
    /// Adds a header field. `Content-Length` is [`RequestHead::finish`]'s
    /// to write; `Host` is the caller's.
    pub fn header(&mut self, name: &HeaderName, value: &HeaderValue) {
        let wire = &mut self.request.wire;
        wire.extend_from_slice(name.as_str().as_bytes());
        wire.extend_from_slice(b": ");
        wire.extend_from_slice(value.as_bytes());
        wire.extend_from_slice(b"\r\n");
    }

    /// Ends the head with the body's `Content-Length`.
    pub fn finish(self) -> UpstreamRequest {
        let mut request = self.request;
        let wire = &mut request.wire;
        wire.extend_from_slice(b"content-length: ");
        crate::json_text::decimal(request.body.len() as u64, wire);
        wire.extend_from_slice(b"\r\n\r\n");
        if request.body.len() <= BODY_WITH_HEAD {
            wire.extend_from_slice(&request.body);
        }
        request
    }
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

/// An exchange that failed, and whether the upstream sent nothing at all
/// (so the request may be sent again on another connection).
struct Failed {
    error: UpstreamError,
    nothing_read: bool,
}

/// Writes the request and reads the response head off `io`.
async fn exchange(mut io: Io, wire: &[u8], body: &Bytes, head_only: bool) -> Result<Answer, Failed> {
    let unanswered = |error| Failed { error, nothing_read: true };
    io.write_all(wire).await.map_err(|e| unanswered(UpstreamError::Io(e)))?;
    if body.len() > BODY_WITH_HEAD {
        io.write_all(body).await.map_err(|e| unanswered(UpstreamError::Io(e)))?;
    }
    io.flush().await.map_err(|e| unanswered(UpstreamError::Io(e)))?;

    let mut buf = BytesMut::with_capacity(2048);
    loop {
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        let read = io.read_buf(&mut buf).await;
        let nothing_read = buf.is_empty();
        let failed = |error| Failed { error, nothing_read };
        match read {
            Err(error) => return Err(failed(UpstreamError::Io(error))),
            Ok(0) if nothing_read => return Err(failed(UpstreamError::Closed)),
            Ok(0) => return Err(failed(UpstreamError::Response("closed inside the response head"))),
            Ok(_) => {}
        }
        // Shared while it is parsed: the header values and the body's first
        // bytes are slices of it, not copies.
        let mut read_so_far = std::mem::take(&mut buf).freeze();
        // Informational answers (100 Continue, 103 Early Hints) are skipped.
        while let Some((head, head_len)) = parse_head(&read_so_far).map_err(failed)? {
            read_so_far.advance(head_len);
            if head.status.is_informational() {
                continue;
            }
            return answer(io, head, &read_so_far, head_only).map_err(failed);
        }
        if read_so_far.len() >= MAX_HEAD_BYTES {
            return Err(failed(UpstreamError::Response("response head longer than 64 KiB")));
        }
        // Not all of the head yet: read on into the same buffer, which
        // nothing else holds now.
        buf = read_so_far.try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    }
}

/// The framing of a parsed head, and the body bytes read with it.
fn answer(io: Io, head: http::response::Parts, rest: &Bytes, head_only: bool) -> Result<Answer, UpstreamError> {
    let framing = framing(head_only, head.status.as_u16(), &head.headers)?;
    let mut decoder = Decoder::new(framing);
    let (first, used) = decoder.decode_shared(rest)?;
    let keep_alive = head.version == Version::HTTP_11
        && !wants_close(&head.headers)
        && framing != super::framing::Framing::UntilClose
        // Bytes after the body are no answer to anything we asked.
        && used == rest.len();
    Ok(Answer { head, decoder, first, io, keep_alive })
}

/// Whether `Connection` says `close`.
fn wants_close(headers: &HeaderMap) -> bool {
    header_tokens(headers, &CONNECTION).any(|token| token.eq_ignore_ascii_case("close"))
}

/// The response head at the start of `buf` and its length; `None` while
/// it is incomplete.
fn parse_head(buf: &Bytes) -> Result<Option<(http::response::Parts, usize)>, UpstreamError> {
    // Uninitialised: httparse writes the fields it finds, and filling 100
    // empty ones first cost more than parsing a short head.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let head_len =
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut parsed, buf, &mut fields) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(UpstreamError::Response("more than 100 header fields")),
            Err(_) => return Err(UpstreamError::Response("malformed response head")),
        };
    let code = parsed.code.ok_or(UpstreamError::Response("malformed status line"))?;
    let status = StatusCode::from_u16(code).map_err(|_| UpstreamError::Response("invalid status code"))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(UpstreamError::Response("unasked protocol switch"));
    }
    let mut headers = HeaderMap::with_capacity(parsed.headers.len() + ADDED_HEADERS);
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| UpstreamError::Response("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(buf.slice_ref(field.value))
            .map_err(|_| UpstreamError::Response("invalid header value"))?;
        headers.append(name, value);
    }
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = if parsed.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
    *response.headers_mut() = headers;
    Ok(Some((response.into_parts().0, head_len)))
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
