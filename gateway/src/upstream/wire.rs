//! HTTP/1.1 on the wire, both ways: a request's head written as it is
//! built, and a response's head read off a connection within bounds.
//!
//! ```text
//! UpstreamRequest::build ─► RequestHead::header … ─► finish (Content-Length, small body inline)
//! read_head: read ─► parse (httparse) ─► 1xx? skip, counted ─► final head ─► Head + the body's first bytes
//!            bounds: 64 KiB across every head, 8 informational heads, 100 fields per head
//! ```

use std::mem::MaybeUninit;

use bytes::{Buf as _, Bytes, BytesMut};

use super::body_rest::BodyRest;
use http::header::{HeaderName, HeaderValue};
use http::uri::Authority;
use http::{HeaderMap, Method, Response, StatusCode, Version};
use tokio::io::AsyncReadExt as _;

use super::io::Io;

/// The most bytes read before a final response head, every informational
/// head (100 Continue, 103 Early Hints) included: an upstream that sends
/// more is broken or hostile.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The most informational heads skipped before a final one: an upstream
/// answering `100 Continue` forever would otherwise keep a core busy for
/// as long as the first-byte timeout allows.
pub const MAX_INFORMATIONAL_HEADS: usize = 8;

/// The most response header fields read (hyper's default too).
const MAX_HEADERS: usize = 100;

/// Room left in a response's header map for the headers the gateway adds
/// before it goes out (its request id, up to six rate-limit headers): a
/// map sized to the upstream's fields alone grew, moving every entry, on
/// the gateway's first insert.
pub(super) const ADDED_HEADERS: usize = 7;

/// Bodies up to this size are written with the head, in one write.
pub(super) const BODY_WITH_HEAD: usize = 64 * 1024;

/// A request for [`super::UpstreamClient::request`]: its head already in
/// wire form, with the body too when that is small (one write).
pub struct UpstreamRequest {
    pub(super) tls: bool,
    /// Held to the egress policy (a `url` backend); `false` for a
    /// model's own Service and its endpoints, held to the fixed guard only.
    pub(super) guarded: bool,
    pub(super) authority: Authority,
    pub(super) head_only: bool,
    pub(super) wire: Vec<u8>,
    pub(super) body: Bytes,
    /// What follows `body`, streamed as it comes.
    pub(super) rest: Option<BodyRest>,
}

impl UpstreamRequest {
    /// Starts `method target HTTP/1.1` to `authority` (over TLS when
    /// `tls`), carrying `body`. The head is written as it is built: no
    /// header map stands between the client's request and the bytes sent.
    pub fn build(method: &Method, tls: bool, authority: Authority, target: &str, body: Bytes) -> RequestHead {
        const HEAD_ROOM: usize = 512;
        let inline_body = if body.len() <= BODY_WITH_HEAD { body.len() } else { 0 };
        let mut wire = Vec::with_capacity(HEAD_ROOM + target.len() + inline_body);
        wire.extend_from_slice(method.as_str().as_bytes());
        wire.push(b' ');
        wire.extend_from_slice(target.as_bytes());
        wire.extend_from_slice(b" HTTP/1.1\r\n");
        let head_only = method == Method::HEAD;
        RequestHead { request: Self { tls, guarded: true, authority, head_only, wire, body, rest: None } }
    }

    /// What is written first: the head, with the body when it is small.
    pub fn wire(&self) -> &[u8] {
        &self.wire
    }

    /// The body that follows the head when it was too large to go with it.
    pub(super) fn body_after_head(&self) -> Option<&Bytes> {
        (self.body.len() > BODY_WITH_HEAD).then_some(&self.body)
    }
}

/// An [`UpstreamRequest`] whose header fields are being written.
pub struct RequestHead {
    request: UpstreamRequest,
}

impl RequestHead {
    /// The request goes to the model's own Service (its address or its
    /// endpoints): the egress policy for `url` backends does not apply, the
    /// fixed link-local/metadata guard does.
    pub fn for_own_service(&mut self) {
        self.request.guarded = false;
    }

