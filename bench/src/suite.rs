//! The suite behind `make bench`: each scenario against the sink directly
//! (the baseline) and through a gateway process in front of the same sink,
//! in one run, with the gateway on one core and source and sink on the
//! other. Prints a table and writes JSON.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use serde_json::json;

use crate::process::{
    self, Process, cpu_seconds, get, local_address, memory_mib, peak_rss_mib, pinned, raw_request, start_sink, wait_for,
};
use crate::{BENCH_MODEL, RunResult, Scenario, Workload, source};

/// The bearer key the suite's gateway accepts.
pub const SUITE_KEY: &str = "wc_benchmark_key_0123456789abcdefghijklmnop";

/// The model the suite's gateway serves from the same sink as a chat-only
/// backend (`format: OpenAIChat`): S9's Messages requests are translated.
pub const TRANSLATED_MODEL: &str = "bench-chat-only";

/// How the suite runs.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// The gateway binary (a release build).
    pub gateway: PathBuf,
    /// The `waycast-bench` binary, to run the sink as its own process.
    pub bench: PathBuf,
    /// Where the JSON goes.
    pub out: PathBuf,
    /// Multiplies every scenario's request count (0.1 for a quick look).
    pub scale: f64,
    /// CPU the gateway is pinned to (taskset), if any.
    pub gateway_cpu: Option<usize>,
    /// CPU the sink is pinned to; the suite itself should run there too.
    pub load_cpu: Option<usize>,
    /// The gateway's log filter (`info` keeps the access log on).
    pub gateway_log: String,
    /// Give the suite's key generous request and token limits (never
    /// reached), so every request pays for the limit check and its headers.
    pub limits: bool,
    /// Only the scenarios of this id, and neither S5 nor S8.
    pub only: Option<String>,
}

/// One scenario's two sides.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// S1, S2, ...
    pub id: String,
    /// What it is.
    pub title: String,
    /// The scenario (target differs per side).
    pub scenario: Scenario,
    /// Straight to the sink.
    pub baseline: RunResult,
    /// Through the gateway.
    pub gateway: RunResult,
}

/// Everything the suite measured.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SuiteReport {
    /// CPUs the gateway and the load ran on.
    pub pinning: serde_json::Value,
    /// Request-response scenarios.
    pub comparisons: Vec<Comparison>,
    /// S5: process start → first authorized 200, in milliseconds, per attempt.
    pub cold_start_ms: Vec<f64>,
    /// S6: the gateway's peak RSS (VmHWM) in MiB after S1 and after S2.
    pub peak_rss_mib: serde_json::Value,
    /// Mean time spent inside the gateway per request during S2, from its
    /// own `waycast_gateway_overhead_seconds` histogram, in microseconds.
    pub s2_gateway_overhead_us: Option<f64>,
    /// S2 requests per second of gateway CPU time (user + system, from
    /// /proc): what one fully busy gateway core would serve, whether or not
    /// the load generator could push it that far.
    pub s2_requests_per_gateway_cpu_second: Option<f64>,
    /// S8: many streams held open at once through a fresh gateway (not
    /// run with `only`).
    pub held_streams: Option<HeldStreams>,
    /// Size of the gateway binary, in MiB.
    pub gateway_binary_mib: f64,
}

/// S8: what many concurrent streams cost a gateway that had served nothing
/// before (its own process), from /proc.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldStreams {
    /// Streams open at once (each from its own client connection).
    pub streams: u64,
    /// Chunks per stream, and the pause between them (ms).
    pub chunks: u32,
    /// Milliseconds between chunks.
    pub chunk_interval_ms: u64,
    /// Resident memory after start and one answered request, in MiB.
    pub rss_after_start_mib: f64,
    /// The highest resident memory (VmHWM) by the end, in MiB.
    pub peak_rss_mib: f64,
    /// (peak − after start) / streams, in KiB.
    pub rss_per_stream_kib: f64,
    /// Gateway CPU time (user + system) per stream, in milliseconds.
    pub cpu_ms_per_stream: f64,
    /// What the client side saw.
    pub result: RunResult,
}

fn authorized_chat() -> Vec<u8> {
    process::chat("", SUITE_KEY, BENCH_MODEL)
}

