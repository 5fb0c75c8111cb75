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

use super::body::RequestFields;
use super::form_scanner::{FormFields, FormScanner, take_parameter};
use crate::error::GatewayError;

/// The boundary of a `multipart/form-data` body, from its `Content-Type`.
///
/// Strict, so that the backend cannot read another boundary than the
/// gateway did: one `Content-Type`, one `boundary` parameter, no
/// extended (`*`) parameters, the boundary of RFC 2046's characters only
/// (quoted or not, no escapes).
///
/// # Errors
/// Not a form, or a boundary that is missing, repeated or not RFC 2046's.
pub fn boundary(headers: &HeaderMap) -> Result<&[u8], GatewayError> {
    let mut types = headers.get_all(CONTENT_TYPE).iter();
    let value = types.next().map(http::HeaderValue::as_bytes).unwrap_or_default();
    if types.next().is_some() {
        return Err(GatewayError::InvalidForm("more than one Content-Type"));
    }
    let mut parameters = value.split(|byte| *byte == b';');
    let essence = parameters.next().unwrap_or_default().trim_ascii();
    if !essence.eq_ignore_ascii_case(b"multipart/form-data") {
        return Err(GatewayError::InvalidForm("Content-Type must be multipart/form-data"));
    }
    let mut found = None;
    for parameter in parameters {
        take_parameter(parameter, b"boundary", &mut found, "more than one boundary")?;
    }
    let boundary = found.ok_or(GatewayError::InvalidForm("Content-Type has no boundary"))?;
    let allowed = |byte: &u8| byte.is_ascii_alphanumeric() || b"'()+_,-./:=? ".contains(byte);
    if boundary.is_empty() || boundary.len() > 70 || !boundary.iter().all(allowed) || boundary.ends_with(b" ") {
        return Err(GatewayError::InvalidForm("the boundary must be 1 to 70 of RFC 2046's characters"));
    }
    Ok(boundary)
}

/// The `Content-Type` a form goes upstream with: of the gateway's own
/// making, with the one boundary it read (never the client's header);
/// `None` when the client's has none [`boundary`] accepts.
pub fn upstream_content_type(headers: &HeaderMap) -> Option<http::HeaderValue> {
    let mut value = b"multipart/form-data; boundary=".to_vec();
    value.extend_from_slice(boundary(headers).ok()?);
    http::HeaderValue::from_bytes(&value).ok()
}

/// A backend's model (a JSON string) as a form part's text: never one
/// that could end the part (no control characters).
pub fn model_text(model_json: &[u8]) -> Option<bytes::Bytes> {
    let name = serde_json::from_slice::<String>(model_json).ok()?;
    (!name.contains(char::is_control)).then(|| bytes::Bytes::from(name))
}

/// Scans a form, whole, whose parts are separated by `boundary`
/// ([`super::form_scanner::FormScanner`] fed it in one piece).
///
/// Strict where a lenient reader could see another form than the
/// backend's (python-multipart under vLLM): no preamble and nothing but
/// line ends after the closing delimiter, part headers ended by CRLF
/// only, one `Content-Disposition` a part, one `name` in it, no field
/// named twice among those the gateway reads.
///
/// # Errors
/// 400-class [`GatewayError`]s: a malformed form, no `model` part or more
/// than one, a model that is empty, too long or not UTF-8.
pub fn scan(body: &[u8], boundary: &[u8]) -> Result<RequestFields<'static>, GatewayError> {
    let mut scanner = FormScanner::new(boundary);
    scanner.feed(body)?;
    let fields = scanner.finish()?;
    Ok(request_fields(fields))
}

/// What routing reads of a form: its model (the part's value, rewritten
/// in place) and whether it streams; nothing else is the gateway's.
pub(super) fn request_fields(fields: FormFields) -> RequestFields<'static> {
    RequestFields {
        model: Cow::Owned(fields.model),
        model_span: fields.model_span,
        stream: fields.stream,
        stream_options: None,
        max_tokens: None,
        choices: 1,
        prompt_start: None,
        client_user: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::super::form_scanner::{MAX_PART_HEADERS, MAX_PARTS};
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
        for bad in [
            "application/json",
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/mixed; boundary=x",
            "multipart/form-data; boundary=A; boundary=B",
            "multipart/form-data; boundary*=UTF-8''x",
            "multipart/form-data; boundary=\"a;b\"",
            "multipart/form-data; boundary=\"a\\\"b\"",
            "multipart/form-data; boundary=\"ends-in-space \"",
        ] {
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
        // The name read as python-multipart reads it: any case, spaces
        // around `=`, a `;` inside a quoted filename kept.
        let body = b"--XyZ\r\nContent-Disposition: form-data; filename=\"x;name=junk;\"; Name = \"model\"\r\n\r\nm\r\n--XyZ--\r\n";
        assert_eq!(scan(body, b"XyZ").unwrap().model, "m");
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
            // What a lenient reader would read otherwise than the backend.
            ([b"preamble\r\n".as_slice(), &form(&[("model", "m")])].concat(), "invalid_form"),
            ([form(&[("model", "m")]).as_slice(), b"--XyZ\r\nmore"].concat(), "invalid_form"),
            (b"--XyZ\r\nContent-Disposition: form-data; name=\"junk\"\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--XyZ--".to_vec(), "invalid_form"),
            (b"--XyZ\r\nContent-Disposition: form-data; name=\"junk\"; name=\"model\"\r\n\r\nm\r\n--XyZ--".to_vec(), "invalid_form"),
            (b"--XyZ\r\nContent-Disposition: form-data; name*=UTF-8''model\r\n\r\nm\r\n--XyZ--".to_vec(), "invalid_form"),
            (b"--XyZ\r\nContent-Disposition: form-data; name=\"mo\\\"del\"\r\n\r\nm\r\n--XyZ--".to_vec(), "invalid_form"),
            (b"--XyZ\r\nX: a\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--XyZ--".to_vec(), "invalid_form"),
            (b"--XyZ\r\n\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--XyZ--".to_vec(), "invalid_form"),
            (form(&[("model", "m"), ("stream", "yes")]), "invalid_type"),
            (form(&[("model", "m"), ("stream", "true"), ("stream", "false")]), "invalid_form"),
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
