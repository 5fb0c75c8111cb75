//! Why a body could not be translated: the field, by its path in the body
//! it was read from (`messages[2].content[0].source.type`), so that the
//! caller can answer a 400 (request) or a 502 (response) naming it.

/// A body that cannot be translated faithfully.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// A field with no counterpart in the other dialect that changes what
    /// the request means: refused rather than silently dropped.
    #[error("`{field}` cannot be translated to {target}: {why}")]
    Untranslatable {
        /// Its path in the body.
        field: String,
        /// The dialect it has no counterpart in.
        target: &'static str,
        /// Why, in a few words.
        why: &'static str,
    },
    /// A field that is not what its own dialect says it is (a wrong type,
    /// a missing member): the body is refused as its own server would.
    #[error("`{field}` is not valid: {why}")]
    Malformed {
        /// Its path in the body.
        field: String,
        /// What was expected.
        why: &'static str,
    },
}

impl TranslateError {
    /// The path of the field at fault, as the client wrote it.
    #[cfg_attr(not(test), allow(dead_code, reason = "the proxy answers with the whole message"))]
    pub fn field(&self) -> &str {
        match self {
            Self::Untranslatable { field, .. } | Self::Malformed { field, .. } => field,
        }
    }
}

/// The name of OpenAI chat completions in messages.
pub(super) const TO_CHAT: &str = "OpenAI chat completions";
/// The name of Anthropic Messages in messages.
pub(super) const TO_MESSAGES: &str = "Anthropic Messages";

/// `field` has no counterpart in `target`.
pub(super) fn untranslatable(field: impl Into<String>, target: &'static str, why: &'static str) -> TranslateError {
    TranslateError::Untranslatable { field: field.into(), target, why }
}

/// `field` is not what its dialect says.
pub(super) fn malformed(field: impl Into<String>, why: &'static str) -> TranslateError {
    TranslateError::Malformed { field: field.into(), why }
}