/// The gateway config: one model to the sink, one key, access log on.
pub fn gateway_config(sink: SocketAddr, limits: bool) -> anyhow::Result<Vec<u8>> {
    gateway_config_for(sink, BENCH_MODEL, limits)
}

/// A standalone gateway's config: `model` routed to `upstream`'s `/v1`,
/// [`SUITE_KEY`] allowed (with generous limits when `limits`), access log on.
pub fn gateway_config_for(upstream: SocketAddr, model: &str, limits: bool) -> anyhow::Result<Vec<u8>> {
    let mut key = json!({"id": "bench/load", "sha256": waycast_mock::fixtures::sha256_hex(SUITE_KEY)});
    if limits {
        key["limits"] = json!({"requestsPerMinute": 1_000_000_000_u64, "tokensPerMinute": 1_000_000_000_000_u64});
    }
    let entry = |name: &str, format: &str| {
        json!({
            "name": name,
            "backends": [{"url": format!("http://{upstream}/v1"), "weight": 1, "format": format}],
            "timeouts": {"connect": "5s", "firstByte": "300s", "idle": "60s"},
            // The sink's knobs are request headers.
            "forwardHeaders": ["x-bench-*"],
        })
    };
    let config = json!({
        "apiVersion": "waycast.dev/config-v1",
        "models": [entry(model, "OpenAI"), entry(TRANSLATED_MODEL, "OpenAIChat")],
        "keys": [key],
        "settings": {"maxRequestBodyBytes": 10_485_760, "accessLog": true},
    });
    let bytes = serde_json::to_vec_pretty(&config)?;
    waycast_crds::GatewayConfig::from_slice(&bytes).context("the suite's gateway config is invalid")?;
    Ok(bytes)
}

fn start_gateway(
    options: &SuiteOptions,
    config: &Path,
    dir: &Path,
) -> anyhow::Result<(Process, SocketAddr, SocketAddr)> {
    let (public, admin) = (local_address()?, local_address()?);
    // The access log goes to a file, as it would to a container log.
    let log = std::fs::File::create(dir.join(format!("gateway-{}.log", public.port())))?;
    let child = pinned(options.gateway_cpu.map(|cpu| cpu.to_string()).as_deref(), &options.gateway)
        .arg("--config-file")
        .arg(config)
        .args(["--listen", &public.to_string(), "--admin-listen", &admin.to_string(), "--log", &options.gateway_log])
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", options.gateway.display()))?;
    Ok((Process(child), public, admin))
}

/// S8: `streams` streams held open at once through a gateway process of
/// its own, so its memory before and at the peak is theirs alone.
async fn held_streams(options: &SuiteOptions, config: &Path, dir: &Path, streams: u64) -> anyhow::Result<HeldStreams> {
    let (process, public, _) = start_gateway(options, config, dir)?;
    wait_for(public, &authorized_chat(), Duration::from_secs(10)).await?;
    let pid = process.id();
    let rss_after_start_mib = memory_mib(pid, "VmRSS:").context("reading the gateway's memory")?;
    let cpu_before = cpu_seconds(pid).context("reading the gateway's CPU time")?;
    let (chunks, chunk_interval_ms) = (20, 250);
    let concurrency = u32::try_from(streams).context("too many streams")?;
    let scenario = Scenario {
        target: format!("http://{public}"),
        stream: true,
        chunks,
        chunk_interval_ms,
        requests: streams,
        concurrency,
        ..base_scenario(streams, concurrency)
    };
    let result = source::run(scenario).await.map_err(anyhow::Error::msg)?;
    let peak_rss_mib = peak_rss_mib(pid).context("reading the gateway's memory")?;
    let cpu = cpu_seconds(pid).context("reading the gateway's CPU time")? - cpu_before;
    drop(process);
    Ok(HeldStreams {
        streams,
        chunks,
        chunk_interval_ms,
        rss_after_start_mib,
        peak_rss_mib,
        rss_per_stream_kib: (peak_rss_mib - rss_after_start_mib) * 1024.0 / streams as f64,
        cpu_ms_per_stream: cpu * 1e3 / streams as f64,
        result,
    })
}

