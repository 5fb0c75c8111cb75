//! The client against scripted upstreams on loopback: each test's upstream
//! answers its connections with fixed bytes, so reuse, closes and hostile
//! heads are exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// An upstream that answers each request on a connection with the next of
/// `answers` (per connection, from the first), closing after the last;
/// counts its connections.
async fn scripted(answers: Vec<&'static [u8]>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let answers = answers.clone();
            tokio::spawn(async move {
                for answer in answers {
                    if read_request(&mut socket).await.is_none() {
                        return;
                    }
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (address, accepted)
}

/// Reads one request (head and `Content-Length` body); `None` at EOF.
async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut seen = Vec::new();
    loop {
        let mut byte = [0u8; 1024];
        let n = socket.read(&mut byte).await.ok()?;
        if n == 0 {
            return None;
        }
        seen.extend_from_slice(&byte[..n]);
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while seen.len() < end + 4 + length {
                let n = socket.read(&mut byte).await.ok()?;
                if n == 0 {
                    return None;
                }
                seen.extend_from_slice(&byte[..n]);
            }
            return Some(seen);
        }
    }
}

fn client() -> UpstreamClient {
    let tls = crate::tls::client_config(None).unwrap();
    UpstreamClient::new(Duration::from_secs(2), Arc::from(Vec::new()), tls, None)
}

fn post(address: SocketAddr, body: &'static [u8]) -> UpstreamRequest {
    let authority = address.to_string().parse().unwrap();
    let mut head =
        UpstreamRequest::build(&Method::POST, false, authority, "/v1/chat/completions", Bytes::from_static(body));
    head.header(&http::header::HOST, &HeaderValue::from_static("upstream"));
    head.finish()
}

async fn body_of(response: Response<UpstreamBody>) -> Result<Bytes, UpstreamError> {
    Ok(response.into_body().collect().await?.to_bytes())
}

const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
const LENGTH: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nworld";

#[tokio::test]
async fn a_finished_response_leaves_its_connection_for_the_next_request() {
    let (address, accepted) = scripted(vec![CHUNKED, LENGTH, CHUNKED]).await;
    let client = client();
    for expected in ["hello", "world", "hello"] {
        let response = client.request(post(address, b"{}")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body_of(response).await.unwrap(), expected);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_not_used() {
    // One answer per connection, then the upstream closes it.
    let (address, accepted) = scripted(vec![LENGTH]).await;
    let client = client();
    for _ in 0..3 {
        let response = client.request(post(address, b"{}")).await.unwrap();
        assert_eq!(body_of(response).await.unwrap(), "world");
        // Let the upstream's close arrive before the next request.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_idle_thread_drops_the_connections_its_upstreams_closed() {
    let (closing, _) = scripted(vec![LENGTH]).await;
    let (open, _) = scripted(vec![LENGTH, LENGTH]).await;
    let client = client();
    for address in [closing, open] {
        let response = client.request(post(address, b"{}")).await.unwrap();
        assert_eq!(body_of(response).await.unwrap(), "world");
    }
    assert_eq!(Pool::idle_connections(), 2);
    // One upstream closes; no request comes to notice it, the sweep does,
    // and keeps the connection that is still open.
    tokio::spawn(Pool::sweep_while_idle(Duration::from_millis(20)));
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while Pool::idle_connections() > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(Pool::idle_connections(), 1);
}

#[tokio::test]
async fn a_request_the_upstream_drops_on_a_reused_connection_is_sent_on_a_new_one() {
    // The upstream reads the second request and closes without answering,
    // as a keep-alive timeout racing the request would; the next
    // connection answers it.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut first, _) = listener.accept().await.unwrap();
        read_request(&mut first).await.unwrap();
        first.write_all(LENGTH).await.unwrap();
        read_request(&mut first).await.unwrap();
        drop(first);
        let (mut second, _) = listener.accept().await.unwrap();
        read_request(&mut second).await.unwrap();
        second.write_all(CHUNKED).await.unwrap();
        let _ = read_request(&mut second).await;
    });
    let client = client();
    assert_eq!(body_of(client.request(post(address, b"{}")).await.unwrap()).await.unwrap(), "world");
    assert_eq!(body_of(client.request(post(address, b"{}")).await.unwrap()).await.unwrap(), "hello");
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await.unwrap();
        socket.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n").await.unwrap();
        let mut rest = [0u8; 64];
        let _ = closed_tx.send(socket.read(&mut rest).await.map(|n| n == 0).unwrap_or(true));
    });
    let client = client();
    let mut body = client.request(post(address, b"{}")).await.unwrap().into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first");
    assert!(!body.is_end_stream());
    drop(body);
    assert!(tokio::time::timeout(Duration::from_secs(2), closed).await.unwrap().unwrap());
}

