//! The connection task behind a [`super::redis::RedisCounter`]: connects
//! (TLS and `AUTH` when configured), loads the scripts, keeps this pod's
//! liveness key fresh, and pipelines calls until the connection breaks;
//! then again after a backoff, until the counter is dropped.
//!
//! ```text
//! calls ─► bounded queue ─► this task ─► one socket: every queued command written at once,
//!                                        replies matched to callers in order
//!          every ALIVE_REFRESH ─► SET <prefix>alive:<holder> PX ALIVE_TTL
//! ```
//!
//! Each connection counts concurrency under a holder of its own
//! (`<pod>-<random>-<connection>`): what an earlier connection held stops
//! counting when its liveness key expires, so a release lost with a broken
//! connection never leaves a count behind.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::TlsConnector;
use waycast_crds::config::RedisConfig;

use super::redis_scripts;
use super::resp::{self, Reply};
use crate::tls::{TlsError, client_config};

/// Why Redis did not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No connection (being re-established).
    #[error("Redis is unreachable")]
    Unreachable,
    /// No reply within the timeout.
    #[error("Redis did not answer in time")]
    Timeout,
    /// An error reply or a reply of the wrong shape.
    #[error("Redis answered with an error")]
    Reply,
    /// Too many calls already wait for Redis.
    #[error("too many calls wait for Redis")]
    Busy,
}

/// Calls that may wait to be written to Redis.
pub const MAX_QUEUED: usize = 4096;
/// Calls that may await their replies at once.
pub const MAX_IN_FLIGHT: usize = 4096;

impl StoreError {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            StoreError::Unreachable => "unreachable",
            StoreError::Timeout => "timeout",
            StoreError::Reply => "error_reply",
            StoreError::Busy => "queue_full",
        }
    }
}

/// `args` as one RESP command.
pub(super) fn command(args: &[Vec<u8>]) -> BytesMut {
    let parts: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let mut out = BytesMut::with_capacity(args.iter().map(|a| a.len() + 16).sum());
    resp::encode(&mut out, &parts);
    out
}

/// How long a holder counts without a refresh of its liveness key.
pub const ALIVE_TTL: Duration = Duration::from_secs(10);
/// How often a connection refreshes its liveness key.
pub const ALIVE_REFRESH: Duration = Duration::from_secs(3);

/// One call to Redis, and where its reply goes (none: fire and forget).
pub(super) struct Call {
    pub(super) command: BytesMut,
    pub(super) reply: Option<oneshot::Sender<Result<Reply, StoreError>>>,
}

/// What the connection task reads: calls that wait for a reply (bounded:
/// past [`MAX_QUEUED`] a caller fails at once), and the settlements and
/// releases owed for admissions already made (one at most per admitted
/// request, so bounded by the requests in flight; never dropped for want
/// of room, which would leave a count behind).
pub(super) struct Queues {
    pub(super) calls: mpsc::Receiver<Call>,
    pub(super) after: mpsc::UnboundedReceiver<BytesMut>,
    /// One taken from `after` and not yet written: calls queued before it
    /// go first.
    pub(super) held_back: Option<BytesMut>,
}

/// A reply owed, and who waits for it (none: nobody).
type Waiting = VecDeque<Option<oneshot::Sender<Result<Reply, StoreError>>>>;

impl Queues {
    /// Moves what is queued into `outgoing`: calls first, then settlements
    /// and releases. A release owed for an admission whose answer was lost
    /// is queued after that admission; taking the calls first writes the
    /// admission first, and Redis runs a connection's commands in order, so
    /// a release never runs before what it releases (which would then stay
    /// counted until its holder expires).
    fn take_queued(&mut self, waiting: &mut Waiting, outgoing: &mut BytesMut) {
        while waiting.len() < MAX_IN_FLIGHT
            && let Ok(call) = self.calls.try_recv()
        {
            outgoing.extend_from_slice(&call.command);
            waiting.push_back(call.reply);
        }
        if !self.calls.is_empty() {
            return;
        }
        while waiting.len() < MAX_IN_FLIGHT {
            let Some(after) = self.held_back.take().or_else(|| self.after.try_recv().ok()) else { break };
            outgoing.extend_from_slice(&after);
            waiting.push_back(None);
        }
    }
}

/// What the connection task tells of its connection.
pub(super) struct Link {
    pub(super) connected: AtomicBool,
    pub(super) failed_connects: AtomicU64,
    /// The holder concurrency is counted under on this connection.
    pub(super) holder: arc_swap::ArcSwap<String>,
    /// This process's part of every holder name.
    base: String,
    connections: AtomicU64,
}

