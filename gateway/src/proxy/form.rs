//! A `multipart/form-data` request (OpenAI's `/v1/audio/transcriptions`
//! and `/translations`: an audio file beside `model` and the options): its
//! `model` and `stream` fields found in one pass over the parts, the
//! file's bytes searched for the next boundary only, never copied.
//!
//! ```text
//! --BOUNDARY\r\n
//! Content-Disposition: form-data; name="model"\r\n
//! \r\n
//! whisper-1\r\n                     ← model_span: the value's bytes, rewritten in place
//! --BOUNDARY\r\n
//! Content-Disposition: form-data; name="file"; filename="a.wav"\r\n
//! Content-Type: audio/wav\r\n
//! \r\n
//! <bytes>\r\n
//! --BOUNDARY--\r\n
//! ```
//!
//! Hostile forms are bounded: at most [`MAX_PARTS`] parts, each part's
//! headers at most [`MAX_PART_HEADERS`] bytes; anything malformed is a
//! 400 that says what.

use std::borrow::Cow;

use http::HeaderMap;
use http::header::CONTENT_TYPE;
use memchr::memmem;

use super::body::RequestFields;
use crate::error::GatewayError;

/// Most parts a form may have (a transcription has a handful).
pub const MAX_PARTS: usize = 64;
/// Most bytes of one part's headers.
pub const MAX_PART_HEADERS: usize = 8 * 1024;
/// Longest model name read from a form.
const MAX_MODEL_BYTES: usize = 256;

/// The boundary of a `multipart/form-data` body, from its `Content-Type`.
///
/// # Errors
/// Not a form, or no boundary of 1–70 characters (RFC 2046).
pub fn boundary(headers: &HeaderMap) -> Result<&[u8], GatewayError> {
    let value = headers.get(CONTENT_TYPE).map(http::HeaderValue::as_bytes).unwrap_or_default();
    let mut parameters = value.split(|byte| *byte == b';');
    let essence = parameters.next().unwrap_or_default().trim_ascii();
    if !essence.eq_ignore_ascii_case(b"multipart/form-data") {
        return Err(GatewayError::InvalidForm("Content-Type must be multipart/form-data"));
    }
    let boundary = parameters
        .filter_map(|parameter| {
            let (name, value) =
                parameter.trim_ascii().split_at(parameter.trim_ascii().iter().position(|b| *b == b'=')?);
            name.eq_ignore_ascii_case(b"boundary").then(|| &value[1..])
        })
        .next()
        .map(|value| value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(value))
        .ok_or(GatewayError::InvalidForm("Content-Type has no boundary"))?;
    if boundary.is_empty() || boundary.len() > 70 {
        return Err(GatewayError::InvalidForm("the boundary must be 1 to 70 characters"));
    }
    Ok(boundary)
}

/// Scans a form whose parts are separated by `boundary`.
///
/// # Errors
/// 400-class [`GatewayError`]s: a malformed form, no `model` part or more
/// than one, a model that is empty, too long or not UTF-8.
pub fn scan<'a>(body: &'a [u8], boundary: &[u8]) -> Result<RequestFields<'a>, GatewayError> {
    let mut delimiter = Vec::with_capacity(boundary.len() + 4);
    delimiter.extend_from_slice(b"\r\n--");
    delimiter.extend_from_slice(boundary);
    let finder = memmem::Finder::new(&delimiter);
    // The first delimiter may open the body (no CRLF before it).
    let mut at = if body.starts_with(&delimiter[2..]) {
        delimiter.len() - 2
    } else {
        finder.find(body).ok_or(GatewayError::InvalidForm("no part starts with the boundary"))? + delimiter.len()
    };
    let (mut model, mut stream) = (None, false);
    for _ in 0..=MAX_PARTS {
        let rest = &body[at..];
        if rest.starts_with(b"--") {
            return fields_of(body, model, stream);
        }
        let rest = rest.strip_prefix(b"\r\n").ok_or(GatewayError::InvalidForm("a boundary is not followed by CRLF"))?;
        let headers_start = body.len() - rest.len();
        let window = &rest[..rest.len().min(MAX_PART_HEADERS + 4)];
        let headers_len = memmem::find(window, b"\r\n\r\n")
            .ok_or(GatewayError::InvalidForm("a part's headers are too long or unended"))?;
        let name = part_name(&rest[..headers_len]).ok_or(GatewayError::InvalidForm("a part names no field"))?;
        let value_start = headers_start + headers_len + 4;
        let value_len = finder
            .find(&body[value_start..])
            .ok_or(GatewayError::InvalidForm("the form does not end with its boundary"))?;
        let value = value_start..value_start + value_len;
        match name {
            b"model" if model.is_some() => return Err(GatewayError::DuplicateModel),
            b"model" => model = Some(value),
            b"stream" => stream = body[value].eq_ignore_ascii_case(b"true"),
            _ => {}
        }
        at = value_start + value_len + delimiter.len();
    }
    Err(GatewayError::InvalidForm("the form has more than 64 parts"))
}