async fn overhead_totals(admin: SocketAddr) -> Option<(f64, f64)> {
    let (_, text) = raw_request(admin, &get("/metrics")).await?;
    let value = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<f64>().ok());
    Some((value("waycast_gateway_overhead_seconds_sum ")?, value("waycast_gateway_overhead_seconds_count ")?))
}

/// A chat scenario of the suite (its target still to set).
pub fn base_scenario(requests: u64, concurrency: u32) -> Scenario {
    Scenario {
        target: String::new(),
        key: Some(SUITE_KEY.to_owned()),
        baseline: None,
        baseline_key: None,
        rounds: 1,
        // The suite warms each side up itself.
        warmup: Some(0),
        model: BENCH_MODEL.to_owned(),
        max_tokens: None,
        workload: Workload::Chat,
        stream: false,
        requests,
        concurrency,
        rate: None,
        // The proxy figures compare runs at the same evenly spaced rate.
        arrival: crate::Arrival::Uniform,
        sweep: None,
        body_bytes: 1024,
        body_bytes_max: None,
        wait_ms: 0,
        chunks: 20,
        chunk_interval_ms: 0,
        timeout_ms: 30_000,
    }
}

/// The request-response scenarios, with request counts scaled by `scale`.
pub fn scenarios(scale: f64) -> Vec<(String, String, Scenario)> {
    let count = |n: f64| ((n * scale).round() as u64).max(100);
    let base = base_scenario;
    let mut list = vec![
        (
            "S1".to_owned(),
            "100 concurrent, 1 KB body, wait 100 ms".to_owned(),
            Scenario { wait_ms: 100, ..base(count(10_000.0), 100) },
        ),
        ("S2".to_owned(), "saturation: 64 concurrent, wait 0".to_owned(), base(count(100_000.0), 64)),
        (
            "S3".to_owned(),
            "streaming: 100 concurrent, 20 chunks 10 ms apart".to_owned(),
            Scenario { stream: true, chunk_interval_ms: 10, ..base(count(5_000.0), 100) },
        ),
        (
            "S4".to_owned(),
            "large bodies: 100 KB, 32 concurrent".to_owned(),
            Scenario { body_bytes: 100 * 1024, ..base(count(10_000.0), 32) },
        ),
    ];
    for workload in [Workload::Chat, Workload::Responses, Workload::Messages] {
        for stream in [false, true] {
            let name = format!("{workload:?}{}", if stream { " stream" } else { "" }).to_lowercase();
            list.push((
                "S7".to_owned(),
                format!("{name}: 32 concurrent"),
                Scenario { workload, stream, chunks: 5, ..base(count(10_000.0), 32) },
            ));
        }
    }
    // Translation's cost: the baseline side is the same Messages request
    // through the gateway to a backend that serves it (passed through), the
    // other to a chat-only backend (translated both ways).
    for stream in [false, true] {
        let name = if stream { "messages stream" } else { "messages" };
        list.push((
            "S9".to_owned(),
            format!("{name} translated vs passed: 32 concurrent"),
            Scenario { workload: Workload::Messages, stream, chunks: 20, ..base(count(10_000.0), 32) },
        ));
    }
    // What translating adds to one stream's first byte: at 32 concurrent
    // on one gateway core, the p99 is mostly the wait for that core.
    list.push((
        "S9".to_owned(),
        "messages stream translated vs passed: 1 at a time".to_owned(),
        Scenario { workload: Workload::Messages, stream: true, chunks: 20, ..base(count(2_000.0), 1) },
    ));
    list
}

