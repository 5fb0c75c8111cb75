//! Rate limits through a real gateway in-process, in front of the mock
//! upstream: the admitted rate, the 429's shape and headers, and token
//! limits charged from streamed usage.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::LimitsConfig;
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY};

const CHAT: &str = r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#;

fn limits(requests: Option<u64>, tokens: Option<u64>) -> Option<LimitsConfig> {
    Some(LimitsConfig { requests_per_minute: requests, tokens_per_minute: tokens, max_concurrent: None })
}

/// A gateway whose key `team-a/alice` has these limits.
async fn alice_limited(requests: Option<u64>, tokens: Option<u64>) -> Fixture {
    Fixture::start(FixtureOptions::default(), |config, _| config.keys[0].limits = limits(requests, tokens)).await
}

#[tokio::test]
async fn a_key_limited_to_60_a_minute_gets_60_a_minute() {
    let fixture = alice_limited(Some(60), None).await;
    // Five requests a second, well over the limit, for 45 s: the first
    // minute's worth goes at once (a full bucket), then one a second.
    let started = Instant::now();
    let (mut burst, mut steady, mut refused) = (0, 0, 0);
    let mut next = started;
    while started.elapsed() < Duration::from_secs(45) {
        let (status, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
        match status {
            StatusCode::OK if started.elapsed() < Duration::from_secs(15) => burst += 1,
            StatusCode::OK => steady += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&body)),
        }
        next += Duration::from_millis(200);
        tokio::time::sleep_until(next.into()).await;
    }
    println!("60/min key: {burst} admitted in the first 15 s, {steady} in the next 30 s, {refused} refused");
    // The bucket (60) plus 15 s of refill in the first 15 s; the rate after.
    assert!((70..=76).contains(&burst), "first 15 s: {burst}");
    assert!((27..=33).contains(&steady), "30 s at 60/min: {steady} (±10 %)");
    assert!(refused > 100);
    // Another key is not limited by it.
    let mistral = r#"{"model":"mistral-7b","messages":[]}"#;
    assert_eq!(fixture.post("/v1/chat/completions", Some(BOB_KEY), mistral).await.0, StatusCode::OK);
}

#[tokio::test]
async fn refusals_are_openai_429s_with_the_headers_sdks_read() {
    let fixture = alice_limited(Some(2), None).await;
    let (status, headers, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-ratelimit-limit-requests"], "2");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "1");
    assert_eq!(headers["x-ratelimit-reset-requests"], "30s");
    assert_eq!(fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await.0, StatusCode::OK);

    let (status, headers, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert_eq!(error["error"]["type"], "requests");
    assert!(error["error"]["message"].as_str().unwrap().contains("2 requests per minute"), "{error}");
    assert_eq!(headers["content-type"], "application/json");
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((29..=30).contains(&retry_after), "one request frees up in 30 s: {retry_after}");
    let retry_after_ms: u64 = headers["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!(retry_after_ms.div_ceil(1000) == retry_after);
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert_eq!(headers["x-ratelimit-limit-requests"], "2");

    // Refused before the body was read: the model is not known yet.
    let metric =
        "waycast_gateway_rate_limit_requests_total{decision=\"key_requests\",key=\"team-a/alice\",model=\"unknown\"}";
    assert_eq!(fixture.metric(metric).await, Some(1.0));
    let admitted =
        "waycast_gateway_rate_limit_requests_total{decision=\"admitted\",key=\"team-a/alice\",model=\"llama-3.1-8b\"}";
    assert_eq!(fixture.metric(admitted).await, Some(2.0));
}

#[tokio::test]
async fn a_token_limit_is_charged_from_streamed_usage_the_client_did_not_ask_for() {
    // The mock reports prompt = body length / 4 and one completion token
    // per chunk: a bit over 40 tokens for this request.
    let fixture = alice_limited(None, Some(60)).await;
    // It reserves its prompt estimate and max_tokens: under 60.
    let stream = r#"{"model":"llama3","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), stream, &[("x-mock-chunks", "20")]);
    let (status, headers, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-ratelimit-limit-tokens"], "60");
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("\"usage\":{"), "the client did not ask for usage: {text}");
    assert_eq!(text.matches("data: ").count(), 21, "20 chunks and [DONE], the usage chunk taken out");
    let upstream = fixture.mock.recorder.last().await.unwrap();
    assert_eq!(upstream.json()["stream_options"]["include_usage"], true, "the gateway asked the upstream for usage");
    let charged = "waycast_gateway_rate_limit_tokens_total{key=\"team-a/alice\",model=\"llama-3.1-8b\"}";
    let tokens = fixture.metric(charged).await.unwrap();
    assert!(tokens > 20.0, "charged {tokens} tokens from the stream's usage");

    // What is left does not hold another request's reservation (its
    // prompt estimate and the default 1,024 output tokens): refused for tokens.
    let (status, headers, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&body));
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["type"], "tokens");
    assert!(headers["x-ratelimit-remaining-tokens"].to_str().unwrap().parse::<u64>().unwrap() < 20);

    // A client that asks for usage keeps its usage chunk.
    let fixture = alice_limited(None, Some(100_000)).await;
    let asked = r#"{"model":"llama3","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
    let (_, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), asked).await;
    assert!(String::from_utf8_lossy(&body).contains("\"usage\":{"), "asked for: kept");
}

