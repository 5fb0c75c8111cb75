//! A backend served by a Service's endpoints (an endpoints document, here a
//! file): requests spread by load over the pods, follow the document as it
//! changes, go elsewhere when a pod refuses connections or answers a
//! retried status (429, 503, or what `retryOnStatus` names) before any byte
//! reached the client, and stick to one pod per prompt
//! prefix under `PrefixAffinity`.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::StatusCode;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::{GatewayConfig, LoadBalancingPolicy};
use waycast_mock::fixtures::{ALICE_KEY, free_port};
use waycast_mock::upstream::{self as mock_upstream, MockOptions, MockUpstream};

const SERVICE: &str = "models/vllm:8000";
const MODEL: &str = "mistral-7b";

/// `mistral-7b` served by the endpoints of [`SERVICE`], under `policy`; its
/// URL (the fixture's own mock) is only the fallback.
fn on_endpoints(config: &mut GatewayConfig, policy: LoadBalancingPolicy) {
    let model = config.models.iter_mut().find(|m| m.name == MODEL).unwrap();
    model.backends[0].endpoints = Some(SERVICE.into());
    model.load_balancing.policy = policy;
}

async fn pods(count: usize) -> Vec<MockUpstream> {
    let mut pods = Vec::new();
    for _ in 0..count {
        pods.push(mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap());
    }
    pods
}

