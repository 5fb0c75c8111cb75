//! A real OpenTelemetry Collector for the telemetry tests: the minimal
//! build `e2e/scripts/build-otelcol.sh` makes from the Go module proxy
//! (built here when missing), receiving OTLP/HTTP on a free port and
//! writing what it receives to files the test reads (OTLP/JSON, a line per
//! export). Killed on drop.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

/// A running collector.
pub struct Collector {
    child: Child,
    dir: PathBuf,
    /// Its OTLP/HTTP base URL.
    pub endpoint: String,
}

impl Collector {
    /// Builds (or reuses) the collector and starts it on `address`.
    ///
    /// # Errors
    /// The build failed, or the collector did not listen within 20 s.
    pub fn start(address: IpAddr) -> anyhow::Result<Self> {
        Self::start_at(address, crate::fixtures::free_port(address)?)
    }

    /// The same, on `port` (a collector that comes back where one was).
    ///
    /// # Errors
    /// The build failed, or the collector did not listen within 20 s.
    pub fn start_at(address: IpAddr, port: u16) -> anyhow::Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/scripts/build-otelcol.sh");
        let built = Command::new("bash").arg(script).stderr(Stdio::inherit()).output().context("build-otelcol.sh")?;
        if !built.status.success() {
            bail!("building the collector failed");
        }
        let stdout = String::from_utf8(built.stdout)?;
        let binary = stdout.lines().last().context("build-otelcol.sh printed no path")?.to_owned();
        let dir = std::env::temp_dir().join(format!("waycast-otelcol-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let host = match address {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: {host}:{port}\n\
             exporters:\n  file/traces:\n    path: {traces}\n    flush_interval: 100ms\n  file/logs:\n    path: {logs}\n    flush_interval: 100ms\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file/traces]\n    logs:\n      receivers: [otlp]\n      exporters: [file/logs]\n",
            traces = dir.join("traces.jsonl").display(),
            logs = dir.join("logs.jsonl").display(),
        );
        std::fs::write(dir.join("config.yaml"), config)?;
        let log = std::fs::File::create(dir.join("collector.log"))?;
        let child = Command::new(binary)
            .arg(format!("--config=file:{}", dir.join("config.yaml").display()))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the collector")?;
        let collector = Self { child, dir, endpoint: format!("http://{host}:{port}") };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect((address, port)).is_err() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(collector.dir.join("collector.log")).unwrap_or_default();
                bail!("the collector did not listen: {log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(collector)
    }

    /// Every span (`traces`) or log record (`logs`) received so far.
    pub fn received(&self, signal: &str) -> Vec<Value> {
        let (file, outer, scoped, items) = match signal {
            "traces" => ("traces.jsonl", "resourceSpans", "scopeSpans", "spans"),
            _ => ("logs.jsonl", "resourceLogs", "scopeLogs", "logRecords"),
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        let mut found = Vec::new();
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            // The last line may be half written (flushed meanwhile): read next time.
            let Ok(document) = serde_json::from_str::<Value>(line) else { continue };
            for resource in document[outer].as_array().into_iter().flatten() {
                for scope in resource[scoped].as_array().into_iter().flatten() {
                    found.extend(scope[items].as_array().into_iter().flatten().cloned());
                }
            }
        }
        found
    }

    /// The resource of every export of `signal` received so far.
    pub fn resources(&self, signal: &str) -> Vec<Value> {
        let (file, outer) =
            if signal == "traces" { ("traces.jsonl", "resourceSpans") } else { ("logs.jsonl", "resourceLogs") };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .flat_map(|document| document[outer].as_array().cloned().unwrap_or_default())
            .map(|resource| resource["resource"].clone())
            .collect()
    }

    /// What was received once `check` holds of it (within 15 s).
    ///
    /// # Panics
    /// `check` never held: the message shows `what` and what was received.
    pub async fn until(&self, signal: &str, what: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let received = self.received(signal);
            if check(&received) {
                return received;
            }
            assert!(Instant::now() < deadline, "{what}: the collector has {received:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value of attribute `key` of a span or record in OTLP/JSON (a
/// string, an integer as its decimal string, or a bool).
pub fn attribute<'a>(item: &'a Value, key: &str) -> Option<&'a Value> {
    let attributes = item["attributes"].as_array()?;
    let value = &attributes.iter().find(|a| a["key"] == key)?["value"];
    value.get("stringValue").or_else(|| value.get("intValue")).or_else(|| value.get("boolValue"))
}
