//! An OpenAI chat completion (not streamed), made an Anthropic message:
//! the answer a chat-only backend gives a Messages client.
//!
//! ```text
//! id, model                          → id, model (type "message", role "assistant")
//! message.reasoning_content          → a thinking block, first (signature "": none was issued)
//!   (or message.reasoning)
//! message.content / refusal          → a text block
//! message.tool_calls[]               → tool_use blocks, arguments parsed into input
//! finish_reason                      → stop_reason (see wire::stop_reason_of); a call made → tool_use;
//!                                      vLLM's matched `stop_reason` string → stop_sequence
//! usage                              → input_tokens (prompt less cached), cache_read_input_tokens,
//!                                      output_tokens
//! ```
//!
//! Arguments that are not a JSON object are an error naming them (the
//! caller answers 502): a tool run with an input the model did not write
//! would be worse than no answer. Empty arguments are `{}`. Choices past
//! the first are not read (a translated request never asks for more).

use serde_json::{Value, json};

use super::chat_request::tool_input;
use super::error::{TranslateError, malformed};
use super::wire::{Usage, stop_reason_of};

/// The Anthropic message for the OpenAI chat completion `response`;
/// `model` stands in when the response names none.
///
/// # Errors
/// [`TranslateError::Malformed`] naming the field when the response has
/// no choice, or a call whose arguments are not a JSON object.
pub fn chat_response_to_message(response: &Value, model: &str) -> Result<Value, TranslateError> {
    let choice = response.get("choices").and_then(|choices| choices.get(0));
    let choice = choice.ok_or_else(|| malformed("choices", "at least one choice"))?;
    let message = choice.get("message").ok_or_else(|| malformed("choices[0].message", "required"))?;
    let text_of = |key: &str| message.get(key).and_then(Value::as_str).filter(|text| !text.is_empty());
    let mut content = Vec::new();
    if let Some(thinking) = text_of("reasoning_content").or_else(|| text_of("reasoning")) {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if let Some(text) = text_of("content").or_else(|| text_of("refusal")) {
        content.push(json!({"type": "text", "text": text}));
    }
    let calls = message.get("tool_calls").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    for (at, call) in calls.iter().enumerate() {
        let field = |name: &str| format!("choices[0].message.tool_calls[{at}].{name}");
        let text = |name: &str, value: Option<&Value>| {
            value.and_then(Value::as_str).map(str::to_owned).ok_or_else(|| malformed(field(name), "a string"))
        };
        let function = call.get("function");
        let arguments = text("function.arguments", function.and_then(|f| f.get("arguments")))?;
        let input = tool_input(&arguments).ok_or_else(|| malformed(field("function.arguments"), "a JSON object"))?;
        content.push(json!({
            "type": "tool_use",
            "id": text("id", call.get("id"))?,
            "name": text("function.name", function.and_then(|f| f.get("name")))?,
            "input": input,
        }));
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str).unwrap_or("stop");
    let mut stop_reason = stop_reason_of(finish);
    if !calls.is_empty() {
        // Some servers say `stop` after a call; the client must run it.
        stop_reason = "tool_use";
    }
    if message.get("refusal").and_then(Value::as_str).is_some_and(|text| !text.is_empty()) {
        stop_reason = "refusal";
    }
    let matched = choice.get("stop_reason").and_then(Value::as_str).filter(|_| stop_reason == "end_turn");
    if matched.is_some() {
        stop_reason = "stop_sequence";
    }
    let usage = response.get("usage").and_then(Usage::of_openai).unwrap_or_default();
    Ok(json!({
        "id": response.get("id").and_then(Value::as_str).unwrap_or("msg_waycast"),
        "type": "message",
        "role": "assistant",
        "model": response.get("model").and_then(Value::as_str).unwrap_or(model),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": matched,
        "usage": usage.to_anthropic(),
    }))
}