    /// Adds a header field. `Content-Length` is [`RequestHead::finish`]'s
    /// to write; `Host` is the caller's.
    pub fn header(&mut self, name: &HeaderName, value: &HeaderValue) {
        let wire = &mut self.request.wire;
        wire.extend_from_slice(name.as_str().as_bytes());
        wire.extend_from_slice(b": ");
        wire.extend_from_slice(value.as_bytes());
        wire.extend_from_slice(b"\r\n");
    }

    /// Adds a header line the gateway composed itself (`name: value`
    /// and CRLF, visible ASCII: a `traceparent`), as it is, in one copy:
    /// no `HeaderValue` is built (checked and allocated) for it.
    pub fn line(&mut self, line: &[u8]) {
        debug_assert!(line.ends_with(b"\r\n"), "a whole header line");
        self.request.wire.extend_from_slice(line);
    }

    /// The body goes on with `rest`, written as its source gives it.
    pub fn with_rest(&mut self, rest: BodyRest) {
        self.request.rest = Some(rest);
    }

    /// Ends the head with the body's `Content-Length` (its rest's included).
    pub fn finish(self) -> UpstreamRequest {
        let mut request = self.request;
        let wire = &mut request.wire;
        wire.extend_from_slice(b"content-length: ");
        let rest = request.rest.as_ref().map_or(0, BodyRest::len);
        crate::json_text::decimal(request.body.len() as u64 + rest, wire);
        wire.extend_from_slice(b"\r\n\r\n");
        if request.body.len() <= BODY_WITH_HEAD {
            wire.extend_from_slice(&request.body);
        }
        request
    }
}

/// Why a response head could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// The upstream closed the connection before a byte of an answer.
    #[error("upstream closed the connection before answering")]
    Closed,
    /// The head broke HTTP/1.1 or its bounds.
    #[error("upstream response: {0}")]
    Invalid(&'static str),
}

/// A final response head and the bytes read after it (the body's first).
pub(super) struct Head {
    pub(super) parts: http::response::Parts,
    pub(super) rest: Bytes,
}

/// Reads the final response head off `io`, skipping informational ones,
/// within [`MAX_HEAD_BYTES`] and [`MAX_INFORMATIONAL_HEADS`].
///
/// # Errors
/// [`HeadError`]; a read error as it came.
pub(super) async fn read_head(io: &mut Io) -> Result<Result<Head, HeadError>, std::io::Error> {
    let mut buf = BytesMut::with_capacity(2048);
    // Bytes of the heads skipped so far.
    let mut skipped = 0;
    let mut informational = 0;
    // Bytes at the start of the buffer known to hold no head's end: a head
    // read in pieces is parsed again only once a piece could end it, so an
    // upstream dribbling a 64 KiB head costs a linear scan, not a parse
    // per byte.
    let mut searched: usize = 0;
    loop {
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        if io.read_buf(&mut buf).await? == 0 {
            return Ok(Err(if buf.is_empty() && skipped == 0 {
                HeadError::Closed
            } else {
                HeadError::Invalid("closed inside the response head")
            }));
        }
        // Shared while it is parsed: the header values and the body's first
        // bytes are slices of it, not copies.
        let mut read_so_far = std::mem::take(&mut buf).freeze();
        loop {
            if searched > 0 && !may_end_a_head(&read_so_far[searched.saturating_sub(3)..]) {
                searched = read_so_far.len();
                break;
            }
            let (parts, length) = match parse_head(&read_so_far) {
                Err(error) => return Ok(Err(error)),
                Ok(None) => {
                    searched = read_so_far.len();
                    break;
                }
                Ok(Some(parsed)) => parsed,
            };
            searched = 0;
            skipped += length;
            if skipped > MAX_HEAD_BYTES {
                return Ok(Err(HeadError::Invalid("response heads longer than 64 KiB")));
            }
            read_so_far.advance(length);
            if !parts.status.is_informational() {
                return Ok(Ok(Head { parts, rest: read_so_far }));
            }
            informational += 1;
            if informational > MAX_INFORMATIONAL_HEADS {
                return Ok(Err(HeadError::Invalid("more than 8 informational responses")));
            }
        }
        if skipped + read_so_far.len() >= MAX_HEAD_BYTES {
            return Ok(Err(HeadError::Invalid("response heads longer than 64 KiB")));
        }
        // Not all of the head yet: read on into the same buffer, which
        // nothing else holds now.
        buf = read_so_far.try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    }
}

