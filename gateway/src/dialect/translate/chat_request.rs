//! An OpenAI chat completions request, made an Anthropic Messages request
//! (an OpenAI client in front of an Anthropic-format backend).
//!
//! Translated: `model`; `max_completion_tokens` or `max_tokens` →
//! `max_tokens` ([`DEFAULT_MAX_TOKENS`] when neither is given: Anthropic
//! requires one); `temperature` (refused above 1, Anthropic's ceiling);
//! `top_p`, `top_k`; `stop` → `stop_sequences`; `stream`; `user` →
//! `metadata.user_id`; function `tools` → tools with `input_schema`
//! (`parameters`, or an empty object schema); `tool_choice` (`auto`,
//! `required` → `any`, `none`, a named function → `tool`);
//! `parallel_tool_calls: false` → `disable_parallel_tool_use`.
//!
//! Messages:
//!
//! ```text
//! system, developer        → `system` text blocks (all of them, in order, wherever they stood)
//! user text / image_url    → text / image blocks (data: URLs as base64 sources, others as url sources)
//! assistant content        → text blocks
//! assistant tool_calls     → tool_use blocks, `arguments` parsed into `input`
//! tool                     → tool_result blocks of one user turn (consecutive ones merged,
//!                            a user message right after them joins the same turn)
//! ```
//!
//! Carried: `cache_control` on a content part, to the block made of it.
//! Dropped, on purpose: `stream_options` (Anthropic streams always carry
//! usage; the stream translator is told whether the client asked),
//! `reasoning_content` of assistant history (Anthropic accepts thinking
//! only with the signature it issued), a message's `name`, an image's
//! `detail`, `seed`, `store`, `metadata`, `service_tier`, `n: 1`,
//! `response_format: {"type": "text"}`, zero penalties, `logprobs: false`.
//!
//! Refused (a [`TranslateError`] naming the field): `n` above 1,
//! `response_format` other than text, non-zero `frequency_penalty` or
//! `presence_penalty`, `logit_bias`, `logprobs`, `top_logprobs`,
//! `reasoning_effort`, audio and other modalities, `functions` and
//! `function_call` (the legacy form), `function` messages, audio and file
//! parts, tool arguments that are not a JSON object, any other top-level
//! field.

use serde_json::{Map, Value, json};

use super::error::{TO_MESSAGES, TranslateError, malformed, untranslatable};

/// `max_tokens` when the client gives no bound: Anthropic requires one,
/// and every Anthropic model accepts this one (LiteLLM's default too).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The Anthropic Messages request for the OpenAI chat completions
/// `request`.
///
/// # Errors
/// [`TranslateError`] naming the first field that has no faithful
/// counterpart, or that is not what OpenAI's API says it is.
pub fn chat_request_to_messages(request: &Value) -> Result<Value, TranslateError> {
    let fields = request.as_object().ok_or_else(|| malformed("", "a request is a JSON object"))?;
    let mut anthropic = Map::new();
    let mut max_tokens = None;
    let mut parallel = true;
    for (key, value) in fields {
        let refuse = |why| Err(untranslatable(key.as_str(), TO_MESSAGES, why));
        // A member set to null is a member not given (as OpenAI reads it).
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "model" | "top_p" | "top_k" | "stream" => {
                anthropic.insert(key.clone(), value.clone());
            }
            "temperature" if value.as_f64().is_some_and(|t| t > 1.0) => return refuse("Anthropic's ceiling is 1"),
            "temperature" => {
                anthropic.insert(key.clone(), value.clone());
            }
            "max_completion_tokens" => max_tokens = Some(value.clone()),
            "max_tokens" => max_tokens = max_tokens.or_else(|| Some(value.clone())),
            "stop" => {
                let stops = match value {
                    Value::String(one) => json!([one]),
                    other => other.clone(),
                };
                anthropic.insert("stop_sequences".into(), stops);
            }
            "user" => {
                anthropic.insert("metadata".into(), json!({"user_id": value}));
            }
            "messages" => {
                let (system, messages) = messages(value)?;
                if !system.is_empty() {
                    anthropic.insert("system".into(), Value::Array(system));
                }
                anthropic.insert("messages".into(), Value::Array(messages));
            }
            "tools" => {
                anthropic.insert("tools".into(), tools(value)?);
            }
            "parallel_tool_calls" => parallel = value.as_bool() != Some(false),
            "tool_choice" | "stream_options" | "seed" | "store" | "metadata" | "service_tier" => {}
            "n" if value.as_u64() != Some(1) => {
                return refuse("Anthropic answers one choice");
            }
            "response_format" if value.get("type").and_then(Value::as_str) != Some("text") => {
                return refuse("Anthropic has no structured output mode");
            }
            "frequency_penalty" | "presence_penalty" if value.as_f64().is_some_and(|p| p != 0.0) => {
                return refuse("Anthropic has no penalties");
            }
            "logprobs" if value.as_bool() == Some(true) => return refuse("Anthropic returns no log probabilities"),
            "modalities" if value.as_array().is_some_and(|m| m.iter().any(|m| m != "text")) => {
                return refuse("Anthropic answers text only");
            }
            "n" | "response_format" | "frequency_penalty" | "presence_penalty" | "logprobs" | "modalities" => {}
            _ => return refuse("no counterpart; it would change the answer"),
        }
    }
    if let Some(choice) = fields.get("tool_choice").filter(|choice| !choice.is_null()) {
        anthropic.insert("tool_choice".into(), tool_choice(choice, parallel)?);
    } else if !parallel {
        anthropic.insert("tool_choice".into(), json!({"type": "auto", "disable_parallel_tool_use": true}));
    }
    anthropic.insert("max_tokens".into(), max_tokens.unwrap_or_else(|| json!(DEFAULT_MAX_TOKENS)));
    Ok(Value::Object(anthropic))
}