fn charged_tokens_metric() -> &'static str {
    "waycast_gateway_rate_limit_tokens_total{key=\"team-a/alice\",model=\"llama-3.1-8b\"}"
}

/// Twenty parallel streams on a 1,000-tokens-per-minute key: each reserves
/// its prompt estimate and `max_tokens` at admission, so only as many as
/// fit are admitted, and what they are charged exceeds the limit by at
/// most one request's reservation.
#[tokio::test]
async fn parallel_requests_overshoot_a_token_limit_by_at_most_one_reservation() {
    let fixture = alice_limited(None, Some(1000)).await;
    let body = r#"{"model":"llama3","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let reservation = body.len().div_ceil(4) as f64 + 100.0;
    let requests = (0..20).map(|_| {
        // 100 chunks: the mock reports 100 completion tokens, about what was reserved.
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &[("x-mock-chunks", "100")]);
        fixture.send(request)
    });
    let statuses: Vec<StatusCode> =
        futures_util::future::join_all(requests).await.into_iter().map(|(s, _, _)| s).collect();
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let refused = statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!(admitted + refused, 20, "{statuses:?}");
    let charged = fixture.metric(charged_tokens_metric()).await.unwrap();
    println!("1,000 TPM: {admitted} of 20 admitted, {charged} tokens charged (reservation {reservation})");
    assert!((1..=8).contains(&admitted), "{admitted} admitted");
    assert!(charged <= 1000.0 + reservation, "charged {charged}: more than the limit and one reservation");
}

/// A request the upstream fails (its error answered, or never reached) is
/// charged nothing: its reservation is given back, so failures do not use
/// up a key's tokens.
#[tokio::test]
async fn a_reservation_is_given_back_when_the_upstream_fails() {
    let fixture = alice_limited(None, Some(3000)).await;
    let body = r#"{"model":"llama3","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}"#;
    // Each reserves over 1,000 tokens: three in a row would pass 3,000
    // unless each is given back.
    for _ in 0..6 {
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &[("x-mock-status", "500")]);
        let (status, _, answer) = fixture.send(request).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{}", String::from_utf8_lossy(&answer));
    }
    assert_eq!(fixture.metric(charged_tokens_metric()).await.unwrap_or(0.0), 0.0, "a failed request was charged");
    let (status, headers, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), body).await;
    assert_eq!(status, StatusCode::OK);
    let remaining: u64 = headers["x-ratelimit-remaining-tokens"].to_str().unwrap().parse().unwrap();
    assert!(remaining >= 1900, "{remaining} tokens left: failed requests used the budget");
}

