//! Finds the top-level `"model"` (and `"stream"`) of a request body in one
//! pass over the bytes, without building a JSON tree.
//!
//! The scan checks the JSON structure of the whole body (so truncated or
//! malformed JSON is a 400 here, not at the upstream) but skips string
//! contents with `memchr`, so a 100 KB prompt costs microseconds. It is exact
//! for what routing needs: only a `model` key at the top level counts, keys
//! are compared after unescaping (`"\u006dodel"` is `model`), and a second
//! `model` is refused rather than guessed at (upstreams disagree on which
//! duplicate wins, which would let a key's allow-list be bypassed).
//!
//! NB: control characters inside strings are not rejected here; the
//! upstream's own parser refuses them.

use std::borrow::Cow;
use std::ops::Range;

use crate::error::GatewayError;

/// Deepest nesting accepted; deeper bodies get 400 instead of a deep recursion.
pub const MAX_DEPTH: usize = 128;

/// What routing needs from a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFields<'a> {
    /// The model name, unescaped.
    pub model: Cow<'a, str>,
    /// Byte range of the model's JSON string, quotes included (for rewriting).
    pub model_span: Range<usize>,
    /// `"stream": true` at the top level.
    pub stream: bool,
    /// Byte range of the top-level `stream_options` value (an object or
    /// `null`), if present.
    pub stream_options: Option<Range<usize>>,
    /// The largest output the client asked for: `max_completion_tokens`,
    /// `max_tokens` or `max_output_tokens` (a non-negative integer), if any.
    pub max_tokens: Option<u64>,
}

/// Scans `body`.
///
/// # Errors
/// 400-class [`GatewayError`]s: invalid JSON, not an object, no / non-string
/// / duplicate `model`.
pub fn scan(body: &[u8]) -> Result<RequestFields<'_>, GatewayError> {
    let mut scanner = Scanner { bytes: body, at: 0 };
    scanner.skip_whitespace();
    if scanner.peek() != Some(b'{') {
        // Tell "valid JSON of another type" from "not JSON at all".
        scanner.value(0)?;
        scanner.end()?;
        return Err(GatewayError::NotAnObject);
    }
    scanner.at += 1;
    let mut model: Option<(Cow<'_, str>, Range<usize>)> = None;
    let mut stream = false;
    let mut stream_options = None;
    let mut max_tokens = None;
    scanner.skip_whitespace();
    if scanner.peek() == Some(b'}') {
        scanner.at += 1;
    } else {
        loop {
            scanner.skip_whitespace();
            let key = scanner.string()?;
            scanner.skip_whitespace();
            scanner.expect(b':')?;
            scanner.skip_whitespace();
            let name = key_text(body, &key)?;
            match name.as_ref() {
                "model" => {
                    if model.is_some() {
                        return Err(GatewayError::DuplicateModel);
                    }
                    if scanner.peek() != Some(b'"') {
                        scanner.value(1)?;
                        // Keep scanning so malformed JSON still reports as such.
                        scanner.rest_of_object()?;
                        return Err(GatewayError::ModelNotString);
                    }
                    let span = scanner.string()?;
                    let text = key_text(body, &span)?;
                    model = Some((text, span.range));
                }
                // NB: typed strictly, as OpenAI does: a `"stream": 1` that
                // the upstream reads as true must not pass as "not a stream"
                // here, where token charging depends on it.
                "stream" => {
                    let start = scanner.at;
                    scanner.value(1)?;
                    stream = match &body[start..scanner.at] {
                        b"true" => true,
                        b"false" | b"null" => false,
                        _ => return Err(GatewayError::InvalidField("stream", "must be a boolean")),
                    };
                }
                "stream_options" => {
                    let start = scanner.at;
                    let is_object = scanner.peek() == Some(b'{');
                    scanner.value(1)?;
                    if !is_object && &body[start..scanner.at] != b"null" {
                        return Err(GatewayError::InvalidField("stream_options", "must be an object"));
                    }
                    stream_options = Some(start..scanner.at);
                }
                "max_tokens" | "max_completion_tokens" | "max_output_tokens" => {
                    let start = scanner.at;
                    scanner.value(1)?;
                    let text = &body[start..scanner.at];
                    if text != b"null" {
                        let value = std::str::from_utf8(text).ok().and_then(|t| t.parse::<u64>().ok());
                        let value =
                            value.ok_or(GatewayError::InvalidField("max_tokens", "must be a non-negative integer"))?;
                        // The largest of them bounds the output.
                        max_tokens = Some(max_tokens.map_or(value, |m: u64| m.max(value)));
                    }
                }
                _ => scanner.value(1)?,
            }
            scanner.skip_whitespace();
            match scanner.next() {
                Some(b',') => continue,
                Some(b'}') => break,
                _ => return Err(GatewayError::InvalidJson("expected ',' or '}' in object")),
            }
        }
    }
    scanner.end()?;
    let (model, model_span) = model.ok_or(GatewayError::MissingModel)?;
    if model.is_empty() {
        return Err(GatewayError::InvalidField("model", "must not be empty"));
    }
    Ok(RequestFields { model, model_span, stream, stream_options, max_tokens })
}

