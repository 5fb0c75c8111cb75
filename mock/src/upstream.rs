//! A mock OpenAI-compatible inference server — the one mock the project
//! allows, standing in for vLLM, SGLang or a provider in tests and demos.
//!
//! Endpoints: `GET /v1/models`, `POST /v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/responses`, `/v1/messages`
//! (streaming with `"stream": true`), `GET /_mock/requests` (what it
//! received, as JSON) and `PUT /_mock/status/S` (answer every later request
//! with status S, as a broken or overloaded server does, until
//! `PUT /_mock/status/0`). With [`MockOptions::tls`] it serves HTTPS.
//! Behaviour per request, through headers (which a gateway forwards):
//!
//! | header | effect |
//! |---|---|
//! | `x-mock-delay-ms: N` | wait N ms before answering |
//! | `x-mock-chunks: N` | N content chunks in a stream (default from options) |
//! | `x-mock-interval-ms: N` | N ms between stream chunks |
//! | `x-mock-status: S` | answer with status S and an OpenAI error body |
//! | `x-mock-html: true` | with `x-mock-status`: an HTML error page instead (as a proxy sends) |
//! | `x-mock-stall: headers` / `body` / `usage` | never answer / stop after the first chunk (with `x-mock-chunked`, the first half of the body) / after the content chunks (no usage, no end) |
//! | `x-mock-chunked: true` | send a non-streaming body with chunked encoding |
//! | `x-mock-burn-ms: N` | spin the CPU for N ms first (autoscaling tests) |
//! | `x-mock-tool-arguments: TEXT` | a whole chat answer's tool call carries TEXT as its arguments (a broken model's) |
//! | `x-mock-error-bytes: N` | with `x-mock-status`: the error's message padded to make a body of about N bytes (≤ 16 MiB) |
//! | `x-mock-event-bytes: N` | a stream's first event (after the role's) padded to about N bytes of content (≤ 16 MiB) |
//!
//! A request offering `tools` is answered with a call of the first one
//! (`crate::tools`) unless its last message is a tool's result.
//!
//! Every answer carries `x-mock-pod: <host name>:<port>` (which pod served).
//!
//! Usage is reported as OpenAI (`prompt_tokens`/`completion_tokens`, in the
//! last chunk when `stream_options.include_usage` is set), the Responses API
//! and Anthropic (`input_tokens`/`output_tokens`) do: prompt tokens are the
//! body length / 4, completion tokens the chunk count.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc};

use crate::openai::{Kind, Usage, complete_body, stream_events};

/// Defaults for requests that do not override them.
#[derive(Debug, Clone)]
pub struct MockOptions {
    /// Wait before answering.
    pub delay: Duration,
    /// Content chunks per stream.
    pub chunks: usize,
    /// Wait between stream chunks.
    pub interval: Duration,
    /// CPU time to burn per request.
    pub burn: Duration,
    /// Behave like a vLLM server (slots, a queue, prefill, a prefix cache,
    /// `/metrics`): see `vllm.rs`.
    pub vllm: Option<Arc<crate::vllm::Engine>>,
    /// Serve HTTPS with this configuration (`crate::pki::server_tls`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Non-zero: every request is answered with this status (set over
    /// `PUT /_mock/status/S`), so one pod of a Service can be broken and
    /// mended from outside while it stays ready.
    pub forced_status: Arc<AtomicU16>,
    /// The tool a request offering it is answered with a call of (else
    /// the first offered): a harmless one for real agents (Claude Code's
    /// `Glob`).
    pub preferred_tool: Option<String>,
}

