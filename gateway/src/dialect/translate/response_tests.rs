//! Table tests of the whole-answer translations.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use serde_json::{Value, json};

use super::*;

fn completion(message: Value, finish: &str) -> Value {
    json!({"id": "c", "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}})
}

/// Finish reasons as stop reasons and back.
#[test]
fn stop_reasons_both_ways() {
    let rows = [
        ("stop", "end_turn", "stop"),
        ("length", "max_tokens", "length"),
        ("tool_calls", "tool_use", "tool_calls"),
        ("content_filter", "refusal", "content_filter"),
    ];
    for (finish, stop, back) in rows {
        let message = chat_response_to_message(&completion(json!({"content": "x"}), finish), "m").unwrap();
        assert_eq!(message["stop_reason"], stop, "{finish}");
        assert_eq!(
            message["usage"],
            json!({"input_tokens": 6, "cache_read_input_tokens": 4,
            "cache_creation_input_tokens": 0, "output_tokens": 2})
        );
        let chat = message_response_to_chat(&message, 5).unwrap();
        assert_eq!(chat["choices"][0]["finish_reason"], back, "{stop}");
        assert_eq!(chat["usage"]["prompt_tokens"], 10, "the cached share is counted back in");
        assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    }
}

/// Calls: parsed arguments (empty ones as `{}`), unparseable ones an
/// error naming them; a call after `stop` is still a tool_use stop; a
/// refusal is a refusal.
#[test]
fn calls_and_refusals() {
    let call = |arguments: &str| {
        json!({"content": null, "tool_calls": [
        {"id": "t", "type": "function", "function": {"name": "f", "arguments": arguments}}]})
    };
    let message = chat_response_to_message(&completion(call(""), "stop"), "m").unwrap();
    assert_eq!(message["content"], json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]));
    assert_eq!(message["stop_reason"], "tool_use");
    for bad in ["{\"a\":", "[1]", "3"] {
        let error = chat_response_to_message(&completion(call(bad), "tool_calls"), "m").unwrap_err();
        assert_eq!(error.field(), "choices[0].message.tool_calls[0].function.arguments", "{bad}");
    }
    let refused =
        chat_response_to_message(&completion(json!({"content": null, "refusal": "no"}), "stop"), "m").unwrap();
    assert_eq!(
        (refused["content"][0]["text"].clone(), refused["stop_reason"].clone()),
        (json!("no"), json!("refusal"))
    );
    assert_eq!(chat_response_to_message(&json!({"choices": []}), "m").unwrap_err().field(), "choices");
}

/// Blocks a chat message cannot hold are named, not lost.
#[test]
fn unknown_blocks_are_named() {
    let message = json!({"id": "m", "model": "c", "content": [{"type": "text", "text": "a"},
        {"type": "web_search_tool_result", "content": []}], "stop_reason": "end_turn", "usage": {}});
    assert_eq!(message_response_to_chat(&message, 0).unwrap_err().field(), "content[1].type");
    let redacted = json!({"content": [{"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "a"}]});
    let chat = message_response_to_chat(&redacted, 0).unwrap();
    assert_eq!(
        (chat["choices"][0]["message"]["content"].clone(), chat["choices"][0]["finish_reason"].clone()),
        (json!("a"), json!("stop"))
    );
}
