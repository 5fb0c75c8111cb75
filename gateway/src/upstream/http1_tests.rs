//! The client against scripted upstreams on loopback: each test's upstream
//! answers its connections with fixed bytes, so reuse, closes and hostile
//! heads are exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::upstream::body_rest::{BodyRest, RestError};
use http::{Method, StatusCode};

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
async fn read_request<S: AsyncRead + Unpin>(socket: &mut S) -> Option<Vec<u8>> {
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
    UpstreamClient::new(Duration::from_secs(2), Arc::default(), tls, None)
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

/// The upstream reads the second request and closes without answering: it
/// may have executed it, so it is not sent again; the failure is the
/// answer. The next request goes on a new connection.
#[tokio::test]
async fn a_request_written_to_a_pooled_connection_is_never_sent_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    tokio::spawn(async move {
        let (mut first, _) = listener.accept().await.unwrap();
        read_request(&mut first).await.unwrap();
        counter.fetch_add(1, Ordering::SeqCst);
        first.write_all(LENGTH).await.unwrap();
        read_request(&mut first).await.unwrap();
        counter.fetch_add(1, Ordering::SeqCst);
        drop(first);
        while let Ok((mut next, _)) = listener.accept().await {
            while read_request(&mut next).await.is_some() {
                counter.fetch_add(1, Ordering::SeqCst);
                next.write_all(CHUNKED).await.unwrap();
            }
        }
    });
    let client = client();
    assert_eq!(body_of(client.request(post(address, b"{}")).await.unwrap()).await.unwrap(), "world");
    let error = client.request(post(address, b"{}")).await.err().expect("the upstream closed without answering");
    assert!(matches!(error, UpstreamError::Head(HeadError::Closed)), "{error}");
    assert!(!error.is_connect());
    assert_eq!(received.load(Ordering::SeqCst), 2, "each request reached the upstream once");
    assert_eq!(body_of(client.request(post(address, b"{}")).await.unwrap()).await.unwrap(), "hello");
    assert_eq!(received.load(Ordering::SeqCst), 3);
}

/// A pooled connection whose write fails (the upstream reset it) never
/// carried the request: it goes on a new connection.
#[tokio::test]
async fn a_request_that_could_not_be_written_goes_on_a_new_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (reset_tx, reset) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut first, _) = listener.accept().await.unwrap();
        read_request(&mut first).await.unwrap();
        first.write_all(LENGTH).await.unwrap();
        // An abortive close: the client's next write fails with a reset.
        #[allow(deprecated, reason = "a zero linger resets at once: nothing blocks")]
        first.set_linger(Some(Duration::ZERO)).unwrap();
        drop(first);
        let _ = reset_tx.send(());
        let (mut second, _) = listener.accept().await.unwrap();
        while read_request(&mut second).await.is_some() {
            second.write_all(CHUNKED).await.unwrap();
        }
    });
    let client = client();
    let response = client.request(post(address, b"{}")).await.unwrap();
    assert_eq!(body_of(response).await.unwrap(), "world");
    reset.await.unwrap();
    // The reset is visible at once; a connection taken before it arrived
    // fails its write and the request goes on a new one: either way, one
    // answer and no error.
    let response = client.request(post(address, &[b' '; 200_000])).await.unwrap();
    assert_eq!(body_of(response).await.unwrap(), "hello");
}