impl Link {
    pub(super) fn new() -> Self {
        let pod = std::env::var(waycast_crds::gateway_pod::env::POD_NAME)
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "gateway".to_owned());
        let pod: String = pod.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(63).collect();
        let mut random = [0_u8; 4];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random);
        let base = format!("{pod}-{}", hex::encode(random));
        Self {
            connected: AtomicBool::new(false),
            failed_connects: AtomicU64::new(0),
            holder: arc_swap::ArcSwap::from_pointee(format!("{base}-0")),
            base,
            connections: AtomicU64::new(0),
        }
    }

    /// A holder name for a new connection.
    fn next_holder(&self) -> String {
        format!("{}-{}", self.base, self.connections.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// The liveness key of `holder`.
pub(super) fn alive_key(config: &RedisConfig, holder: &str) -> String {
    format!("{}alive:{holder}", config.key_prefix())
}

fn alive_command(config: &RedisConfig, holder: &str) -> BytesMut {
    let ttl = ALIVE_TTL.as_millis().to_string();
    command(&[b"SET".to_vec(), alive_key(config, holder).into_bytes(), b"1".to_vec(), b"PX".to_vec(), ttl.into_bytes()])
}

/// Connects, authenticates and serves calls until the connection breaks;
/// again after a backoff; until the counter is dropped.
pub(super) async fn run(config: RedisConfig, transport: Transport, mut queues: Queues, link: Arc<Link>) {
    let mut backoff = Duration::from_millis(50);
    let mut was_up = true;
    loop {
        let holder = link.next_holder();
        match connect(&config, &transport, &holder).await {
            Ok(stream) => {
                tracing::info!(address = %config.address, "rate limits: connected to Redis");
                link.holder.store(Arc::new(holder.clone()));
                link.connected.store(true, Ordering::Relaxed);
                backoff = Duration::from_millis(50);
                was_up = true;
                let ended = serve(stream, &mut queues, alive_command(&config, &holder)).await;
                link.connected.store(false, Ordering::Relaxed);
                match ended {
                    None => return,
                    Some(error) => {
                        tracing::warn!(address = %config.address, %error, "rate limits: lost Redis; reconnecting")
                    }
                }
            }
            Err(error) => {
                link.failed_connects.fetch_add(1, Ordering::Relaxed);
                if was_up {
                    tracing::warn!(address = %config.address, %error, "rate limits: cannot reach Redis; retrying");
                    was_up = false;
                }
            }
        }
        // Calls made meanwhile fail at once rather than wait; settlements
        // and releases wait for the next connection (a spend must be
        // counted; a release of a holder gone by then removes nothing).
        // They are bounded: one at most per request admitted while Redis
        // answered.
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                call = queues.calls.recv() => match call {
                    None => return,
                    Some(call) => {
                        if let Some(reply) = call.reply {
                            let _ = reply.send(Err(StoreError::Unreachable));
                        }
                    }
                },
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// How the connection task reaches Redis.
pub(super) enum Transport {
    Plain,
    Tls { connector: TlsConnector, server_name: ServerName<'static> },
}

impl Transport {
    pub(super) fn new(config: &RedisConfig) -> Result<Self, TlsError> {
        let Some(tls) = &config.tls else { return Ok(Self::Plain) };
        let host = config.address.rsplit_once(':').map_or(config.address.as_str(), |(host, _)| host);
        let name = tls.server_name.as_deref().unwrap_or(host);
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|e| TlsError::Field { what: "serverName", reason: format!("{name:?}: {e}") })?;
        let connector = TlsConnector::from(Arc::new(client_config(Some(tls))?));
        Ok(Self::Tls { connector, server_name })
    }
}

/// A connection to Redis, plain or TLS.
trait Connection: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Connection for T {}

async fn connect(config: &RedisConfig, transport: &Transport, holder: &str) -> std::io::Result<Box<dyn Connection>> {
    let timed_out = |what: &str| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what} timed out"));
    let connecting = TcpStream::connect(&config.address);
    let tcp = tokio::time::timeout(Duration::from_secs(1), connecting).await.map_err(|_| timed_out("connect"))??;
    tcp.set_nodelay(true)?;
    let mut stream: Box<dyn Connection> = match transport {
        Transport::Plain => Box::new(tcp),
        Transport::Tls { connector, server_name } => {
            let handshake = connector.connect(server_name.clone(), tcp);
            Box::new(
                tokio::time::timeout(Duration::from_secs(1), handshake)
                    .await
                    .map_err(|_| timed_out("TLS handshake"))??,
            )
        }
    };
    if let Some(password) = &config.password {
        let mut auth = vec![b"AUTH".to_vec()];
        auth.extend(config.username.as_ref().map(|user| user.as_bytes().to_vec()));
        auth.push(password.as_bytes().to_vec());
        let reply = roundtrip(&mut stream, &auth).await?;
        if reply != Reply::Status("OK".into()) {
            return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "AUTH refused"));
        }
    }
    // Loaded on every connection: a restarted Redis has forgotten them.
    for script in redis_scripts::ALL {
        let reply = roundtrip(&mut stream, &[b"SCRIPT".to_vec(), b"LOAD".to_vec(), script.as_bytes().to_vec()]).await?;
        if reply != Reply::Bulk(Some(redis_scripts::sha(script).into_bytes())) {
            return Err(std::io::Error::other(format!("SCRIPT LOAD answered {reply:?}")));
        }
    }
    // Alive before the first admission counts anything under this holder.
    stream.write_all(&alive_command(config, holder)).await?;
    let mut buffer = BytesMut::with_capacity(64);
    read_reply(&mut stream, &mut buffer).await?;
    Ok(stream)
}

/// One command and its reply, before the connection is shared.
async fn roundtrip(stream: &mut Box<dyn Connection>, args: &[Vec<u8>]) -> std::io::Result<Reply> {
    stream.write_all(&command(args)).await?;
    let mut buffer = BytesMut::with_capacity(256);
    read_reply(stream, &mut buffer).await
}

/// One reply, within a second.
async fn read_reply(stream: &mut Box<dyn Connection>, buffer: &mut BytesMut) -> std::io::Result<Reply> {
    tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            if stream.read_buf(buffer).await? == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
            }
            if let Some((reply, _)) = resp::parse(buffer).map_err(std::io::Error::other)? {
                return Ok(reply);
            }
        }
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply"))?
}