/// Whether `bytes` hold a blank line's end (`\n\n` or `\n\r\n`): where a
/// head can end.
fn may_end_a_head(bytes: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', bytes).any(|at| match bytes.get(at + 1) {
        Some(b'\n') => true,
        Some(b'\r') => bytes.get(at + 2) == Some(&b'\n'),
        _ => false,
    })
}

/// The response head at the start of `buf` and its length; `None` while
/// it is incomplete.
pub(super) fn parse_head(buf: &Bytes) -> Result<Option<(http::response::Parts, usize)>, HeadError> {
    // Uninitialised: httparse writes the fields it finds, and filling 100
    // empty ones first cost more than parsing a short head.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let head_len =
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut parsed, buf, &mut fields) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::Invalid("more than 100 header fields")),
            Err(_) => return Err(HeadError::Invalid("malformed response head")),
        };
    let code = parsed.code.ok_or(HeadError::Invalid("malformed status line"))?;
    let status = StatusCode::from_u16(code).map_err(|_| HeadError::Invalid("invalid status code"))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(HeadError::Invalid("unasked protocol switch"));
    }
    let mut headers = HeaderMap::with_capacity(parsed.headers.len() + ADDED_HEADERS);
    for field in parsed.headers.iter() {
        let name =
            HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| HeadError::Invalid("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(buf.slice_ref(field.value))
            .map_err(|_| HeadError::Invalid("invalid header value"))?;
        headers.append(name, value);
    }
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = if parsed.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
    *response.headers_mut() = headers;
    Ok(Some((response.into_parts().0, head_len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_written_as_one_head_and_body() {
        let body = Bytes::from_static(br#"{"model":"m"}"#);
        let authority: Authority = "10.0.0.1:8000".parse().unwrap();
        let mut head = UpstreamRequest::build(&Method::POST, false, authority.clone(), "/v1/c?api-version=1", body);
        head.header(&http::header::HOST, &HeaderValue::from_static("upstream"));
        assert_eq!(
            String::from_utf8(head.finish().wire().to_vec()).unwrap(),
            "POST /v1/c?api-version=1 HTTP/1.1\r\nhost: upstream\r\ncontent-length: 13\r\n\r\n{\"model\":\"m\"}"
        );
        let large = Bytes::from(vec![b' '; BODY_WITH_HEAD + 1]);
        let request = UpstreamRequest::build(&Method::POST, false, authority, "/", large).finish();
        assert_eq!(
            request.wire(),
            format!("POST / HTTP/1.1\r\ncontent-length: {}\r\n\r\n", BODY_WITH_HEAD + 1).as_bytes()
        );
        assert_eq!(request.body_after_head().map(Bytes::len), Some(BODY_WITH_HEAD + 1));
    }

    #[test]
    fn a_heads_end_is_found_where_it_may_be() {
        assert!(may_end_a_head(b"HTTP/1.1 200 OK\r\nx: y\r\n\r\n"));
        assert!(may_end_a_head(b"\n\n"));
        assert!(may_end_a_head(b"a\n\r\nb"));
        assert!(!may_end_a_head(b"HTTP/1.1 200 OK\r\nx: y\r\n"));
        assert!(!may_end_a_head(b"\r\n\r"));
        assert!(!may_end_a_head(b""));
    }

    /// The gateway adds its own headers to every response: the parsed map has
    /// room for them without growing.
    #[test]
    fn a_parsed_head_leaves_room_for_the_gateways_headers() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nx-upstream: 1\r\n\r\n{}";
        let (parts, length) = parse_head(&Bytes::from_static(head)).unwrap().unwrap();
        assert_eq!(length, head.len() - 2);
        assert_eq!(parts.headers.len(), 3);
        assert!(parts.headers.capacity() >= 3 + ADDED_HEADERS, "capacity {}", parts.headers.capacity());
    }
}
