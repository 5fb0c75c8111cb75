//! An Anthropic Messages request, made an OpenAI chat completions request
//! (a Messages client in front of a chat-only backend).
//!
//! Translated: `model`; `max_tokens`; `temperature`, `top_p`, `top_k` (as
//! they are: vLLM and SGLang read `top_k`); `stop_sequences` → `stop`;
//! `stream` → `stream` with `stream_options.include_usage` (the usage the
//! Anthropic stream carries unasked); `metadata.user_id` → `user`;
//! `system` → a leading `system` message; `tools` → function tools;
//! `tool_choice` (`auto`, `any` → `required`, `tool` → the named function,
//! `none`), its `disable_parallel_tool_use` → `parallel_tool_calls: false`.
//!
//! Messages, block by block:
//!
//! ```text
//! text                          → a text part (a lone one without cache_control: plain string content)
//! image (base64 | url source)   → an image_url part (base64 as a data: URL)
//! tool_use (assistant)          → tool_calls[] {id, function {name, arguments: input as a JSON string}}
//! tool_result (user)            → a role "tool" message {tool_call_id, content}, before the user's other blocks
//! thinking (assistant)          → reasoning_content of the assistant message
//! ```
//!
//! Carried: `cache_control` rides on the content part it marked (text,
//! image, a `tool_result`'s content): LiteLLM-style backends read it there,
//! and vLLM and SGLang accept and ignore it (their prefix cache needs no
//! marker). Dropped, on purpose: `cache_control` on a tool definition (a
//! function tool has no place for it; prefix caching covers the tools),
//! `redacted_thinking` blocks (opaque to any other backend), `thinking`
//! (the request option: the backend's model reasons or not as it is
//! served, and its reasoning comes back as thinking blocks either way),
//! `service_tier` (a billing choice of Anthropic's), `context_management`
//! (Anthropic's server-side clearing of old tool results as a context
//! fills: a chat backend sees the whole context instead, as before the
//! option existed; Claude Code sends it on every turn), `metadata` members
//! other than `user_id`.
//!
//! Refused (a [`TranslateError`] naming the field): any other top-level
//! field, server tools (`tools[i].type`), documents, search results and
//! other block types, images inside a `tool_result` (a tool message holds
//! text only), file-id image sources.
//!
//! `is_error` on a `tool_result`: its text is prefixed with `Error: `, the
//! only way a tool message can say so.

use serde_json::{Map, Value, json};

use super::error::{TO_CHAT, TranslateError, malformed, untranslatable};

/// The OpenAI chat completions request for the Anthropic Messages
/// `request`.
///
/// # Errors
/// [`TranslateError`] naming the first field that has no faithful
/// counterpart, or that is not what Anthropic's API says it is.
pub fn messages_request_to_chat(request: &Value) -> Result<Value, TranslateError> {
    let fields = request.as_object().ok_or_else(|| malformed("", "a request is a JSON object"))?;
    let mut chat = Map::new();
    let mut messages = Vec::new();
    if let Some(system) = fields.get("system").filter(|system| !system.is_null()) {
        system_message(system, &mut messages)?;
    }
    for (key, value) in fields {
        // A member set to null is a member not given.
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "model" | "max_tokens" | "temperature" | "top_p" | "top_k" => {
                chat.insert(key.clone(), value.clone());
            }
            "stop_sequences" => {
                chat.insert("stop".into(), value.clone());
            }
            "stream" => {
                chat.insert("stream".into(), value.clone());
                if value.as_bool() == Some(true) {
                    chat.insert("stream_options".into(), json!({"include_usage": true}));
                }
            }
            "metadata" => {
                let user = value.get("user_id").filter(|user| !user.is_null());
                if let Some(user) = user {
                    chat.insert("user".into(), user.clone());
                }
            }
            "messages" => {
                let list = value.as_array().ok_or_else(|| malformed("messages", "an array"))?;
                for (at, message) in list.iter().enumerate() {
                    push_message(at, message, &mut messages)?;
                }
            }
            "tools" => {
                chat.insert("tools".into(), tools(value)?);
            }
            "tool_choice" => tool_choice(value, &mut chat)?,
            "system" | "thinking" | "service_tier" | "context_management" => {}
            _ => return Err(untranslatable(key.as_str(), TO_CHAT, "no counterpart; it would change the answer")),
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    Ok(Value::Object(chat))
}

/// The `system` prompt as a leading system message: a string as it is,
/// text blocks as text parts (one without `cache_control`: a string).
fn system_message(system: &Value, messages: &mut Vec<Value>) -> Result<(), TranslateError> {
    let content = match system {
        Value::String(text) => Value::String(text.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (at, block) in blocks.iter().enumerate() {
                let path = || format!("system[{at}]");
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(text_part(block, &path)?),
                    _ => return Err(untranslatable(format!("system[{at}].type"), TO_CHAT, "only text blocks")),
                }
            }
            content_of(parts)
        }
        _ => return Err(malformed("system", "a string or an array of text blocks")),
    };
    messages.push(json!({"role": "system", "content": content}));
    Ok(())
}

