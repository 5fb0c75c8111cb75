//! How an upstream HTTP/1.1 response body is delimited (RFC 9112 §6.3) and
//! the decoder that takes its framing off: pure functions over bytes, so
//! every hostile shape is unit-tested without a socket.
//!
//! The decoder copies the data bytes of each read into one buffer of their
//! own size and keeps nothing between reads but a few integers: an idle
//! stream holds no read buffer (`docs/performance.md`, memory per stream).

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http::header::{CONTENT_LENGTH, HeaderName, TRANSFER_ENCODING};

/// The longest chunk extension or trailer section accepted: an upstream
/// that sends more is broken or hostile.
const MAX_FRAMING_BYTES: u32 = 16 * 1024;

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// It has none (HEAD, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the upstream closes the connection.
    UntilClose,
}

/// A response that breaks HTTP/1.1's framing rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// `Content-Length` is not one non-negative integer.
    #[error("invalid Content-Length")]
    BadLength,
    /// Both `Transfer-Encoding` and `Content-Length`: the response could
    /// be read two ways (RFC 9112 §6.3 calls it a sign of smuggling).
    #[error("both Transfer-Encoding and Content-Length")]
    FramedTwice,
    /// A chunk-size line is malformed or overflows.
    #[error("malformed chunk size")]
    BadChunkSize,
    /// A chunk's data is not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    BadChunkEnd,
    /// A chunk extension or the trailers are longer than allowed.
    #[error("chunk extension or trailers longer than {MAX_FRAMING_BYTES} bytes")]
    FramingTooLong,
    /// The connection closed before the body's end.
    #[error("connection closed before the end of the body")]
    Truncated,
    /// `Transfer-Encoding` in an HTTP/1.0 response: RFC 9112 §6.1 has a
    /// client treat its framing as faulty (HTTP/1.0 has no chunked coding,
    /// so an intermediary may have read it as a body ending at the close).
    #[error("Transfer-Encoding in an HTTP/1.0 response")]
    EncodedHttp10,
}

/// Refuses a response whose version cannot carry its framing headers.
///
/// # Errors
/// [`FramingError::EncodedHttp10`] for `Transfer-Encoding` in an HTTP/1.0
/// response, whatever else it says.
pub fn check_version(version: http::Version, headers: &HeaderMap) -> Result<(), FramingError> {
    if version == http::Version::HTTP_10 && headers.contains_key(TRANSFER_ENCODING) {
        return Err(FramingError::EncodedHttp10);
    }
    Ok(())
}

/// The framing of a response to a request (`head`: it was a HEAD request)
/// with `status` and `headers`.
///
/// # Errors
/// [`FramingError::BadLength`] for a `Content-Length` that is not one
/// number (several differing values included), and
/// [`FramingError::FramedTwice`] for one beside `Transfer-Encoding`: such
/// a response could be read two ways, so it is read none.
pub fn framing(head: bool, status: u16, headers: &HeaderMap) -> Result<Framing, FramingError> {
    if head || status == 204 || status == 304 || (100..200).contains(&status) {
        return Ok(Framing::Empty);
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        if headers.contains_key(CONTENT_LENGTH) {
            return Err(FramingError::FramedTwice);
        }
        // The last coding decides; a body whose last coding is not chunked
        // can only end with the connection.
        return Ok(match header_tokens(headers, &TRANSFER_ENCODING).next_back() {
            Some(coding) if coding.eq_ignore_ascii_case("chunked") => Framing::Chunked,
            _ => Framing::UntilClose,
        });
    }
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for part in value.to_str().map_err(|_| FramingError::BadLength)?.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(FramingError::BadLength);
            }
            let parsed: u64 = part.parse().map_err(|_| FramingError::BadLength)?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(FramingError::BadLength);
            }
            length = Some(parsed);
        }
    }
    Ok(length.map_or(Framing::UntilClose, Framing::Length))
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// `left` data bytes of the chunk to come.
    Data { left: u64 },
    /// In the framing around the data, read byte by byte.
    Framing(Line),
}

