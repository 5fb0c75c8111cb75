//! An upstream that tries to make a pooled connection carry one request's
//! answer to another: HTTP/1.1 with keep-alive, over TCP or TLS, written by
//! hand so it can break the framing on purpose. Each answer's body names
//! the request it answers (the `x-probe` header it came with), so a test
//! can tell whether any client got bytes meant for another; every request
//! it reads is counted per probe (executions).
//!
//! | `x-hostile` | the answer |
//! |---|---|
//! | (none) | a 200 JSON answer, `Content-Length` framed |
//! | `stray` | that, then a planted 200 answer in the same write |
//! | `stray-later` | that, then a planted 200 answer 20 ms later, while the connection idles |
//! | `framed-twice` | a 200 with both `Transfer-Encoding: chunked` and a `Content-Length` that disagrees |
//! | `close-after-request` | nothing: the connection is closed once the request is read |
//! | `endless-continue` | `100 Continue` heads, until the connection goes |
//! | `huge-head` | a 200 whose head is 70,000 bytes |
//!
//! Mocks only the inference upstream, as the tests may.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// The probe of every planted answer.
pub const PLANTED: &str = "planted";

/// A running desync upstream.
pub struct Desync {
    /// Where it listens.
    pub addr: SocketAddr,
    executions: Arc<tokio::sync::Mutex<HashMap<String, u32>>>,
}

impl Desync {
    /// How many times a request with `probe` was read.
    pub async fn executions(&self, probe: &str) -> u32 {
        self.executions.lock().await.get(probe).copied().unwrap_or(0)
    }
}

/// Starts the server on `address`, over TLS with `tls` when given.
///
/// # Errors
/// The address cannot be bound.
pub async fn start(address: SocketAddr, tls: Option<Arc<rustls::ServerConfig>>) -> std::io::Result<Desync> {
    let listener = TcpListener::bind(address).await?;
    let addr = listener.local_addr()?;
    let executions = Arc::new(tokio::sync::Mutex::new(HashMap::new()));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let counted = executions.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            // NB: without it, Nagle would hold a planted answer back until
            // the next request's ACK: it must go out before that request.
            let _ = socket.set_nodelay(true);
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                match acceptor {
                    None => serve(socket, counted).await,
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(socket).await {
                            serve(stream, counted).await;
                        }
                    }
                }
            });
        }
    });
    Ok(Desync { addr, executions })
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    executions: Arc<tokio::sync::Mutex<HashMap<String, u32>>>,
) {
    let mut buffer = Vec::new();
    while let Some((mode, probe)) = read_request(&mut stream, &mut buffer).await {
        *executions.lock().await.entry(probe.clone()).or_insert(0) += 1;
        let answered = match mode.as_str() {
            "stray" => stream.write_all(&[answer(&probe), answer(PLANTED)].concat()).await,
            "stray-later" => match stream.write_all(&answer(&probe)).await {
                Ok(()) => {
                    let _ = stream.flush().await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    stream.write_all(&answer(PLANTED)).await
                }
                error => error,
            },
            "framed-twice" => {
                let body = body(&probe);
                let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\ncontent-length: {}\r\n\r\n",
                    body.len() / 2
                );
                stream.write_all(format!("{head}{chunked}").as_bytes()).await
            }
            "close-after-request" => return,
            "endless-continue" => loop {
                if stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err() {
                    return;
                }
            },
            "huge-head" => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nx-filler: {}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}",
                    "a".repeat(70_000)
                );
                stream.write_all(head.as_bytes()).await
            }
            _ => stream.write_all(&answer(&probe)).await,
        };
        if answered.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
}

/// The JSON body naming `probe`, with usage.
fn body(probe: &str) -> String {
    format!(
        r#"{{"id":"desync","object":"chat.completion","probe":"{probe}","choices":[],"usage":{{"prompt_tokens":1,"completion_tokens":1}}}}"#
    )
}

fn answer(probe: &str) -> Vec<u8> {
    let body = body(probe);
    format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len())
        .into_bytes()
}

/// One request (head, `Content-Length` body) off `stream`: its `x-hostile`
/// and `x-probe` values; `None` when the connection ends.
async fn read_request<S: AsyncRead + Unpin>(stream: &mut S, buffer: &mut Vec<u8>) -> Option<(String, String)> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let header = |name: &str| {
                head.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
            };
            let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                let found = (header("x-hostile").unwrap_or_default(), header("x-probe").unwrap_or_default());
                buffer.drain(..end + 4 + length);
                return Some(found);
            }
        }
        if buffer.len() > 1 << 20 {
            return None;
        }
        let mut chunk = [0_u8; 4096];
        let read = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..read]);
    }
}
