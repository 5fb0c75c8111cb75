//! The source: N workers, each on its own keep-alive connection, pulling
//! tickets from a shared dispenser until a fixed number of requests is done.
//! At a fixed arrival rate each ticket has a scheduled start (Poisson or
//! evenly spaced) and latency is counted from it, so queueing behind a slow
//! target shows in the figures. Streams are read as they arrive
//! ([`crate::tokens`]): the first token, the gaps between tokens, and the
//! output token count.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::arrival::{Dispenser, SplitMix};
pub use crate::prompt::{distinct_bodies, request_bodies, request_body};
use crate::tokens::{TokenReader, reported_tokens};
use crate::{CHUNKS_HEADER, INTERVAL_HEADER, RunResult, Scenario, Summary, WAIT_HEADER, Workload, plot_points};

/// What one worker measured (nanoseconds).
#[derive(Default)]
struct Tally {
    latencies: Vec<u64>,
    first_bytes: Vec<u64>,
    first_tokens: Vec<u64>,
    /// Gaps between output tokens: every one up to the worker's share of
    /// [`GAPS_KEPT`], then a uniform sample of them (a run of millions of
    /// long streams would hold gigabytes otherwise).
    token_gaps: Vec<u64>,
    gaps_seen: u64,
    per_token: Vec<u64>,
    /// When each successful request ended, since the run started.
    ends: Vec<u64>,
    output_tokens: u64,
    /// Requests that started later than scheduled because every worker was
    /// busy: the load generator's concurrency, not the target, held them.
    late_starts: u64,
    errors_by_kind: BTreeMap<String, u64>,
    error_samples: Vec<String>,
}

/// Token gaps a run keeps in all (8 bytes each); past it, a sample.
const GAPS_KEPT: usize = 4_000_000;
/// Gaps one stream may add; a stream of more (a hostile or broken server
/// sending endless tiny events) adds its first ones only.
const GAPS_PER_STREAM: usize = 100_000;
/// A request's reported output above this is not believed (the text
/// events are counted instead).
const MOST_TOKENS_A_REQUEST: u64 = 10_000_000;
/// A ticket starting this much after it was due started late.
const LATE: Duration = Duration::from_millis(5);

impl Tally {
    /// Keeps `gaps` within `room` by reservoir sampling (each gap seen is
    /// kept with the same chance); `random` picks.
    fn keep_gaps(&mut self, gaps: &[u64], room: usize, random: &mut SplitMix) {
        for &gap in gaps {
            self.gaps_seen += 1;
            if self.token_gaps.len() < room {
                self.token_gaps.push(gap);
            } else {
                let slot = random.next_u64() % self.gaps_seen;
                if let Some(kept) = usize::try_from(slot).ok().and_then(|slot| self.token_gaps.get_mut(slot)) {
                    *kept = gap;
                }
            }
        }
    }

    fn error(&mut self, failure: Failure) {
        *self.errors_by_kind.entry(failure.kind).or_default() += 1;
        if self.error_samples.len() < 5 {
            self.error_samples.push(failure.detail);
        }
    }

    fn absorb(&mut self, other: Self) {
        self.latencies.extend(other.latencies);
        self.first_bytes.extend(other.first_bytes);
        self.first_tokens.extend(other.first_tokens);
        self.token_gaps.extend(other.token_gaps);
        self.gaps_seen += other.gaps_seen;
        self.per_token.extend(other.per_token);
        self.ends.extend(other.ends);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.late_starts += other.late_starts;
        for (kind, count) in other.errors_by_kind {
            *self.errors_by_kind.entry(kind).or_default() += count;
        }
        for sample in other.error_samples {
            if self.error_samples.len() < 5 {
                self.error_samples.push(sample);
            }
        }
    }
}

/// A failed request: its kind (the key of `errorsByKind`) and what happened.
struct Failure {
    kind: String,
    detail: String,
}

fn failure(kind: &str, detail: String) -> Failure {
    Failure { kind: kind.to_owned(), detail }
}