/// Writes an endpoints document listing `addresses` and waits until the
/// gateway knows exactly that many endpoints.
async fn set_endpoints(fixture: &Fixture, addresses: &[SocketAddr]) {
    let document = serde_json::json!({
        "apiVersion": "waycast.dev/endpoints-v1",
        "services": {SERVICE: addresses.iter().map(ToString::to_string).collect::<Vec<_>>()},
    });
    fixture.write_endpoints(document.to_string().as_bytes());
    let deadline = Instant::now() + Duration::from_secs(5);
    while fixture.metric("waycast_gateway_endpoints").await != Some(addresses.len() as f64) {
        assert!(Instant::now() < deadline, "the gateway did not take the endpoints document");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn served(pod: &MockUpstream) -> usize {
    pod.recorder.requests().await.len()
}

/// `count` requests at once, each held `delay_ms` by the pod that serves it.
async fn concurrent(fixture: &Fixture, count: usize, delay_ms: u64, body: &str) -> Vec<StatusCode> {
    let requests = (0..count).map(|_| {
        let request = fixture.request(
            "/v1/chat/completions",
            Some(ALICE_KEY),
            body,
            &[("x-mock-delay-ms", &delay_ms.to_string())],
        );
        let open = fixture.open(request);
        async move { open.await.status() }
    });
    futures_util::future::join_all(requests).await
}

#[tokio::test]
async fn requests_spread_over_the_endpoints_and_follow_the_document() {
    let options = FixtureOptions { endpoints_file: true, ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |config, _| on_endpoints(config, LoadBalancingPolicy::LeastRequest)).await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#);

    // No endpoints known yet: the URL serves.
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served(&fixture.mock).await, 1);

    let pods = pods(3).await;
    set_endpoints(&fixture, &pods.iter().map(|p| p.addr).collect::<Vec<_>>()).await;
    let statuses = concurrent(&fixture, 90, 300, &body).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    let counts = [served(&pods[0]).await, served(&pods[1]).await, served(&pods[2]).await];
    println!("90 concurrent requests over 3 endpoints: {counts:?}");
    // Least-request over in-flight counts: each pod holds about a third.
    assert!(counts.iter().all(|c| (20..=40).contains(c)), "{counts:?}");
    assert_eq!(served(&fixture.mock).await, 1, "the URL is not used while endpoints are known");
    // Each pod's answers are timed in its own series (300 ms of mock delay).
    let timed = format!(
        r#"waycast_gateway_endpoint_response_seconds_bucket{{endpoint="{}",service="{SERVICE}",le="0.25"}}"#,
        pods[0].addr
    );
    let answered = format!(
        r#"waycast_gateway_endpoint_response_seconds_count{{endpoint="{}",service="{SERVICE}"}}"#,
        pods[0].addr
    );
    assert_eq!(fixture.metric(&timed).await, Some(0.0), "none answered within 0.25 s");
    assert_eq!(fixture.metric(&answered).await, Some(counts[0] as f64));

    // A pod leaves the document: it gets nothing more.
    set_endpoints(&fixture, &[pods[1].addr, pods[2].addr]).await;
    let before = served(&pods[0]).await;
    concurrent(&fixture, 20, 0, &body).await;
    assert_eq!(served(&pods[0]).await, before, "a removed endpoint was still used");

    // A bad document is refused and the last good one keeps serving.
    fixture.write_endpoints(br#"{"apiVersion":"waycast.dev/endpoints-v1","services":{"not a key":[]}}"#);
    let deadline = Instant::now() + Duration::from_secs(5);
    while fixture.metric("waycast_gateway_endpoints_update_errors_total").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the bad document was not counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let statuses = concurrent(&fixture, 10, 0, &body).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    assert_eq!(fixture.metric("waycast_gateway_endpoints").await, Some(2.0));
}

#[tokio::test]
async fn a_dead_endpoint_is_retried_elsewhere_then_ejected() {
    let options = FixtureOptions { endpoints_file: true, ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |config, _| on_endpoints(config, LoadBalancingPolicy::RoundRobin)).await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[]}}"#);
    let live = pods(1).await;
    // Nothing listens there: every connect is refused.
    let dead = SocketAddr::from(([127, 0, 0, 1], free_port([127, 0, 0, 1].into()).unwrap()));
    set_endpoints(&fixture, &[dead, live[0].addr]).await;
    for _ in 0..20 {
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        assert_eq!(status, StatusCode::OK, "a refused connect is retried on the live endpoint");
    }
    let retries = format!(r#"waycast_gateway_upstream_retries_total{{model="{MODEL}",reason="connect_or_reset"}}"#);
    let ejections = format!(r#"waycast_gateway_endpoint_ejections_total{{model="{MODEL}"}}"#);
    // Round-robin sends every other request to the dead one until its fifth
    // failure in a row ejects it; then no more retries.
    assert_eq!(fixture.metric(&retries).await, Some(5.0));
    assert_eq!(fixture.metric(&ejections).await, Some(1.0));
    assert_eq!(served(&live[0]).await, 20);

    // Recovery: the pod comes back at that address; once its ejection
    // (5 s the first time) is over it takes its turn again.
    let revived = tokio::net::TcpListener::bind(dead).await.unwrap();
    let recorder = std::sync::Arc::new(waycast_mock::upstream::Recorder::default());
    tokio::spawn(mock_upstream::serve(revived, std::sync::Arc::new(MockOptions::default()), recorder.clone()));
    tokio::time::sleep(Duration::from_millis(5_200)).await;
    for _ in 0..10 {
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(recorder.requests().await.len(), 5, "the recovered endpoint is back in the rotation");
    assert_eq!(fixture.metric(&retries).await, Some(5.0), "no retry once it answers");
}

/// A pod answering a status in `retryOnStatus` (default 429 and 503)
/// before any byte: the request goes to the other pod; a 500 is the answer
/// unless the list names it; with no other pod left, its answer is the
/// answer.
#[tokio::test]
async fn a_retried_status_before_any_byte_goes_to_another_endpoint() {
    let options = FixtureOptions { endpoints_file: true, ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |config, _| on_endpoints(config, LoadBalancingPolicy::RoundRobin)).await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[]}}"#);
    let live = pods(1).await;
    let forced = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(0));
    let failing_options = MockOptions { forced_status: forced.clone(), ..MockOptions::default() };
    let failing = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), failing_options).await.unwrap();
    set_endpoints(&fixture, &[failing.addr, live[0].addr]).await;
    let statuses = |count: usize| {
        let (fixture, body) = (&fixture, &body);
        async move {
            let mut statuses = Vec::new();
            for _ in 0..count {
                statuses.push(fixture.post("/v1/chat/completions", Some(ALICE_KEY), body).await.0.as_u16());
            }
            statuses
        }
    };
    // Round robin: every other request meets the failing pod first.
    for status in [503, 429] {
        forced.store(status, Ordering::Relaxed);
        assert_eq!(statuses(4).await, [200; 4], "{status}");
        let retries = format!(r#"waycast_gateway_upstream_retries_total{{model="{MODEL}",reason="status_{status}"}}"#);
        assert_eq!(fixture.metric(&retries).await, Some(2.0), "{status}");
    }
    forced.store(500, Ordering::Relaxed);
    let mut answered = statuses(4).await;
    answered.sort_unstable();
    assert_eq!(answered, [200, 200, 500, 500], "a 500 is not retried by default");

    // Named in retryOnStatus, a 500 is retried too.
    let mut config = waycast_mock::fixtures::default_config(&fixture.mock.base_url());
    on_endpoints(&mut config, LoadBalancingPolicy::RoundRobin);
    config.models.iter_mut().find(|m| m.name == MODEL).unwrap().load_balancing.retry_on_status = vec![500, 503];
    fixture.apply_config(&config).await;
    assert_eq!(statuses(4).await, [200; 4]);

    // With only the failing pod left, its answer is the answer.
    forced.store(503, Ordering::Relaxed);
    set_endpoints(&fixture, &[failing.addr]).await;
    assert_eq!(statuses(1).await, [503]);
}

