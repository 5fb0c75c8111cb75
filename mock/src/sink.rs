//! The sink: a lean OpenAI-compatible upstream with canned answers, so that
//! a benchmark measures the gateway, not the upstream (`waycast-bench sink`
//! serves it alone; the functional mock with its test behaviours is
//! `upstream.rs`).
//!
//! `GET /v1/models` advertises [`BENCH_MODEL`]; `POST /v1/chat/completions`,
//! `/v1/responses` and `/v1/messages` answer after a wait, as one JSON body
//! or (`"stream": true`) as server-sent events, a number of chunks apart.
//! The wait, chunk count and interval come from the request's `x-bench-*`
//! headers, else from [`SinkOptions`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use serde::{Deserialize, Serialize};

/// The model the sink advertises and the scenarios ask for.
pub const BENCH_MODEL: &str = "benchmark-model";
/// Per-request wait before the sink answers, in milliseconds.
pub const WAIT_HEADER: &str = "x-bench-wait-ms";
/// Per-request number of stream chunks.
pub const CHUNKS_HEADER: &str = "x-bench-chunks";
/// Per-request pause between stream chunks, in milliseconds.
pub const INTERVAL_HEADER: &str = "x-bench-chunk-interval-ms";

/// The API a scenario's requests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum Workload {
    /// `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages` (Anthropic-style).
    Messages,
}

impl Workload {
    /// `chat`, `responses` or `messages`, as in JSON.
    ///
    /// # Errors
    /// Any other text.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_value(serde_json::Value::String(text.to_owned()))
            .map_err(|_| format!("unknown workload {text:?}: chat, responses or messages"))
    }

    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Responses => "/v1/responses",
            Self::Messages => "/v1/messages",
        }
    }
}

/// Answers for requests that do not say otherwise.
#[derive(Debug, Clone, Copy)]
pub struct SinkOptions {
    /// Wait before answering.
    pub wait: Duration,
    /// Chunks per stream.
    pub chunks: u32,
    /// Pause between stream chunks.
    pub interval: Duration,
}

impl Default for SinkOptions {
    fn default() -> Self {
        Self { wait: Duration::ZERO, chunks: 20, interval: Duration::ZERO }
    }
}

/// The response body type of the sink (and of the bench server it is part of).
pub type SinkBody = BoxBody<Bytes, Infallible>;

/// Canned bytes, built once.
struct Canned {
    models: Bytes,
    chat: Bytes,
    responses: Bytes,
    messages: Bytes,
}

impl Canned {
    fn new() -> Self {
        let usage = r#""usage":{"prompt_tokens":16,"completion_tokens":20,"total_tokens":36}"#;
        Self {
            models: Bytes::from(format!(
                r#"{{"object":"list","data":[{{"id":"{BENCH_MODEL}","object":"model","created":0,"owned_by":"waycast-bench"}}]}}"#
            )),
            chat: Bytes::from(format!(
                r#"{{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"{BENCH_MODEL}","choices":[{{"index":0,"message":{{"role":"assistant","content":"benchmark answer"}},"finish_reason":"stop"}}],{usage}}}"#
            )),
            responses: Bytes::from(format!(
                r#"{{"id":"resp-bench","object":"response","created_at":0,"model":"{BENCH_MODEL}","status":"completed","output":[{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"benchmark answer"}}]}}],"usage":{{"input_tokens":16,"output_tokens":20,"total_tokens":36}}}}"#
            )),
            messages: Bytes::from(format!(
                r#"{{"id":"msg-bench","type":"message","role":"assistant","model":"{BENCH_MODEL}","content":[{{"type":"text","text":"benchmark answer"}}],"stop_reason":"end_turn","usage":{{"input_tokens":16,"output_tokens":20}}}}"#
            )),
        }
    }

    fn body(&self, workload: Workload) -> Bytes {
        match workload {
            Workload::Chat => self.chat.clone(),
            Workload::Responses => self.responses.clone(),
            Workload::Messages => self.messages.clone(),
        }
    }
}

/// One stream event of `workload`; `last` carries the usage and the end marker.
fn stream_event(workload: Workload, last: bool) -> Bytes {
    let text = match (workload, last) {
        (Workload::Chat, false) => format!(
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"model\":\"{BENCH_MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok \"}}}}]}}\n\n"
        ),
        (Workload::Chat, true) => format!(
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"model\":\"{BENCH_MODEL}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":16,\"completion_tokens\":20,\"total_tokens\":36}}}}\n\ndata: [DONE]\n\n"
        ),
        (Workload::Responses, false) => {
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"tok \"}\n\n".to_owned()
        }
        (Workload::Responses, true) => format!(
            "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"id\":\"resp-bench\",\"model\":\"{BENCH_MODEL}\",\"status\":\"completed\",\"usage\":{{\"input_tokens\":16,\"output_tokens\":20,\"total_tokens\":36}}}}}}\n\n"
        ),
        (Workload::Messages, false) => "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok \"}}\n\n".to_owned(),
        (Workload::Messages, true) => "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":20}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned(),
    };
    Bytes::from(text)
}

