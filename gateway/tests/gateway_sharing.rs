//! Sharing a Gateway between teams, through the real gateway in front of
//! the mock: a full model's fair queue (headroom for a team under its
//! share, `maxWait`, a client leaving while queued), concurrency per key,
//! a tenant's caps across its keys, and the Inference Extension's headers
//! stamped from the key, never from the client.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use serde_json::Value;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::{CapacityConfig, KeyConfig, LimitsConfig, TenantConfig};
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY, sha256_hex};

const CHAT: &str = r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM: &str = r#"{"model":"llama3","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const CAROL_KEY: &str = "wc_carol_test_key_0123456789abcdefghijklmno";
const DEPTH: &str = r#"waycast_gateway_queue_depth{class="standard",model="llama-3.1-8b"}"#;

/// Bob may call llama3 too (the default config lets him use mistral only).
fn everyone_calls_llama(gateway: &mut waycast_crds::GatewayConfig) {
    for key in &mut gateway.keys {
        key.models = None;
    }
}

async fn status_and_body(fixture: &Fixture, key: &str, delay_ms: &str) -> (StatusCode, http::HeaderMap, Value) {
    let request = fixture.request("/v1/chat/completions", Some(key), CHAT, &[("x-mock-delay-ms", delay_ms)]);
    let (status, headers, body) = fixture.send(request).await;
    (status, headers, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn wait_for(fixture: &Fixture, series: &str, value: f64) {
    wait_within(fixture, series, value, Duration::from_secs(5)).await;
}

async fn wait_within(fixture: &Fixture, series: &str, value: f64, within: Duration) {
    let deadline = Instant::now() + within;
    while fixture.metric(series).await != Some(value) {
        assert!(Instant::now() < deadline, "{series} never reached {value}: {:?}", fixture.metric(series).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A model of capacity 2 (one url backend × 2) with 50 % headroom: team-a
/// fills it, its next request waits and gets its 429 at `maxWait`; team-b,
/// under its share, is sent at once into the headroom; a client that
/// leaves while queued leaves the queue at once.
#[tokio::test]
async fn a_full_model_queues_its_requests_and_keeps_headroom_for_a_team_under_its_share() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        everyone_calls_llama(gateway);
        gateway.models[0].capacity = Some(CapacityConfig { max_in_flight_per_endpoint: 2 });
        gateway.settings.sharing.max_wait = Duration::from_millis(800);
    })
    .await;
    // Team-a fills the model for 2 s.
    let slow = || fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-delay-ms", "2000")]);
    let filling = futures_util::future::join_all([fixture.send(slow()), fixture.send(slow())]);
    let meanwhile = async {
        // (The requests are on their way: the mock answers after 2 s.)
        let deadline = Instant::now() + Duration::from_secs(5);
        while fixture.mock.recorder.requests().await.len() < 2 {
            assert!(Instant::now() < deadline, "the filling requests never reached the mock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Team-a's third waits its 800 ms, then 429 with Retry-After.
        let started = Instant::now();
        let (status, headers, body) = status_and_body(&fixture, ALICE_KEY, "0").await;
        let waited = started.elapsed();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["error"]["code"], "model_at_capacity");
        assert!(body["error"]["message"].as_str().unwrap().contains("waited"), "{body}");
        assert_eq!(headers["retry-after"], "1");
        assert!(waited >= Duration::from_millis(780) && waited < Duration::from_millis(1_500), "waited {waited:?}");
        // A request whose wait ran out has left the queue.
        assert_eq!(fixture.metric(DEPTH).await, Some(0.0));

        // Team-b is under its share (none of the two places): at once.
        let started = Instant::now();
        let (status, _, body) = status_and_body(&fixture, BOB_KEY, "0").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(started.elapsed() < Duration::from_millis(500), "team-b waited {:?}", started.elapsed());

        // A client that leaves while queued is out of the queue at once.
        let leaving = fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[]));
        tokio::select! {
            answered = leaving => panic!("answered while the model is full: {:?}", answered.0),
            () = wait_for(&fixture, DEPTH, 1.0) => {}
        }
        // Out of the queue at once, long before a place frees (the model is
        // full for another second).
        wait_within(&fixture, DEPTH, 0.0, Duration::from_millis(300)).await;
    };
    let (filled, ()) = tokio::join!(filling, meanwhile);
    assert!(filled.iter().all(|(status, _, _)| *status == StatusCode::OK));
    // Room again: served at once, after a wait of 0 counted.
    let (status, _, _) = status_and_body(&fixture, ALICE_KEY, "0").await;
    assert_eq!(status, StatusCode::OK);
    let shed = r#"waycast_gateway_queue_shed_total{model="llama-3.1-8b",namespace="team-a",reason="timeout"}"#;
    assert_eq!(fixture.metric(shed).await, Some(1.0));
    let waits = r#"waycast_gateway_queue_wait_seconds_count{class="standard",model="llama-3.1-8b"}"#;
    assert!(fixture.metric(waits).await.unwrap() >= 5.0, "every request of the model counted its wait");
}

/// The queue's requests go in order as places free: one waiting request
/// is sent when one in flight ends, long before its `maxWait`.
#[tokio::test]
async fn a_waiting_request_is_sent_when_a_place_frees() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        gateway.models[0].capacity = Some(CapacityConfig { max_in_flight_per_endpoint: 1 });
        gateway.settings.sharing.burst_percent = 0;
        gateway.settings.sharing.max_wait = Duration::from_secs(10);
    })
    .await;
    let first =
        fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-delay-ms", "600")]));
    let second = async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while fixture.mock.recorder.requests().await.is_empty() {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        let (status, _, _) = status_and_body(&fixture, ALICE_KEY, "0").await;
        (status, started.elapsed())
    };
    let ((first, _, _), (status, waited)) = tokio::join!(first, second);
    assert_eq!((first, status), (StatusCode::OK, StatusCode::OK));
    assert!(waited >= Duration::from_millis(300), "it waited for the place: {waited:?}");
    assert!(waited < Duration::from_secs(3), "and went when it freed: {waited:?}");
}

