//! The stream translators fed hostile and split input: block order, the
//! bounds, and an error event rather than a panic.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use serde_json::{Value, json};

use super::*;

/// The events an Anthropic stream is made of: (event name, data).
fn events(out: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(out).unwrap();
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let (name, data) = event.split_once('\n').unwrap();
            let name = name.strip_prefix("event: ").unwrap().to_owned();
            (name, serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap())
        })
        .collect()
}

fn chunk(delta: Value) -> Vec<u8> {
    json!({"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
        .to_string()
        .into_bytes()
}

fn call(index: u64, id: Option<&str>, name: Option<&str>, arguments: &str) -> Vec<u8> {
    let mut piece = json!({"index": index, "function": {"arguments": arguments}});
    if let Some(id) = id {
        piece["id"] = json!(id);
    }
    if let Some(name) = name {
        piece["function"]["name"] = json!(name);
    }
    chunk(json!({"tool_calls": [piece]}))
}

fn finish(reason: &str) -> Vec<u8> {
    json!({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}).to_string().into_bytes()
}

/// Checks what Claude Code relies on: message_start first, each block
/// started, given deltas and stopped before the next starts, indexes
/// 0, 1, … in turn, message_delta then message_stop last.
fn assert_well_ordered(events: &[(String, Value)]) {
    assert_eq!(events[0].0, "message_start", "{events:?}");
    let mut open: Option<u64> = None;
    let mut next = 0;
    for (name, data) in &events[1..events.len() - 2] {
        let index = data["index"].as_u64();
        match name.as_str() {
            "content_block_start" => {
                assert_eq!((open, index), (None, Some(next)), "{events:?}");
                open = index;
                next += 1;
            }
            "content_block_delta" => assert_eq!(open, index, "{events:?}"),
            "content_block_stop" => {
                assert_eq!(open, index, "{events:?}");
                open = None;
            }
            other => panic!("{other} in the middle: {events:?}"),
        }
    }
    assert_eq!(open, None);
    let names: Vec<&str> = events[events.len() - 2..].iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["message_delta", "message_stop"]);
}

/// Each call's input, as a client assembles it from the deltas.
fn inputs(events: &[(String, Value)]) -> Vec<(String, Value)> {
    let mut calls: Vec<(String, String)> = Vec::new();
    for (name, data) in events {
        if name == "content_block_start" && data["content_block"]["type"] == "tool_use" {
            calls.push((data["content_block"]["id"].as_str().unwrap().to_owned(), String::new()));
        }
        if data["delta"]["type"] == "input_json_delta" {
            calls.last_mut().unwrap().1.push_str(data["delta"]["partial_json"].as_str().unwrap());
        }
    }
    calls.into_iter().map(|(id, json)| (id, serde_json::from_str(&json).unwrap())).collect()
}

/// Interleaved calls, in every arrival order of three calls' pieces:
/// blocks stay in order and each input is whole.
#[test]
fn interleaved_calls_come_out_in_order() {
    let pieces = [[r#"{"a""#, r#":1}"#], [r#"{"b":"#, r#"[2]}"#], [r#"{"c":"#, r#""}"}"#]];
    // Each order is a sequence of call numbers; a call's pieces go in turn.
    let orders: [&[u64]; 5] =
        [&[0, 0, 1, 1, 2, 2], &[0, 1, 2, 0, 1, 2], &[2, 1, 0, 0, 1, 2], &[0, 1, 1, 2, 2, 0], &[1, 0, 2, 2, 0, 1]];
    for order in orders {
        let mut stream = ChatStreamToMessages::new("m");
        let mut out = Vec::new();
        let mut sent = [0usize; 3];
        for &index in order {
            let at = index as usize;
            let first = sent[at] == 0;
            let id = format!("id{index}");
            let piece = call(index, first.then_some(id.as_str()), first.then_some("f"), pieces[at][sent[at]]);
            stream.push(&piece, &mut out);
            sent[at] += 1;
        }
        stream.push(&finish("tool_calls"), &mut out);
        stream.push(b"[DONE]", &mut out);
        let events = events(&out);
        assert_well_ordered(&events);
        let mut got = inputs(&events);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let want = [("id0", json!({"a": 1})), ("id1", json!({"b": [2]})), ("id2", json!({"c": "}"}))];
        assert_eq!(got, want.map(|(id, input)| (id.to_owned(), input)), "{order:?}");
        assert_eq!(events[events.len() - 2].1["delta"]["stop_reason"], "tool_use");
    }
}

/// Calls one after another stream live: the first call's pieces are out
/// before the second call is seen.
#[test]
fn sequential_calls_stream_live() {
    let mut stream = ChatStreamToMessages::new("m");
    let mut out = Vec::new();
    stream.push(&call(0, Some("a"), Some("f"), r#"{"x":"#), &mut out);
    stream.push(&call(0, None, None, "1}"), &mut out);
    assert!(String::from_utf8_lossy(&out).contains("1}"), "held instead of streamed");
    stream.push(&call(1, Some("b"), Some("g"), r#"{"y":2}"#), &mut out);
    assert_eq!(events(&out).iter().filter(|(name, _)| name == "content_block_stop").count(), 1);
    stream.push(&finish("tool_calls"), &mut out);
    stream.push(br#"{"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}"#, &mut out);
    assert!(stream.is_done(), "the usage chunk ends the message");
    let events = events(&out);
    assert_well_ordered(&events);
    assert_eq!(
        events[events.len() - 2].1["usage"],
        json!({"output_tokens": 4, "input_tokens": 9, "cache_read_input_tokens": 0})
    );
    stream.push(b"[DONE]", &mut out);
    assert_eq!(events.len(), self::events(&out).len(), "nothing after the end");
}

/// message_delta waits for the usage chunk that follows the finish reason.
#[test]
fn message_delta_waits_for_usage() {
    let mut stream = ChatStreamToMessages::new("m");
    let mut out = Vec::new();
    stream.push(&chunk(json!({"content": "hi"})), &mut out);
    stream.push(&finish("stop"), &mut out);
    assert!(!String::from_utf8_lossy(&out).contains("message_delta"));
    stream.push(b" [DONE] ", &mut out);
    let events = events(&out);
    assert_well_ordered(&events);
    assert_eq!(events[events.len() - 2].1["usage"], json!({"output_tokens": 0}), "no usage came");
}

/// Hostile and broken streams end with one error event, never a panic.
#[test]
fn hostile_streams_end_with_an_error_event() {
    let long = "x".repeat(MAX_TOOL_ID + 1);
    let many: Vec<Vec<u8>> = (0..=MAX_TOOL_CALLS as u64).map(|i| call(i, Some("i"), Some("f"), "{}")).collect();
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("not json", vec![b"{oops".to_vec()]),
        ("choices not an array", vec![br#"{"choices":{}}"#.to_vec()]),
        ("tool_calls not an array", vec![chunk(json!({"tool_calls": 3}))]),
        ("a call without an index", vec![chunk(json!({"tool_calls": [{"id": "a"}]}))]),
        ("a name too long", vec![call(0, Some("a"), Some(&long), "{}")]),
        ("too many calls", many),
        (
            "arguments after a whole call",
            vec![call(0, Some("a"), Some("f"), "{}"), call(1, Some("b"), Some("f"), "{}"), call(0, None, None, "x")],
        ),
        ("a call never named", vec![call(0, Some("a"), None, "{}"), finish("tool_calls")]),
        ("a backend error", vec![br#"{"error":{"message":"boom"}}"#.to_vec()]),
        ("an empty stream", vec![b"[DONE]".to_vec()]),
    ];
    for (case, payloads) in cases {
        let mut stream = ChatStreamToMessages::new("m");
        let mut out = Vec::new();
        for payload in &payloads {
            stream.push(payload, &mut out);
        }
        assert!(stream.is_done(), "{case}");
        let events = events(&out);
        let errors = events.iter().filter(|(name, _)| name == "error").count();
        assert_eq!((errors, events.last().unwrap().0.as_str()), (1, "error"), "{case}: {events:?}");
        stream.push(&chunk(json!({"content": "more"})), &mut out);
        stream.close(&mut out);
        assert_eq!(self::events(&out).len(), events.len(), "{case}: nothing after the error");
    }
    // A connection closed mid-answer.
    let mut stream = ChatStreamToMessages::new("m");
    let mut out = Vec::new();
    stream.push(&chunk(json!({"content": "half"})), &mut out);
    stream.close(&mut out);
    assert_eq!(events(&out).last().unwrap().0, "error");
}

/// Interleaved arguments held past the bound end the stream.
#[test]
fn held_arguments_are_bounded() {
    let mut stream = ChatStreamToMessages::new("m");
    let mut out = Vec::new();
    stream.push(&call(0, Some("a"), Some("f"), "{\"open\":"), &mut out);
    let piece = "x".repeat(1 << 20);
    for _ in 0..=(MAX_HELD_ARGUMENTS >> 20) {
        stream.push(&call(1, Some("b"), Some("f"), &piece), &mut out);
    }
    assert!(stream.is_done());
    assert_eq!(events(&out).last().unwrap().0, "error");
}

/// Reasoning, text and a call in one answer: three blocks in turn, the
/// input count read from the first chunk, the model given when no chunk
/// names one, a made-up id for a call that came without one.
#[test]
fn thinking_text_and_calls_in_one_answer() {
    let mut stream = ChatStreamToMessages::new("fallback");
    let mut out = Vec::new();
    stream.push(br#"{"choices":[{"index":0,"delta":{"role":"assistant","reasoning":"hm"}}],"usage":{"prompt_tokens":30,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":10}}}"#, &mut out);
    stream.push(&chunk(json!({"reasoning_content": " ok", "content": "A"})), &mut out);
    stream.push(&chunk(json!({"content": "B"})), &mut out);
    stream.push(&call(0, None, Some("f"), "{}"), &mut out);
    stream.push(&finish("stop"), &mut out);
    stream.push(b"[DONE]", &mut out);
    let events = events(&out);
    assert_well_ordered(&events);
    let start = &events[0].1["message"];
    assert_eq!((start["model"].clone(), start["usage"]["input_tokens"].clone()), (json!("fallback"), json!(20)));
    let kinds: Vec<&str> = events
        .iter()
        .filter(|(name, _)| name == "content_block_start")
        .map(|(_, data)| data["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"]);
    assert_eq!(inputs(&events), [("toolu_waycast_0".to_owned(), json!({}))]);
    assert_eq!(events[events.len() - 2].1["delta"]["stop_reason"], "tool_use", "a call made is a tool_use stop");
}

/// The reverse stream: text, reasoning and calls as chunks; the usage
/// chunk only when asked; errors as OpenAI error payloads.
#[test]
fn messages_stream_to_chunks() {
    let feed = |include_usage: bool, events: &[Value]| {
        let mut stream = MessageStreamToChat::new(include_usage, 1);
        let mut out = Vec::new();
        for event in events {
            stream.push(event.to_string().as_bytes(), &mut out);
        }
        stream.close(&mut out);
        String::from_utf8(out).unwrap()
    };
    let start = json!({"type": "message_start", "message": {"id": "m1", "model": "claude", "usage": {"input_tokens": 3, "output_tokens": 0}}});
    let stop = [
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        json!({"type": "message_stop"}),
    ];
    let plain = [start.clone(), stop[0].clone(), stop[1].clone()];
    let with_usage = feed(true, &plain);
    assert!(with_usage.contains(r#""choices":[],"usage":{"completion_tokens":2,"prompt_tokens":3"#), "{with_usage}");
    assert!(with_usage.ends_with("data: [DONE]\n\n"));
    assert!(!feed(false, &plain).contains("usage"));

    let error = feed(
        false,
        &[start.clone(), json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})],
    );
    assert!(
        error.contains(r#"data: {"error":{"message":"busy","type":"overloaded_error","param":null,"code":null}}"#),
        "{error}"
    );
    assert!(error.ends_with("data: [DONE]\n\n"));

    let early = feed(
        false,
        &[json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}})],
    );
    assert!(early.starts_with(r#"data: {"error""#), "{early}");
    let stray = feed(
        false,
        &[
            start.clone(),
            json!({"type": "content_block_delta", "index": 4, "delta": {"type": "input_json_delta", "partial_json": "{"}}),
        ],
    );
    assert!(stray.contains("not a tool call"), "{stray}");
    let cut = feed(false, &[start]);
    assert!(cut.contains("ended before"), "{cut}");
    let mut stream = MessageStreamToChat::new(false, 1);
    let mut out = Vec::new();
    stream.push(b"not json", &mut out);
    assert!(stream.is_done() && out.starts_with(b"data: {\"error\""));
}