/// What routing reads of a form: its model (the part's value, rewritten
/// in place) and whether it streams; nothing else is the gateway's.
fn fields_of(
    body: &[u8],
    model: Option<std::ops::Range<usize>>,
    stream: bool,
) -> Result<RequestFields<'_>, GatewayError> {
    let span = model.ok_or(GatewayError::MissingModel)?;
    let text =
        std::str::from_utf8(&body[span.clone()]).map_err(|_| GatewayError::InvalidField("model", "must be text"))?;
    if text.is_empty() || text.len() > MAX_MODEL_BYTES {
        return Err(GatewayError::InvalidField("model", "must be 1 to 256 bytes"));
    }
    Ok(RequestFields {
        model: Cow::Borrowed(text),
        model_span: span,
        stream,
        stream_options: None,
        max_tokens: None,
        choices: 1,
        prompt_start: None,
        client_user: None,
    })
}

/// The `name` of a part's `Content-Disposition: form-data; name="…"`.
fn part_name(headers: &[u8]) -> Option<&[u8]> {
    headers.split(|byte| *byte == b'\n').find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|byte| *byte == b':')?;
        if !line[..colon].eq_ignore_ascii_case(b"content-disposition") {
            return None;
        }
        line[colon + 1..].split(|byte| *byte == b';').find_map(|parameter| {
            let parameter = parameter.trim_ascii();
            let value = parameter.strip_prefix(b"name=")?;
            Some(value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(value))
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    fn form(parts: &[(&str, &str)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, value) in parts {
            body.extend_from_slice(
                format!("--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
            );
        }
        body.extend_from_slice(b"--XyZ--\r\n");
        body
    }

    fn headers(content_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, content_type.parse().unwrap());
        headers
    }

    #[test]
    fn the_boundary_is_read_quoted_or_not() {
        assert_eq!(boundary(&headers("multipart/form-data; boundary=XyZ")).unwrap(), b"XyZ");
        assert_eq!(boundary(&headers("Multipart/Form-Data;charset=utf-8; Boundary=\"a b\"")).unwrap(), b"a b");
        for bad in
            ["application/json", "multipart/form-data", "multipart/form-data; boundary=", "multipart/mixed; boundary=x"]
        {
            assert!(matches!(boundary(&headers(bad)), Err(GatewayError::InvalidForm(_))), "{bad}");
        }
        let long = format!("multipart/form-data; boundary={}", "b".repeat(71));
        assert!(boundary(&headers(&long)).is_err());
    }

    /// The model's span is its value's bytes, whatever part holds it and
    /// whatever bytes the file holds (a boundary-like line without the
    /// delimiter's CRLF, binary zeros).
    #[test]
    fn the_model_and_stream_are_found_in_any_part() {
        let body =
            form(&[("file", "RIFF\0\0--XyZ not a delimiter\r\n-XyZ"), ("model", "whisper-1"), ("stream", "true")]);
        let fields = scan(&body, b"XyZ").unwrap();
        assert_eq!(fields.model, "whisper-1");
        assert_eq!(&body[fields.model_span.clone()], b"whisper-1");
        assert!(fields.stream);
        let not_streamed = form(&[("model", "m"), ("stream", "false")]);
        assert!(!scan(&not_streamed, b"XyZ").unwrap().stream);
        // A preamble before the first boundary is skipped.
        let mut preamble = b"ignored\r\n".to_vec();
        preamble.extend_from_slice(&form(&[("model", "m")]));
        assert_eq!(scan(&preamble, b"XyZ").unwrap().model, "m");
    }

    #[test]
    fn malformed_forms_are_refused_with_what_is_wrong() {
        let too_many: Vec<(&str, &str)> = (0..=MAX_PARTS).map(|_| ("x", "1")).collect();
        let unended = b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm".to_vec();
        let mut huge_headers = b"--XyZ\r\nX: ".to_vec();
        huge_headers.extend(std::iter::repeat_n(b'a', MAX_PART_HEADERS + 10));
        huge_headers.extend_from_slice(b"\r\n\r\nv\r\n--XyZ--");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (form(&[("file", "x")]), "missing_model"),
            (form(&[("model", "a"), ("model", "b")]), "duplicate_model"),
            (form(&[("model", "")]), "invalid_model"),
            (form(&[("model", &"m".repeat(257))]), "invalid_model"),
            (form(&too_many), "invalid_form"),
            (unended, "invalid_form"),
            (huge_headers, "invalid_form"),
            (b"no boundary here".to_vec(), "invalid_form"),
            (b"--XyZ\r\nContent-Type: text/plain\r\n\r\nv\r\n--XyZ--".to_vec(), "invalid_form"),
            (b"--XyZgarbage".to_vec(), "invalid_form"),
        ];
        for (body, code) in cases {
            let refused = scan(&body, b"XyZ").unwrap_err();
            assert_eq!(refused.code(), code, "{}", String::from_utf8_lossy(&body[..body.len().min(80)]));
            assert_eq!(refused.status(), http::StatusCode::BAD_REQUEST);
        }
    }

    /// Every prefix of a form is refused or read, never a panic.
    #[test]
    fn every_prefix_of_a_form_is_handled() {
        let body = form(&[("model", "whisper-1"), ("file", "abc")]);
        for end in 0..body.len() {
            let _ = scan(&body[..end], b"XyZ");
        }
        assert!(scan(&body, b"XyZ").is_ok());
    }
}
