//! The calls beside chat (`/v1/messages/count_tokens`, `/v1/rerank`,
//! `/v1/score`, `/tokenize`, `/detokenize`, `/v1/moderations`) through a
//! real gateway in front of the mock: each reaches its place on the
//! backend with the key's access and request limits checked and refusals
//! in its dialect; the tokenizers' calls are never charged tokens, the
//! others are charged what their answer reports.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use http::StatusCode;
use serde_json::{Value, json};
use support::{Fixture, FixtureOptions};
use waycast_crds::config::LimitsConfig;
use waycast_crds::usage::UsageReport;
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY};

/// Each call: its path, a body naming `model`, and whether it is Anthropic's.
fn calls(model: &str, prompt: &str) -> Vec<(&'static str, String, bool)> {
    vec![
        (
            "/v1/messages/count_tokens",
            json!({"model": model, "messages": [{"role": "user", "content": prompt}]}).to_string(),
            true,
        ),
        ("/v1/rerank", json!({"model": model, "query": prompt, "documents": ["a", "b"]}).to_string(), false),
        ("/v1/score", json!({"model": model, "text_1": prompt, "text_2": "b"}).to_string(), false),
        ("/tokenize", json!({"model": model, "prompt": prompt}).to_string(), false),
        ("/detokenize", json!({"model": model, "tokens": [1, 2, 3]}).to_string(), false),
        ("/v1/moderations", json!({"model": model, "input": prompt}).to_string(), false),
    ]
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)))
}

/// The code of a refusal in the caller's dialect (Anthropic's
/// `{"type":"error","error":{"type":…}}`, OpenAI's `{"error":{"code":…}}`).
fn refusal(body: &[u8], anthropic: bool) -> String {
    let body = json_of(body);
    if anthropic {
        assert_eq!(body["type"], "error", "{body}");
        body["error"]["type"].as_str().unwrap_or_default().to_owned()
    } else {
        body["error"]["code"].as_str().unwrap_or_default().to_owned()
    }
}

#[tokio::test]
async fn every_call_beside_chat_reaches_its_place_with_the_keys_access_checked() {
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    for (path, body, anthropic) in calls("llama-3.1-8b", "hello") {
        let (status, _, answer) = fixture.post(path, Some(ALICE_KEY), &body).await;
        assert_eq!(status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&answer));
        let received = fixture.mock.recorder.requests().await;
        let last = received.last().unwrap();
        // The tokenizers are at the server's root (the backend's base URL
        // is `…/v1`); the rest under it, as chat.
        assert_eq!(last.path, path, "{path} reached the backend at {}", last.path);
        // The backend's own model name, as for chat.
        assert_eq!(json_of(&last.body)["model"], "meta-llama/Llama-3.1-8B-Instruct", "{path}");

        // No key, a model the key may not use, no model: refused before the
        // backend, each in the call's dialect.
        let (status, _, answer) = fixture.post(path, None, &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        let expected = if anthropic { "authentication_error" } else { "missing_api_key" };
        assert_eq!(refusal(&answer, anthropic), expected, "{path}");
        let (status, _, answer) = fixture.post(path, Some(BOB_KEY), &body).await;
        let chat = json!({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hello"}]}).to_string();
        let (chats, _, _) = fixture.post("/v1/chat/completions", Some(BOB_KEY), &chat).await;
        assert!(status.is_client_error(), "{path}: {status}");
        assert_eq!(status, chats, "{path}: refused as chat is: {}", String::from_utf8_lossy(&answer));
        let no_model = json!({"prompt": "hello"}).to_string();
        let (status, _, answer) = fixture.post(path, Some(ALICE_KEY), &no_model).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        let expected = if anthropic { "invalid_request_error" } else { "missing_model" };
        assert_eq!(refusal(&answer, anthropic), expected, "{path}");
        assert_eq!(
            fixture.mock.recorder.requests().await.len(),
            received.len(),
            "{path}: a refusal reached the backend"
        );
    }
    // A GET is not one of them.
    let request = http::Request::get(fixture.url("/tokenize"))
        .header("authorization", format!("Bearer {ALICE_KEY}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(fixture.send(request).await.0, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn the_tokenizers_calls_are_never_charged_tokens_and_the_others_are() {
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        let alice = config.keys.iter_mut().find(|key| key.id == "team-a/alice").unwrap();
        alice.limits = Some(LimitsConfig { requests_per_minute: Some(9), ..LimitsConfig::default() });
    })
    .await;
    let prompt = "x".repeat(2_000);
    let model_calls = calls("llama-3.1-8b", &prompt);
    let free = ["/v1/messages/count_tokens", "/tokenize", "/detokenize"];
    for (path, body, _) in model_calls.iter().filter(|(path, _, _)| free.contains(path)) {
        let (status, _, answer) = fixture.post(path, Some(ALICE_KEY), body).await;
        assert_eq!(status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&answer));
    }
    let used = async || {
        let (status, text) = fixture.admin_get("/usage").await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let report: UsageReport = serde_json::from_str(&text).unwrap();
        report.keys.get("team-a/alice").copied().unwrap_or_default()
    };
    let counted = used().await;
    // Three requests counted, no token: the tokenizer answered a `usage`
    // of some 500 prompt tokens (the mock says so on purpose).
    assert_eq!((counted.requests, counted.input_tokens, counted.output_tokens), (3, 0, 0), "{counted:?}");
    let (path, body, _) = model_calls.iter().find(|(path, _, _)| *path == "/v1/rerank").unwrap();
    assert_eq!(fixture.post(path, Some(ALICE_KEY), body).await.0, StatusCode::OK);
    // A report is taken at most once a second: the next one counts it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut counted = used().await;
    while counted.requests < 4 {
        assert!(std::time::Instant::now() < deadline, "the rerank was never counted: {counted:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        counted = used().await;
    }
    assert_eq!(counted.requests, 4);
    assert!(counted.input_tokens >= 500, "rerank is charged its answer's usage: {counted:?}");
    // Each call counts against the key's request rate, as chat does.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(fixture.post("/tokenize", Some(ALICE_KEY), &model_calls[3].1).await.0);
    }
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 5, "{statuses:?}");
    assert_eq!(statuses.last(), Some(&StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
}
