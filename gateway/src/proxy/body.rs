//! Finds the top-level `"model"` (and `"stream"`) of a request body in one
//! pass over the bytes, without building a JSON tree. Which keys it reads,
//! and as what, is the request's dialect's say ([`Dialect::field`]); the
//! rules for each kind of field are here.
//!
//! The scan checks the JSON structure of the whole body (so truncated or
//! malformed JSON is a 400 here, not at the upstream) but skips string
//! contents with `memchr`, so a 100 KB prompt costs microseconds. It is exact
//! for what routing needs: only a `model` key at the top level counts, keys
//! are compared after unescaping (`"\u006dodel"` is `model`), and a second
//! `model` is refused rather than guessed at (upstreams disagree on which
//! duplicate wins, which would let a key's allow-list be bypassed).
//!
//! NB: control characters and bytes that are not UTF-8 inside strings are
//! not rejected here (keys are compared as bytes with the ASCII names the
//! gateway knows; only the model's name is read as text); the upstream's
//! own parser refuses them.

use std::borrow::Cow;
use std::ops::Range;

use crate::dialect::{Dialect, Field};
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
    /// The largest output the client asked for: the largest of the
    /// dialect's output bounds (OpenAI's `max_completion_tokens`,
    /// `max_tokens` or `max_output_tokens`; non-negative integers), if any.
    pub max_tokens: Option<u64>,
    /// How many completions it asked for: the largest of the dialect's
    /// choices (OpenAI's `n` and `best_of`; 1 when none is set).
    pub choices: u64,
    /// Where the prompt's value starts: the first of the dialect's prompt
    /// fields (OpenAI's `messages`, `input` or `prompt`; prefix affinity
    /// hashes from there).
    pub prompt_start: Option<usize>,
    /// Who the client says its end user is (OpenAI's `user`), when it is a
    /// string: unverified, at most [`MAX_CLIENT_USER_BYTES`].
    pub client_user: Option<Cow<'a, str>>,
}

/// Longest client-declared user recorded (longer ones are cut).
pub const MAX_CLIENT_USER_BYTES: usize = 256;

/// Scans `body`, a request in `dialect`.
///
/// # Errors
/// 400-class [`GatewayError`]s: invalid JSON, not an object, no / non-string
/// / duplicate `model`, a field the gateway reads of the wrong type.
pub fn scan(body: &[u8], dialect: Dialect) -> Result<RequestFields<'_>, GatewayError> {
    let mut scanner = Scanner { bytes: body, at: 0 };
    scanner.skip_whitespace();
    if scanner.peek() != Some(b'{') {
        // Tell "valid JSON of another type" from "not JSON at all".
        scanner.value(0)?;
        scanner.end()?;
        return Err(GatewayError::NotAnObject);
    }
    let mut model: Option<(Cow<'_, str>, Range<usize>)> = None;
    let mut stream = false;
    let mut stream_options = None;
    let mut max_tokens = None;
    let mut choices = 1;
    let mut prompt_start = None;
    let mut client_user = None;
    members(&mut scanner, |key, scanner| {
        match dialect.field(&key_bytes(body, &key)?) {
            Some(Field::Model) => {
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
                let text = string_text(body, &span)?;
                model = Some((text, span.range));
            }
            // NB: typed strictly, as OpenAI does: a `"stream": 1` that
            // the upstream reads as true must not pass as "not a stream"
            // here, where token charging depends on it.
            Some(Field::Stream) => {
                let start = scanner.at;
                scanner.value(1)?;
                stream = match &body[start..scanner.at] {
                    b"true" => true,
                    b"false" | b"null" => false,
                    _ => return Err(GatewayError::InvalidField("stream", "must be a boolean")),
                };
            }
            Some(Field::StreamOptions) => {
                let start = scanner.at;
                let is_object = scanner.peek() == Some(b'{');
                scanner.value(1)?;
                if !is_object && &body[start..scanner.at] != b"null" {
                    return Err(GatewayError::InvalidField("stream_options", "must be an object"));
                }
                stream_options = Some(start..scanner.at);
            }
            Some(Field::OutputBound) => {
                let start = scanner.at;
                scanner.value(1)?;
                let text = &body[start..scanner.at];
                if text != b"null" {
                    let value = crate::json_text::non_negative_integer(text)
                        .ok_or(GatewayError::InvalidField("max_tokens", "must be a non-negative integer"))?;
                    // The largest of them bounds the output.
                    max_tokens = Some(max_tokens.map_or(value, |m: u64| m.max(value)));
                }
            }
            // NB: each completion may use the whole output bound: the
            // reservation multiplies by them.
            Some(Field::Choices) => {
                let start = scanner.at;
                scanner.value(1)?;
                let text = &body[start..scanner.at];
                if text != b"null" {
                    let value = crate::json_text::non_negative_integer(text)
                        .ok_or(GatewayError::InvalidField("n", "must be a non-negative integer"))?;
                    choices = choices.max(value);
                }
            }
            Some(Field::Prompt) => {
                prompt_start = prompt_start.or(Some(scanner.at));
                scanner.value(1)?;
            }
            // Any other type is the upstream's to judge: it is only recorded.
            Some(Field::ClientUser) if scanner.peek() == Some(b'"') => {
                let span = scanner.string()?;
                let text = string_text(body, &span)?;
                client_user = Some(cut(text, MAX_CLIENT_USER_BYTES));
            }
            Some(Field::ClientUser) => scanner.value(1)?,
            None => scanner.value(1)?,
        }
        Ok(())
    })?;
    scanner.end()?;
    let (model, model_span) = model.ok_or(GatewayError::MissingModel)?;
    if model.is_empty() {
        return Err(GatewayError::InvalidField("model", "must not be empty"));
    }
    Ok(RequestFields { model, model_span, stream, stream_options, max_tokens, choices, prompt_start, client_user })
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: Cow<'_, str>, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(text[..end].to_owned())
}