/// A place in a chunked body's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// In the hex digits of a chunk size (`digits` read so far).
    Size { size: u64, digits: u8 },
    /// In a chunk extension (skipped), `seen` bytes so far.
    Extension { size: u64, seen: u32 },
    /// After the size line's CR.
    SizeLf { size: u64 },
    /// After the data, expecting CR.
    DataCr,
    /// After the data's CR.
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    TrailerStart { seen: u32 },
    /// Inside a trailer line (skipped).
    Trailer { seen: u32 },
    /// After the final CR.
    EndLf,
}

/// Where one framing byte leads.
enum Step {
    Chunk(Chunk),
    /// The body's last byte.
    End,
}

const SIZE_START: Chunk = Chunk::Framing(Line::Size { size: 0, digits: 0 });

/// Takes the framing off a response body, read by read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoder(Body);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// `left` bytes to come.
    Length {
        left: u64,
    },
    Chunked(Chunk),
    /// Until the connection closes.
    UntilClose,
    Done,
}

impl Decoder {
    /// The decoder for a body framed as `framing`.
    pub fn new(framing: Framing) -> Self {
        Self(match framing {
            Framing::Empty | Framing::Length(0) => Body::Done,
            Framing::Length(left) => Body::Length { left },
            Framing::Chunked => Body::Chunked(SIZE_START),
            Framing::UntilClose => Body::UntilClose,
        })
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        self.0 == Body::Done
    }

    /// Ends the body here: nothing more is read into it.
    pub fn end(&mut self) {
        self.0 = Body::Done;
    }

    /// The data bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self.0 {
            Body::Length { left } => Some(left),
            Body::Done => Some(0),
            Body::Chunked(_) | Body::UntilClose => None,
        }
    }

    /// Decodes `input`, appending its data bytes to `out`. Returns how many
    /// bytes of `input` belonged to the body: fewer than `input.len()` only
    /// when the body ended inside it (the rest is not this response's).
    ///
    /// # Errors
    /// A chunked body that breaks its framing.
    pub fn decode(&mut self, input: &[u8], out: &mut BytesMut) -> Result<usize, FramingError> {
        match self.take_plain(input.len()) {
            Some(take) => {
                out.extend_from_slice(&input[..take]);
                Ok(take)
            }
            None => self.decode_chunks(input, out),
        }
    }

    /// As [`Decoder::decode`], for input in a buffer of its own: a body
    /// without chunk framing is handed out as a slice of it, not copied.
    ///
    /// # Errors
    /// A chunked body that breaks its framing.
    pub fn decode_shared(&mut self, input: &Bytes) -> Result<(Bytes, usize), FramingError> {
        if let Some(take) = self.take_plain(input.len()) {
            return Ok((input.slice(..take), take));
        }
        let mut out = BytesMut::with_capacity(input.len());
        let used = self.decode_chunks(input, &mut out)?;
        Ok((out.freeze(), used))
    }

    /// For a body without chunk framing: how many of the `available` bytes
    /// are its data, taken off what is still to come. `None` for a chunked
    /// body.
    fn take_plain(&mut self, available: usize) -> Option<usize> {
        match &mut self.0 {
            Body::Done => Some(0),
            Body::UntilClose => Some(available),
            Body::Length { left } => {
                let take = usize::try_from(*left).map_or(available, |left| left.min(available));
                *left -= take as u64;
                if *left == 0 {
                    self.0 = Body::Done;
                }
                Some(take)
            }
            Body::Chunked(_) => None,
        }
    }

    fn decode_chunks(&mut self, input: &[u8], out: &mut BytesMut) -> Result<usize, FramingError> {
        let Body::Chunked(state) = &mut self.0 else { return Ok(0) };
        let (used, ended) = decode_chunked(state, input, out)?;
        if ended {
            self.0 = Body::Done;
        }
        Ok(used)
    }

    /// The connection closed: fine only for a body that ends that way.
    ///
    /// # Errors
    /// [`FramingError::Truncated`] for a body that had more to come.
    pub fn at_eof(&mut self) -> Result<(), FramingError> {
        match self.0 {
            Body::Done | Body::UntilClose => {
                self.0 = Body::Done;
                Ok(())
            }
            Body::Length { .. } | Body::Chunked(_) => Err(FramingError::Truncated),
        }
    }
}

