//! The client against real HTTP/1.1 servers that are not hyper: uvicorn
//! with h11 (PyPI) serving `gateway/tests/upstream_app.py`, and nginx
//! (Debian) serving its own answers, a file, and uvicorn's streams
//! through its proxy. Each runs as its own process on loopback.
//!
//! ```text
//! UpstreamClient ──► uvicorn (h11) ── /length, /chunked, /sse, /close
//! UpstreamClient ──► nginx ── return, static file (sendfile), /up/ ─► uvicorn (proxy_buffering off)
//! ```
//!
//! Checked: bodies with `Content-Length`, chunked, and server-sent events
//! delivered as they are sent (not at the end); a whole keep-alive
//! sequence on one connection (each answer names the client's port in
//! `x-peer`); `Connection: close` honoured by taking a new one.
//!
//! The servers come from `gateway/tests/upstream-servers.sh`
//! (`make upstream-servers`, a prerequisite of `make test`). Without them
//! the tests say loudly that they were skipped — unless run by `make test`
//! (`WAYCAST_REQUIRE_UPSTREAM_SERVERS=1`) or CI (`CI=true`), where they fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;

use super::*;

/// The installed servers.
struct Servers {
    nginx: PathBuf,
    python: PathBuf,
}

/// Whether a missing server fails the test instead of skipping it.
fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("WAYCAST_REQUIRE_UPSTREAM_SERVERS").is_ok_and(|v| v == "1")
}

/// The servers the install script finds, or `None` (skipped, loudly) when
/// one is missing outside `make test` and CI.
fn servers(test: &str) -> Option<Servers> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream-servers.sh");
    let found = Command::new("bash").arg(&script).arg("--find").stderr(Stdio::piped()).output().unwrap();
    let stdout = String::from_utf8_lossy(&found.stdout);
    let path = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    };
    match (found.status.success(), path("nginx"), path("uvicorn_python")) {
        (true, Some(nginx), Some(python)) => Some(Servers { nginx, python }),
        _ => {
            let why = String::from_utf8_lossy(&found.stderr);
            assert!(
                !required(),
                "{test}: the upstream servers are missing ({}); run `make upstream-servers`",
                why.trim()
            );
            eprintln!(
                "\n*** SKIPPED {test}: {} — run `make upstream-servers` (under `make test` or CI this fails) ***\n",
                why.trim()
            );
            None
        }
    }
}

/// A server process, killed when dropped.
struct Process(Child, &'static str);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// Waits until `address` accepts connections (the process still alive).
    async fn ready(mut self, address: SocketAddr) -> Self {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(address).await.is_err() {
            if let Ok(Some(status)) = self.0.try_wait() {
                panic!("{} exited before listening: {status}", self.1);
            }
            assert!(Instant::now() < deadline, "{} did not listen on {address} within 30 s", self.1);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self
    }
}

fn loopback_port() -> SocketAddr {
    let ip = std::net::Ipv4Addr::LOCALHOST.into();
    SocketAddr::new(ip, waycast_mock::fixtures::free_port(ip).unwrap())
}

async fn uvicorn(servers: &Servers) -> (Process, SocketAddr) {
    let address = loopback_port();
    let app_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let child = Command::new(&servers.python)
        .args(["-m", "uvicorn", "upstream_app:app", "--http", "h11", "--lifespan", "off", "--no-access-log"])
        .args(["--log-level", "warning", "--host", "127.0.0.1", "--port", &address.port().to_string()])
        .arg("--app-dir")
        .arg(&app_dir)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    (Process(child, "uvicorn").ready(address).await, address)
}

async fn nginx(servers: &Servers, dir: &Path, uvicorn: SocketAddr) -> (Process, SocketAddr) {
    let address = loopback_port();
    std::fs::create_dir_all(dir.join("static")).unwrap();
    std::fs::write(dir.join("static/file"), pattern(300 * 1024)).unwrap();
    let d = dir.display();
    let config = format!(
        r#"daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 1000;
  server {{
    listen {address};
    add_header x-peer $remote_port always;
    location = /return {{ return 200 "{RETURNED}"; }}
    location /static/ {{ alias {d}/static/; }}
    location /up/ {{
      proxy_pass http://{uvicorn}/;
      proxy_http_version 1.1;
      proxy_buffering off;
      proxy_hide_header x-peer;
    }}
  }}
}}
"#
    );
    std::fs::write(dir.join("nginx.conf"), config).unwrap();
    let child = Command::new(&servers.nginx)
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    (Process(child, "nginx").ready(address).await, address)
}

const RETURNED: &str = "returned by nginx itself";

/// The body bytes the app sends: `(i * 7 + 13) % 256`.
fn pattern(length: usize) -> Vec<u8> {
    (0..length).map(|i| ((i * 7 + 13) % 256) as u8).collect()
}

fn client() -> UpstreamClient {
    let tls = crate::tls::client_config(None).unwrap();
    UpstreamClient::new(Duration::from_secs(5), Arc::default(), tls, None)
}

