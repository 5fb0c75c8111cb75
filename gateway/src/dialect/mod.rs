//! The wire dialects: what a request and a response look like on the wire,
//! one file per dialect, behind one interface ([`Dialect`]), and the table
//! of the inference APIs the gateway forwards ([`APIS`]: each path, its
//! dialect, what it is).
//!
//! What the rest of the gateway asks a dialect, and who asks:
//!
//! ```text
//! which paths it serves              APIS rows                      proxy/route.rs Endpoint, snapshot/backends.rs (upstream paths), telemetry
//! which request fields it reads      Dialect::field → Field          proxy/body.rs scan (one JSON pass; the dialect names the keys)
//! how streams report usage           Api::stream_usage               proxy/usage.rs body_to_send (openai::with_stream_usage),
//!                                    openai::is_usage_only_event     proxy/sse.rs (the chunk the gateway asked for, taken out again)
//! where usage is in a response       usage_count → UsageCount        proxy/usage.rs (the tap: the last and first `"usage"` objects)
//! how an error body is written       Dialect::error_body             proxy/respond.rs (every error the gateway answers itself)
//! what a backend's format makes of a request   plan::plan, plan::Translated   proxy/mod.rs (the body, once), proxy/forward.rs (path and body per backend)
//! how its answer comes back          translate::answer               proxy/translated.rs (whole), proxy/stream.rs (event by event)
//! ```
//!
//! Static dispatch: a `Dialect` is a `Copy` enum and each method a `match`
//! calling into its file, so the request path pays a branch, never a
//! virtual call or an allocation.
//!
//! A new dialect is a file here (its `field`, `usage_count` and
//! `error_body`), a variant of [`Dialect`] with its arm in each method, and
//! its paths as rows of [`APIS`]. A new endpoint of a known dialect is a row
//! of [`APIS`]. The tests that prove one: the table tests of its file, the
//! rows of `apis_are_served_in_their_dialect` below, and a request to the
//! path in `gateway/tests/gateway.rs` (its error body is in its dialect).

pub mod anthropic;
pub mod openai;
pub mod plan;
mod roles;
pub mod translate;

use bytes::Bytes;

use crate::error::GatewayError;
pub use roles::{Field, UsageCount};

/// A wire format clients speak (and, until the gateway translates, the
/// servers behind the path answer in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI's: chat and text completions, embeddings, responses; also the
    /// gateway's own endpoints (`/v1/models`, `/v1/usage`) and paths it
    /// does not know.
    OpenAi,
    /// Anthropic Messages (Claude Code, the Anthropic SDKs).
    Anthropic,
}

/// How a path's streams report their usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamUsage {
    /// Every stream carries it (or the path does not stream).
    Always,
    /// Only when the request asks with OpenAI's
    /// `stream_options.include_usage` (the gateway asks for a charged
    /// stream, and takes the usage chunk out again if the client did not).
    WhenAsked,
}

/// Where a path is on a backend, from its base URL (`http://vllm:8000/v1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamAt {
    /// What follows `/v1` in the client's path, after the base URL's path
    /// (`/v1/rerank` → `http://vllm:8000/v1/rerank`).
    UnderBase,
    /// The client's path at the server's root: the base URL's path less a
    /// last `/v1` (`/tokenize` → `http://vllm:8000/tokenize`), where vLLM
    /// and SGLang serve their tokenizers.
    AtRoot,
}

/// Whether a path's answers are charged tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCharge {
    /// What its answer's usage reports (or the estimate without one), as a
    /// chat's: token limits, budgets, prices, usage.
    Used,
    /// Nothing: a tokenizer's call generates nothing and reads no prompt
    /// through a model. Its requests are counted (request limits, the
    /// access line, metrics); its tokens never (Claude Code counts its
    /// whole context this way many times a turn: charged, it would spend
    /// a budget on counting).
    Never,
}

/// An inference API the gateway forwards to a model's backends.
#[derive(Debug)]
pub struct Api {
    /// The client's path; the upstream's is the backend's base URL and
    /// what follows `/v1` here.
    pub path: &'static str,
    /// What its bodies and errors look like.
    pub dialect: Dialect,
    /// Its GenAI operation (`gen_ai.operation.name` of its spans).
    pub operation: &'static str,
    /// How its streams report usage.
    pub stream_usage: StreamUsage,
    /// Where it is on a backend.
    pub upstream: UpstreamAt,
    /// Whether its answers are charged tokens.
    pub tokens: TokenCharge,
    /// Its body is a `multipart/form-data` form (an audio file beside
    /// `model`: `crate::proxy::form`), not JSON.
    pub form: bool,
    /// Its answer is media (audio, images): without a reported usage its
    /// bytes are charged no output tokens.
    pub media_answer: bool,
}

