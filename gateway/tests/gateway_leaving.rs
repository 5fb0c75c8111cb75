//! What a request is charged for each way of ending, through a real
//! gateway in-process in front of the mock upstream: the key's budgets (in
//! tokens and in money, read back from `GET /v1/usage`) move by what the
//! table in docs/budgets.md promises — whatever the caller does, at least
//! what the upstream will bill for it.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::Value;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::{GatewayConfig, LimitsConfig};
use waycast_crds::money::{Money, PricingConfig};
use waycast_crds::period::Period;
use waycast_crds::spend::BudgetConfig;
use waycast_mock::fixtures::ALICE_KEY;

/// Asks for 4,000 output tokens: the mock answers 5 (its usage), an
/// upstream bills the 4,000 it was asked for when it finishes them.
const CHAT: &str = r#"{"model":"llama3","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}"#;
const STREAM: &str =
    r#"{"model":"llama3","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}"#;
/// Names no output bound: the reservation made at admission stands for it.
const UNBOUNDED: &str = r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#;
/// What the gateway reserves for a request naming no bound (the model's
/// `outputTokenReservation`).
const RESERVED_OUTPUT: u64 = 700;
const CHUNKS: (&str, &str) = ("x-mock-chunks", "5");
/// An answer the caller gives up on: its head comes in 10 s.
const SLOW: (&str, &str) = ("x-mock-delay-ms", "10000");

/// Alice has a day's token budget and a month's money budget, and a token
/// limit (so her streams are counted event by event, as the gateway asks
/// for their usage); llama costs 1 a million prompt tokens and 2 a million
/// completion tokens; mistral answers its first byte within 300 ms.
async fn fixture() -> Fixture {
    Fixture::start(FixtureOptions::default(), |gateway: &mut GatewayConfig, _| {
        let alice = &mut gateway.keys[0];
        alice.budgets = vec![
            BudgetConfig { period: Period::Day, tokens: Some(10_000_000), cost: None },
            BudgetConfig { period: Period::Month, tokens: None, cost: Some("1000".into()) },
        ];
        alice.limits = Some(LimitsConfig {
            requests_per_minute: None,
            tokens_per_minute: Some(100_000_000),
            max_concurrent: None,
        });
        gateway.models[0].pricing = Some(PricingConfig {
            currency: "USD".into(),
            input_per_million_tokens: "1".into(),
            output_per_million_tokens: "2".into(),
            cached_input_per_million_tokens: None,
        });
        gateway.models[0].output_token_reservation = Some(RESERVED_OUTPUT);
        gateway.models[1].timeouts.first_byte = Duration::from_millis(300);
    })
    .await
}

