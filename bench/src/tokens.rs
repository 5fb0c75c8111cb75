//! Reading output tokens off an answer as its bytes arrive, for any of the
//! three APIs, without parsing each event as JSON: the load generator must
//! stay cheaper than what it measures.
//!
//! A stream is read line by line; each `data:` line is one event. An event
//! carries output text when it is a chat or completions chunk with non-empty
//! content (or reasoning, or tool-call arguments), a Responses
//! `response.output_text.delta`, or an Anthropic `content_block_delta`. The
//! usage a server reports (`completion_tokens` or `output_tokens`, the last
//! one seen) is the token count; without one, the events are.
//!
//! A JSON key cannot occur inside a string value unescaped, so looking a
//! key up as `"key"` text finds keys (or a value equal to the key, which
//! none of these APIs sends where it matters).

/// What an answer said about its output so far.
#[derive(Debug, Default)]
pub struct TokenReader {
    /// The start of a line that has not ended yet.
    partial: Vec<u8>,
    /// The line being read grew past [`LONGEST_LINE`]: the rest of it is
    /// skipped, up to its end.
    skipping: bool,
    /// The `event:` name of the event being read, when the stream names
    /// its events (the Responses API and Anthropic's do).
    event: Option<Vec<u8>>,
    /// Events that carried output text.
    pub text_events: u64,
    /// The output token count the server reported, the last one seen.
    pub reported: Option<u64>,
    /// The stream said it ended (`[DONE]`, `response.completed`,
    /// `response.incomplete`, `message_stop`).
    pub ended: bool,
    /// The stream carried an error event: its first bytes.
    pub error: Option<String>,
}

/// Lines longer than this are not events we read (a huge chunk's text is
/// skipped, its line still ends it): 10,000 connections hold 2.5 GiB at
/// most, however hostile the server.
const LONGEST_LINE: usize = 256 * 1024;

impl TokenReader {
    /// Reads `bytes` of a stream; returns how many events carrying output
    /// text ended in them.
    pub fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let before = self.text_events;
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            let (line, rest) = bytes.split_at(end);
            bytes = &rest[1..];
            if std::mem::take(&mut self.skipping) {
                self.partial.clear();
            } else if self.partial.is_empty() {
                self.line(line);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.line(&whole);
                whole.clear();
                self.partial = whole;
            }
        }
        if !self.skipping {
            if self.partial.len() + bytes.len() <= LONGEST_LINE {
                self.partial.extend_from_slice(bytes);
            } else {
                self.partial.clear();
                self.skipping = true;
            }
        }
        self.text_events - before
    }

    /// The stream ended: reads a last line that had no line end.
    pub fn finish(&mut self) {
        if !self.skipping && !self.partial.is_empty() {
            let last = std::mem::take(&mut self.partial);
            self.line(&last);
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            // An event ends at a blank line; the next one names itself anew.
            self.event = None;
            return;
        }
        if let Some(name) = line.strip_prefix(b"event:") {
            self.event = Some(name.trim_ascii().iter().copied().take(64).collect());
            return;
        }
        let Some(data) = line.strip_prefix(b"data:") else { return };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.ended = true;
            return;
        }
        let kind = self.event.as_deref().or_else(|| top_level(data, b"type").and_then(string_at));
        let failed = matches!(kind, Some(b"error" | b"response.failed"))
            || top_level(data, b"error").is_some_and(|value| !value.starts_with(b"null"))
            || top_level(data, b"object").and_then(string_at) == Some(b"error");
        if failed {
            if self.error.is_none() {
                self.error = Some(String::from_utf8_lossy(&data[..data.len().min(200)]).into_owned());
            }
            return;
        }
        if carries_text(data, kind) {
            self.text_events += 1;
        }
        if let Some(count) = reported_tokens(data) {
            self.reported = Some(count);
        }
        if matches!(kind, Some(b"response.completed" | b"response.incomplete" | b"message_stop")) {
            self.ended = true;
        }
    }

    /// The output tokens: the reported count, else the text events.
    pub fn tokens(&self) -> u64 {
        self.reported.unwrap_or(self.text_events)
    }
}

/// A reported output above this is not believed (a stream's text events
/// count instead; a whole answer's, none).
const MOST_TOKENS_A_REQUEST: u64 = 10_000_000;

/// The output token count a whole (not streamed) answer reports, when
/// believable.
pub fn reported_tokens(body: &[u8]) -> Option<u64> {
    number_value(body, b"completion_tokens")
        .or_else(|| number_value(body, b"output_tokens"))
        .filter(|count| *count <= MOST_TOKENS_A_REQUEST)
}

