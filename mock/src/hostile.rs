//! An upstream that misbehaves on purpose, over raw TCP so it can break
//! HTTP the way a broken or hostile server does. Each request picks its
//! misbehaviour with the `x-hostile` header:
//!
//! | `x-hostile` | the response |
//! |---|---|
//! | `endless-event` | a 200 SSE stream of 2 MiB with no event end |
//! | `drip` | a 200 JSON body sent one byte every 5 ms |
//! | `huge-header` | a 200 whose one header is 1 MiB |
//! | `reset` | a 200 SSE stream cut off after its first event |
//! | `absurd-usage` | a 200 chat completion reporting 10¹⁵ tokens |
//! | `one-write` | a 200 SSE stream with a usage chunk, head and body in one write |
//!
//! Mocks only the inference upstream, as the tests may.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Starts the server on `address`; returns where it listens.
///
/// # Errors
/// The address cannot be bound.
pub async fn start(address: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    Ok(bound)
}

async fn serve(mut stream: TcpStream) {
    let Some(mode) = read_mode(&mut stream).await else { return };
    let _ = match mode.as_str() {
        "endless-event" => endless_event(&mut stream).await,
        "drip" => drip(&mut stream).await,
        "huge-header" => huge_header(&mut stream).await,
        "reset" => reset(&mut stream).await,
        "one-write" => one_write(&mut stream).await,
        _ => absurd_usage(&mut stream).await,
    };
}

/// Reads the request head and body (by Content-Length); the `x-hostile` value.
async fn read_mode(stream: &mut TcpStream) -> Option<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > 1 << 20 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
    };
    let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    }
    Some(header("x-hostile").unwrap_or_default())
}

const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

async fn chunk(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    stream.write_all(format!("{:x}\r\n", data.len()).as_bytes()).await?;
    stream.write_all(data).await?;
    stream.write_all(b"\r\n").await
}

async fn endless_event(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(SSE_HEAD).await?;
    chunk(stream, b"data: ").await?;
    let line = vec![b'x'; 1024];
    for _ in 0..2048 {
        chunk(stream, &line).await?;
    }
    stream.write_all(b"0\r\n\r\n").await
}

async fn drip(stream: &mut TcpStream) -> std::io::Result<()> {
    let body =
        br#"{"id":"d","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await?;
    for byte in body {
        stream.write_all(&[*byte]).await?;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn huge_header(stream: &mut TcpStream) -> std::io::Result<()> {
    let big = "a".repeat(1 << 20);
    let head = format!("HTTP/1.1 200 OK\r\nx-huge: {big}\r\ncontent-length: 2\r\n\r\n{{}}");
    stream.write_all(head.as_bytes()).await
}

async fn reset(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(SSE_HEAD).await?;
    chunk(stream, b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n").await?;
    stream.flush().await?;
    // Gone without the last chunk: the connection ends mid-body.
    stream.shutdown().await
}

async fn one_write(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut all = SSE_HEAD.to_vec();
    for event in [
        &br#"data: {"choices":[{"index":0,"delta":{"content":"a"}}]}"#[..],
        br#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
        b"data: [DONE]",
    ] {
        let event = [event, b"\n\n"].concat();
        all.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
        all.extend_from_slice(&event);
        all.extend_from_slice(b"\r\n");
    }
    all.extend_from_slice(b"0\r\n\r\n");
    stream.write_all(&all).await
}

async fn absurd_usage(stream: &mut TcpStream) -> std::io::Result<()> {
    let body = br#"{"id":"u","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":1000000000000000,"completion_tokens":1000000000000000}}"#;
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await
}