/// The upstream resets a pooled connection while the next request is being
/// written (after its head, long before its 16 MB body is in): the write
/// fails, so the request goes on a new connection, and is answered there.
#[tokio::test]
async fn a_request_whose_write_fails_midway_goes_on_a_new_connection() {
    static BODY: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| vec![b' '; 16 * 1024 * 1024]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let (mut first, _) = listener.accept().await.unwrap();
        counter.fetch_add(1, Ordering::SeqCst);
        read_request(&mut first).await.unwrap();
        first.write_all(LENGTH).await.unwrap();
        // The next request's first bytes, then an abortive close.
        let mut head = [0u8; 64];
        let _ = first.read(&mut head).await.unwrap();
        #[allow(deprecated, reason = "a zero linger resets at once: nothing blocks")]
        first.set_linger(Some(Duration::ZERO)).unwrap();
        drop(first);
        let (mut second, _) = listener.accept().await.unwrap();
        counter.fetch_add(1, Ordering::SeqCst);
        while read_request(&mut second).await.is_some() {
            second.write_all(CHUNKED).await.unwrap();
        }
    });
    let client = client();
    let response = client.request(post(address, b"{}")).await.unwrap();
    assert_eq!(body_of(response).await.unwrap(), "world");
    let response = client.request(post(address, BODY.as_slice())).await.unwrap();
    assert_eq!(body_of(response).await.unwrap(), "hello");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "sent again, on a new connection");
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
    let whole_too_long: &'static [u8] = Box::leak(
        [b"HTTP/1.1 200 OK\r\nx-filler: ".as_slice(), &b"a".repeat(70_000), b"\r\ncontent-length: 0\r\n\r\n"]
            .concat()
            .into_boxed_slice(),
    );
    let hint = [b"HTTP/1.1 103 Early Hints\r\nlink: ".as_slice(), &b"a".repeat(40_000), b"\r\n\r\n"].concat();
    let hints_too_long: &'static [u8] = Box::leak(
        [hint.as_slice(), &hint, b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"].concat().into_boxed_slice(),
    );
    let endless_continue: &'static [u8] = Box::leak(b"HTTP/1.1 100 Continue\r\n\r\n".repeat(10_000).into_boxed_slice());
    let cases: [(&'static [u8], &str); 10] = [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed response head"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "unasked protocol switch"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n", "invalid Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n",
            "both Transfer-Encoding and Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-len", "closed inside the response head"),
        (too_long, "longer than 64 KiB"),
        (whole_too_long, "longer than 64 KiB"),
        (hints_too_long, "longer than 64 KiB"),
        (endless_continue, "more than 8 informational responses"),
        (too_many, "more than 100 header fields"),
    ];
    let client = client();
    for (answer, expected) in cases {
        let (address, _) = scripted(vec![answer]).await;
        let error = client.request(post(address, b"{}")).await.err().expect("an error");
        assert!(error.to_string().contains(expected), "{error} for {expected}");
        assert!(!error.is_connect());
    }
    // Exactly 8 informational heads are skipped; a ninth is refused.
    let continues = |count: usize| -> &'static [u8] {
        let heads = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(count);
        Box::leak([heads.as_slice(), LENGTH].concat().into_boxed_slice())
    };
    let (address, _) = scripted(vec![continues(8)]).await;
    let response = client.request(post(address, b"{}")).await.unwrap();
    assert_eq!(body_of(response).await.unwrap(), "world");
    let (address, _) = scripted(vec![continues(9)]).await;
    let error = client.request(post(address, b"{}")).await.err().expect("a ninth informational head is refused");
    assert!(error.to_string().contains("more than 8 informational responses"), "{error}");
    // A body that breaks its framing fails the request, or the body if
    // the head came on its own.
    let broken_bodies: [(&'static [u8], FramingError); 3] = [
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", FramingError::BadChunkSize),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", FramingError::Truncated),
        (b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", FramingError::EncodedHttp10),
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

    // Under a policy closing loopback: a url backend's request, by name
    // or by literal (IPv4-mapped too), is refused before connecting; the
    // same address as a model's own Service is not.
    let policy = waycast_crds::egress::EgressPolicy {
        closed: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
        ..Default::default()
    };
    let tls = crate::tls::client_config(None).unwrap();
    let guarded = UpstreamClient::new(Duration::from_secs(2), Arc::new(policy), tls, None);
    let request = |host: String, own_service: bool| {
        let mut head =
            UpstreamRequest::build(&Method::POST, false, host.parse().unwrap(), "/v1/chat/completions", Bytes::new());
        if own_service {
            head.for_own_service();
        }
        head.finish()
    };
    for host in [format!("localhost:{}", unused.port()), format!("[::ffff:127.0.0.1]:{}", unused.port())] {
        let error = guarded.request(request(host.clone(), false)).await.err().expect("denied");
        assert!(error.is_connect() && error.is_egress_denied(), "{host}: {error}");
    }
    let error = guarded.request(request(unused.to_string(), false)).await.err().expect("denied");
    assert!(error.is_egress_denied(), "{error}");
    let error = guarded.request(request(unused.to_string(), true)).await.err().expect("refused, not denied");
    assert!(error.is_connect() && !error.is_egress_denied(), "{error}");
    let error = guarded.request(request("169.254.169.254:80".into(), true)).await.err().expect("metadata");
    assert!(error.is_connect() && error.is_egress_denied(), "{error}");
}

/// Bytes an upstream sends after a complete answer — with it, or while the
/// connection idles — answer nothing: the connection is closed, and the
/// next request gets its own answer on a new one.
#[tokio::test]
async fn bytes_after_a_complete_answer_close_the_connection() {
    const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY";
    for delay in [None, Some(Duration::from_millis(20))] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                socket.set_nodelay(true).unwrap();
                tokio::spawn(async move {
                    while read_request(&mut socket).await.is_some() {
                        socket.write_all(LENGTH).await.unwrap();
                        if let Some(delay) = delay {
                            socket.flush().await.unwrap();
                            tokio::time::sleep(delay).await;
                        }
                        socket.write_all(STRAY).await.unwrap();
                    }
                });
            }
        });
        let client = client();
        for _ in 0..3 {
            let response = client.request(post(address, b"{}")).await.unwrap();
            assert_eq!(body_of(response).await.unwrap(), "world", "{delay:?}");
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "{delay:?}: a connection with a stray answer was reused");
    }
}

