//! What both dialects share on the wire, in one place: the stop reasons
//! and usage counts each names its own way, and the SSE framing of the
//! events the stream translators write.

use serde_json::{Map, Value};

use crate::json_text::{decimal, json_string};

/// Anthropic's `stop_reason` for OpenAI's `finish_reason`.
///
/// `content_filter` becomes `refusal`: the backend's filter stopped the
/// answer, which is what Anthropic's `refusal` says. An unknown reason is
/// `end_turn` (the answer ended, we cannot say more).
pub fn stop_reason_of(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// OpenAI's `finish_reason` for Anthropic's `stop_reason`.
///
/// `pause_turn` (a server tool's long turn, which the request translation
/// never asks for) is `stop`; a context window filled is `length`.
pub fn finish_reason_of(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// Token counts of an answer, as both dialects can say them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, those read from or written to a cache included
    /// (OpenAI's `prompt_tokens`).
    pub prompt: u64,
    /// Prompt tokens read from a cache.
    pub cache_read: u64,
    /// Prompt tokens written to a cache (Anthropic's only).
    pub cache_creation: u64,
    /// Output tokens.
    pub output: u64,
}

fn count(usage: &Map<String, Value>, key: &str) -> u64 {
    usage.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl Usage {
    /// An OpenAI `usage` object (`prompt_tokens`, `completion_tokens`,
    /// `prompt_tokens_details.cached_tokens`); `None` when it is not one.
    pub fn of_openai(usage: &Value) -> Option<Self> {
        let usage = usage.as_object()?;
        let cached = usage.get("prompt_tokens_details").and_then(|details| details.get("cached_tokens"));
        Some(Self {
            prompt: count(usage, "prompt_tokens"),
            cache_read: cached.and_then(Value::as_u64).unwrap_or(0),
            cache_creation: 0,
            output: count(usage, "completion_tokens"),
        })
    }

    /// An Anthropic `usage` object (`input_tokens` less the cache's
    /// share, `cache_read_input_tokens`, `cache_creation_input_tokens`,
    /// `output_tokens`); `None` when it is not one.
    pub fn of_anthropic(usage: &Value) -> Option<Self> {
        let usage = usage.as_object()?;
        let cache_read = count(usage, "cache_read_input_tokens");
        let cache_creation = count(usage, "cache_creation_input_tokens");
        Some(Self {
            prompt: count(usage, "input_tokens").saturating_add(cache_read).saturating_add(cache_creation),
            cache_read,
            cache_creation,
            output: count(usage, "output_tokens"),
        })
    }

    /// Anthropic's `input_tokens`: the prompt less what the cache served
    /// or stored.
    pub fn input(&self) -> u64 {
        self.prompt.saturating_sub(self.cache_read).saturating_sub(self.cache_creation)
    }

    /// As Anthropic's `usage` of a whole message.
    pub fn to_anthropic(self) -> Value {
        serde_json::json!({
            "input_tokens": self.input(),
            "output_tokens": self.output,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_creation,
        })
    }

    /// As OpenAI's `usage`.
    pub fn to_openai(self) -> Value {
        serde_json::json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.output,
            "total_tokens": self.prompt.saturating_add(self.output),
            "prompt_tokens_details": {"cached_tokens": self.cache_read},
        })
    }
}

/// Writes `event: {name}\ndata: {value}\n\n`.
pub fn sse_event(name: &str, value: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    // NB: writing a `Value` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
    out.extend_from_slice(b"\n\n");
}

/// Writes Anthropic's `content_block_delta` event for block `index`, its
/// delta `{"type": kind, field: text}`: by hand, as it is the event a
/// stream is mostly made of.
pub fn block_delta(index: u32, kind: &str, field: &str, text: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":");
    decimal(u64::from(index), out);
    out.extend_from_slice(b",\"delta\":{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"");
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(b"\":");
    json_string(text, out);
    out.extend_from_slice(b"}}\n\n");
}

/// Writes an Anthropic `error` event (`api_error`, or the type given).
pub fn anthropic_error(kind: &str, message: &str, out: &mut Vec<u8>) {
    let error = serde_json::json!({"type": "error", "error": {"type": kind, "message": message}});
    sse_event("error", &error, out);
}

/// Whether `bytes` are `[DONE]`, OpenAI's end of stream, spaces aside.
pub fn is_done_marker(bytes: &[u8]) -> bool {
    bytes.trim_ascii() == b"[DONE]"
}

/// Whether a JSON text streamed in pieces is one whole value yet: a
/// depth count over brackets outside strings, so that a tool call's
/// arguments can be judged complete without holding them.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonDepth {
    depth: u32,
    in_string: bool,
    escaped: bool,
    started: bool,
}

impl JsonDepth {
    /// Reads the next piece.
    pub fn feed(&mut self, piece: &str) {
        for &byte in piece.as_bytes() {
            if self.in_string {
                match byte {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth = self.depth.saturating_add(1);
                    self.started = true;
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
    }

    /// Whether an object or array has been opened and closed again.
    pub fn is_complete(&self) -> bool {
        self.started && self.depth == 0 && !self.in_string
    }
}
