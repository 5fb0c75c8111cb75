//! Budgets through a real gateway in-process, in front of the mock
//! upstream: a key's and a namespace's budgets in tokens and in money,
//! the OpenAI-shaped `insufficient_quota` refusal and its `Retry-After`,
//! reservations given back on upstream errors, and — counted in a real
//! Redis — one budget held exactly by several gateways, with a killed
//! gateway's reservations let go.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use support::redis::Redis;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::{GatewayConfig, KeyConfig};
use waycast_crds::money::PricingConfig;
use waycast_crds::period::Period;
use waycast_crds::sharing::TenantConfig;
use waycast_crds::spend::BudgetConfig;
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY, sha256_hex};

const CAROL_KEY: &str = "wc_carol_test_key_0123456789abcdefghijklmnopq";

/// 20 output tokens at most; the mock answers 5 chunks (5 completion
/// tokens: far less than reserved, so a budget charged the worst case
/// instead of the usage shows) and a prompt of the body it received
/// (rewritten by the gateway, so a few tokens more than the estimate) / 4.
const CHAT: &str = r#"{"model":"llama3","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;
const CHUNKS: (&str, &str) = ("x-mock-chunks", "5");

/// What a request reserves at admission: the prompt estimate and `max_tokens`.
fn tokens_per_request() -> u64 {
    CHAT.len().div_ceil(4) as u64 + 20
}

/// The tokens (prompt, completion) the upstream reported for each admitted
/// request, and the first refusal.
struct Run {
    used: Vec<(u64, u64)>,
    refusal: (http::HeaderMap, Value),
}

impl Run {
    fn admitted(&self) -> usize {
        self.used.len()
    }

    fn total(&self, price: impl Fn(u64, u64) -> u64) -> u64 {
        self.used.iter().map(|(prompt, completion)| price(*prompt, *completion)).sum()
    }

    /// The budget admitted each request whose worst case fitted in what
    /// was left, and refused the first that did not: `price` of what they
    /// used, against `worst` (one request's worst case) and `budget`.
    fn assert_exact(&self, budget: u64, worst: u64, price: impl Fn(u64, u64) -> u64) {
        let spent = self.total(&price);
        assert!(spent + worst > budget, "refused with {spent} spent of {budget}: another worst case of {worst} fitted");
        let (prompt, completion) = *self.used.last().unwrap();
        let before_last = spent - price(prompt, completion);
        assert!(
            before_last + worst <= budget,
            "admitted with {before_last} spent of {budget}: its {worst} did not fit"
        );
    }
}

fn sum_tokens(prompt: u64, completion: u64) -> u64 {
    prompt + completion
}

fn tokens(period: Period, tokens: u64) -> BudgetConfig {
    BudgetConfig { period, tokens: Some(tokens), cost: None }
}

fn money(period: Period, cost: &str) -> BudgetConfig {
    BudgetConfig { period, tokens: None, cost: Some(cost.into()) }
}

/// `team-a/carol` beside `team-a/alice`, and both may call llama.
fn with_carol(gateway: &mut GatewayConfig) {
    gateway.keys.push(KeyConfig::new("team-a/carol", sha256_hex(CAROL_KEY)));
}

async fn chat(fixture: &Fixture, key: &str) -> (StatusCode, http::HeaderMap, Value) {
    let (status, headers, body) =
        fixture.send(fixture.request("/v1/chat/completions", Some(key), CHAT, &[CHUNKS])).await;
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, headers, body)
}

/// Sends `keys` in turn until one is refused (at most `limit` requests).
async fn until_refused(fixture: &Fixture, keys: &[&str], limit: usize) -> Run {
    let mut used = Vec::new();
    for sent in 0..limit {
        let (status, headers, body) = chat(fixture, keys[sent % keys.len()]).await;
        match status {
            StatusCode::OK => used.push(usage(&body)),
            StatusCode::TOO_MANY_REQUESTS => return Run { used, refusal: (headers, body) },
            other => panic!("{other}: {body}"),
        }
    }
    panic!("no refusal in {limit} requests");
}

