//! A backend's answer made the client's, as the proxy relays it: a stream
//! event by event ([`StreamTranslator`], fed the upstream's frames as they
//! come, whatever their split points), or a whole body ([`whole_answer`]:
//! a non-streamed answer, or an error, read whole within a bound).

use http::StatusCode;
use serde_json::{Value, json};

use super::chat_stream::ChatStreamToMessages;
use super::message_stream::MessageStreamToChat;
use super::{chat_response_to_message, message_response_to_chat};
use crate::dialect::plan::Plan;

/// The most of one upstream event held while its end has not come: a
/// chat chunk is a few hundred bytes, a Messages event as small.
pub const MAX_EVENT: usize = 1 << 20;

/// The most of a whole answer read to translate it: a non-streamed
/// answer of 100,000 tokens is some 400 KiB, and parsing multiplies what
/// is held several times over.
pub const MAX_WHOLE_ANSWER: usize = 8 << 20;

/// The most of an error answer read: its message is all that is kept.
pub const MAX_ERROR_ANSWER: usize = 64 << 10;

/// One stream's translator: SSE events split out of the frames, each
/// event's `data:` payload given to the dialect's state machine.
#[derive(Debug)]
pub struct StreamTranslator {
    held: Vec<u8>,
    machine: Machine,
    closed: bool,
    overflowed: bool,
}

#[derive(Debug)]
enum Machine {
    ToMessages(Box<ChatStreamToMessages>),
    ToChat(Box<MessageStreamToChat>),
}

impl StreamTranslator {
    /// The translator for a stream answered under `plan`: `model` names
    /// the Messages answer, `include_usage` (the chat client asked) and
    /// `created` stamp the chat one. `None`: the plan relays the stream
    /// as it is.
    pub fn for_plan(plan: Plan, model: &str, include_usage: bool, created: u64) -> Option<Self> {
        let machine = match plan {
            Plan::MessagesOnChat => Machine::ToMessages(Box::new(ChatStreamToMessages::new(model))),
            Plan::ChatOnMessages => Machine::ToChat(Box::new(MessageStreamToChat::new(include_usage, created))),
            Plan::Pass | Plan::NotServed | Plan::CountOnTokenizer => return None,
        };
        Some(Self { held: Vec::new(), machine, closed: false, overflowed: false })
    }

    /// Reads the next bytes of the upstream stream; writes the client's
    /// events they complete to `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.closed {
            return;
        }
        let searched_from = self.held.len().saturating_sub(3);
        self.held.extend_from_slice(data);
        let mut start = 0;
        let mut from = searched_from;
        while let Some((end, next)) = event_end(&self.held[from..]).map(|(end, next)| (from + end, from + next)) {
            let event = &self.held[start..end];
            let payload = data_payload(event);
            if !payload.is_empty() {
                match &mut self.machine {
                    Machine::ToMessages(machine) => machine.push(&payload, out),
                    Machine::ToChat(machine) => machine.push(&payload, out),
                }
            }
            start = next;
            from = next;
        }
        self.held.drain(..start);
        if self.held.len() > MAX_EVENT {
            // An event longer than any a backend sends: the stream ends
            // here, with the client's error event.
            self.held = Vec::new();
            self.overflowed = true;
            self.close(out);
        }
    }

    /// The upstream stream ended: what the client's stream still needs
    /// (its last events, or an error event if the answer was cut short).
    pub fn close(&mut self, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        let rest = std::mem::take(&mut self.held);
        let payload = data_payload(&rest);
        match &mut self.machine {
            Machine::ToMessages(machine) => {
                if !payload.is_empty() {
                    machine.push(&payload, out);
                }
                machine.close(out);
            }
            Machine::ToChat(machine) => {
                if !payload.is_empty() {
                    machine.push(&payload, out);
                }
                machine.close(out);
            }
        }
    }

    /// Whether [`Self::close`] has run.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether the stream was ended by an event longer than [`MAX_EVENT`]
    /// (the backend's fault, not the client's).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
}

/// The end of the first event in `bytes` (where its blank line starts)
/// and where the next begins.
fn event_end(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut at = 0;
    while let Some(found) = memchr::memchr(b'\n', &bytes[at..]) {
        let newline = at + found;
        let rest = &bytes[newline + 1..];
        if rest.first() == Some(&b'\n') {
            return Some((newline, newline + 2));
        }
        if rest.starts_with(b"\r\n") {
            return Some((newline, newline + 3));
        }
        at = newline + 1;
    }
    None
}

/// The `data:` lines of one event, joined by newlines (as SSE reads them).
fn data_payload(event: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    for line in event.split(|byte| *byte == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(data) = line.strip_prefix(b"data:") {
            if !payload.is_empty() {
                payload.push(b'\n');
            }
            payload.extend_from_slice(data.strip_prefix(b" ").unwrap_or(data));
        }
    }
    payload
}