/// Runs the chunked state machine over `input`: (bytes used, body ended).
fn decode_chunked(state: &mut Chunk, input: &[u8], out: &mut BytesMut) -> Result<(usize, bool), FramingError> {
    let mut at = 0;
    while at < input.len() {
        match state {
            Chunk::Data { left } => {
                let take = usize::try_from(*left).map_or(input.len() - at, |left| left.min(input.len() - at));
                out.extend_from_slice(&input[at..at + take]);
                at += take;
                *left -= take as u64;
                if *left == 0 {
                    *state = Chunk::Framing(Line::DataCr);
                }
            }
            Chunk::Framing(line) => {
                let byte = input[at];
                at += 1;
                match step(*line, byte)? {
                    Step::Chunk(next) => *state = next,
                    Step::End => return Ok((at, true)),
                }
            }
        }
    }
    Ok((at, false))
}

/// One byte of a chunked body's framing, read at `line`.
fn step(line: Line, byte: u8) -> Result<Step, FramingError> {
    let framing = |line| Ok(Step::Chunk(Chunk::Framing(line)));
    match (line, byte) {
        (Line::Size { size, digits }, _) if byte.is_ascii_hexdigit() => {
            let digit = u64::from((byte as char).to_digit(16).unwrap_or(0));
            // 16 hex digits fill a u64; leading zeros are allowed.
            let size = size.checked_mul(16).and_then(|s| s.checked_add(digit)).ok_or(FramingError::BadChunkSize)?;
            framing(Line::Size { size, digits: digits.saturating_add(1) })
        }
        (Line::Size { digits: 0, .. }, _) => Err(FramingError::BadChunkSize),
        (Line::Size { size, .. }, b';' | b' ' | b'\t') => framing(Line::Extension { size, seen: 0 }),
        (Line::Size { size, .. } | Line::Extension { size, .. }, b'\r') => framing(Line::SizeLf { size }),
        (Line::Size { .. } | Line::Extension { .. }, b'\n') => Err(FramingError::BadChunkSize),
        (Line::Size { .. }, _) => Err(FramingError::BadChunkSize),
        (Line::Extension { size, seen }, _) => {
            if seen >= MAX_FRAMING_BYTES {
                return Err(FramingError::FramingTooLong);
            }
            framing(Line::Extension { size, seen: seen + 1 })
        }
        (Line::SizeLf { size: 0 }, b'\n') => framing(Line::TrailerStart { seen: 0 }),
        (Line::SizeLf { size }, b'\n') => Ok(Step::Chunk(Chunk::Data { left: size })),
        (Line::SizeLf { .. }, _) => Err(FramingError::BadChunkSize),
        (Line::DataCr, b'\r') => framing(Line::DataLf),
        (Line::DataLf, b'\n') => Ok(Step::Chunk(SIZE_START)),
        (Line::DataCr | Line::DataLf, _) => Err(FramingError::BadChunkEnd),
        (Line::TrailerStart { .. }, b'\r') => framing(Line::EndLf),
        (Line::EndLf, b'\n') => Ok(Step::End),
        (Line::EndLf, _) => Err(FramingError::BadChunkEnd),
        (Line::TrailerStart { seen } | Line::Trailer { seen }, _) => {
            if seen >= MAX_FRAMING_BYTES {
                return Err(FramingError::FramingTooLong);
            }
            framing(if byte == b'\n' {
                Line::TrailerStart { seen: seen + 1 }
            } else {
                Line::Trailer { seen: seen + 1 }
            })
        }
    }
}

