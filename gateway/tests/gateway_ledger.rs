//! The usage record of each request (its access line) adds up: a priced
//! model's requests — plain answers, streams, a client that leaves early,
//! an upstream error — each get a line with their tokens and cost, the
//! cost is the model's prices applied to the line's own tokens (exact, in
//! nano-units, written as a decimal string), and the lines' costs sum to
//! the cost counter in `/metrics` to the last nano-unit.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::net::SocketAddr;
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
    let client = Client::builder(TokioExecutor::new()).build_http();
    let url = gateway.url("/v1/chat/completions");
    let chat = |stream: bool, size: usize| {
        format!(
            r#"{{"model":"llama3","stream":{stream},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"{}"}}]}}"#,
            "x".repeat(size)
        )
    };
    let send = |body: String, headers: Vec<(&'static str, &'static str)>| {
        let mut request = fixture::post_request(&url, Some(ALICE_KEY), &body);
        for (name, value) in headers {
            request.headers_mut().insert(name, value.parse().unwrap());
        }
        client.request(request)
    };
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

    let lines = || -> Vec<serde_json::Value> {
        gateway
            .stdout()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["path"] == "/v1/chat/completions")
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while lines().len() < sent {
        assert!(Instant::now() < deadline, "records missing:\n{}", gateway.stdout());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines = lines();
    assert_eq!(lines.len(), sent, "one record per request");
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
            assert!(cost > Money::ZERO);
        } else {
            assert_eq!(status, 499, "{line}");
            assert!(cost > Money::ZERO, "the early leaver pays for what it read: {line}");
        }
        total += cost.0;
    }
    let counted: f64 = gateway
        .metric(r#"waycast_gateway_cost_nanos_total{currency="EUR",key="team-a/alice",model="llama-3.1-8b"}"#)
        .await
        .unwrap();
    assert_eq!(counted as u64, total, "the records sum to the counter");
    // And to the key's month in the report the operator collects
    // (`ApiKey.status.usage`): requests that reached the model, tokens, cost.
    let report: waycast_crds::usage::UsageReport =
        serde_json::from_str(&gateway.admin_get("/usage").await.unwrap()).unwrap();
    let month = report.keys["team-a/alice"];
    let sum = |field: &str| lines.iter().map(|line| line[field].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!(month.requests, sent as u64, "{month:?}");
    assert_eq!((month.input_tokens, month.output_tokens), (sum("prompt_tokens"), sum("completion_tokens")));
    assert_eq!(month.cost_nanos, total, "the records sum to the key's month");
}