/// The inference APIs, in the order a backend's upstream paths are built
/// (a request's endpoint is an index here). A `static`, not a `const`: a
/// row's strings are the same pointers wherever they are read (telemetry
/// compares the operation's by pointer).
pub static APIS: [Api; 15] = [
    Api::new("/v1/chat/completions", Dialect::OpenAi, "chat", StreamUsage::WhenAsked),
    Api::new("/v1/completions", Dialect::OpenAi, "text_completion", StreamUsage::WhenAsked),
    Api::new("/v1/embeddings", Dialect::OpenAi, "embeddings", StreamUsage::Always),
    Api::new("/v1/responses", Dialect::OpenAi, "chat", StreamUsage::Always),
    Api::new("/v1/messages", Dialect::Anthropic, "chat", StreamUsage::Always),
    // Claude Code's context count: the backend's own when it has one.
    Api::new("/v1/messages/count_tokens", Dialect::Anthropic, "count_tokens", StreamUsage::Always).free(),
    // vLLM's and SGLang's, called by RAG stacks.
    Api::new("/v1/rerank", Dialect::OpenAi, "rerank", StreamUsage::Always),
    Api::new("/v1/score", Dialect::OpenAi, "score", StreamUsage::Always),
    Api::new("/tokenize", Dialect::OpenAi, "tokenize", StreamUsage::Always).free().at_root(),
    Api::new("/detokenize", Dialect::OpenAi, "detokenize", StreamUsage::Always).free().at_root(),
    Api::new("/v1/moderations", Dialect::OpenAi, "moderation", StreamUsage::Always),
    // Audio and images: forms with a file, and JSON answered with bytes.
    Api::new("/v1/audio/transcriptions", Dialect::OpenAi, "transcription", StreamUsage::Always).form(),
    Api::new("/v1/audio/translations", Dialect::OpenAi, "translation", StreamUsage::Always).form(),
    Api::new("/v1/audio/speech", Dialect::OpenAi, "speech", StreamUsage::Always).media(),
    Api::new("/v1/images/generations", Dialect::OpenAi, "image_generation", StreamUsage::Always).media(),
];

impl Api {
    const fn new(path: &'static str, dialect: Dialect, operation: &'static str, stream_usage: StreamUsage) -> Self {
        Self {
            path,
            dialect,
            operation,
            stream_usage,
            upstream: UpstreamAt::UnderBase,
            tokens: TokenCharge::Used,
            form: false,
            media_answer: false,
        }
    }

    const fn media(self) -> Self {
        Self { media_answer: true, ..self }
    }

    const fn form(self) -> Self {
        Self { form: true, ..self }
    }

    const fn free(self) -> Self {
        Self { tokens: TokenCharge::Never, ..self }
    }

    const fn at_root(self) -> Self {
        Self { upstream: UpstreamAt::AtRoot, ..self }
    }

    /// Its path on a backend whose base URL's path is `base_path`.
    pub fn upstream_path(&self, base_path: &str) -> String {
        match self.upstream {
            UpstreamAt::UnderBase => format!("{base_path}{}", &self.path["/v1".len()..]),
            UpstreamAt::AtRoot => format!("{}{}", base_path.strip_suffix("/v1").unwrap_or(base_path), self.path),
        }
    }
}

/// The index in [`APIS`] of the API at `path`, if any.
pub fn api_at(path: &str) -> Option<usize> {
    APIS.iter().position(|api| api.path == path)
}

impl Dialect {
    /// What the top-level request field named `key` (unescaped) means to
    /// the gateway; `None`: a field it does not read.
    #[inline]
    pub fn field(self, key: &[u8]) -> Option<Field> {
        match self {
            Self::OpenAi => openai::field(key),
            Self::Anthropic => anthropic::field(key),
        }
    }

    /// The body of an error the gateway answers itself, in this dialect.
    pub fn error_body(self, error: &GatewayError) -> Bytes {
        match self {
            Self::OpenAi => openai::error_body(error),
            Self::Anthropic => anthropic::error_body(error),
        }
    }

    /// The response to an error the gateway answers itself, in this
    /// dialect (its status and headers are the error's, whatever the dialect).
    pub fn error_response<B: From<Bytes>>(self, error: &GatewayError) -> http::Response<B> {
        error.response(self.error_body(error))
    }
}