/// Walks the JSON object at the start of `bytes` (leading whitespace
/// allowed), handing `member` each key, unescaped, and the raw text of its
/// value. It stops at the object's closing brace: what follows may be
/// anything (an SSE event's rest, more JSON).
///
/// # Errors
/// The 400-class [`GatewayError`]s of [`scan`] where the object is not
/// well-formed.
pub fn object_members<'a>(bytes: &'a [u8], mut member: impl FnMut(&[u8], &'a [u8])) -> Result<(), GatewayError> {
    let mut scanner = Scanner { bytes, at: 0 };
    scanner.skip_whitespace();
    members(&mut scanner, |key, scanner| {
        let start = scanner.at;
        scanner.value(1)?;
        member(&key_bytes(bytes, &key)?, &bytes[start..scanner.at]);
        Ok(())
    })
}

/// Scans the object whose `{` is next, calling `member` with each key's
/// span and the scanner at that key's value, which `member` must consume.
fn members<'a>(
    scanner: &mut Scanner<'a>,
    member: impl FnMut(StringSpan, &mut Scanner<'a>) -> Result<(), GatewayError>,
) -> Result<(), GatewayError> {
    scanner.expect(b'{')?;
    scanner.skip_whitespace();
    if scanner.peek() == Some(b'}') {
        scanner.at += 1;
        return Ok(());
    }
    member_list(scanner, member)
}

/// The members of an object from its next key to its closing `}`.
fn member_list<'a>(
    scanner: &mut Scanner<'a>,
    mut member: impl FnMut(StringSpan, &mut Scanner<'a>) -> Result<(), GatewayError>,
) -> Result<(), GatewayError> {
    loop {
        scanner.skip_whitespace();
        let key = scanner.string()?;
        scanner.skip_whitespace();
        scanner.expect(b':')?;
        scanner.skip_whitespace();
        member(key, scanner)?;
        scanner.skip_whitespace();
        match scanner.next() {
            Some(b',') => continue,
            Some(b'}') => return Ok(()),
            _ => return Err(GatewayError::InvalidJson("expected ',' or '}' in object")),
        }
    }
}

struct StringSpan {
    /// Quotes included.
    range: Range<usize>,
    escaped: bool,
}

/// A key's bytes, unescaped. Not checked for UTF-8: a key is only compared
/// with names the gateway knows, all ASCII, and that check cost more than
/// the rest of the scan of a short object.
fn key_bytes<'a>(body: &'a [u8], span: &StringSpan) -> Result<Cow<'a, [u8]>, GatewayError> {
    if span.escaped {
        return string_text(body, span).map(|text| Cow::Owned(text.into_owned().into_bytes()));
    }
    let raw = &body[span.range.clone()];
    Ok(Cow::Borrowed(&raw[1..raw.len() - 1]))
}

/// A string's text, unescaped and checked for UTF-8 (the model's name).
fn string_text<'a>(body: &'a [u8], span: &StringSpan) -> Result<Cow<'a, str>, GatewayError> {
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
            Some(b'{') => members(self, |_, scanner| scanner.value(depth + 1)),
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
        self.skip_whitespace();
        match self.next() {
            Some(b'}') => {}
            Some(b',') => member_list(self, |_, scanner| scanner.value(1))?,
            _ => return Err(GatewayError::InvalidJson("expected ',' or '}' in object")),
        }
        self.end()
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
#[path = "body_tests.rs"]
mod tests;