/// What a run measured, before it is summed up: runs of the same target
/// (rounds) pool into one with [`Measured::pool`].
#[derive(Default)]
pub struct Measured {
    requests: u64,
    offered: Option<f64>,
    streamed: bool,
    seconds: f64,
    /// Completions counted toward the sustained rate, and the seconds they
    /// were counted over (see [`completion_window`]).
    window: (f64, f64),
    tally: Tally,
}

impl Measured {
    /// Adds another run's figures (its requests and wall time too).
    pub fn pool(&mut self, other: Self) {
        // Pooled runs at a rate offered it for their summed spans.
        self.offered = match (self.offered, other.offered) {
            (Some(a), Some(b)) => {
                let (n, m) = (self.requests as f64, other.requests as f64);
                Some((n + m) / (n / a + m / b))
            }
            (a, b) => a.or(b),
        };
        self.requests += other.requests;
        self.streamed |= other.streamed;
        self.seconds += other.seconds;
        self.window = (self.window.0 + other.window.0, self.window.1 + other.window.1);
        self.tally.absorb(other.tally);
    }

    /// The figures.
    pub fn result(mut self) -> RunResult {
        self.summary()
    }

    /// The figures so far (sorting what it holds in place, so it can still
    /// be pooled after).
    pub fn summary(&mut self) -> RunResult {
        let tally = &mut self.tally;
        for list in [
            &mut tally.latencies,
            &mut tally.first_bytes,
            &mut tally.first_tokens,
            &mut tally.token_gaps,
            &mut tally.per_token,
        ] {
            list.sort_unstable();
        }
        let ok = tally.latencies.len() as u64;
        let per_second = |count: f64| if self.seconds > 0.0 { count / self.seconds } else { 0.0 };
        let streamed = |list: &[u64]| if self.streamed { Summary::of_sorted(list) } else { None };
        let (counted, over) = self.window;
        let sustained = if over > 0.0 { counted / over } else { per_second(ok as f64) };
        RunResult {
            requests: self.requests,
            ok,
            errors: tally.errors_by_kind.values().sum(),
            error_samples: tally.error_samples.clone(),
            duration_seconds: self.seconds,
            requests_per_second: per_second(ok as f64),
            offered_requests_per_second: self.offered,
            latency: Summary::of_sorted(&tally.latencies),
            time_to_first_byte: streamed(&tally.first_bytes),
            time_to_first_token: streamed(&tally.first_tokens),
            inter_token_latency: streamed(&tally.token_gaps),
            time_per_output_token: streamed(&tally.per_token),
            output_tokens: tally.output_tokens,
            output_tokens_per_second: per_second(tally.output_tokens as f64),
            sustained_requests_per_second: sustained,
            late_starts: tally.late_starts,
            errors_by_kind: tally.errors_by_kind.clone(),
            percentiles: plot_points(&tally.latencies),
            ttft_percentiles: if self.streamed { plot_points(&tally.first_tokens) } else { Vec::new() },
        }
    }
}

/// Everything workers share.
struct Plan {
    scenario: Scenario,
    authority: String,
    /// The API path under the target's base path.
    path: String,
    bodies: Vec<Bytes>,
    authorization: Option<http::HeaderValue>,
    tickets: Dispenser,
    start: Instant,
}

/// The authority and request path for `workload` at `target`: the API
/// path goes under the target's base path (a gateway mounted at a prefix),
/// and a base ending in `/v1`, as OpenAI base URLs do, is not doubled.
fn request_target(target: &str, workload: Workload) -> Result<(String, String), String> {
    let rest = target.trim_start_matches("http://");
    let (authority, base) = rest.split_once('/').map_or((rest, ""), |(authority, base)| (authority, base));
    if authority.is_empty() {
        return Err("target has no host".into());
    }
    let base = format!("/{}", base.trim_end_matches('/'));
    let prefix = base.strip_suffix("/v1").unwrap_or(base.trim_end_matches('/'));
    Ok((authority.to_owned(), format!("{prefix}{}", workload.path())))
}