/// Pipelines calls over `stream` until it breaks (`Some(error)`) or the
/// counter is dropped (`None`).
async fn serve(stream: Box<dyn Connection>, queues: &mut Queues, alive: BytesMut) -> Option<std::io::Error> {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut waiting: Waiting = VecDeque::new();
    let mut incoming = BytesMut::with_capacity(4096);
    let mut outgoing = BytesMut::with_capacity(4096);
    let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + ALIVE_REFRESH, ALIVE_REFRESH);
    let error = loop {
        tokio::select! {
            _ = refresh.tick() => {
                if let Err(error) = writer.write_all(&alive).await {
                    break error;
                }
                waiting.push_back(None);
            }
            // NB: while MAX_IN_FLIGHT replies are owed, nothing more is sent;
            // the queue fills and callers fail fast instead.
            after = queues.after.recv(), if queues.held_back.is_none() && waiting.len() < MAX_IN_FLIGHT => {
                queues.held_back = Some(after?);
                queues.take_queued(&mut waiting, &mut outgoing);
                if let Err(error) = writer.write_all(&outgoing).await {
                    break error;
                }
                outgoing.clear();
            }
            call = queues.calls.recv(), if waiting.len() < MAX_IN_FLIGHT => {
                let call = call?;
                outgoing.extend_from_slice(&call.command);
                waiting.push_back(call.reply);
                // Everything queued meanwhile goes in the same write.
                queues.take_queued(&mut waiting, &mut outgoing);
                if let Err(error) = writer.write_all(&outgoing).await {
                    break error;
                }
                outgoing.clear();
            }
            () = std::future::ready(()), if queues.held_back.is_some() && waiting.len() < MAX_IN_FLIGHT => {
                queues.take_queued(&mut waiting, &mut outgoing);
                if let Err(error) = writer.write_all(&outgoing).await {
                    break error;
                }
                outgoing.clear();
            }
            read = reader.read_buf(&mut incoming) => {
                match read {
                    Ok(0) => break std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "Redis closed the connection"),
                    Err(error) => break error,
                    Ok(_) => {}
                }
                loop {
                    match resp::parse(&incoming) {
                        Ok(Some((reply, used))) => {
                            incoming.advance(used);
                            if let Some(Some(caller)) = waiting.pop_front() {
                                let _ = caller.send(Ok(reply));
                            }
                        }
                        Ok(None) => break,
                        Err(error) => return Some(std::io::Error::other(error)),
                    }
                }
            }
        }
    };
    for caller in waiting.into_iter().flatten() {
        let _ = caller.send(Err(StoreError::Unreachable));
    }
    Some(error)
}
