//! Exact fleet-wide counting in Redis: the same GCRA as `gcra.rs`, and
//! concurrency counted per live pod, run by one Lua script on the server's
//! clock (`redis_scripts.rs`), one round trip per limited request.
//!
//! ```text
//! requests ─► bounded queue ─► connection task ─► one socket, pipelined:
//!                               every queued command written at once,
//!                               replies matched to callers in order
//! ```
//!
//! Bounded: at most [`MAX_QUEUED`] calls wait to be written and
//! `redis_link::MAX_IN_FLIGHT` await replies; past that a call fails at once
//! (`queue_full`) and the Gateway's failure mode applies, so a Redis that
//! stalls costs neither memory nor time without end.
//!
//! Over TLS when the config says so (`rediss://` to other clients): the
//! rustls client config is built once with the counter, so a bad CA or
//! client pair refuses the config rather than failing every connect.
//!
//! The connection task (`redis_link.rs`) reconnects with backoff (loading the scripts again
//! on each connection); while it is down, calls fail at once, so no request
//! waits on a dead server. A call that gets no reply within the timeout
//! fails too. What a failure means for the request is the caller's
//! `fail_closed`.
//!
//! NB: the client is ours (about 200 lines with `resp.rs`) rather than the
//! `redis` crate: the gateway needs three scripts over one pipelined
//! connection with strict timeouts, and the crate's dependency tree (url,
//! idna, combine …) is several times the gateway's own.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use tokio::sync::{mpsc, oneshot};
use waycast_crds::config::RedisConfig;

use crate::tls::TlsError;

use super::gcra::{self, Verdict};
use super::redis_link::{self, Call, Link, Queues, Transport, command};
use super::redis_scripts;
use super::resp::Reply;
use super::spend_reads::Source;

pub use super::redis_link::{MAX_QUEUED, StoreError};

/// One limiter of a request, as the script sees it.
pub struct ScriptLimiter<'a> {
    /// The Redis key.
    pub key: &'a str,
    /// What the request costs in it: 1 (a request) or the tokens it reserves.
    pub units: u64,
    /// The limit per minute.
    pub per_minute: u64,
}

/// What the admission script decided.
#[derive(Debug)]
pub struct Admission {
    /// Per rate limiter, its verdict.
    pub verdicts: Vec<Verdict>,
    /// Per concurrency limit: admitted, and the requests it holds.
    pub held: Vec<(bool, u64)>,
    /// Per budget: admitted, and the tokens and cost it counted before.
    pub budgets: Vec<(bool, u64, u64)>,
}

/// One budget of a request, as the admission script sees it.
pub struct ScriptBudget<'a> {
    /// Its hash (the budget's scope and current period).
    pub key: &'a str,
    /// Its tokens and cost (nano-units), if it sets them.
    pub tokens: Option<u64>,
    /// Its cost, in nano-units.
    pub cost: Option<u64>,
    /// The request's worst case.
    pub need_tokens: u64,
    /// The request's worst-case cost.
    pub need_cost: u64,
    /// How long the hash lives: past the period's end.
    pub ttl_ms: u64,
}

/// What a request reserved in budgets counted in Redis, to settle when it
/// ends (the `SPEND` script, on the queue that is never dropped for want
/// of room).
pub struct RedisSpend {
    pub(super) counter: Arc<RedisCounter>,
    /// The request's name its reservations are kept under.
    pub(super) request: String,
    /// (hash, ttl in ms).
    pub(super) budgets: Vec<(String, u64)>,
}

impl std::fmt::Debug for RedisSpend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSpend").field("budgets", &self.budgets).finish_non_exhaustive()
    }
}

/// Past this a spend is clamped (the script's counts are 64-bit integers).
const MOST_SPENT: u64 = 9_000_000_000_000_000_000;

impl RedisSpend {
    /// The request used `tokens` and cost `cost`.
    pub fn settle(&self, tokens: u64, cost: u64) {
        if self.budgets.is_empty() {
            return;
        }
        let mut args: Vec<Vec<u8>> = vec![
            b"EVALSHA".to_vec(),
            redis_scripts::sha(redis_scripts::SPEND).into_bytes(),
            self.budgets.len().to_string().into_bytes(),
        ];
        args.extend(self.budgets.iter().map(|(key, _)| key.as_bytes().to_vec()));
        args.push(self.request.as_bytes().to_vec());
        for (_, ttl) in &self.budgets {
            args.push(tokens.min(MOST_SPENT).to_string().into_bytes());
            args.push(cost.min(MOST_SPENT).to_string().into_bytes());
            args.push(ttl.to_string().into_bytes());
        }
        let _ = self.counter.after.send(command(&args));
    }
}

/// A request held under concurrency limits in Redis: counted out when
/// dropped (its exchange ended).
pub struct RedisHold {
    pub(super) counter: Arc<RedisCounter>,
    pub(super) keys: Vec<String>,
    pub(super) holder: Arc<String>,
}