#[tokio::test]
async fn prefix_affinity_keeps_a_prompt_on_one_pod_and_spreads_different_ones() {
    let options = FixtureOptions { endpoints_file: true, ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |config, _| on_endpoints(config, LoadBalancingPolicy::PrefixAffinity)).await;
    let pods = pods(3).await;
    set_endpoints(&fixture, &pods.iter().map(|p| p.addr).collect::<Vec<_>>()).await;
    let system = "You are a careful assistant for the billing team. ".repeat(8);
    for question in 0..30 {
        let body = format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {question}"}}]}}"#
        );
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        assert_eq!(status, StatusCode::OK);
    }
    let counts = [served(&pods[0]).await, served(&pods[1]).await, served(&pods[2]).await];
    assert!(counts.contains(&30), "one shared prefix, one pod: {counts:?}");
    for prompt in 0..60 {
        let body = format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"prompt number {prompt} {system}"}}]}}"#
        );
        fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
    }
    let after = [served(&pods[0]).await, served(&pods[1]).await, served(&pods[2]).await];
    let new: Vec<usize> = after.iter().zip(counts).map(|(a, b)| a - b).collect();
    assert!(new.iter().all(|n| *n >= 5), "different prefixes spread over the pods: {new:?}");
}

#[tokio::test]
async fn a_lower_priority_backend_serves_when_every_pod_is_down_or_overloaded() {
    let options = FixtureOptions { endpoints_file: true, ..FixtureOptions::default() };
    // Tier 0: the Service's pods; tier 1: the fixture's own mock, standing in
    // for an external provider.
    let fixture = Fixture::start(options, |config, base| {
        on_endpoints(config, LoadBalancingPolicy::LeastRequest);
        let model = config.models.iter_mut().find(|m| m.name == MODEL).unwrap();
        let mut provider = model.backends[0].clone();
        (provider.url, provider.endpoints, provider.priority) = (base.to_owned(), None, 1);
        // The in-cluster backend's own URL leads nowhere either.
        let nowhere = free_port([127, 0, 0, 1].into()).unwrap();
        model.backends[0].url = format!("http://127.0.0.1:{nowhere}/v1");
        model.backends.push(provider);
    })
    .await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[]}}"#);
    let dead = SocketAddr::from(([127, 0, 0, 1], free_port([127, 0, 0, 1].into()).unwrap()));
    set_endpoints(&fixture, &[dead]).await;
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
    assert_eq!(status, StatusCode::OK, "no pod reachable: the next tier serves");
    assert_eq!(served(&fixture.mock).await, 1);
    let overloaded = || async {
        let options = MockOptions { forced_status: std::sync::Arc::new(503.into()), ..MockOptions::default() };
        mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), options).await.unwrap()
    };
    let (first, second) = (overloaded().await, overloaded().await);
    set_endpoints(&fixture, &[first.addr, second.addr]).await;
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
    assert_eq!(status, StatusCode::OK, "every pod overloaded: the next tier serves");
    assert_eq!(served(&fixture.mock).await, 2);
}

/// An audio upload streams its file to the first endpoint picked: once
/// the file went out it cannot go to another, so a retried status from
/// that pod (503 here) is the client's answer, never a retry that could
/// only fail: neither the other pod nor the failover tier behind them is
/// asked.
#[tokio::test]
async fn a_streamed_upload_is_answered_by_the_pod_it_went_to() {
    let options = FixtureOptions { endpoints_file: true, ..FixtureOptions::default() };
    let failover = pods(1).await;
    let failover_url = failover[0].base_url();
    let fixture = Fixture::start(options, |config, _| {
        on_endpoints(config, LoadBalancingPolicy::RoundRobin);
        config.settings.max_request_body_bytes = 8 << 20;
        let model = config.models.iter_mut().find(|m| m.name == MODEL).unwrap();
        let mut tier = model.backends[0].clone();
        (tier.url, tier.endpoints, tier.priority) = (failover_url, None, 1);
        model.backends.push(tier);
    })
    .await;
    let live = pods(1).await;
    let failing_options = MockOptions { forced_status: std::sync::Arc::new(503.into()), ..MockOptions::default() };
    let failing = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), failing_options).await.unwrap();
    set_endpoints(&fixture, &[failing.addr, live[0].addr]).await;
    let mut form = format!("--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{MODEL}\r\n").into_bytes();
    form.extend_from_slice(b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n");
    form.extend(std::iter::repeat_n(b'a', 4 << 20));
    form.extend_from_slice(b"\r\n--b--\r\n");
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let request = http::Request::post(fixture.url("/v1/audio/transcriptions"))
            .header("authorization", format!("Bearer {ALICE_KEY}"))
            .header("content-type", "multipart/form-data; boundary=b")
            .body(http_body_util::Full::new(bytes::Bytes::from(form.clone())))
            .unwrap();
        statuses.push(fixture.send(request).await.0.as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 503], "each answered by the one pod its file went to");
    assert_eq!((served(&failing).await, served(&live[0]).await, served(&failover[0]).await), (1, 1, 0));
}