fn usage(body: &Value) -> (u64, u64) {
    let read = |name: &str| body["usage"][name].as_u64().unwrap_or_else(|| panic!("no usage.{name}: {body}"));
    (read("prompt_tokens"), read("completion_tokens"))
}

/// Seconds from now to the next midnight in UTC.
fn to_midnight() -> i64 {
    let now = jiff::Timestamp::now();
    let window = Period::Day.window(now, &jiff::tz::TimeZone::UTC);
    window.end.as_second() - now.as_second()
}

#[tokio::test]
async fn a_keys_daily_token_budget_refuses_with_insufficient_quota_until_midnight() {
    let budget = 10 * tokens_per_request() + tokens_per_request() / 2;
    // (About 16 requests: each uses about 25 of its 40 reserved.)
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        gateway.keys[0].budgets = vec![tokens(Period::Day, budget)];
        // Bob's day is hardly touched: under half, no series for it.
        gateway.keys[1].budgets = vec![tokens(Period::Day, 1_000 * tokens_per_request())];
    })
    .await;
    let run = until_refused(&fixture, &[ALICE_KEY], 30).await;
    run.assert_exact(budget, tokens_per_request(), sum_tokens);
    let (headers, body) = &run.refusal;
    assert_eq!(body["error"]["type"], "insufficient_quota", "{body}");
    assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("API key's daily token budget"), "{message}");
    assert_eq!(headers["x-should-retry"], "false", "the SDKs must not retry a spent budget at once");
    let retry_after: i64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((retry_after - to_midnight()).abs() <= 2, "Retry-After {retry_after} s, midnight in {} s", to_midnight());
    // Another key is not touched by alice's budget.
    let bob = fixture.request("/v1/chat/completions", Some(BOB_KEY), &CHAT.replace("llama3", "mistral-7b"), &[CHUNKS]);
    assert_eq!(fixture.send(bob).await.0, StatusCode::OK);
    let refused = r#"waycast_gateway_rate_limit_requests_total{decision="key_budget_tokens",key="team-a/alice",model="llama-3.1-8b"}"#;
    assert_eq!(fixture.metric(refused).await, Some(1.0));
    // The budget alert's gauge: nearly all spent (the refused request's
    // reservation did not fit the rest), shown for alice's budget alone.
    let used = fixture.metric(r#"waycast_gateway_budget_used_ratio{period="day",scope="key:team-a/alice"}"#).await;
    assert!(used.is_some_and(|ratio| (0.9..=1.0).contains(&ratio)), "{used:?}");
    let (_, text) = fixture.admin_get("/metrics").await;
    assert_eq!(text.matches("waycast_gateway_budget_used_ratio{").count(), 1, "{text}");
}

/// A namespace's budget covers all its keys together, whatever budgets the
/// keys have of their own: a key's own budget can only be tighter.
#[tokio::test]
async fn a_namespaces_budget_covers_all_its_keys_and_a_keys_own_cannot_exceed_it() {
    let per = tokens_per_request();
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        with_carol(gateway);
        // Alice's own month is larger than the namespace's: it does not help her.
        gateway.keys[0].budgets = vec![tokens(Period::Month, 1_000 * per)];
        let mut team_a = TenantConfig::new("team-a");
        team_a.budgets = vec![tokens(Period::Month, 6 * per)];
        gateway.settings.tenants = vec![team_a];
    })
    .await;
    let run = until_refused(&fixture, &[ALICE_KEY, CAROL_KEY], 30).await;
    run.assert_exact(6 * per, per, sum_tokens);
    let message = run.refusal.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("namespace's monthly token budget"), "{message}");
    // Both keys are refused now; team-b's key is not counted against it.
    assert_eq!(chat(&fixture, CAROL_KEY).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(chat(&fixture, ALICE_KEY).await.0, StatusCode::TOO_MANY_REQUESTS);
    let bob = fixture.request("/v1/chat/completions", Some(BOB_KEY), &CHAT.replace("llama3", "mistral-7b"), &[CHUNKS]);
    assert_eq!(fixture.send(bob).await.0, StatusCode::OK);
    let used = fixture.metric(r#"waycast_gateway_budget_used_ratio{period="month",scope="tenant:team-a"}"#).await;
    assert!(used.is_some_and(|ratio| (0.9..=1.0).contains(&ratio)), "{used:?}");
    // Alice's own month is hardly touched: under half, no series.
    let (_, text) = fixture.admin_get("/metrics").await;
    assert!(!text.contains(r#"scope="key:team-a/alice""#), "{text}");

    // A key whose own budget is tighter is refused by its own first.
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        with_carol(gateway);
        gateway.keys[0].budgets = vec![tokens(Period::Week, 2 * per)];
        let mut team_a = TenantConfig::new("team-a");
        team_a.budgets = vec![tokens(Period::Month, 6 * per)];
        gateway.settings.tenants = vec![team_a];
    })
    .await;
    let alice = until_refused(&fixture, &[ALICE_KEY], 30).await;
    alice.assert_exact(2 * per, per, sum_tokens);
    let message = alice.refusal.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("API key's weekly token budget"), "{message}");
    // Carol has what alice left of the namespace's.
    let carol = until_refused(&fixture, &[CAROL_KEY], 30).await;
    let message = carol.refusal.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("namespace's monthly token budget"), "{message}");
    let both = Run { used: [alice.used, carol.used].concat(), refusal: carol.refusal };
    both.assert_exact(6 * per, per, sum_tokens);
}

