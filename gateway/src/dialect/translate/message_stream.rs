//! An Anthropic Messages stream, made an OpenAI chat completion stream:
//! fed one event's `data:` payload at a time (the payload names its own
//! type; the `event:` line is not needed), it writes the chunks that
//! event makes, as `data: {chunk}\n\n` lines.
//!
//! ```text
//! message_start                         → the first chunk: delta {role: assistant, content: ""}
//! content_block_start tool_use          → delta.tool_calls [{index, id, type, function {name, arguments: ""}}]
//! content_block_delta text_delta        → delta.content
//! content_block_delta thinking_delta    → delta.reasoning_content
//! content_block_delta input_json_delta  → delta.tool_calls [{index, function {arguments}}]
//! message_delta                         → a chunk with finish_reason
//! message_stop                          → the usage chunk (choices: []) when the client asked, then [DONE]
//! error                                 → an OpenAI error payload, then [DONE]
//! ping, signature_delta, content_block_stop, unknown events → nothing (Anthropic asks clients to ignore new ones)
//! ```
//!
//! Calls are numbered 0, 1, … in the order their blocks start, as OpenAI
//! numbers them; at most [`MAX_TOOL_CALLS`](super::chat_stream::MAX_TOOL_CALLS).

use serde_json::Value;

use super::chat_stream::MAX_TOOL_CALLS;
use super::wire::Usage;
use crate::json_text::{decimal, json_string};

/// Longest message id or model name a backend's `message_start` may
/// carry, in bytes (each is repeated in every chunk written).
pub const MAX_NAME: usize = 256;

/// The translator of one stream.
#[derive(Debug)]
pub struct MessageStreamToChat {
    include_usage: bool,
    created: u64,
    /// `data: {"id":…,"object":"chat.completion.chunk","created":…,"model":…,"choices":`
    /// once `message_start` named them.
    prefix: Vec<u8>,
    /// Anthropic block index of each call, by OpenAI call index.
    calls: Vec<u64>,
    usage: Usage,
    done: bool,
}

impl MessageStreamToChat {
    /// A translator stamping chunks `created` (seconds since the epoch),
    /// adding the usage chunk when the client asked
    /// (`stream_options.include_usage`).
    pub fn new(include_usage: bool, created: u64) -> Self {
        Self { include_usage, created, prefix: Vec::new(), calls: Vec::new(), usage: Usage::default(), done: false }
    }

