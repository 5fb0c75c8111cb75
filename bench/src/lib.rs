//! `waycast-bench`: an OpenAI-compatible load generator that users run on
//! their own setup (with the sink from `waycast_mock::sink`), and the suite
//! behind `make bench`. It knows nothing of the operator or the gateway's
//! code: it measures any OpenAI-compatible target from the outside.
//!
//! ```text
//! source (N workers, one connection each) ──► target (a gateway, or the sink itself = baseline) ──► sink
//!   └─ a shared ticket counter: a fixed number of requests, as fast as
//!      responses allow, or at a fixed arrival rate (latency from the
//!      scheduled start, so a slow target cannot hide its queueing)
//! ```
//!
//! The sink answers `/v1/chat/completions`, `/v1/responses` and
//! `/v1/messages` (streaming and not) with canned bodies after a wait and, for
//! streams, a number of chunks apart; the source asks for those per request
//! with headers, which a gateway forwards, so one sink serves every scenario.

pub mod access;
pub mod arrival;
pub mod csv;
pub mod peers;
pub mod process;
pub mod prompt;
pub mod server;
pub mod source;
pub mod study;
pub mod suite;
pub mod tally;
pub mod tokens;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use waycast_mock::sink::{self, BENCH_MODEL, CHUNKS_HEADER, INTERVAL_HEADER, WAIT_HEADER, Workload};

/// One run: where to send what, how much, how fast.
///
/// The one definition of a run's options: the REST API reads it as JSON and
/// `waycast-bench run` as flags.
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    /// Base URL of the target, e.g. `http://127.0.0.1:8080` (a gateway or a sink).
    #[arg(long)]
    pub target: String,
    /// Bearer key sent with every request (none when absent).
    #[serde(default)]
    #[arg(long, env = "WAYCAST_BENCH_KEY")]
    pub key: Option<String>,
    /// Base URL of the same server reached without the gateway (the
    /// inference server itself, or the sink): run beside the target in
    /// interleaved rounds, so the report says what the gateway added.
    #[serde(default)]
    #[arg(long)]
    pub baseline: Option<String>,
    /// Bearer key for the baseline (none when absent: a server reached
    /// directly often wants none, or another one).
    #[serde(default)]
    #[arg(long, env = "WAYCAST_BENCH_BASELINE_KEY")]
    pub baseline_key: Option<String>,
    /// Rounds the run is split into; with a baseline, each round runs both
    /// sides one after the other (which goes first alternates), so drift on
    /// the machine or the server lands on both and the spread across rounds
    /// shows what is noise.
    #[serde(default = "default_rounds")]
    #[arg(long, default_value_t = default_rounds())]
    pub rounds: u32,
    /// Requests sent to each side before the run, not counted: connections
    /// opened, pools warmed and every prompt seen once (a server's prefix
    /// cache), on the gateway and the server alike. Absent: the larger of
    /// the concurrency and the number of different prompts; 0: none.
    #[serde(default)]
    #[arg(long)]
    pub warmup: Option<u64>,
    /// The model every request names (a real server's model name when
    /// pointed straight at vLLM, SGLang or a provider).
    #[serde(default = "default_model")]
    #[arg(long, default_value = BENCH_MODEL)]
    pub model: String,
    /// `max_tokens` in every request (`max_output_tokens` for responses);
    /// absent: not sent (messages always sends one: 64).
    #[serde(default)]
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Which API: chat, responses or messages.
    #[serde(default)]
    #[arg(long, default_value = "chat", value_parser = Workload::parse)]
    pub workload: Workload,
    /// Ask for a stream.
    #[serde(default)]
    #[arg(long)]
    pub stream: bool,
    /// Requests in the run.
    #[arg(long, default_value_t = 10_000)]
    pub requests: u64,
    /// Workers, each with its own connection.
    #[arg(long, default_value_t = 64)]
    pub concurrency: u32,
    /// Fixed arrival rate in requests per second; absent: as fast as responses allow.
    #[serde(default)]
    #[arg(long)]
    pub rate: Option<f64>,
    /// How requests arrive at a fixed rate: `poisson` (random gaps with
    /// that mean, as users arrive) or `uniform` (evenly spaced).
    #[serde(default)]
    #[arg(long, default_value = "poisson", value_parser = Arrival::parse)]
    pub arrival: Arrival,
    /// A rate sweep instead of one load: `FROM:TO:STEPS` requests per
    /// second (`{"from", "to", "steps"}` in JSON), `requests` at each rate;
    /// the report gives the curve and the saturation point.
    #[serde(default)]
    #[arg(long, value_parser = Sweep::parse)]
    pub sweep: Option<Sweep>,
    /// Size of each request body in bytes (a padded prompt).
    #[serde(default = "default_body_bytes")]
    #[arg(long, default_value_t = default_body_bytes())]
    pub body_bytes: usize,
    /// With it, body sizes spread evenly from `bodyBytes` to this many
    /// bytes (a distribution of prompt sizes).
    #[serde(default)]
    #[arg(long)]
    pub body_bytes_max: Option<usize>,
    /// The sink's wait before answering, in milliseconds.
    #[serde(default)]
    #[arg(long, default_value_t = 0)]
    pub wait_ms: u64,
    /// Chunks per stream.
    #[serde(default = "default_chunks")]
    #[arg(long, default_value_t = default_chunks())]
    pub chunks: u32,
    /// Pause between stream chunks, in milliseconds.
    #[serde(default)]
    #[arg(long, default_value_t = 0)]
    pub chunk_interval_ms: u64,
    /// How long a request may go without a byte, in milliseconds: for a
    /// stream, before its first byte and between any two chunks (a long
    /// generation that keeps streaming never times out); otherwise the
    /// whole answer.
    #[serde(default = "default_timeout_ms")]
    #[arg(long, default_value_t = default_timeout_ms())]
    pub timeout_ms: u64,
}