/// A client that leaves mid-stream, before the usage chunk, is charged an
/// estimate of what it was sent.
#[tokio::test]
async fn a_client_that_leaves_early_is_charged_an_estimate() {
    let fixture = alice_limited(None, Some(100_000)).await;
    let body = r#"{"model":"llama3","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = fixture.request(
        "/v1/chat/completions",
        Some(ALICE_KEY),
        body,
        &[("x-mock-chunks", "50"), ("x-mock-interval-ms", "50")],
    );
    let mut response = fixture.open(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let first = http_body_util::BodyExt::frame(response.body_mut()).await.unwrap().unwrap();
    assert!(first.is_data());
    drop(response);
    let deadline = Instant::now() + Duration::from_secs(5);
    let charged = loop {
        if let Some(charged) = fixture.metric(charged_tokens_metric()).await {
            break charged;
        }
        assert!(Instant::now() < deadline, "the early leaver was never charged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The prompt estimate plus a token per four bytes relayed: more than
    // nothing, less than the whole stream's 50 tokens and the reserved 1,024.
    assert!(charged >= body.len().div_ceil(4) as f64 && charged < 1024.0, "charged {charged}");
}

/// A client that sends no `max_tokens`, reads a whole 3,000-token stream
/// and leaves before its usage chunk pays for the 3,000 tokens it read —
/// not an estimate capped at the 1,024 output tokens it reserved.
#[tokio::test]
async fn a_client_that_reads_everything_and_leaves_before_the_usage_pays_for_what_it_read() {
    let fixture = alice_limited(None, Some(1_000_000)).await;
    let body = r#"{"model":"llama3","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let headers = [("x-mock-chunks", "3000"), ("x-mock-interval-ms", "0"), ("x-mock-stall", "usage")];
    let mut response = fixture.open(fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &headers)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut received = Vec::new();
    while received.windows(2).filter(|w| w == b"\n\n").count() < 3000 {
        let frame = http_body_util::BodyExt::frame(response.body_mut()).await.unwrap().unwrap();
        received.extend_from_slice(&frame.into_data().unwrap());
    }
    assert_eq!(String::from_utf8_lossy(&received).matches("\"content\"").count(), 3000);
    drop(response);
    let deadline = Instant::now() + Duration::from_secs(5);
    let charged = loop {
        if let Some(charged) = fixture.metric(charged_tokens_metric()).await {
            break charged;
        }
        assert!(Instant::now() < deadline, "the early leaver was never charged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let prompt_estimate = body.len().div_ceil(4) as f64;
    assert!(charged >= prompt_estimate + 3000.0, "charged {charged} for 3,000 tokens read");
    assert!(charged <= prompt_estimate + 3000.0 + 2.0, "charged {charged}: an event is one token");
}

/// `n` completions may each use the whole output bound: the reservation
/// is for all of them.
#[tokio::test]
async fn a_request_for_several_completions_reserves_the_output_of_each() {
    for (n, reserved_output) in [(1, 100), (4, 400)] {
        let fixture = alice_limited(None, Some(10_000)).await;
        let body = format!(r#"{{"model":"llama3","n":{n},"max_tokens":100,"messages":[]}}"#);
        let (status, headers, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        assert_eq!(status, StatusCode::OK);
        // Reported at admission: the limit less this request's reservation.
        let left: u64 = headers["x-ratelimit-remaining-tokens"].to_str().unwrap().parse().unwrap();
        let expected = body.len().div_ceil(4) as u64 + reserved_output;
        assert!((10_000 - left).abs_diff(expected) <= 2, "n={n}: reserved {}, expected {expected}", 10_000 - left);
    }
}

/// A key over its request limit is refused before its body is read: the
/// 429 comes while a declared 5 MB body has not been sent at all.
#[tokio::test]
async fn a_key_over_its_request_limit_is_refused_before_its_body_is_read() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let fixture = alice_limited(Some(1), None).await;
    assert_eq!(fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await.0, StatusCode::OK);
    let mut stream = tokio::net::TcpStream::connect(fixture.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE_KEY}\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = vec![0_u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut response)).await;
    let n = read.expect("answered without waiting for the body").unwrap();
    let text = String::from_utf8_lossy(&response[..n]);
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    assert!(text.contains("rate_limit_exceeded"), "{text}");
}

/// A pod of a Gateway that runs at least two (`settings.minimumPods`, from
/// the Gateway's replicas) enforces half of each limit before it has
/// counted any sibling: a standalone process here, alone in its fleet.
#[tokio::test]
async fn a_pod_divides_its_limits_by_the_pods_its_gateway_runs_at_least() {
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        config.keys[0].limits = limits(Some(10), None);
        config.settings.minimum_pods = 2;
    })
    .await;
    let mut admitted = 0;
    for _ in 0..10 {
        if fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await.0 == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "half of the key's 10 a minute");
}
