//! A `multipart/form-data` body's grammar as a machine fed the body in
//! pieces, wherever they are split: the one reading of a form the
//! gateway has, whether the body is read whole ([`super::form::scan`]) or
//! streamed to the backend as it arrives ([`super::form_upload`]).
//!
//! What it holds is bounded whatever the form: a part's headers (at most
//! [`MAX_PART_HEADERS`] bytes), the value of a field it reads (`model`,
//! `stream`: a few hundred bytes), and the last bytes of any other value
//! that could begin a delimiter. A file's bytes are searched, never kept.

use std::ops::Range;

use memchr::memmem;

use crate::error::GatewayError;

/// The most of a `stream` field's value kept (`false` and a margin).
const MAX_STREAM_VALUE: usize = 8;

/// Reads one form.
#[derive(Debug)]
pub struct FormScanner {
    /// `\r\n--` and the boundary: what ends every value.
    delimiter: Vec<u8>,
    finder: memmem::Finder<'static>,
    state: State,
    /// Bytes fed so far.
    offset: usize,
    /// Parts started so far.
    parts: usize,
    /// The element being read: the first delimiter's bytes, a part's
    /// headers, or the last bytes of a value that may begin a delimiter.
    held: Vec<u8>,
    /// The value of a field read (`model`, `stream`) from its first byte,
    /// with up to a delimiter's length of bytes more; cut at its bound.
    captured: Vec<u8>,
    model: Option<ModelPart>,
    stream: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first delimiter, which has no CRLF before it.
    Start,
    /// After a delimiter: `--` closes the form, CRLF begins a part.
    AfterDelimiter,
    /// A part's headers, until their blank line.
    Headers,
    /// A part's value, from `start`, until the next delimiter.
    Value { field: Field, start: usize },
    /// After the closing delimiter: nothing but line ends.
    Epilogue,
    /// Refused: nothing more is read.
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Model,
    Stream,
    Other,
}

/// The `model` part's value: where it lies in the body, and its bytes (at
/// most one more than a model name may have).
#[derive(Debug, Clone)]
struct ModelPart {
    span: Range<usize>,
    text: Vec<u8>,
    too_long: bool,
}

/// What routing reads of a whole form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormFields {
    /// The model named.
    pub model: String,
    /// Where its value lies in the body (rewritten for the backend).
    pub model_span: Range<usize>,
    /// `stream` is `true` (any case); `false` when absent.
    pub stream: bool,
}

impl FormScanner {
    /// A scanner of a form whose parts are separated by `boundary`.
    pub fn new(boundary: &[u8]) -> Self {
        let mut delimiter = Vec::with_capacity(boundary.len() + 4);
        delimiter.extend_from_slice(b"\r\n--");
        delimiter.extend_from_slice(boundary);
        let finder = memmem::Finder::new(&delimiter).into_owned();
        Self {
            delimiter,
            finder,
            state: State::Start,
            offset: 0,
            parts: 0,
            held: Vec::new(),
            captured: Vec::new(),
            model: None,
            stream: None,
        }
    }

