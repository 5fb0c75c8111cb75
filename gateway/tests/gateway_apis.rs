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

/// A multipart form: `model` and an audio file (and whatever else).
fn audio_form(boundary: &str, model: Option<&str>, file: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    if let Some(model) = model {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n").as_bytes(),
        );
    }
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n")
            .as_bytes(),
    );
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

fn form_request(
    fixture: &Fixture,
    path: &str,
    key: &str,
    body: Vec<u8>,
    content_type: &str,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::post(fixture.url(path))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", content_type)
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap()
}

/// Audio and images: a transcription's form reaches the backend with its
/// model rewritten in place and its file intact, access checked as for
/// chat, its usage charged; malformed and oversized forms are 4xx; speech
/// answers bytes that are not JSON, relayed as they are.
#[tokio::test]
async fn audio_forms_and_images_are_served_with_the_keys_access_checked() {
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        config.settings.max_request_body_bytes = 64 * 1024;
        let alice = config.keys.iter_mut().find(|key| key.id == "team-a/alice").unwrap();
        alice.limits = Some(LimitsConfig { tokens_per_minute: Some(100_000), ..LimitsConfig::default() });
    })
    .await;
    let file: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let content_type = "multipart/form-data; boundary=waycast-b0undary";
    for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
        let body = audio_form("waycast-b0undary", Some("llama3"), &file);
        let (status, headers, answer) = fixture.send(form_request(&fixture, path, ALICE_KEY, body, content_type)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&answer));
        if path == "/v1/audio/transcriptions" {
            // The first: its file reserves no prompt tokens, only the
            // output bound (1,024; the file's bytes would be 1,100 more).
            let remaining: u64 = headers["x-ratelimit-remaining-tokens"].to_str().unwrap().parse().unwrap();
            assert!(remaining >= 100_000 - 1_024 - 64, "{remaining} tokens left");
        }
        assert_eq!(json_of(&answer)["text"], "mock transcript");
        let received = fixture.mock.recorder.requests().await.pop().unwrap();
        assert_eq!(received.path, path);
        assert_eq!(
            received.body,
            audio_form("waycast-b0undary", Some("meta-llama/Llama-3.1-8B-Instruct"), &file),
            "{path}: the model rewritten in place, the file intact"
        );
        assert_eq!(received.headers["content-type"], content_type);
    }
    // Refusals: no model, not a form, a broken form, a model the key may
    // not use, a form past the body limit — none reaches the backend.
    let before = fixture.mock.recorder.requests().await.len();
    let path = "/v1/audio/transcriptions";
    let cases = [
        (
            ALICE_KEY,
            audio_form("b", None, &file),
            "multipart/form-data; boundary=b",
            StatusCode::BAD_REQUEST,
            "missing_model",
        ),
        (
            ALICE_KEY,
            audio_form("b", Some("llama3"), &file),
            "application/json",
            StatusCode::BAD_REQUEST,
            "invalid_form",
        ),
        (
            ALICE_KEY,
            b"--b\r\nno end".to_vec(),
            "multipart/form-data; boundary=b",
            StatusCode::BAD_REQUEST,
            "invalid_form",
        ),
        (
            ALICE_KEY,
            audio_form("b", Some("llama3"), &vec![0; 70 * 1024]),
            "multipart/form-data; boundary=b",
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
        ),
    ];
    for (key, body, content_type, status, code) in cases {
        let (got, _, answer) = fixture.send(form_request(&fixture, path, key, body, content_type)).await;
        assert_eq!((got, refusal(&answer, false)), (status, code.to_owned()), "{code}");
    }
    // Bob may not use llama: refused as his chat is.
    let chat = json!({"model": "llama3", "messages": [{"role": "user", "content": "hello"}]}).to_string();
    let (chats, _, chat_answer) = fixture.post("/v1/chat/completions", Some(BOB_KEY), &chat).await;
    let body = audio_form("b", Some("llama3"), &file);
    let (status, _, answer) =
        fixture.send(form_request(&fixture, path, BOB_KEY, body, "multipart/form-data; boundary=b")).await;
    assert!(status.is_client_error(), "{status}");
    assert_eq!((status, refusal(&answer, false)), (chats, refusal(&chat_answer, false)));
    assert_eq!(fixture.mock.recorder.requests().await.len(), before, "a refusal reached the backend");

    let speech = json!({"model": "llama3", "input": "hello", "voice": "alloy"}).to_string();
    let (status, headers, audio) = fixture.post("/v1/audio/speech", Some(ALICE_KEY), &speech).await;
    assert_eq!((status, headers["content-type"].to_str().unwrap()), (StatusCode::OK, "audio/mpeg"));
    assert!(audio.starts_with(b"ID3"), "relayed as it is");
    let image = json!({"model": "llama3", "prompt": "a cat", "size": "256x256"}).to_string();
    let (status, _, answer) = fixture.post("/v1/images/generations", Some(ALICE_KEY), &image).await;
    assert_eq!(status, StatusCode::OK);
    assert!(json_of(&answer)["data"][0]["b64_json"].is_string());

    // Charged what the transcriptions and the image reported; the speech
    // its text's estimate.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (_, text) = fixture.admin_get("/usage").await;
        let report: UsageReport = serde_json::from_str(&text).unwrap();
        let counted = report.keys.get("team-a/alice").copied().unwrap_or_default();
        if counted.requests >= 4 {
            // The speech reports no usage and its answer is audio: no
            // output tokens for its bytes.
            assert_eq!(counted.output_tokens, 3 + 3 + 16, "{counted:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never counted: {counted:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A model that says which APIs it offers refuses the others before
/// anything is sent (in the caller's dialect), and is still listed.
#[tokio::test]
async fn a_model_refuses_the_apis_it_does_not_offer() {
    use waycast_crds::model_api::ModelApi;
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        let embed = config.models.iter_mut().find(|model| model.name == "embed-small").unwrap();
        embed.apis = Some(vec![ModelApi::Embeddings, ModelApi::Tokenize]);
    })
    .await;
    let embed = json!({"model": "embed-small", "input": "x"}).to_string();
    assert_eq!(fixture.post("/v1/embeddings", Some(ALICE_KEY), &embed).await.0, StatusCode::OK);
    assert_eq!(
        fixture
            .post("/detokenize", Some(ALICE_KEY), &json!({"model": "embed-small", "tokens": [1]}).to_string())
            .await
            .0,
        StatusCode::OK
    );
    let before = fixture.mock.recorder.requests().await.len();
    let chat = json!({"model": "embed-small", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let (status, _, answer) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &chat).await;
    assert_eq!((status, refusal(&answer, false)), (StatusCode::NOT_FOUND, "unsupported_endpoint".to_owned()));
    let messages =
        json!({"model": "embed-small", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let (status, _, answer) = fixture.post("/v1/messages", Some(ALICE_KEY), &messages).await;
    assert_eq!((status, refusal(&answer, true)), (StatusCode::NOT_FOUND, "not_found_error".to_owned()));
    assert_eq!(fixture.mock.recorder.requests().await.len(), before, "a refusal reached the backend");
    let request = http::Request::get(fixture.url("/v1/models"))
        .header("authorization", format!("Bearer {ALICE_KEY}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (_, _, models) = fixture.send(request).await;
    assert!(json_of(&models)["data"].as_array().unwrap().iter().any(|model| model["id"] == "embed-small"));
}

/// `GET /` and `HEAD /` answer 200 without a key (a client's check that
/// the gateway is there); anything else at `/` is refused.
#[tokio::test]
async fn the_root_answers_without_a_key() {
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    for method in [http::Method::GET, http::Method::HEAD] {
        let request = http::Request::builder()
            .method(method.clone())
            .uri(fixture.url("/"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        assert_eq!(fixture.send(request).await.0, StatusCode::OK, "{method}");
    }
    assert_eq!(fixture.post("/", None, "{}").await.0, StatusCode::METHOD_NOT_ALLOWED);
}

/// Reads from `socket` after `seen` until `enough` says the bytes so far
/// suffice, or the peer closes; what came, either way.
async fn read_until(
    socket: &mut tokio::net::TcpStream,
    mut seen: Vec<u8>,
    enough: impl Fn(&[u8]) -> bool,
    within: std::time::Duration,
) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut buffer = vec![0; 64 * 1024];
    let reading = async {
        while !enough(&seen) {
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(within, reading).await;
    seen
}

/// The end of an HTTP head in `bytes`, and its declared body length.
fn head_and_length(bytes: &[u8]) -> Option<(usize, usize)> {
    let end = bytes.windows(4).position(|window| window == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..end]).to_lowercase();
    let length = head.lines().find_map(|line| line.strip_prefix("content-length: "))?.trim().parse().ok()?;
    Some((end, length))
}

/// A transcription's file goes to the backend as it arrives: the backend
/// reads the form's beginning while the client still holds most of the
/// file, then the whole body (model rewritten, file intact). A form whose
/// tail turns out malformed — a second model, or a last part never ended
/// (which python-multipart would take as ended) — never reaches the
/// backend whole: its request is cut short, and the client gets the 400.
#[tokio::test]
async fn an_uploaded_file_streams_to_the_backend_as_it_arrives() {
    use tokio::io::AsyncWriteExt as _;
    let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_url = format!("http://{}/v1", backend.local_addr().unwrap());
    let fixture = Fixture::start(FixtureOptions::default(), |config, _| {
        config.settings.max_request_body_bytes = 16 << 20;
        let llama = config.models.iter_mut().find(|model| model.name == "llama-3.1-8b").unwrap();
        llama.backends[0].url = backend_url;
    })
    .await;
    let file: Vec<u8> = (0..8_000_000u32).map(|i| (i % 253) as u8).collect();
    let wait = std::time::Duration::from_secs(10);
    let tails: [(&[u8], Option<&str>); 3] = [
        (b"--b--\r\n", None),
        (b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nother\r\n--b--\r\n", Some("duplicate_model")),
        (b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nabc", Some("invalid_form")),
    ];
    let with_tail = |model: &str, tail: &[u8]| {
        let mut form = audio_form("b", Some(model), &file);
        form.truncate(form.len() - b"--b--\r\n".len());
        form.extend_from_slice(tail);
        form
    };
    for (tail, refused) in tails {
        let malformed_tail = refused.is_some();
        let form = with_tail("llama3", tail);
        let mut client = tokio::net::TcpStream::connect(fixture.addr).await.unwrap();
        let head = format!(
            "POST /v1/audio/transcriptions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {ALICE_KEY}\r\n\
             content-type: multipart/form-data; boundary=b\r\ncontent-length: {}\r\n\r\n",
            form.len()
        );
        client.write_all(head.as_bytes()).await.unwrap();
        let first = 1 << 20;
        client.write_all(&form[..first]).await.unwrap();

        // The backend has the request and the file's first bytes while the
        // client holds the other 7 MB back.
        let (mut upstream, _) =
            tokio::time::timeout(wait, backend.accept()).await.expect("the request reached the backend").unwrap();
        let early = read_until(&mut upstream, Vec::new(), |seen| seen.len() > 512 * 1024, wait).await;
        assert!(
            early.len() > 512 * 1024,
            "only {} bytes reached the backend before the client sent the rest",
            early.len()
        );
        let (body_at, length) = head_and_length(&early).expect("a head with a length");
        let expected = with_tail("meta-llama/Llama-3.1-8B-Instruct", tail);
        assert_eq!(length, expected.len(), "the length counts the rewritten model");

        client.write_all(&form[first..]).await.unwrap();
        let seen = read_until(&mut upstream, early, |seen| seen.len() >= body_at + length, wait).await;
        let answer = if malformed_tail {
            assert!(seen.len() < body_at + length, "the backend read a whole form the gateway refuses");
            assert_eq!(&seen[body_at..], &expected[..seen.len() - body_at], "what it read is the form's beginning");
            None
        } else {
            let got = &seen[body_at..];
            let differs = got.iter().zip(&expected).position(|(a, b)| a != b);
            assert!(
                got == &expected[..],
                "the model rewritten in place, the file intact: {} of {} bytes, first difference at {differs:?}",
                got.len(),
                expected.len()
            );
            let json = br#"{"text":"streamed"}"#;
            let reply =
                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", json.len());
            upstream.write_all(&[reply.as_bytes(), json].concat()).await.unwrap();
            Some(json)
        };
        let reply = read_until(
            &mut client,
            Vec::new(),
            |seen| head_and_length(seen).is_some_and(|(at, n)| seen.len() >= at + n),
            wait,
        )
        .await;
        let (at, _) = head_and_length(&reply).expect("an answer");
        let text = String::from_utf8_lossy(&reply);
        match answer {
            Some(json) => {
                assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                assert_eq!(&reply[at..], json);
            }
            None => {
                assert!(text.starts_with("HTTP/1.1 400"), "{text}");
                assert_eq!(Some(refusal(&reply[at..], false).as_str()), refused);
            }
        }
    }
}
