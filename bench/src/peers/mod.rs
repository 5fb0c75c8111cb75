//! `make bench-peers`: waycast and the proxies a user would pick instead,
//! measured in one run by the same load, on the same pinned CPUs, in front
//! of the same sinks.
//!
//! Each peer is started with a config of its own written here: one bearer
//! key checked on every request, an access log where the peer has one, and
//! three models, each to a sink process whose default answer is that
//! cell's shape (so no peer needs to forward the sink's `x-bench-*` request
//! headers). Per peer, on one fresh process:
//!
//! 1. held streams: N streams open at once, 20 chunks 250 ms apart — RSS of
//!    the process tree (sampled: nginx and LiteLLM run several processes)
//!    over its RSS after start, per stream; CPU per stream;
//! 2. saturation (S2's shape): 64 connections, no wait — CPU per request;
//! 3. streaming (S3's shape): 100 streams of 20 chunks 10 ms apart — CPU
//!    per stream and time to first token.
//!
//! Cells 2 and 3 run in rounds (every peer's saturation, then every peer's
//! streaming, again), so a slow moment of a shared machine is spread over
//! the peers; the table shows each figure's median over the rounds.
//! They last about `cell_seconds` each: a short calibration run
//! sets their request count from the peer's own rate, so a slow peer is
//! not given minutes of work and a fast one is not measured for a blink.

mod configs;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::json;

use crate::process::{
    self, Process, RssSampler, cpu_count, local_address, pinned, raw_request, start_sink, tree_cpu_seconds,
    tree_rss_mib,
};
use crate::{RunResult, Scenario, source};
use configs::{CELLS, Cell, HELD, SATURATION, STREAMING};
pub use configs::{PEERS_KEY, litellm_config, nginx_config, nginx_path, onwards_config, waycast_config};

/// A proxy the bench knows how to configure and start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerKind {
    /// waycast's gateway.
    Waycast,
    /// nginx from Debian: a `map` on the Authorization header, no body parsing.
    Nginx,
    /// onwards (Rust, crates.io).
    Onwards,
    /// LiteLLM's proxy (Python, PyPI).
    Litellm,
}

impl PeerKind {
    fn name(self) -> &'static str {
        match self {
            Self::Waycast => "waycast",
            Self::Nginx => "nginx",
            Self::Onwards => "onwards",
            Self::Litellm => "litellm",
        }
    }
}

/// A peer and its program.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Which one.
    pub kind: PeerKind,
    /// Its binary (LiteLLM: the `litellm` script of its virtualenv).
    pub program: PathBuf,
}

/// How the peers bench runs.
#[derive(Debug, Clone)]
pub struct PeersOptions {
    /// The peers, measured in this order.
    pub peers: Vec<Peer>,
    /// The `waycast-bench` binary, to run the sinks as processes of their own.
    pub bench: PathBuf,
    /// CPUs every peer is pinned to (a taskset list); each runs as many
    /// workers as it names.
    pub peer_cpus: String,
    /// CPUs the sinks are pinned to (the bench itself should run there too).
    pub load_cpus: Option<String>,
    /// Seconds each timed cell lasts, roughly.
    pub cell_seconds: f64,
    /// Streams held open at once in the first cell.
    pub held_streams: u64,
    /// Rounds of the timed cells (the table shows each figure's median).
    pub rounds: u32,
}

/// What one timed cell measured.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CellResult {
    /// The load's view.
    pub result: RunResult,
    /// CPU seconds of the peer's process tree during the cell, per
    /// completed request, in milliseconds.
    pub cpu_ms_per_request: f64,
}

/// What one peer measured.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerReport {
    /// Which peer.
    pub peer: PeerKind,
    /// Resident memory of its process tree after start and one answered request, in MiB.
    pub rss_after_start_mib: f64,
    /// The highest tree RSS sampled while the streams were held, in MiB.
    pub held_peak_rss_mib: f64,
    /// (peak − after start) / streams, in KiB.
    pub held_rss_per_stream_kib: f64,
    /// The held streams cell.
    pub held: CellResult,
    /// The saturation cell, one per round.
    pub saturation: Vec<CellResult>,
    /// The streaming cell, one per round.
    pub streaming: Vec<CellResult>,
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeersReport {
    /// CPUs the peers and the load ran on.
    pub pinning: serde_json::Value,
    /// The saturation and streaming cells straight to the sink.
    pub baseline: Baseline,
    /// Per peer, in run order.
    pub peers: Vec<PeerReport>,
}

/// The sinks measured without a proxy.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Baseline {
    /// The saturation cell.
    pub saturation: RunResult,
    /// The streaming cell.
    pub streaming: RunResult,
}