/// A budget in money at a priced model: each request reserves its worst
/// case at the model's prices, and is charged its usage at them.
#[tokio::test]
async fn a_cost_budget_holds_the_requests_its_money_buys() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        // 0.001 a prompt token, 0.002 an output token.
        gateway.models[0].pricing = Some(PricingConfig {
            currency: "USD".into(),
            input_per_million_tokens: "1000".into(),
            output_per_million_tokens: "2000".into(),
            cached_input_per_million_tokens: None,
        });
        gateway.keys[0].budgets = vec![money(Period::Day, "0.50")];
    })
    .await;
    // In nano-dollars.
    let price = |prompt: u64, completion: u64| prompt * 1_000_000 + completion * 2_000_000;
    let worst = price(CHAT.len().div_ceil(4) as u64, 20);
    let run = until_refused(&fixture, &[ALICE_KEY], 30).await;
    run.assert_exact(500_000_000, worst, price);
    let message = run.refusal.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("API key's daily spending budget"), "{message}");
    let spent = fixture
        .metric(r#"waycast_gateway_cost_nanos_total{currency="USD",key="team-a/alice",model="llama-3.1-8b"}"#)
        .await
        .unwrap();
    assert_eq!(spent as u64, run.total(price), "charged the usage at the model's prices");
}

/// A request the upstream fails is charged nothing: its worst case, held
/// while it ran, is given back.
#[tokio::test]
async fn a_failed_request_gives_its_reservation_back() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        gateway.keys[0].budgets = vec![tokens(Period::Day, 3_000)];
    })
    .await;
    let body = r#"{"model":"llama3","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..6 {
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &[("x-mock-status", "500")]);
        assert_eq!(fixture.send(request).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    }
    // Each of the six reserved over 1,000 of the 3,000 while it ran: two
    // more admitted show every one was given back.
    for _ in 0..2 {
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &[("x-mock-chunks", "5")]);
        let (status, _, answer) = fixture.send(request).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&answer));
    }
}

