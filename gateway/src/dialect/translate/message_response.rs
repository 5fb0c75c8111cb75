//! An Anthropic message (not streamed), made an OpenAI chat completion:
//! the answer an Anthropic-format backend gives an OpenAI client.
//!
//! ```text
//! id, model              → id, model (object "chat.completion", `created` given by the caller)
//! text blocks            → message.content, joined
//! thinking blocks        → message.reasoning_content, joined (redacted_thinking: dropped, opaque)
//! tool_use blocks        → message.tool_calls[] (input written as the arguments string)
//! stop_reason            → finish_reason (see wire::finish_reason_of)
//! usage                  → prompt_tokens (input + cache read + cache written),
//!                          prompt_tokens_details.cached_tokens (cache read), completion_tokens
//! ```
//!
//! A block of a kind a translated request cannot cause (server tools'
//! results, documents) is an error naming it rather than an answer with a
//! hole in it.

use serde_json::{Map, Value, json};

use super::error::{TO_CHAT, TranslateError, malformed, untranslatable};
use super::wire::{Usage, finish_reason_of};

/// The OpenAI chat completion for the Anthropic message `response`,
/// stamped `created` (seconds since the epoch; the caller's clock).
///
/// # Errors
/// [`TranslateError`] naming the field when `content` is not an array of
/// the blocks a chat message can hold.
pub fn message_response_to_chat(response: &Value, created: u64) -> Result<Value, TranslateError> {
    let blocks = response.get("content").and_then(Value::as_array);
    let blocks = blocks.ok_or_else(|| malformed("content", "an array of content blocks"))?;
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (at, block) in blocks.iter().enumerate() {
        let field = |name: &str| format!("content[{at}].{name}");
        let string =
            |name: &str| block.get(name).and_then(Value::as_str).ok_or_else(|| malformed(field(name), "a string"));
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(string("text")?),
            Some("thinking") => reasoning.push_str(string("thinking")?),
            Some("redacted_thinking") => {}
            Some("tool_use") => {
                let input = block.get("input").ok_or_else(|| malformed(field("input"), "required"))?;
                calls.push(json!({
                    "id": string("id")?,
                    "type": "function",
                    "function": {"name": string("name")?, "arguments": input.to_string()},
                }));
            }
            _ => return Err(untranslatable(field("type"), TO_CHAT, "no counterpart for this block")),
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    let content = if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) };
    message.insert("content".into(), content);
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), Value::String(reasoning));
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let stop_reason = response.get("stop_reason").and_then(Value::as_str).unwrap_or("end_turn");
    let usage = response.get("usage").and_then(Usage::of_anthropic).unwrap_or_default();
    Ok(json!({
        "id": response.get("id").and_then(Value::as_str).unwrap_or("chatcmpl-waycast"),
        "object": "chat.completion",
        "created": created,
        "model": response.get("model").and_then(Value::as_str).unwrap_or_default(),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason_of(stop_reason),
        }],
        "usage": usage.to_openai(),
    }))
}
