//! A grant's members counted in a real Redis (Debian's `redis-server`) by
//! three real gateways in-process: each person's budget and concurrency
//! hold across the fleet, whichever pod their requests reach.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;
use support::redis::Redis;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::{GrantConfig, LimitsConfig, PerUserConfig, ProviderConfig};
use waycast_crds::period::Period;
use waycast_crds::spend::BudgetConfig;
use waycast_mock::tokens::TestIssuer;

const CORP: &str = "https://sso.example.com/realms/corp";
const SMALL: &str = r#"{"model":"llama3","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;

/// Three gateways sharing `redis`, trusting `issuer`; the developers
/// grant gives each member one request in flight and 100 tokens a day.
async fn fleet(redis: &Redis, issuer: &TestIssuer) -> Vec<Fixture> {
    let mut fleet = Vec::new();
    for _ in 0..3 {
        let redis = redis.config(false);
        let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
            config.settings.redis = Some(redis);
            let mut corp = ProviderConfig::new("corp", CORP, "waycast");
            corp.key_set = Some(issuer.jwks());
            config.providers = vec![corp];
            let mut developers = GrantConfig::new("team-a/developers", "corp");
            developers.groups = vec!["developers".into()];
            developers.per_user = Some(PerUserConfig {
                limits: Some(LimitsConfig {
                    requests_per_minute: None,
                    tokens_per_minute: None,
                    max_concurrent: Some(1),
                }),
                budgets: vec![BudgetConfig { period: Period::Day, tokens: Some(100), cost: None }],
            });
            config.grants = vec![developers];
        })
        .await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while fixture.metric("waycast_gateway_rate_limit_store_up").await != Some(1.0) {
            assert!(std::time::Instant::now() < deadline, "the gateway never connected to Redis");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fleet.push(fixture);
    }
    fleet
}

fn token(issuer: &TestIssuer, subject: &str) -> String {
    let now = jiff::Timestamp::now().as_second();
    issuer.token(&issuer.claims(subject, "waycast", &["developers"], now, now + 600))
}

async fn usage(fixture: &Fixture, token: &str) -> Value {
    let request = http::Request::get(fixture.url("/v1/usage"))
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn a_persons_budget_is_exact_across_three_gateways() {
    let redis = Redis::start();
    let issuer = TestIssuer::new(CORP, "corp-1");
    let fleet = fleet(&redis, &issuer).await;
    let (alice, bob) = (token(&issuer, "alice"), token(&issuer, "bob"));
    let mut served = 0;
    let mut refused_by = Vec::new();
    for round in 0..30 {
        let pod = &fleet[round % 3];
        let (status, _, body) = pod.post("/v1/chat/completions", Some(&alice), SMALL).await;
        match status {
            StatusCode::OK => served += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                let error: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(error["error"]["code"], "insufficient_quota", "{error}");
                refused_by.push(round % 3);
            }
            other => panic!("{other}"),
        }
    }
    // Refused by every pod once spent: the fleet counts one budget.
    refused_by.sort_unstable();
    refused_by.dedup();
    assert_eq!(refused_by, [0, 1, 2], "each pod refuses her once she is spent");
    let mine = &usage(&fleet[1], &alice).await["budgets"][0];
    let spent = mine["spent_tokens"].as_u64().unwrap();
    assert!(spent <= 100, "never past her budget across pods: {mine}");
    // Spent to within one request of it: counted as one budget, not a
    // budget per pod (three pods would have served three times as much).
    let each = spent / served.max(1);
    assert!(served >= 2 && spent + 2 * each > 100, "served {served}, spent {spent}");
    assert_eq!(fleet[2].post("/v1/chat/completions", Some(&bob), SMALL).await.0, StatusCode::OK, "Bob has his own");
}

#[tokio::test]
async fn a_persons_concurrency_holds_across_gateways() {
    let redis = Redis::start();
    let issuer = TestIssuer::new(CORP, "corp-1");
    let fleet = fleet(&redis, &issuer).await;
    let alice = token(&issuer, "alice");
    let slow = fleet[0].request("/v1/chat/completions", Some(&alice), SMALL, &[("x-mock-delay-ms", "1500")]);
    let in_flight = fleet[0].open(slow);
    let elsewhere = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        fleet[1].post("/v1/chat/completions", Some(&alice), SMALL).await
    };
    let (first, (status, _, body)) = tokio::join!(in_flight, elsewhere);
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("per-person limit of 1 concurrent"));
    assert_eq!(fleet[2].post("/v1/chat/completions", Some(&alice), SMALL).await.0, StatusCode::OK, "free again");
}