/// The system blocks and the turns of `messages`.
fn messages(value: &Value) -> Result<(Vec<Value>, Vec<Value>), TranslateError> {
    let list = value.as_array().ok_or_else(|| malformed("messages", "an array"))?;
    let mut system = Vec::new();
    let mut turns: Vec<Value> = Vec::with_capacity(list.len());
    // Whether the last turn is the user turn tool messages opened.
    let mut open_results = false;
    for (at, message) in list.iter().enumerate() {
        let path = || format!("messages[{at}]");
        let content = message.get("content").unwrap_or(&Value::Null);
        match message.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => system.extend(blocks(content, &|| format!("{}.content", path()))?),
            Some("user") if !open_results && content.is_string() => {
                turns.push(json!({"role": "user", "content": content}));
            }
            Some("user") => {
                let blocks = blocks(content, &|| format!("{}.content", path()))?;
                if open_results {
                    extend_last(&mut turns, blocks);
                } else {
                    turns.push(json!({"role": "user", "content": blocks}));
                }
                open_results = false;
            }
            Some("assistant") => {
                turns.push(assistant_turn(message, &path)?);
                open_results = false;
            }
            Some("tool") => {
                let result = tool_result(message, &path)?;
                if open_results {
                    extend_last(&mut turns, vec![result]);
                } else {
                    turns.push(json!({"role": "user", "content": [result]}));
                }
                open_results = true;
            }
            _ => return Err(untranslatable(format!("{}.role", path()), TO_MESSAGES, "no counterpart for this role")),
        }
    }
    Ok((system, turns))
}

fn extend_last(turns: &mut [Value], blocks: Vec<Value>) {
    if let Some(Value::Array(content)) = turns.last_mut().and_then(|turn| turn.get_mut("content")) {
        content.extend(blocks);
    }
}

/// Content (a string, parts or null) as Anthropic blocks; empty text is
/// left out (Anthropic refuses empty text blocks).
fn blocks(content: &Value, path: &dyn Fn() -> String) -> Result<Vec<Value>, TranslateError> {
    let parts = match content {
        Value::Null => return Ok(Vec::new()),
        Value::String(text) if text.is_empty() => return Ok(Vec::new()),
        Value::String(text) => return Ok(vec![json!({"type": "text", "text": text})]),
        Value::Array(parts) => parts,
        _ => return Err(malformed(path(), "a string or an array of content parts")),
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for (at, part) in parts.iter().enumerate() {
        let field = |name: &str| format!("{}[{at}].{name}", path());
        let mut block = match part.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text =
                    part.get("text").and_then(Value::as_str).ok_or_else(|| malformed(field("text"), "a string"))?;
                if text.is_empty() {
                    continue;
                }
                json!({"type": "text", "text": text})
            }
            Some("image_url") => {
                let url = part.get("image_url").and_then(|image| image.get("url")).and_then(Value::as_str);
                image_block(url.ok_or_else(|| malformed(field("image_url.url"), "a string"))?)
            }
            _ => return Err(untranslatable(field("type"), TO_MESSAGES, "no counterpart for this part")),
        };
        if let (Some(marker), Some(object)) = (part.get("cache_control"), block.as_object_mut()) {
            object.insert("cache_control".into(), marker.clone());
        }
        blocks.push(block);
    }
    Ok(blocks)
}

/// An image block: a `data:` URL as a base64 source, any other as a url
/// source.
fn image_block(url: &str) -> Value {
    let inline = url.strip_prefix("data:").and_then(|rest| rest.split_once(";base64,"));
    match inline {
        Some((media_type, data)) => {
            json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
        }
        None => json!({"type": "image", "source": {"type": "url", "url": url}}),
    }
}