/// Runs the suite.
///
/// # Errors
/// A process cannot start or answer.
pub async fn run(options: SuiteOptions) -> anyhow::Result<SuiteReport> {
    let dir = waycast_mock::fixtures::temp_dir("bench");
    let (sink_process, sink) =
        start_sink(&options.bench, options.load_cpu.map(|cpu| cpu.to_string()).as_deref(), &[]).await?;
    let config = dir.join("gateway.json");
    std::fs::write(&config, gateway_config(sink, options.limits)?)?;
    let (gateway, public, admin) = start_gateway(&options, &config, &dir)?;
    wait_for(public, &authorized_chat(), Duration::from_secs(10)).await?;
    let gateway_pid = gateway.id();

    let mut comparisons = Vec::new();
    let mut rss = serde_json::Map::new();
    let mut s2_overhead = None;
    let mut s2_per_cpu_second = None;
    let wanted = |id: &str| options.only.as_deref().is_none_or(|only| only == id);
    for (id, title, scenario) in scenarios(options.scale).into_iter().filter(|(id, _, _)| wanted(id)) {
        eprintln!("bench: {id} {title}");
        // Each side first runs a tenth of the scenario (at least five rounds
        // of its concurrency), so connections and pools match its shape.
        let warm_up = scenario.requests.div_ceil(10).max(u64::from(scenario.concurrency) * 5);
        // S9's baseline is the gateway passing the request through; its
        // other side, the gateway translating it.
        let (baseline_target, through_model) =
            if id == "S9" { (public, TRANSLATED_MODEL.to_owned()) } else { (sink, scenario.model.clone()) };
        let through_scenario = Scenario { model: through_model, ..scenario.clone() };
        for (target, scenario) in [(baseline_target, &scenario), (public, &through_scenario)] {
            let warm = Scenario { target: format!("http://{target}"), requests: warm_up, ..scenario.clone() };
            source::run(warm).await.map_err(anyhow::Error::msg)?;
        }
        // Latency-target scenarios run three times per side, alternating, and
        // keep each side's run with the median p99: one slow run on a shared
        // machine should not decide a tail figure either way.
        let trials = if id == "S1" || id == "S3" || scenario.concurrency == 1 { 3 } else { 1 };
        let mut baselines = Vec::new();
        let mut throughs = Vec::new();
        let before = overhead_totals(admin).await;
        let cpu_before = cpu_seconds(gateway_pid);
        for _ in 0..trials {
            baselines.push(
                source::run(Scenario { target: format!("http://{baseline_target}"), ..scenario.clone() })
                    .await
                    .map_err(anyhow::Error::msg)?,
            );
            throughs.push(
                source::run(Scenario { target: format!("http://{public}"), ..through_scenario.clone() })
                    .await
                    .map_err(anyhow::Error::msg)?,
            );
        }
        let baseline = median_by_p99(baselines);
        let through = median_by_p99(throughs);
        if id == "S2"
            && let (Some((sum0, n0)), Some((sum1, n1))) = (before, overhead_totals(admin).await)
            && n1 > n0
        {
            s2_overhead = Some((sum1 - sum0) / (n1 - n0) * 1e6);
        }
        if id == "S2"
            && let (Some(cpu0), Some(cpu1)) = (cpu_before, cpu_seconds(gateway_pid))
            && cpu1 > cpu0
        {
            s2_per_cpu_second = Some(through.ok as f64 / (cpu1 - cpu0));
        }
        if id == "S1" || id == "S2" {
            rss.insert(format!("after{id}"), json!(peak_rss_mib(gateway_pid)));
        }
        comparisons.push(Comparison { id, title, scenario, baseline, gateway: through });
    }

    // S5: a fresh process each time, from spawn to the first authorized 200.
    let mut cold_start_ms = Vec::new();
    let extras = if options.only.is_some() { 0 } else { 5 };
    for _ in 0..extras {
        let started = Instant::now();
        let (process, fresh, _) = start_gateway(&options, &config, &dir)?;
        wait_for(fresh, &authorized_chat(), Duration::from_secs(10)).await?;
        cold_start_ms.push(started.elapsed().as_secs_f64() * 1e3);
        drop(process);
    }
    drop(gateway);
    let streams = ((1_000.0 * options.scale).round() as u64).max(10);
    let held_streams = if options.only.is_some() {
        None
    } else {
        eprintln!("bench: S8 {streams} concurrent streams through a fresh gateway");
        Some(held_streams(&options, &config, &dir, streams).await?)
    };
    drop(sink_process);
    let _ = std::fs::remove_dir_all(&dir);
    let binary_bytes = std::fs::metadata(&options.gateway).map(|m| m.len()).unwrap_or_default();
    Ok(SuiteReport {
        pinning: json!({"gatewayCpu": options.gateway_cpu, "loadCpu": options.load_cpu, "limits": options.limits}),
        comparisons,
        cold_start_ms,
        peak_rss_mib: serde_json::Value::Object(rss),
        s2_gateway_overhead_us: s2_overhead,
        s2_requests_per_gateway_cpu_second: s2_per_cpu_second,
        held_streams,
        gateway_binary_mib: binary_bytes as f64 / (1024.0 * 1024.0),
    })
}

