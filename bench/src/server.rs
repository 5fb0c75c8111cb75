//! `waycast-bench serve`: a REST API that starts runs and returns their
//! results as JSON, a small web page over it, and the sink's routes — one
//! process to try a gateway with.
//!
//! | route | |
//! |---|---|
//! | `POST /runs` | body: a [`Scenario`] as JSON (`Content-Type: application/json`) → `202 {"id": N, "status": "running"}`; `400` with a message when invalid; `409` while another run is running (two at once would measure each other); `415` without the JSON type and `403` from a page of another origin (so no other site can start runs from a user's browser) |
//! | `DELETE /runs/{id}` | cancels a running run: its requests stop, its status becomes `cancelled` |
//! | `GET /runs` | every run kept (the last 200), newest first |
//! | `GET /runs/{id}` | `{"id", "status": "running" \| "done" \| "failed" \| "cancelled", "progress"?, "scenario", "result"?, "error"?}`; `result` is a [`Report`]; the scenario's keys are not shown |
//! | `GET /runs/{id}.json`, `GET /runs/{id}.csv` | a finished run as a file to keep ([`crate::csv`] for the columns) |
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
use tokio::task::AbortHandle;

use crate::sink::{Sink, SinkBody, SinkOptions, json, not_found, serve_with};
use crate::study::{self, Report};
use crate::{Scenario, csv};

/// Finished runs kept; older ones are forgotten.
const RUNS_KEPT: usize = 200;
/// What a run's record shows for a key.
const REDACTED: &str = "(redacted)";

const PAGE: &str = include_str!("page.html");

/// A run and, once it ended, how.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Its number.
    pub id: u64,
    /// `running`, `done`, `failed` or `cancelled`.
    pub status: &'static str,
    /// What a running run is doing now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// What was asked, keys redacted.
    pub scenario: Scenario,
    /// The figures, when done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Report>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The server's state.
pub struct BenchServer {
    sink: Sink,
    runs: Mutex<Vec<RunRecord>>,
    /// The running run's id and what stops it (locked after `runs`).
    running: Mutex<Option<(u64, AbortHandle)>>,
}

impl BenchServer {
    /// A server whose sink answers with `options` by default.
    pub fn new(options: SinkOptions) -> Arc<Self> {
        Arc::new(Self { sink: Sink::new(options), runs: Mutex::new(Vec::new()), running: Mutex::new(None) })
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
            (Method::GET, p) if p.starts_with("/runs/") => self.run_file(p.trim_start_matches("/runs/")).await,
            (Method::DELETE, p) if p.starts_with("/runs/") => self.cancel(p.trim_start_matches("/runs/")).await,
            _ => self.sink.handle(request).await.unwrap_or_else(not_found),
        }
    }

    async fn start_run(self: Arc<Self>, request: Request<Incoming>) -> Response<SinkBody> {
        let headers = request.headers();
        let json_typed = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
        if !json_typed {
            return error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "send the scenario as Content-Type: application/json");
        }
        // A browser names the page that sent a request: only this server's own may start runs.
        if let Some(origin) = headers.get(header::ORIGIN) {
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
            if origin.to_str().ok() != Some(format!("http://{host}").as_str()) {
                return error(StatusCode::FORBIDDEN, "runs start only from this server's own page");
            }
        }
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
            if let Some(running) = runs.iter().find(|r| r.status == "running") {
                let message = format!("run {} is still running: two runs at once would measure each other", running.id);
                return error(StatusCode::CONFLICT, &message);
            }
            let id = runs.last().map_or(1, |r| r.id + 1);
            let shown = Scenario {
                key: scenario.key.as_ref().map(|_| REDACTED.to_owned()),
                baseline_key: scenario.baseline_key.as_ref().map(|_| REDACTED.to_owned()),
                ..scenario.clone()
            };
            let record =
                RunRecord { id, status: "running", progress: None, scenario: shown, result: None, error: None };
            runs.push(record);
            let excess = runs.len().saturating_sub(RUNS_KEPT);
            runs.drain(..excess);
            id
        };
        let server = self.clone();
        let task = tokio::spawn(async move {
            // Progress is for display: skipped when a reader holds the list.
            let progress = |now: String| {
                if let Ok(mut runs) = server.runs.try_lock()
                    && let Some(run) = runs.iter_mut().find(|r| r.id == id)
                {
                    run.progress = Some(now);
                }
            };
            let outcome = study::run(scenario, progress).await;
            if let Some(run) = server.runs.lock().await.iter_mut().find(|r| r.id == id) {
                run.progress = None;
                if run.status != "running" {
                    return;
                }
                match outcome {
                    Ok(result) => (run.status, run.result) = ("done", Some(result)),
                    Err(problem) => (run.status, run.error) = ("failed", Some(problem)),
                }
            }
        });
        *self.running.lock().await = Some((id, task.abort_handle()));
        to_json(StatusCode::ACCEPTED, &serde_json::json!({"id": id, "status": "running"}))
    }

    /// Stops the running run `id`.
    async fn cancel(&self, id: &str) -> Response<SinkBody> {
        let mut runs = self.runs.lock().await;
        let Some(run) = id.parse::<u64>().ok().and_then(|id| runs.iter_mut().find(|r| r.id == id)) else {
            return error(StatusCode::NOT_FOUND, "no such run");
        };
        if run.status != "running" {
            return error(StatusCode::CONFLICT, &format!("run {} is {}, not running", run.id, run.status));
        }
        let mut running = self.running.lock().await;
        let Some((_, stop)) = running.take_if(|(running, _)| *running == run.id) else {
            return error(StatusCode::CONFLICT, "the run is starting: try again");
        };
        stop.abort();
        (run.status, run.progress) = ("cancelled", None);
        to_json(StatusCode::OK, &*run)
    }

    /// `ID` (the record), `ID.json` or `ID.csv` (a finished run's report, to keep).
    async fn run_file(&self, name: &str) -> Response<SinkBody> {
        let (id, extension) = name.split_once('.').map_or((name, None), |(id, extension)| (id, Some(extension)));
        let runs = self.runs.lock().await;
        let Some(run) = id.parse::<u64>().ok().and_then(|id| runs.iter().find(|r| r.id == id)) else {
            return error(StatusCode::NOT_FOUND, "no such run");
        };
        let (content_type, bytes) = match (extension, &run.result) {
            (None, _) => return to_json(StatusCode::OK, run),
            (Some("json" | "csv"), None) => return error(StatusCode::CONFLICT, "the run has no report (yet)"),
            (Some("json"), Some(_)) => match serde_json::to_vec_pretty(run) {
                Ok(bytes) => ("application/json", bytes),
                Err(_) => return error(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the report"),
            },
            (Some("csv"), Some(report)) => ("text/csv; charset=utf-8", csv::report(report).into_bytes()),
            (Some(_), _) => return error(StatusCode::NOT_FOUND, "a run is there as ID, ID.json or ID.csv"),
        };
        let mut response = json(StatusCode::OK, Bytes::from(bytes));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
        if let Ok(disposition) = http::HeaderValue::from_str(&format!(
            "attachment; filename=\"waycast-bench-run-{}.{}\"",
            run.id,
            extension.unwrap_or("json")
        )) {
            headers.insert(header::CONTENT_DISPOSITION, disposition);
        }
        response
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