struct StringSpan {
    /// Quotes included.
    range: Range<usize>,
    escaped: bool,
}

fn key_text<'a>(body: &'a [u8], span: &StringSpan) -> Result<Cow<'a, str>, GatewayError> {
    let raw = &body[span.range.clone()];
    if span.escaped {
        let text: String =
            serde_json::from_slice(raw).map_err(|_| GatewayError::InvalidJson("invalid escape in string"))?;
        Ok(Cow::Owned(text))
    } else {
        std::str::from_utf8(&raw[1..raw.len() - 1])
            .map(Cow::Borrowed)
            .map_err(|_| GatewayError::InvalidJson("string is not UTF-8"))
    }
}

struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Result<(), GatewayError> {
        if self.next() == Some(byte) {
            Ok(())
        } else {
            Err(GatewayError::InvalidJson(match byte {
                b':' => "expected ':' after object key",
                _ => "unexpected character",
            }))
        }
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    fn end(&mut self) -> Result<(), GatewayError> {
        self.skip_whitespace();
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(GatewayError::InvalidJson("trailing characters after the JSON value"))
        }
    }

    fn string(&mut self) -> Result<StringSpan, GatewayError> {
        let start = self.at;
        if self.next() != Some(b'"') {
            return Err(GatewayError::InvalidJson("expected a string"));
        }
        let mut escaped = false;
        loop {
            let rest = &self.bytes[self.at..];
            let Some(found) = memchr::memchr2(b'"', b'\\', rest) else {
                return Err(GatewayError::InvalidJson("unterminated string"));
            };
            self.at += found;
            if self.bytes[self.at] == b'"' {
                self.at += 1;
                return Ok(StringSpan { range: start..self.at, escaped });
            }
            escaped = true;
            match self.bytes.get(self.at + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.at += 2,
                Some(b'u') => {
                    let hex = self.bytes.get(self.at + 2..self.at + 6);
                    if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                        return Err(GatewayError::InvalidJson("invalid \\u escape"));
                    }
                    self.at += 6;
                }
                _ => return Err(GatewayError::InvalidJson("invalid escape in string")),
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<(), GatewayError> {
        if depth > MAX_DEPTH {
            return Err(GatewayError::InvalidJson("nested too deeply"));
        }
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b'{') => {
                self.at += 1;
                self.skip_whitespace();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                    return Ok(());
                }
                loop {
                    self.skip_whitespace();
                    self.string()?;
                    self.skip_whitespace();
                    self.expect(b':')?;
                    self.skip_whitespace();
                    self.value(depth + 1)?;
                    self.skip_whitespace();
                    match self.next() {
                        Some(b',') => continue,
                        Some(b'}') => return Ok(()),
                        _ => {
                            return Err(GatewayError::InvalidJson("expected ',' or '}' in object"));
                        }
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                self.skip_whitespace();
                if self.peek() == Some(b']') {
                    self.at += 1;
                    return Ok(());
                }
                loop {
                    self.skip_whitespace();
                    self.value(depth + 1)?;
                    self.skip_whitespace();
                    match self.next() {
                        Some(b',') => continue,
                        Some(b']') => return Ok(()),
                        _ => return Err(GatewayError::InvalidJson("expected ',' or ']' in array")),
                    }
                }
            }
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(GatewayError::InvalidJson("unexpected character")),
            None => Err(GatewayError::InvalidJson("unexpected end of input")),
        }
    }

    /// After a non-string `model`: validate the remaining members.
    fn rest_of_object(&mut self) -> Result<(), GatewayError> {
        loop {
            self.skip_whitespace();
            match self.next() {
                Some(b'}') => return self.end(),
                Some(b',') => {
                    self.skip_whitespace();
                    self.string()?;
                    self.skip_whitespace();
                    self.expect(b':')?;
                    self.skip_whitespace();
                    self.value(1)?;
                }
                _ => return Err(GatewayError::InvalidJson("expected ',' or '}' in object")),
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), GatewayError> {
        if self.bytes[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(GatewayError::InvalidJson("invalid literal"))
        }
    }

    fn number(&mut self) -> Result<(), GatewayError> {
        let invalid = || GatewayError::InvalidJson("invalid number");
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next() {
            Some(b'0') => {}
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(invalid()),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            self.digits();
        }
        Ok(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so property runs repeat.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        /// A JSON value (valid), nested at most `depth`.
        fn value(&mut self, depth: usize) -> String {
            let strings = ["\"model\"", "\"m\\u006f\"", "\"a\\\"b\"", "\"caf\u{e9}\"", "\"\""];
            match self.below(if depth == 0 { 4 } else { 6 }) {
                0 => strings[self.below(strings.len())].to_owned(),
                1 => ["0", "-1.5e3", "12", "0.25"][self.below(4)].to_owned(),
                2 => ["true", "false"][self.below(2)].to_owned(),
                3 => "null".to_owned(),
                4 => {
                    let items: Vec<String> = (0..self.below(4)).map(|_| self.value(depth - 1)).collect();
                    format!("[{}]", items.join(","))
                }
                _ => {
                    let keys = ["\"model\"", "\"stream\"", "\"x\"", "\"messages\""];
                    let fields: Vec<String> = (0..self.below(4))
                        .map(|_| format!("{}:{}", keys[self.below(keys.len())], self.value(depth - 1)))
                        .collect();
                    format!("{{{}}}", fields.join(","))
                }
            }
        }
    }

    /// On any input the scanner answers without panicking; on valid JSON it
    /// agrees with serde_json about the top-level model (or refuses a
    /// duplicate, which serde_json's last-wins reading would hide).
    #[test]
    fn property_agrees_with_serde_json_and_never_panics() {
        let mut random = Random(0x2545_f491_4f6c_dd1d);
        for _ in 0..5_000 {
            let mut document = random.value(4);
            if random.below(2) == 0 {
                document = format!("{{\"model\":\"top\",\"body\":{document}}}");
            }
            let scanned = scan(document.as_bytes());
            let parsed: Result<serde_json::Value, _> = serde_json::from_str(&document);
            match (&scanned, parsed.as_ref().ok().and_then(|v| v.as_object())) {
                (Ok(fields), Some(object)) => {
                    assert_eq!(Some(fields.model.as_ref()), object.get("model").and_then(|m| m.as_str()), "{document}")
                }
                (Ok(_), None) => panic!("scanned a body serde_json refuses: {document}"),
                (Err(_), _) => {}
            }
            // Cut anywhere, or with a byte flipped: an answer, never a panic.
            let bytes = document.as_bytes();
            let cut = random.below(bytes.len() + 1);
            let _ = scan(&bytes[..cut]);
            let mut flipped = bytes.to_vec();
            if let Some(byte) = flipped.get_mut(random.below(bytes.len().max(1))) {
                *byte ^= 1 << random.below(8);
            }
            let _ = scan(&flipped);
        }
    }

    fn model_of(body: &str) -> Result<String, GatewayError> {
        scan(body.as_bytes()).map(|fields| fields.model.into_owned())
    }

    #[test]
    fn finds_the_top_level_model() {
        let body = r#"{"messages":[{"role":"user","content":"say \"model\": 1","model":"nested"}],"model":"llama3","stream":true}"#;
        let fields = scan(body.as_bytes()).unwrap();
        assert_eq!(fields.model, "llama3");
        assert!(fields.stream);
        assert_eq!(&body[fields.model_span.clone()], "\"llama3\"");
        assert_eq!(model_of(" {\n\"model\" : \"a/b:c\" } ").unwrap(), "a/b:c");
        assert!(!scan(br#"{"model":"m","stream":false}"#).unwrap().stream);
        assert!(!scan(br#"{"model":"m","stream":null}"#).unwrap().stream);
    }

    /// Fields whose type decides what is charged are typed strictly: a
    /// stream the upstream would run must never pass as "no stream" here.
    #[test]
    fn stream_fields_and_output_bounds_are_typed() {
        let invalid = |body: &str| scan(body.as_bytes()).err();
        for stream in ["1", "\"true\"", "{}", "[true]"] {
            let body = format!(r#"{{"model":"m","stream":{stream}}}"#);
            assert_eq!(invalid(&body), Some(GatewayError::InvalidField("stream", "must be a boolean")), "{body}");
        }
        assert_eq!(
            invalid(r#"{"model":"m","stream_options":"x"}"#),
            Some(GatewayError::InvalidField("stream_options", "must be an object"))
        );
        assert_eq!(invalid(r#"{"model":""}"#), Some(GatewayError::InvalidField("model", "must not be empty")));
        let fields =
            scan(br#"{"model":"m","stream":true,"stream_options":null,"max_tokens":64,"max_completion_tokens":128}"#)
                .unwrap();
        assert_eq!((fields.stream, fields.max_tokens), (true, Some(128)));
        assert_eq!(fields.stream_options.map(|span| span.len()), Some(4), "null is kept: the gateway replaces it");
        assert_eq!(scan(br#"{"model":"m","max_tokens":null}"#).unwrap().max_tokens, None);
        assert!(invalid(r#"{"model":"m","max_tokens":-1}"#).is_some());
        assert!(invalid(r#"{"model":"m","max_output_tokens":"9"}"#).is_some());
    }

    #[test]
    fn unescapes_keys_and_values() {
        assert_eq!(model_of(r#"{"\u006dodel":"x\u0041"}"#).unwrap(), "xA");
        assert_eq!(model_of(r#"{"\u006dodel":"a","model":"b"}"#), Err(GatewayError::DuplicateModel));
    }

    #[test]
    fn refuses_what_routing_cannot_trust() {
        let cases: &[(&str, GatewayError)] = &[
            ("", GatewayError::InvalidJson("unexpected end of input")),
            ("not json", GatewayError::InvalidJson("invalid literal")),
            ("[1,2]", GatewayError::NotAnObject),
            ("\"text\"", GatewayError::NotAnObject),
            ("{}", GatewayError::MissingModel),
            (r#"{"messages":[]}"#, GatewayError::MissingModel),
            (r#"{"model":42}"#, GatewayError::ModelNotString),
            (r#"{"model":null,"x":1}"#, GatewayError::ModelNotString),
            (r#"{"model":"a","model":"b"}"#, GatewayError::DuplicateModel),
            (r#"{"model":"a""#, GatewayError::InvalidJson("expected ',' or '}' in object")),
            (r#"{"model":"a"} x"#, GatewayError::InvalidJson("trailing characters after the JSON value")),
            (r#"{"model":"a","n":01}"#, GatewayError::InvalidJson("expected ',' or '}' in object")),
            (r#"{"model":"a","n":1.}"#, GatewayError::InvalidJson("invalid number")),
            (r#"{"model":"a","s":"\x"}"#, GatewayError::InvalidJson("invalid escape in string")),
            (r#"{"model":"unterminated}"#, GatewayError::InvalidJson("unterminated string")),
            (r#"{"model":42,"#, GatewayError::InvalidJson("expected a string")),
        ];
        for (body, expected) in cases {
            assert_eq!(scan(body.as_bytes()).map(|f| f.model.into_owned()).as_ref(), Err(expected), "{body}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_recursing_forever() {
        let deep = format!("{{\"model\":\"m\",\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(scan(deep.as_bytes()), Err(GatewayError::InvalidJson("nested too deeply")));
        let fine = format!("{{\"model\":\"m\",\"x\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert_eq!(model_of(&fine).unwrap(), "m");
    }

    #[test]
    fn agrees_with_serde_json_on_valid_documents() {
        let documents = [
            r#"{"model":"m","temperature":-0.5e-3,"n":0,"stop":null,"logit_bias":{"1":-100},"tools":[true,false,[],{}]}"#,
            r#"{"input":"caf\u00e9 ☕","model":"embed-1"}"#,
        ];
        for document in documents {
            let value: serde_json::Value = serde_json::from_str(document).unwrap();
            assert_eq!(model_of(document).unwrap(), value["model"].as_str().unwrap());
        }
    }
}