/// A TLS upstream at `address` (certificate for `upstream`) whose
/// connections run `serve`, and a client that trusts it.
async fn tls_upstream<F, Fut>(serve: F) -> (SocketAddr, UpstreamClient, Arc<AtomicUsize>)
where
    F: Fn(tokio_rustls::server::TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (acceptor, client) = tls_pair();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    tokio::spawn(serve_tls(listener, acceptor, accepted.clone(), serve));
    (address, client, accepted)
}

/// A TLS acceptor for `upstream`, and a client that trusts it.
fn tls_pair() -> (tokio_rustls::TlsAcceptor, UpstreamClient) {
    let dir = waycast_mock::fixtures::temp_dir("http1-tls");
    let authority = waycast_mock::pki::Authority::generate(&dir, "ca").unwrap();
    let server = authority
        .issue(&dir, "upstream", "upstream", &[], &["upstream".into()], waycast_mock::pki::Usage::Server)
        .unwrap();
    let acceptor =
        tokio_rustls::TlsAcceptor::from(waycast_mock::pki::server_tls(&server.cert, &server.key, None).unwrap());
    let trusted = waycast_crds::config::ClientTlsConfig {
        ca_pem: Some(std::fs::read_to_string(&authority.files.cert).unwrap()),
        server_name: Some("upstream".into()),
        ..Default::default()
    };
    let client = crate::upstream::client(Duration::from_secs(2), &Arc::default(), Some(&trusted)).unwrap();
    (acceptor, client)
}

/// Accepts TLS connections on `listener`, counting them, and serves each.
async fn serve_tls<F, Fut>(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    accepted: Arc<AtomicUsize>,
    serve: F,
) where
    F: Fn(tokio_rustls::server::TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    while let Ok((socket, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::SeqCst);
        socket.set_nodelay(true).unwrap();
        let (acceptor, serve) = (acceptor.clone(), serve.clone());
        tokio::spawn(async move {
            if let Ok(stream) = acceptor.accept(socket).await {
                serve(stream).await;
            }
        });
    }
}

fn tls_post(address: SocketAddr) -> UpstreamRequest {
    let authority = address.to_string().parse().unwrap();
    let mut head = UpstreamRequest::build(&Method::POST, true, authority, "/v1/chat/completions", Bytes::new());
    head.header(&http::header::HOST, &HeaderValue::from_static("upstream"));
    head.finish()
}

/// The TLS records `plaintext` becomes on `stream`'s connection, not yet sent.
fn sealed(stream: &mut tokio_rustls::server::TlsStream<TcpStream>, plaintext: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let (_, connection) = stream.get_mut();
    connection.writer().write_all(plaintext).unwrap();
    let mut records = Vec::new();
    while connection.wants_write() {
        connection.write_tls(&mut records).unwrap();
    }
    records
}

