//! Sign-in with an identity the caller already has, through a real gateway
//! in front of the mock upstream: bearer tokens (JWTs) of trusted
//! providers, served through the grants that admit their holders, beside
//! keys; every refusal a 401 in the client's dialect, before the body is
//! read. Tokens are minted by `waycast_mock::tokens` (ring, by hand).

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use support::{Fixture, FixtureOptions};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use waycast_crds::config::{GatewayConfig, GrantConfig, ProviderConfig};
use waycast_mock::fixtures::{ALICE_KEY, UPSTREAM_SECRET};
use waycast_mock::tokens::{TestIssuer, hmac_signed, tampered, unsigned};

const CORP: &str = "https://sso.example.com/realms/corp";
const CLUSTER: &str = "https://kubernetes.default.svc.cluster.local";
const LATER: &str = "https://later.example.com";
const AUDIENCE: &str = "waycast";
const LLAMA: &str = r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#;
const MISTRAL: &str = r#"{"model":"mistral-7b","messages":[{"role":"user","content":"hi"}]}"#;

struct Issuers {
    corp: TestIssuer,
    cluster: TestIssuer,
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

impl Issuers {
    fn new() -> Self {
        Self { corp: TestIssuer::new(CORP, "corp-1"), cluster: TestIssuer::new(CLUSTER, "sa-1") }
    }

    /// A token of the company's provider for `subject` in `groups`.
    fn person(&self, subject: &str, groups: &[&str]) -> String {
        self.corp.token(&self.corp.claims(subject, AUDIENCE, groups, now(), now() + 600))
    }

    /// A projected ServiceAccount token of `namespace/name`.
    fn workload(&self, namespace: &str, name: &str) -> String {
        let subject = format!("system:serviceaccount:{namespace}:{name}");
        self.cluster.token(&self.cluster.claims(&subject, AUDIENCE, &[], now(), now() + 600))
    }

