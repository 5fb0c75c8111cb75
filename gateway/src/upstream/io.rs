//! An upstream connection's byte stream, and the one question the pool
//! asks of it: may it carry another request?
//!
//! A connection may be reused only when nothing is pending on it: no byte
//! the upstream sent that no request asked for, no close. Bytes sent after
//! a complete answer answer nothing, and served to the next request they
//! would shift every later answer onto the request after it (another key's).
//!
//! ```text
//! cleartext: peek the socket ─► any byte or EOF ─► closed
//! TLS:       read through rustls, without waiting ─► plaintext or EOF ─► closed
//!                (a session ticket is consumed there and yields nothing)
//!            ─► a record only partly taken in (Records, below rustls) ─► closed
//!            ─► peek the socket ─► any byte rustls has not seen, or EOF ─► closed
//! ```
//!
//! NB: the socket is peeked with a system call of its own, not through
//! tokio, whose readiness flags lag until its reactor next runs: bytes
//! that arrived just before a connection is taken count too.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connection's byte stream.
pub(super) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<Records>>),
}

impl Io {
    /// Whether an idle connection can carry another request: the upstream
    /// has not closed it and has sent nothing unasked, down to a part of a
    /// TLS record.
    pub(super) fn is_reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut byte = [MaybeUninit::uninit(); 1];
        let mut read = ReadBuf::uninit(&mut byte);
        match self {
            Io::Plain(tcp) => nothing_pending(tcp),
            Io::Tls(tls) => {
                // rustls takes in what tokio has seen arrive: a session
                // ticket yields nothing; application data or a close is an
                // answer to nothing.
                if Pin::new(tls.as_mut()).poll_read(&mut cx, &mut read).is_ready() {
                    return false;
                }
                let records = tls.get_ref().0;
                records.at_record_boundary() && nothing_pending(&records.tcp)
            }
        }
    }
}

/// Whether the socket holds no unread byte and no close: one `MSG_PEEK`
/// system call on the non-blocking socket.
fn nothing_pending(tcp: &TcpStream) -> bool {
    let mut byte = [MaybeUninit::uninit(); 1];
    matches!(socket2::SockRef::from(tcp).peek(&mut byte), Err(error) if error.kind() == io::ErrorKind::WouldBlock)
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The TCP stream under rustls, following the TLS record framing of what
/// rustls reads: whether the bytes handed up so far end at a record's end.
///
/// NB: in TLS 1.3 a session ticket and application data look alike on
/// the wire (both are encrypted `application_data` records), so the
/// framing cannot tell them apart; it can tell that rustls holds part of a
/// record it cannot decrypt yet, which no idle connection should.
pub(super) struct Records {
    tcp: TcpStream,
    framing: RecordFraming,
}

impl Records {
    pub(super) fn new(tcp: TcpStream) -> Self {
        Self { tcp, framing: RecordFraming::default() }
    }

    fn at_record_boundary(&self) -> bool {
        self.framing.at_boundary()
    }
}

/// Where a stream of TLS records stands: inside a record's 5-byte header
/// (`header_read` of it) or its body (`body_left` bytes to come).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct RecordFraming {
    header: [u8; 5],
    header_read: u8,
    body_left: usize,
}

impl RecordFraming {
    /// Follows `bytes`, the next bytes of the stream. Skips record bodies
    /// by their length: the cost is per record, not per byte.
    fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let skipped = self.body_left.min(bytes.len());
                self.body_left -= skipped;
                bytes = &bytes[skipped..];
                continue;
            }
            self.header[usize::from(self.header_read)] = bytes[0];
            self.header_read += 1;
            bytes = &bytes[1..];
            if self.header_read == 5 {
                self.header_read = 0;
                self.body_left = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
            }
        }
    }

    fn at_boundary(&self) -> bool {
        self.header_read == 0 && self.body_left == 0
    }
}

impl AsyncRead for Records {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.framing.advance(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Records {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(length: u16) -> Vec<u8> {
        let mut bytes = vec![23, 3, 3];
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend(std::iter::repeat_n(0xAA, usize::from(length)));
        bytes
    }

    /// Whatever the reads, the framing is at a boundary exactly where a
    /// record ends, and nowhere inside one (header or body).
    #[test]
    fn record_boundaries_are_found_whatever_the_reads() {
        let stream: Vec<u8> = [record(0), record(1), record(300), record(16_384 + 256), record(5)].concat();
        let mut ends = std::collections::BTreeSet::new();
        let mut at = 0;
        for length in [0_usize, 1, 300, 16_384 + 256, 5] {
            at += 5 + length;
            ends.insert(at);
        }
        for step in [1, 2, 3, 5, 7, 64, 1000, stream.len()] {
            let mut framing = RecordFraming::default();
            let mut read = 0;
            for piece in stream.chunks(step) {
                framing.advance(piece);
                read += piece.len();
                assert_eq!(framing.at_boundary(), ends.contains(&read), "step {step}, after {read} bytes");
            }
        }
        let mut byte_by_byte = RecordFraming::default();
        for (index, byte) in stream.iter().enumerate() {
            byte_by_byte.advance(std::slice::from_ref(byte));
            assert_eq!(byte_by_byte.at_boundary(), ends.contains(&(index + 1)), "after {} bytes", index + 1);
        }
    }
}