/// A whole answer translated for the client: its status and body.
#[derive(Debug, PartialEq, Eq)]
pub struct WholeAnswer {
    /// The status the client gets.
    pub status: StatusCode,
    /// The body, JSON in the client's dialect.
    pub body: Vec<u8>,
}

/// The whole answer `body` (with `status`) the backend gave under `plan`,
/// made the client's: a success translated (`model` names a Messages
/// answer, `created` stamps a chat one), an error put in the client's
/// error shape with its status kept. An answer that cannot be translated
/// is a 502 in the client's shape that says why.
pub fn whole_answer(plan: Plan, status: StatusCode, body: &[u8], model: &str, created: u64) -> WholeAnswer {
    let anthropic_client = matches!(plan, Plan::MessagesOnChat | Plan::CountOnTokenizer);
    let error = |status: StatusCode, message: &str| WholeAnswer {
        status,
        body: error_in(anthropic_client, status, message).to_string().into_bytes(),
    };
    if !status.is_success() {
        // Its status kept whatever its body is (an HTML page from a proxy):
        // an SDK decides by it whether to retry.
        let value = serde_json::from_slice::<Value>(body).unwrap_or_default();
        return error(status, &error_message(&value));
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return error(StatusCode::BAD_GATEWAY, "the backend's answer is not JSON");
    };
    let translated = match plan {
        Plan::MessagesOnChat => chat_response_to_message(&value, model),
        Plan::ChatOnMessages => message_response_to_chat(&value, created),
        Plan::CountOnTokenizer => match value.get("count").and_then(Value::as_u64) {
            Some(count) => Ok(json!({"input_tokens": count})),
            None => return error(StatusCode::BAD_GATEWAY, "the backend's tokenizer answered without a count"),
        },
        Plan::Pass | Plan::NotServed => Ok(value),
    };
    match translated {
        Ok(value) => WholeAnswer { status, body: value.to_string().into_bytes() },
        Err(why) => error(StatusCode::BAD_GATEWAY, &format!("the backend's answer cannot be translated: {why}")),
    }
}

/// The message of an error body in either dialect (both nest it under
/// `error.message`), or a general one.
fn error_message(value: &Value) -> String {
    let message = value.get("error").and_then(|error| error.get("message").or(Some(error)));
    match message {
        Some(Value::String(text)) => text.clone(),
        _ => "the backend refused the request".to_owned(),
    }
}

/// An error body for the client: Anthropic's shape or OpenAI's.
fn error_in(anthropic: bool, status: StatusCode, message: &str) -> Value {
    if anthropic {
        json!({"type": "error", "error": {"type": crate::dialect::anthropic::error_type(status), "message": message}})
    } else {
        let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
        json!({"error": {"message": message, "type": kind, "param": null, "code": "upstream_error"}})
    }
}

/// The answer when the backend's answer broke off, idled out or outgrew
/// the bound before it was whole: a 502 in the client's shape.
pub fn broken_answer(plan: Plan) -> WholeAnswer {
    let anthropic_client = matches!(plan, Plan::MessagesOnChat | Plan::CountOnTokenizer);
    let message = "the backend's answer broke off, idled out or was too large to translate";
    WholeAnswer {
        status: StatusCode::BAD_GATEWAY,
        body: error_in(anthropic_client, StatusCode::BAD_GATEWAY, message).to_string().into_bytes(),
    }
}

/// Whether a tokenizer's answer with `status` says the backend has none
/// (then the count is estimated; any other error is the client's to see).
pub fn has_no_tokenizer(status: StatusCode) -> bool {
    matches!(status.as_u16(), 404 | 405 | 501)
}

