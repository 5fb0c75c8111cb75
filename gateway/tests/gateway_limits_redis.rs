//! Rate limits counted in a real Redis (Debian's `redis-server`, started
//! here on loopback) by several real gateways in-process: exact across
//! gateways, and what happens when Redis dies, stalls and comes back.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use support::redis::{ACL_PASSWORD, ACL_USER, Redis};
use support::{Fixture, FixtureOptions};
use waycast_crds::config::{ClientTlsConfig, LimitsConfig};
use waycast_mock::fixtures::{ALICE_KEY, temp_dir};
use waycast_mock::pki::{Authority, Usage};

const CHAT: &str = r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#;

async fn gateway(redis: &Redis, fail_closed: bool, requests_per_minute: u64) -> Fixture {
    let config = redis.config(fail_closed);
    Fixture::start(FixtureOptions::default(), move |gateway, _| {
        gateway.settings.redis = Some(config);
        gateway.keys[0].limits = Some(LimitsConfig::requests(requests_per_minute));
    })
    .await
}

/// One chat request, and how long it took.
async fn timed(fixture: &Fixture) -> (StatusCode, http::HeaderMap, bytes::Bytes, Duration) {
    let started = Instant::now();
    let (status, headers, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    (status, headers, body, started.elapsed())
}

/// Waits until the gateway's Redis connection is up (it connects in the background).
async fn connected(fixture: &Fixture) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fixture.metric("waycast_gateway_rate_limit_store_up").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the gateway never connected to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the gateway has tried to connect to Redis and been refused
/// (at least twice: not a first attempt still in flight).
async fn refused(fixture: &Fixture) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fixture.metric("waycast_gateway_rate_limit_store_failed_connects").await.unwrap_or(0.0) < 2.0 {
        assert!(Instant::now() < deadline, "the gateway never tried to connect to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn three_gateways_sharing_redis_admit_exactly_the_limit() {
    let redis = Redis::start();
    let gateways =
        [gateway(&redis, false, 60).await, gateway(&redis, false, 60).await, gateway(&redis, false, 60).await];
    for fixture in &gateways {
        connected(fixture).await;
    }
    let started = Instant::now();
    let mut admitted = [0; 3];
    let mut last_refusal = None;
    for round in 0..50 {
        for (index, fixture) in gateways.iter().enumerate() {
            let (status, headers, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
            match status {
                StatusCode::OK => admitted[index] += 1,
                StatusCode::TOO_MANY_REQUESTS => last_refusal = Some((headers, body)),
                other => panic!("round {round}: {other} {}", String::from_utf8_lossy(&body)),
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total: u32 = admitted.iter().sum();
    println!("60/min over 3 gateways counting in Redis: {admitted:?} = {total} of 150 in {elapsed:.2} s");
    // The bucket holds 60; it refills one a second while the test runs.
    let refilled = elapsed.floor() as u32;
    assert!((60..=60 + refilled + 1).contains(&total), "{total} admitted in {elapsed:.2} s");
    assert!(admitted.iter().all(|a| *a > 0), "every gateway admitted some: {admitted:?}");
    let (headers, body) = last_refusal.expect("refusals after the limit");
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert_eq!(headers["x-ratelimit-limit-requests"], "60");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert!(headers.contains_key("retry-after"));
}

#[tokio::test]
async fn redis_lost_fails_open_or_closed_never_hangs_and_counting_resumes() {
    let mut redis = Redis::start();
    let open = gateway(&redis, false, 2).await;
    let closed = gateway(&redis, true, 1_000_000).await;
    connected(&open).await;
    connected(&closed).await;
    assert_eq!(timed(&open).await.0, StatusCode::OK);
    assert_eq!(timed(&open).await.0, StatusCode::OK);
    assert_eq!(timed(&open).await.0, StatusCode::TOO_MANY_REQUESTS, "2/min counted in Redis");

    // Stalled (SIGSTOP): connected but silent; each request waits at most the 100 ms timeout.
    redis.signal("-STOP");
    let (status, _, _, took) = timed(&open).await;
    assert_eq!(status, StatusCode::OK, "fails open");
    assert!(took < Duration::from_secs(1), "waited {took:?}");
    let (status, headers, body, took) = timed(&closed).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "fails closed");
    assert!(took < Duration::from_secs(1), "waited {took:?}");
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"], "rate_limit_unavailable");
    assert_eq!(headers["retry-after"], "1");
    redis.signal("-CONT");

    // Killed: refused or admitted at once, no waiting on a dead server.
    redis.kill();
    for _ in 0..5 {
        let (status, _, _, took) = timed(&open).await;
        assert_eq!(status, StatusCode::OK);
        assert!(took < Duration::from_secs(1), "waited {took:?}");
        let (status, _, _, took) = timed(&closed).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(took < Duration::from_secs(1), "waited {took:?}");
    }
    let errors = open.metric("waycast_gateway_rate_limit_store_errors_total{reason=\"timeout\"}").await.unwrap_or(0.0)
        + open.metric("waycast_gateway_rate_limit_store_errors_total{reason=\"unreachable\"}").await.unwrap_or(0.0);
    assert!(errors >= 6.0, "store errors counted: {errors}");
    assert_eq!(open.metric("waycast_gateway_rate_limit_store_up").await, Some(0.0));

    // Back (empty: a restarted Redis without persistence forgot the counts):
    // counting resumes once the gateways have reconnected.
    redis.restart();
    connected(&open).await;
    connected(&closed).await;
    assert_eq!(timed(&closed).await.0, StatusCode::OK);
    let statuses: Vec<StatusCode> = {
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(timed(&open).await.0);
        }
        seen
    };
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS], "counting again");
}

/// Token limits in Redis reserve at admission (one script) and settle at
/// the end (another): parallel requests on two gateways sharing a
/// 1,000-tokens-per-minute key are admitted only as far as their
/// reservations fit, and what they used then shows in what is left.
#[tokio::test]
async fn token_reservations_in_redis_hold_across_gateways() {
    let redis = Redis::start();
    let config = redis.config(false);
    let start = || {
        let config = config.clone();
        Fixture::start(FixtureOptions::default(), move |gateway, _| {
            gateway.settings.redis = Some(config);
            gateway.keys[0].limits = Some(LimitsConfig::tokens(1000));
        })
    };
    let (first, second) = (start().await, start().await);
    connected(&first).await;
    connected(&second).await;
    let body = r#"{"model":"llama3","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let reservation = body.len().div_ceil(4) + 100;
    // Each answers after 300 ms: all twenty are in flight at once.
    async fn send(fixture: &Fixture, body: &str) -> (StatusCode, http::HeaderMap, bytes::Bytes) {
        let headers = [("x-mock-chunks", "10"), ("x-mock-delay-ms", "300")];
        fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &headers)).await
    }
    let requests = (0..10).map(|_| send(&first, body)).chain((0..10).map(|_| send(&second, body)));
    let statuses: Vec<StatusCode> =
        futures_util::future::join_all(requests).await.into_iter().map(|(status, _, _)| status).collect();
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(admitted, 1000 / reservation, "as many as the reservations fit: {statuses:?}");
    // Each used far less than it reserved (10 completion tokens of 100):
    // the rest was given back, so a new request fits again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, headers, _) = send(&first, body).await;
        if status == StatusCode::OK {
            let left: u64 = headers["x-ratelimit-remaining-tokens"].to_str().unwrap().parse().unwrap();
            assert!(left < 1000, "{left}");
            break;
        }
        assert!(Instant::now() < deadline, "reservations were never settled: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An ACL user (Redis 6+) authenticates with `AUTH <user> <password>`; a
/// wrong user never connects, and the failure mode applies.
#[tokio::test]
async fn an_acl_user_authenticates_and_a_wrong_one_does_not() {
    let redis = Redis::start();
    let as_user = |username: &str| {
        let mut config = redis.config(true);
        config.username = Some(username.into());
        config.password = Some(ACL_PASSWORD.into());
        Fixture::start(FixtureOptions::default(), move |gateway, _| {
            gateway.settings.redis = Some(config);
            gateway.keys[0].limits = Some(LimitsConfig::requests(1));
        })
    };
    let limiter = as_user(ACL_USER).await;
    connected(&limiter).await;
    assert_eq!(timed(&limiter).await.0, StatusCode::OK);
    assert_eq!(timed(&limiter).await.0, StatusCode::TOO_MANY_REQUESTS, "counted in Redis as that user");
    let stranger = as_user("stranger").await;
    refused(&stranger).await;
    assert_eq!(stranger.metric("waycast_gateway_rate_limit_store_up").await, Some(0.0));
    assert_eq!(timed(&stranger).await.0, StatusCode::SERVICE_UNAVAILABLE, "fails closed");
}

/// `rediss://`: a TLS-only Redis that wants client certificates counts for
/// a gateway that trusts its CA and presents a certificate it signed; a
/// gateway that trusts another CA, or has no client certificate, never
/// connects, and the failure mode applies.
#[tokio::test]
async fn tls_to_redis_with_a_private_ca_and_a_client_certificate() {
    let dir = temp_dir("redis-tls");
    let authority = Authority::generate(&dir, "redis-ca").unwrap();
    let redis = Redis::start_tls(&authority, &dir);
    let client = authority.issue(&dir, "gateway", "gateway", &[], &[], Usage::Client).unwrap();
    let trusted = waycast_mock::pki::client_tls(&authority, &client).unwrap();
    let with_tls = |tls: ClientTlsConfig| {
        let mut config = redis.config(true);
        config.tls = Some(tls);
        Fixture::start(FixtureOptions::default(), move |gateway, _| {
            gateway.settings.redis = Some(config);
            gateway.keys[0].limits = Some(LimitsConfig::requests(1));
        })
    };

    let gateway = with_tls(trusted.clone()).await;
    connected(&gateway).await;
    assert_eq!(timed(&gateway).await.0, StatusCode::OK);
    assert_eq!(timed(&gateway).await.0, StatusCode::TOO_MANY_REQUESTS, "counted in Redis over TLS");

    let other_dir = temp_dir("redis-tls-other");
    let other = Authority::generate(&other_dir, "other-ca").unwrap();
    let wrong_ca = with_tls(ClientTlsConfig {
        ca_pem: Some(std::fs::read_to_string(&other.files.cert).unwrap()),
        ..trusted.clone()
    })
    .await;
    let no_client_cert =
        with_tls(ClientTlsConfig { client_cert_pem: None, client_key_pem: None, ..trusted.clone() }).await;
    let wrong_name = with_tls(ClientTlsConfig { server_name: Some("redis.elsewhere".into()), ..trusted }).await;
    for (what, fixture) in
        [("another CA", &wrong_ca), ("no client certificate", &no_client_cert), ("another name", &wrong_name)]
    {
        refused(fixture).await;
        assert_eq!(fixture.metric("waycast_gateway_rate_limit_store_up").await, Some(0.0), "{what}: never connected");
        assert_eq!(timed(fixture).await.0, StatusCode::SERVICE_UNAVAILABLE, "{what}: fails closed");
    }
}

/// `maxConcurrent` in Redis holds exactly across gateways: a key of 3 has
/// at most 3 requests in flight over an in-process gateway and a gateway
/// process; when the process is killed (SIGKILL, nothing released) with
/// its requests open, their places come back once its liveness key
/// expires (`ALIVE_TTL`, 10 s), not before and not never.
#[tokio::test]
async fn concurrency_in_redis_holds_across_gateways_and_a_killed_pods_places_come_back() {
    let redis = Redis::start();
    let config = redis.config(false);
    let in_process = {
        let config = config.clone();
        Fixture::start(FixtureOptions::default(), move |gateway, _| {
            gateway.settings.redis = Some(config);
            gateway.keys[0].limits = Some(LimitsConfig::concurrent(3));
        })
        .await
    };
    connected(&in_process).await;
    let mut process_config = waycast_mock::fixtures::default_config(&in_process.mock.base_url());
    process_config.settings.redis = Some(config);
    process_config.keys[0].limits = Some(LimitsConfig::concurrent(3));
    let mut process = support::GatewayProcess::start(&process_config, &[]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while process.metric("waycast_gateway_rate_limit_store_up").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the process never connected to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let long = [("x-mock-delay-ms", "60000")];
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    // Two held by the process (answers after a minute), then one here.
    let mut held_by_process = Vec::new();
    for _ in 0..2 {
        let request = in_process.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &long);
        let (mut parts, body) = request.into_parts();
        parts.uri = process.url("/v1/chat/completions").parse().unwrap();
        held_by_process.push(tokio::spawn(client.request(http::Request::from_parts(parts, body))));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while in_process.mock.recorder.requests().await.len() < 2 {
        assert!(Instant::now() < deadline, "the process's requests never reached the mock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let here = in_process.send(in_process.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &long));
    let checks = async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while in_process.mock.recorder.requests().await.len() < 3 {
            assert!(Instant::now() < deadline, "the third request never reached the mock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The fourth, on either gateway: 429.
        assert_eq!(timed(&in_process).await.0, StatusCode::TOO_MANY_REQUESTS, "3 in flight across the fleet");
        let (status, _, body) = {
            let request = in_process.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[]);
            let (mut parts, body) = request.into_parts();
            parts.uri = process.url("/v1/chat/completions").parse().unwrap();
            let response = client.request(http::Request::from_parts(parts, body)).await.unwrap();
            let status = response.status();
            (status, (), http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes())
        };
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&body));
        // The process dies with its two requests open.
        process.child.start_kill().unwrap();
        let _ = process.child.wait().await;
        let killed = Instant::now();
        assert_eq!(timed(&in_process).await.0, StatusCode::TOO_MANY_REQUESTS, "its places still count at first");
        let deadline = killed + Duration::from_secs(20);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let (status, _, body, _) = timed(&in_process).await;
            if status == StatusCode::OK {
                break;
            }
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&body));
            assert!(Instant::now() < deadline, "the killed gateway's places never came back");
        }
        let back = killed.elapsed();
        println!("a killed gateway's places came back after {back:?}");
        assert!(back >= Duration::from_secs(5), "not before its liveness key could expire: {back:?}");
    };
    tokio::select! {
        _ = here => panic!("the long request ended early"),
        () = checks => {}
    }
    for held in held_by_process {
        held.abort();
    }
}
