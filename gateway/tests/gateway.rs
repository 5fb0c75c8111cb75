//! The gateway over real sockets: a gateway and the mock upstream on
//! ephemeral loopback ports, in-process.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use serde_json::Value;
use support::{Fixture, FixtureOptions};
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY, DISABLED_KEY, EXPIRED_KEY, UPSTREAM_SECRET};

const CHAT: &str = r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#;

async fn fixture() -> Fixture {
    Fixture::start(FixtureOptions::default(), |_, _| {}).await
}

async fn list_models(fixture: &Fixture, key: &str) -> (StatusCode, http::HeaderMap, Bytes) {
    let request = Request::get(fixture.url("/v1/models"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    fixture.send(request).await
}

fn json_of(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn forwards_with_rewrite_injected_credential_and_request_id() {
    let fixture = fixture().await;
    let (status, headers, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json_of(&body)["object"], "chat.completion");
    let request_id = headers.get("x-request-id").expect("x-request-id on the response").clone();

    let seen = fixture.mock.recorder.last().await.unwrap();
    assert_eq!(seen.path, "/v1/chat/completions");
    assert_eq!(seen.json()["model"], "meta-llama/Llama-3.1-8B-Instruct", "model rewritten upstream");
    assert_eq!(seen.json()["messages"][0]["content"], "hi", "the rest of the body untouched");
    let upstream_auth = seen.headers.get("authorization").unwrap().to_str().unwrap();
    assert_eq!(upstream_auth, format!("Bearer {UPSTREAM_SECRET}"), "upstream credential injected");
    assert!(!format!("{:?}", seen.headers).contains(ALICE_KEY), "the client's key never goes upstream");
    assert_eq!(seen.headers.get("x-request-id"), Some(&request_id));

    // A client's own request id is propagated.
    let request =
        fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-request-id", "client-chosen-id")]);
    let (_, headers, _) = fixture.send(request).await;
    assert_eq!(headers.get("x-request-id").unwrap(), "client-chosen-id");
    assert_eq!(fixture.mock.recorder.last().await.unwrap().headers.get("x-request-id").unwrap(), "client-chosen-id");
}

#[tokio::test]
async fn the_six_workloads_and_the_other_endpoints_work() {
    let fixture = fixture().await;
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"model":"mistral-7b","messages":[{"role":"user","content":"hi"}]}"#,
            "chat.completion",
        ),
        ("/v1/responses", r#"{"model":"mistral-7b","input":"hi"}"#, "response"),
        (
            "/v1/messages",
            r#"{"model":"mistral-7b","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#,
            "message",
        ),
        ("/v1/completions", r#"{"model":"mistral-7b","prompt":"hi"}"#, "text_completion"),
        ("/v1/embeddings", r#"{"model":"embed-small","input":"hi"}"#, "list"),
    ];
    for (path, body, expected) in cases {
        let (status, _, response) = fixture.post(path, Some(ALICE_KEY), body).await;
        assert_eq!(status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&response));
        let value = json_of(&response);
        let kind = value["object"].as_str().or(value["type"].as_str()).unwrap_or_default().to_owned();
        assert_eq!(kind, expected, "{path}");

        if path == "/v1/completions" || path == "/v1/embeddings" {
            continue;
        }
        let streaming = body.replacen('{', r#"{"stream":true,"#, 1);
        let (status, headers, response) = fixture.post(path, Some(ALICE_KEY), &streaming).await;
        assert_eq!(status, StatusCode::OK, "{path} stream");
        assert_eq!(headers.get("content-type").unwrap(), "text/event-stream");
        let text = String::from_utf8_lossy(&response);
        assert!(text.contains("token0") && text.contains("token4"), "{path} stream: {text}");
    }

    // Anthropic clients send x-api-key.
    let request = Request::post(fixture.url("/v1/messages"))
        .header("x-api-key", ALICE_KEY)
        .header("anthropic-version", "2023-06-01")
        .body(Full::new(Bytes::from_static(br#"{"model":"mistral-7b","max_tokens":5,"messages":[]}"#)))
        .unwrap();
    let (status, _, _) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    let seen = fixture.mock.recorder.last().await.unwrap();
    assert_eq!(seen.headers.get("anthropic-version").unwrap(), "2023-06-01");
    assert!(seen.headers.get("x-api-key").is_none(), "the client's key never goes upstream");
}

#[tokio::test]
async fn models_lists_only_what_the_key_may_use() {
    let fixture = fixture().await;
    let list = |key: &'static str| list_models(&fixture, key);
    let (status, _, body) = list(ALICE_KEY).await;
    assert_eq!(status, StatusCode::OK);
    let value = json_of(&body);
    assert_eq!(value["object"], "list");
    let ids: Vec<&str> = value["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["llama-3.1-8b", "llama3", "mistral-7b", "embed-small"]);
    assert_eq!(value["data"][0]["object"], "model");
    let (_, _, body) = list(BOB_KEY).await;
    let ids: Vec<String> = json_of(&body)["data"].as_array().unwrap().iter().map(|m| m["id"].to_string()).collect();
    assert_eq!(ids, ["\"mistral-7b\""]);
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let fixture = fixture().await;
    let llama = CHAT;
    let cases: Vec<(&str, Option<&str>, String, u16, &str)> = vec![
        ("/v1/chat/completions", None, llama.into(), 401, "missing_api_key"),
        ("/v1/chat/completions", Some("wc_not_a_key"), llama.into(), 401, "invalid_api_key"),
        ("/v1/chat/completions", Some(EXPIRED_KEY), llama.into(), 401, "expired_api_key"),
        ("/v1/chat/completions", Some(DISABLED_KEY), llama.into(), 401, "disabled_api_key"),
        ("/v1/chat/completions", Some(BOB_KEY), llama.into(), 403, "model_not_allowed"),
        ("/v1/chat/completions", Some(ALICE_KEY), r#"{"model":"gpt-9"}"#.into(), 404, "model_not_found"),
        ("/v1/chat/completions", Some(ALICE_KEY), "{not json".into(), 400, "invalid_json"),
        ("/v1/chat/completions", Some(ALICE_KEY), "[1,2,3]".into(), 400, "invalid_body"),
        ("/v1/chat/completions", Some(ALICE_KEY), r#"{"messages":[]}"#.into(), 400, "missing_model"),
        ("/v1/chat/completions", Some(ALICE_KEY), r#"{"model":7}"#.into(), 400, "invalid_model"),
        ("/v1/chat/completions", Some(ALICE_KEY), r#"{"model":""}"#.into(), 400, "invalid_model"),
        ("/v1/chat/completions", Some(ALICE_KEY), r#"{"model":"llama3","stream":1}"#.into(), 400, "invalid_type"),
        ("/v1/chat/completions", Some(ALICE_KEY), r#"{"model":"llama3","stream":"true"}"#.into(), 400, "invalid_type"),
        (
            "/v1/chat/completions",
            Some(ALICE_KEY),
            r#"{"model":"llama3","stream":true,"stream_options":"x"}"#.into(),
            400,
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            Some(ALICE_KEY),
            format!("{{\"model\":\"llama3\",\"x\":{}{}}}", "[".repeat(50_000), "]".repeat(50_000)),
            400,
            "invalid_json",
        ),
        ("/v1/unknown", Some(ALICE_KEY), llama.into(), 404, "unknown_url"),
        (
            "/v1/chat/completions",
            Some(ALICE_KEY),
            format!(r#"{{"model":"llama3","pad":"{}"}}"#, "x".repeat(11 * 1024 * 1024)),
            413,
            "request_too_large",
        ),
    ];
    for (path, key, body, status, code) in cases {
        let (got, headers, response) = fixture.post(path, key, &body).await;
        let shown = String::from_utf8_lossy(&response[..response.len().min(300)]).into_owned();
        assert_eq!(got.as_u16(), status, "{code}: {shown}");
        assert_eq!(headers.get("content-type").unwrap(), "application/json", "{code}");
        let value = json_of(&response);
        assert_eq!(value["error"]["code"], code, "{shown}");
        assert!(value["error"]["message"].is_string() && value["error"]["type"].is_string(), "{shown}");
        assert!(!shown.contains(ALICE_KEY), "key material in an error");
    }
    let request = Request::get(fixture.url("/v1/chat/completions")).body(Full::new(Bytes::new())).unwrap();
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json_of(&body)["error"]["code"], "method_not_allowed");
}

#[tokio::test]
async fn upstream_errors_pass_through_unchanged_when_json() {
    let fixture = fixture().await;
    let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-status", "429")]);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(json_of(&body)["error"]["message"], "injected by x-mock-status", "the upstream's own body");
    // An HTML error page (a proxy in front of the upstream) becomes an
    // OpenAI-shaped error with the same status.
    let headers = [("x-mock-status", "502"), ("x-mock-html", "true")];
    let (status, headers, body) =
        fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &headers)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(headers.get("content-type").unwrap(), "application/json");
    let error = json_of(&body);
    assert_eq!(
        (error["error"]["code"].as_str(), error["error"]["type"].as_str()),
        (Some("upstream_error"), Some("server_error"))
    );
    assert!(!String::from_utf8_lossy(&body).contains("<html>"));
}

/// A Messages client (Claude Code, the Anthropic SDKs) gets the gateway's
/// own errors in Anthropic's shape, with the status and headers an OpenAI
/// client gets; the upstream's own JSON errors still pass through as sent.
#[tokio::test]
async fn messages_callers_get_anthropic_errors() {
    let fixture = fixture().await;
    let messages = r#"{"model":"llama3","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    /// Key, body, extra headers, the status and Anthropic's error type.
    type Case<'a> = (Option<&'a str>, &'a str, &'a [(&'static str, &'a str)], u16, &'a str);
    let cases: [Case<'_>; 7] = [
        (None, messages, &[], 401, "authentication_error"),
        (Some("wc_not_a_key"), messages, &[], 401, "authentication_error"),
        (Some(BOB_KEY), messages, &[], 403, "permission_error"),
        (Some(ALICE_KEY), r#"{"model":"claude-9","messages":[]}"#, &[], 404, "not_found_error"),
        (Some(ALICE_KEY), "{not json", &[], 400, "invalid_request_error"),
        (Some(ALICE_KEY), r#"{"model":"llama3","stream":1}"#, &[], 400, "invalid_request_error"),
        // A proxy's HTML page in front of the upstream.
        (Some(ALICE_KEY), messages, &[("x-mock-status", "502"), ("x-mock-html", "true")], 502, "api_error"),
    ];
    for (key, body, extra, status, kind) in cases {
        let (got, headers, response) = fixture.send(fixture.request("/v1/messages", key, body, extra)).await;
        let shown = String::from_utf8_lossy(&response).into_owned();
        assert_eq!(got.as_u16(), status, "{kind}: {shown}");
        assert_eq!(headers.get("content-type").unwrap(), "application/json", "{kind}");
        let value = json_of(&response);
        assert_eq!(value["type"], "error", "{shown}");
        assert_eq!(value["error"]["type"], kind, "{shown}");
        assert!(value["error"]["message"].is_string(), "{shown}");
        assert_eq!(value["error"].get("code"), None, "no OpenAI fields: {shown}");
        if status == 401 {
            assert_eq!(headers.get("www-authenticate").unwrap(), "Bearer");
        }
    }
    let request = Request::get(fixture.url("/v1/messages")).body(Full::new(Bytes::new())).unwrap();
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // OpenAI's type is the same word: `type` tells the dialects apart.
    let value = json_of(&body);
    assert_eq!(value["type"], "error", "{value}");
    assert_eq!(value["error"]["type"], "invalid_request_error", "{value}");
    // The upstream's own JSON error is its answer, untouched.
    let request = fixture.request("/v1/messages", Some(ALICE_KEY), messages, &[("x-mock-status", "429")]);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(json_of(&body)["error"]["message"], "injected by x-mock-status");
}

/// Only what an inference API reads goes upstream, plus what the model
/// forwards; the gateway sets X-Forwarded-For and -Proto itself.
#[tokio::test]
async fn headers_go_upstream_by_allow_list() {
    let fixture = fixture().await;
    let sent = [
        ("cookie", "session=secret"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-proto", "https"),
        ("api-key", "azure-key"),
        ("connection", "x-hop"),
        ("x-hop", "1"),
        ("accept-encoding", "gzip"),
        ("x-internal", "1"),
        ("openai-beta", "assistants=v2"),
        ("x-stainless-lang", "python"),
        ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("x-mock-chunks", "1"),
        ("openai-organization", "org-client"),
        ("openai-project", "proj-client"),
        ("anthropic-beta", "context-1m-2025-08-07"),
        ("x-gateway-inference-fairness-id", "someone-else"),
        ("x-llm-d-inference-objective", "critical"),
    ];
    let (status, _, _) = fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &sent)).await;
    assert_eq!(status, StatusCode::OK);
    let seen = fixture.mock.recorder.last().await.unwrap().headers;
    for gone in [
        "cookie",
        "api-key",
        "x-hop",
        "accept-encoding",
        "x-internal",
        "openai-organization",
        "openai-project",
        "anthropic-beta",
        "x-gateway-inference-fairness-id",
        "x-llm-d-inference-objective",
    ] {
        assert!(seen.get(gone).is_none(), "{gone} reached the upstream");
    }
    for kept in ["openai-beta", "x-stainless-lang", "traceparent", "x-mock-chunks", "content-type"] {
        assert!(seen.get(kept).is_some(), "{kept} did not reach the upstream");
    }
    assert_eq!(seen.get("x-forwarded-for").unwrap(), "127.0.0.1", "the gateway's own, not the client's");
    assert_eq!(seen.get("x-forwarded-proto").unwrap(), "http");
}

/// A header that chooses what the provider bills goes up only when the
/// model names it; the endpoint picker's never, whatever the model forwards.
#[tokio::test]
async fn billing_headers_go_upstream_only_when_the_model_forwards_them() {
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        for model in &mut config.models {
            model.forward_headers = vec!["openai-project".into(), "x-llm-d-*".into(), "x-gateway-*".into()];
        }
    })
    .await;
    let sent = [
        ("openai-organization", "org-client"),
        ("openai-project", "proj-client"),
        ("x-llm-d-inference-fairness-id", "someone-else"),
        ("x-gateway-inference-objective", "critical"),
    ];
    let (status, _, _) = fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &sent)).await;
    assert_eq!(status, StatusCode::OK);
    let seen = fixture.mock.recorder.last().await.unwrap().headers;
    assert_eq!(seen.get("openai-project").unwrap(), "proj-client", "listed by the model");
    for gone in ["openai-organization", "x-llm-d-inference-fairness-id", "x-gateway-inference-objective"] {
        assert!(seen.get(gone).is_none(), "{gone} reached the upstream");
    }
}

#[tokio::test]
async fn streaming_delivers_the_first_chunk_while_the_upstream_holds_the_rest() {
    let fixture = fixture().await;
    let request = fixture.request(
        "/v1/chat/completions",
        Some(ALICE_KEY),
        r#"{"model":"mistral-7b","stream":true,"messages":[]}"#,
        &[("x-mock-chunks", "3"), ("x-mock-interval-ms", "2000")],
    );
    let started = Instant::now();
    let response = fixture.open(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let waited = started.elapsed();
    assert!(String::from_utf8_lossy(&first).contains("token0"), "{first:?}");
    assert!(waited < Duration::from_millis(1500), "first chunk took {waited:?}: the relay buffered");
    assert_eq!(
        fixture.mock.recorder.streams_completed.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the upstream was still holding back the rest"
    );
    // The rest follows, one frame per upstream chunk.
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(String::from_utf8_lossy(&second).contains("token1"), "{second:?}");
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_the_upstream() {
    let fixture = fixture().await;
    let request = fixture.request(
        "/v1/chat/completions",
        Some(ALICE_KEY),
        r#"{"model":"mistral-7b","stream":true,"messages":[]}"#,
        &[("x-mock-chunks", "100"), ("x-mock-interval-ms", "100")],
    );
    let response = fixture.open(request).await;
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    let recorder = &fixture.mock.recorder;
    let deadline = Instant::now() + Duration::from_secs(3);
    while recorder.streams_cancelled.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the upstream stream was not cancelled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... and the gateway recorded it as a client-closed request, not in flight.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let inflight = fixture.metric("waycast_gateway_inflight_requests").await;
        let closed =
            fixture.metric(r#"waycast_gateway_requests_total{code="499",key="team-a/alice",model="mistral-7b"}"#).await;
        if inflight == Some(0.0) && closed == Some(1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "inflight {inflight:?}, 499s {closed:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The data plane's share of tenancy: a model shared only with team-a's
/// keys is, to team-b's key, a model that does not exist (in `/v1/models`
/// too); a base URL's query goes with every request, and of the client's
/// only the parameters the model forwards; a backend host that resolves
/// into a closed range it was not opened for gets a 502 `egress_denied`.
#[tokio::test]
async fn key_visibility_base_url_queries_and_the_egress_guard() {
    let fixture = Fixture::start(FixtureOptions::default(), |config, upstream| {
        config.models[0].key_namespaces = Some(vec!["team-a".into()]);
        config.models[1].backends[0].url = format!("{upstream}?api-version=2024-06-01");
        config.models[1].forward_query_parameters = vec!["trace".into()];
        config.models[2].backends[0].url = upstream.replace("127.0.0.1", "localhost");
        // Loopback closed, and opened for the address the other models use.
        config.settings.closed_cidrs = vec!["127.0.0.0/8".into(), "::1/128".into()];
        config.settings.allowed_hosts = vec!["127.0.0.1".into()];
        config.keys[1].models = None;
    })
    .await;
    // bob (team-b) may not see llama: 404, exactly as for an unknown model.
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(BOB_KEY), CHAT).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, _, unknown) = fixture.post("/v1/chat/completions", Some(BOB_KEY), r#"{"model":"llama-9"}"#).await;
    assert_eq!(json_of(&body)["error"]["code"], json_of(&unknown)["error"]["code"]);
    assert_eq!(json_of(&body)["error"]["type"], json_of(&unknown)["error"]["type"]);
    let (_, _, models) = list_models(&fixture, BOB_KEY).await;
    let ids: Vec<String> = json_of(&models)["data"].as_array().unwrap().iter().map(|m| m["id"].to_string()).collect();
    assert_eq!(ids, ["\"mistral-7b\"", "\"embed-small\""]);
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK, "team-a's own key sees it");

    // The base URL's query, then the client's forwarded parameter, reach
    // the upstream; the client's other parameters do not.
    let request = fixture.request(
        "/v1/chat/completions?trace=1&target=http://elsewhere",
        Some(BOB_KEY),
        r#"{"model":"mistral-7b","messages":[]}"#,
        &[],
    );
    let (status, _, _) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fixture.mock.recorder.last().await.unwrap().path, "/v1/chat/completions?api-version=2024-06-01&trace=1");

    // localhost resolves only into the closed ranges: refused at connect.
    let before = fixture.mock.recorder.requests().await.len();
    let (status, _, body) =
        fixture.post("/v1/embeddings", Some(BOB_KEY), r#"{"model":"embed-small","input":"hi"}"#).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json_of(&body)["error"]["code"], "egress_denied");
    assert_eq!(fixture.mock.recorder.requests().await.len(), before, "nothing reached the upstream");
    let denied =
        fixture.metric(r#"waycast_gateway_upstream_errors_total{model="embed-small",reason="egress_denied"}"#).await;
    assert_eq!(denied, Some(1.0));
}

/// The binary's layout (two workers in the fixture): new connections are
/// spread over the workers' listeners, and each worker reaches the upstream
/// through its own pool — sequential requests on fresh client connections
/// open an upstream connection per worker, where one shared pool would
/// reuse a single one.
#[tokio::test]
async fn each_worker_has_its_own_listener_and_upstream_pool() {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let fixture = fixture().await;
    let before = fixture.mock.recorder.connections.load(Ordering::Relaxed);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {ALICE_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{CHAT}",
        CHAT.len()
    );
    for turn in 0..64 {
        let mut stream = tokio::net::TcpStream::connect(fixture.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"), "request {turn}: {}", String::from_utf8_lossy(&answer));
    }
    let upstream = fixture.mock.recorder.connections.load(Ordering::Relaxed) - before;
    // Both listeners got some of 64 connections (all on one: 2 in 2^64).
    assert!((2..=8).contains(&upstream), "{upstream} upstream connections for 64 sequential requests");
}

/// Refused before its body is read — a bad key, a body declared too large —
/// while the client is still sending it, the client reads the answer: the
/// gateway reads and throws away the rest of the body (up to 16 MiB, 2 s)
/// rather than close a connection with unread data, which resets it under
/// the client. The keep-alive connection then serves the next request.
#[tokio::test]
async fn a_refusal_reaches_a_client_still_sending_its_body() {
    let fixture = fixture().await;
    let large = format!(r#"{{"model":"llama3","pad":"{}"}}"#, "x".repeat(4 * 1024 * 1024));
    for turn in 0..3 {
        let (status, _, body) = fixture.post("/v1/chat/completions", Some("wc_not_a_key"), &large).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "turn {turn}");
        assert_eq!(json_of(&body)["error"]["code"], "invalid_api_key");
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
        assert_eq!(status, StatusCode::OK, "turn {turn}");
    }
    let too_large = format!(r#"{{"model":"llama3","pad":"{}"}}"#, "x".repeat(12 * 1024 * 1024));
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &too_large).await;
    assert_eq!(
        (status, json_of(&body)["error"]["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("request_too_large"))
    );
}