/// Runs `scenario` to completion against its target, as one load (its
/// baseline, rounds and sweep are [`crate::study`]'s).
///
/// # Errors
/// The scenario is invalid; failures of requests are counted, not returned.
pub async fn run(scenario: Scenario) -> Result<RunResult, String> {
    Ok(measure(scenario, 0).await?.result())
}

/// Runs `scenario` against its target and keeps the raw figures;
/// `seed` picks the arrival gaps and bodies.
///
/// # Errors
/// The scenario is invalid; failures of requests are counted, not returned.
pub async fn measure(scenario: Scenario, seed: u64) -> Result<Measured, String> {
    scenario.validate()?;
    let (authority, path) = request_target(&scenario.target, scenario.workload)?;
    let authorization = match &scenario.key {
        Some(key) => {
            Some(http::HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| "key is not a valid header value")?)
        }
        None => None,
    };
    let plan = Arc::new(Plan {
        bodies: request_bodies(&scenario),
        authority,
        path,
        authorization,
        tickets: Dispenser::new(&scenario, seed),
        start: Instant::now(),
        scenario,
    });
    // A set: dropping it (a run cancelled or failed) stops every worker.
    let mut workers = tokio::task::JoinSet::new();
    let room = (GAPS_KEPT / plan.scenario.concurrency as usize).max(10_000);
    for index in 0..plan.scenario.concurrency {
        workers.spawn(worker(plan.clone(), room, SplitMix(seed ^ (u64::from(index) << 32))));
    }
    let mut total = Tally::default();
    while let Some(tally) = workers.join_next().await {
        total.absorb(tally.map_err(|e| format!("a worker failed: {e}"))?);
    }
    let requests = plan.scenario.requests;
    let last_due = plan.tickets.last_due(requests).await;
    total.ends.sort_unstable();
    let window = completion_window(&total.ends, last_due);
    Ok(Measured {
        requests,
        offered: last_due.filter(|span| *span > 0.0).map(|span| (requests - 1) as f64 / span),
        streamed: plan.scenario.stream,
        seconds: plan.start.elapsed().as_secs_f64(),
        window,
        tally: total,
    })
}

/// The completions that count toward what a target sustained, and the
/// seconds they came in: at a fixed rate, those after the first completion
/// while requests were still arriving (so neither the ramp at the start
/// nor the drain at the end dilutes it); otherwise, or when that window
/// holds fewer than two, those after the first until the last.
/// `ends` are sorted nanoseconds since the run started.
pub fn completion_window(ends: &[u64], last_due: Option<f64>) -> (f64, f64) {
    let (Some(&first), Some(&last)) = (ends.first(), ends.last()) else { return (0.0, 0.0) };
    if let Some(due) = last_due.map(|seconds| (seconds * 1e9) as u64).filter(|due| *due > first) {
        let counted = ends.iter().filter(|end| **end > first && **end <= due).count();
        if counted >= 2 {
            return (counted as f64, (due - first) as f64 / 1e9);
        }
    }
    if last > first { ((ends.len() - 1) as f64, (last - first) as f64 / 1e9) } else { (0.0, 0.0) }
}

type Sender = http1::SendRequest<Full<Bytes>>;

