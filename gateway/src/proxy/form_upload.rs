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
    /// When the client must have sent all of it (the body timeout).
    pub read_by: Instant,
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
    let mut head = BytesMut::new();
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
        head.extend_from_slice(&data);
        let Some(fields) = scanner.fields_so_far() else { continue };
        let fields = form::request_fields(fields?);
        let left = declared.saturating_sub(head.len() as u64);
        if left == 0 {
            body.read_to_end();
            return Ok((head.freeze(), form::request_fields(scanner.finish()?), None));
        }
        let source =
            FormRest { body: body.take(), scanner, deadline: Box::pin(tokio::time::sleep_until(read_by.into())) };
        let rest = BodyRest::new(left, Box::pin(source));
        return Ok((head.freeze(), fields, Some(Upload { rest, read_by })));
    }
}

/// The client's body after the model part, checked as it passes.
struct FormRest {
    body: UnreadBody,
    scanner: FormScanner,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Body for FormRest {
    type Data = Bytes;
    type Error = SourceError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, SourceError>>> {
        let this = self.get_mut();
        let Some(incoming) = this.body.incoming() else { return Poll::Ready(None) };
        // Whatever is left of a refused or broken body is thrown away as
        // for any refused request (`UnreadBody`).
        let error = match Pin::new(incoming).poll_frame(cx) {
            Poll::Pending => {
                ready!(this.deadline.as_mut().poll(cx));
                GatewayError::BodyTimeout
            }
            Poll::Ready(Some(Ok(frame))) => match frame.data_ref().map(|data| this.scanner.feed(data)) {
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