/// Appends the chat messages of Anthropic message `at`.
fn push_message(at: usize, message: &Value, messages: &mut Vec<Value>) -> Result<(), TranslateError> {
    let role = message.get("role").and_then(Value::as_str);
    let content = message.get("content").ok_or_else(|| malformed(format!("messages[{at}].content"), "required"))?;
    match (role, content) {
        (Some(role @ ("user" | "assistant")), Value::String(text)) => {
            messages.push(json!({"role": role, "content": text}));
            Ok(())
        }
        (Some("user"), Value::Array(blocks)) => user_blocks(at, blocks, messages),
        (Some("assistant"), Value::Array(blocks)) => assistant_blocks(at, blocks, messages),
        (Some("user" | "assistant"), _) => {
            Err(malformed(format!("messages[{at}].content"), "a string or an array of content blocks"))
        }
        _ => Err(malformed(format!("messages[{at}].role"), "\"user\" or \"assistant\"")),
    }
}

/// A user turn: its `tool_result` blocks as tool messages first (Anthropic
/// puts them first in the turn, and a tool message must follow the
/// assistant's call), then one user message with the other blocks.
fn user_blocks(at: usize, blocks: &[Value], messages: &mut Vec<Value>) -> Result<(), TranslateError> {
    let mut parts = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        let path = || format!("messages[{at}].content[{index}]");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(text_part(block, &path)?),
            Some("image") => parts.push(image_part(block, &path)?),
            Some("tool_result") => messages.push(tool_message(block, &path)?),
            _ => return Err(untranslatable(format!("{}.type", path()), TO_CHAT, "no counterpart for this block")),
        }
    }
    if !parts.is_empty() {
        messages.push(json!({"role": "user", "content": content_of(parts)}));
    }
    Ok(())
}

/// An assistant turn: text as content, thinking as `reasoning_content`,
/// `tool_use` as `tool_calls` (their order among the text is not kept: a
/// chat message has its content, then its calls).
fn assistant_blocks(at: usize, blocks: &[Value], messages: &mut Vec<Value>) -> Result<(), TranslateError> {
    let mut parts = Vec::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        let path = || format!("messages[{at}].content[{index}]");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(text_part(block, &path)?),
            Some("thinking") => {
                let thinking = block.get("thinking").and_then(Value::as_str);
                reasoning.push_str(thinking.ok_or_else(|| malformed(format!("{}.thinking", path()), "a string"))?);
            }
            Some("redacted_thinking") => {}
            Some("tool_use") => calls.push(tool_call(block, &path)?),
            _ => return Err(untranslatable(format!("{}.type", path()), TO_CHAT, "no counterpart for this block")),
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    let content = match (parts.is_empty(), calls.is_empty()) {
        // As OpenAI writes a message that only calls tools.
        (true, false) => Value::Null,
        (true, true) => Value::String(String::new()),
        (false, _) => content_of(parts),
    };
    message.insert("content".into(), content);
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), Value::String(reasoning));
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    messages.push(Value::Object(message));
    Ok(())
}

/// Parts as message content: a lone text part without `cache_control` as
/// a plain string (what every chat template reads), otherwise the parts.
fn content_of(mut parts: Vec<Value>) -> Value {
    let lone_text = parts.len() == 1 && parts[0].get("cache_control").is_none() && parts[0]["type"] == "text";
    match parts.pop() {
        Some(Value::Object(mut part)) if lone_text => part.remove("text").unwrap_or_default(),
        Some(last) => {
            parts.push(last);
            Value::Array(parts)
        }
        None => Value::String(String::new()),
    }
}

/// Keeps the block's `cache_control` on the part made of it.
fn with_cache_control(mut part: Value, block: &Value) -> Value {
    if let (Some(marker), Some(object)) = (block.get("cache_control"), part.as_object_mut()) {
        object.insert("cache_control".into(), marker.clone());
    }
    part
}

