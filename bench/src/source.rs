//! The source: N workers, each on its own keep-alive connection, pulling
//! tickets from a shared dispenser until a fixed number of requests is done.
//! At a fixed arrival rate each ticket has a scheduled start (Poisson or
//! evenly spaced) and latency is counted from it, so queueing behind a slow
//! target shows in the figures. Streams are read as they arrive
//! ([`crate::tokens`]): the first token, the gaps between tokens, and the
//! output token count.

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
use crate::tally::{Failure, GAPS_KEPT, GAPS_PER_STREAM, Measured, Tally, completion_window, failure};
use crate::tokens::{TokenReader, reported_tokens};
use crate::{CHUNKS_HEADER, INTERVAL_HEADER, RunResult, Scenario, WAIT_HEADER, Workload};

/// A ticket starting this much after it was due started late.
const LATE: Duration = Duration::from_millis(5);

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
    let room = (GAPS_KEPT / plan.scenario.concurrency as usize).max(1);
    for index in 0..plan.scenario.concurrency {
        workers.spawn(worker(plan.clone(), room, SplitMix(seed ^ (u64::from(index) << 32))));
    }
    let mut total = Tally::default();
    let mut random = SplitMix(seed.wrapping_add(1));
    while let Some(tally) = workers.join_next().await {
        total.absorb(tally.map_err(|e| format!("a worker failed: {e}"))?, &mut random);
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
    let output_tokens = if scenario.stream { tokens.tokens() } else { reported_tokens(&tail).unwrap_or(0) };
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
