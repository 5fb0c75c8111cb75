//! Clients of one dialect on backends of the other, through a real gateway
//! in front of the mock: a Messages client on a chat-only backend
//! (`format: OpenAIChat`), an OpenAI chat client on an Anthropic-format
//! backend, whole and streamed, with tools; the token count asked of the
//! backend's tokenizer (or estimated without one); what a backend does not
//! serve refused in the caller's dialect; the usage the backend reported
//! charged exactly.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use http::StatusCode;
use serde_json::{Value, json};
use support::{Fixture, FixtureOptions};
use waycast_crds::backend::BackendFormat;
use waycast_crds::usage::UsageReport;
use waycast_mock::fixtures::ALICE_KEY;

/// The mock as a chat-only backend (`chat-only`) and as an
/// Anthropic-format one (`claude`), beside the fixture's own models.
async fn fixture() -> Fixture {
    fixture_with(FixtureOptions::default()).await
}

async fn fixture_with(options: FixtureOptions) -> Fixture {
    Fixture::start(options, |config, _| {
        let llama = config.models.iter().find(|model| model.name == "llama-3.1-8b").unwrap().clone();
        for (name, format) in [("chat-only", BackendFormat::OpenAIChat), ("claude", BackendFormat::Anthropic)] {
            let mut model = llama.clone();
            model.name = name.into();
            model.aliases = Vec::new();
            model.backends[0].format = format;
            config.models.push(model);
        }
    })
    .await
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)))
}

/// The `data:` payloads of an event stream, parsed (`[DONE]` as a string).
fn payloads(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_owned())))
        .collect()
}

async fn last_received(fixture: &Fixture) -> waycast_mock::upstream::Received {
    fixture.mock.recorder.requests().await.pop().unwrap()
}

const BASH: &str = r#"{"name":"Bash","description":"runs a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}"#;

