//! Closed-loop load for the sharing benchmarks (`make bench-fairness`):
//! users that stream generations through a gateway one after another, what
//! each of their requests saw, and what the vLLM-like mock pods held.
//!
//! ```text
//! users(url, model, bearer, n, max_tokens, until) ─► n tasks: stream, stream, … ─► Vec<Sample>
//! sample_running(pods) ─► their running / waiting requests every 50 ms ─► Held
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use waycast_mock::fixtures as fixture;

/// A plain-HTTP client (the benches reach the gateway's Service directly).
pub type PlainClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

/// A new plain-HTTP client with a connection pool of its own.
pub fn plain_client() -> PlainClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// One request's fate, as its user saw it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The answer's status (none: no answer within 180 s).
    pub status: Option<StatusCode>,
    /// Sent → first body frame (streams answered 200).
    pub ttft: Option<Duration>,
    /// Sent → the answer (head) arrived.
    pub answered: Duration,
    /// Sent → its body ended.
    pub took: Duration,
    /// Output tokens streamed (a `content` delta each).
    pub tokens: u64,
    /// The answer's `Retry-After`.
    pub retry_after: Option<String>,
    /// When it was sent.
    pub started: Instant,
}

/// `users` closed-loop users calling `model` with `bearer` (a key or a
/// token), each streaming `max_tokens` at a time until `until`; a refused user tries
/// again after 100 ms. Each user is a client of its own (its own
/// connection, which the Service sends to one gateway pod, as it does a
/// real client's).
///
/// # Panics
/// When a user's task panics (tests only).
pub async fn users(url: &str, model: &str, bearer: &str, users: usize, max_tokens: u64, until: Instant) -> Vec<Sample> {
    let tasks: Vec<_> = (0..users)
        .map(|user| {
            let (url, model, bearer) = (url.to_owned(), model.to_owned(), bearer.to_owned());
            let http = plain_client();
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut turn = 0;
                while Instant::now() < until {
                    let sample = stream(&http, (&url, &model), &bearer, max_tokens, user * 10_000 + turn).await;
                    turn += 1;
                    if sample.status != Some(StatusCode::OK) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    samples.push(sample);
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        #[allow(clippy::expect_used, reason = "a user's task panicking is a broken bench")]
        samples.extend(task.await.expect("a user's task"));
    }
    samples
}

/// One streamed generation of `max_tokens` of `model` at `url` (a token a
/// chunk) with a prompt of about 2 KB no other request shares (no
/// prefix-cache hits).
pub async fn stream(
    http: &PlainClient,
    (url, model): (&str, &str),
    bearer: &str,
    max_tokens: u64,
    unique: usize,
) -> Sample {
    let prompt = format!("request {unique}: ") + &"tell me about the weather in the mountains. ".repeat(45);
    let body = format!(
        r#"{{"model":"{model}","stream":true,"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"{prompt}"}}]}}"#
    );
    let started = Instant::now();
    let mut sample = Sample {
        status: None,
        ttft: None,
        answered: Duration::ZERO,
        took: Duration::ZERO,
        tokens: 0,
        retry_after: None,
        started,
    };
    let Ok(Ok(response)) =
        tokio::time::timeout(Duration::from_secs(180), http.request(fixture::post_request(url, Some(bearer), &body)))
            .await
    else {
        return sample;
    };
    sample.answered = started.elapsed();
    sample.status = Some(response.status());
    sample.retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let ok = response.status() == StatusCode::OK;
    let mut body = response.into_body();
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            if ok && sample.ttft.is_none() {
                sample.ttft = Some(started.elapsed());
            }
            sample.tokens += count(data, b"\"content\"");
        }
    }
    sample.took = started.elapsed();
    sample
}

fn count(haystack: &[u8], needle: &[u8]) -> u64 {
    haystack.windows(needle.len()).filter(|window| *window == needle).count() as u64
}