fn default_rounds() -> u32 {
    1
}
fn default_model() -> String {
    BENCH_MODEL.to_owned()
}
fn default_body_bytes() -> usize {
    1024
}
fn default_chunks() -> u32 {
    20
}
fn default_timeout_ms() -> u64 {
    30_000
}

impl Scenario {
    /// Checks the numbers before a run starts.
    ///
    /// # Errors
    /// A message naming the field that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.target.starts_with("http://")) {
            return Err("target must be an http:// URL".into());
        }
        if self.baseline.as_ref().is_some_and(|b| !b.starts_with("http://")) {
            return Err("baseline must be an http:// URL".into());
        }
        if self.warmup.is_some_and(|n| n > 1_000_000) {
            return Err("warmup must be at most 1000000 requests".into());
        }
        if self.rounds == 0 || self.rounds > 100 {
            return Err("rounds must be between 1 and 100".into());
        }
        if u64::from(self.rounds) > self.requests {
            return Err("rounds must not be more than requests (each round runs requests / rounds)".into());
        }
        if let Some(sweep) = &self.sweep {
            sweep.validate()?;
            if self.rate.is_some() {
                return Err("a sweep sets the rate itself: give rate or sweep, not both".into());
            }
        }
        // Up to 64 bodies are built from a range: at most 256 MiB in all.
        if self.body_bytes_max.is_some_and(|max| max < self.body_bytes || max > 4 * 1024 * 1024) {
            return Err("bodyBytesMax must be at least bodyBytes and at most 4 MiB".into());
        }
        if self.requests == 0 || self.requests > 10_000_000 {
            return Err("requests must be between 1 and 10000000".into());
        }
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return Err("concurrency must be between 1 and 10000".into());
        }
        let slowest = self.rate.or(self.sweep.map(|s| s.from));
        if slowest.is_some_and(|r| !(MIN_RATE..=MAX_RATE).contains(&r)) {
            return Err(format!("rates must be between {MIN_RATE} and {MAX_RATE} requests per second"));
        }
        if self.scheduled_seconds() > LONGEST_RUN_SECONDS {
            return Err(
                "at those rates the requests would take more than a week: fewer requests or higher rates".into()
            );
        }
        if self.wait_ms > HOUR_MS || self.chunk_interval_ms > HOUR_MS {
            return Err("waitMs and chunkIntervalMs must be at most an hour".into());
        }
        if self.body_bytes > 64 * 1024 * 1024 {
            return Err("bodyBytes must be at most 64 MiB".into());
        }
        if self.chunks == 0 || self.chunks > 100_000 {
            return Err("chunks must be between 1 and 100000".into());
        }
        if self.model.is_empty()
            || self.model.len() > 256
            || self.model.contains(['"', '\\'])
            || self.model.chars().any(char::is_control)
        {
            return Err("model must be 1 to 256 characters, without quotes, backslashes or control characters".into());
        }
        if self.max_tokens == Some(0) {
            return Err("maxTokens must be positive".into());
        }
        if self.timeout_ms == 0 || self.timeout_ms > 24 * HOUR_MS {
            return Err("timeoutMs must be between 1 and 86400000 (a day)".into());
        }
        Ok(())
    }
}