/// The run whose latency p99 is the median of `runs` (not empty).
fn median_by_p99(mut runs: Vec<RunResult>) -> RunResult {
    runs.sort_by(|a, b| {
        let p99 = |r: &RunResult| r.latency.as_ref().map_or(f64::MAX, |l| l.p99);
        p99(a).total_cmp(&p99(b))
    });
    let middle = runs.len() / 2;
    runs.swap_remove(middle)
}

/// The report as a table, with the targets of the benchmark issue.
pub fn table(report: &SuiteReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<4} {:<46} {:<9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>6}",
        "", "scenario", "side", "req/s", "avg ms", "p50", "p90", "p99", "p99.9", "TTFB p99", "errors"
    );
    for c in &report.comparisons {
        for (side, r) in [("baseline", &c.baseline), ("gateway", &c.gateway)] {
            let l = r.latency.clone().unwrap_or_default();
            let ttfb = r.time_to_first_byte.as_ref().map_or_else(|| "-".to_owned(), |t| format!("{:.2}", t.p99));
            let _ = writeln!(
                out,
                "{:<4} {:<46} {:<9} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9} {:>6}",
                if side == "baseline" { c.id.as_str() } else { "" },
                if side == "baseline" { c.title.as_str() } else { "" },
                side,
                r.requests_per_second,
                l.avg,
                l.p50,
                l.p90,
                l.p99,
                l.p999,
                ttfb,
                r.errors
            );
        }
        let (b, g) = (c.baseline.latency.clone().unwrap_or_default(), c.gateway.latency.clone().unwrap_or_default());
        let ttfb_added = match (&c.baseline.time_to_first_byte, &c.gateway.time_to_first_byte) {
            (Some(b), Some(g)) => format!("{:+.2}", g.p99 - b.p99),
            _ => "-".to_owned(),
        };
        let ratio = if c.baseline.requests_per_second > 0.0 {
            c.gateway.requests_per_second / c.baseline.requests_per_second * 100.0
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "{:<4} {:<46} {:<9} {:>8.1}% {:>+8.2} {:>+8.2} {:>+8.2} {:>+8.2} {:>+8.2} {:>9}",
            "",
            "",
            "gw - base",
            ratio,
            g.avg - b.avg,
            g.p50 - b.p50,
            g.p90 - b.p90,
            g.p99 - b.p99,
            g.p999 - b.p999,
            ttfb_added
        );
    }
    let mut cold = report.cold_start_ms.clone();
    cold.sort_by(f64::total_cmp);
    if let Some(median) = cold.get(cold.len() / 2) {
        let _ = writeln!(out, "\nS5 cold start (spawn → first authorized 200): median {median:.1} ms, all {cold:.1?}");
    }
    let _ = writeln!(out, "S6 gateway peak RSS (MiB): {}", report.peak_rss_mib);
    if let Some(us) = report.s2_gateway_overhead_us {
        let _ = writeln!(out, "S2 time inside the gateway per request (its overhead histogram): {us:.1} µs");
    }
    if let Some(rate) = report.s2_requests_per_gateway_cpu_second {
        let _ = writeln!(out, "S2 requests per second of gateway CPU time: {rate:.0}");
    }
    if let Some(held) = &report.held_streams {
        held_line(&mut out, held);
    }
    let _ = writeln!(out, "gateway binary: {:.1} MiB", report.gateway_binary_mib);
    out
}

fn held_line(out: &mut String, held: &HeldStreams) {
    let _ = writeln!(
        out,
        "S8 {} concurrent streams ({} chunks {} ms apart) through a fresh gateway: RSS after start {:.1} MiB, peak {:.1} MiB → {:.1} KiB per stream; {:.3} ms gateway CPU per stream; TTFB p99 {:.2} ms; {} errors",
        held.streams,
        held.chunks,
        held.chunk_interval_ms,
        held.rss_after_start_mib,
        held.peak_rss_mib,
        held.rss_per_stream_kib,
        held.cpu_ms_per_stream,
        held.result.time_to_first_byte.as_ref().map_or(0.0, |t| t.p99),
        held.result.errors,
    );
}
