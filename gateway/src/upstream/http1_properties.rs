//! The upstream client against generated responses: every framing
//! (`Content-Length` in its spellings, chunked with extensions and
//! trailers, until close), informational heads, `Connection: close`,
//! HTTP/1.0, random split points, and stray bytes after the answer — in
//! the same write or arriving while the connection idles — over cleartext
//! and TLS, each followed by the next case's request on the same pool.
//!
//! The oracle is the generator's own reference: the body it framed, the
//! status it wrote (each head is also checked against `httparse`), and
//! whether the connection may carry another request. Properties:
//! - the client hands out exactly the body that was framed, with its status,
//!   and a `Content-Length` only as the one length it was read by;
//! - a request never receives bytes sent before it was written: after an
//!   answer followed by stray bytes the next request goes on a new
//!   connection and gets its own answer;
//! - a connection left clean is reused (the pool still pools).
//!
//! Seeded: a failing seed and case index are printed; replay with
//! `WAYCAST_PROPERTY_SEED`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http::header::{HeaderName, HeaderValue};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;
use waycast_crds::config::ClientTlsConfig;
use waycast_crds::seeded::Xorshift;

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stray {
    None,
    /// Written right after the answer, in the same write.
    WithAnswer,
    /// Written while the connection idles, before the next request.
    WhileIdle,
}

/// One generated answer and what a correct client makes of it.
#[derive(Clone)]
pub(super) struct Case {
    /// The bytes on the wire, in the pieces they are written in.
    pub(super) pieces: Vec<Vec<u8>>,
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
    pub(super) stray: Stray,
    /// Whether a correct client may send another request on the connection.
    pub(super) reusable: bool,
    /// The server closes after this answer.
    pub(super) closes: bool,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wire: Vec<u8> = self.pieces.concat();
        let head_end = wire.windows(4).rposition(|w| w == b"\r\n\r\n").map_or(wire.len(), |at| at + 4);
        f.debug_struct("Case")
            .field("wire", &String::from_utf8_lossy(&wire[..head_end.min(400)]))
            .field("pieces", &self.pieces.iter().map(Vec::len).collect::<Vec<_>>())
            .field("status", &self.status)
            .field("body_bytes", &self.body.len())
            .field("stray", &self.stray)
            .field("reusable", &self.reusable)
            .field("closes", &self.closes)
            .finish()
    }
}

pub(super) const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY";

pub(super) fn case(rng: &mut Xorshift) -> Case {
    let status = [200, 200, 200, 201, 404, 500, 204][rng.below(7) as usize];
    let length = rng.below(400) as usize;
    let body = if status == 204 { Vec::new() } else { rng.bytes(length) };
    let http10 = rng.chance(12);
    let close_header = rng.chance(10);
    // 0: Content-Length, 1: chunked, 2: until close
    let framing = if status == 204 { 0 } else { rng.below(3) };
    // HTTP/1.0 has no chunked coding: `Transfer-Encoding` there is faulty
    // framing (RFC 9112 §6.1), a hostile case of the oracle test.
    let framing = if http10 && framing == 1 { 0 } else { framing };
    let mut wire = Vec::new();
    for _ in 0..rng.below(3) {
        let line: &[u8] =
            if rng.chance(2) { b"HTTP/1.1 100 Continue\r\n" } else { b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n" };
        wire.extend_from_slice(line);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    wire.extend_from_slice(format!("{status} Whatever\r\n").as_bytes());
    for index in 0..rng.below(4) {
        wire.extend_from_slice(format!("x-filler-{index}: {}\r\n", "v".repeat(rng.below(60) as usize)).as_bytes());
    }
    if close_header {
        wire.extend_from_slice(if rng.chance(2) {
            b"Connection: close\r\n"
        } else {
            b"connection: keep-alive, Close\r\n"
        });
    }
    let mut encoded = Vec::new();
    match framing {
        _ if status == 204 => {}
        0 => {
            let length = body.len();
            let spelled = match rng.below(4) {
                0 => format!("Content-Length: {length}\r\n"),
                1 => format!("content-length: {length}, {length}\r\n"),
                2 => format!("content-length: {length}\r\ncontent-length: {length}\r\n"),
                _ => format!("content-length: 000{length}\r\n"),
            };
            wire.extend_from_slice(spelled.as_bytes());
            encoded.extend_from_slice(&body);
        }
        1 => {
            wire.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
            let mut at = 0;
            while at < body.len() {
                let size = (1 + rng.below(60) as usize).min(body.len() - at);
                let extension = if rng.chance(5) { ";name=value" } else { "" };
                let hex = if rng.chance(2) { format!("{size:x}") } else { format!("{size:X}") };
                encoded.extend_from_slice(format!("{hex}{extension}\r\n").as_bytes());
                encoded.extend_from_slice(&body[at..at + size]);
                encoded.extend_from_slice(b"\r\n");
                at += size;
            }
            encoded.extend_from_slice(b"0\r\n");
            for index in 0..rng.below(3) {
                encoded.extend_from_slice(format!("x-trailer-{index}: t\r\n").as_bytes());
            }
            encoded.extend_from_slice(b"\r\n");
        }
        _ => encoded.extend_from_slice(&body),
    }
    wire.extend_from_slice(b"\r\n");
    // The reference reading of the final head agrees with httparse's.
    check_head_with_httparse(&wire, status);
    wire.extend_from_slice(&encoded);
    let until_close = framing == 2;
    let closes = until_close || close_header || http10;
    let stray = match rng.below(4) {
        0 if !until_close => Stray::WithAnswer,
        1 if !until_close => Stray::WhileIdle,
        _ => Stray::None,
    };
    if stray == Stray::WithAnswer {
        wire.extend_from_slice(STRAY);
    }
    let pieces = split(rng, &wire);
    Case { pieces, status, body, stray, reusable: !closes && stray == Stray::None, closes }
}

/// `wire` cut at generated points: single bytes, short runs, the rest.
pub(super) fn split(rng: &mut Xorshift, wire: &[u8]) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let size = match rng.below(4) {
            0 => 1 + rng.below(4) as usize,
            1 => wire.len() - at,
            _ => 1 + rng.below(80) as usize,
        }
        .min(wire.len() - at);
        pieces.push(wire[at..at + size].to_vec());
        at += size;
    }
    pieces
}