    /// Reads the body's next bytes.
    ///
    /// # Errors
    /// The form is malformed (see [`super::form::scan`]); nothing more is
    /// read after an error.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), GatewayError> {
        let mut at = 0;
        while at < chunk.len() {
            match self.step(chunk, at) {
                Ok(next) => at = next,
                Err(error) => {
                    self.state = State::Refused;
                    return Err(error);
                }
            }
        }
        self.offset += chunk.len();
        Ok(())
    }

    /// The form has ended: what routing reads of it.
    ///
    /// # Errors
    /// The form is cut short or malformed, or names no usable model.
    pub fn finish(&self) -> Result<FormFields, GatewayError> {
        let unended = match self.state {
            State::Epilogue => return self.fields(),
            State::Start => "the body must start with the boundary",
            State::AfterDelimiter => "a boundary is not followed by CRLF",
            State::Headers => "a part's headers are too long or unended",
            State::Value { .. } => "the form does not end with its boundary",
            State::Refused => "the form was refused",
        };
        Err(GatewayError::InvalidForm(unended))
    }

    /// What routing reads of the form so far, once its `model` part has
    /// ended (the rest may still come): `None` before that.
    ///
    /// # Errors
    /// The model is empty, too long or not text.
    pub fn fields_so_far(&self) -> Option<Result<FormFields, GatewayError>> {
        self.model.as_ref()?;
        Some(self.fields())
    }

    fn fields(&self) -> Result<FormFields, GatewayError> {
        let model = self.model.as_ref().ok_or(GatewayError::MissingModel)?;
        let text = std::str::from_utf8(&model.text).map_err(|_| GatewayError::InvalidField("model", "must be text"));
        let text = match text {
            Ok(text) if !model.too_long && !text.is_empty() && text.len() <= MAX_MODEL_BYTES => text,
            Ok(_) => return Err(GatewayError::InvalidField("model", "must be 1 to 256 bytes")),
            // Cut at its bound inside a character, a long name is too long.
            Err(_) if model.too_long => return Err(GatewayError::InvalidField("model", "must be 1 to 256 bytes")),
            Err(error) => return Err(error),
        };
        Ok(FormFields { model: text.to_owned(), model_span: model.span.clone(), stream: self.stream.unwrap_or(false) })
    }

    /// Reads from `chunk[at..]` what the current state takes; returns where
    /// the next state begins.
    fn step(&mut self, chunk: &[u8], at: usize) -> Result<usize, GatewayError> {
        let rest = &chunk[at..];
        match self.state {
            State::Start => {
                let expected = &self.delimiter[2..];
                let take = rest.len().min(expected.len() - self.held.len());
                self.held.extend_from_slice(&rest[..take]);
                if !expected.starts_with(&self.held) {
                    return Err(GatewayError::InvalidForm("the body must start with the boundary"));
                }
                if self.held.len() == expected.len() {
                    self.held.clear();
                    self.state = State::AfterDelimiter;
                }
                Ok(at + take)
            }
            State::AfterDelimiter => {
                let take = rest.len().min(2 - self.held.len());
                self.held.extend_from_slice(&rest[..take]);
                if self.held.len() < 2 {
                    return Ok(at + take);
                }
                if self.held == b"--" {
                    self.state = State::Epilogue;
                } else if self.held == b"\r\n" {
                    if self.parts == MAX_PARTS {
                        return Err(GatewayError::InvalidForm("the form has more than 64 parts"));
                    }
                    self.parts += 1;
                    self.state = State::Headers;
                } else {
                    return Err(GatewayError::InvalidForm("a boundary is not followed by CRLF"));
                }
                self.held.clear();
                Ok(at + take)
            }
            State::Headers => self.step_headers(rest, at),
            State::Value { field, start } => self.step_value(chunk, at, field, start),
            State::Epilogue => {
                if !rest.iter().all(|byte| matches!(byte, b'\r' | b'\n')) {
                    return Err(GatewayError::InvalidForm("bytes after the closing boundary"));
                }
                Ok(chunk.len())
            }
            State::Refused => Err(GatewayError::InvalidForm("the form was refused")),
        }
    }

    fn step_headers(&mut self, rest: &[u8], at: usize) -> Result<usize, GatewayError> {
        const CAP: usize = MAX_PART_HEADERS + 4;
        let before = self.held.len();
        let take = rest.len().min(CAP - before);
        self.held.extend_from_slice(&rest[..take]);
        if self.held.starts_with(b"\r\n") {
            return Err(GatewayError::InvalidForm("a part has no headers"));
        }
        let searched_from = before.saturating_sub(3);
        let Some(found) = memmem::find(&self.held[searched_from..], b"\r\n\r\n") else {
            if self.held.len() == CAP {
                return Err(GatewayError::InvalidForm("a part's headers are too long or unended"));
            }
            return Ok(at + take);
        };
        let headers_len = searched_from + found;
        let field = match part_name(&self.held[..headers_len])? {
            b"model" => Field::Model,
            b"stream" => Field::Stream,
            _ => Field::Other,
        };
        // The value begins after the blank line, within this chunk.
        let used = headers_len + 4 - before;
        let start = self.offset + at + used;
        self.held.clear();
        self.captured.clear();
        self.state = State::Value { field, start };
        Ok(at + used)
    }

    fn step_value(&mut self, chunk: &[u8], at: usize, field: Field, start: usize) -> Result<usize, GatewayError> {
        let rest = &chunk[at..];
        let length = self.delimiter.len();
        // A delimiter begun in the bytes held from before this chunk.
        let mut window = self.held.clone();
        window.extend_from_slice(&rest[..rest.len().min(length - 1)]);
        let straddling = memmem::find(&window, &self.delimiter).filter(|&found| found < self.held.len());
        let found_at = match straddling {
            Some(found) => Some(self.offset + at - self.held.len() + found),
            None => self.finder.find(rest).map(|found| self.offset + at + found),
        };
        if field != Field::Other {
            let bound = if field == Field::Model { MAX_MODEL_BYTES + 1 } else { MAX_STREAM_VALUE } + length;
            let room = bound - self.captured.len();
            self.captured.extend_from_slice(&rest[..rest.len().min(room)]);
        }
        let Some(end) = found_at else {
            // The last bytes may begin a delimiter the next chunk ends.
            let keep = length - 1;
            if rest.len() >= keep {
                self.held.clear();
                self.held.extend_from_slice(&rest[rest.len() - keep..]);
            } else {
                self.held.extend_from_slice(rest);
                let excess = self.held.len().saturating_sub(keep);
                self.held.drain(..excess);
            }
            return Ok(chunk.len());
        };
        self.end_value(field, start..end)?;
        self.held.clear();
        self.state = State::AfterDelimiter;
        Ok(end + length - self.offset)
    }

    /// A read field's value has ended at `value.end`.
    fn end_value(&mut self, field: Field, value: Range<usize>) -> Result<(), GatewayError> {
        let length = value.len();
        // Captured from the value's first byte on: beyond the value, the
        // delimiter's beginning; short of it, the value outgrew the bound.
        let whole = length <= self.captured.len();
        let text = &self.captured[..length.min(self.captured.len())];
        match field {
            Field::Other => {}
            Field::Model if self.model.is_some() => return Err(GatewayError::DuplicateModel),
            Field::Model => {
                let kept = text.len().min(MAX_MODEL_BYTES + 1);
                self.model = Some(ModelPart {
                    span: value,
                    text: text[..kept].to_vec(),
                    too_long: !whole || length > MAX_MODEL_BYTES,
                });
            }
            Field::Stream if self.stream.is_some() => {
                return Err(GatewayError::InvalidForm("stream is given twice"));
            }
            Field::Stream if !whole => return Err(GatewayError::InvalidField("stream", "must be true or false")),
            Field::Stream => self.stream = Some(stream_value(text)?),
        }
        Ok(())
    }
}