/// Alice's budgets as `GET /v1/usage` shows them.
async fn budgets(fixture: &Fixture) -> Vec<Value> {
    let request = http::Request::get(fixture.url("/v1/usage"))
        .header("authorization", format!("Bearer {ALICE_KEY}"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let usage: Value = serde_json::from_slice(&body).unwrap();
    usage["budgets"].as_array().unwrap().clone()
}

/// Alice's spend: (tokens today, money this month).
async fn spent(fixture: &Fixture) -> (u64, String) {
    let budgets = budgets(fixture).await;
    let of = |period: &str| budgets.iter().find(|b| b["period"] == period).unwrap();
    (of("Day")["spent_tokens"].as_u64().unwrap(), of("Month")["spent_cost"].as_str().unwrap().to_owned())
}

/// Waits until alice's spend moves from `before` (a request ended after
/// its client left), and returns it.
async fn moved_from(fixture: &Fixture, before: &(u64, String)) -> (u64, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = spent(fixture).await;
        // NB: the day's tokens and the month's cost are two budgets,
        // settled one after the other: a read between them saw one moved.
        if now.0 != before.0 && now.1 != before.1 {
            return now;
        }
        assert!(Instant::now() < deadline, "the request was never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What `(prompt, completion)` costs at llama's prices.
fn cost(prompt: u64, completion: u64) -> String {
    Money(prompt * 1_000 + completion * 2_000).to_string()
}

/// The gateway's prompt estimate for a body: a token per four bytes.
fn prompt(body: &str) -> u64 {
    body.len().div_ceil(4) as u64
}

/// Sends `body` and gives up after 300 ms, before the answer's head.
async fn leave_before_the_head(fixture: &Fixture, body: &str, headers: &[(&'static str, &str)]) {
    let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, headers);
    let left = tokio::time::timeout(Duration::from_millis(300), fixture.open(request)).await;
    assert!(left.is_err(), "the answer came before the caller left");
}

/// Opens `body` and reads until `enough` says so, then leaves; returns what
/// was read.
async fn leave_once(
    fixture: &Fixture,
    body: &str,
    headers: &[(&'static str, &str)],
    enough: impl Fn(&[u8]) -> bool,
) -> Vec<u8> {
    let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, headers);
    let response = fixture.open(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut read = Vec::new();
    while !enough(&read) {
        let frame = body.frame().await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data);
        }
    }
    read
}

fn events(read: &[u8]) -> u64 {
    read.windows(2).filter(|pair| pair == b"\n\n").count() as u64
}

/// Read to its end with usage: charged the usage, at the model's prices.
#[tokio::test]
async fn a_completed_answer_is_charged_its_usage() {
    let fixture = fixture().await;
    let before = spent(&fixture).await;
    let (status, _, body) =
        fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[CHUNKS])).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    let used = |name: &str| answer["usage"][name].as_u64().unwrap();
    let (prompt, completion) = (used("prompt_tokens"), used("completion_tokens"));
    assert_eq!(completion, 5);
    assert_eq!(spent(&fixture).await, (before.0 + prompt + completion, cost(prompt, completion)));
}

/// Left before a non-streamed answer's head: the upstream finishes and
/// bills the whole answer, so the caller pays the prompt and `max_tokens`
/// — or, naming none, the output the gateway reserved for it.
#[tokio::test]
async fn leaving_before_the_head_is_charged_the_output_bound() {
    let fixture = fixture().await;
    leave_before_the_head(&fixture, CHAT, &[SLOW, CHUNKS]).await;
    let charged = prompt(CHAT) + 4_000;
    assert_eq!(moved_from(&fixture, &(0, cost(0, 0))).await, (charged, cost(prompt(CHAT), 4_000)));

    leave_before_the_head(&fixture, UNBOUNDED, &[SLOW, CHUNKS]).await;
    let after = moved_from(&fixture, &(charged, cost(prompt(CHAT), 4_000))).await;
    assert_eq!(after.0, charged + prompt(UNBOUNDED) + RESERVED_OUTPUT);
    // The abandoned requests' connections were closed, not pooled: the
    // next answer is the next request's own, not a late one of theirs.
    for _ in 0..4 {
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-chunks", "3")]);
        let (status, _, body) = fixture.send(request).await;
        assert_eq!(status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");
    }
}

/// Waits until the mock saw `count` of its streamed (or chunked) answers
/// cut off: the upstream connection was closed, so the upstream stopped.
async fn cancelled_upstream(fixture: &Fixture, count: u64) {
    let cancelled = &fixture.mock.recorder.streams_cancelled;
    let deadline = Instant::now() + Duration::from_secs(10);
    while cancelled.load(std::sync::atomic::Ordering::Relaxed) < count {
        assert!(Instant::now() < deadline, "the upstream answer was not cancelled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A stream left before its head: nothing better is known than the bound.
#[tokio::test]
async fn leaving_a_stream_before_its_head_is_charged_the_output_bound() {
    let fixture = fixture().await;
    leave_before_the_head(&fixture, STREAM, &[SLOW, CHUNKS]).await;
    let moved = moved_from(&fixture, &(0, cost(0, 0))).await;
    assert_eq!(moved, (prompt(STREAM) + 4_000, cost(prompt(STREAM), 4_000)));
}

/// Left during a non-streamed body, before its usage was read: the whole
/// answer was generated (and billed), so the bound is charged.
#[tokio::test]
async fn leaving_during_a_body_is_charged_the_output_bound() {
    let fixture = fixture().await;
    let headers = [CHUNKS, ("x-mock-chunked", "true"), ("x-mock-stall", "body")];
    leave_once(&fixture, CHAT, &headers, |read| !read.is_empty()).await;
    let moved = moved_from(&fixture, &(0, cost(0, 0))).await;
    assert_eq!(moved, (prompt(CHAT) + 4_000, cost(prompt(CHAT), 4_000)));
    cancelled_upstream(&fixture, 1).await;
}

/// Left mid-stream, or after the content but before the usage chunk: the
/// upstream stops on the close, and what was relayed is what was produced
/// — a token per event.
#[tokio::test]
async fn leaving_a_stream_is_charged_what_was_relayed() {
    let fixture = fixture().await;
    let mid = [("x-mock-chunks", "50"), ("x-mock-stall", "body")];
    let read = leave_once(&fixture, STREAM, &mid, |read| events(read) >= 1).await;
    assert_eq!(events(&read), 1);
    let first = moved_from(&fixture, &(0, cost(0, 0))).await;
    assert_eq!(first, (prompt(STREAM) + 1, cost(prompt(STREAM), 1)));

    let before_usage = [CHUNKS, ("x-mock-stall", "usage")];
    let read = leave_once(&fixture, STREAM, &before_usage, |read| events(read) >= 5).await;
    assert_eq!(events(&read), 5, "{}", String::from_utf8_lossy(&read));
    let second = moved_from(&fixture, &first).await;
    assert_eq!(second.0, first.0 + prompt(STREAM) + 5);
    cancelled_upstream(&fixture, 2).await;
}

/// Nothing is charged for an answer the upstream failed; a first-byte
/// timeout leaves a request the upstream may still finish: the bound.
#[tokio::test]
async fn an_upstream_error_costs_nothing_and_a_timeout_the_output_bound() {
    let fixture = fixture().await;
    let failed = fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-status", "500")]);
    assert_eq!(fixture.send(failed).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(spent(&fixture).await, (0, cost(0, 0)));

    let body = CHAT.replace("llama3", "mistral-7b");
    let stalled = fixture.request("/v1/chat/completions", Some(ALICE_KEY), &body, &[("x-mock-stall", "headers")]);
    assert_eq!(fixture.send(stalled).await.0, StatusCode::GATEWAY_TIMEOUT);
    // Mistral is not priced: tokens only.
    assert_eq!(spent(&fixture).await, (prompt(&body) + 4_000, cost(0, 0)));
}

/// A request refused before it was forwarded costs nothing: by a budget
/// its worst case does not fit, or by a token limit after its budgets were
/// reserved.
#[tokio::test]
async fn a_request_refused_before_forwarding_costs_nothing() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway: &mut GatewayConfig, _| {
        let alice = &mut gateway.keys[0];
        alice.budgets = vec![BudgetConfig { period: Period::Day, tokens: Some(10_000), cost: None }];
        alice.limits =
            Some(LimitsConfig { requests_per_minute: None, tokens_per_minute: Some(1_000), max_concurrent: None });
    })
    .await;
    let day = |budgets: Vec<Value>| budgets[0]["spent_tokens"].as_u64().unwrap();
    // A full bucket admits a reservation larger than the limit: this one is
    // served and charged its usage, and leaves the bucket short of another.
    let (status, _, _) = fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[CHUNKS])).await;
    assert_eq!(status, StatusCode::OK);
    let served = day(budgets(&fixture).await);
    assert!(served > 0 && served < 100, "{served}");
    let (status, _, body) =
        fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[CHUNKS])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&body));
    assert_eq!(day(budgets(&fixture).await), served);
    // Its worst case does not fit the budget's rest: refused by it.
    let greedy = CHAT.replace("4000", "9990");
    let (status, _, body) =
        fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), &greedy, &[CHUNKS])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(String::from_utf8_lossy(&body).contains("insufficient_quota"));
    assert_eq!(day(budgets(&fixture).await), served);
}

