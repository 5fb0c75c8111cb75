//! The source: N workers, each on its own keep-alive connection, pulling
//! tickets from a shared counter until a fixed number of requests is done.
//! At a fixed arrival rate each ticket has a scheduled start and latency is
//! counted from it, so queueing behind a slow target shows in the figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::{CHUNKS_HEADER, INTERVAL_HEADER, RunResult, Scenario, Summary, WAIT_HEADER, Workload, plot_points};

/// A request body of about `scenario.body_bytes` bytes: a padded prompt for
/// its workload, model and output length.
pub fn request_body(scenario: &Scenario) -> Bytes {
    let (model, stream) = (&scenario.model, scenario.stream);
    let limit = |field: &str, default: Option<u32>| {
        scenario.max_tokens.or(default).map(|n| format!(r#""{field}":{n},"#)).unwrap_or_default()
    };
    let (head, tail) = match scenario.workload {
        Workload::Chat => (
            format!(
                r#"{{"model":"{model}",{}"stream":{stream},"messages":[{{"role":"user","content":""#,
                limit("max_tokens", None)
            ),
            r#""}]}"#,
        ),
        Workload::Responses => {
            (format!(r#"{{"model":"{model}",{}"stream":{stream},"input":""#, limit("max_output_tokens", None)), r#""}"#)
        }
        Workload::Messages => (
            format!(
                r#"{{"model":"{model}",{}"stream":{stream},"messages":[{{"role":"user","content":""#,
                limit("max_tokens", Some(64))
            ),
            r#""}]}"#,
        ),
    };
    let padding = scenario.body_bytes.saturating_sub(head.len() + tail.len());
    let mut body = String::with_capacity(head.len() + padding + tail.len());
    body.push_str(&head);
    body.extend(std::iter::repeat_n('x', padding));
    body.push_str(tail);
    Bytes::from(body)
}

/// What one worker measured.
#[derive(Default)]
struct Tally {
    latencies: Vec<u64>,
    first_bytes: Vec<u64>,
    errors: u64,
    error_samples: Vec<String>,
}

impl Tally {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.error_samples.len() < 5 {
            self.error_samples.push(what);
        }
    }
}

/// Everything workers share.
struct Plan {
    scenario: Scenario,
    authority: String,
    /// The API path under the target's base path.
    path: String,
    body: Bytes,
    authorization: Option<http::HeaderValue>,
    tickets: AtomicU64,
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

/// Runs `scenario` to completion.
///
/// # Errors
/// The scenario is invalid; failures of requests are counted, not returned.
pub async fn run(scenario: Scenario) -> Result<RunResult, String> {
    scenario.validate()?;
    let (authority, path) = request_target(&scenario.target, scenario.workload)?;
    let authorization = match &scenario.key {
        Some(key) => {
            Some(http::HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| "key is not a valid header value")?)
        }
        None => None,
    };
    let plan = Arc::new(Plan {
        body: request_body(&scenario),
        authority,
        path,
        authorization,
        tickets: AtomicU64::new(0),
        start: Instant::now(),
        scenario,
    });
    let workers: Vec<_> = (0..plan.scenario.concurrency).map(|_| tokio::spawn(worker(plan.clone()))).collect();
    let mut total = Tally::default();
    for handle in workers {
        let tally = handle.await.map_err(|e| format!("a worker failed: {e}"))?;
        total.latencies.extend(tally.latencies);
        total.first_bytes.extend(tally.first_bytes);
        total.errors += tally.errors;
        for sample in tally.error_samples {
            if total.error_samples.len() < 5 {
                total.error_samples.push(sample);
            }
        }
    }
    let elapsed = plan.start.elapsed().as_secs_f64();
    total.latencies.sort_unstable();
    total.first_bytes.sort_unstable();
    let ok = total.latencies.len() as u64;
    Ok(RunResult {
        requests: plan.scenario.requests,
        ok,
        errors: total.errors,
        error_samples: total.error_samples,
        duration_seconds: elapsed,
        requests_per_second: if elapsed > 0.0 { ok as f64 / elapsed } else { 0.0 },
        latency: Summary::of_sorted(&total.latencies),
        time_to_first_byte: if plan.scenario.stream { Summary::of_sorted(&total.first_bytes) } else { None },
        percentiles: plot_points(&total.latencies),
    })
}

type Sender = http1::SendRequest<Full<Bytes>>;

async fn connect(authority: &str) -> Result<Sender, String> {
    let stream = TcpStream::connect(authority).await.map_err(|e| format!("connect {authority}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) =
        http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("handshake with {authority}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

async fn worker(plan: Arc<Plan>) -> Tally {
    let mut tally = Tally::default();
    let scenario = &plan.scenario;
    let timeout = Duration::from_millis(scenario.timeout_ms);
    let mut sender: Option<Sender> = None;
    loop {
        let ticket = plan.tickets.fetch_add(1, Ordering::Relaxed);
        if ticket >= scenario.requests {
            return tally;
        }
        // At a fixed rate, ticket n starts at n / rate; latency counts from then.
        let scheduled = match scenario.rate {
            Some(rate) => {
                let at = plan.start + Duration::from_secs_f64(ticket as f64 / rate);
                tokio::time::sleep_until(at.into()).await;
                at
            }
            None => Instant::now(),
        };
        if sender.as_ref().is_none_or(|s| s.is_closed()) {
            match connect(&plan.authority).await {
                Ok(s) => sender = Some(s),
                Err(error) => {
                    tally.error(error);
                    // Do not spin on a target that is down.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let Some(connection) = sender.as_mut() else { continue };
        match exchange(connection, &plan, scheduled, timeout).await {
            Ok((latency, first_byte)) => {
                tally.latencies.push(latency);
                if let Some(first_byte) = first_byte {
                    tally.first_bytes.push(first_byte);
                }
            }
            Err(error) => {
                tally.error(error);
                sender = None;
            }
        }
    }
}

/// One request; returns (latency, time to first body byte) in nanoseconds.
/// A stream may take `timeout` for its headers and for each frame; any
/// other answer `timeout` in all.
async fn exchange(
    sender: &mut Sender,
    plan: &Plan,
    scheduled: Instant,
    timeout: Duration,
) -> Result<(u64, Option<u64>), String> {
    let scenario = &plan.scenario;
    let whole = tokio::time::Instant::now() + timeout;
    let deadline = || if scenario.stream { tokio::time::Instant::now() + timeout } else { whole };
    let timed_out = |what: &str| {
        let since = scheduled.elapsed().as_secs_f64();
        if scenario.stream {
            format!("timed out: no {what} for {} ms (--timeout-ms), {since:.1} s into the stream", scenario.timeout_ms)
        } else {
            format!("timed out: no whole answer within {} ms (--timeout-ms)", scenario.timeout_ms)
        }
    };
    sender.ready().await.map_err(|e| format!("connection: {e}"))?;
    let mut builder = Request::post(plan.path.as_str())
        .header(header::HOST, &plan.authority)
        .header(header::CONTENT_TYPE, "application/json")
        .header(WAIT_HEADER, scenario.wait_ms)
        .header(CHUNKS_HEADER, scenario.chunks)
        .header(INTERVAL_HEADER, scenario.chunk_interval_ms);
    if let Some(authorization) = &plan.authorization {
        builder = builder.header(header::AUTHORIZATION, authorization.clone());
    }
    let request = builder.body(Full::new(plan.body.clone())).map_err(|e| format!("request: {e}"))?;
    let response = tokio::time::timeout_at(deadline(), sender.send_request(request))
        .await
        .map_err(|_| timed_out("response headers"))?
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    let mut body = response.into_body();
    let mut first_byte = None;
    let mut received = 0_usize;
    while let Some(frame) = tokio::time::timeout_at(deadline(), body.frame()).await.map_err(|_| timed_out("byte"))? {
        let frame = frame.map_err(|e| format!("response body: {e}"))?;
        if let Some(data) = frame.data_ref()
            && !data.is_empty()
        {
            received += data.len();
            if first_byte.is_none() {
                first_byte = Some(nanos(scheduled.elapsed()));
            }
        }
    }
    if status != StatusCode::OK {
        return Err(format!("status {status}"));
    }
    if received == 0 {
        return Err("empty response body".into());
    }
    Ok((nanos(scheduled.elapsed()), first_byte))
}

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