/// The comma-separated tokens of every `name` header, trimmed, empty ones
/// left out (`Connection: keep-alive, close`; `Transfer-Encoding: gzip, chunked`).
pub fn header_tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl DoubleEndedIterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    /// Feeds `input` split into pieces of `step` bytes; returns the data,
    /// the bytes used and whether the body ended.
    fn decode_in_steps(framing: Framing, input: &[u8], step: usize) -> Result<(Vec<u8>, usize, bool), FramingError> {
        let mut decoder = Decoder::new(framing);
        let mut out = BytesMut::new();
        let mut used = 0;
        for piece in input.chunks(step) {
            let n = decoder.decode(piece, &mut out)?;
            used += n;
            if n < piece.len() {
                break;
            }
        }
        Ok((out.to_vec(), used, decoder.is_done()))
    }

    #[test]
    fn framing_follows_rfc_9112() {
        assert_eq!(framing(true, 200, &headers(&[("content-length", "5")])), Ok(Framing::Empty));
        assert_eq!(framing(false, 204, &HeaderMap::new()), Ok(Framing::Empty));
        assert_eq!(framing(false, 304, &HeaderMap::new()), Ok(Framing::Empty));
        assert_eq!(framing(false, 200, &headers(&[("content-length", "5")])), Ok(Framing::Length(5)));
        assert_eq!(framing(false, 200, &headers(&[("content-length", "5, 5")])), Ok(Framing::Length(5)));
        assert_eq!(
            framing(false, 200, &headers(&[("content-length", "5"), ("content-length", "5")])),
            Ok(Framing::Length(5))
        );
        assert_eq!(framing(false, 200, &HeaderMap::new()), Ok(Framing::UntilClose));
        // The last coding of Transfer-Encoding decides.
        let chunked = headers(&[("transfer-encoding", "gzip, Chunked")]);
        assert_eq!(framing(false, 200, &chunked), Ok(Framing::Chunked));
        assert_eq!(framing(false, 200, &headers(&[("transfer-encoding", "chunked, gzip")])), Ok(Framing::UntilClose));
    }

    #[test]
    fn transfer_encoding_in_http_1_0_is_faulty_framing() {
        let chunked = headers(&[("transfer-encoding", "chunked")]);
        assert_eq!(check_version(http::Version::HTTP_10, &chunked), Err(FramingError::EncodedHttp10));
        assert_eq!(check_version(http::Version::HTTP_11, &chunked), Ok(()));
        let length = headers(&[("content-length", "5")]);
        assert_eq!(check_version(http::Version::HTTP_10, &length), Ok(()));
    }

    #[test]
    fn ambiguous_lengths_are_refused() {
        for bad in ["5, 6", "-1", "+5", "", "0x10", "99999999999999999999999"] {
            assert_eq!(
                framing(false, 200, &headers(&[("content-length", bad)])),
                Err(FramingError::BadLength),
                "{bad}"
            );
        }
        let two = headers(&[("content-length", "5"), ("content-length", "6")]);
        assert_eq!(framing(false, 200, &two), Err(FramingError::BadLength));
        // Framed two ways, whichever comes first and whatever the coding.
        for pairs in [
            [("transfer-encoding", "chunked"), ("content-length", "5")],
            [("content-length", "5"), ("transfer-encoding", "chunked")],
            [("transfer-encoding", "gzip"), ("content-length", "0")],
        ] {
            assert_eq!(framing(false, 200, &headers(&pairs)), Err(FramingError::FramedTwice), "{pairs:?}");
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_reads() {
        let body = b"5;name=value\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: yes\r\n\r\n";
        for step in 1..=body.len() {
            let (data, used, done) = decode_in_steps(Framing::Chunked, body, step).unwrap();
            assert_eq!(data, b"hello, world", "step {step}");
            assert_eq!((used, done), (body.len(), true), "step {step}");
        }
    }

    #[test]
    fn bytes_after_the_end_are_not_the_body() {
        let input = b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n";
        let (data, used, done) = decode_in_steps(Framing::Chunked, input, input.len()).unwrap();
        assert_eq!((data.as_slice(), used, done), (&b"abc"[..], 13, true));
        let (data, used, done) = decode_in_steps(Framing::Length(4), b"abcdefg", 7).unwrap();
        assert_eq!((data.as_slice(), used, done), (&b"abcd"[..], 4, true));
    }

    #[test]
    fn hostile_chunk_framing_is_refused() {
        let cases: [(&[u8], FramingError); 7] = [
            (b"zz\r\n", FramingError::BadChunkSize),
            (b"\r\n", FramingError::BadChunkSize),
            (b"5\nhello\r\n", FramingError::BadChunkSize),
            (b"11111111111111111\r\n", FramingError::BadChunkSize),
            (b"3\r\nabcX", FramingError::BadChunkEnd),
            (b"3\r\nabc\rX", FramingError::BadChunkEnd),
            (b"0\r\n\rX", FramingError::BadChunkEnd),
        ];
        for (input, error) in cases {
            assert_eq!(decode_in_steps(Framing::Chunked, input, 1), Err(error), "{:?}", String::from_utf8_lossy(input));
        }
        let long_extension = [b"1;".as_slice(), &[b'a'; 20_000]].concat();
        assert_eq!(decode_in_steps(Framing::Chunked, &long_extension, 4096), Err(FramingError::FramingTooLong));
        let endless_trailers = [b"0\r\n".as_slice(), &b"x: y\r\n".repeat(4000)].concat();
        assert_eq!(decode_in_steps(Framing::Chunked, &endless_trailers, 4096), Err(FramingError::FramingTooLong));
    }

    /// Decoding in place gives what copying does; a body without chunk
    /// framing is a slice of the input, not a copy.
    #[test]
    fn decoding_in_place_matches_copying() {
        let cases: [(Framing, &[u8]); 5] = [
            (Framing::Length(4), b"abcdefg"),
            (Framing::Length(40), b"abcdefg"),
            (Framing::UntilClose, b"abcdefg"),
            (Framing::Empty, b"abc"),
            (Framing::Chunked, b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1"),
        ];
        for (framing, input) in cases {
            let (copied, used, done) = decode_in_steps(framing, input, input.len()).unwrap();
            let mut decoder = Decoder::new(framing);
            let shared = Bytes::copy_from_slice(input);
            let (data, shared_used) = decoder.decode_shared(&shared).unwrap();
            assert_eq!((&data[..], shared_used, decoder.is_done()), (copied.as_slice(), used, done), "{framing:?}");
            if framing != Framing::Chunked && !data.is_empty() {
                assert_eq!(data.as_ptr(), shared.as_ptr(), "{framing:?}: copied");
            }
        }
        let mut hostile = Decoder::new(Framing::Chunked);
        assert_eq!(hostile.decode_shared(&Bytes::from_static(b"zz\r\n")), Err(FramingError::BadChunkSize));
    }

    #[test]
    fn the_end_of_the_connection_ends_only_what_it_may() {
        let mut until_close = Decoder::new(Framing::UntilClose);
        assert_eq!(until_close.at_eof(), Ok(()));
        assert!(until_close.is_done());
        let mut length = Decoder::new(Framing::Length(3));
        length.decode(b"ab", &mut BytesMut::new()).unwrap();
        assert_eq!(length.remaining(), Some(1));
        assert_eq!(length.at_eof(), Err(FramingError::Truncated));
        let mut chunked = Decoder::new(Framing::Chunked);
        chunked.decode(b"3\r\nab", &mut BytesMut::new()).unwrap();
        assert_eq!(chunked.at_eof(), Err(FramingError::Truncated));
        assert!(Decoder::new(Framing::Length(0)).is_done());
        assert!(Decoder::new(Framing::Empty).is_done());
    }
}
