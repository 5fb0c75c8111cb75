//! Anthropic Messages (`/v1/messages`): Claude Code and the Anthropic SDKs.
//!
//! Requests: `model`, `stream`, `max_tokens`, `messages`. Usage:
//! `usage.input_tokens` (without the cache's share), `output_tokens`,
//! `cache_read_input_tokens`, `cache_creation_input_tokens`; a stream puts
//! the input counts in its first event (`message_start`) and the output
//! count in its last (`message_delta`), and carries them unasked. Errors:
//! `{"type":"error","error":{"type","message"}}`, the type named by the
//! status.

use bytes::Bytes;

use super::roles::{Field, UsageCount};
use crate::error::GatewayError;

/// What the top-level request field `key` means: Anthropic's own names,
/// then OpenAI's.
///
/// NB: OpenAI's names are read here too (`n`, `max_completion_tokens`,
/// `stream_options`, …). Until the gateway translates, a Messages request
/// goes to a server as the client wrote it, and servers that answer both
/// dialects may honour them: the reservation keeps counting the larger
/// bound and the choices, as it did before this path had a dialect.
#[inline]
pub fn field(key: &[u8]) -> Option<Field> {
    match key {
        b"model" => Some(Field::Model),
        b"stream" => Some(Field::Stream),
        b"max_tokens" => Some(Field::OutputBound),
        b"messages" => Some(Field::Prompt),
        _ => super::openai::field(key),
    }
}

/// What the `usage` member `key` counts.
pub fn usage_count(key: &[u8]) -> Option<UsageCount> {
    Some(match key {
        b"input_tokens" => UsageCount::Input,
        b"output_tokens" => UsageCount::Output,
        b"cache_read_input_tokens" => UsageCount::CacheRead,
        b"cache_creation_input_tokens" => UsageCount::CacheCreation,
        _ => return None,
    })
}

/// Anthropic's `error.type` for an answer with `status`, as its API names
/// them (any other 4xx is an `invalid_request_error`, any other 5xx an
/// `api_error`).
pub fn error_type(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The error body: `{"type":"error","error":{"type","message"}}`. Written
/// by hand, as OpenAI's is.
pub fn error_body(error: &GatewayError) -> Bytes {
    use crate::json_text::json_string;
    let message = error.to_string();
    let mut body = Vec::with_capacity(64 + message.len());
    body.extend_from_slice(br#"{"type":"error","error":{"type":"#);
    json_string(error_type(error.status()), &mut body);
    body.extend_from_slice(br#","message":"#);
    json_string(&message, &mut body);
    body.extend_from_slice(b"}}");
    Bytes::from(body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    /// Each error the gateway answers a Messages client with, in
    /// Anthropic's shape: the type its API gives that status, the
    /// gateway's message, nothing else.
    #[test]
    fn errors_are_anthropic_shaped() {
        let rows: [(GatewayError, u16, &str); 10] = [
            (GatewayError::InvalidKey, 401, "authentication_error"),
            (GatewayError::ModelNotAllowed("m".into()), 403, "permission_error"),
            (GatewayError::UnknownModel("m".into()), 404, "not_found_error"),
            (GatewayError::BodyTooLarge(1), 413, "request_too_large"),
            (GatewayError::InvalidJson("x"), 400, "invalid_request_error"),
            (GatewayError::MethodNotAllowed, 405, "invalid_request_error"),
            (GatewayError::HeadersTooLarge(1), 431, "invalid_request_error"),
            (GatewayError::UpstreamNotJson("m".into(), 529), 529, "overloaded_error"),
            (GatewayError::UpstreamTimeout("m".into()), 504, "api_error"),
            (GatewayError::NotReady, 503, "api_error"),
        ];
        for (error, status, kind) in rows {
            assert_eq!(error.status().as_u16(), status, "{error:?}");
            let value: serde_json::Value = serde_json::from_slice(&error_body(&error)).unwrap();
            assert_eq!(value["type"], "error", "{value}");
            assert_eq!(value["error"]["type"], kind, "{error:?}");
            assert_eq!(value["error"]["message"], error.to_string());
            assert_eq!((value.as_object().unwrap().len(), value["error"].as_object().unwrap().len()), (2, 2));
        }
        let hostile = GatewayError::UnknownModel("a\"\n\u{1}".into());
        let value: serde_json::Value = serde_json::from_slice(&error_body(&hostile)).unwrap();
        assert!(value["error"]["message"].as_str().unwrap().contains("a\"\n\u{1}"), "{value}");
    }

    #[test]
    fn request_fields_table() {
        let rows: [(&[u8], Option<Field>); 7] = [
            (b"model", Some(Field::Model)),
            (b"stream", Some(Field::Stream)),
            (b"max_tokens", Some(Field::OutputBound)),
            (b"messages", Some(Field::Prompt)),
            // OpenAI's, read here as before (see `field`).
            (b"n", Some(Field::Choices)),
            (b"max_completion_tokens", Some(Field::OutputBound)),
            (b"system", None),
        ];
        for (key, expected) in rows {
            assert_eq!(field(key), expected, "{}", String::from_utf8_lossy(key));
        }
    }
}