    /// Whether the stream has ended (`[DONE]` written).
    #[cfg_attr(not(test), allow(dead_code, reason = "the proxy asks the translator, not the machine"))]
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Reads one event's `data:` payload and writes the chunks it makes.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let event = match serde_json::from_slice::<Value>(data) {
            Ok(event) => event,
            Err(_) => return self.fail("api_error", "the backend sent an event that is not JSON", out),
        };
        if let Err(why) = self.event(&event, out) {
            self.fail("api_error", why, out);
        }
    }

    /// The backend's stream ended (the connection): an error payload
    /// unless `message_stop` came.
    pub fn close(&mut self, out: &mut Vec<u8>) {
        if !self.done {
            self.fail("api_error", "the backend's stream ended before the answer did", out);
        }
    }

    fn fail(&mut self, kind: &str, message: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: {\"error\":{\"message\":");
        json_string(message, out);
        out.extend_from_slice(b",\"type\":");
        json_string(kind, out);
        out.extend_from_slice(b",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n");
        self.done = true;
    }

    fn event(&mut self, event: &Value, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let kind = event.get("type").and_then(Value::as_str).unwrap_or_default();
        if kind == "error" {
            let error = event.get("error");
            let text = |key: &str| error.and_then(|error| error.get(key)).and_then(Value::as_str);
            self.fail(text("type").unwrap_or("api_error"), text("message").unwrap_or("the backend failed"), out);
            return Ok(());
        }
        if kind == "message_start" {
            return self.start(event, out);
        }
        if self.prefix.is_empty() && matches!(kind, "content_block_start" | "content_block_delta" | "message_delta") {
            return Err("the backend's stream did not start with message_start");
        }
        match kind {
            "content_block_start" => self.block_start(event, out),
            "content_block_delta" => self.block_delta(event, out),
            "message_delta" => {
                if let Some(usage) = event.get("usage").and_then(Usage::of_anthropic) {
                    self.usage.output = usage.output;
                    // Newer servers restate the input counts here.
                    if usage.prompt > 0 {
                        self.usage = Usage { output: usage.output, ..usage };
                    }
                }
                let stop = event.get("delta").and_then(|delta| delta.get("stop_reason")).and_then(Value::as_str);
                self.chunk(b"{}", Some(super::wire::finish_reason_of(stop.unwrap_or("end_turn"))), out);
                Ok(())
            }
            "message_stop" => {
                if self.include_usage {
                    self.usage_chunk(out);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.done = true;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn start(&mut self, event: &Value, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let message = event.get("message").ok_or("the backend's message_start has no message")?;
        let text = |key: &str| message.get(key).and_then(Value::as_str).unwrap_or_default();
        // Both are copied into every chunk: a backend's long ones would
        // multiply each event it sends.
        if text("id").len() > MAX_NAME || text("model").len() > MAX_NAME {
            return Err("the backend's message id or model name is too long");
        }
        if let Some(usage) = message.get("usage").and_then(Usage::of_anthropic) {
            self.usage = usage;
        }
        self.prefix.clear();
        self.prefix.extend_from_slice(b"data: {\"id\":");
        json_string(text("id"), &mut self.prefix);
        self.prefix.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        decimal(self.created, &mut self.prefix);
        self.prefix.extend_from_slice(b",\"model\":");
        json_string(text("model"), &mut self.prefix);
        self.prefix.extend_from_slice(b",\"choices\":");
        self.chunk(b"{\"role\":\"assistant\",\"content\":\"\"}", None, out);
        Ok(())
    }

    fn block_start(&mut self, event: &Value, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let block = event.get("content_block").ok_or("the backend's content_block_start has no block")?;
        let text = |key: &str| block.get(key).and_then(Value::as_str).filter(|text| !text.is_empty());
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(text) = text("text") {
                    self.text_chunk("content", text, out);
                }
            }
            Some("thinking") => {
                if let Some(text) = text("thinking") {
                    self.text_chunk("reasoning_content", text, out);
                }
            }
            Some("tool_use") => {
                if self.calls.len() >= MAX_TOOL_CALLS {
                    return Err("the backend made too many tool calls");
                }
                let block_index = event.get("index").and_then(Value::as_u64).ok_or("a block without an index")?;
                let (id, name) = (text("id").unwrap_or_default(), text("name").ok_or("a tool call without a name")?);
                let mut delta = Vec::with_capacity(96 + id.len() + name.len());
                delta.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
                decimal(self.calls.len() as u64, &mut delta);
                delta.extend_from_slice(b",\"id\":");
                json_string(id, &mut delta);
                delta.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                json_string(name, &mut delta);
                delta.extend_from_slice(b",\"arguments\":\"\"}}]}");
                self.calls.push(block_index);
                self.chunk(&delta, None, out);
            }
            _ => {}
        }
        Ok(())
    }

    fn block_delta(&mut self, event: &Value, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let delta = event.get("delta").ok_or("the backend's content_block_delta has no delta")?;
        let text = |key: &str| delta.get(key).and_then(Value::as_str).filter(|text| !text.is_empty());
        match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => {
                if let Some(text) = text("text") {
                    self.text_chunk("content", text, out);
                }
            }
            Some("thinking_delta") => {
                if let Some(text) = text("thinking") {
                    self.text_chunk("reasoning_content", text, out);
                }
            }
            Some("input_json_delta") => {
                let block_index = event.get("index").and_then(Value::as_u64);
                let call = self.calls.iter().position(|index| Some(*index) == block_index);
                let call = call.ok_or("the backend sent arguments for a block that is not a tool call")?;
                if let Some(piece) = text("partial_json") {
                    let mut chunk = Vec::with_capacity(64 + piece.len());
                    chunk.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
                    decimal(call as u64, &mut chunk);
                    chunk.extend_from_slice(b",\"function\":{\"arguments\":");
                    json_string(piece, &mut chunk);
                    chunk.extend_from_slice(b"}}]}");
                    self.chunk(&chunk, None, out);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn text_chunk(&self, field: &str, text: &str, out: &mut Vec<u8>) {
        let mut delta = Vec::with_capacity(16 + text.len());
        delta.extend_from_slice(b"{\"");
        delta.extend_from_slice(field.as_bytes());
        delta.extend_from_slice(b"\":");
        json_string(text, &mut delta);
        delta.push(b'}');
        self.chunk(&delta, None, out);
    }

    /// A chunk of the one choice with `delta` (JSON text).
    fn chunk(&self, delta: &[u8], finish: Option<&str>, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(b"[{\"index\":0,\"delta\":");
        out.extend_from_slice(delta);
        out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":");
        match finish {
            Some(reason) => json_string(reason, out),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"}]}\n\n");
    }

    fn usage_chunk(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(b"[],\"usage\":");
        let _ = serde_json::to_writer(&mut *out, &self.usage.to_openai());
        out.extend_from_slice(b"}\n\n");
    }
}