async fn connected(fixture: &Fixture) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fixture.metric("waycast_gateway_rate_limit_store_up").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the gateway never connected to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Counted in Redis, a namespace's budget holds across gateways exactly:
/// three gateways, two keys, the namespace's 9 requests' worth admitted,
/// not 9 per gateway.
#[tokio::test]
async fn three_gateways_counting_in_redis_hold_one_budget_exactly() {
    let redis = Redis::start();
    let per = tokens_per_request();
    let mut gateways = Vec::new();
    for _ in 0..3 {
        let config = redis.config(false);
        let fixture = Fixture::start(FixtureOptions::default(), move |gateway, _| {
            gateway.settings.redis = Some(config);
            with_carol(gateway);
            let mut team_a = TenantConfig::new("team-a");
            team_a.budgets = vec![tokens(Period::Month, 9 * per + per / 2)];
            gateway.settings.tenants = vec![team_a];
        })
        .await;
        connected(&fixture).await;
        gateways.push(fixture);
    }
    // Round robin over the gateways and keys until the first refusal.
    let mut used = Vec::new();
    let mut refusal = None;
    'rounds: for round in 0..8 {
        for (index, fixture) in gateways.iter().enumerate() {
            let key = if (round + index) % 2 == 0 { ALICE_KEY } else { CAROL_KEY };
            match chat(fixture, key).await {
                (StatusCode::OK, _, body) => used.push(usage(&body)),
                (StatusCode::TOO_MANY_REQUESTS, headers, body) => {
                    assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
                    refusal = Some((headers, body));
                    break 'rounds;
                }
                (other, _, body) => panic!("{other}: {body}"),
            }
        }
    }
    let run = Run { used, refusal: refusal.expect("no refusal") };
    run.assert_exact(9 * per + per / 2, per, sum_tokens);
    // Each uses about 25 of the 380: per gateway, three times as many.
    assert!(run.admitted() <= 16, "counted per gateway, not for the namespace: {}", run.admitted());
    // Every gateway refuses now, for either key.
    for fixture in &gateways {
        for key in [ALICE_KEY, CAROL_KEY] {
            assert_eq!(chat(fixture, key).await.0, StatusCode::TOO_MANY_REQUESTS);
        }
        // Each gateway's budget gauge shows what Redis counted for all
        // (past the alert's 80 %: the last refusal's request did not fit).
        let used = fixture.metric(r#"waycast_gateway_budget_used_ratio{period="month",scope="tenant:team-a"}"#).await;
        assert!(used.is_some_and(|ratio| (0.8..=1.0).contains(&ratio)), "{used:?}");
    }
}

/// A gateway killed with requests open (SIGKILL: nothing settled) holds
/// their reservations in Redis only until its liveness key expires.
#[tokio::test]
async fn a_killed_gateways_reservations_in_redis_are_let_go() {
    let redis = Redis::start();
    let config = redis.config(false);
    let budget = 3_000;
    let in_process = {
        let config = config.clone();
        Fixture::start(FixtureOptions::default(), move |gateway, _| {
            gateway.settings.redis = Some(config);
            gateway.keys[0].budgets = vec![tokens(Period::Day, budget)];
        })
        .await
    };
    connected(&in_process).await;
    let mut process_config = waycast_mock::fixtures::default_config(&in_process.mock.base_url());
    process_config.settings.redis = Some(config);
    process_config.keys[0].budgets = vec![tokens(Period::Day, budget)];
    let mut process = support::GatewayProcess::start(&process_config, &[]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while process.metric("waycast_gateway_rate_limit_store_up").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the process never connected to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Two requests through the process reserve over 2,000 of the 3,000
    // and hang (the mock answers after a minute).
    let big = r#"{"model":"llama3","max_tokens":1000,"messages":[]}"#;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let mut held = Vec::new();
    for _ in 0..2 {
        let request = in_process.request("/v1/chat/completions", Some(ALICE_KEY), big, &[("x-mock-delay-ms", "60000")]);
        let (mut parts, body) = request.into_parts();
        parts.uri = process.url("/v1/chat/completions").parse().unwrap();
        held.push(tokio::spawn(client.request(http::Request::from_parts(parts, body))));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while in_process.mock.recorder.requests().await.len() < 2 {
        assert!(Instant::now() < deadline, "the process's requests never reached the mock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let send_big = || in_process.send(in_process.request("/v1/chat/completions", Some(ALICE_KEY), big, &[]));
    assert_eq!(send_big().await.0, StatusCode::TOO_MANY_REQUESTS, "the process's reservations count here");
    process.child.start_kill().unwrap();
    let _ = process.child.wait().await;
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (status, _, body) = send_big().await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&body));
        assert!(Instant::now() < deadline, "the killed gateway's reservations were never let go");
    }
    let back = killed.elapsed();
    println!("a killed gateway's reservations were let go after {back:?}");
    assert!(back >= Duration::from_secs(5), "not before its liveness key could expire: {back:?}");
    for request in held {
        request.abort();
    }
}

/// A model priced in another currency than the budgets count in: a key
/// with a cost budget is refused on it (its cost cannot be counted), a key
/// with only a token budget is served.
#[tokio::test]
async fn a_cost_budget_cannot_be_spent_on_a_model_priced_in_another_currency() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        with_carol(gateway);
        gateway.models[0].pricing = Some(PricingConfig {
            currency: "EUR".into(),
            input_per_million_tokens: "1".into(),
            output_per_million_tokens: "2".into(),
            cached_input_per_million_tokens: None,
        });
        gateway.keys[0].budgets = vec![money(Period::Month, "10")];
        gateway.keys[4].budgets = vec![tokens(Period::Month, 10_000)];
    })
    .await;
    let (status, _, body) = chat(&fixture, ALICE_KEY).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "model_priced_in_another_currency", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("priced in EUR"), "{body}");
    assert_eq!(chat(&fixture, CAROL_KEY).await.0, StatusCode::OK, "a token budget counts any model");
}

