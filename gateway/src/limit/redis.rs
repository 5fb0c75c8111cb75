//! Exact fleet-wide counting in Redis: the same GCRA as `gcra.rs`, run by
//! a Lua script on the server's clock, one round trip per limited request.
//!
//! ```text
//! requests ─► bounded queue ─► connection task ─► one socket, pipelined:
//!                               every queued command written at once,
//!                               replies matched to callers in order
//! ```
//!
//! Bounded: at most [`MAX_QUEUED`] calls wait to be written and
//! [`MAX_IN_FLIGHT`] await replies; past that a call fails at once
//! (`queue_full`) and the Gateway's failure mode applies, so a Redis that
//! stalls costs neither memory nor time without end.
//!
//! Over TLS when the config says so (`rediss://` to other clients): the
//! rustls client config is built once with the counter, so a bad CA or
//! client pair refuses the config rather than failing every connect.
//!
//! The connection task reconnects with backoff (loading the scripts again
//! on each connection); while it is down, calls fail at once, so no request
//! waits on a dead server. A call that gets no reply within the timeout
//! fails too. What a failure means for the request is the caller's
//! `fail_closed`.
//!
//! NB: the client is ours (about 200 lines with `resp.rs`) rather than the
//! `redis` crate: the gateway needs two scripts over one pipelined
//! connection with strict timeouts, and the crate's dependency tree (url,
//! idna, combine …) is several times the gateway's own.

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

use crate::tls::{TlsError, client_config};

use super::gcra::{self, Verdict};
use super::resp::{self, Reply};

/// Checks every limiter of a request and, only if all admit, charges each
/// its cost: one request, or the tokens a request reserves. KEYS: one per
/// limiter. ARGV[1]: the window (µs); then per limiter its cost (µs).
/// Returns per limiter: admitted (1/0), window used (µs, after the charge
/// when admitted), and the wait until it would admit (µs). The TAT is kept
/// in µs since 2023-11 (small enough for Lua's doubles to count fractions
/// of a µs) and expires when the limiter is full.
const ADMIT: &str = r"
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1700000000) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[1])
local out, tats, all = {}, {}, true
for i = 1, #KEYS do
  local cost = tonumber(ARGV[i + 1])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  tats[i] = tat
  local used = tat + cost - now
  local retry = 0
  if used > window then
    all = false
    retry = used - window
    used = tat - now
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
  end
  out[#out + 1] = math.floor(used)
  out[#out + 1] = math.ceil(retry)
end
if all then
  for i = 1, #KEYS do
    local tat = tats[i] + tonumber(ARGV[i + 1])
    redis.call('SET', KEYS[i], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  end
end
return out
";

/// Settles token reservations after a response. KEYS: token limiters;
/// ARGV[i]: the change (µs of window, negative to give back) for KEYS[i].
/// A limiter is never given back more than makes it full.
const SETTLE: &str = r"
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1700000000) * 1000000 + tonumber(t[2])
for i = 1, #KEYS do
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  tat = tat + tonumber(ARGV[i])
  if tat > now then
    redis.call('SET', KEYS[i], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  else
    redis.call('DEL', KEYS[i])
  end
end
return 1
";

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

struct Call {
    command: BytesMut,
    reply: Option<oneshot::Sender<Result<Reply, StoreError>>>,
}

/// One limiter of a request, as the script sees it.
pub struct ScriptLimiter<'a> {
    /// The Redis key.
    pub key: &'a str,
    /// What the request costs in it: 1 (a request) or the tokens it reserves.
    pub units: u64,
    /// The limit per minute.
    pub per_minute: u64,
}

/// A connection to the Redis that counts, shared by every request.
pub struct RedisCounter {
    /// What it was built from (a config reload keeps it when unchanged).
    pub config: RedisConfig,
    calls: mpsc::Sender<Call>,
    link: Arc<Link>,
}

/// What the connection task tells of its connection.
#[derive(Default)]
struct Link {
    connected: AtomicBool,
    failed_connects: AtomicU64,
}

impl std::fmt::Debug for RedisCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCounter").field("config", &self.config).finish_non_exhaustive()
    }
}

