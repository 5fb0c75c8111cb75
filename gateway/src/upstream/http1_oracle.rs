//! hyper's HTTP/1 client as a second, independent reading of the
//! generated answers: the same corpus as [`super::properties`] (every
//! framing, informational heads, `Connection: close`, HTTP/1.0, generated
//! split points, stray bytes with the answer and while idle, keep-alive
//! sequences) plus hostile answers, served alike to both clients, each on
//! a server of its own.
//!
//! ```text
//! corpus ─► server A ◄── UpstreamClient ─┐
//!        └► server B ◄── hyper conn::http1 ─┴─► per case: accepted? status, body, next request on the same connection?
//! ```
//!
//! Properties, per case:
//! - both clients accept the same answers and refuse the same ones, but
//!   for the one documented difference: a response with both
//!   `Transfer-Encoding` and `Content-Length`, which hyper reads as chunked
//!   and this client refuses (RFC 9112 §6.3 lets a client do either; it is
//!   the shape of a smuggling attempt, so it is read no way at all);
//! - an accepted answer gives both the same status and body, and that is
//!   the one the generator framed;
//! - both send the next request on the same connection exactly when the
//!   generator says the connection may be reused.
//!
//! A disagreement with hyper is either a bug here or a deliberate
//! difference that belongs in the list above.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use waycast_crds::seeded::Xorshift;

use super::properties::{Arrivals, Case, Stray, case, request_for, seed, serve, split};
use super::*;

/// What a correct client makes of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Reads the case's status and body.
    Read,
    /// Refuses it: as a failed request or a failed body.
    Refused,
    /// This client refuses it; hyper reads the status and body.
    RefusedHereReadByHyper,
}

/// What one client made of one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Read { status: u16, body: Vec<u8> },
    Refused,
}

/// A hostile answer: framed wrongly, cut short or with a head no client
/// may read. The server closes after writing it.
fn hostile(rng: &mut Xorshift) -> (Case, Expect) {
    let length = 1 + rng.below(40) as usize;
    let body = rng.bytes(length);
    let (wire, expect): (Vec<u8>, Expect) = match rng.below(14) {
        0 => {
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n".to_vec(), Expect::Refused)
        }
        1 => (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n".to_vec(), Expect::Refused),
        2 => (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n11111111111111111\r\n".to_vec(), Expect::Refused),
        3 => (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n".to_vec(), Expect::Refused),
        4 => {
            // Cut short: fewer bytes than announced, then the close.
            let mut wire = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", length + 10).into_bytes();
            wire.extend_from_slice(&body);
            (wire, Expect::Refused)
        }
        5 => {
            let mut wire =
                format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n", length + 3).into_bytes();
            wire.extend_from_slice(&body);
            (wire, Expect::Refused)
        }
        6 => {
            let spelled = match rng.below(3) {
                0 => format!("content-length: {length}, {}", length + 1),
                1 => format!("content-length: {length}\r\ncontent-length: {}", length + 1),
                _ => ["content-length: -1", "content-length: +1", "content-length: abc", "content-length: 0x10"]
                    [rng.below(4) as usize]
                    .to_owned(),
            };
            let mut wire = format!("HTTP/1.1 200 OK\r\n{spelled}\r\n\r\n").into_bytes();
            wire.extend_from_slice(&body);
            (wire, Expect::Refused)
        }
        7 => {
            let line = ["HTTP/1.1 2x0 OK", "HTTP/2.0 200 OK", "HTTP/1.1 200OK", "ICY 200 OK", "HTTP/1.1 99999 OK"]
                [rng.below(5) as usize];
            (format!("{line}\r\ncontent-length: 0\r\n\r\n").into_bytes(), Expect::Refused)
        }
        8 => {
            let field = ["no colon here", "content-length : 0", "x-folded: a\r\n b", "x bad name: v", "\0x: v"]
                [rng.below(5) as usize];
            (format!("HTTP/1.1 200 OK\r\n{field}\r\ncontent-length: 0\r\n\r\n").into_bytes(), Expect::Refused)
        }
        9 if rng.chance(2) => {
            // Ends before its head does.
            (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n".to_vec(), Expect::Refused)
        }
        9 => {
            // HTTP/1.0 has no chunked coding (RFC 9112 §6.1).
            let mut wire = format!("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{length:x}\r\n").into_bytes();
            wire.extend_from_slice(&body);
            wire.extend_from_slice(b"\r\n0\r\n\r\n");
            (wire, Expect::Refused)
        }
        10 => {
            let extension = "e".repeat(64 * 1024);
            (
                format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;{extension}\r\nx\r\n0\r\n\r\n")
                    .into_bytes(),
                Expect::Refused,
            )
        }
        11 => {
            let trailers = "x-trailer: vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\r\n".repeat(2_000);
            (
                format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n{trailers}\r\n")
                    .into_bytes(),
                Expect::Refused,
            )
        }
        12 => {
            let mut wire = format!("HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n", "h".repeat(1024 * 1024)).into_bytes();
            wire.extend_from_slice(&body);
            (wire, Expect::Refused)
        }
        _ => {
            // Framed two ways.
            let mut wire = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ntransfer-encoding: chunked\r\n\r\n{length:x}\r\n",
                length + 5
            )
            .into_bytes();
            wire.extend_from_slice(&body);
            wire.extend_from_slice(b"\r\n0\r\n\r\n");
            (wire, Expect::RefusedHereReadByHyper)
        }
    };
    let pieces = split(rng, &wire);
    (Case { pieces, status: 200, body, stray: Stray::None, reusable: false, closes: true }, expect)
}

/// `count` cases from `seed`, one in `hostile_one_in` hostile.
fn corpus(seed: u64, count: usize, hostile_one_in: u64) -> (Arc<Vec<Case>>, Vec<Expect>) {
    let mut rng = Xorshift::new(seed);
    println!("seed {seed}");
    let (cases, expects) = (0..count)
        .map(|_| if rng.chance(hostile_one_in) { hostile(&mut rng) } else { (case(&mut rng), Expect::Read) })
        .unzip();
    (Arc::new(cases), expects)
}

/// A server for `cases` on loopback, recording arrivals.
async fn server(cases: Arc<Vec<Case>>) -> (SocketAddr, Arrivals) {
    let arrivals = Arrivals::new(cases.len());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let recorded = arrivals.clone();
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((socket, _)) = listener.accept().await {
            connection += 1;
            socket.set_nodelay(true).unwrap();
            tokio::spawn(serve(socket, connection, cases.clone(), recorded.clone()));
        }
    });
    (address, arrivals)
}

/// Waits, after a case with stray bytes, until they are written: bytes
/// arriving after the next request would be an answer to it for any client.
async fn settle(case: &Case, arrivals: &Arrivals) {
    if case.stray != Stray::None {
        let written = tokio::time::timeout(Duration::from_secs(5), arrivals.stray_written.notified()).await;
        assert!(written.is_ok(), "the server wrote no stray answer: {case:?}");
    }
    tokio::time::sleep(Duration::from_millis(if case.stray == Stray::None { 0 } else { 5 })).await;
}

const LIMIT: Duration = Duration::from_secs(10);

/// This client over the corpus: what it made of each answer, and the
/// connection each request arrived on.
async fn through_ours(cases: &Arc<Vec<Case>>) -> Vec<(Seen, Option<usize>)> {
    let (address, arrivals) = server(cases.clone()).await;
    let tls = crate::tls::client_config(None).unwrap();
    let client = UpstreamClient::new(Duration::from_secs(2), Arc::default(), tls, None);
    let mut seen = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        let answer = async {
            let response = client.request(request_for(address, false, "upstream", index)).await.ok()?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.ok()?.to_bytes();
            Some(Seen::Read { status, body: body.to_vec() })
        };
        let answer = tokio::time::timeout(LIMIT, answer).await.expect("this client answered within 10 s");
        seen.push((answer.unwrap_or(Seen::Refused), arrivals.connection_of(index)));
        settle(case, &arrivals).await;
    }
    seen
}

