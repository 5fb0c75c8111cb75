//! A form (an audio upload) is read only as far as its `model` part: what
//! comes after — the file, mostly — goes to the backend as it arrives,
//! through the same [`FormScanner`], so the gateway holds a file's bytes
//! only on their way through, whatever its size.
//!
//! ```text
//! client ──▶ head: up to the model part's end ──▶ route, limits, admission
//!                                                        │
//!        ──▶ rest: scanned as it passes ──────────────▶ backend (Content-Length: head + rest)
//! ```
//!
//! The whole form is held to the same grammar as a form read whole: a
//! rest that turns out malformed (a second `model`, a part too many, a
//! bad ending) fails the upstream request before its last byte is
//! written, so the backend never reads a whole body the gateway would
//! have refused, and the client is answered the form's 400. A body whose
//! length is not declared (chunked) is read whole within the body limit,
//! as any other request's.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;

use super::body::RequestFields;
use super::form;
use super::form_scanner::FormScanner;
use super::request_body::{self, UnreadBody};
use crate::error::GatewayError;
use crate::upstream::BodyRest;
use crate::upstream::body_rest::SourceError;

/// The rest of a form, still arriving.
#[derive(Debug)]
pub struct Upload {
    /// Its bytes, for the upstream request.
    pub rest: BodyRest,
    /// What is left of the body timeout once the head was read: the rest
    /// must come within it, counted from when the gateway starts sending
    /// it (a wait in the fair queue is not the client's).
    pub allowance: Duration,
}

/// A form read as far as its model: the bytes read, what routing reads of
/// them, and the rest still to come (`None`: all of it came).
///
/// # Errors
/// A form malformed as far as it came, a body over `limit` (its declared
/// length), or one that broke off or was not read within `timeout`.
pub async fn read(
    body: &mut UnreadBody,
    headers: &HeaderMap,
    limit: u64,
    timeout: Duration,
) -> Result<(Bytes, RequestFields<'static>, Option<Upload>), GatewayError> {
    let boundary = form::boundary(headers)?;
    let Some(declared) = request_body::declared_length(headers) else {
        let whole = request_body::read(body, headers, limit, timeout).await?;
        let fields = form::scan(&whole, boundary)?;
        return Ok((whole, fields, None));
    };
    if declared > limit {
        return Err(GatewayError::BodyTooLarge(limit));
    }
    let read_by = Instant::now() + timeout;
    let mut scanner = FormScanner::new(boundary);
    // A form whose model comes after its file is held up to its whole
    // length: one allocation of it, not a doubling's worth more.
    let mut head = BytesMut::with_capacity(usize::try_from(declared.min(HEAD_CAPACITY)).unwrap_or_default());
    loop {
        let Some(incoming) = body.incoming() else { return Err(GatewayError::BodyRead) };
        let frame = match tokio::time::timeout_at(read_by.into(), incoming.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => {
                // All of it came before the model's part ended (or with it).
                body.read_to_end();
                return Ok((head.freeze(), form::request_fields(scanner.finish()?), None));
            }
            Ok(Some(Err(_))) => {
                body.read_to_end();
                return Err(GatewayError::BodyRead);
            }
            Err(_) => {
                body.read_to_end();
                return Err(GatewayError::BodyTimeout);
            }
        };
        let Ok(data) = frame.into_data() else { continue };
        scanner.feed(&data)?;
        if head.capacity() - head.len() < data.len() {
            let whole = usize::try_from(declared).unwrap_or(usize::MAX);
            head.reserve(whole.saturating_sub(head.len()).max(data.len()));
        }
        head.extend_from_slice(&data);
        let left = declared.saturating_sub(head.len() as u64);
        if left == 0 {
            // All of it came with (or before) the model's part.
            body.read_to_end();
            return Ok((head.freeze(), form::request_fields(scanner.finish()?), None));
        }
        let Some(fields) = scanner.fields_so_far() else { continue };
        let fields = form::request_fields(fields?);
        let allowance = read_by.saturating_duration_since(Instant::now());
        let source = FormRest { body: body.take(), scanner, left, allowance, deadline: None };
        let rest = BodyRest::new(left, Box::pin(source));
        return Ok((head.freeze(), fields, Some(Upload { rest, allowance })));
    }
}

/// What a form's head is allocated for at first: most forms are small.
const HEAD_CAPACITY: u64 = 64 * 1024;

/// The client's body after the model part, checked as it passes.
struct FormRest {
    body: UnreadBody,
    scanner: FormScanner,
    /// Bytes still to come.
    left: u64,
    allowance: Duration,
    /// Set at the first poll: when the rest must have come.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl FormRest {
    /// Feeds `data` to the scanner; with the body's last bytes, the form
    /// must be whole. The last frame is handed on only then: a backend
    /// with every byte of a form the gateway refuses could read it (a
    /// lenient parser takes an unended last part as ended).
    fn scanner_checked(&mut self, data: &[u8]) -> Result<(), GatewayError> {
        self.scanner.feed(data)?;
        self.left = self.left.saturating_sub(data.len() as u64);
        if self.left == 0 {
            self.scanner.finish()?;
        }
        Ok(())
    }
}

impl Body for FormRest {
    type Data = Bytes;
    type Error = SourceError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, SourceError>>> {
        let this = self.get_mut();
        let Some(incoming) = this.body.incoming() else { return Poll::Ready(None) };
        // Whatever is left of a refused or broken body is thrown away as
        // for any refused request (`UnreadBody`).
        let allowance = this.allowance;
        let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(allowance)));
        let error = match Pin::new(incoming).poll_frame(cx) {
            Poll::Pending => {
                ready!(deadline.as_mut().poll(cx));
                GatewayError::BodyTimeout
            }
            Poll::Ready(Some(Ok(frame))) => match frame.data_ref().map(|data| this.scanner_checked(data)) {
                Some(Err(refused)) => refused,
                _ => return Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(Some(Err(_))) => GatewayError::BodyRead,
            Poll::Ready(None) => match this.scanner.finish() {
                Ok(_) => {
                    this.body.read_to_end();
                    return Poll::Ready(None);
                }
                Err(refused) => refused,
            },
        };
        Poll::Ready(Some(Err(Box::new(error))))
    }
}