/// Whether one event's data carries output text; `kind` is its name (the
/// `event:` line, else its top-level `type`).
pub fn carries_text(data: &[u8], kind: Option<&[u8]>) -> bool {
    if top_level(data, b"choices").is_some() {
        // Chat and completions chunks; the final usage chunk has no choices.
        return [b"content".as_slice(), b"reasoning_content", b"reasoning", b"text", b"arguments"]
            .iter()
            .any(|key| string_value(data, key).is_some_and(|value| !value.is_empty()));
    }
    matches!(kind, Some(b"response.output_text.delta" | b"response.reasoning_text.delta" | b"content_block_delta"))
}

/// What follows `"key":` at the top level of the JSON object `data` (keys
/// inside nested objects and arrays, and text inside strings, are passed over).
fn top_level<'a>(data: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let mut depth = 0_usize;
    let mut at = 0;
    while at < data.len() {
        match data[at] {
            b'"' => {
                let end = at + 1 + string_length(&data[at + 1..])?;
                if depth == 1
                    && let Some(value) = data[end + 1..].trim_ascii_start().strip_prefix(b":")
                    && &data[at + 1..end] == key
                {
                    return Some(value.trim_ascii_start());
                }
                at = end + 1;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        at += 1;
    }
    None
}

/// The length of the JSON string text that starts `rest` (after its
/// opening quote), up to its closing quote.
fn string_length(rest: &[u8]) -> Option<usize> {
    let mut escaped = false;
    for (index, byte) in rest.iter().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(index),
            _ => {}
        }
    }
    None
}

/// The raw text of a JSON string value that starts `value`.
fn string_at(value: &[u8]) -> Option<&[u8]> {
    let rest = value.strip_prefix(b"\"")?;
    string_length(rest).map(|length| &rest[..length])
}

/// The raw text of the first string value of `key` (escapes left as they are).
fn string_value<'a>(data: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    string_at(value_after(data, key)?)
}

/// The first value of `key` that is a whole number.
fn number_value(data: &[u8], key: &[u8]) -> Option<u64> {
    let mut from = 0;
    while let Some(rest) = data.get(from..).and_then(|d| value_after(d, key)) {
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 {
            return std::str::from_utf8(&rest[..digits]).ok()?.parse().ok();
        }
        from = data.len() - rest.len();
    }
    None
}