impl Default for MockOptions {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            chunks: 5,
            interval: Duration::from_millis(1),
            burn: Duration::ZERO,
            vllm: None,
            tls: None,
            forced_status: Arc::default(),
            preferred_tool: None,
        }
    }
}

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Received {
    /// The body as JSON (Null if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// What the mock saw, for assertions.
#[derive(Debug, Default)]
pub struct Recorder {
    requests: Mutex<Vec<Received>>,
    /// Streams whose every chunk was taken by the client.
    pub streams_completed: AtomicU64,
    /// Streams the client (or gateway) stopped reading: the connection closed.
    pub streams_cancelled: AtomicU64,
    /// TCP connections accepted.
    pub connections: AtomicU64,
}

impl Recorder {
    /// Every request so far.
    pub async fn requests(&self) -> Vec<Received> {
        self.requests.lock().await.clone()
    }

    /// The most recent request.
    pub async fn last(&self) -> Option<Received> {
        self.requests.lock().await.last().cloned()
    }
}

/// A running mock.
pub struct MockUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it saw.
    pub recorder: Arc<Recorder>,
    task: tokio::task::JoinHandle<()>,
}

impl MockUpstream {
    /// `http://<addr>/v1`, the base URL to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn termination() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Starts a mock on `listen` (use port 0 in tests).
///
/// # Errors
/// Binding failing.
pub async fn start(listen: SocketAddr, options: MockOptions) -> std::io::Result<MockUpstream> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let recorder = Arc::new(Recorder::default());
    let task = tokio::spawn(serve(listener, Arc::new(options), recorder.clone()));
    Ok(MockUpstream { addr, recorder, task })
}

/// The header every answer carries with the mock's identity (host name —
/// a pod's name — and port), so a test sees which pod served.
pub const POD_HEADER: &str = "x-mock-pod";

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, options: Arc<MockOptions>, recorder: Arc<Recorder>) {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let port = listener.local_addr().map(|address| address.port()).unwrap_or_default();
    let identity = header::HeaderValue::from_str(&format!("{}:{port}", host.trim()))
        .unwrap_or_else(|_| header::HeaderValue::from_static("mock"));
    let acceptor = options.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        recorder.connections.fetch_add(1, Ordering::Relaxed);
        let options = options.clone();
        let recorder = recorder.clone();
        let identity = identity.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let answer = respond(request, options.clone(), recorder.clone());
                let identity = identity.clone();
                async move {
                    let mut response = answer.await?;
                    response.headers_mut().insert(POD_HEADER, identity);
                    Ok::<_, Infallible>(response)
                }
            });
            let server = auto::Builder::new(TokioExecutor::new());
            match acceptor {
                None => drop(server.serve_connection(TokioIo::new(stream), service).await),
                Some(acceptor) => {
                    // A failed handshake (an untrusted client) ends the connection.
                    if let Ok(tls) = acceptor.accept(stream).await {
                        drop(server.serve_connection(TokioIo::new(tls), service).await);
                    }
                }
            }
        });
    }
}

fn header_number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

