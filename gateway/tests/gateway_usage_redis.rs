//! `GET /v1/usage` with budgets counted in a real Redis (Debian's
//! `redis-server`, started here on loopback): a key asking for it in a loop
//! makes a bounded number of Redis reads (counted by Redis itself, `INFO
//! commandstats`), and the admissions of every other key meanwhile are
//! counted in Redis as usual, none let through uncounted (fail-open).

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use support::redis::Redis;
use support::{Fixture, FixtureOptions};
use waycast_crds::common::LimitsConfig;
use waycast_crds::period::Period;
use waycast_crds::sharing::TenantConfig;
use waycast_crds::spend::BudgetConfig;
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY};

const CHAT: &str = r#"{"model":"llama3","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;
/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(3);
/// Clients asking for `/v1/usage` at once.
const CLIENTS: usize = 24;

fn tokens(period: Period, tokens: u64) -> BudgetConfig {
    BudgetConfig { period, tokens: Some(tokens), cost: None }
}

/// How many times Redis ran `command`, from `INFO commandstats`.
fn calls(redis: &Redis, command: &str) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

async fn usage(fixture: &Fixture, key: &str) -> (StatusCode, bytes::Bytes) {
    let request = http::Request::get(fixture.url("/v1/usage"))
        .header("authorization", format!("Bearer {key}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = fixture.send(request).await;
    (status, body)
}

#[tokio::test]
async fn a_flood_of_usage_reads_is_bounded_and_never_makes_admissions_fail_open() {
    let redis = Redis::start();
    let config = redis.config(false);
    let fixture = Fixture::start(FixtureOptions::default(), move |gateway, _| {
        gateway.settings.redis = Some(config);
        for key in &mut gateway.keys {
            key.models = None;
        }
        // Alice: budgets, no limit (what made a read per budget per request).
        gateway.keys[0].budgets = vec![tokens(Period::Day, 1_000_000), tokens(Period::Month, 10_000_000)];
        let mut team_a = TenantConfig::new("team-a");
        team_a.budgets = vec![tokens(Period::Month, 50_000_000)];
        gateway.settings.tenants = vec![team_a];
        // Bob's requests are admitted in Redis while alice floods.
        gateway.keys[1].limits = Some(LimitsConfig::requests(1_000_000));
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fixture.metric("waycast_gateway_rate_limit_store_up").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the gateway never connected to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    redis.cli(&["CONFIG", "RESETSTAT"]);

    let started = Instant::now();
    let flood = futures_util::future::join_all((0..CLIENTS).map(|_| async {
        let (mut answered, mut known) = (0_u64, 0_u64);
        while started.elapsed() < FLOOD {
            let (status, body) = usage(&fixture, ALICE_KEY).await;
            assert_eq!(status, StatusCode::OK, "{body:?}");
            let usage: Value = serde_json::from_slice(&body).unwrap();
            let budgets = usage["budgets"].as_array().unwrap();
            assert_eq!(budgets.len(), 3, "{usage}");
            answered += 1;
            known += u64::from(budgets.iter().all(|b| b["spent_tokens"].as_u64().is_some_and(|t| t > 0)));
        }
        (answered, known)
    }));
    let admissions = async {
        let mut admitted = 0;
        while started.elapsed() < FLOOD {
            let (status, headers, body) = fixture.post("/v1/chat/completions", Some(BOB_KEY), CHAT).await;
            assert_eq!(status, StatusCode::OK, "{body:?}");
            assert!(headers.contains_key("x-ratelimit-remaining-requests"), "counted in Redis: {headers:?}");
            admitted += 1;
        }
        admitted
    };
    let (answers, admitted) = tokio::join!(flood, admissions);
    let elapsed = started.elapsed();
    let answered: u64 = answers.iter().map(|(answered, _)| answered).sum();
    let known: u64 = answers.iter().map(|(_, known)| known).sum();
    let reads = calls(&redis, "hmget");
    println!(
        "{answered} usage answers ({known} with every spend known) and {admitted} admissions in {:.2} s: \
         {reads} budget reads in Redis",
        elapsed.as_secs_f64()
    );
    assert!(answered > 100, "the flood was no flood: {answered}");
    assert!(known * 10 >= answered * 9, "spends were unknown: {known} of {answered}");
    // Each of the three budgets read at most once a second (and one more
    // at each edge of the flood).
    let bound = 3 * (elapsed.as_secs() + 2);
    assert!(reads <= bound, "{reads} reads for {answered} answers: more than {bound}");
    assert!(admitted > 10, "{admitted}");
    let (_, metrics) = fixture.admin_get("/metrics").await;
    let source = |source: &str| format!("waycast_gateway_usage_spend_reads_total{{source=\"{source}\"}}");
    let from_redis = fixture.metric(&source("redis")).await.unwrap_or(0.0);
    let from_cache = fixture.metric(&source("cache")).await.unwrap_or(0.0);
    println!("spends answered: {from_redis} read from Redis, {from_cache} from the cache");
    assert!(from_redis > 0.0 && from_redis <= reads as f64, "the metric counts at most what Redis ran: {from_redis}");
    assert!(from_cache >= (answered * 3) as f64 * 0.9, "{from_cache} of {answered} answers' spends from the cache");
    let failures: Vec<&str> =
        metrics.lines().filter(|line| line.starts_with("waycast_gateway_rate_limit_store_errors_total")).collect();
    assert!(failures.is_empty(), "admissions passed over a Redis that did not answer: {failures:?}");
}

/// `/v1/usage` is a request like any other under the tenant's limits: asked
/// in a loop, it spends the tenant's rate (and then is refused), not the
/// platform's.
#[tokio::test]
async fn usage_reads_count_under_the_tenants_request_limit() {
    let redis = Redis::start();
    let config = redis.config(true);
    let fixture = Fixture::start(FixtureOptions::default(), move |gateway, _| {
        gateway.settings.redis = Some(config);
        for key in &mut gateway.keys {
            key.models = None;
        }
        gateway.keys[0].budgets = vec![tokens(Period::Day, 1_000_000)];
        let mut team_a = TenantConfig::new("team-a");
        team_a.limits = Some(LimitsConfig::requests(5));
        gateway.settings.tenants = vec![team_a];
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fixture.metric("waycast_gateway_rate_limit_store_up").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the gateway never connected to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for asked in 0..5 {
        let (status, body) = usage(&fixture, ALICE_KEY).await;
        assert_eq!(status, StatusCode::OK, "read {asked}: {body:?}");
    }
    let (status, body) = usage(&fixture, ALICE_KEY).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body:?}");
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "the reads spent the tenant's rate");
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(BOB_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK, "another tenant is not touched");
}