/// A POST with a small JSON body; a GET for nginx's static files (which
/// answer POST with 405).
fn request(address: SocketAddr, path: &str) -> UpstreamRequest {
    let authority = address.to_string().parse().unwrap();
    let (method, body) = if path.starts_with("/static/") {
        (Method::GET, Bytes::new())
    } else {
        (Method::POST, Bytes::from_static(b"{\"a\":1}"))
    };
    let mut head = UpstreamRequest::build(&method, false, authority, path, body);
    head.header(&http::header::HOST, &HeaderValue::from_static("upstream"));
    head.finish()
}

/// One answer: its status, `x-peer`, body, and the time between its first
/// and last body frames.
struct Answer {
    status: StatusCode,
    peer: String,
    body: Vec<u8>,
    frames: usize,
    spread: Duration,
}

async fn fetch(client: &UpstreamClient, address: SocketAddr, path: &str) -> Answer {
    let response = client.request(request(address, path)).await.unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = response.status();
    let peer = response.headers().get("x-peer").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let mut body = response.into_body();
    let (mut bytes, mut frames, mut first, mut last) = (Vec::new(), 0, None, Instant::now());
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap_or_else(|e| panic!("{path}: {e}"));
        if let Some(data) = frame.data_ref().filter(|d| !d.is_empty()) {
            bytes.extend_from_slice(data);
            frames += 1;
            last = Instant::now();
            first.get_or_insert(last);
        }
    }
    let spread = first.map_or(Duration::ZERO, |first| last - first);
    Answer { status, peer, body: bytes, frames, spread }
}

fn events(count: usize) -> Vec<u8> {
    let mut all: Vec<u8> = (0..count).flat_map(|i| format!("data: {i}\n\n").into_bytes()).collect();
    all.extend_from_slice(b"data: [DONE]\n\n");
    all
}

/// A keep-alive sequence through `prefix` (`""` to uvicorn, `/up` through
/// nginx), checked against what the app sent; returns the peer ports.
async fn sequence(client: &UpstreamClient, address: SocketAddr, prefix: &str) -> Vec<String> {
    let mut peers = Vec::new();
    for (path, expected) in [
        ("/length/0".to_owned(), Vec::new()),
        ("/length/5000".to_owned(), pattern(5000)),
        ("/chunked/70001".to_owned(), pattern(70_001)),
        ("/chunked/1".to_owned(), pattern(1)),
        ("/sse/10/30".to_owned(), events(10)),
        ("/length/3".to_owned(), pattern(3)),
    ] {
        let path = format!("{prefix}{path}");
        let answer = fetch(client, address, &path).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        assert!(answer.body == expected, "{path}: {} bytes, expected {}", answer.body.len(), expected.len());
        if path.contains("/sse/") {
            // Ten events 30 ms apart arrive as they are sent, not at the end.
            assert!(answer.frames >= 5, "{path}: the stream came in {} frames", answer.frames);
            assert!(answer.spread >= Duration::from_millis(200), "{path}: all events within {:?}", answer.spread);
        }
        peers.push(answer.peer);
    }
    peers
}

#[tokio::test]
async fn uvicorn_with_h11_serves_lengths_chunks_and_events_on_one_connection() {
    let Some(servers) = servers("uvicorn_with_h11_serves_lengths_chunks_and_events_on_one_connection") else { return };
    let (_uvicorn, address) = uvicorn(&servers).await;
    let client = client();
    let peers = sequence(&client, address, "").await;
    assert!(!peers[0].is_empty() && peers.iter().all(|p| *p == peers[0]), "one connection for all: {peers:?}");
    // `Connection: close` is honoured: the next request takes a new one.
    let closing = fetch(&client, address, "/close").await;
    assert_eq!((closing.status, closing.body.as_slice()), (StatusCode::OK, &b"close"[..]));
    assert_eq!(closing.peer, peers[0], "the close came on the kept connection");
    let after = fetch(&client, address, "/length/7").await;
    assert_eq!(after.body, pattern(7));
    assert_ne!(after.peer, closing.peer, "a connection the server closed was used again");
}

#[tokio::test]
async fn nginx_serves_its_own_answers_a_file_and_a_proxied_stream_on_one_connection() {
    let Some(servers) = servers("nginx_serves_its_own_answers_a_file_and_a_proxied_stream_on_one_connection") else {
        return;
    };
    let dir = waycast_mock::fixtures::temp_dir("http1-nginx");
    let (_uvicorn, upstream) = uvicorn(&servers).await;
    let (_nginx, address) = nginx(&servers, &dir, upstream).await;
    let client = client();
    let returned = fetch(&client, address, "/return").await;
    assert_eq!((returned.status, returned.body.as_slice()), (StatusCode::OK, RETURNED.as_bytes()));
    let file = fetch(&client, address, "/static/file").await;
    assert_eq!(file.status, StatusCode::OK);
    assert!(file.body == pattern(300 * 1024), "the file: {} bytes", file.body.len());
    let mut peers = vec![returned.peer, file.peer];
    peers.extend(sequence(&client, address, "/up").await);
    let missing = fetch(&client, address, "/static/missing").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    peers.push(missing.peer);
    assert!(!peers[0].is_empty() && peers.iter().all(|p| *p == peers[0]), "one connection for all: {peers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
