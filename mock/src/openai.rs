//! A mock answer in each API's shape: OpenAI's chat and completions and
//! embeddings, the Responses API and Anthropic's messages, whole or as
//! server-sent events, with usage as each reports it.

use bytes::Bytes;
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completion,
    Embedding,
    Responses,
    Messages,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) prompt: u64,
    pub(crate) completion: u64,
}

pub(crate) fn text(chunks: usize) -> String {
    (0..chunks).map(|i| format!("token{i} ")).collect()
}

pub(crate) fn complete_body(kind: Kind, model: &str, chunks: usize, usage: Usage) -> Value {
    let openai_usage = json!({"prompt_tokens": usage.prompt, "completion_tokens": usage.completion, "total_tokens": usage.prompt + usage.completion});
    match kind {
        Kind::Chat => json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text(chunks)}, "finish_reason": "stop"}],
            "usage": openai_usage,
        }),
        Kind::Completion => json!({
            "id": "cmpl-mock", "object": "text_completion", "created": 0, "model": model,
            "choices": [{"index": 0, "text": text(chunks), "finish_reason": "stop"}],
            "usage": openai_usage,
        }),
        Kind::Embedding => json!({
            "object": "list", "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
            "usage": {"prompt_tokens": usage.prompt, "total_tokens": usage.prompt},
        }),
        Kind::Responses => json!({
            "id": "resp_mock", "object": "response", "created_at": 0, "status": "completed", "model": model,
            "output": [{"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text(chunks), "annotations": []}]}],
            "usage": {"input_tokens": usage.prompt, "output_tokens": usage.completion, "total_tokens": usage.prompt + usage.completion},
        }),
        Kind::Messages => json!({
            "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text(chunks)}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": usage.prompt, "output_tokens": usage.completion},
        }),
    }
}

pub(crate) fn sse(event: Option<&str>, data: &Value) -> Bytes {
    match event {
        Some(event) => Bytes::from(format!("event: {event}\ndata: {data}\n\n")),
        None => Bytes::from(format!("data: {data}\n\n")),
    }
}

pub(crate) fn stream_events(kind: Kind, model: &str, chunks: usize, usage: Usage, include_usage: bool) -> Vec<Bytes> {
    let mut events = Vec::with_capacity(chunks + 4);
    match kind {
        Kind::Chat | Kind::Completion => {
            let object = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
            for i in 0..chunks {
                let choice = if kind == Kind::Chat {
                    json!({"index": 0, "delta": {"content": format!("token{i} ")}, "finish_reason": null})
                } else {
                    json!({"index": 0, "text": format!("token{i} "), "finish_reason": null})
                };
                let mut chunk =
                    json!({"id": "chatcmpl-mock", "object": object, "created": 0, "model": model, "choices": [choice]});
                if include_usage {
                    chunk["usage"] = Value::Null;
                }
                events.push(sse(None, &chunk));
            }
            if include_usage {
                let last = json!({"id": "chatcmpl-mock", "object": object, "created": 0, "model": model, "choices": [],
                    "usage": {"prompt_tokens": usage.prompt, "completion_tokens": usage.completion, "total_tokens": usage.prompt + usage.completion}});
                events.push(sse(None, &last));
            }
            events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        Kind::Responses => {
            events.push(sse(Some("response.created"), &json!({"type": "response.created", "response": {"id": "resp_mock", "status": "in_progress", "model": model}})));
            for i in 0..chunks {
                events.push(sse(
                    Some("response.output_text.delta"),
                    &json!({"type": "response.output_text.delta", "delta": format!("token{i} ")}),
                ));
            }
            events.push(sse(Some("response.completed"), &json!({"type": "response.completed", "response": {"id": "resp_mock", "status": "completed", "model": model,
                "usage": {"input_tokens": usage.prompt, "output_tokens": usage.completion, "total_tokens": usage.prompt + usage.completion}}})));
        }
        Kind::Messages => {
            events.push(sse(Some("message_start"), &json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": [],
                "usage": {"input_tokens": usage.prompt, "output_tokens": 1}}})));
            events.push(sse(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            for i in 0..chunks {
                events.push(sse(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("token{i} ")}})));
            }
            events.push(sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": 0})));
            events.push(sse(Some("message_delta"), &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": usage.completion}})));
            events.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
        }
        Kind::Embedding => {}
    }
    events
}