/// The last head in `wire` (after the informational ones) parses with
/// `httparse` to `status`.
fn check_head_with_httparse(wire: &[u8], status: u16) {
    let mut rest = wire;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(length) = response.parse(rest).expect("the generator writes valid heads") else {
            panic!("the generator wrote an incomplete head")
        };
        let code = response.code.expect("a status");
        rest = &rest[length..];
        if !(100..200).contains(&code) {
            assert_eq!(code, status);
            assert!(rest.is_empty(), "the head is all the generator wrote so far");
            return;
        }
    }
}

/// Which connection each case's request arrived on, and a signal for each
/// stray answer written to an idle connection.
#[derive(Clone)]
pub(super) struct Arrivals {
    /// Per case: the connection (from 1) its request arrived on; 0 until then.
    connections: Arc<[AtomicUsize]>,
    pub(super) stray_written: Arc<tokio::sync::Notify>,
}

impl Arrivals {
    pub(super) fn new(cases: usize) -> Self {
        Self { connections: (0..cases).map(|_| AtomicUsize::new(0)).collect(), stray_written: Arc::default() }
    }

    fn record(&self, case: usize, connection: usize) {
        if let Some(slot) = self.connections.get(case) {
            slot.store(connection, Ordering::SeqCst);
        }
    }

    pub(super) fn connection_of(&self, case: usize) -> Option<usize> {
        self.connections.get(case).map(|slot| slot.load(Ordering::SeqCst)).filter(|c| *c > 0)
    }
}

/// Serves `cases` on every connection accepted: each request names its
/// case in `x-case`; answers are written piece by piece, stray bytes as
/// the case says.
pub(super) async fn serve<S>(stream: S, connection: usize, cases: Arc<Vec<Case>>, arrivals: Arrivals)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = stream;
    let mut buffer = Vec::new();
    loop {
        let Some((case_index, used)) = read_request(&mut stream, &mut buffer).await else { return };
        buffer.drain(..used);
        arrivals.record(case_index, connection);
        let case = &cases[case_index];
        for (index, piece) in case.pieces.iter().enumerate() {
            if stream.write_all(piece).await.is_err() {
                // The client closed it, having seen bytes after the answer.
                if case.stray != Stray::None {
                    arrivals.stray_written.notify_one();
                }
                return;
            }
            if index % 3 == 2 {
                let _ = stream.flush().await;
                tokio::task::yield_now().await;
            }
        }
        let _ = stream.flush().await;
        if case.stray == Stray::WhileIdle {
            let _ = stream.write_all(STRAY).await;
            let _ = stream.flush().await;
        }
        if case.stray != Stray::None {
            arrivals.stray_written.notify_one();
        }
        if case.closes {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// One request off `stream` (head, `Content-Length` body) by `httparse`:
/// its `x-case` and the bytes it took.
async fn read_request<S: AsyncRead + Unpin>(stream: &mut S, buffer: &mut Vec<u8>) -> Option<(usize, usize)> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(head)) = request.parse(buffer) {
            let header = |name: &str| {
                request.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value.to_vec())
            };
            let length: usize = std::str::from_utf8(&header("content-length")?).ok()?.parse().ok()?;
            let case: usize = std::str::from_utf8(&header("x-case")?).ok()?.parse().ok()?;
            if buffer.len() >= head + length {
                return Some((case, head + length));
            }
        }
        let mut chunk = [0_u8; 4096];
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