/// Stray plaintext sealed in the same TLS record as the answer, which the
/// head's read takes exactly: rustls holds it decrypted while the
/// connection idles, out of sight of the socket. The connection is not
/// reused.
#[tokio::test]
async fn stray_plaintext_rustls_holds_closes_the_connection() {
    const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY";
    let (address, client, accepted) = tls_upstream(|mut stream| async move {
        while read_request(&mut stream).await.is_some() {
            // The head's first read takes 2,048 bytes: an answer of
            // exactly that many leaves the stray bytes decrypted in rustls.
            let prefix = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-pad: ";
            let pad = 2048 - prefix.len() - b"\r\n\r\nworld".len();
            let answer = [prefix.as_slice(), &vec![b'p'; pad], b"\r\n\r\nworld"].concat();
            assert_eq!(answer.len(), 2048);
            let records = sealed(&mut stream, &[answer.as_slice(), STRAY].concat());
            stream.get_mut().0.write_all(&records).await.unwrap();
        }
    })
    .await;
    for _ in 0..3 {
        let response = client.request(tls_post(address)).await.unwrap();
        assert_eq!(body_of(response).await.unwrap(), "world");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "a connection with decrypted stray bytes was reused");
}

/// Half of a stray TLS record arrives while the connection idles: rustls
/// takes it in and cannot decrypt it yet, so neither rustls nor the socket
/// shows a byte; below rustls, the record framing does. The connection is
/// not reused (had it been, the rest of the record, sent once the next
/// request arrived, would have been taken for its answer).
#[tokio::test]
async fn part_of_a_stray_record_closes_the_connection() {
    const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY";
    let (address, client, accepted) = tls_upstream(|mut stream| async move {
        let mut held_back: Option<Vec<u8>> = None;
        while read_request(&mut stream).await.is_some() {
            if let Some(rest) = held_back.take() {
                stream.get_mut().0.write_all(&rest).await.unwrap();
            }
            stream.write_all(LENGTH).await.unwrap();
            stream.flush().await.unwrap();
            let records = sealed(&mut stream, STRAY);
            let half = records.len() / 2;
            stream.get_mut().0.write_all(&records[..half]).await.unwrap();
            held_back = Some(records[half..].to_vec());
        }
    })
    .await;
    for _ in 0..3 {
        let response = client.request(tls_post(address)).await.unwrap();
        assert_eq!(body_of(response).await.unwrap(), "world");
        // The half record arrives, and a sweep or take reads it into rustls.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "a connection holding part of a record was reused");
}

/// A stray record that reaches the socket while the client's runtime is
/// not running (so its reactor has not marked the socket readable, and a
/// read through rustls sees nothing): only the look at the socket itself
/// finds it. The connection is not reused.
#[test]
fn a_stray_record_the_reactor_has_not_seen_closes_the_connection() {
    const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY";
    let (acceptor, client) = tls_pair();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (stray_sent, stray_arrived) = std::sync::mpsc::channel::<()>();
    let counter = accepted.clone();
    // The upstream runs on a thread and runtime of its own.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            serve_tls(listener, acceptor, counter, move |mut stream| {
                let stray_sent = stray_sent.clone();
                async move {
                    while read_request(&mut stream).await.is_some() {
                        stream.write_all(LENGTH).await.unwrap();
                        stream.flush().await.unwrap();
                        // Once the client has read the answer (and so
                        // pooled the connection), one more record.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let records = sealed(&mut stream, STRAY);
                        stream.get_mut().0.write_all(&records).await.unwrap();
                        let _ = stray_sent.send(());
                    }
                }
            })
            .await;
        });
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let response = runtime.block_on(client.request(tls_post(address))).unwrap();
    assert_eq!(runtime.block_on(body_of(response)).unwrap(), "world");
    // Blocked outside the runtime: its reactor does not run while the
    // stray record arrives.
    stray_arrived.recv_timeout(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let response = runtime.block_on(client.request(tls_post(address))).unwrap();
    assert_eq!(runtime.block_on(body_of(response)).unwrap(), "world");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a connection with a stray record on its socket was reused");
}