#[tokio::test]
async fn a_messages_client_is_served_by_a_chat_only_backend() {
    let fixture = fixture().await;
    let ask = |stream: bool, tools: bool| {
        let mut body = json!({"model": "chat-only", "max_tokens": 64, "system": "be brief", "stream": stream,
            "messages": [{"role": "user", "content": "list the files"}]});
        if tools {
            body["tools"] = json!([serde_json::from_str::<Value>(BASH).unwrap()]);
        }
        body.to_string()
    };

    // Whole: the backend is asked chat completions, the client gets a message.
    let (status, _, body) = fixture.post("/v1/messages", Some(ALICE_KEY), &ask(false, false)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let message = json_of(&body);
    assert_eq!(
        (&message["type"], &message["role"], &message["content"][0]["type"]),
        (&json!("message"), &json!("assistant"), &json!("text"))
    );
    assert_eq!(message["stop_reason"], "end_turn");
    let sent = last_received(&fixture).await;
    assert_eq!(sent.path, "/v1/chat/completions");
    let sent_body = json_of(&sent.body);
    assert_eq!(sent_body["model"], "meta-llama/Llama-3.1-8B-Instruct", "the backend's own model name");
    assert_eq!(sent_body["messages"][0], json!({"role": "system", "content": "be brief"}));
    assert_eq!(message["usage"]["input_tokens"], sent.body.len() / 4, "the backend's count, translated");

    // Streamed: Anthropic's events in Anthropic's order, from chat chunks.
    let (status, headers, body) = fixture.post("/v1/messages", Some(ALICE_KEY), &ask(true, false)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[http::header::CONTENT_TYPE].to_str().unwrap().starts_with("text/event-stream"));
    let events = payloads(&body);
    let kinds: Vec<&str> = events.iter().map(|event| event["type"].as_str().unwrap_or("?")).collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{kinds:?}");
    assert_eq!(&kinds[kinds.len() - 2..], ["message_delta", "message_stop"], "{kinds:?}");
    assert!(kinds.contains(&"content_block_delta"));
    let sent = json_of(&last_received(&fixture).await.body);
    assert_eq!(sent["stream_options"], json!({"include_usage": true}), "a Messages stream carries usage");

    // A tool call, whole and streamed: tool_use blocks with the input.
    let (_, _, body) = fixture.post("/v1/messages", Some(ALICE_KEY), &ask(false, true)).await;
    let message = json_of(&body);
    assert_eq!(message["stop_reason"], "tool_use", "{message}");
    assert_eq!(message["content"][0]["name"], "Bash");
    assert_eq!(message["content"][0]["input"], json!({"command": "mock"}));
    assert_eq!(json_of(&last_received(&fixture).await.body)["tools"][0]["function"]["name"], "Bash");
    let (_, _, body) = fixture.post("/v1/messages", Some(ALICE_KEY), &ask(true, true)).await;
    let events = payloads(&body);
    let started = events.iter().find(|event| event["type"] == "content_block_start").unwrap();
    assert_eq!(started["content_block"]["type"], "tool_use", "{events:?}");
    let input: String = events
        .iter()
        .filter(|event| event["delta"]["type"] == "input_json_delta")
        .map(|event| event["delta"]["partial_json"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(json_of(input.as_bytes()), json!({"command": "mock"}));
    let delta = events.iter().find(|event| event["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");

    // The tool's result goes back as a tool message; the model answers text.
    let turn = json!({"model": "chat-only", "max_tokens": 64, "tools": [serde_json::from_str::<Value>(BASH).unwrap()],
        "messages": [{"role": "user", "content": "list the files"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}]});
    let (status, _, body) = fixture.post("/v1/messages", Some(ALICE_KEY), &turn.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body)["content"][0]["type"], "text");
    let sent = json_of(&last_received(&fixture).await.body);
    assert_eq!(sent["messages"][2], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"}));
}

#[tokio::test]
async fn a_chat_client_is_served_by_an_anthropic_backend() {
    let fixture = fixture().await;
    let ask = |stream: bool, tools: bool| {
        let mut body = json!({"model": "claude", "stream": stream,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if tools {
            body["tools"] = json!([{"type": "function", "function": {"name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]);
        }
        body.to_string()
    };
    let (status, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &ask(false, false)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let completion = json_of(&body);
    assert_eq!(completion["object"], "chat.completion");
    assert!(completion["choices"][0]["message"]["content"].as_str().unwrap().starts_with("token0"));
    let sent = last_received(&fixture).await;
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01", "the version a chat client never sends");
    let sent_body = json_of(&sent.body);
    assert_eq!(sent_body["system"], json!([{"type": "text", "text": "be brief"}]));
    assert_eq!(sent_body["max_tokens"], 4096, "Anthropic requires one");

    let (status, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &ask(true, false)).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = payloads(&body);
    assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    let usage = chunks.iter().find(|chunk| chunk["usage"].is_object()).unwrap();
    assert_eq!(usage["choices"], json!([]), "the usage chunk the client asked for");
    assert!(usage["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    let (_, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &ask(false, true)).await;
    let completion = json_of(&body);
    assert_eq!(completion["choices"][0]["finish_reason"], "tool_calls", "{completion}");
    let call = &completion["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(
        (&call["function"]["name"], json_of(call["function"]["arguments"].as_str().unwrap().as_bytes())),
        (&json!("lookup"), json!({"q": "mock"}))
    );
    let (_, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &ask(true, true)).await;
    let chunks = payloads(&body);
    let arguments: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(json_of(arguments.as_bytes()), json!({"q": "mock"}), "{chunks:?}");

    // What an Anthropic backend does not serve is refused, in OpenAI's shape.
    let embed = json!({"model": "claude", "input": "x"}).to_string();
    let before = fixture.mock.recorder.requests().await.len();
    let (status, _, body) = fixture.post("/v1/embeddings", Some(ALICE_KEY), &embed).await;
    assert_eq!((status, &json_of(&body)["error"]["code"]), (StatusCode::NOT_FOUND, &json!("unsupported_endpoint")));
    assert_eq!(fixture.mock.recorder.requests().await.len(), before, "never sent");
}

#[tokio::test]
async fn counts_refusals_and_errors_are_in_the_callers_dialect() {
    let fixture = fixture().await;
    let count =
        json!({"model": "chat-only", "messages": [{"role": "user", "content": "how long is this?"}]}).to_string();
    let (status, _, body) = fixture.post("/v1/messages/count_tokens", Some(ALICE_KEY), &count).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let sent = last_received(&fixture).await;
    assert_eq!(sent.path, "/tokenize", "asked of the backend's tokenizer");
    assert_eq!(json_of(&sent.body)["messages"], json!([{"role": "user", "content": "how long is this?"}]));
    assert_eq!(json_of(&body), json!({"input_tokens": sent.body.len() / 4}));
    // A backend without a tokenizer: an estimate, labelled.
    let request = fixture.request("/v1/messages/count_tokens", Some(ALICE_KEY), &count, &[("x-mock-status", "404")]);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body)["waycast_estimate"], true);
    // Any other failure of the tokenizer is the client's to see, not an estimate.
    let request = fixture.request("/v1/messages/count_tokens", Some(ALICE_KEY), &count, &[("x-mock-status", "401")]);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!((status, &json_of(&body)["error"]["type"]), (StatusCode::UNAUTHORIZED, &json!("authentication_error")));

    // A field with no counterpart: a 400 naming it, in Anthropic's shape, never sent.
    let before = fixture.mock.recorder.requests().await.len();
    let server_tool = json!({"model": "chat-only", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    let (status, _, body) = fixture.post("/v1/messages", Some(ALICE_KEY), &server_tool.to_string()).await;
    let refusal = json_of(&body);
    assert_eq!(
        (status, &refusal["type"], &refusal["error"]["type"]),
        (StatusCode::BAD_REQUEST, &json!("error"), &json!("invalid_request_error"))
    );
    assert!(refusal["error"]["message"].as_str().unwrap().contains("tools[0]"), "{refusal}");
    assert_eq!(fixture.mock.recorder.requests().await.len(), before, "never sent");

    // /v1/responses has no chat-only counterpart: refused.
    let responses = json!({"model": "chat-only", "input": "x"}).to_string();
    let (status, _, body) = fixture.post("/v1/responses", Some(ALICE_KEY), &responses).await;
    assert_eq!((status, &json_of(&body)["error"]["code"]), (StatusCode::NOT_FOUND, &json!("unsupported_endpoint")));

    // The backend's own error, in the caller's shape with its status.
    let ask =
        json!({"model": "chat-only", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let request = fixture.request("/v1/messages", Some(ALICE_KEY), &ask, &[("x-mock-status", "429")]);
    let (status, _, body) = fixture.send(request).await;
    let error = json_of(&body);
    assert_eq!(
        (status, &error["type"], &error["error"]["type"]),
        (StatusCode::TOO_MANY_REQUESTS, &json!("error"), &json!("rate_limit_error"))
    );
    assert_eq!(error["error"]["message"], "injected by x-mock-status");
}

/// A translated request is charged what the backend reported, as a native
/// one is: the key's month counts the backend's own numbers.
#[tokio::test]
async fn a_translated_request_is_charged_what_the_backend_reported() {
    let fixture = fixture().await;
    let used = async || {
        let (_, text) = fixture.admin_get("/usage").await;
        let report: UsageReport = serde_json::from_str(&text).unwrap();
        report.keys.get("team-a/alice").copied().unwrap_or_default()
    };
    let mut expected = (0, 0);
    let asks = [
        (
            "/v1/messages",
            json!({"model": "chat-only", "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": "a stream"}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "chat-only", "max_tokens": 64, "messages": [{"role": "user", "content": "a whole answer"}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "claude", "stream": true, "messages": [{"role": "user", "content": "a stream"}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "llama-3.1-8b", "max_tokens": 64, "messages": [{"role": "user", "content": "native"}]}),
        ),
    ];
    for (path, body) in asks {
        let (status, _, answer) = fixture.post(path, Some(ALICE_KEY), &body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&answer));
        let sent = last_received(&fixture).await;
        // The mock reports a quarter of the body it got as prompt tokens,
        // and one token per chunk (its default, 5) as output.
        expected = (expected.0 + sent.body.len() as u64 / 4, expected.1 + 5);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut counted = used().await;
    while counted.requests < 4 {
        assert!(std::time::Instant::now() < deadline, "never counted: {counted:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        counted = used().await;
    }
    assert_eq!((counted.input_tokens, counted.output_tokens), expected, "{counted:?}");

    // An answer the backend generated whole but that cannot be translated
    // (a call whose arguments are not JSON) is the client's 502, and still
    // charged what the backend reported.
    let broken = json!({"model": "chat-only", "max_tokens": 64, "tools": [serde_json::from_str::<Value>(BASH).unwrap()],
        "messages": [{"role": "user", "content": "x"}]});
    let request =
        fixture.request("/v1/messages", Some(ALICE_KEY), &broken.to_string(), &[("x-mock-tool-arguments", "{\"comm")]);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(
        (status, &json_of(&body)["type"]),
        (StatusCode::BAD_GATEWAY, &json!("error")),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let sent = last_received(&fixture).await;
    expected = (expected.0 + sent.body.len() as u64 / 4, expected.1 + 5);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while counted.requests < 5 {
        assert!(std::time::Instant::now() < deadline, "never counted: {counted:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        counted = used().await;
    }
    assert_eq!((counted.input_tokens, counted.output_tokens), expected, "{counted:?}");
}

/// The official Anthropic and OpenAI Python SDKs, unchanged, through
/// translation both ways: whole, streamed (with the SDKs' own stream
/// accumulators), tools, a tool round trip, `count_tokens`, a refusal.
#[tokio::test]
async fn the_official_sdks_work_through_translation() {
    use std::process::Command;
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let setup = Command::new("bash").arg(tests.join("python-env.sh")).output().unwrap();
    assert!(setup.status.success(), "python env setup failed: {}", String::from_utf8_lossy(&setup.stderr));
    let python = String::from_utf8(setup.stdout).unwrap().trim().to_owned();
    let fixture = fixture().await;
    let base_url = fixture.url("");
    let base_url = base_url.trim_end_matches('/').to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).arg(tests.join("dialect_sdks.py")).args([&base_url, ALICE_KEY]).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "SDK checks failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for check in [
        "anthropic messages.create ok",
        "anthropic messages.stream ok",
        "anthropic tool round trip ok",
        "anthropic count_tokens ok",
        "anthropic untranslatable error ok",
        "openai chat on messages ok",
        "openai streamed chat on messages ok",
        "openai tool calls on messages ok",
    ] {
        assert!(stdout.contains(check), "missing {check:?} in:\n{stdout}");
    }
}

/// Claude Code itself, run non-interactively against a chat-only backend:
/// it completes a turn that uses a tool (the mock calls `Glob`, Claude Code
/// runs it and sends the result back), and no call of its gets a 404.
#[tokio::test]
async fn claude_code_completes_a_tool_using_turn_on_a_chat_only_backend() {
    use std::process::Command;
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let setup = Command::new("bash").arg(tests.join("claude-code-env.sh")).output().unwrap();
    assert!(setup.status.success(), "Claude Code setup failed: {}", String::from_utf8_lossy(&setup.stderr));
    let cli = String::from_utf8(setup.stdout).unwrap().trim().to_owned();
    let mut options = FixtureOptions::default();
    options.mock.preferred_tool = Some("Glob".into());
    let fixture = fixture_with(options).await;
    let home = waycast_mock::fixtures::temp_dir("claude-home");
    let base_url = fixture.url("");
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(cli)
            .args(["-p", "Which files are here? Use a tool.", "--model", "chat-only", "--output-format", "json"])
            .current_dir(&home)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("ANTHROPIC_BASE_URL", base_url)
            .env("ANTHROPIC_API_KEY", ALICE_KEY)
            .env("ANTHROPIC_SMALL_FAST_MODEL", "chat-only")
            .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", "chat-only")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let received = fixture.mock.recorder.requests().await;
    let paths: Vec<&str> = received.iter().map(|request| request.path.as_str()).collect();
    assert!(
        output.status.success(),
        "Claude Code failed:\n{stdout}\n{}\nthe backend got {paths:?}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result = json_of(stdout.trim().as_bytes());
    assert_eq!(result["is_error"], false, "{result}");
    assert!(result["result"].as_str().unwrap_or_default().contains("token0"), "{result}");
    // The tool was called and its result sent back to the model.
    let answered_tool = received.iter().any(|request| {
        request.path == "/v1/chat/completions"
            && json_of(&request.body)["messages"]
                .as_array()
                .is_some_and(|messages| messages.iter().any(|message| message["role"] == "tool"))
    });
    assert!(answered_tool, "no tool result reached the backend: {paths:?}");
    assert!(paths.iter().all(|path| ["/v1/chat/completions", "/tokenize"].contains(path)), "{paths:?}");
    // Every call Claude Code made was served: none refused by the gateway.
    let (_, metrics) = fixture.admin_get("/metrics").await;
    let served: Vec<&str> =
        metrics.lines().filter(|line| line.starts_with("waycast_gateway_requests_total{")).collect();
    assert!(!served.is_empty(), "{metrics}");
    assert!(served.iter().all(|line| line.contains("code=\"200\"")), "{served:?}");
}

/// A model whose first backend speaks Anthropic and second OpenAI: a path
/// the first does not serve always goes to the second.
#[tokio::test]
async fn a_path_one_backend_does_not_serve_goes_to_another() {
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        let mut mixed = config.models.iter().find(|model| model.name == "llama-3.1-8b").unwrap().clone();
        mixed.name = "mixed".into();
        mixed.aliases = Vec::new();
        let mut anthropic = mixed.backends[0].clone();
        anthropic.format = BackendFormat::Anthropic;
        anthropic.model = Some("anthropic-side".into());
        mixed.backends[0].model = Some("openai-side".into());
        mixed.backends.insert(0, anthropic);
        config.models.push(mixed);
    })
    .await;
    let embed = json!({"model": "mixed", "input": "x"}).to_string();
    for _ in 0..4 {
        assert_eq!(fixture.post("/v1/embeddings", Some(ALICE_KEY), &embed).await.0, StatusCode::OK);
        assert_eq!(json_of(&last_received(&fixture).await.body)["model"], "openai-side");
    }
}

/// A backend that stops mid-answer: a translated stream ends with an error
/// event in the client's dialect; a whole answer cut short is the client's
/// 502 and charged as unfinished (its output bound), as the backend may
/// have generated it all.
#[tokio::test]
async fn an_answer_cut_short_ends_in_the_clients_dialect_and_is_charged() {
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        let mut model = config.models.iter().find(|model| model.name == "llama-3.1-8b").unwrap().clone();
        model.name = "chat-only".into();
        model.aliases = Vec::new();
        model.backends[0].format = BackendFormat::OpenAIChat;
        model.timeouts.idle = std::time::Duration::from_millis(500);
        config.models.push(model);
    })
    .await;
    let ask = |stream: bool| {
        json!({"model": "chat-only", "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": "x"}]})
            .to_string()
    };
    let request = fixture.request("/v1/messages", Some(ALICE_KEY), &ask(true), &[("x-mock-stall", "usage")]);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    let events = payloads(&body);
    assert_eq!(events.last().unwrap()["type"], "error", "{events:?}");

    let used = async || {
        let (_, text) = fixture.admin_get("/usage").await;
        let report: UsageReport = serde_json::from_str(&text).unwrap();
        report.keys.get("team-a/alice").copied().unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut before = used().await;
    while before.requests < 1 {
        assert!(std::time::Instant::now() < deadline, "never counted: {before:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        before = used().await;
    }
    let stalled = [("x-mock-chunked", "true"), ("x-mock-stall", "body")];
    let (status, _, body) = fixture.send(fixture.request("/v1/messages", Some(ALICE_KEY), &ask(false), &stalled)).await;
    assert_eq!((status, &json_of(&body)["type"]), (StatusCode::BAD_GATEWAY, &json!("error")));
    let mut after = used().await;
    while after.requests < 2 {
        assert!(std::time::Instant::now() < deadline, "never counted: {after:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        after = used().await;
    }
    assert!(after.output_tokens >= before.output_tokens + 64, "charged its output bound: {before:?} → {after:?}");
}

/// What a backend sends beyond the translation's bounds ends in the
/// caller's dialect: an error answer up to 64 KiB is translated (its
/// message kept), a longer one is a 502; a stream event over 1 MiB ends
/// the client's stream with an error event and is counted as the
/// backend's fault.
#[tokio::test]
async fn a_backend_past_the_translations_bounds_ends_in_the_clients_dialect() {
    let fixture = fixture().await;
    let ask = |stream: bool| {
        json!({"model": "chat-only", "max_tokens": 5, "stream": stream, "messages": [{"role": "user", "content": "x"}]})
            .to_string()
    };
    let error_of = async |bytes: &str| {
        let padded = [("x-mock-status", "400"), ("x-mock-error-bytes", bytes)];
        let (status, _, body) =
            fixture.send(fixture.request("/v1/messages", Some(ALICE_KEY), &ask(false), &padded)).await;
        (status, json_of(&body))
    };
    let (status, within) = error_of("60000").await;
    assert_eq!((status, &within["type"]), (StatusCode::BAD_REQUEST, &json!("error")), "{within}");
    assert!(within["error"]["message"].as_str().unwrap().starts_with("injected by x-mock-status"), "{within}");
    let (status, past) = error_of("70000").await;
    assert_eq!((status, &past["type"]), (StatusCode::BAD_GATEWAY, &json!("error")), "{past}");

    let long_event = [("x-mock-event-bytes", "1100000")];
    let request = fixture.request("/v1/messages", Some(ALICE_KEY), &ask(true), &long_event);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    let events = payloads(&body);
    assert_eq!(events.last().unwrap()["type"], "error", "{:?}", &events[events.len().saturating_sub(2)..]);
    assert!(body.len() < 100_000, "the long event was not relayed: {} bytes", body.len());
    let too_long = r#"waycast_gateway_upstream_errors_total{model="chat-only",reason="sse_event_too_long"}"#;
    assert_eq!(fixture.metric(too_long).await, Some(1.0));
    // Under the bound, the same long content is translated and relayed.
    let request = fixture.request("/v1/messages", Some(ALICE_KEY), &ask(true), &[("x-mock-event-bytes", "900000")]);
    let (status, _, body) = fixture.send(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(payloads(&body).last().unwrap()["type"], "message_stop");
    assert!(body.len() > 900_000, "{} bytes", body.len());
}
