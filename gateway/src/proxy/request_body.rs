//! The client's request body: read whole within the config's size limit
//! and the body timeout, or, when the request is answered without it (a
//! refusal), read and thrown away in the background within bounds, so the
//! client can still read the answer.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use crate::error::GatewayError;

/// Reads the whole body, refusing it early when Content-Length already says
/// it is too large, and giving up when the client is too slow. A body
/// refused for its size stays in `body` (to be discarded); one read, or cut
/// off by the timeout or a read error, is taken.
pub async fn read(
    body: &mut UnreadBody,
    headers: &HeaderMap,
    limit: u64,
    timeout: Duration,
) -> Result<Bytes, GatewayError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|length| length > limit) {
        return Err(GatewayError::BodyTooLarge(limit));
    }
    let Some(incoming) = body.0.as_mut() else { return Err(GatewayError::BodyRead) };
    let read = match tokio::time::timeout(timeout, collect_at_most(incoming, limit)).await {
        Err(_) => Err(GatewayError::BodyTimeout),
        // Left in `body`: the rest is discarded when it drops.
        Ok(Err(BodyError::TooLarge)) => return Err(GatewayError::BodyTooLarge(limit)),
        Ok(Err(BodyError::Read)) => Err(GatewayError::BodyRead),
        Ok(Ok(bytes)) => Ok(bytes),
    };
    // Read whole, or cut off: a slow or broken client's connection is not
    // kept for it.
    body.0 = None;
    read
}

/// The body's length as its `Content-Length` declares it (hyper has
/// refused a request whose lengths disagree).
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
}

enum BodyError {
    TooLarge,
    Read,
}

/// The body's data frames, joined with one copy at the end (none for a
/// one-frame body), or `TooLarge` as soon as they pass `limit` bytes.
async fn collect_at_most(body: &mut Incoming, limit: u64) -> Result<Bytes, BodyError> {
    // The first frame apart: most bodies come in one, and then no list is
    // allocated.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<Bytes> = Vec::new();
    let mut total = 0_usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyError::Read)?.into_data() else { continue };
        total += data.len();
        if total as u64 > limit {
            return Err(BodyError::TooLarge);
        }
        if first.is_none() { first = Some(data) } else { more.push(data) }
    }
    let first = first.unwrap_or_default();
    if more.is_empty() {
        return Ok(first);
    }
    let mut joined = bytes::BytesMut::with_capacity(total);
    for frame in std::iter::once(&first).chain(&more) {
        joined.extend_from_slice(frame);
    }
    Ok(joined.freeze())
}

/// How much of a refused request's body is still read and thrown away, and
/// for how long: enough that a client still sending it can finish and read
/// the answer (a connection closed with unread data is reset, and the
/// client loses the answer with it), bounded so a client cannot make the
/// gateway read forever.
const DISCARD_AFTER_REFUSAL_BYTES: u64 = 16 * 1024 * 1024;
/// See [`DISCARD_AFTER_REFUSAL_BYTES`].
const DISCARD_AFTER_REFUSAL_TIME: Duration = Duration::from_secs(2);

/// A request body not read (yet). Dropped while still held — the request
/// was answered without it — the rest is discarded in the background within
/// the bounds above; HTTP/1.1 keep-alive then goes on if it all came.
pub struct UnreadBody(Option<Incoming>);

impl UnreadBody {
    /// The body of a request not read yet.
    pub fn new(body: Incoming) -> Self {
        Self(Some(body))
    }

    /// The body, while it is held.
    pub(super) fn incoming(&mut self) -> Option<&mut Incoming> {
        self.0.as_mut()
    }

    /// The body, held from now on by the one returned.
    pub(super) fn take(&mut self) -> Self {
        Self(self.0.take())
    }

    /// The body was read whole, or given up on: nothing is left to discard.
    pub(super) fn read_to_end(&mut self) {
        self.0 = None;
    }
}

impl Drop for UnreadBody {
    fn drop(&mut self) {
        let Some(mut body) = self.0.take() else { return };
        // Nothing left, or more declared than would be read: close now.
        if http_body::Body::is_end_stream(&body)
            || http_body::Body::size_hint(&body).lower() > DISCARD_AFTER_REFUSAL_BYTES
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let discard = async {
                let mut left = DISCARD_AFTER_REFUSAL_BYTES;
                while let Some(Ok(frame)) = body.frame().await {
                    let length = frame.data_ref().map_or(0, |data| data.len() as u64);
                    if length >= left {
                        return;
                    }
                    left -= length;
                }
            };
            let _ = tokio::time::timeout(DISCARD_AFTER_REFUSAL_TIME, discard).await;
        });
    }
}
