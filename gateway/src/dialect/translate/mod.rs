//! Translation between the two dialects, as pure functions and stream
//! state machines: an Anthropic Messages client on a backend that speaks
//! only OpenAI chat completions, and an OpenAI client on an
//! Anthropic-format backend. Nothing here does I/O or reads a clock; the
//! proxy decides when to translate and relays what comes out.
//!
//! ```text
//! Messages client ─► messages_request_to_chat ─► chat backend
//!                 ◄─ chat_response_to_message ◄─            (a whole answer)
//!                 ◄─ ChatStreamToMessages     ◄─            (one data: payload at a time)
//!
//! chat client     ─► chat_request_to_messages ─► Messages backend
//!                 ◄─ message_response_to_chat ◄─
//!                 ◄─ MessageStreamToChat      ◄─
//! ```
//!
//! A request field with no faithful counterpart that changes the answer
//! is refused with a [`TranslateError`] naming it (the caller answers
//! 400); fields dropped on purpose are listed in each file's docs and in
//! `docs/dialects.md`. Streams are translated event by event and never
//! held whole. Golden transcripts of whole exchanges are under
//! `gateway/tests/golden/dialect/`.

pub mod answer;
mod chat_request;
mod chat_response;
mod chat_stream;
mod error;
mod message_response;
mod message_stream;
mod messages_request;
mod wire;

// The machines and bounds are named here for the tests; the proxy reaches
// the streams through `answer`.
#[cfg_attr(not(test), allow(unused_imports, reason = "named for the tests"))]
pub use chat_request::{DEFAULT_MAX_TOKENS, chat_request_to_messages};
pub use chat_response::chat_response_to_message;
#[cfg_attr(not(test), allow(unused_imports, reason = "named for the tests"))]
pub use chat_stream::{ChatStreamToMessages, MAX_HELD_ARGUMENTS, MAX_TOOL_CALLS, MAX_TOOL_ID};
pub use error::TranslateError;
pub use message_response::message_response_to_chat;
#[cfg_attr(not(test), allow(unused_imports, reason = "named for the tests"))]
pub use message_stream::MessageStreamToChat;
pub use messages_request::messages_request_to_chat;

#[cfg(test)]
#[path = "golden_tests.rs"]
mod golden_tests;
#[cfg(test)]
#[path = "request_tests.rs"]
mod request_tests;
#[cfg(test)]
#[path = "response_tests.rs"]
mod response_tests;
#[cfg(test)]
#[path = "stream_tests.rs"]
mod stream_tests;
