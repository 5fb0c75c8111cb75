//! Tool calls, as a model served by vLLM makes them: a request that offers
//! tools and whose last message is not a tool's result is answered by a
//! call of its first tool (or of the one the mock's options prefer), each required string property of its schema
//! filled with `"mock"`, in the shape of the API asked (chat completions'
//! `tool_calls`, Messages' `tool_use`), whole or streamed in pieces. A
//! request answering a call gets text, as the model's next turn.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::openai::{Kind, Usage, sse};

/// The call to make: the tool's name and its input.
pub(crate) struct ToolCall {
    name: String,
    input: Value,
    /// The arguments text as a broken model writes it (`x-mock-tool-arguments`),
    /// in place of the input's JSON.
    pub(crate) raw_arguments: Option<String>,
}

/// The call a model would make for `request` (of `kind`), if any: of the
/// tool named `preferred` when it is offered, else of the first.
pub(crate) fn call_for(request: &Value, kind: Kind, preferred: Option<&str>) -> Option<ToolCall> {
    let tools = request.get("tools")?.as_array()?;
    let named = |tool: &&Value| {
        let name = tool.pointer("/function/name").or_else(|| tool.get("name"));
        preferred.is_some() && name.and_then(Value::as_str) == preferred
    };
    let tool = tools.iter().find(named).or_else(|| tools.first())?;
    let last = request.get("messages")?.as_array()?.last()?;
    let (name, schema, answered) = match kind {
        Kind::Chat => (
            tool.pointer("/function/name"),
            tool.pointer("/function/parameters"),
            last.get("role").and_then(Value::as_str) == Some("tool"),
        ),
        Kind::Messages => (
            tool.get("name"),
            tool.get("input_schema"),
            last.get("content").and_then(Value::as_array).is_some_and(|blocks| {
                blocks.iter().any(|block| block.get("type").and_then(Value::as_str) == Some("tool_result"))
            }),
        ),
        _ => return None,
    };
    if answered {
        return None;
    }
    let mut input = Map::new();
    let required = schema.and_then(|schema| schema.get("required")).and_then(Value::as_array);
    for property in required.into_iter().flatten().filter_map(Value::as_str) {
        input.insert(property.to_owned(), json!("mock"));
    }
    Some(ToolCall { name: name?.as_str()?.to_owned(), input: Value::Object(input), raw_arguments: None })
}

impl ToolCall {
    /// The whole answer making the call.
    pub(crate) fn complete_body(&self, kind: Kind, model: &str, usage: Usage) -> Value {
        if kind == Kind::Messages {
            return json!({
                "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "tool_use", "id": "toolu_mock", "name": self.name, "input": self.input}],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": usage.prompt, "output_tokens": usage.completion},
            });
        }
        json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_mock", "type": "function",
                    "function": {"name": self.name,
                        "arguments": self.raw_arguments.clone().unwrap_or_else(|| self.input.to_string())}}]}}],
            "usage": {"prompt_tokens": usage.prompt, "completion_tokens": usage.completion,
                "total_tokens": usage.prompt + usage.completion},
        })
    }

    /// The call streamed: its start, then its input in two pieces.
    pub(crate) fn stream_events(&self, kind: Kind, model: &str, usage: Usage, include_usage: bool) -> Vec<Bytes> {
        let input = self.input.to_string();
        let (first, second) = input.split_at(input.len() / 2);
        if kind == Kind::Messages {
            let mut events = vec![sse(
                Some("message_start"),
                &json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message",
                "role": "assistant", "model": model, "content": [], "usage": {"input_tokens": usage.prompt, "output_tokens": 1}}}),
            )];
            events.push(sse(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_mock", "name": self.name, "input": {}}}),
            ));
            for piece in [first, second] {
                events.push(sse(
                    Some("content_block_delta"),
                    &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            events.push(sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": 0})));
            events.push(sse(
                Some("message_delta"),
                &json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": usage.completion}}),
            ));
            events.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
            return events;
        }
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let mut events = vec![sse(
            None,
            &chunk(
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_mock",
            "type": "function", "function": {"name": self.name, "arguments": ""}}]}),
                Value::Null,
            ),
        )];
        for piece in [first, second] {
            events.push(sse(
                None,
                &chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}), Value::Null),
            ));
        }
        events.push(sse(None, &chunk(json!({}), json!("tool_calls"))));
        if include_usage {
            events.push(sse(
                None,
                &json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [], "usage": {"prompt_tokens": usage.prompt, "completion_tokens": usage.completion,
                    "total_tokens": usage.prompt + usage.completion}}),
            ));
        }
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        events
    }
}