/// What follows `"key"`, blanks and a colon, the first time that shape occurs.
fn value_after<'a>(data: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let mut from = 0;
    loop {
        let at = from + find(&data[from..], b"\"")?;
        let rest = &data[at + 1..];
        from = at + 1;
        let Some(after) = rest.strip_prefix(key).and_then(|r| r.strip_prefix(b"\"")) else { continue };
        let after = after.trim_ascii_start();
        if let Some(value) = after.strip_prefix(b":") {
            return Some(value.trim_ascii_start());
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_apis_text_events_and_usage_are_read_across_any_split() {
        let streams: [(&str, u64, u64); 4] = [
            // vLLM's chat stream: a role chunk, two tokens, a finish chunk, usage.
            (
                concat!(
                    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
                    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
                    "data: {\"id\":\"c\", \"choices\": [{\"index\": 0, \"delta\": {\"content\": \"lo \\\"x\\\"\"}}]}\r\n\r\n",
                    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                    "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\n",
                    "data: [DONE]\n\n",
                ),
                2,
                3,
            ),
            (
                concat!(
                    "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
                    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
                    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\n\n",
                    "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":2}}}\n\n",
                ),
                2,
                2,
            ),
            (
                concat!(
                    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n",
                    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
                    "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n",
                    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                ),
                1,
                7,
            ),
            // No usage: the events are the count; a tool call's arguments count.
            (
                concat!(
                    "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"type\":\"function\",\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
                    "data: {\"choices\":[{\"text\":\"x\"}]}\n\n",
                    "data: [DONE]\n\n",
                ),
                2,
                2,
            ),
        ];
        for (stream, events, tokens) in streams {
            for split in [1, 2, 7, 64, stream.len()] {
                let mut reader = TokenReader::default();
                let counted: u64 = stream.as_bytes().chunks(split).map(|piece| reader.feed(piece)).sum();
                assert_eq!(
                    (counted, reader.text_events, reader.tokens()),
                    (events, events, tokens),
                    "{split}: {stream}"
                );
                assert!(reader.ended, "{stream}");
            }
        }
        let mut cut = TokenReader::default();
        cut.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
        assert!(!cut.ended, "a stream without its end marker did not end");
    }

    #[test]
    fn events_are_named_by_their_event_line_or_top_level_type_and_errors_fail_the_stream() {
        // openai-python's models write `type` last, after nested objects with types of their own.
        let typed_last = concat!(
            "data: {\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"},\"index\":0,\"type\":\"content_block_delta\"}\n\n",
            "data: {\"response\":{\"output\":[{\"type\":\"message\"}],\"usage\":{\"output_tokens\":5}},\"sequence_number\":9,\"type\":\"response.completed\"}\n\n",
        );
        let mut reader = TokenReader::default();
        reader.feed(typed_last.as_bytes());
        assert_eq!((reader.text_events, reader.tokens(), reader.ended), (1, 5, true));
        // An event line names the event whatever its data says first.
        let named = "event: response.output_text.delta\ndata: {\"item\":{\"type\":\"x\"},\"delta\":\"a\"}\n\nevent: response.incomplete\ndata: {\"response\":{}}\n\n";
        let mut reader = TokenReader::default();
        reader.feed(named.as_bytes());
        assert_eq!((reader.text_events, reader.ended), (1, true), "a response cut at its max tokens ended");
        // A blank line ends the name: the next event's data speaks for itself.
        reader.feed(b"data: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\n\n");
        assert_eq!(reader.text_events, 2);
        // An error mid-stream, then [DONE], as vLLM sends it: the stream failed.
        for error in [
            "data: {\"error\":{\"message\":\"out of memory\",\"code\":500}}\n\ndata: [DONE]\n\n",
            "data: {\"object\":\"error\",\"message\":\"bad\"}\n\ndata: [DONE]\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n",
        ] {
            let mut reader = TokenReader::default();
            reader.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
            reader.feed(error.as_bytes());
            assert!(reader.error.is_some(), "{error}");
        }
        // A chunk with `"error": null` is no error, nor one whose text mentions one.
        let mut reader = TokenReader::default();
        reader.feed(b"data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
        assert_eq!((reader.error.as_deref(), reader.text_events), (None, 1));
        // A chunk whose text mentions an error is not one.
        let mut reader = TokenReader::default();
        reader.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"{\\\"error\\\": 1}\"}}]}\n\n");
        assert_eq!((reader.error.as_deref(), reader.text_events), (None, 1));
        // The last line of a stream may lack its line end.
        let mut reader = TokenReader::default();
        reader.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]");
        assert!(!reader.ended);
        reader.finish();
        assert!(reader.ended);
    }

    #[test]
    fn a_whole_answers_usage_and_hostile_shapes() {
        assert_eq!(reported_tokens(br#"{"usage":{"prompt_tokens":5,"completion_tokens":12}}"#), Some(12));
        assert_eq!(reported_tokens(br#"{"usage":{"input_tokens":5,"output_tokens":3}}"#), Some(3));
        assert_eq!(reported_tokens(br#"{"usage":{"completion_tokens":null,"output_tokens":4}}"#), Some(4));
        assert_eq!(reported_tokens(br#"{"content":"\"completion_tokens\": 99"}"#), None, "escaped text is not a key");
        assert_eq!(reported_tokens(b"\"completion_tokens\":"), None);
        assert_eq!(reported_tokens(br#"{"completion_tokens":99999999999999999999999}"#), None);
        assert!(!carries_text(br#"{"choices":[{"delta":{"content":"unterminated"#, None));
        assert_eq!(
            top_level(br#"{"a":{"type":"inner"},"type":"outer"}"#, b"type").and_then(string_at),
            Some(&b"outer"[..])
        );
        assert_eq!(top_level(br#"{"a":"\"type\":\"fake\"","b":1}"#, b"type"), None);
        assert_eq!(top_level(br#"{"type":"#, b"type"), Some(&b""[..]));
        // A line past the longest kept is dropped, not grown without bound.
        let mut reader = TokenReader::default();
        for _ in 0..(2 * LONGEST_LINE / 4096) {
            reader.feed(&[b'x'; 4096]);
        }
        assert!(reader.partial.len() <= LONGEST_LINE);
        // What came after the limit is not spliced onto a line.
        reader.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}");
        assert_eq!(reader.text_events, 0);
        reader.feed(b"\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n");
        assert_eq!(reader.text_events, 1);
    }
}