/// A request body's rest as a source gives it: these chunks, then an end
/// (or an error, as the client's body breaking off).
struct Chunks(std::collections::VecDeque<Result<&'static [u8], &'static str>>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = super::super::body_rest::SourceError;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| match chunk {
            Ok(data) => Ok(Frame::data(Bytes::from_static(data))),
            Err(why) => Err(why.into()),
        }))
    }
}

fn rest(length: u64, chunks: Vec<Result<&'static [u8], &'static str>>) -> BodyRest {
    BodyRest::new(length, Box::pin(Chunks(chunks.into())))
}

fn post_with_rest(address: SocketAddr, body: &'static [u8], rest: &BodyRest) -> UpstreamRequest {
    let authority = address.to_string().parse().unwrap();
    let mut head = UpstreamRequest::build(&Method::POST, false, authority, "/v1/audio", Bytes::from_static(body));
    head.header(&http::header::HOST, &HeaderValue::from_static("upstream"));
    head.with_rest(rest.clone());
    head.finish()
}

/// An upstream that hands each request it reads whole to the test and
/// answers it.
async fn recording() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some(request) = read_request(&mut socket).await {
                    let _ = seen.send(request);
                    if socket.write_all(LENGTH).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (address, requests)
}

/// The rest follows the request's own bytes as its source gives it, under
/// one `Content-Length` for both, on a connection of its own.
#[tokio::test]
async fn a_streamed_rest_follows_the_body_under_one_length() {
    let (address, mut requests) = recording().await;
    let client = client();
    // A pooled connection is there; the streamed request does not take it.
    assert_eq!(body_of(client.request(post(address, b"{}")).await.unwrap()).await.unwrap(), "world");
    let _ = requests.recv().await.unwrap();
    let streamed = rest(5, vec![Ok(b"CDE"), Ok(b""), Ok(b"FG")]);
    let response = client.request(post_with_rest(address, b"AB", &streamed)).await.unwrap();
    assert_eq!(body_of(response).await.unwrap(), "world");
    let request = String::from_utf8(requests.recv().await.unwrap()).unwrap();
    assert!(request.contains("content-length: 7\r\n"), "{request}");
    assert!(request.ends_with("\r\n\r\nABCDEFG"), "{request}");
    assert!(streamed.is_begun());
    assert_eq!(Pool::idle_connections(), 2, "the pooled connection was left in the pool, and the new one joined it");
}

/// A rest is sent once, at its declared length, or the request fails
/// with the source's own error; a connection it failed on is never used
/// again.
#[tokio::test]
async fn a_rest_is_sent_once_at_its_length_or_the_request_fails() {
    // A rest sent short would leave the upstream waiting for the rest:
    // bounded, so that such a fault fails here rather than hangs.
    tokio::time::timeout(Duration::from_secs(10), sent_once_at_its_length()).await.expect("no request hangs");
}

async fn sent_once_at_its_length() {
    let (address, _requests) = recording().await;
    let client = client();
    let sent = rest(2, vec![Ok(b"CD")]);
    client.request(post_with_rest(address, b"AB", &sent)).await.unwrap();
    let again = client.request(post_with_rest(address, b"AB", &sent)).await.err().unwrap();
    assert!(matches!(again, UpstreamError::RequestBody(RestError::Begun)), "{again:?}");
    let longer = rest(2, vec![Ok(b"CD"), Ok(b"E")]);
    let error = client.request(post_with_rest(address, b"AB", &longer)).await.err().unwrap();
    assert!(matches!(error, UpstreamError::RequestBody(RestError::Length("more", 2))), "{error:?}");
    let shorter = rest(3, vec![Ok(b"CD")]);
    let error = client.request(post_with_rest(address, b"AB", &shorter)).await.err().unwrap();
    assert!(matches!(error, UpstreamError::RequestBody(RestError::Length("fewer", 3))), "{error:?}");
    let broken = rest(4, vec![Ok(b"CD"), Err("the client went away")]);
    let error = client.request(post_with_rest(address, b"AB", &broken)).await.err().unwrap();
    match error {
        UpstreamError::RequestBody(RestError::Source(source)) => assert_eq!(source.to_string(), "the client went away"),
        other => panic!("{other:?}"),
    }
    // Never taken for a connect failure, which another backend may retry.
    assert!(!UpstreamError::RequestBody(RestError::Begun).is_connect());
}
