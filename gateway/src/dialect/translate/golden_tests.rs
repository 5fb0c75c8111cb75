//! Golden transcripts: each folder of `gateway/tests/golden/dialect/` is a
//! case whose inputs (`request.in.json`, `response.in.json`,
//! `stream.in.sse`) are translated and compared with the outputs beside
//! them (`*.out.*`). A case named `anthropic-*` is a Messages client on a
//! chat backend; `openai-*`, a chat client on a Messages backend. With
//! `WAYCAST_REGENERATE_GOLDEN=1` the outputs are written instead.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test fails loudly on any unexpected error")]

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;

/// `created` of every translated chat completion in the goldens.
const CREATED: u64 = 1_700_000_000;

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/dialect");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("the golden folder")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .collect();
    cases.sort();
    cases
}

fn regenerate() -> bool {
    std::env::var_os("WAYCAST_REGENERATE_GOLDEN").is_some_and(|value| value == "1")
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `data:` payloads of an SSE transcript, in order.
fn payloads(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data))
        .collect()
}

/// An SSE transcript's lines, each `data:` line's JSON parsed (so that the
/// order of keys does not matter).
fn sse_lines(text: &str) -> Vec<Result<Value, String>> {
    text.lines()
        .filter(|line| !line.is_empty())
        .map(|line| match line.strip_prefix("data: ").map(serde_json::from_str::<Value>) {
            Some(Ok(value)) => Ok(value),
            _ => Err(line.to_owned()),
        })
        .collect()
}

fn check_json(case: &Path, name: &str, actual: &Value) {
    let path = case.join(name);
    if regenerate() {
        std::fs::write(&path, serde_json::to_string_pretty(actual).unwrap() + "\n").unwrap();
        return;
    }
    assert_eq!(actual, &read_json(&path), "{}", path.display());
}

fn check_sse(case: &Path, name: &str, actual: &[u8]) {
    let path = case.join(name);
    let actual = std::str::from_utf8(actual).unwrap();
    if regenerate() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    assert_eq!(sse_lines(actual), sse_lines(&expected), "{}", path.display());
}

/// Every case's transcripts, translated as the golden files say.
#[test]
fn golden_transcripts() {
    let cases = cases();
    assert!(cases.len() >= 8, "the golden cases are missing");
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let messages_client = if name.starts_with("anthropic-") {
            true
        } else {
            assert!(name.starts_with("openai-"), "{name}: a case is named for its client's dialect");
            false
        };
        let request = read_json(&case.join("request.in.json"));
        let translated =
            if messages_client { messages_request_to_chat(&request) } else { chat_request_to_messages(&request) };
        check_json(&case, "request.out.json", &translated.unwrap_or_else(|e| panic!("{name}: {e}")));
        let model = request["model"].as_str().unwrap_or_default();
        let response_in = case.join("response.in.json");
        if response_in.exists() {
            let response = read_json(&response_in);
            let translated = if messages_client {
                chat_response_to_message(&response, model)
            } else {
                message_response_to_chat(&response, CREATED)
            };
            check_json(&case, "response.out.json", &translated.unwrap_or_else(|e| panic!("{name}: {e}")));
        }
        let stream_in = case.join("stream.in.sse");
        if stream_in.exists() {
            let text = std::fs::read_to_string(&stream_in).unwrap();
            let mut out = Vec::new();
            if messages_client {
                let mut stream = ChatStreamToMessages::new(model);
                for payload in payloads(&text) {
                    stream.push(payload.as_bytes(), &mut out);
                }
                stream.close(&mut out);
            } else {
                let include_usage = request["stream_options"]["include_usage"].as_bool() == Some(true);
                let mut stream = MessageStreamToChat::new(include_usage, CREATED);
                for payload in payloads(&text) {
                    stream.push(payload.as_bytes(), &mut out);
                }
                stream.close(&mut out);
            }
            check_sse(&case, "stream.out.sse", &out);
        }
    }
}