/// A client that leaves while its request waits in a full model's fair
/// queue leaves before anything was forwarded: it costs nothing.
#[tokio::test]
async fn leaving_the_fair_queue_costs_nothing() {
    const DEPTH: &str = r#"waycast_gateway_queue_depth{class="standard",model="llama-3.1-8b"}"#;
    let fixture = Fixture::start(FixtureOptions::default(), |gateway: &mut GatewayConfig, _| {
        let alice = &mut gateway.keys[0];
        // Three requests' reservations (each ~4,000 tokens of output bound
        // plus the prompt estimate) fit, four do not: what the leaver
        // reserved must be given back for three to fit again at the end.
        alice.budgets = vec![BudgetConfig { period: Period::Day, tokens: Some(12_300), cost: None }];
        gateway.models[0].capacity = Some(waycast_crds::config::CapacityConfig { max_in_flight_per_endpoint: 2 });
        gateway.settings.sharing.max_wait = Duration::from_secs(20);
    })
    .await;
    let day = |budgets: Vec<Value>| budgets[0]["spent_tokens"].as_u64().unwrap();
    // Alice fills the model for 8 s; her third request waits its turn.
    let slow =
        || fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-delay-ms", "8000"), CHUNKS]);
    let filling = futures_util::future::join(fixture.send(slow()), fixture.send(slow()));
    let meanwhile = async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while fixture.mock.recorder.requests().await.len() < 2 {
            assert!(Instant::now() < deadline, "the filling requests never reached the mock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let queued = fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[CHUNKS]);
        let leaving = tokio::time::timeout(Duration::from_secs(2), fixture.open(queued));
        let waited = async {
            let deadline = Instant::now() + Duration::from_secs(5);
            while fixture.metric(DEPTH).await != Some(1.0) {
                assert!(Instant::now() < deadline, "the third request never queued");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let (left, ()) = tokio::join!(leaving, waited);
        assert!(left.is_err(), "the queued request was answered");
        let deadline = Instant::now() + Duration::from_secs(5);
        while fixture.metric(DEPTH).await != Some(0.0) {
            assert!(Instant::now() < deadline, "the leaver never left the queue");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The fillers are still running: nothing is spent yet.
        assert_eq!(day(budgets(&fixture).await), 0);
    };
    let ((first, second), ()) = tokio::join!(filling, meanwhile);
    assert_eq!((first.0, second.0), (StatusCode::OK, StatusCode::OK));
    // Only the two that were served are charged (their usage).
    let served = day(budgets(&fixture).await);
    assert_eq!(served, 2 * (prompt_of_served(&first.2) + 5));
    assert_eq!(fixture.mock.recorder.requests().await.len(), 2, "the leaver was never forwarded");
    // Its reservation was given back: three at once fit the budget again.
    let held =
        || fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-delay-ms", "1000"), CHUNKS]);
    let (a, b, c) = tokio::join!(fixture.send(held()), fixture.send(held()), fixture.send(held()));
    assert_eq!(
        (a.0, b.0, c.0),
        (StatusCode::OK, StatusCode::OK, StatusCode::OK),
        "{:?}",
        String::from_utf8_lossy(&c.2)
    );
}

/// The prompt tokens the mock reported in an answer.
fn prompt_of_served(body: &[u8]) -> u64 {
    let answer: Value = serde_json::from_slice(body).unwrap();
    answer["usage"]["prompt_tokens"].as_u64().unwrap()
}
