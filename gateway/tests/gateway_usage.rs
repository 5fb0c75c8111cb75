//! Usage through a real gateway in-process: what each key used this month
//! and what each budget spent, in the report the operator collects
//! (`GET /usage` on the admin port) and in `GET /v1/usage` for the key
//! itself; and the fleet's spend handed back (the usage baseline, here a
//! file) counted by the budgets, so a new process starts from what the
//! fleet spent, not from nothing.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use support::{Fixture, FixtureOptions};
use waycast_crds::money::PricingConfig;
use waycast_crds::period::Period;
use waycast_crds::sharing::TenantConfig;
use waycast_crds::spend::BudgetConfig;
use waycast_crds::usage::UsageReport;
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY};

const CHAT: &str = r#"{"model":"llama3","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;
const CHUNKS: (&str, &str) = ("x-mock-chunks", "20");

async fn chat(fixture: &Fixture, key: &str, body: &str) -> (StatusCode, Value) {
    let (status, _, body) = fixture.send(fixture.request("/v1/chat/completions", Some(key), body, &[CHUNKS])).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn report(fixture: &Fixture) -> UsageReport {
    let (status, body) = fixture.admin_get("/usage").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn usage_of(fixture: &Fixture, key: &str) -> Value {
    let request = http::Request::get(fixture.url("/v1/usage"))
        .header("authorization", format!("Bearer {key}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

fn today() -> String {
    Period::Day.window(jiff::Timestamp::now(), &jiff::tz::TimeZone::UTC).key
}

fn tokens(period: Period, tokens: u64) -> BudgetConfig {
    BudgetConfig { period, tokens: Some(tokens), cost: None }
}

#[tokio::test]
async fn each_keys_month_and_each_budgets_period_are_reported_and_a_key_sees_only_its_own() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        // 1 a prompt token, 2 an output token, in millionths.
        gateway.models[0].pricing = Some(PricingConfig {
            currency: "USD".into(),
            input_per_million_tokens: "1".into(),
            output_per_million_tokens: "2".into(),
            cached_input_per_million_tokens: None,
        });
        // Another currency than the budgets': its cost is not a USD cost.
        gateway.models[1].pricing = Some(PricingConfig {
            currency: "EUR".into(),
            input_per_million_tokens: "1".into(),
            output_per_million_tokens: "2".into(),
            cached_input_per_million_tokens: None,
        });
        gateway.keys[0].budgets = vec![tokens(Period::Day, 10_000)];
        let mut team_a = TenantConfig::new("team-a");
        team_a.budgets = vec![BudgetConfig { period: Period::Month, tokens: None, cost: Some("3.50".into()) }];
        gateway.settings.tenants = vec![team_a];
    })
    .await;
    let mut used = (0, 0);
    for _ in 0..3 {
        let (status, body) = chat(&fixture, ALICE_KEY, CHAT).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        used.0 += body["usage"]["prompt_tokens"].as_u64().unwrap();
        used.1 += body["usage"]["completion_tokens"].as_u64().unwrap();
    }
    let (status, _) = chat(&fixture, BOB_KEY, &CHAT.replace("llama3", "mistral-7b")).await;
    assert_eq!(status, StatusCode::OK);
    let cost = used.0 * 1_000 + used.1 * 2_000;

    // The operator's report: every key's month, every budget's period.
    let first = report(&fixture).await;
    let alice = first.keys["team-a/alice"];
    assert_eq!((alice.requests, alice.input_tokens, alice.output_tokens), (3, used.0, used.1));
    assert_eq!(alice.cost_nanos, cost);
    assert_eq!(first.keys["team-b/bob"].requests, 1);
    assert_eq!(first.keys["team-b/bob"].cost_nanos, 0, "a EUR cost is not counted as USD");
    let spend = |scope: &str| first.budgets.iter().find(|b| b.scope == scope).unwrap().clone();
    let day = spend("key:team-a/alice");
    assert_eq!((day.period, day.window.as_str(), day.tokens), (Period::Day, today().as_str(), used.0 + used.1));
    assert_eq!(spend("tenant:team-a").cost_nanos, cost);
    assert_eq!(first.month, Period::Month.window(jiff::Timestamp::now(), &jiff::tz::TimeZone::UTC).key);
    assert_eq!(report(&fixture).await.sequence, first.sequence, "nothing new: the same number");

    // The key's own view: its budgets and its namespace's, nothing else.
    let mine = usage_of(&fixture, ALICE_KEY).await;
    assert_eq!(mine["key"], "team-a/alice");
    let budgets = mine["budgets"].as_array().unwrap();
    assert_eq!(budgets.len(), 2, "{mine}");
    assert_eq!(budgets[0]["owner"], "key");
    assert_eq!(budgets[0]["spent_tokens"], used.0 + used.1);
    assert_eq!(budgets[0]["remaining_tokens"], 10_000 - (used.0 + used.1));
    assert_eq!(budgets[1]["owner"], "namespace");
    assert_eq!(budgets[1]["cost"], "3.50");
    let spent = waycast_crds::money::Money(cost);
    assert_eq!(budgets[1]["spent_cost"], spent.to_string());
    let bob = usage_of(&fixture, BOB_KEY).await;
    assert_eq!(bob["budgets"], json!([]), "bob has no budgets and sees no one else's: {bob}");
    assert!(!bob.to_string().contains("alice"));
    assert_eq!(chat(&fixture, ALICE_KEY, CHAT).await.0, StatusCode::OK);
    // Something new: the next number (at most one a second).
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let next = report(&fixture).await;
        if next.sequence != first.sequence {
            assert_eq!(next.sequence, first.sequence + 1);
            assert_eq!(next.keys["team-a/alice"].requests, 4);
            break;
        }
        assert!(Instant::now() < deadline, "a report with something new kept the old number");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process that starts (a restart, a rollout, a scale-up) counts what
/// the fleet spent before it — the operator hands it back — and spends at
/// most its share of what was left; a process whose own report is in the
/// fleet's total does not count it twice; a baseline that does not parse
/// leaves the last one in force.
#[tokio::test]
async fn a_process_counts_the_fleets_spend_and_keeps_to_its_share_of_what_was_left() {
    let options = FixtureOptions { usage_file: true, ..FixtureOptions::default() };
    let fixture =
        Fixture::start(options, |gateway, _| gateway.keys[0].budgets = vec![tokens(Period::Day, 1_000)]).await;
    // Other processes, gone or alive, spent 900 of alice's 1,000 today.
    let baseline = |tokens: u64, reports: Value| {
        json!({"budgets": [{"scope": "key:team-a/alice", "period": "Day", "window": today(),
                            "tokens": tokens, "costNanos": 0}], "reports": reports})
    };
    fixture.write_usage(baseline(900, json!({})).to_string().as_bytes());
    let spent = |usage: &Value| usage["budgets"][0]["spent_tokens"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while spent(&usage_of(&fixture, ALICE_KEY).await) < 900 {
        assert!(Instant::now() < deadline, "the baseline was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 100 left: as many requests as their worst cases fit (each reserves
    // about 40), then insufficient_quota.
    let mut own = 0;
    let refusal = loop {
        let (status, body) = chat(&fixture, ALICE_KEY, CHAT).await;
        if status != StatusCode::OK {
            break (status, body);
        }
        own += body["usage"]["total_tokens"].as_u64().unwrap();
        assert!(own <= 100, "spent {own} of the 100 the fleet left");
    };
    assert_eq!(refusal.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refusal.1["error"]["code"], "insufficient_quota");
    assert!(own > 0, "what was left was spendable");
    assert_eq!(spent(&usage_of(&fixture, ALICE_KEY).await), 900 + own);

    // The operator collects this process's report and adds it to the
    // total: counted once, not twice.
    let collected = report(&fixture).await;
    let mine = collected.budgets.iter().find(|b| b.scope == "key:team-a/alice").unwrap().tokens;
    assert_eq!(mine, own);
    // (Others spent 10 more meanwhile: the change shows it was applied.)
    let reports = json!({ collected.instance.clone(): collected.sequence });
    fixture.write_usage(baseline(910 + mine, reports).to_string().as_bytes());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now_spent = spent(&usage_of(&fixture, ALICE_KEY).await);
        if now_spent != 900 + own {
            assert_eq!(now_spent, 910 + own, "its own spend counted once, not twice");
            break;
        }
        assert!(Instant::now() < deadline, "the new baseline was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A baseline that does not parse: the last one stays (the file is
    // read every 250 ms: two reads later it is still in force).
    fixture.write_usage(b"{\"budgets\": 12}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(spent(&usage_of(&fixture, ALICE_KEY).await), 910 + own);

    // A baseline that lists nothing of alice's budget: only this
    // process's own spend counts (another key's total is not hers).
    fixture.write_usage(
        json!({"budgets": [{"scope": "key:team-b/bob", "period": "Day", "window": today(), "tokens": 999_999, "costNanos": 0}],
               "reports": {}})
        .to_string()
        .as_bytes(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while spent(&usage_of(&fixture, ALICE_KEY).await) != own {
        assert!(Instant::now() < deadline, "the new baseline was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