async fn connect(authority: &str, timeout: Duration) -> Result<Sender, String> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(authority))
        .await
        .map_err(|_| format!("connect {authority}: no answer within the timeout"))?
        .map_err(|e| format!("connect {authority}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) =
        http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("handshake with {authority}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

async fn worker(plan: Arc<Plan>, gaps_room: usize, mut random: SplitMix) -> Tally {
    let mut tally = Tally::default();
    let scenario = &plan.scenario;
    let timeout = Duration::from_millis(scenario.timeout_ms);
    let mut sender: Option<Sender> = None;
    loop {
        let (ticket, due) = plan.tickets.take().await;
        if ticket >= scenario.requests {
            return tally;
        }
        // At a fixed rate, a ticket starts when due; latency counts from then.
        let scheduled = match due {
            Some(seconds) => {
                let Some(at) =
                    Duration::try_from_secs_f64(seconds).ok().and_then(|after| plan.start.checked_add(after))
                else {
                    tally.error(failure("schedule", format!("a request due {seconds} s after the start")));
                    continue;
                };
                if Instant::now() > at + LATE {
                    tally.late_starts += 1;
                }
                tokio::time::sleep_until(at.into()).await;
                at
            }
            None => Instant::now(),
        };
        if sender.as_ref().is_none_or(|s| s.is_closed()) {
            match connect(&plan.authority, timeout).await {
                Ok(s) => sender = Some(s),
                Err(error) => {
                    tally.error(failure("connect", error));
                    // Do not spin on a target that is down.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let Some(connection) = sender.as_mut() else { continue };
        let body = plan.bodies[usize::try_from(ticket).unwrap_or(0) % plan.bodies.len()].clone();
        match exchange(connection, &plan, body, scheduled, timeout).await {
            Ok(answer) => {
                tally.latencies.push(answer.latency);
                tally.output_tokens = tally.output_tokens.saturating_add(answer.output_tokens);
                tally.first_bytes.extend(answer.first_byte);
                if let Some(first_token) = answer.first_token {
                    tally.first_tokens.push(first_token);
                    if answer.output_tokens > 1 {
                        tally.per_token.push((answer.latency - first_token) / (answer.output_tokens - 1));
                    }
                }
                tally.keep_gaps(&answer.token_gaps, gaps_room, &mut random);
                tally.ends.push(nanos(plan.start.elapsed()));
            }
            Err(error) => {
                tally.error(error);
                sender = None;
            }
        }
    }
}

/// What one successful request measured (nanoseconds since it was scheduled).
struct Answer {
    latency: u64,
    /// Streams only.
    first_byte: Option<u64>,
    first_token: Option<u64>,
    token_gaps: Vec<u64>,
    output_tokens: u64,
}

/// One request. A stream may take `timeout` for its headers and for each
/// frame; any other answer `timeout` in all.
async fn exchange(
    sender: &mut Sender,
    plan: &Plan,
    body: Bytes,
    scheduled: Instant,
    timeout: Duration,
) -> Result<Answer, Failure> {
    let scenario = &plan.scenario;
    let whole = tokio::time::Instant::now() + timeout;
    let deadline = || if scenario.stream { tokio::time::Instant::now() + timeout } else { whole };
    let timed_out = |what: &str| {
        let since = scheduled.elapsed().as_secs_f64();
        let detail = if scenario.stream {
            format!("timed out: no {what} for {} ms (--timeout-ms), {since:.1} s into the stream", scenario.timeout_ms)
        } else {
            format!("timed out: no whole answer within {} ms (--timeout-ms)", scenario.timeout_ms)
        };
        failure("timeout", detail)
    };
    tokio::time::timeout(timeout, sender.ready())
        .await
        .map_err(|_| timed_out("ready connection"))?
        .map_err(|e| failure("request", format!("connection: {e}")))?;
    let mut builder = Request::post(plan.path.as_str())
        .header(header::HOST, &plan.authority)
        .header(header::CONTENT_TYPE, "application/json")
        .header(WAIT_HEADER, scenario.wait_ms)
        .header(CHUNKS_HEADER, scenario.chunks)
        .header(INTERVAL_HEADER, scenario.chunk_interval_ms);
    if let Some(authorization) = &plan.authorization {
        builder = builder.header(header::AUTHORIZATION, authorization.clone());
    }
    let request = builder.body(Full::new(body)).map_err(|e| failure("request", format!("request: {e}")))?;
    let response = tokio::time::timeout_at(deadline(), sender.send_request(request))
        .await
        .map_err(|_| timed_out("response headers"))?
        .map_err(|e| failure("request", format!("request: {e}")))?;
    let status = response.status();
    let mut body = response.into_body();
    let (mut first_byte, mut first_token, mut last_token) = (None, None, None);
    let mut gaps = Vec::new();
    let mut tokens = TokenReader::default();
    // A whole answer's usage is read from its last bytes (where servers put it).
    let mut tail = Vec::new();
    let mut received = 0_usize;
    while let Some(frame) = tokio::time::timeout_at(deadline(), body.frame()).await.map_err(|_| timed_out("byte"))? {
        let broken = if scenario.stream { "broken stream" } else { "broken body" };
        let frame = frame.map_err(|e| failure(broken, format!("response body: {e}")))?;
        let Some(data) = frame.data_ref().filter(|data| !data.is_empty()) else { continue };
        received += data.len();
        let now = nanos(scheduled.elapsed());
        first_byte.get_or_insert(now);
        if scenario.stream {
            if tokens.feed(data) > 0 {
                if first_token.is_none() {
                    first_token = Some(now);
                } else if let Some(last) = last_token
                    && gaps.len() < GAPS_PER_STREAM
                {
                    gaps.push(now - last);
                }
                last_token = Some(now);
            }
        } else {
            tail.extend_from_slice(data);
            if tail.len() > 2 * TAIL_BYTES {
                tail.drain(..tail.len() - TAIL_BYTES);
            }
        }
    }
    if status != StatusCode::OK {
        return Err(failure(&format!("status {}", status.as_u16()), format!("status {status}")));
    }
    if received == 0 {
        return Err(failure("empty body", "empty response body".into()));
    }
    if scenario.stream {
        tokens.finish();
        if let Some(error) = tokens.error.take() {
            return Err(failure("stream error", format!("the stream reported an error: {error}")));
        }
        if !tokens.ended {
            return Err(failure("broken stream", "the stream ended without its end event".into()));
        }
    }
    let latency = nanos(scheduled.elapsed());
    let believed = |count: u64| (count <= MOST_TOKENS_A_REQUEST).then_some(count);
    let output_tokens = if scenario.stream {
        tokens.reported.and_then(believed).unwrap_or(tokens.text_events)
    } else {
        reported_tokens(&tail).and_then(believed).unwrap_or(0)
    };
    Ok(Answer {
        latency,
        first_byte: first_byte.filter(|_| scenario.stream),
        first_token,
        token_gaps: gaps,
        output_tokens,
    })
}

/// How much of a whole answer's end is kept to read its usage from.
const TAIL_BYTES: usize = 4096;

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_path_goes_under_the_targets_base_path() {
        let chat = |target| request_target(target, Workload::Chat);
        let at = |authority: &str, path: &str| Ok((authority.to_owned(), path.to_owned()));
        assert_eq!(chat("http://gw:8080"), at("gw:8080", "/v1/chat/completions"));
        assert_eq!(chat("http://gw:8080/"), at("gw:8080", "/v1/chat/completions"));
        assert_eq!(chat("http://gw:8080/v1"), at("gw:8080", "/v1/chat/completions"));
        assert_eq!(chat("http://gw/team-a"), at("gw", "/team-a/v1/chat/completions"));
        assert_eq!(chat("http://gw/team-a/v1/"), at("gw", "/team-a/v1/chat/completions"));
        assert_eq!(chat("http://gw/apiv1"), at("gw", "/apiv1/v1/chat/completions"));
        assert!(chat("http:///v1").is_err());
    }
}

#[cfg(test)]
mod body_tests {
    use super::*;

    #[test]
    fn the_sustained_rate_counts_completions_while_requests_arrived() {
        let second = 1_000_000_000_u64;
        // Ten a second for two seconds, then a tail of stragglers.
        let mut ends: Vec<u64> = (1..=20).map(|i| i * second / 10).collect();
        ends.extend([3 * second, 5 * second]);
        let (counted, over) = completion_window(&ends, Some(2.0));
        assert!((counted / over - 10.0).abs() < 1e-9, "{counted} over {over}");
        // As fast as answered: first to last completion.
        let (counted, over) = completion_window(&ends, None);
        assert_eq!((counted, over), (21.0, 4.9));
        assert_eq!(completion_window(&[], None), (0.0, 0.0));
        assert_eq!(completion_window(&[5], Some(1.0)), (0.0, 0.0));
    }
}