impl RedisCounter {
    /// Starts the connection task on the current runtime. It ends when the
    /// counter is dropped.
    ///
    /// # Errors
    /// The TLS settings being unusable (a bad PEM, a bad server name).
    pub fn start(config: RedisConfig) -> Result<Self, TlsError> {
        let transport = Transport::new(&config)?;
        let (calls, queue) = mpsc::channel(MAX_QUEUED);
        let link = Arc::new(Link::default());
        tokio::spawn(run(config.clone(), transport, queue, link.clone()));
        Ok(Self { config, calls, link })
    }

    /// Whether the connection is up.
    pub fn is_connected(&self) -> bool {
        self.link.connected.load(Ordering::Relaxed)
    }

    /// Attempts to connect (and authenticate) that failed so far.
    pub fn failed_connects(&self) -> u64 {
        self.link.failed_connects.load(Ordering::Relaxed)
    }

    /// Runs the admission script over `limiters`: a verdict per limiter.
    ///
    /// # Errors
    /// Redis unreachable, slow or answering an error.
    pub async fn admit(&self, limiters: &[ScriptLimiter<'_>]) -> Result<Vec<Verdict>, StoreError> {
        let window = (gcra::WINDOW_NANOS / 1000).to_string();
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(3 + limiters.len() * 3);
        args.push(b"EVALSHA".to_vec());
        args.push(script_sha(ADMIT).into_bytes());
        args.push(limiters.len().to_string().into_bytes());
        args.extend(limiters.iter().map(|l| l.key.as_bytes().to_vec()));
        args.push(window.into_bytes());
        for limiter in limiters {
            let cost = gcra::unit_cost(limiter.per_minute, 1).saturating_mul(limiter.units).min(gcra::WINDOW_NANOS);
            args.push(micros(cost).into_bytes());
        }
        let reply = self.call(&args).await?;
        let Reply::Array(Some(items)) = reply else { return Err(StoreError::Reply) };
        let numbers: Vec<i64> = items
            .iter()
            .map(|i| if let Reply::Integer(n) = i { Ok(*n) } else { Err(StoreError::Reply) })
            .collect::<Result<_, _>>()?;
        if numbers.len() != limiters.len() * 3 {
            return Err(StoreError::Reply);
        }
        let nanos = |micros: i64| u64::try_from(micros).unwrap_or(0).saturating_mul(1000);
        Ok(numbers
            .chunks_exact(3)
            .zip(limiters)
            .map(|(n, limiter)| {
                let used = nanos(n[1]);
                Verdict {
                    allowed: n[0] == 1,
                    remaining: gcra::remaining(used, limiter.per_minute),
                    reset_nanos: used,
                    retry_after_nanos: nanos(n[2]),
                }
            })
            .collect())
    }

    /// Settles a reservation: `tokens` more (positive) or fewer (negative)
    /// than reserved, for each token limiter `(key, per minute)`, without
    /// waiting for the reply.
    pub fn settle(&self, limiters: &[(&str, u64)], tokens: i128) {
        if tokens == 0 {
            return;
        }
        let mut args: Vec<Vec<u8>> =
            vec![b"EVALSHA".to_vec(), script_sha(SETTLE).into_bytes(), limiters.len().to_string().into_bytes()];
        args.extend(limiters.iter().map(|(key, _)| key.as_bytes().to_vec()));
        for (_, per_minute) in limiters {
            let nanos = i128::from(gcra::WINDOW_NANOS) * tokens / i128::from((*per_minute).max(1));
            args.push(format!("{:.3}", nanos as f64 / 1000.0).into_bytes());
        }
        // Best effort: a full queue drops the settlement, as a lost Redis does.
        let _ = self.calls.try_send(Call { command: command(&args), reply: None });
    }

    async fn call(&self, args: &[Vec<u8>]) -> Result<Reply, StoreError> {
        if !self.is_connected() {
            return Err(StoreError::Unreachable);
        }
        let (reply, answer) = oneshot::channel();
        self.calls.try_send(Call { command: command(args), reply: Some(reply) }).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => StoreError::Busy,
            mpsc::error::TrySendError::Closed(_) => StoreError::Unreachable,
        })?;
        match tokio::time::timeout(self.config.timeout, answer).await {
            Ok(Ok(Ok(Reply::Error(error)))) => {
                if error.starts_with("NOSCRIPT") {
                    // The scripts were flushed (SCRIPT FLUSH): load them again.
                    for script in [ADMIT, SETTLE] {
                        let load = command(&[b"SCRIPT".to_vec(), b"LOAD".to_vec(), script.as_bytes().to_vec()]);
                        let _ = self.calls.try_send(Call { command: load, reply: None });
                    }
                }
                Err(StoreError::Reply)
            }
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Unreachable),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

/// The SHA-1 Redis names a script by (EVALSHA), in hex.
fn script_sha(script: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, script.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn micros(nanos: u64) -> String {
    format!("{:.3}", nanos as f64 / 1000.0)
}

fn command(args: &[Vec<u8>]) -> BytesMut {
    let parts: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let mut out = BytesMut::with_capacity(args.iter().map(|a| a.len() + 16).sum());
    resp::encode(&mut out, &parts);
    out
}

/// Connects, authenticates and serves calls until the connection breaks;
/// again after a backoff; until the counter is dropped.
async fn run(config: RedisConfig, transport: Transport, mut queue: mpsc::Receiver<Call>, link: Arc<Link>) {
    let mut backoff = Duration::from_millis(50);
    let mut was_up = true;
    loop {
        match connect(&config, &transport).await {
            Ok(stream) => {
                tracing::info!(address = %config.address, "rate limits: connected to Redis");
                link.connected.store(true, Ordering::Relaxed);
                backoff = Duration::from_millis(50);
                was_up = true;
                let ended = serve(stream, &mut queue).await;
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
        // Calls made meanwhile fail at once rather than wait.
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                call = queue.recv() => match call {
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
enum Transport {
    Plain,
    Tls { connector: TlsConnector, server_name: ServerName<'static> },
}

impl Transport {
    fn new(config: &RedisConfig) -> Result<Self, TlsError> {
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

async fn connect(config: &RedisConfig, transport: &Transport) -> std::io::Result<Box<dyn Connection>> {
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
    for script in [ADMIT, SETTLE] {
        let reply = roundtrip(&mut stream, &[b"SCRIPT".to_vec(), b"LOAD".to_vec(), script.as_bytes().to_vec()]).await?;
        if reply != Reply::Bulk(Some(script_sha(script).into_bytes())) {
            return Err(std::io::Error::other(format!("SCRIPT LOAD answered {reply:?}")));
        }
    }
    Ok(stream)
}

/// One command and its reply, before the connection is shared.
async fn roundtrip(stream: &mut Box<dyn Connection>, args: &[Vec<u8>]) -> std::io::Result<Reply> {
    stream.write_all(&command(args)).await?;
    let mut buffer = BytesMut::with_capacity(256);
    tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            if stream.read_buf(&mut buffer).await? == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
            }
            if let Some((reply, _)) = resp::parse(&buffer).map_err(std::io::Error::other)? {
                return Ok(reply);
            }
        }
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply"))?
}

/// Pipelines calls over `stream` until it breaks (`Some(error)`) or the
/// counter is dropped (`None`).
async fn serve(stream: Box<dyn Connection>, queue: &mut mpsc::Receiver<Call>) -> Option<std::io::Error> {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut waiting: VecDeque<Option<oneshot::Sender<Result<Reply, StoreError>>>> = VecDeque::new();
    let mut incoming = BytesMut::with_capacity(4096);
    let mut outgoing = BytesMut::with_capacity(4096);
    let error = loop {
        tokio::select! {
            // NB: while MAX_IN_FLIGHT replies are owed, nothing more is sent;
            // the queue fills and callers fail fast instead.
            call = queue.recv(), if waiting.len() < MAX_IN_FLIGHT => {
                let call = call?;
                outgoing.extend_from_slice(&call.command);
                waiting.push_back(call.reply);
                // Everything queued meanwhile goes in the same write.
                while waiting.len() < MAX_IN_FLIGHT && let Ok(call) = queue.try_recv() {
                    outgoing.extend_from_slice(&call.command);
                    waiting.push_back(call.reply);
                }
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
