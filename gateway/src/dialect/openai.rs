//! OpenAI's dialect: chat and text completions, embeddings, responses.
//!
//! Requests: `model`, `stream`, `stream_options`, the output bounds
//! (`max_tokens`, `max_completion_tokens`, `max_output_tokens`), the
//! choices (`n`, `best_of`), the prompt (`messages`, `input`, `prompt`).
//! Usage: `usage.prompt_tokens` / `completion_tokens` (chat, completions,
//! embeddings), `input_tokens` / `output_tokens` (responses), the cached
//! share in `*_tokens_details.cached_tokens`. Chat and completion streams
//! carry usage only when asked (`stream_options.include_usage`), in a chunk
//! of their own with no choices. Errors:
//! `{"error":{"message","type","param","code"}}`.

use std::ops::Range;

use bytes::Bytes;

use super::roles::{Field, UsageCount};
use crate::error::GatewayError;

/// What the top-level request field `key` means.
#[inline]
pub fn field(key: &[u8]) -> Option<Field> {
    Some(match key {
        b"model" => Field::Model,
        b"stream" => Field::Stream,
        b"stream_options" => Field::StreamOptions,
        b"max_tokens" | b"max_completion_tokens" | b"max_output_tokens" => Field::OutputBound,
        b"n" | b"best_of" => Field::Choices,
        b"messages" | b"input" | b"prompt" => Field::Prompt,
        b"user" => Field::ClientUser,
        _ => return None,
    })
}

/// What the `usage` member `key` counts.
pub fn usage_count(key: &[u8]) -> Option<UsageCount> {
    Some(match key {
        b"prompt_tokens" => UsageCount::Prompt,
        b"completion_tokens" => UsageCount::Completion,
        b"input_tokens" => UsageCount::Input,
        b"output_tokens" => UsageCount::Output,
        b"prompt_tokens_details" | b"input_tokens_details" => UsageCount::CachedDetails,
        _ => return None,
    })
}

/// OpenAI's `error.type` for `error`.
pub fn error_type(error: &GatewayError) -> &'static str {
    use GatewayError::*;
    match error {
        MissingKey | InvalidKey | ExpiredKey | DisabledKey | TokenRefused(_) | NoGrant(_) | AmbiguousGrant => {
            "authentication_error"
        }
        ModelNotAllowed(_) => "permission_error",
        UpstreamUnreachable(_)
        | UpstreamFailed(_)
        | UpstreamTimeout(_)
        | EgressDenied(_)
        | NotReady
        | RateLimitUnavailable(_) => "server_error",
        UpstreamNotJson(_, status) if *status >= 500 => "server_error",
        // As OpenAI's own 429s: the type names what ran out.
        RateLimited(refusal) => refusal.unit.as_str(),
        ModelBusy { .. } | GrantFull(_) => "requests",
        // As OpenAI's own answer when an account's quota is spent.
        InsufficientQuota(_) => "insufficient_quota",
        _ => "invalid_request_error",
    }
}