impl Scenario {
    /// How long a fixed-rate run or a sweep is scheduled to take, every
    /// step and both sides counted (0 as fast as answers come).
    fn scheduled_seconds(&self) -> f64 {
        let sides = if self.baseline.is_some() { 2.0 } else { 1.0 };
        let requests = self.requests as f64;
        let one_side = match (self.rate, &self.sweep) {
            (Some(rate), _) => requests / rate,
            (None, Some(sweep)) => sweep.rates().iter().map(|rate| requests / rate).sum(),
            (None, None) => 0.0,
        };
        one_side * sides
    }
}

/// The slowest and fastest arrival rates a run may ask for, per second.
pub const MIN_RATE: f64 = 0.01;
/// See [`MIN_RATE`].
pub const MAX_RATE: f64 = 10_000_000.0;
/// The longest a fixed-rate run may be scheduled to last: a week.
const LONGEST_RUN_SECONDS: f64 = 7.0 * 24.0 * 3600.0;
const HOUR_MS: u64 = 3_600_000;

/// How requests arrive at a fixed rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum Arrival {
    /// Exponential gaps (a Poisson process): bursts and lulls, as users arrive.
    #[default]
    Poisson,
    /// Evenly spaced.
    Uniform,
}

impl Arrival {
    /// `poisson` or `uniform`.
    ///
    /// # Errors
    /// Any other text.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_value(serde_json::Value::String(text.to_owned()))
            .map_err(|_| format!("unknown arrival {text:?}: poisson or uniform"))
    }
}

/// Offered rates of a sweep: `steps` rates evenly from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sweep {
    /// The first rate, requests per second.
    pub from: f64,
    /// The last rate.
    pub to: f64,
    /// How many rates (at least 2).
    pub steps: u32,
}

impl Sweep {
    /// `FROM:TO:STEPS`, e.g. `10:100:10`.
    ///
    /// # Errors
    /// Text of another shape, or numbers out of range.
    pub fn parse(text: &str) -> Result<Self, String> {
        let shape = || format!("sweep {text:?} is not FROM:TO:STEPS (e.g. 10:100:10)");
        let mut parts = text.split(':');
        let (Some(from), Some(to), Some(steps), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(shape());
        };
        let sweep = Self {
            from: from.trim().parse().map_err(|_| shape())?,
            to: to.trim().parse().map_err(|_| shape())?,
            steps: steps.trim().parse().map_err(|_| shape())?,
        };
        sweep.validate()?;
        Ok(sweep)
    }

    /// # Errors
    /// Rates not positive or not rising, or fewer than 2 or more than 50 steps.
    pub fn validate(&self) -> Result<(), String> {
        let rate = |r: f64| (MIN_RATE..=MAX_RATE).contains(&r);
        if !(rate(self.from) && rate(self.to) && self.from < self.to) {
            return Err(format!("sweep rates must be between {MIN_RATE} and {MAX_RATE}, from below to"));
        }
        if !(2..=50).contains(&self.steps) {
            return Err("sweep steps must be between 2 and 50".into());
        }
        Ok(())
    }

    /// The offered rates, in order.
    pub fn rates(&self) -> Vec<f64> {
        let gap = (self.to - self.from) / f64::from(self.steps - 1);
        (0..self.steps).map(|i| self.from + gap * f64::from(i)).collect()
    }
}

