//! `waycast-bench serve`: a REST API that starts runs and returns their
//! results as JSON, a small web page over it, and the sink's routes — one
//! process to try a gateway with.
//!
//! | route | |
//! |---|---|
//! | `POST /runs` | body: a [`Scenario`] as JSON (`Content-Type: application/json`) → `202 {"id": N, "status": "running"}`; `400` with a message when invalid; `403` for a target or baseline outside the allow-list ([`Targets`]); `409` while another run is running (two at once would measure each other); `415` without the JSON type and `403` from a page of another origin (so no other site can start runs from a user's browser) |
//! | `DELETE /runs/{id}` | cancels a running run: its requests stop, its status becomes `cancelled` |
//! | `GET /runs` | every run kept that the caller started, newest first (200 kept in all; beyond, the oldest finished run of the token with the most goes) |
//! | `GET /runs/{id}` | `{"id", "status": "running" \| "done" \| "failed" \| "cancelled", "progress"?, "scenario", "result"?, "error"?}`; `result` is a [`Report`]; the scenario's keys are not shown |
//! | `GET /runs/{id}.json`, `GET /runs/{id}.csv` | a finished run as a file to keep ([`crate::csv`] for the columns) |
//! | `GET /` | the web page (it takes the token from its URL's `#token=`) |
//! | `/v1/...` | the sink |
//!
//! Every `/runs` request, in this order: names this server (`Host`, or
//! HTTP/2's authority; none: `400`) by an IP address, `localhost` or a
//! name given with `--allowed-host` (a web page at a name made to point
//! here must not start runs: DNS rebinding; else `403`), and carries
//! `Authorization: Bearer TOKEN` with a token of [`Tokens`] (else `401`).
//! A run belongs to the token that started it: another token's runs are
//! not listed, and their ids answer `404`, as if they did not exist.

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

use crate::access::{Identity, Targets, Tokens};
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
    /// Whose run it is: the token that started it.
    #[serde(skip)]
    pub owner: Option<Identity>,
}

impl RunRecord {
    /// Whether `caller` started this run.
    fn belongs_to(&self, caller: &Identity) -> bool {
        self.owner.is_some_and(|owner| owner.same(caller))
    }
}

/// How `waycast-bench serve` is set up.
#[derive(Debug)]
pub struct ServeOptions {
    /// The sink's default answers.
    pub sink: SinkOptions,
    /// Host names besides IP addresses and `localhost` that `/runs`
    /// answers to (a Service's, an Ingress's).
    pub allowed_hosts: Vec<String>,
    /// Where runs may go.
    pub targets: Targets,
    /// The tokens `/runs` accepts.
    pub tokens: Tokens,
}

/// The server's state.
pub struct BenchServer {
    sink: Sink,
    /// Host names besides IP addresses and `localhost` that `/runs` answers
    /// to (`--allowed-host`).
    allowed_hosts: Vec<String>,
    targets: Targets,
    tokens: Tokens,
    runs: Mutex<Vec<RunRecord>>,
    /// The running run's id and what stops it (locked after `runs`).
    running: Mutex<Option<(u64, AbortHandle)>>,
}

impl BenchServer {
    /// A server set up by `options`.
    pub fn new(options: ServeOptions) -> Arc<Self> {
        let ServeOptions { sink, allowed_hosts, targets, tokens } = options;
        let (runs, running) = (Mutex::new(Vec::new()), Mutex::new(None));
        Arc::new(Self { sink: Sink::new(sink), allowed_hosts, targets, tokens, runs, running })
    }

