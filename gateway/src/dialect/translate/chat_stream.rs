//! An OpenAI chat completion stream, made an Anthropic Messages stream:
//! fed one `data:` payload at a time, it writes the Anthropic events that
//! payload completes, and holds nothing of the answer but what the block
//! order forces it to (below).
//!
//! ```text
//! first chunk                      → message_start (usage.input_tokens if the chunk has usage, else 0)
//! delta.reasoning_content/reasoning→ a thinking block: content_block_start, thinking_delta…
//! delta.content                    → a text block: content_block_start, text_delta…
//! delta.tool_calls[i]              → a tool_use block per call (start with id and name, input {}),
//!                                    input_json_delta with each arguments piece
//! finish_reason                    → every block stopped; the stop reason kept
//! usage chunk (choices: [])        → message_delta (stop_reason, usage) and message_stop
//! [DONE]                           → the same, if the usage chunk never came
//! ```
//!
//! # Guarantees
//! Blocks are started and stopped strictly in turn with increasing
//! `index`, each stopped before the next starts (the order Claude Code
//! requires). A new call closes the one open when that one's arguments
//! are a whole JSON value yet (the usual case: servers stream calls one
//! after another, so each streams live). When calls interleave their
//! pieces, the later calls' pieces are held (at most
//! [`MAX_HELD_ARGUMENTS`] bytes in all) until the open call is whole or
//! the answer ends, then written as one delta each. Hostile input is
//! bounded ([`MAX_TOOL_CALLS`], [`MAX_TOOL_ID`]) and a malformed chunk
//! ends the stream with an Anthropic `error` event; nothing panics.

use serde_json::{Value, json};

use super::wire::{JsonDepth, Usage, anthropic_error, block_delta, is_done_marker, sse_event, stop_reason_of};

/// Most tool calls one answer may make.
pub const MAX_TOOL_CALLS: usize = 128;
/// Longest tool call id or function name, in bytes.
pub const MAX_TOOL_ID: usize = 256;
/// Most bytes of arguments held for calls that cannot be started yet.
pub const MAX_HELD_ARGUMENTS: usize = 4 << 20;

/// The translator of one stream.
#[derive(Debug)]
pub struct ChatStreamToMessages {
    model: String,
    phase: Phase,
    open: Open,
    next_block: u32,
    calls: Vec<Call>,
    held: usize,
    stop_reason: &'static str,
    stop_sequence: Option<String>,
    usage: Option<Usage>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing written yet.
    Waiting,
    /// `message_start` written; blocks flowing.
    Answering,
    /// The finish reason came; `message_delta` waits for the usage.
    Finished,
    /// `message_stop` or `error` written; the rest is ignored.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking(u32),
    Text(u32),
    /// The call at this position of `calls`, as block `u32`.
    Call(usize, u32),
}

#[derive(Debug)]
struct Call {
    /// Its `index` in the OpenAI stream.
    index: u64,
    id: Option<String>,
    name: Option<String>,
    state: CallState,
}

#[derive(Debug)]
enum CallState {
    /// Not started: its arguments so far.
    Held(String),
    /// Its block is open.
    Open(JsonDepth),
    Closed,
}

/// Why a stream cannot go on (the `error` event's message).
type Failure = &'static str;