/// An assistant message: its text, then its calls as `tool_use` blocks.
fn assistant_turn(message: &Value, path: &dyn Fn() -> String) -> Result<Value, TranslateError> {
    let mut content = blocks(message.get("content").unwrap_or(&Value::Null), &|| format!("{}.content", path()))?;
    if let Some(calls) = message.get("tool_calls").filter(|calls| !calls.is_null()) {
        let calls = calls.as_array().ok_or_else(|| malformed(format!("{}.tool_calls", path()), "an array"))?;
        for (at, call) in calls.iter().enumerate() {
            let field = |name: &str| format!("{}.tool_calls[{at}].{name}", path());
            let text = |name: &str, value: Option<&Value>| {
                value.and_then(Value::as_str).map(str::to_owned).ok_or_else(|| malformed(field(name), "a string"))
            };
            let function = call.get("function");
            let arguments = text("function.arguments", function.and_then(|f| f.get("arguments")))?;
            let input = tool_input(&arguments).ok_or_else(|| {
                untranslatable(field("function.arguments"), TO_MESSAGES, "a tool's input is a JSON object")
            })?;
            content.push(json!({
                "type": "tool_use",
                "id": text("id", call.get("id"))?,
                "name": text("function.name", function.and_then(|f| f.get("name")))?,
                "input": input,
            }));
        }
    }
    if message.get("function_call").is_some_and(|call| !call.is_null()) {
        return Err(untranslatable(format!("{}.function_call", path()), TO_MESSAGES, "the legacy form"));
    }
    Ok(json!({"role": "assistant", "content": content}))
}

/// A call's `arguments` as an input object (`""`, which some servers send
/// for a call without arguments, as `{}`); `None` when not an object.
pub(super) fn tool_input(arguments: &str) -> Option<Value> {
    if arguments.trim().is_empty() {
        return Some(json!({}));
    }
    serde_json::from_str::<Value>(arguments).ok().filter(Value::is_object)
}

/// A tool message as a `tool_result` block (its text parts as text blocks).
fn tool_result(message: &Value, path: &dyn Fn() -> String) -> Result<Value, TranslateError> {
    let id = message.get("tool_call_id").and_then(Value::as_str);
    let id = id.ok_or_else(|| malformed(format!("{}.tool_call_id", path()), "a string"))?;
    let content = match message.get("content").unwrap_or(&Value::Null) {
        Value::String(text) => Value::String(text.clone()),
        other => Value::Array(blocks(other, &|| format!("{}.content", path()))?),
    };
    Ok(json!({"type": "tool_result", "tool_use_id": id, "content": content}))
}

/// Function tools as Anthropic tools.
fn tools(value: &Value) -> Result<Value, TranslateError> {
    let list = value.as_array().ok_or_else(|| malformed("tools", "an array"))?;
    let mut tools = Vec::with_capacity(list.len());
    for (at, tool) in list.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(untranslatable(format!("tools[{at}].type"), TO_MESSAGES, "function tools only"));
        }
        let function = tool.get("function").ok_or_else(|| malformed(format!("tools[{at}].function"), "required"))?;
        let name = function.get("name").and_then(Value::as_str);
        let name = name.ok_or_else(|| malformed(format!("tools[{at}].function.name"), "a string"))?;
        let schema = function.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        let mut out = Map::new();
        out.insert("name".into(), name.into());
        if let Some(description) = function.get("description") {
            out.insert("description".into(), description.clone());
        }
        out.insert("input_schema".into(), schema);
        if let Some(marker) = tool.get("cache_control") {
            out.insert("cache_control".into(), marker.clone());
        }
        tools.push(Value::Object(out));
    }
    Ok(Value::Array(tools))
}

/// `tool_choice`, with `disable_parallel_tool_use` unless `parallel`.
fn tool_choice(value: &Value, parallel: bool) -> Result<Value, TranslateError> {
    let mut choice = match value {
        Value::String(mode) if mode == "auto" => json!({"type": "auto"}),
        Value::String(mode) if mode == "required" => json!({"type": "any"}),
        Value::String(mode) if mode == "none" => return Ok(json!({"type": "none"})),
        Value::Object(_) if value.get("type").and_then(Value::as_str) == Some("function") => {
            let name = value.get("function").and_then(|function| function.get("name")).and_then(Value::as_str);
            json!({"type": "tool", "name": name.ok_or_else(|| malformed("tool_choice.function.name", "a string"))?})
        }
        _ => return Err(untranslatable("tool_choice", TO_MESSAGES, "auto, required, none or a function")),
    };
    if !parallel && let Some(object) = choice.as_object_mut() {
        object.insert("disable_parallel_tool_use".into(), Value::Bool(true));
    }
    Ok(choice)
}
