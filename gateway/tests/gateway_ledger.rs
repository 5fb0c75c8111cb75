//! The usage record of each request (its access line) adds up: a priced
//! model's requests — plain answers, streams, a client that leaves early,
//! an upstream error — each get a line with their tokens and cost, the
//! cost is the model's prices applied to the line's own tokens (exact, in
//! nano-units, written as a decimal string), and the lines sum to the
//! counters in `/metrics` and to the key's month in the usage report (what
//! the operator writes to `ApiKey.status.usage`) to the last token and
//! nano-unit — over a handful of each kind, and over a mixed load of
//! `WAYCAST_LEDGER_REQUESTS` requests (2,000 by default; 100,000 for the
//! figure in docs/budgets.md).

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::GatewayProcess;
use waycast_crds::money::{Money, PricingConfig};
use waycast_mock::fixtures::{self as fixture, ALICE_KEY};
use waycast_mock::upstream::{self as mock_upstream, MockOptions};

#[tokio::test]
async fn every_request_of_a_priced_model_has_a_record_and_the_records_sum_to_the_counter() {
    let (_mock, gateway) = priced_gateway().await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let url = gateway.url("/v1/chat/completions");
    let send = |body: String, headers: Vec<(&'static str, &'static str)>| client.request(request(&url, body, &headers));
    let mut sent = 0;
    for size in [10, 400, 4_000] {
        for stream in [false, true] {
            let response = send(chat(stream, size), vec![("x-mock-chunks", "7")]).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            response.into_body().collect().await.unwrap();
            sent += 1;
        }
    }
    // An upstream error: a record, costing nothing.
    let failed = send(chat(false, 50), vec![("x-mock-status", "500")]).await.unwrap();
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    failed.into_body().collect().await.unwrap();
    sent += 1;
    // A client that leaves after the first chunk of a slow stream: a
    // record of what it read, charged by estimate.
    let mut leaving = send(chat(true, 100), vec![("x-mock-chunks", "50"), ("x-mock-interval-ms", "50")]).await.unwrap();
    leaving.body_mut().frame().await.unwrap().unwrap();
    drop(leaving);
    sent += 1;

    let lines = records(&gateway, sent).await;
    let mut statuses: Vec<u64> = lines.iter().map(|line| line["status"].as_u64().unwrap()).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 499, 500], "six answers, a client gone, an upstream error");
    let mut total = 0_u64;
    for line in &lines {
        assert_eq!(line["currency"], "EUR", "{line}");
        let cost = Money::parse(line["cost"].as_str().unwrap()).unwrap();
        let status = line["status"].as_u64().unwrap();
        if status == 500 {
            assert_eq!(cost, Money::ZERO, "an upstream error costs nothing: {line}");
        } else if status == 200 {
            // The reported tokens at the model's prices, rounded up once.
            let (prompt, completion) =
                (line["prompt_tokens"].as_u64().unwrap(), line["completion_tokens"].as_u64().unwrap());
            let expected =
                (u128::from(prompt) * 200_000_000 + u128::from(completion) * 600_000_000).div_ceil(1_000_000);
            assert_eq!(u128::from(cost.0), expected, "{line}");
            assert_eq!(completion, 7, "the mock's seven chunks, a token each: {line}");
        } else {
            assert_eq!(status, 499, "{line}");
            assert!(cost > Money::ZERO, "the early leaver pays for what it read: {line}");
        }
        total += cost.0;
    }
    assert_sums_agree(&gateway, &lines).await;
    assert!(total > 0);
}