/// A cell's scenario against `target` (a base URL).
fn scenario(target: String, cell: &Cell, stream: bool, requests: u64, concurrency: u32) -> Scenario {
    Scenario {
        target,
        key: Some(PEERS_KEY.to_owned()),
        model: cell.model.to_owned(),
        stream,
        chunks: cell.chunks,
        chunk_interval_ms: cell.chunk_interval_ms,
        ..crate::suite::base_scenario(requests, concurrency)
    }
}

/// A started peer: the process and where it listens (with the path prefix
/// that routes to each cell's model, for nginx).
struct Running {
    process: Process,
    address: SocketAddr,
    prefix: fn(&str) -> String,
}

fn no_prefix(_: &str) -> String {
    String::new()
}

fn start(peer: &Peer, options: &PeersOptions, sinks: &[SocketAddr; 3], dir: &Path) -> anyhow::Result<Running> {
    let address = local_address()?;
    let workers = cpu_count(&options.peer_cpus);
    let name = peer.kind.name();
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let mut command = pinned(Some(&options.peer_cpus), &peer.program);
    let mut prefix: fn(&str) -> String = no_prefix;
    match peer.kind {
        PeerKind::Waycast => {
            let config = dir.join("waycast.json");
            std::fs::write(&config, waycast_config(sinks)?)?;
            let admin = local_address()?;
            command.arg("--config-file").arg(&config).args([
                "--listen",
                &address.to_string(),
                "--admin-listen",
                &admin.to_string(),
                "--log",
                "info",
                "--workers",
                &workers.to_string(),
            ]);
        }
        PeerKind::Nginx => {
            let config = dir.join("nginx.conf");
            std::fs::write(&config, nginx_config(dir, address, sinks, workers))?;
            command.arg("-p").arg(dir).arg("-e").arg(dir.join("nginx-error.log")).arg("-c").arg(&config);
            prefix = nginx_path;
        }
        PeerKind::Onwards => {
            let config = dir.join("onwards.json");
            std::fs::write(&config, onwards_config(sinks))?;
            let metrics = local_address()?;
            command
                .arg("-f")
                .arg(&config)
                .args(["-p", &address.port().to_string()])
                .args(["--metrics-port", &metrics.port().to_string()]);
        }
        PeerKind::Litellm => {
            let config = dir.join("litellm.yaml");
            std::fs::write(&config, litellm_config(sinks))?;
            command
                .arg("--config")
                .arg(&config)
                .args(["--host", "127.0.0.1", "--port", &address.port().to_string()])
                .args(["--num_workers", &workers.to_string()])
                // The model cost map is fetched from the network otherwise.
                .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                .env("LITELLM_TELEMETRY", "False");
        }
    }
    let child = command
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name} ({})", peer.program.display()))?;
    Ok(Running { process: Process(child), address, prefix })
}

/// The peer's address with the prefix that reaches `cell`'s model.
fn target(running: &Running, cell: &Cell) -> String {
    format!("http://{}{}", running.address, (running.prefix)(cell.model))
}

/// Runs `scenario`, measuring the peer's CPU over it.
async fn timed(running: &Running, scenario: Scenario) -> anyhow::Result<CellResult> {
    let pid = running.process.id();
    let cpu_before = tree_cpu_seconds(pid);
    let result = source::run(scenario).await.map_err(anyhow::Error::msg)?;
    let cpu = tree_cpu_seconds(pid) - cpu_before;
    let cpu_ms_per_request = if result.ok > 0 { cpu * 1e3 / result.ok as f64 } else { 0.0 };
    Ok(CellResult { result, cpu_ms_per_request })
}

/// A calibration run of `warm_up` requests, then about `seconds` of the cell at the rate it showed.
async fn calibrated(
    running: &Running,
    cell: &Cell,
    stream: bool,
    concurrency: u32,
    seconds: f64,
) -> anyhow::Result<CellResult> {
    let at = |requests| scenario(target(running, cell), cell, stream, requests, concurrency);
    let warm_up = u64::from(concurrency) * 10;
    let probe = source::run(at(warm_up)).await.map_err(anyhow::Error::msg)?;
    if probe.ok == 0 {
        bail!("no request was answered in calibration: {:?}", probe.error_samples);
    }
    let requests = ((probe.requests_per_second * seconds) as u64).max(u64::from(concurrency) * 5);
    timed(running, at(requests)).await
}

