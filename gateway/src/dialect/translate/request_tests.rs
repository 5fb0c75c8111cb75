//! Table tests of the request translations: what each field becomes,
//! and every refusal naming its field.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use serde_json::{Value, json};

use super::*;

fn anthropic(extra: Value) -> Value {
    let mut request = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    request.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    request
}

fn openai(extra: Value) -> Value {
    let mut request = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    request.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    request
}

fn user_blocks(blocks: Value) -> Value {
    anthropic(json!({"messages": [{"role": "user", "content": blocks}]}))
}

/// Claude Code's `context_management` (server-side clearing of old tool
/// results) is dropped: the chat backend sees the whole context.
#[test]
fn context_management_is_dropped_not_refused() {
    let edits = json!({"edits": [{"type": "clear_tool_uses_20250919"}]});
    let chat = messages_request_to_chat(&anthropic(json!({"context_management": edits}))).unwrap();
    assert!(chat.get("context_management").is_none(), "{chat}");
}

/// Each Messages field with no faithful chat counterpart is refused, the
/// error naming it (the caller's 400 says which).
#[test]
fn messages_refusals_name_the_field() {
    let image_in_result = json!([{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]);
    let rows: [(Value, &str); 10] = [
        (anthropic(json!({"container": "c"})), "container"),
        (anthropic(json!({"mcp_servers": []})), "mcp_servers"),
        (anthropic(json!({"not_a_field": {}})), "not_a_field"),
        (anthropic(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})), "tools[0].type"),
        (user_blocks(json!([{"type": "document", "source": {}}])), "messages[0].content[0].type"),
        (
            user_blocks(json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}])),
            "messages[0].content[0].source.type",
        ),
        (user_blocks(image_in_result), "messages[0].content[0].content[0].type"),
        (anthropic(json!({"system": [{"type": "image"}]})), "system[0].type"),
        (anthropic(json!({"messages": [{"role": "system", "content": "x"}]})), "messages[0].role"),
        (
            anthropic(json!({"messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]})),
            "messages[0].content[0].type",
        ),
    ];
    for (request, field) in rows {
        let error = messages_request_to_chat(&request).unwrap_err();
        assert_eq!(error.field(), field, "{error}");
        assert!(error.to_string().contains(field), "{error}");
    }
}

/// Each chat field with no faithful Messages counterpart is refused, the
/// error naming it.
#[test]
fn chat_refusals_name_the_field() {
    let bad_arguments = json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]});
    let rows: [(Value, &str); 14] = [
        (openai(json!({"n": 2})), "n"),
        (openai(json!({"response_format": {"type": "json_schema", "json_schema": {}}})), "response_format"),
        (openai(json!({"response_format": {"type": "json_object"}})), "response_format"),
        (openai(json!({"temperature": 1.5})), "temperature"),
        (openai(json!({"frequency_penalty": 0.5})), "frequency_penalty"),
        (openai(json!({"presence_penalty": -1})), "presence_penalty"),
        (openai(json!({"logit_bias": {"1": 5}})), "logit_bias"),
        (openai(json!({"logprobs": true})), "logprobs"),
        (openai(json!({"reasoning_effort": "high"})), "reasoning_effort"),
        (openai(json!({"modalities": ["text", "audio"]})), "modalities"),
        (openai(json!({"functions": []})), "functions"),
        (openai(json!({"tools": [{"type": "custom", "custom": {"name": "x"}}]})), "tools[0].type"),
        (openai(json!({"messages": [{"role": "function", "name": "f", "content": "x"}]})), "messages[0].role"),
        (bad_arguments, "messages[0].tool_calls[0].function.arguments"),
    ];
    for (request, field) in rows {
        let error = chat_request_to_messages(&request).unwrap_err();
        assert_eq!(error.field(), field, "{error}");
        assert!(matches!(error, TranslateError::Untranslatable { .. }), "{error:?}");
    }
    let audio =
        openai(json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}));
    assert_eq!(chat_request_to_messages(&audio).unwrap_err().field(), "messages[0].content[0].type");
}

/// What is harmless passes: dropped or kept as documented, never refused.
#[test]
fn harmless_fields_pass() {
    let kept = anthropic(json!({"thinking": {"type": "enabled", "budget_tokens": 100}, "service_tier": "auto",
        "metadata": {"user_id": "u"}, "top_k": 5, "stop_sequences": ["X"]}));
    let chat = messages_request_to_chat(&kept).unwrap();
    assert_eq!(
        (chat["user"].clone(), chat["top_k"].clone(), chat["stop"].clone()),
        (json!("u"), json!(5), json!(["X"]))
    );
    assert!(chat.get("thinking").is_none() && chat.get("service_tier").is_none(), "{chat}");
    let chat = openai(
        json!({"n": 1, "seed": 7, "frequency_penalty": 0, "logprobs": false, "response_format": {"type": "text"},
        "stream_options": {"include_usage": true}, "top_logprobs": null, "modalities": ["text"], "store": false}),
    );
    let messages = chat_request_to_messages(&chat).unwrap();
    assert_eq!(messages["max_tokens"], json!(DEFAULT_MAX_TOKENS));
    for dropped in ["n", "seed", "stream_options", "response_format", "store", "frequency_penalty"] {
        assert!(messages.get(dropped).is_none(), "{dropped}: {messages}");
    }
    let bound = chat_request_to_messages(&openai(json!({"max_tokens": 7, "max_completion_tokens": 9}))).unwrap();
    assert_eq!(bound["max_tokens"], 9, "max_completion_tokens wins");
}

