//! What the gateway does with a request of one API on a backend of one
//! format ([`plan`]), and the request body it sends when it translates
//! ([`Translated`]).
//!
//! ```text
//! client API ╲ backend format   OpenAI   OpenAIChat          Anthropic
//! /v1/chat/completions          pass     pass                ChatOnMessages
//! /v1/messages                  pass     MessagesOnChat      pass
//! /v1/messages/count_tokens     pass     CountOnTokenizer    pass
//! /v1/responses                 pass     NotServed           NotServed
//! any other OpenAI path         pass     pass                NotServed
//! ```
//!
//! A route whose backends all speak `OpenAI` (the default) never asks:
//! `Route::translating` is false and the request path is what it was.

use bytes::Bytes;
use serde_json::Value;
use waycast_crds::backend::BackendFormat;

use super::translate::{TranslateError, chat_request_to_messages, messages_request_to_chat};

/// The index in [`super::APIS`] of OpenAI chat completions.
pub const CHAT: usize = 0;
/// The index of OpenAI's Responses API.
pub const RESPONSES: usize = 3;
/// The index of Anthropic Messages.
pub const MESSAGES: usize = 4;
/// The index of Anthropic's token count.
pub const COUNT_TOKENS: usize = 5;
/// The index of vLLM's and SGLang's tokenizer.
pub const TOKENIZE: usize = 8;

/// What the gateway does with one request on one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Sent as the client wrote it, answered as the backend wrote it.
    Pass,
    /// A Messages request sent as chat completions; the answer made Messages.
    MessagesOnChat,
    /// A chat completions request sent as Messages; the answer made chat.
    ChatOnMessages,
    /// A Messages token count asked of the backend's tokenizer (the
    /// messages as chat messages); its count answered as Anthropic's.
    CountOnTokenizer,
    /// The backend does not serve this API.
    NotServed,
}

/// What to do with a request for `APIS[endpoint]` on a backend of `format`.
pub fn plan(endpoint: usize, format: BackendFormat) -> Plan {
    match (format, endpoint) {
        (BackendFormat::OpenAI, _) => Plan::Pass,
        (BackendFormat::OpenAIChat, MESSAGES) => Plan::MessagesOnChat,
        (BackendFormat::OpenAIChat, COUNT_TOKENS) => Plan::CountOnTokenizer,
        (BackendFormat::OpenAIChat, RESPONSES) => Plan::NotServed,
        (BackendFormat::OpenAIChat, _) => Plan::Pass,
        (BackendFormat::Anthropic, CHAT) => Plan::ChatOnMessages,
        (BackendFormat::Anthropic, MESSAGES | COUNT_TOKENS) => Plan::Pass,
        (BackendFormat::Anthropic, _) => Plan::NotServed,
    }
}

impl Plan {
    /// Which of [`super::APIS`] the backend is asked for.
    pub fn upstream_endpoint(self, endpoint: usize) -> usize {
        match self {
            Self::Pass | Self::NotServed => endpoint,
            Self::MessagesOnChat => CHAT,
            Self::ChatOnMessages => MESSAGES,
            Self::CountOnTokenizer => TOKENIZE,
        }
    }
}

/// A request's body translated for each plan its route's backends need,
/// each at most once, before the first is tried.
#[derive(Debug, Default)]
pub struct Translated {
    messages_on_chat: Option<Value>,
    chat_on_messages: Option<Value>,
    count_on_tokenizer: Option<Value>,
}

impl Translated {
    /// `body` (a request for `APIS[endpoint]`) translated for every plan
    /// of `formats` that translates.
    ///
    /// # Errors
    /// The body cannot be translated faithfully: the field at fault, for a
    /// 400 (a refusal, never a silent drop).
    pub fn of(
        endpoint: usize,
        formats: impl Iterator<Item = BackendFormat>,
        body: &[u8],
    ) -> Result<Self, TranslateError> {
        let mut translated = Self::default();
        let mut parsed = None;
        for format in formats {
            let plan = plan(endpoint, format);
            let request = match plan {
                Plan::Pass | Plan::NotServed => continue,
                _ => match &parsed {
                    Some(request) => request,
                    None => parsed.insert(serde_json::from_slice::<Value>(body).map_err(|_| {
                        TranslateError::Malformed { field: String::new(), why: "the request is not JSON" }
                    })?),
                },
            };
            match plan {
                Plan::MessagesOnChat if translated.messages_on_chat.is_none() => {
                    translated.messages_on_chat = Some(messages_request_to_chat(request)?);
                }
                Plan::ChatOnMessages if translated.chat_on_messages.is_none() => {
                    translated.chat_on_messages = Some(chat_request_to_messages(request)?);
                }
                Plan::CountOnTokenizer if translated.count_on_tokenizer.is_none() => {
                    translated.count_on_tokenizer = Some(tokenize_request(request)?);
                }
                _ => {}
            }
        }
        Ok(translated)
    }