/// Most parts a form may have (a transcription has a handful).
pub const MAX_PARTS: usize = 64;
/// Most bytes of one part's headers.
pub const MAX_PART_HEADERS: usize = 8 * 1024;
/// Longest model name read from a form.
pub const MAX_MODEL_BYTES: usize = 256;

/// Keeps `parameter`'s value (unquoted) in `found` when it is `wanted`
/// (any case).
///
/// # Errors
/// An extended (`*`) parameter, or `wanted` given twice (`twice` says so).
pub(super) fn take_parameter<'a>(
    parameter: &'a [u8],
    wanted: &[u8],
    found: &mut Option<&'a [u8]>,
    twice: &'static str,
) -> Result<(), GatewayError> {
    let Some((key, value)) = split_parameter(parameter) else { return Ok(()) };
    if key.ends_with(b"*") {
        return Err(GatewayError::InvalidForm("extended (*) parameters are not accepted"));
    }
    if key.eq_ignore_ascii_case(wanted) {
        if found.is_some() {
            return Err(GatewayError::InvalidForm(twice));
        }
        *found = Some(value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(value));
    }
    Ok(())
}

/// `name=value` of a header parameter, both trimmed; `None` without `=`.
fn split_parameter(parameter: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = parameter.iter().position(|byte| *byte == b'=')?;
    Some((parameter[..at].trim_ascii(), parameter[at + 1..].trim_ascii()))
}

/// `true` or `false` (any case): the values both sides read alike.
fn stream_value(value: &[u8]) -> Result<bool, GatewayError> {
    if value.eq_ignore_ascii_case(b"true") {
        Ok(true)
    } else if value.eq_ignore_ascii_case(b"false") {
        Ok(false)
    } else {
        Err(GatewayError::InvalidField("stream", "must be true or false"))
    }
}

/// The `name` of a part: its one `Content-Disposition: form-data` header's
/// one `name` parameter (any case, quoted or not, spaces around `=`).
///
/// # Errors
/// Lines not ended by CRLF, no or several `Content-Disposition` headers,
/// no or several names, an extended (`*`) or escaped parameter.
fn part_name(headers: &[u8]) -> Result<&[u8], GatewayError> {
    let mut name = None;
    let mut dispositions = 0;
    for line in split_crlf(headers) {
        if line.contains(&b'\r') || line.contains(&b'\n') {
            return Err(GatewayError::InvalidForm("a part's header line is not ended by CRLF"));
        }
        let Some(colon) = line.iter().position(|byte| *byte == b':') else {
            return Err(GatewayError::InvalidForm("a part's header has no name"));
        };
        if !line[..colon].trim_ascii().eq_ignore_ascii_case(b"content-disposition") {
            continue;
        }
        dispositions += 1;
        for parameter in quoted_split(&line[colon + 1..])? {
            take_parameter(parameter, b"name", &mut name, "a part has more than one name")?;
        }
    }
    if dispositions != 1 {
        return Err(GatewayError::InvalidForm("a part needs exactly one Content-Disposition"));
    }
    name.ok_or(GatewayError::InvalidForm("a part names no field"))
}

/// `bytes` split at each CRLF.
fn split_crlf(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let current = rest?;
        match memmem::find(current, b"\r\n") {
            Some(at) => {
                rest = Some(&current[at + 2..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

/// A header value's `;`-separated parameters, a `;` inside quotes kept.
///
/// # Errors
/// A backslash inside quotes (an escape another reader would undo) or an
/// unclosed quote.
fn quoted_split(value: &[u8]) -> Result<Vec<&[u8]>, GatewayError> {
    let (mut parts, mut start, mut quoted) = (Vec::new(), 0, false);
    for (at, byte) in value.iter().enumerate() {
        match byte {
            b'"' => quoted = !quoted,
            b'\\' if quoted => return Err(GatewayError::InvalidForm("escaped quotes are not accepted")),
            b';' if !quoted => {
                parts.push(&value[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return Err(GatewayError::InvalidForm("an unclosed quote"));
    }
    parts.push(&value[start..]);
    Ok(parts)
}

#[cfg(test)]
#[path = "form_scanner_tests.rs"]
mod tests;
