//! The answer of a backend that speaks another API than the client
//! (`crate::dialect::plan`): a stream is relayed through a translator,
//! event by event (`super::stream`); anything else — a non-streamed
//! answer, an error — is read whole within a bound and translated, so its
//! status can say what became of it (a 502 when the backend's answer
//! cannot be translated). Its usage is read from the backend's own bytes,
//! as for a relayed answer: budgets settle the same either way.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http::header::{self, HeaderValue};
use http_body_util::BodyExt as _;

use super::forward::Forwarded;
use super::respond::{Answer, Relayed, Whole, prepare_head};
use super::stream::{UsageWatch, is_event_stream};
use super::usage::UsageTap;
use crate::dialect::plan::Plan;
use crate::dialect::translate::answer::{
    MAX_ERROR_ANSWER, MAX_WHOLE_ANSWER, StreamTranslator, WholeAnswer, broken_answer, estimated_count,
    has_no_tokenizer, whole_answer,
};
use crate::error::GatewayError;
use crate::limit::{Ending, RateHeaders};
use crate::snapshot::Route;

/// What the client asked, as the translation of its answer needs it.
#[derive(Debug, Clone, Copy)]
pub struct ClientAsked<'a> {
    /// The model it named (a Messages answer names it back).
    pub model: &'a str,
    /// A chat client's `stream_options.include_usage`.
    pub include_usage: bool,
    /// Its body's length: a token count's estimate when the backend has
    /// no tokenizer.
    pub request_bytes: usize,
}

/// The backend's answer under `forwarded.plan` (not `Pass`), made ready
/// for the client.
///
/// # Errors
/// None yet: a broken answer is the client's 502 in its shape (the
/// `Result` is the relay's, for the pipeline's one shape).
pub async fn answer(
    forwarded: Forwarded,
    route: &Route,
    rate_headers: Option<&RateHeaders>,
    asked: ClientAsked<'_>,
) -> Result<Answer, GatewayError> {
    let status = forwarded.response.status();
    let created = jiff::Timestamp::now().as_second().max(0).unsigned_abs();
    let upstream_took = forwarded.headers_at - forwarded.sent_at;
    let (mut head, body) = forwarded.response.into_parts();
    prepare_head(&mut head.headers, rate_headers);
    // What described the backend's body does not describe the one made of it.
    for name in [header::CONTENT_LENGTH, header::CONTENT_ENCODING, header::ETAG, header::CONTENT_LOCATION] {
        head.headers.remove(name);
    }
    if status.is_success() && is_event_stream(&head.headers) {
        let translator = StreamTranslator::for_plan(forwarded.plan, asked.model, asked.include_usage, created);
        if let Some(translator) = translator {
            return Ok(Answer::Relay(Relayed {
                head,
                body,
                idle_timeout: route.timeouts.idle,
                usage_watch: UsageWatch::Tap,
                upstream_took,
                headers_at: forwarded.headers_at,
                translator: Some(Box::new(translator)),
            }));
        }
    }
    let limit = if status.is_success() { MAX_WHOLE_ANSWER } else { MAX_ERROR_ANSWER };
    // What the backend did is what is charged, whatever the client is
    // answered: a whole answer that cannot be translated was still
    // generated (and is charged its usage); one that broke off may still
    // be generating (charged as a request cut short).
    let (translated, usage, ending) = match read_whole(body, route.timeouts.idle, limit).await {
        None => (broken_answer(forwarded.plan), None, Ending::Unfinished),
        Some(bytes) if !status.is_success() => {
            let answer = if forwarded.plan == Plan::CountOnTokenizer && has_no_tokenizer(status) {
                // No tokenizer there (SGLang's and Ollama's builds without
                // one): the count is estimated, and says so.
                WholeAnswer { status: StatusCode::OK, body: estimated_count(asked.request_bytes) }
            } else {
                whole_answer(forwarded.plan, status, &bytes, asked.model, created)
            };
            (answer, None, Ending::Unserved)
        }
        Some(bytes) => {
            let usage = UsageTap::default().usage_ending_with(&bytes);
            (whole_answer(forwarded.plan, status, &bytes, asked.model, created), usage, Ending::Whole)
        }
    };
    head.status = translated.status;
    head.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(Answer::Whole(Whole { head, body: Bytes::from(translated.body), usage, upstream_took, ending }))
}

/// The body of an answer, whole, within `limit` bytes and with no gap
/// longer than `idle`; `None` when it broke off, idled out or outgrew the
/// bound.
async fn read_whole(mut body: crate::upstream::UpstreamBody, idle: Duration, limit: usize) -> Option<Bytes> {
    let mut whole = BytesMut::new();
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if whole.len() + data.len() > limit {
                        return None;
                    }
                    whole.extend_from_slice(data);
                }
            }
            Ok(None) => return Some(whole.freeze()),
            Ok(Some(Err(_))) | Err(_) => return None,
        }
    }
}