/// hyper's client over the corpus: a connection kept while hyper keeps
/// it (`SendRequest::ready`), a new one when hyper closed it.
async fn through_hyper(cases: &Arc<Vec<Case>>) -> Vec<(Seen, Option<usize>)> {
    let (address, arrivals) = server(cases.clone()).await;
    let mut sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> = None;
    let mut seen = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        let live = match sender.as_mut() {
            Some(open) if !open.is_closed() => open.ready().await.is_ok(),
            _ => false,
        };
        if !live {
            let stream = TcpStream::connect(address).await.unwrap();
            let (opened, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
            tokio::spawn(connection);
            sender = Some(opened);
        }
        let Some(open) = sender.as_mut() else { unreachable!("opened above") };
        let request = http::Request::post("/v1/chat/completions")
            .header(http::header::HOST, "upstream")
            .header("x-case", index)
            .body(Full::new(Bytes::from(format!(r#"{{"case":{index}}}"#))))
            .unwrap();
        let answer = async {
            let response = open.send_request(request).await.ok()?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.ok()?.to_bytes();
            Some(Seen::Read { status, body: body.to_vec() })
        };
        let answer = tokio::time::timeout(LIMIT, answer).await.expect("hyper answered within 10 s");
        seen.push((answer.unwrap_or(Seen::Refused), arrivals.connection_of(index)));
        settle(case, &arrivals).await;
    }
    seen
}

#[tokio::test]
async fn hyper_and_this_client_read_the_generated_answers_alike() {
    let (cases, expects) = corpus(seed() ^ 0x4e1f, 1_500, 6);
    let ours = through_ours(&cases).await;
    let theirs = through_hyper(&cases).await;
    let mut tally = [0_usize; 3];
    for (index, case) in cases.iter().enumerate() {
        let context = || {
            format!(
                "case {index} ({:?}): {case:?}, after {:?}",
                expects[index],
                index.checked_sub(1).map(|i| &cases[i])
            )
        };
        let framed = Seen::Read { status: case.status, body: case.body.clone() };
        let (expected_here, expected_hyper) = match expects[index] {
            Expect::Read => (framed.clone(), framed),
            Expect::Refused => (Seen::Refused, Seen::Refused),
            Expect::RefusedHereReadByHyper => (Seen::Refused, framed),
        };
        tally[expects[index] as usize] += 1;
        assert_eq!(ours[index].0, expected_here, "this client, {}", context());
        assert_eq!(theirs[index].0, expected_hyper, "hyper, {}", context());
        if index > 0 && expects[index - 1] == Expect::Read {
            let reused = |seen: &[(Seen, Option<usize>)]| seen[index].1 == seen[index - 1].1;
            let reusable = cases[index - 1].reusable;
            assert_eq!(reused(&theirs), reusable, "hyper's reuse, {}", context());
            assert_eq!(reused(&ours), reusable, "this client's reuse, {}", context());
        }
    }
    println!("read {}, refused by both {}, refused here and read by hyper {}", tally[0], tally[1], tally[2]);
    assert!(tally.iter().all(|count| *count > 0), "every kind of case ran: {tally:?}");
}