/// Starts `peer` and waits for its first 200.
async fn start_ready(
    peer: &Peer,
    options: &PeersOptions,
    sinks: &[SocketAddr; 3],
    dir: &Path,
) -> anyhow::Result<Running> {
    let mut running = start(peer, options, sinks, dir)?;
    let name = peer.kind.name();
    let request = process::chat(&(running.prefix)(HELD.model), PEERS_KEY, HELD.model);
    let started = Instant::now();
    while raw_request(running.address, &request).await.is_none_or(|(status, _)| status != 200) {
        let log = || std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        if let Some(status) = running.process.exited() {
            bail!("{name} exited ({status}) before answering:\n{}", log());
        }
        if started.elapsed() > Duration::from_secs(180) {
            bail!("{name} did not answer 200 within 180 s:\n{}", log());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(running)
}

/// The held streams cell, on a peer that has answered one request only.
async fn held(peer: &Peer, running: &Running, streams: u64) -> anyhow::Result<PeerReport> {
    let pid = running.process.id();
    let rss_after_start_mib = tree_rss_mib(pid);
    eprintln!("bench-peers: {}: {streams} held streams", peer.kind.name());
    let concurrency = u32::try_from(streams).context("too many held streams")?;
    let sampler = RssSampler::start(pid);
    let held = timed(running, scenario(target(running, &HELD), &HELD, true, streams, concurrency)).await?;
    let held_peak_rss_mib = sampler.peak_mib();
    Ok(PeerReport {
        peer: peer.kind,
        rss_after_start_mib,
        held_peak_rss_mib,
        held_rss_per_stream_kib: (held_peak_rss_mib - rss_after_start_mib) * 1024.0 / streams as f64,
        held,
        saturation: Vec::new(),
        streaming: Vec::new(),
    })
}

/// Runs every peer against the same sinks: each started fresh for its held
/// streams (so its memory is theirs), then the timed cells in rounds that
/// take the peers in turn, so a slow moment of a shared machine falls on
/// one round of every peer rather than on all of one peer's.
///
/// # Errors
/// A sink cannot start, or a peer does not start or answers nothing.
pub async fn run(options: PeersOptions) -> anyhow::Result<PeersReport> {
    let dir = waycast_mock::fixtures::temp_dir("bench-peers");
    let mut sink_processes = Vec::new();
    let mut sinks = Vec::new();
    for cell in CELLS {
        let flags = [
            "--chunks".to_owned(),
            cell.chunks.to_string(),
            "--chunk-interval-ms".to_owned(),
            cell.chunk_interval_ms.to_string(),
        ];
        let (process, address) = start_sink(&options.bench, options.load_cpus.as_deref(), &flags).await?;
        sink_processes.push(process);
        sinks.push(address);
    }
    let sinks: [SocketAddr; 3] = [sinks[0], sinks[1], sinks[2]];

    eprintln!("bench-peers: baseline (the sinks alone)");
    let baseline = Baseline {
        saturation: source::run(scenario(format!("http://{}", sinks[0]), &SATURATION, false, 64 * 200, 64))
            .await
            .map_err(anyhow::Error::msg)?,
        streaming: source::run(scenario(format!("http://{}", sinks[1]), &STREAMING, true, 100 * 20, 100))
            .await
            .map_err(anyhow::Error::msg)?,
    };
    let mut running = Vec::new();
    let mut reports = Vec::new();
    for peer in &options.peers {
        let peer_dir = dir.join(peer.kind.name());
        std::fs::create_dir_all(&peer_dir)?;
        let started = start_ready(peer, &options, &sinks, &peer_dir).await?;
        reports.push(held(peer, &started, options.held_streams).await?);
        running.push(started);
    }
    for round in 1..=options.rounds {
        for (peer, report) in running.iter().zip(&mut reports) {
            eprintln!("bench-peers: round {round}: {}: saturation", report.peer.name());
            report.saturation.push(calibrated(peer, &SATURATION, false, 64, options.cell_seconds).await?);
        }
        for (peer, report) in running.iter().zip(&mut reports) {
            eprintln!("bench-peers: round {round}: {}: streaming", report.peer.name());
            report.streaming.push(calibrated(peer, &STREAMING, true, 100, options.cell_seconds).await?);
        }
    }
    drop(running);
    drop(sink_processes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(PeersReport {
        pinning: json!({"peerCpus": options.peer_cpus, "loadCpus": options.load_cpus}),
        baseline,
        peers: reports,
    })
}

/// The median of `values` (0 for none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The median of a figure of a peer's saturation rounds.
fn saturation(peer: &PeerReport, figure: fn(&CellResult) -> f64) -> f64 {
    median(peer.saturation.iter().map(figure).collect())
}

/// The median of a figure of a peer's streaming rounds.
fn streaming(peer: &PeerReport, figure: fn(&CellResult) -> f64) -> f64 {
    median(peer.streaming.iter().map(figure).collect())
}

fn p99(summary: Option<&crate::Summary>) -> f64 {
    summary.map_or(0.0, |s| s.p99)
}

/// The report as a table: one column per peer, and the ratios to nginx's.
pub fn table(report: &PeersReport) -> String {
    type Row = (&'static str, fn(&PeerReport) -> f64);
    let rows: [Row; 11] = [
        ("saturation: req/s", |p| saturation(p, |c| c.result.requests_per_second)),
        ("saturation: CPU ms per request", |p| saturation(p, |c| c.cpu_ms_per_request)),
        ("saturation: p99 ms", |p| saturation(p, |c| p99(c.result.latency.as_ref()))),
        ("streaming: CPU ms per stream", |p| streaming(p, |c| c.cpu_ms_per_request)),
        ("streaming: first token p99 ms", |p| streaming(p, |c| p99(c.result.time_to_first_byte.as_ref()))),
        ("streaming: p99 ms", |p| streaming(p, |c| p99(c.result.latency.as_ref()))),
        ("RSS after start MiB", |p| p.rss_after_start_mib),
        ("held streams: peak RSS MiB", |p| p.held_peak_rss_mib),
        ("held streams: KiB per stream", |p| p.held_rss_per_stream_kib),
        ("held streams: CPU ms per stream", |p| p.held.cpu_ms_per_request),
        ("errors (all cells)", |p| {
            let errors = |cells: &[CellResult]| cells.iter().map(|c| c.result.errors).sum::<u64>();
            (p.held.result.errors + errors(&p.saturation) + errors(&p.streaming)) as f64
        }),
    ];
    let mut out = String::new();
    let _ = write!(out, "{:<34}", "");
    for peer in &report.peers {
        let _ = write!(out, " {:>10}", peer.peer.name());
    }
    let _ = writeln!(out, " {:>10}", "sink alone");
    for (label, value) in rows {
        let _ = write!(out, "{label:<34}");
        for peer in &report.peers {
            let _ = write!(out, " {:>10.3}", value(peer));
        }
        let baseline = match label {
            "saturation: req/s" => format!("{:.0}", report.baseline.saturation.requests_per_second),
            "saturation: p99 ms" => format!("{:.3}", p99(report.baseline.saturation.latency.as_ref())),
            "streaming: first token p99 ms" => {
                format!("{:.3}", p99(report.baseline.streaming.time_to_first_byte.as_ref()))
            }
            "streaming: p99 ms" => format!("{:.3}", p99(report.baseline.streaming.latency.as_ref())),
            _ => "-".to_owned(),
        };
        let _ = writeln!(out, " {baseline:>10}");
    }
    let find = |kind| report.peers.iter().find(|p| p.peer == kind);
    if let (Some(waycast), Some(nginx)) = (find(PeerKind::Waycast), find(PeerKind::Nginx)) {
        let ratio = |row: usize| {
            let (a, b) = (rows[row].1(waycast), rows[row].1(nginx));
            if b > 0.0 { a / b } else { f64::NAN }
        };
        let _ = writeln!(
            out,
            "\nwaycast against nginx (medians of {} rounds): CPU per request {:.2}× (target ≤ 1.1×), CPU per stream {:.2}× (target ≤ 1.2×), first token p99 {:+.2} ms (target ≤ +1 ms), held KiB per stream {:.2}×",
            waycast.saturation.len(),
            ratio(1),
            ratio(3),
            rows[4].1(waycast) - rows[4].1(nginx),
            ratio(8),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn sinks() -> [SocketAddr; 3] {
        [8001, 8002, 8003].map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
    }

    #[test]
    fn every_peer_config_routes_each_model_to_its_own_sink_behind_the_key() {
        let sinks = sinks();
        waycast_config(&sinks).expect("a valid gateway config");
        let nginx = nginx_config(Path::new("/run/x"), SocketAddr::from((Ipv4Addr::LOCALHOST, 9000)), &sinks, 4);
        let onwards = onwards_config(&sinks);
        let litellm = litellm_config(&sinks);
        for (cell, sink) in CELLS.iter().zip(sinks) {
            assert!(nginx.contains(&format!("upstream {} {{ server {sink};", cell.model)), "{nginx}");
            assert!(nginx.contains(&format!("location {}/ {{", nginx_path(cell.model))), "{nginx}");
            assert!(
                onwards.contains(&format!(r#""{}":{{"keys":["{PEERS_KEY}"],"url":"http://{sink}"}}"#, cell.model)),
                "{onwards}"
            );
            assert!(
                litellm.contains(&format!("model: openai/{}\n      api_base: http://{sink}/v1", cell.model)),
                "{litellm}"
            );
        }
        assert!(nginx.contains("worker_processes 4;") && nginx.contains(&format!("\"Bearer {PEERS_KEY}\" 1;")));
        assert!(litellm.contains(&format!("master_key: {PEERS_KEY}")));
    }
}