/// What the member named `key` of a response's `usage` object counts.
///
/// Every dialect's names are read whatever the path: servers mix them
/// (an OpenAI-compatible proxy in front of Anthropic models reports
/// Anthropic's cache counts beside OpenAI's; OpenAI's Responses API uses
/// Anthropic's `input_tokens` and `output_tokens`), and the names do not
/// collide.
pub fn usage_count(key: &[u8]) -> Option<UsageCount> {
    openai::usage_count(key).or_else(|| anthropic::usage_count(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each API's path finds its row, and its dialect answers errors in
    /// its own shape.
    #[test]
    fn apis_are_served_in_their_dialect() {
        let rows: [(&str, Dialect, &str, StreamUsage); 15] = [
            ("/v1/chat/completions", Dialect::OpenAi, "chat", StreamUsage::WhenAsked),
            ("/v1/completions", Dialect::OpenAi, "text_completion", StreamUsage::WhenAsked),
            ("/v1/embeddings", Dialect::OpenAi, "embeddings", StreamUsage::Always),
            ("/v1/responses", Dialect::OpenAi, "chat", StreamUsage::Always),
            ("/v1/messages", Dialect::Anthropic, "chat", StreamUsage::Always),
            ("/v1/messages/count_tokens", Dialect::Anthropic, "count_tokens", StreamUsage::Always),
            ("/v1/rerank", Dialect::OpenAi, "rerank", StreamUsage::Always),
            ("/v1/score", Dialect::OpenAi, "score", StreamUsage::Always),
            ("/tokenize", Dialect::OpenAi, "tokenize", StreamUsage::Always),
            ("/detokenize", Dialect::OpenAi, "detokenize", StreamUsage::Always),
            ("/v1/moderations", Dialect::OpenAi, "moderation", StreamUsage::Always),
            ("/v1/audio/transcriptions", Dialect::OpenAi, "transcription", StreamUsage::Always),
            ("/v1/audio/translations", Dialect::OpenAi, "translation", StreamUsage::Always),
            ("/v1/audio/speech", Dialect::OpenAi, "speech", StreamUsage::Always),
            ("/v1/images/generations", Dialect::OpenAi, "image_generation", StreamUsage::Always),
        ];
        for (path, dialect, operation, stream_usage) in rows {
            let api = &APIS[api_at(path).unwrap_or_else(|| panic!("{path} is not served"))];
            assert_eq!(
                (api.path, api.dialect, api.operation, api.stream_usage),
                (path, dialect, operation, stream_usage)
            );
            let body: serde_json::Value =
                serde_json::from_slice(&api.dialect.error_body(&GatewayError::MissingModel)).unwrap_or_default();
            let shaped = match dialect {
                Dialect::OpenAi => body["error"]["code"] == "missing_model",
                Dialect::Anthropic => body["type"] == "error" && body["error"]["type"] == "invalid_request_error",
            };
            assert!(shaped, "{path}: {body}");
        }
        assert_eq!(api_at("/v1/models"), None, "the gateway's own, not forwarded");
        assert_eq!(api_at("/v1/tokenize"), None, "vLLM's tokenizer is at the root");
        assert_eq!(api_at("/v1/messages/"), None);
    }

    /// Where each path is on a backend, and which are charged tokens.
    #[test]
    fn each_api_is_at_its_place_on_a_backend_and_only_tokenizers_are_free() {
        let at = |path: &str, base: &str| APIS[api_at(path).unwrap()].upstream_path(base);
        assert_eq!(at("/v1/chat/completions", "/v1"), "/v1/chat/completions");
        assert_eq!(at("/v1/rerank", "/openai/v1"), "/openai/v1/rerank");
        assert_eq!(at("/v1/messages/count_tokens", "/v1"), "/v1/messages/count_tokens");
        assert_eq!(at("/tokenize", "/v1"), "/tokenize");
        assert_eq!(at("/detokenize", "/serving/v1"), "/serving/detokenize");
        assert_eq!(at("/tokenize", ""), "/tokenize", "a base URL without /v1");
        let free: Vec<&str> = APIS.iter().filter(|api| api.tokens == TokenCharge::Never).map(|api| api.path).collect();
        assert_eq!(free, ["/v1/messages/count_tokens", "/tokenize", "/detokenize"]);
        let forms: Vec<&str> = APIS.iter().filter(|api| api.form).map(|api| api.path).collect();
        assert_eq!(forms, ["/v1/audio/transcriptions", "/v1/audio/translations"]);
    }

    /// The usage names of every dialect, each with one meaning.
    #[test]
    fn usage_counts_of_every_dialect_are_read() {
        let rows: [(&[u8], Option<UsageCount>); 10] = [
            (b"prompt_tokens", Some(UsageCount::Prompt)),
            (b"completion_tokens", Some(UsageCount::Completion)),
            (b"prompt_tokens_details", Some(UsageCount::CachedDetails)),
            (b"input_tokens_details", Some(UsageCount::CachedDetails)),
            (b"input_tokens", Some(UsageCount::Input)),
            (b"output_tokens", Some(UsageCount::Output)),
            (b"cache_read_input_tokens", Some(UsageCount::CacheRead)),
            (b"cache_creation_input_tokens", Some(UsageCount::CacheCreation)),
            (b"total_tokens", None),
            (b"cached_tokens", None),
        ];
        for (key, expected) in rows {
            assert_eq!(usage_count(key), expected, "{}", String::from_utf8_lossy(key));
        }
    }
}
