//! The inference APIs a ModelEndpoint may say it offers
//! (`spec.apis`): each a name for one or two of the gateway's paths.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An inference API a model offers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ModelApi {
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/completions`.
    Completions,
    /// `/v1/embeddings`.
    Embeddings,
    /// `/v1/responses`.
    Responses,
    /// `/v1/messages` (Anthropic Messages).
    Messages,
    /// `/v1/messages/count_tokens`.
    CountTokens,
    /// `/v1/rerank`.
    Rerank,
    /// `/v1/score`.
    Score,
    /// `/tokenize` and `/detokenize`.
    Tokenize,
    /// `/v1/moderations`.
    Moderations,
    /// `/v1/audio/transcriptions` and `/v1/audio/translations`.
    AudioTranscriptions,
    /// `/v1/audio/speech`.
    AudioSpeech,
    /// `/v1/images/generations`.
    ImageGenerations,
}

impl ModelApi {
    /// The gateway's paths it names.
    pub const fn paths(self) -> &'static [&'static str] {
        match self {
            Self::ChatCompletions => &["/v1/chat/completions"],
            Self::Completions => &["/v1/completions"],
            Self::Embeddings => &["/v1/embeddings"],
            Self::Responses => &["/v1/responses"],
            Self::Messages => &["/v1/messages"],
            Self::CountTokens => &["/v1/messages/count_tokens"],
            Self::Rerank => &["/v1/rerank"],
            Self::Score => &["/v1/score"],
            Self::Tokenize => &["/tokenize", "/detokenize"],
            Self::Moderations => &["/v1/moderations"],
            Self::AudioTranscriptions => &["/v1/audio/transcriptions", "/v1/audio/translations"],
            Self::AudioSpeech => &["/v1/audio/speech"],
            Self::ImageGenerations => &["/v1/images/generations"],
        }
    }
}