/// A key's streams count until they end: the third of a key with
/// `maxConcurrent: 2` gets 429 while two are open, and goes once one ends.
#[tokio::test]
async fn a_keys_concurrency_holds_until_its_streams_end() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        gateway.keys[0].limits = Some(LimitsConfig::concurrent(2));
    })
    .await;
    let slow = [("x-mock-interval-ms", "200"), ("x-mock-chunks", "5")];
    let mut open = Vec::new();
    for _ in 0..2 {
        let response = fixture.open(fixture.request("/v1/chat/completions", Some(ALICE_KEY), STREAM, &slow)).await;
        assert_eq!(response.status(), StatusCode::OK);
        open.push(response);
    }
    let (status, headers, body) = status_and_body(&fixture, ALICE_KEY, "0").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(body["error"]["message"].as_str().unwrap().contains("limit of 2 concurrent requests"), "{body}");
    assert_eq!(headers["retry-after"], "1");
    // One stream read to its end: a place is free.
    let finished = open.pop().unwrap();
    finished.into_body().collect().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (status, _, _) = status_and_body(&fixture, ALICE_KEY, "0").await;
        if status == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "the place never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(open);
}

/// A tenant's cap covers all its keys: two team-a keys with no limits of
/// their own share the namespace's 3 requests a minute; team-b is not
/// counted against it.
#[tokio::test]
async fn a_tenants_cap_is_shared_by_all_its_keys() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        everyone_calls_llama(gateway);
        gateway.keys.push(KeyConfig::new("team-a/carol", sha256_hex(CAROL_KEY)));
        let mut team_a = TenantConfig::new("team-a");
        team_a.limits = Some(LimitsConfig::requests(3));
        gateway.settings.tenants = vec![team_a];
    })
    .await;
    let mut admitted = 0;
    for key in [ALICE_KEY, CAROL_KEY, ALICE_KEY, CAROL_KEY, ALICE_KEY, CAROL_KEY] {
        let (status, _, body) = status_and_body(&fixture, key, "0").await;
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(body["error"]["message"].as_str().unwrap().contains("namespace's limit of 3"), "{body}")
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(admitted, 3, "3 for the namespace, not 3 per key");
    assert_eq!(status_and_body(&fixture, BOB_KEY, "0").await.0, StatusCode::OK, "team-b has no cap");
    let refused = r#"waycast_gateway_rate_limit_requests_total{decision="tenant_requests",key="team-a/carol",model="llama-3.1-8b"}"#;
    assert!(fixture.metric(refused).await.unwrap_or(0.0) >= 1.0);
}

/// With `inferenceHeaders`, the upstream reads the key's namespace and
/// class in both generations of the picker's headers, whatever the client
/// sent in them (or in any other `x-llm-d-*`); a key whose class its
/// namespace may not use is left out of the config (401), its neighbours
/// served.
#[tokio::test]
async fn the_inference_headers_come_from_the_key_never_the_client() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        everyone_calls_llama(gateway);
        gateway.settings.sharing.inference_headers = true;
        // The model forwards any x-gateway-* header a client sends…
        gateway.models[0].forward_headers.push("x-gateway-*".into());
        gateway.models[0].forward_headers.push("x-llm-d-*".into());
        gateway.keys[0].class = Some("interactive".into());
        let mut team_b = TenantConfig::new("team-b");
        team_b.classes = Some(vec!["batch".into()]);
        // Team A's policy grants every class (a namespace without one gets
        // the default class only).
        gateway.settings.tenants = vec![TenantConfig::new("team-a"), team_b];
        // …and bob asks for a class his namespace may not use.
        gateway.keys[1].class = Some("interactive".into());
    })
    .await;
    let forged = [
        ("x-gateway-inference-fairness-id", "team-b"),
        ("x-gateway-inference-objective", "batch"),
        ("x-llm-d-inference-fairness-id", "team-b"),
        ("x-llm-d-inference-objective", "batch"),
        ("x-llm-d-other", "steer"),
    ];
    let (status, _, _) = fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &forged)).await;
    assert_eq!(status, StatusCode::OK);
    let received = fixture.mock.recorder.last().await.unwrap();
    let values =
        |name: &str| received.headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(values("x-gateway-inference-fairness-id"), ["team-a"]);
    assert_eq!(values("x-gateway-inference-objective"), ["interactive"]);
    assert_eq!(values("x-llm-d-inference-fairness-id"), ["team-a"], "the second generation too");
    assert_eq!(values("x-llm-d-inference-objective"), ["interactive"]);
    assert!(values("x-llm-d-other").is_empty(), "no picker header of the client's, even one the model forwards");
    assert_eq!(status_and_body(&fixture, BOB_KEY, "0").await.0, StatusCode::UNAUTHORIZED, "bob's entry is left out");
    assert_eq!(fixture.metric(r#"waycast_gateway_config_entries_dropped{kind="key"}"#).await, Some(1.0));
}