impl std::fmt::Debug for RedisHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisHold").field("keys", &self.keys).field("holder", &self.holder).finish()
    }
}

impl Drop for RedisHold {
    fn drop(&mut self) {
        self.counter.release(&self.keys, &self.holder);
    }
}

/// A connection to the Redis that counts, shared by every request.
pub struct RedisCounter {
    /// What it was built from (a config reload keeps it when unchanged).
    pub config: RedisConfig,
    calls: mpsc::Sender<Call>,
    after: mpsc::UnboundedSender<BytesMut>,
    link: Arc<Link>,
    /// Numbers the requests whose budget reservations it keeps.
    requests: std::sync::atomic::AtomicU64,
    /// `/v1/usage`'s reads: cached and bounded.
    reads: super::spend_reads::SpendReads,
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
        let (calls, calls_out) = mpsc::channel(MAX_QUEUED);
        let (after, after_out) = mpsc::unbounded_channel();
        let link = Arc::new(Link::new());
        let queues = Queues { calls: calls_out, after: after_out, held_back: None };
        tokio::spawn(redis_link::run(config.clone(), transport, queues, link.clone()));
        let requests = std::sync::atomic::AtomicU64::new(0);
        Ok(Self { config, calls, after, link, requests, reads: Default::default() })
    }

    /// The name this pod's current connection counts concurrency under.
    pub fn holder(&self) -> Arc<String> {
        self.link.holder.load_full()
    }

    /// A name of its own for a request, under `holder`.
    pub fn request_name(&self, holder: &str) -> String {
        format!("{holder}|{}", self.requests.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether the connection is up.
    pub fn is_connected(&self) -> bool {
        self.link.connected.load(Ordering::Relaxed)
    }

    /// Attempts to connect (and authenticate) that failed so far.
    pub fn failed_connects(&self) -> u64 {
        self.link.failed_connects.load(Ordering::Relaxed)
    }

    /// Runs the admission script over the rate limiters `rates` and the
    /// concurrency limits `concurrent` (Redis key, limit): a verdict per
    /// rate limiter, and per concurrency limit whether it admitted and the
    /// requests it holds. Only when every one admits is each charged (and
    /// the request held, under `Admission::held`).
    ///
    /// # Errors
    /// Redis unreachable, slow or answering an error.
    pub async fn admit(
        &self,
        rates: &[ScriptLimiter<'_>],
        concurrent: &[(&str, u64)],
        budgets: &[ScriptBudget<'_>],
        holder: &Arc<String>,
        request: &str,
    ) -> Result<Admission, StoreError> {
        let count = rates.len() + concurrent.len() + budgets.len();
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(8 + count * 3 + budgets.len() * 5);
        args.push(b"EVALSHA".to_vec());
        args.push(redis_scripts::sha(redis_scripts::ADMIT).into_bytes());
        args.push(count.to_string().into_bytes());
        args.extend(rates.iter().map(|l| l.key.as_bytes().to_vec()));
        args.extend(concurrent.iter().map(|(key, _)| key.as_bytes().to_vec()));
        args.extend(budgets.iter().map(|budget| budget.key.as_bytes().to_vec()));
        args.push((gcra::WINDOW_NANOS / 1000).to_string().into_bytes());
        args.push(rates.len().to_string().into_bytes());
        args.push(holder.as_bytes().to_vec());
        args.push(redis_link::alive_key(&self.config, "").into_bytes());
        args.push(concurrent.len().to_string().into_bytes());
        args.push(request.as_bytes().to_vec());
        for limiter in rates {
            let cost = gcra::unit_cost(limiter.per_minute, 1).saturating_mul(limiter.units).min(gcra::WINDOW_NANOS);
            args.push(micros(cost).into_bytes());
        }
        args.extend(concurrent.iter().map(|(_, limit)| limit.to_string().into_bytes()));
        let limit = |value: Option<u64>| value.map_or_else(|| "-1".to_owned(), |v| v.to_string()).into_bytes();
        for budget in budgets {
            args.push(limit(budget.tokens));
            args.push(limit(budget.cost));
            args.push(budget.need_tokens.to_string().into_bytes());
            args.push(budget.need_cost.to_string().into_bytes());
            args.push(budget.ttl_ms.to_string().into_bytes());
        }
        let reply = self.call(&args).await?;
        let Reply::Array(Some(items)) = reply else { return Err(StoreError::Reply) };
        let numbers: Vec<i64> = items
            .iter()
            .map(|i| if let Reply::Integer(n) = i { Ok(*n) } else { Err(StoreError::Reply) })
            .collect::<Result<_, _>>()?;
        if numbers.len() != count * 3 {
            return Err(StoreError::Reply);
        }
        let nanos = |micros: i64| u64::try_from(micros).unwrap_or(0).saturating_mul(1000);
        let (rate_numbers, rest) = numbers.split_at(rates.len() * 3);
        let (concurrent_numbers, budget_numbers) = rest.split_at(concurrent.len() * 3);
        let verdicts = rate_numbers
            .chunks_exact(3)
            .zip(rates)
            .map(|(n, limiter)| {
                let used = nanos(n[1]);
                Verdict {
                    allowed: n[0] == 1,
                    remaining: gcra::remaining(used, limiter.per_minute),
                    reset_nanos: used,
                    retry_after_nanos: nanos(n[2]),
                }
            })
            .collect();
        let held = concurrent_numbers.chunks_exact(3).map(|n| (n[0] == 1, u64::try_from(n[1]).unwrap_or(0))).collect();
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let budgets = budget_numbers.chunks_exact(3).map(|n| (n[0] == 1, count(n[1]), count(n[2]))).collect();
        Ok(Admission { verdicts, held, budgets })
    }

    /// Counts a request out of the concurrency limits it was held under
    /// (by `holder`), without waiting for the reply.
    pub fn release(&self, keys: &[String], holder: &str) {
        if keys.is_empty() {
            return;
        }
        let mut args: Vec<Vec<u8>> = vec![
            b"EVALSHA".to_vec(),
            redis_scripts::sha(redis_scripts::RELEASE).into_bytes(),
            keys.len().to_string().into_bytes(),
        ];
        args.extend(keys.iter().map(|key| key.as_bytes().to_vec()));
        args.push(holder.as_bytes().to_vec());
        // Owed, never dropped for want of room; one lost with the connection
        // is forgotten with its holder (see `redis_link`).
        let _ = self.after.send(command(&args));
    }

    /// Settles a reservation: `tokens` more (positive) or fewer (negative)
    /// than reserved, for each token limiter `(key, per minute)`, without
    /// waiting for the reply.
    pub fn settle(&self, limiters: &[(&str, u64)], tokens: i128) {
        if tokens == 0 {
            return;
        }
        let mut args: Vec<Vec<u8>> = vec![
            b"EVALSHA".to_vec(),
            redis_scripts::sha(redis_scripts::SETTLE).into_bytes(),
            limiters.len().to_string().into_bytes(),
        ];
        args.extend(limiters.iter().map(|(key, _)| key.as_bytes().to_vec()));
        for (_, per_minute) in limiters {
            let nanos = i128::from(gcra::WINDOW_NANOS) * tokens / i128::from((*per_minute).max(1));
            args.push(format!("{:.3}", nanos as f64 / 1000.0).into_bytes());
        }
        // Owed, never dropped for want of room (a lost Redis loses it).
        let _ = self.after.send(command(&args));
    }

    /// What each budget hash of `hashes` spent (tokens, nano-units), for
    /// `GET /v1/usage`: read at most once a second per budget, within the
    /// bounds of `spend_reads` (past them, the last spend read, if recent);
    /// `None` where it is not known; and where each came from.
    pub async fn budgets_spent(&self, hashes: &[String]) -> (Vec<Option<(u64, u64)>>, Vec<Source>) {
        let mut plan = self.reads.plan(hashes, std::time::Instant::now()).await;
        if plan.to_read.is_empty() {
            return (plan.spends, plan.sources);
        }
        let reads = plan.to_read.iter().map(|place| self.budget_spent(&hashes[*place]));
        let read = futures_util::future::join_all(reads).await;
        drop(plan.slot.take());
        let mut fresh = Vec::with_capacity(read.len());
        for (place, result) in plan.to_read.iter().zip(read) {
            if let Ok(spend) = result {
                fresh.push((hashes[*place].clone(), spend));
                (plan.spends[*place], plan.sources[*place]) = (Some(spend), Source::Redis);
            }
        }
        self.reads.keep(fresh, std::time::Instant::now()).await;
        (plan.spends, plan.sources)
    }

    /// What the budget hash `hash` spent: tokens, nano-units.
    ///
    /// # Errors
    /// Redis did not answer, or answered something else.
    async fn budget_spent(&self, hash: &str) -> Result<(u64, u64), StoreError> {
        let args = [b"HMGET".to_vec(), hash.as_bytes().to_vec(), b"t".to_vec(), b"c".to_vec()];
        let Reply::Array(Some(items)) = self.call(&args).await? else { return Err(StoreError::Reply) };
        let number = |item: Option<&Reply>| match item {
            Some(Reply::Bulk(Some(text))) => std::str::from_utf8(text).ok().and_then(|t| t.parse::<u64>().ok()),
            _ => None,
        };
        Ok((number(items.first()).unwrap_or(0), number(items.get(1)).unwrap_or(0)))
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
                    for script in redis_scripts::ALL {
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

fn micros(nanos: u64) -> String {
    format!("{:.3}", nanos as f64 / 1000.0)
}
