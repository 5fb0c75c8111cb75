//! The mock's answers to the calls vLLM and SGLang serve beside chat:
//! rerank, score, the tokenizer's, Anthropic's `count_tokens`,
//! moderations — their shapes, with a prompt count of a token per four
//! request bytes. The tokenizer's answer carries a `usage` object on
//! purpose: the gateway must charge such a call nothing whatever it says.

use serde_json::{Value, json};

use crate::openai::text;

/// What `/v1/audio/speech` answers: bytes that are not JSON (an MP3's
/// tag header), as a speech server's are.
pub(crate) const SPEECH: &[u8] = b"ID3\x04\x00\x00mock-audio";

/// The answer to a call at `path` for `model`, if the mock serves it.
pub(crate) fn answer(path: &str, model: &str, prompt_tokens: u64) -> Option<Value> {
    let answer = match path {
        "/v1/rerank" => json!({
            "id": "rerank-mock", "model": model, "results": [{"index": 0, "relevance_score": 0.9}],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }),
        "/v1/score" => json!({
            "id": "score-mock", "object": "list", "model": model,
            "data": [{"index": 0, "object": "score", "score": 0.9}],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0},
        }),
        "/tokenize" => json!({
            "count": prompt_tokens, "max_model_len": 4096, "tokens": [1, 2, 3],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }),
        "/detokenize" => json!({"prompt": text(3)}),
        "/v1/messages/count_tokens" => json!({"input_tokens": prompt_tokens}),
        "/v1/audio/transcriptions" | "/v1/audio/translations" => json!({
            "text": "mock transcript",
            "usage": {"type": "tokens", "input_tokens": prompt_tokens, "output_tokens": 3, "total_tokens": prompt_tokens + 3},
        }),
        "/v1/images/generations" => json!({
            "created": 0, "data": [{"b64_json": "iVBORw0KGgo="}],
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 16, "total_tokens": prompt_tokens + 16},
        }),
        "/v1/moderations" => json!({
            "id": "modr-mock", "model": model,
            "results": [{"flagged": false, "categories": {}, "category_scores": {}}],
        }),
        _ => return None,
    };
    Some(answer)
}
