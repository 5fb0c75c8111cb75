//! `waycast-bench serve`: a REST API that starts runs and returns their
//! results as JSON, a small web page over it, and the sink's routes — one
//! process to try a gateway with.
//!
//! | route | |
//! |---|---|
//! | `POST /runs` | body: a [`Scenario`] as JSON → `202 {"id": N, "status": "running"}`; `400` with a message when invalid |
//! | `GET /runs` | every run, newest first |
//! | `GET /runs/{id}` | `{"id", "status": "running" \| "done" \| "failed", "scenario", "result"?, "error"?}` |
//! | `GET /` | the web page |
//! | `/v1/...` | the sink |

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use crate::sink::{Sink, SinkBody, SinkOptions, json, not_found, serve_with};
use crate::{RunResult, Scenario, source};

const PAGE: &str = include_str!("page.html");

/// A run and, once it ended, how.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Its number.
    pub id: u64,
    /// `running`, `done` or `failed`.
    pub status: &'static str,
    /// What was asked.
    pub scenario: Scenario,
    /// The figures, when done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<RunResult>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The server's state.
pub struct BenchServer {
    sink: Sink,
    runs: Mutex<Vec<RunRecord>>,
}

impl BenchServer {
    /// A server whose sink answers with `options` by default.
    pub fn new(options: SinkOptions) -> Arc<Self> {
        Arc::new(Self { sink: Sink::new(options), runs: Mutex::new(Vec::new()) })
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<SinkBody> {
        let path = request.uri().path().to_owned();
        match (request.method().clone(), path.as_str()) {
            (Method::GET, "/") => {
                let mut response = Response::new(Full::new(Bytes::from_static(PAGE.as_bytes())).boxed());
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/html; charset=utf-8"));
                response
            }
            (Method::POST, "/runs") => self.start_run(request).await,
            (Method::GET, "/runs") => {
                let runs = self.runs.lock().await;
                let newest_first: Vec<&RunRecord> = runs.iter().rev().collect();
                to_json(StatusCode::OK, &newest_first)
            }
            (Method::GET, p) if p.starts_with("/runs/") => {
                let id = p.trim_start_matches("/runs/").parse::<u64>().ok();
                let runs = self.runs.lock().await;
                match id.and_then(|id| runs.iter().find(|r| r.id == id)) {
                    Some(run) => to_json(StatusCode::OK, run),
                    None => error(StatusCode::NOT_FOUND, "no such run"),
                }
            }
            _ => self.sink.handle(request).await.unwrap_or_else(not_found),
        }
    }

    async fn start_run(self: Arc<Self>, request: Request<Incoming>) -> Response<SinkBody> {
        let body = match Limited::new(request.into_body(), 64 * 1024).collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => return error(StatusCode::PAYLOAD_TOO_LARGE, "the scenario must be at most 64 KiB"),
        };
        let scenario: Scenario = match serde_json::from_slice(&body) {
            Ok(scenario) => scenario,
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid scenario: {e}")),
        };
        if let Err(problem) = scenario.validate() {
            return error(StatusCode::BAD_REQUEST, &format!("invalid scenario: {problem}"));
        }
        let id = {
            let mut runs = self.runs.lock().await;
            let id = runs.last().map_or(1, |r| r.id + 1);
            runs.push(RunRecord { id, status: "running", scenario: scenario.clone(), result: None, error: None });
            id
        };
        let server = self.clone();
        tokio::spawn(async move {
            let outcome = source::run(scenario).await;
            let mut runs = server.runs.lock().await;
            if let Some(run) = runs.iter_mut().find(|r| r.id == id) {
                match outcome {
                    Ok(result) => (run.status, run.result) = ("done", Some(result)),
                    Err(problem) => (run.status, run.error) = ("failed", Some(problem)),
                }
            }
        });
        to_json(StatusCode::ACCEPTED, &serde_json::json!({"id": id, "status": "running"}))
    }
}

fn to_json(status: StatusCode, value: &impl Serialize) -> Response<SinkBody> {
    match serde_json::to_vec(value) {
        Ok(bytes) => json(status, Bytes::from(bytes)),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the answer"),
    }
}

fn error(status: StatusCode, message: &str) -> Response<SinkBody> {
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}});
    json(status, Bytes::from(body.to_string()))
}

/// Serves the bench server on `listen` until the task is dropped; returns
/// the bound address once listening.
///
/// # Errors
/// The address cannot be bound.
pub async fn start(listen: SocketAddr, options: SinkOptions) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let address = listener.local_addr()?;
    let server = BenchServer::new(options);
    tokio::spawn(serve_with(listener, move |request| server.clone().handle(request)));
    Ok(address)
}
