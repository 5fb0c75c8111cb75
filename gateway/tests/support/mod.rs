//! The gateway in-process (or as its own binary) in front of the mock
//! upstream, on ephemeral loopback ports, with a config file the test can
//! rewrite — the setup of every gateway test.

#![allow(dead_code, reason = "each test binary uses part of the support module")]

pub mod redis;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use waycast_crds::GatewayConfig;
use waycast_gateway::{ConfigSource, EndpointsSource, GatewayOptions, RunningGateway};
use waycast_mock::fixtures::{default_config, post_request, temp_dir};
use waycast_mock::upstream::{self as mock_upstream, MockOptions, MockUpstream};

/// A running gateway in front of a running mock.
pub struct Fixture {
    /// The mock upstream.
    pub mock: MockUpstream,
    /// The gateway (taken by `shutdown`).
    pub gateway: Option<RunningGateway>,
    /// The gateway's public address.
    pub addr: SocketAddr,
    /// The gateway's admin address.
    pub admin: SocketAddr,
    /// The config file the gateway follows.
    pub config_path: PathBuf,
    dir: PathBuf,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Knobs a test may turn.
pub struct FixtureOptions {
    /// Mock defaults.
    pub mock: MockOptions,
    /// Body timeout.
    pub body_timeout: Duration,
    /// Header timeout.
    pub header_read_timeout: Duration,
    /// Drain timeout.
    pub drain_timeout: Duration,
    /// TLS certificate and key files.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Most client connections open at once.
    pub max_connections: usize,
    /// Longest a connection stays open with no request in flight.
    pub idle_timeout: Duration,
    /// Read endpoints from `endpoints.json` in the fixture's directory
    /// (write it with [`Fixture::write_endpoints`]).
    pub endpoints_file: bool,
    /// Read the fleet's budget spend from `usage.json` in the fixture's
    /// directory (write it with [`Fixture::write_usage`]).
    pub usage_file: bool,
    /// Data-plane workers (the binary's layout, two by default); None:
    /// served on the test's runtime.
    pub workers: Option<std::num::NonZeroUsize>,
    /// The telemetry flags (the config's `settings.telemetry` wins).
    pub telemetry: Option<waycast_crds::telemetry::TelemetryConfig>,
}

impl Default for FixtureOptions {
    fn default() -> Self {
        Self {
            mock: MockOptions::default(),
            body_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(5),
            max_connections: waycast_gateway::DEFAULT_MAX_CONNECTIONS,
            idle_timeout: waycast_gateway::DEFAULT_IDLE_TIMEOUT,
            drain_timeout: Duration::from_secs(10),
            tls: None,
            endpoints_file: false,
            usage_file: false,
            workers: std::num::NonZeroUsize::new(2),
            telemetry: None,
        }
    }
}

impl Fixture {
    /// Starts a mock and a gateway whose config is `default_config` changed
    /// by `adjust`, and waits until the gateway serves it.
    ///
    /// # Panics
    /// When anything fails to start: the test cannot run.
    pub async fn start(options: FixtureOptions, adjust: impl FnOnce(&mut GatewayConfig, &str)) -> Self {
        let mock =
            mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), options.mock).await.expect("mock starts");
        let mut config = default_config(&mock.base_url());
        adjust(&mut config, &mock.base_url());
        let dir = temp_dir("gateway");
        let config_path = dir.join("gateway.yaml");
        write_atomically(&config_path, serde_yaml_ng::to_string(&config).expect("yaml").as_bytes());
        if options.usage_file {
            // The operator writes one before the pods start: none spent yet.
            write_atomically(&dir.join("usage.json"), br#"{"budgets": [], "reports": {}}"#);
        }
        let gateway = waycast_gateway::start(GatewayOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            config: ConfigSource::File(config_path.clone()),
            endpoints: options.endpoints_file.then(|| EndpointsSource::File(dir.join("endpoints.json"))),
            usage: options.usage_file.then(|| EndpointsSource::File(dir.join("usage.json"))),
            tls: options.tls,
            drain_timeout: options.drain_timeout,
            body_timeout: options.body_timeout,
            header_read_timeout: options.header_read_timeout,
            max_connections: options.max_connections,
            idle_timeout: options.idle_timeout,
            heartbeat: None,
            workers: options.workers,
            telemetry: options.telemetry.clone(),
        })
        .await
        .expect("gateway starts");
        let fixture = Self {
            mock,
            addr: gateway.public_addr,
            admin: gateway.admin_addr,
            gateway: Some(gateway),
            config_path,
            dir,
            client: Client::builder(TokioExecutor::new()).build_http(),
        };
        fixture.wait_ready().await;
        fixture
    }

    /// Waits until `/readyz` says ready.
    ///
    /// # Panics
    /// After 10 s.
    pub async fn wait_ready(&self) {
        for _ in 0..1000 {
            if self.admin_get("/readyz").await.0 == StatusCode::OK {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("gateway not ready within 10s");
    }

    /// Replaces the config file (atomically, as a ConfigMap mount does).
    pub fn write_config(&self, bytes: &[u8]) {
        write_atomically(&self.config_path, bytes);
    }

    /// Replaces the config with `config` and waits until the gateway has
    /// applied it (the config must differ from the one served).
    ///
    /// # Panics
    /// When it is not applied within 5 s.
    pub async fn apply_config(&self, config: &GatewayConfig) {
        const RELOADS: &str = "waycast_gateway_config_reloads_total";
        let before = self.metric(RELOADS).await.unwrap_or(0.0);
        self.write_config(serde_yaml_ng::to_string(config).expect("yaml").as_bytes());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.metric(RELOADS).await.unwrap_or(0.0) <= before {
            assert!(std::time::Instant::now() < deadline, "the config was not applied within 5 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Replaces the endpoints file (with `endpoints_file` set).
    pub fn write_endpoints(&self, bytes: &[u8]) {
        write_atomically(&self.dir.join("endpoints.json"), bytes);
    }

    /// Writes the usage baseline the gateway follows (with `usage_file`).
    pub fn write_usage(&self, bytes: &[u8]) {
        write_atomically(&self.dir.join("usage.json"), bytes);
    }

    /// `http://<gateway><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends a request and reads the whole response.
    ///
    /// # Panics
    /// On a transport error.
    pub async fn send(&self, request: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, Bytes) {
        let response = self.client.request(request).await.expect("gateway answers");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        (parts.status, parts.headers, body)
    }

    /// A POST to `path` with a key and extra headers (e.g. `x-mock-*`).
    ///
    /// # Panics
    /// On an invalid header.
    pub fn request(
        &self,
        path: &str,
        key: Option<&str>,
        body: &str,
        headers: &[(&'static str, &str)],
    ) -> Request<Full<Bytes>> {
        let mut request = post_request(&self.url(path), key, body);
        for (name, value) in headers {
            request.headers_mut().insert(*name, value.parse().expect("header value"));
        }
        request
    }

    /// Sends a request on a fresh connection and returns the response with
    /// its body still streaming.
    ///
    /// # Panics
    /// On a transport error.
    pub async fn open(&self, request: Request<Full<Bytes>>) -> http::Response<hyper::body::Incoming> {
        let client = Client::builder(TokioExecutor::new()).build_http();
        client.request(request).await.expect("gateway answers")
    }

    /// POSTs JSON with a key (or none).
    pub async fn post(&self, path: &str, key: Option<&str>, body: &str) -> (StatusCode, HeaderMap, Bytes) {
        self.send(post_request(&self.url(path), key, body)).await
    }

    /// GETs a path of the admin listener.
    pub async fn admin_get(&self, path: &str) -> (StatusCode, String) {
        let request =
            Request::get(format!("http://{}{path}", self.admin)).body(Full::new(Bytes::new())).expect("request");
        match self.client.request(request).await {
            Ok(response) => {
                let status = response.status();
                let body = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
            Err(_) => (StatusCode::SERVICE_UNAVAILABLE, String::new()),
        }
    }

    /// The value of one metric line (`name{labels}` exactly as rendered).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = self.admin_get("/metrics").await;
        metric_value(&text, series)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The gateway binary as a child process on loopback ports, for what only a
/// process shows: signals, exit codes, its own memory and CPU time.
pub struct GatewayProcess {
    /// The running gateway (killed on drop).
    pub child: tokio::process::Child,
    /// The public listener.
    pub public: SocketAddr,
    /// The admin listener (`/metrics`, `/readyz`).
    pub admin: SocketAddr,
    /// The config file it reads.
    pub config_path: PathBuf,
    dir: PathBuf,
}

impl GatewayProcess {
    /// Writes `config`, starts the binary with `args` added, and waits until
    /// `/readyz` answers 200.
    ///
    /// # Panics
    /// When it cannot start or is not ready within 10 s.
    pub async fn start(config: &GatewayConfig, args: &[&str]) -> Self {
        let dir = temp_dir("process");
        let config_path = dir.join("gateway.yaml");
        write_atomically(&config_path, serde_yaml_ng::to_string(config).expect("yaml").as_bytes());
        let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
        let port = || waycast_mock::fixtures::free_port(loopback).expect("a free port");
        let (public, admin) = (SocketAddr::new(loopback, port()), SocketAddr::new(loopback, port()));
        // WAYCAST_GATEWAY_BIN: another build (release, for the benchmarks' figures).
        let binary = std::env::var_os("WAYCAST_GATEWAY_BIN")
            .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_waycast-gateway")), PathBuf::from);
        let child = tokio::process::Command::new(binary)
            .args(["--config-file", &config_path.display().to_string()])
            .args(["--listen", &public.to_string(), "--admin-listen", &admin.to_string()])
            .args(args)
            // The access log, for `stdout()`.
            .stdout(std::fs::File::create(dir.join("stdout.log")).expect("a stdout file"))
            .kill_on_drop(true)
            .spawn()
            .expect("the gateway starts");
        let process = Self { child, public, admin, config_path, dir };
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        for _ in 0..1000 {
            let request =
                Request::get(format!("http://{admin}/readyz")).body(Full::new(Bytes::new())).expect("request");
            if client.request(request).await.is_ok_and(|r| r.status() == StatusCode::OK) {
                return process;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the gateway process was not ready within 10 s");
    }

    /// What the process has written to stdout (its access log).
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default()
    }

    /// `http://<public listener><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.public)
    }

    /// Sends `name` (e.g. `TERM`) to the process.
    ///
    /// # Panics
    /// When `kill` fails.
    pub fn signal(&self, name: &str) {
        let pid = self.pid().to_string();
        let sent = std::process::Command::new("kill").args(["-s", name, &pid]).status().expect("kill runs");
        assert!(sent.success(), "kill -s {name} {pid}");
    }

    /// Its process id.
    ///
    /// # Panics
    /// After it exited.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the gateway is running")
    }

    /// Resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
    ///
    /// # Panics
    /// When /proc cannot be read (the process is gone).
    pub fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("/proc/<pid>/status");
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .expect("a kB field")
                * 1024
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// CPU time used so far (user + system), in clock ticks (1/100 s on Linux).
    ///
    /// # Panics
    /// When /proc cannot be read (the process is gone).
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("/proc/<pid>/stat");
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')').expect("stat format").1.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat(5); here 11 and 12 from 0.
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
    }

    /// The value of one metric line (`name{labels}` exactly as rendered).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.admin_get("/metrics").await?, series)
    }

    /// The body of an admin endpoint (`/metrics`, `/usage`).
    pub async fn admin_get(&self, path: &str) -> Option<String> {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = Request::get(format!("http://{}{path}", self.admin)).body(Full::new(Bytes::new())).ok()?;
        let body = client.request(request).await.ok()?.into_body().collect().await.ok()?.to_bytes();
        Some(String::from_utf8_lossy(&body).into_owned())
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value of one series in a Prometheus text exposition.
fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

fn write_atomically(path: &PathBuf, bytes: &[u8]) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, bytes).expect("write config");
    std::fs::rename(&temporary, path).expect("rename config");
}