    /// Whether a request to `/runs` came by a name this server answers
    /// to: an IP address, `localhost`, or an allowed host. A web page at a
    /// name that was made to point here (DNS rebinding) must not start
    /// runs or read them.
    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host);
        name.eq_ignore_ascii_case("localhost")
            || name.parse::<std::net::IpAddr>().is_ok()
            || self.allowed_hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(name))
    }

    /// Who may use `/runs` for `request`, or the status and message that refuse it.
    fn admit(&self, request: &Request<Incoming>) -> Result<Identity, (StatusCode, &'static str)> {
        let Some(host) = request_host(request) else {
            return Err((StatusCode::BAD_REQUEST, "a request to /runs must name this server in its Host header"));
        };
        if !self.host_allowed(&host) {
            let message = "this server answers /runs by IP address or localhost: start it with --allowed-host NAME to use another name";
            return Err((StatusCode::FORBIDDEN, message));
        }
        let message = "/runs needs Authorization: Bearer TOKEN with the token waycast-bench serve printed (or one of its --token-file)";
        self.tokens.identify(request.headers()).ok_or((StatusCode::UNAUTHORIZED, message))
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<SinkBody> {
        let path = request.uri().path().to_owned();
        if !(path == "/runs" || path.starts_with("/runs/")) {
            return match (request.method(), path.as_str()) {
                (&Method::GET, "/") => {
                    let mut response = Response::new(Full::new(Bytes::from_static(PAGE.as_bytes())).boxed());
                    let html = http::HeaderValue::from_static("text/html; charset=utf-8");
                    response.headers_mut().insert(header::CONTENT_TYPE, html);
                    response
                }
                _ => self.sink.handle(request).await.unwrap_or_else(not_found),
            };
        }
        let caller = match self.admit(&request) {
            Ok(caller) => caller,
            Err((status, message)) => {
                let mut refused = error(status, message);
                if status == StatusCode::UNAUTHORIZED {
                    refused.headers_mut().insert(header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
                }
                return refused;
            }
        };
        match (request.method().clone(), path.as_str()) {
            (Method::POST, "/runs") => self.start_run(request, caller).await,
            (Method::GET, "/runs") => {
                let runs = self.runs.lock().await;
                let newest_first: Vec<&RunRecord> = runs.iter().rev().filter(|r| r.belongs_to(&caller)).collect();
                to_json(StatusCode::OK, &newest_first)
            }
            (Method::GET, p) if p.starts_with("/runs/") => self.run_file(p.trim_start_matches("/runs/"), &caller).await,
            (Method::DELETE, p) if p.starts_with("/runs/") => {
                self.cancel(p.trim_start_matches("/runs/"), &caller).await
            }
            _ => error(StatusCode::METHOD_NOT_ALLOWED, "/runs takes GET and POST, /runs/ID GET and DELETE"),
        }
    }

    async fn start_run(self: Arc<Self>, request: Request<Incoming>, caller: Identity) -> Response<SinkBody> {
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
            let host = request_host(&request).unwrap_or_default();
            let origin = origin.to_str().unwrap_or_default();
            // Behind a proxy that ends TLS, the page's origin is https.
            let own = ["http://", "https://"].iter().any(|scheme| origin.strip_prefix(scheme) == Some(host.as_str()));
            if !own {
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
        // Checked before anything connects: a refused target gets the
        // same answer whether or not something listens there.
        for url in std::iter::once(&scenario.target).chain(&scenario.baseline) {
            if let Err(problem) = self.targets.check(url) {
                return error(StatusCode::FORBIDDEN, &problem);
            }
        }
        let mut runs = self.runs.lock().await;
        if let Some(running) = runs.iter().find(|r| r.status == "running") {
            let message = if running.belongs_to(&caller) {
                format!("run {} is still running: two runs at once would measure each other", running.id)
            } else {
                "another token's run is still running: two runs at once would measure each other".to_owned()
            };
            return error(StatusCode::CONFLICT, &message);
        }
        let id = runs.last().map_or(1, |r| r.id + 1);
        let shown = Scenario {
            key: scenario.key.as_ref().map(|_| REDACTED.to_owned()),
            baseline_key: scenario.baseline_key.as_ref().map(|_| REDACTED.to_owned()),
            ..scenario.clone()
        };
        let owner = Some(caller);
        runs.push(RunRecord {
            id,
            status: "running",
            progress: None,
            scenario: shown,
            result: None,
            error: None,
            owner,
        });
        forget_beyond(&mut runs, RUNS_KEPT);
        // Progress is for display: skipped when a reader holds the list,
        // and once the run is no longer running.
        let server = self.clone();
        let progress = move |now: String| {
            if let Ok(mut runs) = server.runs.try_lock()
                && let Some(run) = runs.iter_mut().find(|r| r.id == id && r.status == "running")
            {
                run.progress = Some(now);
            }
        };
        let study = tokio::spawn(study::run(scenario, progress));
        // Known as the running run before the list is let go: a DELETE
        // that sees the record finds what stops it.
        *self.running.lock().await = Some((id, study.abort_handle()));
        drop(runs);
        let server = self.clone();
        tokio::spawn(async move {
            let outcome = match study.await {
                Ok(outcome) => outcome,
                // Cancelled: the DELETE wrote the status.
                Err(stopped) if stopped.is_cancelled() => return,
                Err(panicked) => Err(format!("the run stopped on a fault of waycast-bench: {panicked}")),
            };
            if let Some(run) = server.runs.lock().await.iter_mut().find(|r| r.id == id && r.status == "running") {
                run.progress = None;
                match outcome {
                    Ok(result) => (run.status, run.result) = ("done", Some(result)),
                    Err(problem) => (run.status, run.error) = ("failed", Some(problem)),
                }
            }
        });
        to_json(StatusCode::ACCEPTED, &serde_json::json!({"id": id, "status": "running"}))
    }

    /// Stops the running run `id`, when `caller` started it.
    async fn cancel(&self, id: &str, caller: &Identity) -> Response<SinkBody> {
        let mut runs = self.runs.lock().await;
        let found = id.parse::<u64>().ok().and_then(|id| runs.iter_mut().find(|r| r.id == id && r.belongs_to(caller)));
        let Some(run) = found else {
            return error(StatusCode::NOT_FOUND, "no such run");
        };
        if run.status != "running" {
            return error(StatusCode::CONFLICT, &format!("run {} is {}, not running", run.id, run.status));
        }
        let mut running = self.running.lock().await;
        let Some((_, stop)) = running.take_if(|(running, _)| *running == run.id) else {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "the running run has nothing to stop it");
        };
        stop.abort();
        (run.status, run.progress) = ("cancelled", None);
        to_json(StatusCode::OK, &*run)
    }

    /// `ID` (the record), `ID.json` or `ID.csv` (a finished run's report, to keep).
    async fn run_file(&self, name: &str, caller: &Identity) -> Response<SinkBody> {
        let (id, extension) = name.split_once('.').map_or((name, None), |(id, extension)| (id, Some(extension)));
        let runs = self.runs.lock().await;
        let Some(run) = id.parse::<u64>().ok().and_then(|id| runs.iter().find(|r| r.id == id && r.belongs_to(caller)))
        else {
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

/// Forgets finished runs until `kept` are left: each time the oldest of
/// the token with the most, so one holder's many runs never push out
/// another's. A running run is never forgotten.
fn forget_beyond(runs: &mut Vec<RunRecord>, kept: usize) {
    let same = |a: &Option<Identity>, b: &Option<Identity>| match (a, b) {
        (Some(a), Some(b)) => a.same(b),
        (a, b) => a.is_none() && b.is_none(),
    };
    while runs.len() > kept {
        let ended: Vec<&RunRecord> = runs.iter().filter(|r| r.status != "running").collect();
        let held = |owner: &Option<Identity>| ended.iter().filter(|r| same(&r.owner, owner)).count();
        let Some(most) = ended.iter().max_by_key(|r| held(&r.owner)) else { return };
        let oldest = ended.iter().find(|r| same(&r.owner, &most.owner)).map(|r| r.id);
        runs.retain(|r| Some(r.id) != oldest);
    }
}

/// The name a request gives for this server: its `Host` header, or the
/// authority of HTTP/2 (and of an absolute-form HTTP/1 target). None when
/// it gives none (HTTP/1.0 may), or not as text.
fn request_host(request: &Request<Incoming>) -> Option<String> {
    match request.headers().get(header::HOST) {
        Some(host) => host.to_str().ok().filter(|host| !host.is_empty()).map(str::to_owned),
        None => request.uri().authority().map(|authority| authority.as_str().to_owned()),
    }
}

/// The name in a Host header, without its port (`[::1]:8090` → `::1`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
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
pub async fn start(listen: SocketAddr, options: ServeOptions) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let address = listener.local_addr()?;
    let server = BenchServer::new(options);
    tokio::spawn(serve_with(listener, move |request| server.clone().handle(request)));
    Ok(address)
}