/// The error body: `{"error":{"message","type","param","code"}}`, the code
/// being the gateway's own ([`GatewayError::code`]). Written by hand: a
/// flood of refusals (bad keys) costs what the checks cost, not a serde
/// tree per answer.
pub fn error_body(error: &GatewayError) -> Bytes {
    use crate::json_text::json_string;
    let message = error.to_string();
    let mut body = Vec::with_capacity(96 + message.len());
    body.extend_from_slice(br#"{"error":{"message":"#);
    json_string(&message, &mut body);
    body.extend_from_slice(br#","type":"#);
    json_string(error_type(error), &mut body);
    body.extend_from_slice(br#","param":null,"code":"#);
    json_string(error.code(), &mut body);
    body.extend_from_slice(b"}}");
    Bytes::from(body)
}

/// A usage object's start, as servers write it (no space).
const USAGE_OBJECT: &[u8] = br#""usage":{"#;
/// A chunk with no choices.
const NO_CHOICES: &[u8] = br#""choices":[]"#;

/// Whether `bytes` may hold a stream's usage chunk: they hold a usage
/// object (most chunks say `"usage":null`, or nothing).
pub fn may_hold_usage(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, USAGE_OBJECT).is_some()
}

/// Whether a complete server-sent event is the usage-only chunk that
/// `stream_options.include_usage` adds: a usage object and no choices.
pub fn is_usage_only_event(event: &[u8]) -> bool {
    may_hold_usage(event) && memchr::memmem::find(event, NO_CHOICES).is_some()
}

/// `body` asking for usage in the stream (`stream_options.include_usage`),
/// the model's span in it, and whether the gateway added the request (so
/// the usage chunk is the gateway's to take out again). `options` is the
/// span of the client's own `stream_options` value, if any.
pub fn with_stream_usage(
    body: &Bytes,
    options: Option<Range<usize>>,
    model_span: Range<usize>,
) -> (Bytes, Range<usize>, bool) {
    const FIELD: &[u8] = br#""stream_options":{"include_usage":true},"#;
    match options {
        None => {
            // The body is a JSON object with at least "model": a field and a
            // comma fit right after its opening brace.
            let Some(open) = body.iter().position(|byte| *byte == b'{') else {
                return (body.clone(), model_span, false);
            };
            let (body, model_span) = splice(body, open + 1..open + 1, FIELD, model_span);
            (body, model_span, true)
        }
        // NB: `null` is replaced in place: a second `stream_options` key
        // would leave the upstream to pick one (most keep the last, `null`).
        Some(span) if &body[span.clone()] == b"null" => {
            let (body, model_span) = splice(body, span, br#"{"include_usage":true}"#, model_span);
            (body, model_span, true)
        }
        Some(span) => {
            let Ok(mut options) =
                serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body[span.clone()])
            else {
                // Not an object: the upstream refuses it as it would without us.
                return (body.clone(), model_span, false);
            };
            if options.get("include_usage") == Some(&serde_json::Value::Bool(true)) {
                return (body.clone(), model_span, false);
            }
            options.insert("include_usage".to_owned(), serde_json::Value::Bool(true));
            let Ok(text) = serde_json::to_vec(&options) else { return (body.clone(), model_span, false) };
            let (body, model_span) = splice(body, span, &text, model_span);
            (body, model_span, true)
        }
    }
}

/// `body` with `replaced` swapped for `with`, and where `model_span` moved to.
fn splice(body: &Bytes, replaced: Range<usize>, with: &[u8], model_span: Range<usize>) -> (Bytes, Range<usize>) {
    let mut out = Vec::with_capacity(body.len() + with.len());
    out.extend_from_slice(&body[..replaced.start]);
    out.extend_from_slice(with);
    out.extend_from_slice(&body[replaced.end..]);
    let model_span = if replaced.end <= model_span.start {
        let moved = |at: usize| at + with.len() - replaced.len();
        moved(model_span.start)..moved(model_span.end)
    } else {
        model_span
    };
    (Bytes::from(out), model_span)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    #[test]
    fn bodies_are_openai_shaped_and_escaped() {
        let error = GatewayError::UnknownModel("evil\"model".into());
        let value: serde_json::Value = serde_json::from_slice(&error_body(&error)).unwrap();
        assert_eq!(value["error"]["code"], "model_not_found");
        assert_eq!(value["error"]["type"], "invalid_request_error");
        assert_eq!(value["error"]["message"], "model 'evil\"model' does not exist or you do not have access to it");
        assert!(value["error"]["param"].is_null());
        let hostile = GatewayError::ModelNotAllowed("a\n\u{1}\\b".into());
        let value: serde_json::Value = serde_json::from_slice(&error_body(&hostile)).unwrap();
        assert!(value["error"]["message"].as_str().unwrap().contains("a\n\u{1}\\b"), "{value}");
        assert_eq!(value["error"].as_object().unwrap().len(), 4, "{value}");
    }

    #[test]
    fn request_fields_table() {
        let rows: [(&[u8], Option<Field>); 14] = [
            (b"model", Some(Field::Model)),
            (b"stream", Some(Field::Stream)),
            (b"stream_options", Some(Field::StreamOptions)),
            (b"max_tokens", Some(Field::OutputBound)),
            (b"max_completion_tokens", Some(Field::OutputBound)),
            (b"max_output_tokens", Some(Field::OutputBound)),
            (b"n", Some(Field::Choices)),
            (b"best_of", Some(Field::Choices)),
            (b"messages", Some(Field::Prompt)),
            (b"input", Some(Field::Prompt)),
            (b"prompt", Some(Field::Prompt)),
            (b"user", Some(Field::ClientUser)),
            (b"Model", None),
            (b"", None),
        ];
        for (key, expected) in rows {
            assert_eq!(field(key), expected, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn the_usage_only_chunk_is_told_from_content() {
        let rows: [(&str, bool); 4] = [
            ("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n", true),
            ("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n", false),
            ("data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"total_tokens\":1}}\n\n", false),
            ("data: [DONE]\n\n", false),
        ];
        for (event, usage_only) in rows {
            assert_eq!(is_usage_only_event(event.as_bytes()), usage_only, "{event}");
        }
    }

    fn injected(body: &str) -> (String, String, bool) {
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        let fields = crate::proxy::body::scan(&bytes, super::super::Dialect::OpenAi).unwrap();
        let (out, span, strip) = with_stream_usage(&bytes, fields.stream_options.clone(), fields.model_span.clone());
        (String::from_utf8(out[span].to_vec()).unwrap(), String::from_utf8(out.to_vec()).unwrap(), strip)
    }

    #[test]
    fn stream_usage_is_asked_for_and_the_model_still_found() {
        let (model, body, strip) = injected(r#"{"model":"m","stream":true,"messages":[]}"#);
        assert_eq!(model, r#""m""#);
        assert!(strip);
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["stream_options"]["include_usage"], true);
        assert_eq!(value["model"], "m");

        let (model, body, strip) =
            injected(r#"{"stream_options":{"include_usage":false,"x":1},"stream":true,"model":"m"}"#);
        assert_eq!(model, r#""m""#);
        assert!(strip, "the client said no: its stream must not show usage");
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["stream_options"], serde_json::json!({"include_usage": true, "x": 1}));

        let (model, body, strip) = injected(r#"{"stream_options":null,"model":"m","stream":true}"#);
        assert_eq!(model, r#""m""#);
        assert!(strip);
        assert_eq!(body, r#"{"stream_options":{"include_usage":true},"model":"m","stream":true}"#);

        let original = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#;
        let (_, body, strip) = injected(original);
        assert_eq!((body.as_str(), strip), (original, false), "the client asked: untouched, chunk kept");
    }
}