fn text_part(block: &Value, path: &dyn Fn() -> String) -> Result<Value, TranslateError> {
    let text =
        block.get("text").and_then(Value::as_str).ok_or_else(|| malformed(format!("{}.text", path()), "a string"))?;
    Ok(with_cache_control(json!({"type": "text", "text": text}), block))
}

fn image_part(block: &Value, path: &dyn Fn() -> String) -> Result<Value, TranslateError> {
    let source = block.get("source").ok_or_else(|| malformed(format!("{}.source", path()), "required"))?;
    let field = |name: &str| {
        source
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(format!("{}.source.{name}", path()), "a string"))
    };
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => format!("data:{};base64,{}", field("media_type")?, field("data")?),
        Some("url") => field("url")?.to_owned(),
        _ => return Err(untranslatable(format!("{}.source.type", path()), TO_CHAT, "only base64 and url images")),
    };
    Ok(with_cache_control(json!({"type": "image_url", "image_url": {"url": url}}), block))
}

fn tool_call(block: &Value, path: &dyn Fn() -> String) -> Result<Value, TranslateError> {
    let field = |name: &str| {
        block.get(name).and_then(Value::as_str).ok_or_else(|| malformed(format!("{}.{name}", path()), "a string"))
    };
    let input = block.get("input").ok_or_else(|| malformed(format!("{}.input", path()), "required"))?;
    Ok(json!({
        "id": field("id")?,
        "type": "function",
        "function": {"name": field("name")?, "arguments": input.to_string()},
    }))
}

/// A `tool_result` block as a tool message: its text (blocks joined by a
/// newline, as vLLM joins text parts), `Error: ` first when `is_error`;
/// with `cache_control` (on the block or one of its text blocks) the text
/// is one part carrying it.
fn tool_message(block: &Value, path: &dyn Fn() -> String) -> Result<Value, TranslateError> {
    let id = block.get("tool_use_id").and_then(Value::as_str);
    let id = id.ok_or_else(|| malformed(format!("{}.tool_use_id", path()), "a string"))?;
    let mut text = String::new();
    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        text.push_str("Error: ");
    }
    let mut cache_control = block.get("cache_control");
    match block.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(content)) => text.push_str(content),
        Some(Value::Array(inner)) => {
            for (at, item) in inner.iter().enumerate() {
                let field = || format!("{}.content[{at}]", path());
                if item.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(untranslatable(format!("{}.type", field()), TO_CHAT, "a tool message holds text only"));
                }
                let piece = item.get("text").and_then(Value::as_str);
                let piece = piece.ok_or_else(|| malformed(format!("{}.text", field()), "a string"))?;
                if at > 0 {
                    text.push('\n');
                }
                text.push_str(piece);
                cache_control = item.get("cache_control").or(cache_control);
            }
        }
        Some(_) => return Err(malformed(format!("{}.content", path()), "a string or an array of blocks")),
    }
    let content = match cache_control {
        Some(marker) => json!([{"type": "text", "text": text, "cache_control": marker}]),
        None => Value::String(text),
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

/// Anthropic tools as function tools; server tools (a `type` other than
/// `custom`) are refused.
fn tools(value: &Value) -> Result<Value, TranslateError> {
    let list = value.as_array().ok_or_else(|| malformed("tools", "an array"))?;
    let mut functions = Vec::with_capacity(list.len());
    for (at, tool) in list.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(_) => return Err(untranslatable(format!("tools[{at}].type"), TO_CHAT, "a server tool")),
        }
        let name = tool.get("name").and_then(Value::as_str);
        let name = name.ok_or_else(|| malformed(format!("tools[{at}].name"), "a string"))?;
        let mut function = Map::new();
        function.insert("name".into(), name.into());
        if let Some(description) = tool.get("description") {
            function.insert("description".into(), description.clone());
        }
        let schema =
            tool.get("input_schema").ok_or_else(|| malformed(format!("tools[{at}].input_schema"), "required"))?;
        function.insert("parameters".into(), schema.clone());
        functions.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(functions))
}

/// `tool_choice` (and its `disable_parallel_tool_use`).
fn tool_choice(value: &Value, chat: &mut Map<String, Value>) -> Result<(), TranslateError> {
    let choice = match value.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = value.get("name").and_then(Value::as_str);
            let name = name.ok_or_else(|| malformed("tool_choice.name", "a string"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(malformed("tool_choice.type", "auto, any, tool or none")),
    };
    chat.insert("tool_choice".into(), choice);
    if value.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
        chat.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    Ok(())
}