pub(super) fn request_for(address: SocketAddr, tls: bool, host: &str, case: usize) -> UpstreamRequest {
    let authority = address.to_string().parse().expect("an address is an authority");
    let body = Bytes::from(format!(r#"{{"case":{case}}}"#));
    let mut head = UpstreamRequest::build(&Method::POST, tls, authority, "/v1/chat/completions", body);
    head.header(&http::header::HOST, &HeaderValue::from_str(host).expect("a host"));
    head.header(&HeaderName::from_static("x-case"), &HeaderValue::from(case));
    head.finish()
}

/// Runs `count` cases from `seed` through `client` against the server at
/// `address` (which serves the same cases): the properties above.
async fn check_cases(client: &UpstreamClient, address: SocketAddr, tls: bool, cases: &[Case], arrivals: &Arrivals) {
    let arrived = |case: usize| arrivals.connection_of(case);
    for (index, case) in cases.iter().enumerate() {
        let context = || format!("case {index}: {case:?}, after {:?}", index.checked_sub(1).map(|i| &cases[i]));
        let response = client.request(request_for(address, tls, "upstream", index)).await;
        let response = response.unwrap_or_else(|error| panic!("{error} in {}", context()));
        assert_eq!(response.status().as_u16(), case.status, "{}", context());
        // A Content-Length that goes on is the one the body was read by.
        let lengths: Vec<&HeaderValue> = response.headers().get_all(http::header::CONTENT_LENGTH).iter().collect();
        if !lengths.is_empty() {
            assert_eq!(lengths, [&HeaderValue::from(case.body.len())], "{}", context());
        }
        let body = response.into_body().collect().await.unwrap_or_else(|e| panic!("{e} in {}", context()));
        assert_eq!(body.to_bytes(), case.body, "{}", context());
        if index > 0 {
            let previous = &cases[index - 1];
            let (before, now) = (arrived(index - 1), arrived(index));
            if previous.reusable {
                assert_eq!(now, before, "a clean connection was not reused: {}", context());
            } else {
                assert_ne!(now, before, "a connection with bytes after its answer was reused: {}", context());
            }
        }
        if case.stray != Stray::None {
            // Every stray byte is sent before the next request: bytes that
            // come after it would be an answer to it, for any client.
            let written = tokio::time::timeout(Duration::from_secs(5), arrivals.stray_written.notified()).await;
            assert!(written.is_ok(), "the server wrote no stray answer: {}", context());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

pub(super) fn seed() -> u64 {
    std::env::var("WAYCAST_PROPERTY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_cafe_f00d_0001)
}

pub(super) fn generated(seed: u64, count: usize) -> Arc<Vec<Case>> {
    let mut rng = Xorshift::new(seed);
    println!("seed {seed}");
    Arc::new((0..count).map(|_| case(&mut rng)).collect())
}

#[tokio::test]
async fn generated_answers_over_cleartext_reach_only_their_own_request() {
    let cases = generated(seed(), 2_000);
    let arrivals = Arrivals::new(cases.len());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (served, recorded) = (cases.clone(), arrivals.clone());
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((socket, _)) = listener.accept().await {
            connection += 1;
            // NB: without it, Nagle holds a stray answer back until the
            // client's next request carries an ACK: it then arrives after
            // that request, which no client can tell from an answer.
            socket.set_nodelay(true).unwrap();
            tokio::spawn(serve(socket, connection, served.clone(), recorded.clone()));
        }
    });
    let tls = crate::tls::client_config(None).unwrap();
    let client = UpstreamClient::new(Duration::from_secs(2), Arc::default(), tls, None);
    check_cases(&client, address, false, &cases, &arrivals).await;
}

#[tokio::test]
async fn generated_answers_over_tls_reach_only_their_own_request() {
    let cases = generated(seed() ^ 0x7157, 400);
    let arrivals = Arrivals::new(cases.len());
    let dir = waycast_mock::fixtures::temp_dir("http1-properties");
    let authority = waycast_mock::pki::Authority::generate(&dir, "ca").unwrap();
    let server = authority
        .issue(&dir, "upstream", "upstream", &[], &["upstream".into()], waycast_mock::pki::Usage::Server)
        .unwrap();
    let acceptor =
        tokio_rustls::TlsAcceptor::from(waycast_mock::pki::server_tls(&server.cert, &server.key, None).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (served, recorded) = (cases.clone(), arrivals.clone());
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((socket, _)) = listener.accept().await {
            connection += 1;
            socket.set_nodelay(true).unwrap();
            let (acceptor, served, recorded) = (acceptor.clone(), served.clone(), recorded.clone());
            tokio::spawn(async move {
                if let Ok(stream) = acceptor.accept(socket).await {
                    serve(stream, connection, served, recorded).await;
                }
            });
        }
    });
    let trusted = ClientTlsConfig {
        ca_pem: Some(std::fs::read_to_string(&authority.files.cert).unwrap()),
        server_name: Some("upstream".into()),
        ..ClientTlsConfig::default()
    };
    let client = crate::upstream::client(Duration::from_secs(2), &Arc::default(), Some(&trusted)).unwrap();
    check_cases(&client, address, true, &cases, &arrivals).await;
}