/// `tool_choice` both ways, and parallel calls.
#[test]
fn tool_choice_table() {
    let rows: [(Value, Value); 5] = [
        (json!({"type": "auto"}), json!("auto")),
        (json!({"type": "any"}), json!("required")),
        (json!({"type": "none"}), json!("none")),
        (json!({"type": "tool", "name": "f"}), json!({"type": "function", "function": {"name": "f"}})),
        (json!({"type": "any", "disable_parallel_tool_use": true}), json!("required")),
    ];
    for (choice, expected) in rows {
        let parallel = choice.get("disable_parallel_tool_use").is_none();
        let chat = messages_request_to_chat(&anthropic(json!({"tool_choice": choice.clone()}))).unwrap();
        assert_eq!(chat["tool_choice"], expected, "{choice}");
        assert_eq!(chat.get("parallel_tool_calls").is_none(), parallel, "{choice}");
        let mut back = chat_request_to_messages(&openai(json!({"tool_choice": expected.clone(),
            "parallel_tool_calls": parallel})))
        .unwrap()["tool_choice"]
            .clone();
        if choice["type"] == "none" {
            assert_eq!(back, json!({"type": "none"}));
            continue;
        }
        if !parallel {
            assert_eq!(back.as_object_mut().unwrap().remove("disable_parallel_tool_use"), Some(json!(true)));
        }
        let mut plain = choice.clone();
        plain.as_object_mut().unwrap().remove("disable_parallel_tool_use");
        assert_eq!(back, plain, "{expected}");
    }
    let bad = messages_request_to_chat(&anthropic(json!({"tool_choice": {"type": "sometimes"}}))).unwrap_err();
    assert_eq!(bad.field(), "tool_choice.type");
}

/// Tool results come right after the assistant's calls, in order, before
/// the user's text of the same turn; several results in one turn are
/// several tool messages.
#[test]
fn tool_results_keep_their_order() {
    let request = anthropic(json!({"messages": [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "a", "name": "f", "input": {}},
            {"type": "tool_use", "id": "b", "name": "f", "input": {"x": [1, "é"]}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "A"},
            {"type": "tool_result", "tool_use_id": "b"},
            {"type": "text", "text": "next"}]}]}));
    let chat = messages_request_to_chat(&request).unwrap();
    let messages = chat["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["assistant", "tool", "tool", "user"]);
    assert_eq!(messages[0]["content"], Value::Null);
    assert_eq!(messages[0]["tool_calls"][1]["function"]["arguments"], r#"{"x":[1,"é"]}"#);
    assert_eq!((messages[1]["tool_call_id"].clone(), messages[1]["content"].clone()), (json!("a"), json!("A")));
    assert_eq!((messages[2]["tool_call_id"].clone(), messages[2]["content"].clone()), (json!("b"), json!("")));
    assert_eq!(messages[3]["content"], "next");

    // And back: the tool messages are one user turn, the text joins it.
    let back = chat_request_to_messages(&chat).unwrap();
    let turns = back["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{back}");
    let kinds: Vec<&str> =
        turns[1]["content"].as_array().unwrap().iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["tool_result", "tool_result", "text"]);
    assert_eq!(turns[0]["content"][1]["input"], json!({"x": [1, "é"]}));
}

/// Malformed bodies are refused as malformed, naming the field, never
/// a panic.
#[test]
fn malformed_requests_name_the_field() {
    let rows: [(Value, &str); 6] = [
        (json!([1]), ""),
        (anthropic(json!({"messages": {}})), "messages"),
        (anthropic(json!({"messages": [{"role": "user"}]})), "messages[0].content"),
        (anthropic(json!({"messages": [{"role": "user", "content": 5}]})), "messages[0].content"),
        (user_blocks(json!([{"type": "text"}])), "messages[0].content[0].text"),
        (
            user_blocks(json!([{"type": "image", "source": {"type": "base64", "data": "x"}}])),
            "messages[0].content[0].source.media_type",
        ),
    ];
    for (request, field) in rows {
        let error = messages_request_to_chat(&request).unwrap_err();
        assert_eq!(error.field(), field, "{error}");
        assert!(matches!(error, TranslateError::Malformed { .. }), "{error:?}");
    }
    let error = chat_request_to_messages(&openai(json!({"messages": [{"role": "tool", "content": "x"}]}))).unwrap_err();
    assert_eq!(error.field(), "messages[0].tool_call_id");
}

/// Images both ways: base64 ⇄ data: URL, url ⇄ url.
#[test]
fn images_round_trip() {
    let blocks = json!([
        {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklG"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]);
    let chat = messages_request_to_chat(&user_blocks(blocks.clone())).unwrap();
    let parts = &chat["messages"][0]["content"];
    assert_eq!(parts[0]["image_url"]["url"], "data:image/webp;base64,UklG");
    let back = chat_request_to_messages(&chat).unwrap();
    assert_eq!(back["messages"][0]["content"], blocks);
}