/// A spend past what Redis's 64-bit counts hold (an upstream reporting
/// absurd usage) leaves the count at its top instead of failing the
/// settlement half-way: the request's cost is still spent, and the next
/// request is refused for the budget, not failed.
#[tokio::test]
async fn a_spend_past_a_64_bit_count_saturates_and_the_rest_is_still_counted() {
    let redis = Redis::start();
    let config = redis.config(true);
    let fixture = Fixture::start(FixtureOptions::default(), move |gateway, _| {
        gateway.settings.redis = Some(config);
        gateway.models[0].pricing = Some(PricingConfig {
            currency: "USD".into(),
            input_per_million_tokens: "1".into(),
            output_per_million_tokens: "1".into(),
            cached_input_per_million_tokens: None,
        });
        // A cost budget only: the tokens are counted, not limited.
        gateway.keys[0].budgets = vec![money(Period::Day, "5")];
    })
    .await;
    connected(&fixture).await;
    assert_eq!(chat(&fixture, ALICE_KEY).await.0, StatusCode::OK);
    let hashes = redis.cli(&["--scan", "--pattern", "*budget:key:team-a/alice:Day:*"]);
    let hash = hashes.lines().next().unwrap_or_else(|| panic!("no budget hash in Redis: {hashes:?}")).to_owned();
    let spent_cost: u64 = redis.cli(&["HGET", &hash, "c"]).parse().unwrap();
    assert!(spent_cost > 0);
    // The token count a step below i64::MAX: the next spend overflows it.
    redis.cli(&["HSET", &hash, "t", "9223372036854775800"]);
    assert_eq!(chat(&fixture, ALICE_KEY).await.0, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let counted: u64 = redis.cli(&["HGET", &hash, "c"]).parse().unwrap();
        if counted > spent_cost {
            break;
        }
        assert!(Instant::now() < deadline, "the second request's cost was never spent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(redis.cli(&["HGET", &hash, "t"]), "9000000000000000000", "saturated");
    // Spent past the money: refused for the budget (not a store failure).
    redis.cli(&["HSET", &hash, "c", "9000000000000000000"]);
    let (status, _, body) = chat(&fixture, ALICE_KEY).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("insufficient_quota")));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("daily spending budget"), "{message}");
}

/// A request a later limit refuses after its budgets were reserved (the
/// model's request limit, checked after the budgets) gives its
/// reservations back: ten such refusals of about 40 tokens each on a
/// 200-token budget leave it whole, so every refusal names the limit,
/// never the budget.
#[tokio::test]
async fn a_request_refused_after_its_budgets_were_reserved_gives_them_back() {
    let fixture = Fixture::start(FixtureOptions::default(), |gateway, _| {
        gateway.keys[0].budgets = vec![tokens(Period::Day, 5 * tokens_per_request())];
        gateway.models[0].limits = Some(waycast_crds::config::LimitsConfig::requests(2));
    })
    .await;
    for _ in 0..2 {
        assert_eq!(chat(&fixture, ALICE_KEY).await.0, StatusCode::OK);
    }
    for attempt in 0..10 {
        let (status, _, body) = chat(&fixture, ALICE_KEY).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "attempt {attempt}: a reservation was kept: {body}");
    }
}