    /// Providers `corp` and `cluster` with their key sets, `later` with
    /// none fetched yet; grants: team-a's developers (group) may use the
    /// llama models, team-b's ops (users carol and alice) the mistral
    /// ones, team-a's batch workload (ServiceAccount) every model, dave
    /// through `later`.
    fn adjust(&self, config: &mut GatewayConfig) {
        let mut corp = ProviderConfig::new("corp", CORP, AUDIENCE);
        corp.key_set = Some(self.corp.jwks());
        let mut cluster = ProviderConfig::new("cluster", CLUSTER, AUDIENCE);
        cluster.service_accounts = true;
        cluster.key_set = Some(self.cluster.jwks());
        config.providers = vec![corp, cluster, ProviderConfig::new("later", LATER, AUDIENCE)];
        let mut developers = GrantConfig::new("team-a/developers", "corp");
        developers.groups = vec!["developers".into()];
        developers.models = Some(vec!["llama*".into()]);
        let mut ops = GrantConfig::new("team-b/ops", "corp");
        ops.users = vec!["carol".into(), "dana".into()];
        ops.models = Some(vec!["mistral-*".into()]);
        let mut robots = GrantConfig::new("team-a/robots", "cluster");
        robots.service_accounts = vec!["team-a/batch".into()];
        let mut later = GrantConfig::new("team-c/later", "later");
        later.users = vec!["dave".into()];
        config.grants = vec![ops, developers, robots, later];
    }
}

async fn gateway(issuers: &Issuers) -> Fixture {
    Fixture::start(FixtureOptions::default(), |config, _| issuers.adjust(config)).await
}

fn error_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| panic!("JSON error: {}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn token_holders_reach_their_grants_models_and_keys_work_beside_them() {
    let issuers = Issuers::new();
    let fixture = gateway(&issuers).await;
    let alice = issuers.person("alice", &["developers"]);
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(&alice), LLAMA).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let upstream = fixture.mock.recorder.last().await.unwrap();
    assert_eq!(
        upstream.headers.get("authorization").and_then(|v| v.to_str().ok()),
        Some(format!("Bearer {UPSTREAM_SECRET}").as_str()),
        "the upstream gets the backend's credential, never the caller's token"
    );
    // Served through team-a/developers, the one grant that admits her: its
    // models only.
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(&alice), MISTRAL).await;
    assert_eq!((status, error_of(&body)["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("model_not_allowed")));
    // A grant that does not admit her cannot be named into.
    let foreign = fixture.request("/v1/chat/completions", Some(&alice), LLAMA, &[("x-waycast-grant", "team-a/robots")]);
    let (status, _, body) = fixture.send(foreign).await;
    assert_eq!((status, error_of(&body)["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("no_grant")));
    // Dana is admitted by grants of two teams (a group of team-a's, a name
    // in team-b's): neither serves her until she names one, so no team's
    // grant takes another team's people by the order of its name.
    let dana = issuers.person("dana", &["developers"]);
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(&dana), LLAMA).await;
    assert_eq!(
        (status, error_of(&body)["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("ambiguous_grant"))
    );
    let named = fixture.request("/v1/chat/completions", Some(&dana), MISTRAL, &[("x-waycast-grant", "team-b/ops")]);
    assert_eq!(fixture.send(named).await.0, StatusCode::OK);
    let named =
        fixture.request("/v1/chat/completions", Some(&dana), LLAMA, &[("x-waycast-grant", "team-a/developers")]);
    assert_eq!(fixture.send(named).await.0, StatusCode::OK);

    let carol = issuers.person("carol", &[]);
    assert_eq!(fixture.post("/v1/chat/completions", Some(&carol), MISTRAL).await.0, StatusCode::OK);
    let batch = issuers.workload("team-a", "batch");
    assert_eq!(fixture.post("/v1/chat/completions", Some(&batch), MISTRAL).await.0, StatusCode::OK);
    let (status, _, body) =
        fixture.post("/v1/chat/completions", Some(&issuers.workload("team-b", "batch")), LLAMA).await;
    assert_eq!((status, error_of(&body)["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("no_grant")));
    // A key works as before.
    assert_eq!(fixture.post("/v1/chat/completions", Some(ALICE_KEY), LLAMA).await.0, StatusCode::OK);

    // The grant is the metric's key; the person is never a label.
    let (_, metrics) = fixture.admin_get("/metrics").await;
    assert!(metrics.contains("key=\"team-a/developers\""), "the grant counts as the key");
    for person in ["alice", "carol", "system:serviceaccount"] {
        assert!(!metrics.contains(&format!("\"{person}")), "{person} is a label in /metrics");
    }
}

/// Another team's grant naming team-a's workload as a user (the
/// API server's rule refuses it; a config that has it anyway) admits
/// nobody: the workload is served by its own grant, not made ambiguous,
/// and never served through the other team's.
#[tokio::test]
async fn a_service_account_named_as_another_teams_user_is_not_theirs() {
    let issuers = Issuers::new();
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        issuers.adjust(config);
        let mut hijack = GrantConfig::new("team-c/hijack", "cluster");
        hijack.users = vec!["system:serviceaccount:team-a:batch".into(), "system:serviceaccount:team-a:other".into()];
        config.grants.push(hijack);
    })
    .await;
    let batch = issuers.workload("team-a", "batch");
    assert_eq!(fixture.post("/v1/chat/completions", Some(&batch), MISTRAL).await.0, StatusCode::OK);
    let (status, _, body) =
        fixture.post("/v1/chat/completions", Some(&issuers.workload("team-a", "other")), LLAMA).await;
    assert_eq!((status, error_of(&body)["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("no_grant")));
}

#[tokio::test]
async fn every_bad_token_is_a_401_that_says_why() {
    let issuers = Issuers::new();
    let fixture = gateway(&issuers).await;
    let corp = &issuers.corp;
    let good = corp.claims("alice", AUDIENCE, &["developers"], now(), now() + 600);
    let with = |field: &str, value: Value| {
        let mut claims = good.clone();
        claims[field] = value;
        claims
    };
    let mut no_subject = good.clone();
    no_subject.as_object_mut().unwrap().remove("sub");
    let stranger = TestIssuer::new(CORP, "corp-1");
    let elsewhere = TestIssuer::new("https://evil.example.com", "corp-1");
    let cases: Vec<(&str, String, &str)> = vec![
        ("a member of no grant", issuers.person("eve", &["sales"]), "no_grant"),
        ("expired", corp.token(&with("exp", json!(now() - 120))), "token_expired"),
        ("not yet valid", corp.token(&with("nbf", json!(now() + 600))), "token_not_yet_valid"),
        ("for another audience", corp.token(&with("aud", json!("another-app"))), "wrong_audience"),
        ("tampered", tampered(&corp.token(&good), &with("groups", json!(["admins", "developers"]))), "bad_signature"),
        ("signed by another key of the same kid", stranger.token(&good), "bad_signature"),
        ("unsigned (alg none)", unsigned(&good), "disallowed_algorithm"),
        (
            "an HMAC keyed with the public key set",
            hmac_signed(corp.jwks().as_bytes(), "corp-1", &good),
            "disallowed_algorithm",
        ),
        (
            "of an issuer not trusted",
            elsewhere.token(&with("iss", json!("https://evil.example.com"))),
            "unknown_issuer",
        ),
        ("without a subject", corp.token(&no_subject), "missing_claim"),
        ("of a provider whose key set is not fetched", corp.token(&with("iss", json!(LATER))), "unknown_key"),
        ("garbage of a token's shape", "eyJhbGciOi.eyJzdWIi.c2ln".to_owned(), "malformed_token"),
    ];
    for (what, token, code) in cases {
        let (status, headers, body) = fixture.post("/v1/chat/completions", Some(&token), LLAMA).await;
        let error = error_of(&body);
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some(code)),
            "{what}: {error}"
        );
        assert_eq!(error["error"]["type"], "authentication_error", "{what}");
        assert_eq!(headers["www-authenticate"], "Bearer error=\"invalid_token\"", "{what}");
        // The same token on Anthropic's path gets Anthropic's shape.
        let (status, _, body) = fixture.post("/v1/messages", Some(&token), LLAMA).await;
        let error = error_of(&body);
        assert_eq!((status, error["type"].as_str()), (StatusCode::UNAUTHORIZED, Some("error")), "{what}: {error}");
        assert_eq!(error["error"]["type"], "authentication_error", "{what}");
    }
    assert!(fixture.mock.recorder.requests().await.is_empty(), "nothing refused reached the upstream");
    // A token too large is refused unread.
    let huge = format!("eyJ{}.e30.", "A".repeat(9000));
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(&huge), LLAMA).await;
    assert_eq!(
        (status, error_of(&body)["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("token_too_large"))
    );
}

#[tokio::test]
async fn a_bad_token_is_answered_before_the_body_is_read() {
    let issuers = Issuers::new();
    let fixture = gateway(&issuers).await;
    let expired = issuers.corp.token(&issuers.corp.claims("alice", AUDIENCE, &["developers"], now(), now() - 120));
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(fixture.addr).await.unwrap();
    // A body declared and never sent: the body timeout is 5 s.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {expired}\r\nContent-Length: 100000\r\n\r\n{{\"model\":"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let mut buffer = [0_u8; 4096];
    while !String::from_utf8_lossy(&response).contains("token_expired") {
        let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut buffer)).await.unwrap().unwrap();
        assert!(read > 0, "closed early: {}", String::from_utf8_lossy(&response));
        response.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(2), "answered before the body: {:?}", started.elapsed());
}

/// The developers grant counts each member on their own: one request in
/// flight each and a daily budget of 100 tokens each, beside the grant's
/// own 1,000 a day for all of them together.
fn per_person(issuers: &Issuers, config: &mut GatewayConfig) {
    use waycast_crds::config::{LimitsConfig, PerUserConfig};
    use waycast_crds::period::Period;
    use waycast_crds::spend::BudgetConfig;
    issuers.adjust(config);
    let developers = config.grants.iter_mut().find(|grant| grant.id == "team-a/developers").unwrap();
    let tokens = |tokens| BudgetConfig { period: Period::Day, tokens: Some(tokens), cost: None };
    developers.budgets = vec![tokens(1_000)];
    developers.per_user = Some(PerUserConfig {
        limits: Some(LimitsConfig { requests_per_minute: None, tokens_per_minute: None, max_concurrent: Some(1) }),
        budgets: vec![tokens(100)],
    });
}

const SMALL: &str = r#"{"model":"llama3","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn each_member_has_their_own_concurrency_beside_the_others() {
    let issuers = Issuers::new();
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| per_person(&issuers, config)).await;
    let (alice, bob) = (issuers.person("alice", &["developers"]), issuers.person("bob", &["developers"]));
    let slow = fixture.request("/v1/chat/completions", Some(&alice), SMALL, &[("x-mock-delay-ms", "1500")]);
    let in_flight = fixture.open(slow);
    let second = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let alice_again = fixture.post("/v1/chat/completions", Some(&alice), SMALL).await;
        let bob_meanwhile = fixture.post("/v1/chat/completions", Some(&bob), SMALL).await;
        (alice_again, bob_meanwhile)
    };
    let (first, ((status, _, body), (bob_status, _, _))) = tokio::join!(in_flight, second);
    assert_eq!(first.status(), StatusCode::OK);
    let error = error_of(&body);
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("per-person limit of 1 concurrent"), "{message}");
    assert_eq!(bob_status, StatusCode::OK, "Bob is not held back by Alice's request");
    let label = "waycast_gateway_rate_limit_requests_total{decision=\"user_concurrent\",key=\"team-a/developers\",model=\"llama-3.1-8b\"}";
    assert_eq!(fixture.metric(label).await, Some(1.0));
    // Her request over, she is served again.
    assert_eq!(fixture.post("/v1/chat/completions", Some(&alice), SMALL).await.0, StatusCode::OK);
}

#[tokio::test]
async fn each_member_spends_their_own_budget_and_sees_it() {
    let issuers = Issuers::new();
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| per_person(&issuers, config)).await;
    let (alice, bob) = (issuers.person("alice", &["developers"]), issuers.person("bob", &["developers"]));
    let mut served = 0;
    let refusal = loop {
        let (status, _, body) = fixture.post("/v1/chat/completions", Some(&alice), SMALL).await;
        match status {
            StatusCode::OK => served += 1,
            StatusCode::TOO_MANY_REQUESTS => break error_of(&body),
            other => panic!("{other}: {}", String::from_utf8_lossy(&body)),
        }
        assert!(served < 20, "100 tokens a day cannot serve 20 requests of about 20");
    };
    assert!(served >= 2, "served {served} before her budget ran out");
    assert_eq!(refusal["error"]["code"], "insufficient_quota", "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.contains("per-person daily token budget"), "{message}");
    // Bob has his own.
    assert_eq!(fixture.post("/v1/chat/completions", Some(&bob), SMALL).await.0, StatusCode::OK);

    // She sees her own budget and her grant's, nobody else's.
    let request = http::Request::get(fixture.url("/v1/usage"))
        .header("authorization", format!("Bearer {alice}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let usage = error_of(&body);
    let budgets = usage["budgets"].as_array().unwrap();
    let owners: Vec<&str> = budgets.iter().map(|b| b["owner"].as_str().unwrap()).collect();
    assert_eq!(owners, ["user", "grant"], "{usage}");
    let mine = &budgets[0];
    assert_eq!(mine["tokens"], 100);
    let spent = mine["spent_tokens"].as_u64().unwrap();
    assert!(spent > 0 && spent <= 100, "{usage}");
    let grant_spent = budgets[1]["spent_tokens"].as_u64().unwrap();
    assert!(grant_spent > spent, "the grant counts Bob's too: {usage}");
    assert_eq!(usage["key"], "team-a/developers");
}

/// The members of one grant take turns in a full model's queue: a person
/// who queued three requests does not keep a colleague waiting behind all
/// three.
#[tokio::test]
async fn members_of_a_grant_take_turns_in_a_full_model() {
    use waycast_crds::config::CapacityConfig;
    let issuers = Issuers::new();
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        issuers.adjust(config);
        config.models[0].capacity = Some(CapacityConfig { max_in_flight_per_endpoint: 1 });
        config.settings.sharing.burst_percent = 0;
        config.settings.sharing.max_wait = Duration::from_secs(20);
    })
    .await;
    let depth = r#"waycast_gateway_queue_depth{class="standard",model="llama-3.1-8b"}"#;
    let (alice, bob) = (issuers.person("alice", &["developers"]), issuers.person("bob", &["developers"]));
    let chat = |who: &str| format!(r#"{{"model":"llama3","messages":[{{"role":"user","content":"{who}"}}]}}"#);
    let send = |token: &str, who: &str| {
        let request = fixture.request("/v1/chat/completions", Some(token), &chat(who), &[("x-mock-delay-ms", "300")]);
        fixture.send(request)
    };
    let fixture = &fixture;
    let wait_depth = |value: f64| async move {
        let deadline = Instant::now() + Duration::from_secs(5);
        while fixture.metric(depth).await != Some(value) {
            assert!(Instant::now() < deadline, "the queue never held {value}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let all = async {
        let filler = send(&alice, "alice-0");
        let queued = async {
            // The filler is at the mock before the others are sent.
            let deadline = Instant::now() + Duration::from_secs(5);
            while fixture.mock.recorder.requests().await.is_empty() {
                assert!(Instant::now() < deadline, "the filler never reached the mock");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let alice_more = futures_util::future::join_all([
                send(&alice, "alice-1"),
                send(&alice, "alice-2"),
                send(&alice, "alice-3"),
            ]);
            let bob_after = async {
                wait_depth(3.0).await;
                let sent = send(&bob, "bob-1");
                sent.await
            };
            tokio::join!(alice_more, bob_after)
        };
        tokio::join!(filler, queued)
    };
    let ((filled, _, _), (alice_answers, (bob_status, _, _))) = all.await;
    assert_eq!(filled, StatusCode::OK);
    assert!(alice_answers.iter().all(|(status, _, _)| *status == StatusCode::OK));
    assert_eq!(bob_status, StatusCode::OK);
    let order: Vec<String> = fixture
        .mock
        .recorder
        .requests()
        .await
        .iter()
        .map(|request| request.json()["messages"][0]["content"].as_str().unwrap_or("").to_owned())
        .collect();
    let bob_at = order.iter().position(|who| who == "bob-1").unwrap();
    assert!(bob_at <= 2, "Bob waited behind all of Alice's queued requests: {order:?}");
}

/// Without Redis a grant's and its members' budgets go into the report the
/// operator collects, and come back as the fleet's spend: a member first
/// seen by a process (one restarted, a new replica) starts from what the
/// fleet spent of their budget, not from nothing; a member already held
/// takes each new baseline.
#[tokio::test]
async fn members_budgets_are_reported_and_count_the_fleets_spend() {
    use waycast_crds::period::Period;
    use waycast_crds::usage::{BudgetScope, UsageReport};
    let issuers = Issuers::new();
    let options = FixtureOptions { usage_file: true, ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |config, _| per_person(&issuers, config)).await;
    let (alice, bob) = (issuers.person("alice", &["developers"]), issuers.person("bob", &["developers"]));
    let (alice_scope, bob_scope) =
        (BudgetScope::member_of("team-a/developers", "alice"), BudgetScope::member_of("team-a/developers", "bob"));
    let today = Period::Day.window(jiff::Timestamp::now(), &jiff::tz::TimeZone::UTC).key;
    let spent = |scope: &str, tokens: u64| json!({"scope": scope, "period": "Day", "window": today, "tokens": tokens, "costNanos": 0});
    let usage_of = |token: String| {
        let fixture = &fixture;
        async move {
            let request = http::Request::get(fixture.url("/v1/usage"))
                .header("authorization", format!("Bearer {token}"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let (status, _, body) = fixture.send(request).await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
            error_of(&body)["budgets"][0]["spent_tokens"].as_u64().unwrap()
        }
    };
    // Bob is served first, so he is held when the baseline comes.
    assert_eq!(fixture.post("/v1/chat/completions", Some(&bob), SMALL).await.0, StatusCode::OK);
    // Processes gone had spent 50 of Alice's 100 today, 95 of Bob's, 500
    // of the grant's 1,000; this one's reports are in none of it.
    let baseline = json!({"budgets": [spent(&alice_scope, 50), spent(&bob_scope, 95),
                                      spent("grant:team-a/developers", 500)], "reports": {}});
    fixture.write_usage(baseline.to_string().as_bytes());
    let deadline = Instant::now() + Duration::from_secs(10);
    while usage_of(bob.clone()).await < 95 {
        assert!(Instant::now() < deadline, "the baseline never reached a member already held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(&bob), SMALL).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&body));
    // Alice, first seen now, starts from the fleet's 50: at most 50 more.
    assert!(usage_of(alice.clone()).await >= 50, "a member made after the baseline starts from it");
    let (mut own, mut served) = (0, 1);
    loop {
        let (status, _, body) = fixture.post("/v1/chat/completions", Some(&alice), SMALL).await;
        if status != StatusCode::OK {
            assert_eq!(error_of(&body)["error"]["code"], "insufficient_quota");
            break;
        }
        served += 1;
        own += error_of(&body)["usage"]["total_tokens"].as_u64().unwrap();
        assert!(own <= 50, "spent {own} of the 50 the fleet left her");
    }
    assert!(own > 0, "what was left was spendable");
    // The report names the grant's budget and each member's by digest
    // only, with this process's own spend.
    let (status, text) = fixture.admin_get("/usage").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(!text.contains("alice"), "no person's name in the report: {text}");
    let report: UsageReport = serde_json::from_str(&text).unwrap();
    let of = |scope: &str| report.budgets.iter().find(|b| b.scope == scope).map(|b| b.tokens);
    assert_eq!(of(&alice_scope), Some(own));
    assert!(of(&bob_scope).is_some_and(|tokens| tokens > 0));
    assert!(of("grant:team-a/developers").is_some_and(|tokens| tokens > own));
    // The grant's month: every member's request together, as the grant's
    // (its `status.usage`), never as a key's.
    let grant = report.grants.get("team-a/developers").unwrap_or_else(|| panic!("no grant usage: {text}"));
    assert_eq!(grant.requests, served, "{text}");
    assert!(grant.input_tokens > 0 && grant.output_tokens > 0, "{text}");
    assert!(report.keys.keys().all(|id| !id.contains("developers")), "{text}");
}