    /// The body to send for `plan`, naming the model `model_json` (a JSON
    /// string, the backend's rewrite) when given; `None` for a plan that
    /// sends the client's body.
    pub fn body_for(&self, plan: Plan, model_json: Option<&Bytes>) -> Option<Bytes> {
        let value = match plan {
            Plan::MessagesOnChat => self.messages_on_chat.as_ref(),
            Plan::ChatOnMessages => self.chat_on_messages.as_ref(),
            Plan::CountOnTokenizer => self.count_on_tokenizer.as_ref(),
            Plan::Pass | Plan::NotServed => None,
        }?;
        let rewritten = model_json.and_then(|model| serde_json::from_slice::<Value>(model).ok());
        let text = match rewritten {
            Some(model) => {
                let mut value = value.clone();
                value["model"] = model;
                serde_json::to_vec(&value)
            }
            None => serde_json::to_vec(value),
        };
        text.ok().map(Bytes::from)
    }
}

/// The tokenizer request (vLLM's and SGLang's `/tokenize` with chat
/// messages: the chat template applied, as the model would read them) for
/// a Messages `count_tokens` request.
fn tokenize_request(request: &Value) -> Result<Value, TranslateError> {
    // count_tokens has no max_tokens; the chat translation needs none.
    let chat = messages_request_to_chat(request)?;
    let mut tokenize = serde_json::Map::new();
    for field in ["model", "messages", "tools"] {
        if let Some(value) = chat.get(field) {
            tokenize.insert(field.into(), value.clone());
        }
    }
    Ok(Value::Object(tokenize))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;
    use crate::dialect::{APIS, api_at};

    #[test]
    fn the_named_indices_are_their_paths() {
        let named = [
            (CHAT, "/v1/chat/completions"),
            (RESPONSES, "/v1/responses"),
            (MESSAGES, "/v1/messages"),
            (COUNT_TOKENS, "/v1/messages/count_tokens"),
            (TOKENIZE, "/tokenize"),
        ];
        for (index, path) in named {
            assert_eq!(api_at(path), Some(index), "{path}");
        }
    }

    /// Every API on every format: the table in this file's docs.
    #[test]
    fn each_api_on_each_format_is_passed_translated_or_not_served() {
        for (endpoint, api) in APIS.iter().enumerate() {
            assert_eq!(plan(endpoint, BackendFormat::OpenAI), Plan::Pass, "{}", api.path);
            let on_chat = match api.path {
                "/v1/messages" => Plan::MessagesOnChat,
                "/v1/messages/count_tokens" => Plan::CountOnTokenizer,
                "/v1/responses" => Plan::NotServed,
                _ => Plan::Pass,
            };
            assert_eq!(plan(endpoint, BackendFormat::OpenAIChat), on_chat, "{}", api.path);
            let on_messages = match api.path {
                "/v1/chat/completions" => Plan::ChatOnMessages,
                "/v1/messages" | "/v1/messages/count_tokens" => Plan::Pass,
                _ => Plan::NotServed,
            };
            assert_eq!(plan(endpoint, BackendFormat::Anthropic), on_messages, "{}", api.path);
        }
        assert_eq!(Plan::MessagesOnChat.upstream_endpoint(MESSAGES), CHAT);
        assert_eq!(Plan::ChatOnMessages.upstream_endpoint(CHAT), MESSAGES);
        assert_eq!(Plan::CountOnTokenizer.upstream_endpoint(COUNT_TOKENS), TOKENIZE);
        assert_eq!(Plan::Pass.upstream_endpoint(7), 7);
    }

    /// Each needed translation is made once, with the backend's model
    /// written in; a body that cannot be translated names its field.
    #[test]
    fn bodies_are_translated_for_the_formats_that_need_them() {
        let messages =
            br#"{"model":"claude","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hi"}]}"#;
        let formats = [BackendFormat::OpenAI, BackendFormat::OpenAIChat, BackendFormat::OpenAIChat];
        let translated = Translated::of(MESSAGES, formats.into_iter(), messages).unwrap();
        let model = Bytes::from_static(br#""qwen-7b""#);
        let sent: Value =
            serde_json::from_slice(&translated.body_for(Plan::MessagesOnChat, Some(&model)).unwrap()).unwrap();
        assert_eq!(sent["model"], "qwen-7b");
        assert_eq!(sent["messages"][0], serde_json::json!({"role": "system", "content": "be brief"}));
        assert_eq!(translated.body_for(Plan::Pass, Some(&model)), None);
        assert_eq!(translated.body_for(Plan::ChatOnMessages, None), None, "no Anthropic backend: not made");

        let count = br#"{"model":"claude","messages":[{"role":"user","content":"hi"}],"tools":[{"name":"t","input_schema":{"type":"object"}}]}"#;
        let translated = Translated::of(COUNT_TOKENS, [BackendFormat::OpenAIChat].into_iter(), count).unwrap();
        let sent: Value = serde_json::from_slice(&translated.body_for(Plan::CountOnTokenizer, None).unwrap()).unwrap();
        assert_eq!(sent["messages"], serde_json::json!([{"role": "user", "content": "hi"}]));
        assert_eq!(sent["tools"][0]["function"]["name"], "t");
        assert_eq!(sent.as_object().unwrap().len(), 3, "{sent}");

        let server_tool =
            br#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"type":"web_search_20250305","name":"s"}]}"#;
        let refused = Translated::of(MESSAGES, [BackendFormat::OpenAIChat].into_iter(), server_tool).unwrap_err();
        assert!(refused.field().starts_with("tools[0]"), "{refused}");
        // Nothing to translate: nothing parsed, nothing refused.
        assert!(Translated::of(MESSAGES, [BackendFormat::OpenAI].into_iter(), b"not json").is_ok());
    }
}