/// Output tokens of the requests sent from `from` on.
pub fn served_since(samples: &[Sample], from: Instant) -> u64 {
    samples.iter().filter(|s| s.started >= from).map(|s| s.tokens).sum()
}

/// Output tokens of the requests that ended from `from` to `until`: what
/// was served in that window, whenever each was sent (a team whose
/// requests wait longer is not counted by when it asked).
pub fn served_between(samples: &[Sample], from: Instant, until: Instant) -> u64 {
    samples.iter().filter(|s| (from..until).contains(&(s.started + s.took))).map(|s| s.tokens).sum()
}

/// The most streams of `samples` that were generating at once, each from
/// its first token to its end. A stream starts generating only after its
/// prefill (200 ms of the mock's), so two that one concurrency place
/// served one after the other never overlap here: this never counts more
/// than the gateway let through at once.
pub fn most_at_once(samples: &[Sample]) -> usize {
    let mut edges: Vec<(Instant, i32)> = Vec::new();
    for sample in samples.iter().filter(|s| s.status == Some(StatusCode::OK)) {
        if let Some(ttft) = sample.ttft {
            edges.push((sample.started + ttft, 1));
            edges.push((sample.started + sample.took, -1));
        }
    }
    // Ends before starts at the same instant.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// The `pct` percentile of `values` (0 when empty).
pub fn percentile(values: &[Duration], pct: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(((sorted.len() as f64 - 1.0) * pct).round() as usize).copied().unwrap_or_default()
}

/// The times to first token of the streams answered 200.
pub fn ttfts(samples: &[Sample]) -> Vec<Duration> {
    samples.iter().filter_map(|s| s.ttft).collect()
}

/// `duration` in milliseconds.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// The mock pods' requests running and waiting, and requests they served.
pub async fn pods_load(http: &PlainClient, ips: &[String]) -> (f64, f64, f64) {
    let mut load = (0.0, 0.0, 0.0);
    for ip in ips {
        let Ok(request) = http::Request::get(format!("http://{ip}:8000/metrics"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
        else {
            continue;
        };
        let Ok(Ok(response)) = tokio::time::timeout(Duration::from_secs(2), http.request(request)).await else {
            continue;
        };
        let Ok(body) = response.into_body().collect().await else { continue };
        let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
        let value = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        load.0 += value("vllm:num_requests_running");
        load.1 += value("vllm:num_requests_waiting");
        load.2 += value("vllm:request_success_total");
    }
    load
}

/// What the pods held while sampled.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    /// Requests running, on average.
    pub mean: f64,
    /// Requests running, at most.
    pub most: f64,
    /// Requests waiting in the pods' own queues, at most.
    pub waiting: f64,
}

/// Samples the pods' requests running and waiting every 50 ms from `from`
/// to `until`.
pub fn sample_between(
    http: PlainClient,
    ips: Vec<String>,
    from: Instant,
    until: Instant,
) -> tokio::task::JoinHandle<Held> {
    let running = Arc::new(AtomicBool::new(true));
    let flag = running.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(from.into()).await;
        let sampler = sample_running(http, ips, flag);
        tokio::time::sleep_until(until.into()).await;
        running.store(false, Ordering::Relaxed);
        sampler.await.unwrap_or(Held { mean: 0.0, most: 0.0, waiting: 0.0 })
    })
}

/// Samples the pods' requests running and waiting every 50 ms while
/// `running`.
pub fn sample_running(http: PlainClient, ips: Vec<String>, running: Arc<AtomicBool>) -> tokio::task::JoinHandle<Held> {
    tokio::spawn(async move {
        let (mut sum, mut count) = (0.0, 0.0);
        let mut held = Held { mean: 0.0, most: 0.0, waiting: 0.0 };
        while running.load(Ordering::Relaxed) {
            let (now, waiting, _) = pods_load(&http, &ips).await;
            sum += now;
            count += 1.0;
            held.most = held.most.max(now);
            held.waiting = held.waiting.max(waiting);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        held.mean = sum / f64::max(count, 1.0);
        held
    })
}
