//! A hostile upstream (`hostile_upstream.rs`) behind a real gateway
//! in-process, with a token limit on so the usage tap and the usage-chunk
//! filter run: each misbehaviour ends in bounded time and memory, costs
//! only its own request, and never locks a key out.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use waycast_crds::config::LimitsConfig;
use waycast_e2e::fixture::{ALICE_KEY, Fixture, FixtureOptions};
use waycast_e2e::hostile_upstream;

const CHAT: &str = r#"{"model":"mistral-7b","messages":[{"role":"user","content":"hi"}]}"#;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

#[tokio::test]
async fn a_hostile_upstream_costs_only_its_own_requests() {
    let hostile = hostile_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        let mut model = config.models[1].clone();
        model.name = "hostile".into();
        model.backends[0].url = format!("http://{hostile}/v1");
        model.forward_headers = vec!["x-hostile".into()];
        model.timeouts.idle = Duration::from_secs(2);
        config.models.push(model);
        config.keys[0].limits = Some(LimitsConfig { requests_per_minute: None, tokens_per_minute: Some(100_000) });
    })
    .await;
    let before = rss_bytes();
    let stream = r#"{"model":"hostile","stream":true,"messages":[]}"#;
    let plain = r#"{"model":"hostile","messages":[]}"#;
    let mut outcomes = Vec::new();
    for (mode, body) in
        [("endless-event", stream), ("drip", plain), ("huge-header", plain), ("reset", stream), ("absurd-usage", plain)]
    {
        let started = Instant::now();
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &[("x-hostile", mode)]);
        let outcome = tokio::time::timeout(Duration::from_secs(20), async {
            let response = fixture.open(request).await;
            let status = response.status();
            let body = response.into_body().collect().await.map(|c| c.to_bytes().len());
            (status, body)
        })
        .await
        .unwrap_or_else(|_| panic!("{mode}: the request did not end within 20 s"));
        println!("{mode}: {outcome:?} after {:?}", started.elapsed());
        // Every other client is served meanwhile and after.
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
        assert_eq!(status, StatusCode::OK, "after {mode}");
        outcomes.push((mode, outcome));
    }
    // The endless event went through unfiltered, and was counted.
    let (status, relayed) = &outcomes[0].1;
    assert_eq!(*status, StatusCode::OK);
    assert!(relayed.as_ref().is_ok_and(|bytes| *bytes > 2_000_000), "{relayed:?}");
    let too_long = r#"waycast_gateway_upstream_errors_total{model="hostile",reason="sse_event_too_long"}"#;
    assert_eq!(fixture.metric(too_long).await, Some(1.0));
    // A 1 MiB response header is refused: 502.
    assert_eq!(outcomes[2].1.0, StatusCode::BAD_GATEWAY);
    // 10^15 reported tokens are capped at what the bytes make plausible:
    // the key is not locked out.
    let (status, headers, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK);
    let left: u64 = headers["x-ratelimit-remaining-tokens"].to_str().unwrap().parse().unwrap();
    assert!(left > 50_000, "absurd usage drained the key: {left} left");
    let grown = rss_bytes().saturating_sub(before);
    println!("RSS grew by {} KiB", grown / 1024);
    assert!(grown < 64 << 20, "RSS grew by {grown} bytes");
}