/// The sink's request handler, shared with the bench server.
pub struct Sink {
    options: SinkOptions,
    canned: Canned,
    events: [(Bytes, Bytes); 3],
}

impl Sink {
    /// A sink answering with `options` unless a request says otherwise.
    pub fn new(options: SinkOptions) -> Self {
        let events = [Workload::Chat, Workload::Responses, Workload::Messages]
            .map(|w| (stream_event(w, false), stream_event(w, true)));
        Self { options, canned: Canned::new(), events }
    }

    /// The answer to `request`, or `None` when the path is not the sink's.
    pub async fn handle(&self, request: Request<Incoming>) -> Option<Response<SinkBody>> {
        let workload = match (request.method().as_str(), request.uri().path()) {
            ("GET", "/v1/models") => return Some(json(StatusCode::OK, self.canned.models.clone())),
            ("POST", "/v1/chat/completions") => Workload::Chat,
            ("POST", "/v1/responses") => Workload::Responses,
            ("POST", "/v1/messages") => Workload::Messages,
            _ => return None,
        };
        let headers = request.headers().clone();
        let wait = header_millis(&headers, WAIT_HEADER).unwrap_or(self.options.wait);
        let interval = header_millis(&headers, INTERVAL_HEADER).unwrap_or(self.options.interval);
        let chunks = header_number(&headers, CHUNKS_HEADER).map_or(self.options.chunks, |n| n.clamp(1, 100_000) as u32);
        let body = match request.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                return Some(json(
                    StatusCode::BAD_REQUEST,
                    Bytes::from_static(br#"{"error":{"message":"unreadable body","type":"invalid_request_error"}}"#),
                ));
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        if !asks_for_stream(&body) {
            return Some(json(StatusCode::OK, self.canned.body(workload)));
        }
        let index = match workload {
            Workload::Chat => 0,
            Workload::Responses => 1,
            Workload::Messages => 2,
        };
        let (chunk, last) = self.events[index].clone();
        let stream = futures_util::stream::unfold(0_u32, move |sent| {
            let (chunk, last) = (chunk.clone(), last.clone());
            async move {
                if sent > chunks {
                    return None;
                }
                if sent > 0 && !interval.is_zero() {
                    tokio::time::sleep(interval).await;
                }
                let data = if sent == chunks { last } else { chunk };
                Some((Ok::<_, Infallible>(Frame::data(data)), sent + 1))
            }
        });
        let mut response = Response::new(StreamBody::new(stream).boxed());
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Some(response)
    }
}

/// Whether a request body has `"stream": true` at any nesting (the canned
/// bodies this sink is sent keep it at the top level).
fn asks_for_stream(body: &[u8]) -> bool {
    let Some(at) = find(body, b"\"stream\"") else { return false };
    let rest = &body[at + 8..];
    let rest = rest.iter().position(|b| !b.is_ascii_whitespace() && *b != b':').map_or(&rest[..0], |i| &rest[i..]);
    rest.starts_with(b"true")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn header_number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

fn header_millis(headers: &HeaderMap, name: &str) -> Option<Duration> {
    header_number(headers, name).map(Duration::from_millis)
}

/// A JSON response with `body`.
pub fn json(status: StatusCode, body: Bytes) -> Response<SinkBody> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// 404 in OpenAI's error shape.
pub fn not_found() -> Response<SinkBody> {
    json(
        StatusCode::NOT_FOUND,
        Bytes::from_static(
            br#"{"error":{"message":"no such route","type":"invalid_request_error","code":"not_found"}}"#,
        ),
    )
}

/// Serves HTTP/1 and HTTP/2 on `listener` with `handler` until the task is
/// dropped (the sink alone, or the bench server).
pub async fn serve_with<H, F>(listener: TcpListener, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<SinkBody>> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let answer = handler(request);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// Serves the sink alone on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, sink: Arc<Sink>) {
    serve_with(listener, move |request| {
        let sink = sink.clone();
        async move { sink.handle(request).await.unwrap_or_else(not_found) }
    })
    .await;
}

/// Binds `listen` and serves the sink in the background; returns the bound address.
///
/// # Errors
/// The address cannot be bound.
pub async fn start(listen: SocketAddr, options: SinkOptions) -> std::io::Result<SocketAddr> {
    // A deep listen queue (clamped by net.core.somaxconn): a benchmark opens
    // a thousand upstream connections at once, and with the usual queue the
    // kernel drops SYNs and the client retries after a second, which would
    // show as the gateway's latency.
    let socket = if listen.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(listen)?;
    let listener: TcpListener = socket.listen(4096)?;
    let address = listener.local_addr()?;
    tokio::spawn(serve(listener, Arc::new(Sink::new(options))));
    Ok(address)
}