#[tokio::test]
async fn informational_answers_are_skipped_and_close_delimited_bodies_end_with_the_connection() {
    let (address, accepted) = scripted(vec![
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n\r\nuntil the end",
    ])
    .await;
    let client = client();
    for _ in 0..2 {
        let response = client.request(post(address, b"{}")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body_of(response).await.unwrap(), "until the end");
    }
    // A close-delimited body's connection is never pooled.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A head that comes in several reads is read on in the same buffer; its
/// values and the body's first bytes (slices of that buffer) come out whole.
#[tokio::test]
async fn a_head_in_pieces_is_read_whole() {
    let answer: &[u8] = b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nx-served-by: pod-a\r\ncontent-length: 11\r\n\r\nhello world";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await.unwrap();
        for piece in answer.chunks(13) {
            socket.write_all(piece).await.unwrap();
            socket.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Held open: the body ends by its length, not by the close.
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let response = client().request(post(address, b"{}")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-served-by"], "pod-a");
    assert_eq!(response.headers()["content-length"], "11");
    assert_eq!(body_of(response).await.unwrap(), "hello world");
}

#[tokio::test]
async fn hostile_answers_are_errors_not_panics() {
    let too_long: &'static [u8] =
        Box::leak([b"HTTP/1.1 200 OK\r\nx-filler: ".as_slice(), &b"a".repeat(70_000)].concat().into_boxed_slice());
    let too_many: &'static [u8] =
        Box::leak([b"HTTP/1.1 200 OK\r\n".as_slice(), &b"x-a: b\r\n".repeat(101), b"\r\n"].concat().into_boxed_slice());
    let cases: [(&'static [u8], &str); 6] = [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed response head"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "unasked protocol switch"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-len", "closed inside the response head"),
        (too_long, "longer than 64 KiB"),
        (too_many, "more than 100 header fields"),
    ];
    let client = client();
    for (answer, expected) in cases {
        let (address, _) = scripted(vec![answer]).await;
        let error = client.request(post(address, b"{}")).await.err().expect("an error");
        assert!(error.to_string().contains(expected), "{error} for {expected}");
        assert!(!error.is_connect());
    }
    // A body that breaks its framing fails the request, or the body if
    // the head came on its own.
    let broken_bodies: [(&'static [u8], FramingError); 2] = [
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", FramingError::BadChunkSize),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", FramingError::Truncated),
    ];
    for (answer, expected) in broken_bodies {
        let (address, _) = scripted(vec![answer]).await;
        let outcome = match client.request(post(address, b"{}")).await {
            Ok(response) => body_of(response).await.map(drop),
            Err(error) => Err(error),
        };
        assert!(matches!(outcome, Err(UpstreamError::Body(error)) if error == expected), "{outcome:?}");
    }
}

#[tokio::test]
async fn refused_connections_and_denied_names_are_connect_errors() {
    let unused = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let error = client().request(post(unused, b"{}")).await.err().expect("refused");
    assert!(error.is_connect() && !error.is_egress_denied(), "{error}");

    let tls = crate::tls::client_config(None).unwrap();
    let everything: Cidr = "0.0.0.0/0".parse().unwrap();
    let guarded = UpstreamClient::new(Duration::from_secs(2), Arc::from(vec![everything]), tls, None);
    let by_name = format!("localhost:{}", unused.port()).parse().unwrap();
    let request = UpstreamRequest::build(&Method::POST, false, by_name, "/v1/chat/completions", Bytes::new()).finish();
    let error = guarded.request(request).await.err().expect("denied");
    assert!(error.is_connect() && error.is_egress_denied(), "{error}");
}

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
    assert_eq!(request.wire(), format!("POST / HTTP/1.1\r\ncontent-length: {}\r\n\r\n", BODY_WITH_HEAD + 1).as_bytes());
}

#[test]
fn pool_keys_hash_by_client_scheme_and_exact_authority() {
    use std::hash::BuildHasher;
    let hasher = BuildHasherDefault::<PoolHasher>::default();
    let key = |client, tls, authority: &str| PoolKey { client, tls, authority: authority.parse().unwrap() };
    let base = key(1, false, "10.0.0.5:8000");
    assert!(base == key(1, false, "10.0.0.5:8000"));
    assert_eq!(hasher.hash_one(&base), hasher.hash_one(key(1, false, "10.0.0.5:8000")));
    for other in [key(2, false, "10.0.0.5:8000"), key(1, true, "10.0.0.5:8000"), key(1, false, "10.0.0.5:8001")] {
        assert!(base != other);
        assert_ne!(hasher.hash_one(&base), hasher.hash_one(&other));
    }
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