/// The answer to a token count when the backend has no tokenizer (a
/// server without `/tokenize`): an estimate, about four bytes of the
/// request a token, labelled as one.
pub fn estimated_count(request_bytes: usize) -> Vec<u8> {
    let tokens = request_bytes.div_ceil(4);
    json!({"input_tokens": tokens, "waycast_estimate": true}).to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    fn json_of_body(body: &[u8]) -> Value {
        serde_json::from_slice(body).unwrap()
    }

    fn events(out: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(out)
            .split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| event.lines().next().unwrap_or_default().to_owned())
            .collect()
    }

    /// A chat stream cut at every byte gives the same Messages events,
    /// with either line end.
    #[test]
    fn a_stream_is_translated_whatever_its_frames() {
        let stream = concat!(
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
            ": keep-alive\r\n\r\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\r\n\r\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        )
        .as_bytes();
        let mut whole = Vec::new();
        let mut translator = StreamTranslator::for_plan(Plan::MessagesOnChat, "m", false, 0).unwrap();
        translator.push(stream, &mut whole);
        translator.close(&mut whole);
        let expected = events(&whole);
        assert_eq!(expected.first().map(String::as_str), Some("event: message_start"));
        assert_eq!(expected.last().map(String::as_str), Some("event: message_stop"));
        for step in 1..stream.len() {
            let mut out = Vec::new();
            let mut translator = StreamTranslator::for_plan(Plan::MessagesOnChat, "m", false, 0).unwrap();
            for piece in stream.chunks(step) {
                translator.push(piece, &mut out);
            }
            translator.close(&mut out);
            assert_eq!(out, whole, "split every {step} bytes");
        }
    }

    /// An event that never ends is not held past the bound: the client's
    /// stream ends with an error event.
    #[test]
    fn an_endless_event_ends_the_stream_with_an_error() {
        let mut translator = StreamTranslator::for_plan(Plan::ChatOnMessages, "m", true, 7).unwrap();
        let mut out = Vec::new();
        let line = vec![b'x'; 64 * 1024];
        translator.push(b"data: ", &mut out);
        for _ in 0..(MAX_EVENT / line.len() + 1) {
            translator.push(&line, &mut out);
        }
        assert!(translator.is_closed() && translator.overflowed());
        assert!(String::from_utf8_lossy(&out).contains("\"error\""), "{}", String::from_utf8_lossy(&out));
        let before = out.len();
        translator.push(b"\n\n", &mut out);
        assert_eq!(out.len(), before, "nothing after the end");
    }

    /// A backend's `message_start` with a long id or model (copied into
    /// every chunk) ends the stream with an error instead.
    #[test]
    fn a_long_message_id_is_refused_not_repeated() {
        let long = "m".repeat(super::super::message_stream::MAX_NAME + 1);
        let start =
            json!({"type": "message_start", "message": {"id": long, "model": "m", "usage": {"input_tokens": 1}}});
        let mut translator = StreamTranslator::for_plan(Plan::ChatOnMessages, "m", false, 0).unwrap();
        let mut out = Vec::new();
        translator.push(format!("event: message_start\ndata: {start}\n\n").as_bytes(), &mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("\"error\"") && !text.contains(&long), "{text}");
    }

    /// Whole answers: a success translated, an error in the client's
    /// shape with its status, garbage a 502 that says so.
    #[test]
    fn whole_answers_are_translated_or_refused_in_the_clients_shape() {
        let chat = br#"{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
        let answer = whole_answer(Plan::MessagesOnChat, StatusCode::OK, chat, "claude", 0);
        let message: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(
            (answer.status, &message["type"], &message["content"][0]["text"]),
            (StatusCode::OK, &json!("message"), &json!("hi"))
        );
        assert_eq!(message["usage"]["output_tokens"], 1);

        let refused = br#"{"error":{"message":"context too long","type":"BadRequestError","code":400}}"#;
        let answer = whole_answer(Plan::MessagesOnChat, StatusCode::BAD_REQUEST, refused, "claude", 0);
        let body: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "context too long"}})
        );

        let anthropic_error = br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#;
        let answer = whole_answer(Plan::ChatOnMessages, StatusCode::from_u16(529).unwrap(), anthropic_error, "m", 0);
        let body: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(
            (answer.status.as_u16(), &body["error"]["message"], &body["error"]["type"]),
            (529, &json!("busy"), &json!("server_error"))
        );

        let answer = whole_answer(Plan::ChatOnMessages, StatusCode::OK, b"<html>", "m", 0);
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
        let answer = whole_answer(Plan::MessagesOnChat, StatusCode::UNAUTHORIZED, b"<html>no</html>", "m", 0);
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "the status kept whatever the body");
        assert_eq!(json_of_body(&answer.body)["error"]["type"], "authentication_error");
        assert_eq!(broken_answer(Plan::ChatOnMessages).status, StatusCode::BAD_GATEWAY);
        assert!(has_no_tokenizer(StatusCode::NOT_FOUND) && !has_no_tokenizer(StatusCode::UNAUTHORIZED));
        assert!(has_no_tokenizer(StatusCode::METHOD_NOT_ALLOWED) && has_no_tokenizer(StatusCode::NOT_IMPLEMENTED));
        assert!(!has_no_tokenizer(StatusCode::TOO_MANY_REQUESTS) && !has_no_tokenizer(StatusCode::BAD_GATEWAY));
        let answer = whole_answer(Plan::ChatOnMessages, StatusCode::OK, br#"{"content":"no blocks"}"#, "m", 0);
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
        assert!(String::from_utf8_lossy(&answer.body).contains("content"), "names the field");

        let answer = whole_answer(Plan::CountOnTokenizer, StatusCode::OK, br#"{"count":17,"tokens":[1]}"#, "m", 0);
        assert_eq!(answer.body, br#"{"input_tokens":17}"#);
        assert_eq!(estimated_count(10), br#"{"input_tokens":3,"waycast_estimate":true}"#);
    }
}