async fn respond(
    request: Request<Incoming>,
    options: Arc<MockOptions>,
    recorder: Arc<Recorder>,
) -> Result<Response<MockBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let received =
        Received { method: parts.method.to_string(), path: path.clone(), headers: parts.headers.clone(), body };
    if parts.uri.path() == "/_mock/requests" {
        let listed: Vec<Value> = recorder
            .requests()
            .await
            .iter()
            .map(|r| {
                let headers: serde_json::Map<String, Value> = r
                    .headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), Value::from(v.to_str().unwrap_or_default())))
                    .collect();
                json!({"method": r.method, "path": r.path, "headers": headers, "body": String::from_utf8_lossy(&r.body)})
            })
            .collect();
        return Ok(json_response(StatusCode::OK, &Value::from(listed)));
    }
    if let Some(engine) = &options.vllm
        && parts.uri.path() == "/metrics"
    {
        let mut response = Response::new(MockBody::Full(Some(Bytes::from(engine.metrics()))));
        response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain"));
        return Ok(response);
    }
    if parts.method == http::Method::PUT
        && let Some(status) = parts.uri.path().strip_prefix("/_mock/status/")
    {
        return Ok(match status.parse::<u16>() {
            Ok(status) if status == 0 || StatusCode::from_u16(status).is_ok() => {
                options.forced_status.store(status, Ordering::Relaxed);
                json_response(StatusCode::OK, &json!({"status": status}))
            }
            _ => json_response(StatusCode::BAD_REQUEST, &json!({"error": {"message": "not a status code"}})),
        });
    }
    recorder.requests.lock().await.push(received.clone());
    let forced = options.forced_status.load(Ordering::Relaxed);
    if forced != 0 {
        let status = StatusCode::from_u16(forced).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let error = json!({"error": {"message": "set by PUT /_mock/status", "type": "mock_error", "param": null, "code": "mock"}});
        return Ok(json_response(status, &error));
    }
    let headers = &received.headers;
    // vLLM-like: wait for a slot (held until the response ends), then prefill.
    let slot = match &options.vllm {
        Some(engine) => {
            let slot = engine.admit().await;
            tokio::time::sleep(engine.prefill(&received.body).await).await;
            slot
        }
        None => None,
    };

    let burn = header_number(headers, "x-mock-burn-ms").map_or(options.burn, Duration::from_millis);
    let burn_until = std::time::Instant::now() + burn;
    while std::time::Instant::now() < burn_until {
        std::hint::spin_loop();
    }
    let delay = header_number(headers, "x-mock-delay-ms").map_or(options.delay, Duration::from_millis);
    let stall = headers.get("x-mock-stall").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    if stall == "headers" {
        std::future::pending::<()>().await;
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = header_number(headers, "x-mock-status").and_then(|s| u16::try_from(s).ok()) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if headers.contains_key("x-mock-html") {
            let page = Bytes::from_static(b"<html><body>502 Bad Gateway</body></html>");
            let mut page = Response::new(MockBody::Full(Some(page)));
            *page.status_mut() = status;
            page.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/html"));
            return Ok(page);
        }
        let padding = header_number(headers, "x-mock-error-bytes").map_or(0, |n| n.min(MAX_PADDING) as usize);
        let message = format!("injected by x-mock-status{}", "x".repeat(padding));
        let error = json!({"error": {"message": message, "type": "mock_error", "param": null, "code": "mock"}});
        return Ok(json_response(status, &error));
    }
    let request_json = received.json();
    let model = request_json["model"].as_str().unwrap_or("mock-model").to_owned();
    let mut chunks = header_number(headers, "x-mock-chunks").map_or(options.chunks, |n| n as usize);
    let mut interval = header_number(headers, "x-mock-interval-ms").map_or(options.interval, Duration::from_millis);
    if let Some(engine) = &options.vllm {
        // One chunk per output token, as many as the request asked for.
        chunks = request_json["max_tokens"].as_u64().map_or(chunks, |n| usize::try_from(n).unwrap_or(chunks));
        interval = engine.options.token_time;
    }
    let prompt_tokens = (received.body.len() / 4) as u64;
    let completion_tokens = chunks as u64;
    let stream = request_json["stream"].as_bool() == Some(true);
    let include_usage = request_json["stream_options"]["include_usage"].as_bool() == Some(true);
    if parts.uri.path() == "/v1/audio/speech" {
        let mut audio = Response::new(MockBody::Full(Some(Bytes::from_static(crate::beside_chat::SPEECH))));
        audio.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("audio/mpeg"));
        return Ok(audio);
    }
    if let Some(body) = crate::beside_chat::answer(parts.uri.path(), &model, prompt_tokens) {
        return Ok(json_response(StatusCode::OK, &body));
    }
    let kind = match parts.uri.path() {
        "/v1/models" => {
            return Ok(json_response(
                StatusCode::OK,
                &json!({"object": "list", "data": [{"id": "mock-model", "object": "model", "created": 0, "owned_by": "mock"}]}),
            ));
        }
        "/v1/chat/completions" => Kind::Chat,
        "/v1/completions" => Kind::Completion,
        "/v1/embeddings" => Kind::Embedding,
        "/v1/responses" => Kind::Responses,
        "/v1/messages" => Kind::Messages,
        _ => {
            let error = json!({"error": {"message": "no such path", "type": "invalid_request_error", "param": null, "code": "unknown_url"}});
            return Ok(json_response(StatusCode::NOT_FOUND, &error));
        }
    };
    let usage = Usage { prompt: prompt_tokens, completion: completion_tokens };
    let mut tool_call = crate::tools::call_for(&request_json, kind, options.preferred_tool.as_deref());
    if let Some(call) = &mut tool_call {
        call.raw_arguments = headers.get("x-mock-tool-arguments").and_then(|v| v.to_str().ok()).map(str::to_owned);
    }
    if stream && kind != Kind::Embedding {
        let mut events = match &tool_call {
            Some(call) => call.stream_events(kind, &model, usage, include_usage),
            None => stream_events(kind, &model, chunks, usage, include_usage),
        };
        if let Some(size) = header_number(headers, "x-mock-event-bytes") {
            // One long chunk of content after the role's (a runaway server's).
            let content = "x".repeat(size.min(MAX_PADDING) as usize);
            let chunk = json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]});
            events.insert(1.min(events.len()), Bytes::from(format!("data: {chunk}\n\n")));
        }
        let stall_after = match stall.as_str() {
            "body" => Some(1),
            "usage" => Some(chunks),
            _ => None,
        };
        return Ok(stream_response(events, interval, stall_after, recorder, slot));
    }
    if slot.is_some() {
        // The whole generation, then the answer; the slot is held meanwhile.
        tokio::time::sleep(interval.saturating_mul(u32::try_from(chunks).unwrap_or(u32::MAX))).await;
        drop(slot);
    }
    let body = match &tool_call {
        Some(call) => call.complete_body(kind, &model, usage),
        None => complete_body(kind, &model, chunks, usage),
    };
    if headers.get("x-mock-chunked").is_some_and(|v| v == "true") {
        // Two frames and no Content-Length: hyper sends it chunked.
        let text = body.to_string();
        let (first, second) = text.split_at(text.len() / 2);
        let events = vec![Bytes::from(first.to_owned()), Bytes::from(second.to_owned())];
        // `x-mock-stall: body`: the first half, then nothing (a client may
        // leave during the body).
        let stall_after = (stall == "body").then_some(1);
        let mut response = stream_response(events, Duration::ZERO, stall_after, recorder, None);
        response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
        return Ok(response);
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// The most padding `x-mock-error-bytes` and `x-mock-event-bytes` add.
const MAX_PADDING: u64 = 16 << 20;

fn json_response(status: StatusCode, body: &Value) -> Response<MockBody> {
    let mut response = Response::new(MockBody::Full(Some(Bytes::from(body.to_string()))));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

fn stream_response(
    events: Vec<Bytes>,
    interval: Duration,
    stall_after: Option<usize>,
    recorder: Arc<Recorder>,
    slot: Option<crate::vllm::Slot>,
) -> Response<MockBody> {
    let (sender, receiver) = mpsc::channel(1);
    tokio::spawn(async move {
        // Held until the stream ends, however it ends.
        let _slot = slot;
        for (index, event) in events.into_iter().enumerate() {
            if index > 0 {
                if stall_after == Some(index) {
                    // Keep the stream open without sending: the reader must
                    // time out (or disconnect) on its own.
                    sender.closed().await;
                    recorder.streams_cancelled.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                if !interval.is_zero() {
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        () = sender.closed() => {
                            recorder.streams_cancelled.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            }
            if sender.send(event).await.is_err() {
                recorder.streams_cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        recorder.streams_completed.fetch_add(1, Ordering::Relaxed);
    });
    let mut response = Response::new(MockBody::Channel(receiver));
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    response
}

/// The mock's response bodies.
pub enum MockBody {
    /// A whole body.
    Full(Option<Bytes>),
    /// Frames as a producer task sends them.
    Channel(mpsc::Receiver<Bytes>),
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            MockBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            MockBody::Channel(receiver) => receiver.poll_recv(cx).map(|event| event.map(|e| Ok(Frame::data(e)))),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            MockBody::Full(Some(data)) => SizeHint::with_exact(data.len() as u64),
            MockBody::Full(None) => SizeHint::with_exact(0),
            MockBody::Channel(_) => SizeHint::default(),
        }
    }
}