impl ChatStreamToMessages {
    /// A translator for the answer to a request for `model` (named in
    /// `message_start` when the chunks do not name it).
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            phase: Phase::Waiting,
            open: Open::None,
            next_block: 0,
            calls: Vec::new(),
            held: 0,
            stop_reason: "end_turn",
            stop_sequence: None,
            usage: None,
        }
    }

    /// Whether the stream has ended (`message_stop` or `error` written).
    #[cfg_attr(not(test), allow(dead_code, reason = "the proxy asks the translator, not the machine"))]
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Reads one `data:` payload (a chunk, or `[DONE]`) and writes the
    /// events it completes to `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.phase == Phase::Done {
            return;
        }
        if is_done_marker(data) {
            return self.end(out);
        }
        if self.plain_chunk(data, out) {
            return;
        }
        let result = match serde_json::from_slice::<Value>(data) {
            Ok(chunk) => self.chunk(&chunk, out),
            Err(_) => Err("the backend sent a chunk that is not JSON"),
        };
        if let Err(why) = result {
            self.fail(why, out);
        }
    }

    /// The backend's stream ended (the connection, not `[DONE]`): an
    /// `error` event unless the answer was complete.
    pub fn close(&mut self, out: &mut Vec<u8>) {
        if self.phase == Phase::Finished {
            return self.end(out);
        }
        if self.phase != Phase::Done {
            self.fail("the backend's stream ended before the answer did", out);
        }
    }

    fn fail(&mut self, why: &str, out: &mut Vec<u8>) {
        anthropic_error("api_error", why, out);
        self.phase = Phase::Done;
    }

    fn chunk(&mut self, chunk: &Value, out: &mut Vec<u8>) -> Result<(), Failure> {
        if let Some(error) = chunk.get("error") {
            let message = error.get("message").and_then(Value::as_str).unwrap_or("the backend failed");
            self.fail(message, out);
            return Ok(());
        }
        let usage = chunk.get("usage").and_then(Usage::of_openai);
        if self.phase == Phase::Waiting {
            self.start(chunk, usage, out);
        }
        if usage.is_some() {
            self.usage = usage;
        }
        let choices = match chunk.get("choices") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(choices)) => choices.as_slice(),
            Some(_) => return Err("the backend sent a chunk whose choices are not an array"),
        };
        // Only the first choice: a translated request asks for one.
        let choice = choices.iter().find(|choice| choice.get("index").and_then(Value::as_u64).unwrap_or(0) == 0);
        match choice {
            Some(choice) if self.phase == Phase::Answering => self.choice(choice, out),
            // The usage chunk after the finish reason: the end.
            None if self.phase == Phase::Finished && usage.is_some() => {
                self.end(out);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn start(&mut self, chunk: &Value, usage: Option<Usage>, out: &mut Vec<u8>) {
        let id = chunk.get("id").and_then(Value::as_str).unwrap_or("msg_waycast");
        let model = chunk.get("model").and_then(Value::as_str).unwrap_or(&self.model);
        let mut start_usage = json!({"input_tokens": 0, "output_tokens": 0});
        if let Some(usage) = usage {
            start_usage = json!({
                "input_tokens": usage.input(),
                "output_tokens": 0,
                "cache_read_input_tokens": usage.cache_read,
            });
        }
        let message = json!({
            "type": "message_start",
            "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": start_usage,
            },
        });
        sse_event("message_start", &message, out);
        self.phase = Phase::Answering;
    }

    /// The chunk a stream is mostly made of — text or reasoning for the
    /// first choice, nothing else — read into borrowed fields without a
    /// tree; `false` for anything else (usage, an error, tool calls, the
    /// finish, a field of another type, a repeated key), which the general
    /// reading below takes, so both read every chunk alike.
    fn plain_chunk(&mut self, data: &[u8], out: &mut Vec<u8>) -> bool {
        if self.phase != Phase::Answering || memchr::memmem::find(data, b"\"error\"").is_some() {
            return false;
        }
        let Ok(chunk) = serde_json::from_slice::<PlainChunk<'_>>(data) else { return false };
        if chunk.usage.is_some() {
            return false;
        }
        let Some(choice) = chunk.choices.iter().find(|choice| choice.index == 0) else { return true };
        let delta = choice.delta.as_ref();
        if choice.finish_reason.is_some() || delta.is_some_and(|delta| delta.tool_calls.is_some()) {
            return false;
        }
        let text_of = non_empty;
        let thinking = delta
            .and_then(|delta| text_of(delta.reasoning_content.as_ref()).or_else(|| text_of(delta.reasoning.as_ref())));
        self.texts(thinking, delta.and_then(|delta| text_of(delta.content.as_ref())), out);
        true
    }

    fn choice(&mut self, choice: &Value, out: &mut Vec<u8>) -> Result<(), Failure> {
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        let text_of = |key: &str| delta.get(key).and_then(Value::as_str).filter(|text| !text.is_empty());
        self.texts(text_of("reasoning_content").or_else(|| text_of("reasoning")), text_of("content"), out);
        match delta.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                for call in calls {
                    self.call_piece(call, out)?;
                }
            }
            Some(_) => return Err("the backend sent tool calls that are not an array"),
        }
        if let Some(finish) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish(finish, choice.get("stop_reason"), out)?;
        }
        Ok(())
    }

    /// A delta's reasoning, then its text, each into its block.
    fn texts(&mut self, thinking: Option<&str>, text: Option<&str>, out: &mut Vec<u8>) {
        if let Some(thinking) = thinking {
            let index = match self.open {
                Open::Thinking(index) => index,
                _ => self.open_block(json!({"type": "thinking", "thinking": "", "signature": ""}), Open::Thinking, out),
            };
            block_delta(index, "thinking_delta", "thinking", thinking, out);
        }
        if let Some(text) = text {
            let index = match self.open {
                Open::Text(index) => index,
                _ => self.open_block(json!({"type": "text", "text": ""}), Open::Text, out),
            };
            block_delta(index, "text_delta", "text", text, out);
        }
    }

    /// Stops the open block and starts `block` as the next index.
    fn open_block(&mut self, block: Value, open: fn(u32) -> Open, out: &mut Vec<u8>) -> u32 {
        self.stop_open(out);
        let index = self.next_block;
        self.next_block += 1;
        let start = json!({"type": "content_block_start", "index": index, "content_block": block});
        sse_event("content_block_start", &start, out);
        self.open = open(index);
        index
    }

    fn stop_open(&mut self, out: &mut Vec<u8>) {
        let index = match self.open {
            Open::None => return,
            Open::Thinking(index) | Open::Text(index) => index,
            Open::Call(at, index) => {
                self.calls[at].state = CallState::Closed;
                index
            }
        };
        sse_event("content_block_stop", &json!({"type": "content_block_stop", "index": index}), out);
        self.open = Open::None;
    }

    /// One piece of a call: its id and name when first seen, a piece of
    /// its arguments.
    fn call_piece(&mut self, piece: &Value, out: &mut Vec<u8>) -> Result<(), Failure> {
        let index =
            piece.get("index").and_then(Value::as_u64).ok_or("the backend sent a tool call without an index")?;
        let at = match self.calls.iter().position(|call| call.index == index) {
            Some(at) => at,
            None if self.calls.len() >= MAX_TOOL_CALLS => return Err("the backend made too many tool calls"),
            None => {
                self.calls.push(Call { index, id: None, name: None, state: CallState::Held(String::new()) });
                self.calls.len() - 1
            }
        };
        let function = piece.get("function");
        let bounded = |value: Option<&Value>| match value.and_then(Value::as_str) {
            Some(text) if text.len() > MAX_TOOL_ID => Err("the backend sent a tool call id or name too long"),
            other => Ok(other.filter(|text| !text.is_empty()).map(str::to_owned)),
        };
        let id = bounded(piece.get("id"))?;
        let name = bounded(function.and_then(|function| function.get("name")))?;
        let call = &mut self.calls[at];
        call.id = call.id.take().or(id);
        call.name = call.name.take().or(name);
        let arguments = function.and_then(|function| function.get("arguments")).and_then(Value::as_str).unwrap_or("");
        match &mut call.state {
            CallState::Open(depth) => {
                depth.feed(arguments);
                if let Open::Call(_, block) = self.open
                    && !arguments.is_empty()
                {
                    block_delta(block, "input_json_delta", "partial_json", arguments, out);
                }
            }
            CallState::Closed if arguments.trim().is_empty() => {}
            CallState::Closed => return Err("the backend continued a tool call's arguments after they were whole"),
            CallState::Held(held) => {
                self.held += arguments.len();
                if self.held > MAX_HELD_ARGUMENTS {
                    return Err("the backend interleaved more tool call arguments than the gateway holds");
                }
                held.push_str(arguments);
            }
        }
        let startable = matches!(self.calls[at].state, CallState::Held(_)) && self.calls[at].name.is_some();
        let open_is_whole = match self.open {
            Open::Call(open, _) => matches!(&self.calls[open].state, CallState::Open(depth) if depth.is_complete()),
            _ => true,
        };
        if startable && open_is_whole {
            self.start_call(at, out);
        }
        Ok(())
    }

    /// Starts call `at`'s block, writing what was held of its arguments.
    fn start_call(&mut self, at: usize, out: &mut Vec<u8>) {
        let call = &self.calls[at];
        let id = match &call.id {
            Some(id) => id.clone(),
            // Some servers send no id; the client needs one to answer the call.
            None => format!("toolu_waycast_{}", call.index),
        };
        let block = json!({"type": "tool_use", "id": id, "name": call.name, "input": {}});
        let index = self.open_block(block, |index| Open::Call(0, index), out);
        self.open = Open::Call(at, index);
        let held = match std::mem::replace(&mut self.calls[at].state, CallState::Closed) {
            CallState::Held(held) => held,
            _ => String::new(),
        };
        self.held -= held.len();
        let mut depth = JsonDepth::default();
        depth.feed(&held);
        if !held.is_empty() {
            block_delta(index, "input_json_delta", "partial_json", &held, out);
        }
        self.calls[at].state = CallState::Open(depth);
    }

    /// The finish reason: every block stopped, the held calls written.
    fn finish(&mut self, finish: &str, matched: Option<&Value>, out: &mut Vec<u8>) -> Result<(), Failure> {
        self.stop_open(out);
        for at in 0..self.calls.len() {
            if matches!(self.calls[at].state, CallState::Held(_)) {
                if self.calls[at].name.is_none() {
                    return Err("the backend made a tool call without a name");
                }
                self.start_call(at, out);
                self.stop_open(out);
            }
        }
        self.stop_reason = stop_reason_of(finish);
        if !self.calls.is_empty() {
            // Some servers say `stop` after a call; the client must run it.
            self.stop_reason = "tool_use";
        }
        if self.stop_reason == "end_turn"
            && let Some(sequence) = matched.and_then(Value::as_str)
        {
            self.stop_reason = "stop_sequence";
            self.stop_sequence = Some(sequence.to_owned());
        }
        self.phase = Phase::Finished;
        Ok(())
    }

    /// `message_delta` and `message_stop` (after stopping what is open,
    /// when the backend ended without a finish reason).
    fn end(&mut self, out: &mut Vec<u8>) {
        match self.phase {
            Phase::Waiting => return self.fail("the backend ended its stream without an answer", out),
            Phase::Answering => {
                if let Err(why) = self.finish("stop", None, out) {
                    return self.fail(why, out);
                }
            }
            Phase::Finished => {}
            Phase::Done => return,
        }
        let usage = self.usage.unwrap_or_default();
        let mut delta_usage = json!({"output_tokens": usage.output});
        if self.usage.is_some() {
            delta_usage["input_tokens"] = json!(usage.input());
            delta_usage["cache_read_input_tokens"] = json!(usage.cache_read);
        }
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
            "usage": delta_usage,
        });
        sse_event("message_delta", &delta, out);
        sse_event("message_stop", &json!({"type": "message_stop"}), out);
        self.phase = Phase::Done;
    }
}

/// A text that is there and not empty.
fn non_empty<'t>(text: Option<&'t std::borrow::Cow<'_, str>>) -> Option<&'t str> {
    text.map(|text| &**text).filter(|text| !text.is_empty())
}

/// A chunk as [`ChatStreamToMessages::plain_chunk`] reads it: the fields
/// it acts on, borrowed where they hold no escapes; the rest skipped.
#[derive(serde::Deserialize)]
struct PlainChunk<'a> {
    #[serde(borrow)]
    choices: Vec<PlainChoice<'a>>,
    #[serde(default)]
    usage: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct PlainChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(default, borrow)]
    delta: Option<PlainDelta<'a>>,
    #[serde(default)]
    finish_reason: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct PlainDelta<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

#[cfg(test)]
#[path = "chat_stream_tests.rs"]
mod tests;