/// A mixed load, 16 at a time: plain answers and streams of several
/// sizes, clients that leave a stream early, upstream errors (a 500, a 429)
/// and a stream the upstream cuts off before its usage.
#[tokio::test]
async fn the_records_of_a_mixed_load_sum_to_the_keys_month_and_the_counters() {
    let requests: usize = std::env::var("WAYCAST_LEDGER_REQUESTS").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000);
    let (_mock, gateway) = priced_gateway().await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let url = gateway.url("/v1/chat/completions");
    let next = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..16)
        .map(|_| {
            let (client, url, next) = (client.clone(), url.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= requests {
                        return;
                    }
                    let size = 10 + (index * 37) % 2_000;
                    let (stream, headers, leave): (bool, &[(&str, &str)], bool) = match index % 10 {
                        0..=2 => (false, &[("x-mock-chunks", "9")], false),
                        3..=5 => (true, &[("x-mock-chunks", "12")], false),
                        6 => (true, &[("x-mock-chunks", "40"), ("x-mock-interval-ms", "5")], true),
                        7 => (false, &[("x-mock-status", "500")], false),
                        8 => (true, &[("x-mock-status", "429")], false),
                        _ => (
                            true,
                            &[("x-mock-chunks", "6"), ("x-mock-stall", "usage"), ("x-mock-interval-ms", "1")],
                            true,
                        ),
                    };
                    let mut response = client.request(request(&url, chat(stream, size), headers)).await.unwrap();
                    if leave {
                        // The first frame, then gone.
                        response.body_mut().frame().await.unwrap().unwrap();
                        drop(response);
                    } else {
                        response.into_body().collect().await.unwrap();
                    }
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
    let lines = records(&gateway, requests).await;
    let statuses = |code: u64| lines.iter().filter(|line| line["status"] == code).count();
    println!(
        "{requests} requests: {} answered, {} left early, {} upstream errors",
        statuses(200),
        statuses(499),
        statuses(500) + statuses(429)
    );
    assert!(statuses(200) > 0 && statuses(499) > 0 && statuses(500) > 0 && statuses(429) > 0);
    assert_sums_agree(&gateway, &lines).await;
}

/// A gateway pricing its model at 0.20 / 0.60 EUR a million tokens, in
/// front of a mock upstream.
async fn priced_gateway() -> (mock_upstream::MockUpstream, GatewayProcess) {
    let mock = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap();
    let mut config = fixture::default_config(&mock.base_url());
    config.settings.budgets.currency = "EUR".into();
    config.models[0].pricing = Some(PricingConfig {
        currency: "EUR".into(),
        input_per_million_tokens: "0.20".into(),
        output_per_million_tokens: "0.60".into(),
        cached_input_per_million_tokens: None,
    });
    let gateway = GatewayProcess::start(&config, &["--workers", "2", "--log", "info"]).await;
    (mock, gateway)
}

fn chat(stream: bool, size: usize) -> String {
    format!(
        r#"{{"model":"llama3","stream":{stream},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(size)
    )
}

fn request(url: &str, body: String, headers: &[(&str, &str)]) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut request = fixture::post_request(url, Some(ALICE_KEY), &body);
    for (name, value) in headers {
        request.headers_mut().insert(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
    }
    request
}

/// The access lines of the chat path, once all `expected` are written.
async fn records(gateway: &GatewayProcess, expected: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let written = gateway.stdout().matches(r#""path":"/v1/chat/completions""#).count();
        if written >= expected {
            break;
        }
        assert!(Instant::now() < deadline, "{written} records of {expected}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines: Vec<serde_json::Value> = gateway
        .stdout()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(lines.len(), expected, "one record per request");
    lines
}

/// The records' sums equal the counters in `/metrics` and the key's month
/// in the report the operator collects (`ApiKey.status.usage`): requests,
/// tokens and cost, each to the last unit.
async fn assert_sums_agree(gateway: &GatewayProcess, lines: &[serde_json::Value]) {
    let sum = |field: &str| lines.iter().map(|line| line[field].as_u64().unwrap_or(0)).sum::<u64>();
    let cost: u64 = lines.iter().map(|line| Money::parse(line["cost"].as_str().unwrap()).unwrap().0).sum();
    let (prompt, completion) = (sum("prompt_tokens"), sum("completion_tokens"));
    assert!(prompt > 0 && completion > 0 && cost > 0, "something was charged");
    let metric = |name: String| async move { gateway.metric(&name).await.map_or(0, |value| value as u64) };
    let counted_cost =
        metric(r#"waycast_gateway_cost_nanos_total{currency="EUR",key="team-a/alice",model="llama-3.1-8b"}"#.into())
            .await;
    let token_series = |kind: &str| {
        format!(r#"waycast_gateway_tokens_total{{key="team-a/alice",kind="{kind}",model="llama-3.1-8b"}}"#)
    };
    let counted_prompt = metric(token_series("prompt")).await;
    let counted_completion = metric(token_series("completion")).await;
    assert_eq!(
        (counted_prompt, counted_completion, counted_cost),
        (prompt, completion, cost),
        "the records sum to the counters"
    );
    let report: waycast_crds::usage::UsageReport =
        serde_json::from_str(&gateway.admin_get("/usage").await.unwrap()).unwrap();
    let month = report.keys["team-a/alice"];
    assert_eq!(
        (month.requests, month.input_tokens, month.output_tokens, month.cost_nanos),
        (lines.len() as u64, prompt, completion, cost),
        "the records sum to the key's month"
    );
    println!(
        "records, counters and the key's month: {prompt} prompt and {completion} completion tokens, {cost} nano-EUR"
    );
}