/// Latency figures in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Mean.
    pub avg: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Summary {
    /// Figures of `sorted` (nanoseconds, ascending).
    pub fn of_sorted(sorted: &[u64]) -> Option<Self> {
        if sorted.is_empty() {
            return None;
        }
        let sum: u128 = sorted.iter().map(|&n| u128::from(n)).sum();
        Some(Self {
            avg: nanos_to_ms_f(sum as f64 / sorted.len() as f64),
            p50: nanos_to_ms(percentile(sorted, 50.0)),
            p90: nanos_to_ms(percentile(sorted, 90.0)),
            p99: nanos_to_ms(percentile(sorted, 99.0)),
            p999: nanos_to_ms(percentile(sorted, 99.9)),
            max: nanos_to_ms(sorted[sorted.len() - 1]),
        })
    }
}

/// The nearest-rank percentile of `sorted` (ascending, not empty).
pub fn percentile(sorted: &[u64], pct: f64) -> u64 {
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[allow(clippy::cast_precision_loss, reason = "milliseconds for display")]
fn nanos_to_ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

fn nanos_to_ms_f(nanos: f64) -> f64 {
    nanos / 1e6
}

/// What a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// Requests sent.
    pub requests: u64,
    /// Answered 200 with a complete body.
    pub ok: u64,
    /// Failed: a status other than 200, a transport error or a timeout.
    pub errors: u64,
    /// A few error descriptions, for the reader.
    pub error_samples: Vec<String>,
    /// Wall time of the run, in seconds.
    pub duration_seconds: f64,
    /// Successful requests per second.
    pub requests_per_second: f64,
    /// At a fixed rate, the rate the requests were sent at (a Poisson
    /// run's arrivals come near the rate asked for, not exactly at it).
    pub offered_requests_per_second: Option<f64>,
    /// Latency of successful requests (request start, or its scheduled start
    /// at a fixed rate, to the last body byte).
    pub latency: Option<Summary>,
    /// Time to the first body byte, for streams.
    pub time_to_first_byte: Option<Summary>,
    /// Time to the first output token (the first event carrying output
    /// text), for streams.
    pub time_to_first_token: Option<Summary>,
    /// Gaps between two events carrying output text, for streams
    /// (inter-token latency: a server sending several tokens an event shows
    /// longer gaps).
    pub inter_token_latency: Option<Summary>,
    /// Per request, (latency − time to first token) / (output tokens − 1),
    /// for streams of at least two tokens.
    pub time_per_output_token: Option<Summary>,
    /// Output tokens of successful requests: the usage the server reported,
    /// else (streams) the events that carried output text.
    pub output_tokens: u64,
    /// Output tokens per second of the run's wall time.
    pub output_tokens_per_second: f64,
    /// Successful requests per second between the first and the last
    /// completion: what the target sustained, without the ramp at the start.
    pub sustained_requests_per_second: f64,
    /// At a fixed rate, requests that started more than 5 ms after they
    /// were due because every worker was busy: the load generator's
    /// concurrency held them back, not the target (raise `concurrency`).
    pub late_starts: u64,
    /// Failed requests by kind: `status 404`, `timeout`, `connect`,
    /// `broken stream` (ended without its end event, or cut off),
    /// `stream error` (an error event in the stream), `broken body`,
    /// `empty body`, `request`.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// (percentile, milliseconds) points for a latency plot.
    pub percentiles: Vec<(f64, f64)>,
    /// (percentile, milliseconds) points for a time-to-first-token plot.
    pub ttft_percentiles: Vec<(f64, f64)>,
}

/// Points for a latency-by-percentile plot, denser toward the tail.
pub fn plot_points(sorted: &[u64]) -> Vec<(f64, f64)> {
    if sorted.is_empty() {
        return Vec::new();
    }
    let mut points: Vec<f64> = (0..=90).step_by(5).map(f64::from).collect();
    points.extend([92.5, 95.0, 97.5, 99.0, 99.5, 99.9, 99.99, 100.0]);
    points.into_iter().map(|p| (p, nanos_to_ms(percentile(sorted, p.max(0.0001))))).collect()
}

/// `Duration` from milliseconds.
pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
