//! A benchmark, not a test of timing (run by hand, `#[ignore]`): the
//! collector down for a minute under load. A gateway process (set
//! `WAYCAST_GATEWAY_BIN` to a release build for figures) exports every
//! request's spans and usage record to a real OpenTelemetry Collector; 16
//! clients keep it busy through three phases — the collector up, killed
//! (its port closed), started again on the same port — and the benchmark
//! prints each phase's requests, p50 and p99, the gateway's resident memory
//! at its peak, and what the exporter counted: spans and records
//! exported, dropped, and records still held for a retry at the end.
//! `OUTAGE=silent`: the collector's port accepts connections and never
//! answers instead (each export waits out its deadline).
//!
//! ```text
//! WAYCAST_GATEWAY_BIN=target/release/waycast-gateway OUTAGE_SECONDS=60 [OUTAGE=silent] \
//!   cargo test -p waycast-gateway --test telemetry_outage -- --ignored --nocapture
//! ```
//!
//! It asserts only what is not timing: every request answered 200, spans
//! dropped and counted while the collector is down, and the records of the
//! outage delivered or counted once it is back.

#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on any unexpected error")]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt as _;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::GatewayProcess;
use waycast_mock::collector::Collector;
use waycast_mock::fixtures::{self as fixture, ALICE_KEY, free_port};
use waycast_mock::upstream::{self as mock_upstream, MockOptions};

const CLIENTS: usize = 16;

/// Each phase's latencies, in microseconds.
async fn load(url: String, seconds: u64) -> Vec<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (url, stop) = (url.clone(), stop.clone());
        clients.spawn(async move {
            let http = Client::builder(TokioExecutor::new()).build_http();
            let body = r#"{"model":"mistral-7b","messages":[{"role":"user","content":"is the collector there?"}]}"#;
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let response = http.request(fixture::post_request(&url, Some(ALICE_KEY), body)).await.unwrap();
                assert_eq!(response.status(), 200);
                response.into_body().collect().await.unwrap();
                took.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            took
        });
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    while let Some(took) = clients.join_next().await {
        all.extend(took.unwrap());
    }
    all.sort_unstable();
    all
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let index = ((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1));
    #[allow(clippy::cast_precision_loss)]
    let micros = sorted.get(index).copied().unwrap_or(0) as f64;
    micros / 1000.0
}

/// Accepts connections on `address` and holds them, never answering,
/// until the flag is set (and one more connection arrives).
fn silent_listener(address: SocketAddr) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let listener = std::net::TcpListener::bind(address).unwrap();
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            if stopped.load(Ordering::Relaxed) {
                break;
            }
            held.extend(stream.ok());
        }
    });
    stop
}

#[tokio::test]
#[ignore = "a benchmark: minutes long, prints figures"]
async fn the_collector_down_for_a_minute_under_load() {
    let seconds: u64 = std::env::var("OUTAGE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let loopback = IpAddr::from([127, 0, 0, 1]);
    let port = free_port(loopback).unwrap();
    let mock = mock_upstream::start(SocketAddr::new(loopback, 0), MockOptions::default()).await.unwrap();
    let config = fixture::default_config(&mock.base_url());
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut collector = Some(Collector::start_at(loopback, port).unwrap());
    let gateway =
        GatewayProcess::start(&config, &["--otlp-endpoint", &endpoint, "--otlp-sampling", "1", "--workers", "1"]).await;
    let url = gateway.url("/v1/chat/completions");
    let counted = |signal: &str, what: &str| format!("waycast_gateway_telemetry_{what}{{signal=\"{signal}\"}}");
    let dropped = |signal: &str, reason: &str| {
        format!("waycast_gateway_telemetry_dropped_total{{reason=\"{reason}\",signal=\"{signal}\"}}")
    };

    println!("| phase | requests | p50 ms | p99 ms | peak RSS MiB |");
    println!("|---|---|---|---|---|");
    let mut requests = 0;
    let mut p99s = Vec::new();
    let silent = std::env::var("OUTAGE").is_ok_and(|kind| kind == "silent");
    let mut hole = None;
    for phase in ["collector up", "collector down", "collector back"] {
        match phase {
            "collector down" => {
                collector = None;
                if silent {
                    hole = Some(silent_listener(SocketAddr::new(loopback, port)));
                }
            }
            "collector back" => {
                if let Some(stop) = hole.take() {
                    stop.store(true, Ordering::Relaxed);
                    // The listener's thread notices at its next accept.
                    let _ = std::net::TcpStream::connect(SocketAddr::new(loopback, port));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                collector = Some(Collector::start_at(loopback, port).unwrap());
            }
            _ => {}
        }
        let took = load(url.clone(), if phase == "collector down" { seconds } else { seconds / 2 }).await;
        requests += took.len();
        let (_, peak) = gateway.memory();
        #[allow(clippy::cast_precision_loss)]
        let peak = peak as f64 / 1024.0 / 1024.0;
        let (p50, p99) = (percentile(&took, 0.5), percentile(&took, 0.99));
        p99s.push(p99);
        println!("| {phase} | {} | {p50:.3} | {p99:.3} | {peak:.1} |", took.len());
        if phase == "collector down" {
            let spans = gateway.metric(&dropped("traces", "export_failed")).await.unwrap_or(0.0);
            assert!(spans > 0.0, "no span counted as dropped while the collector was down");
        }
    }
    // The last retries: 30 s apart at most once the backoff has grown.
    let deadline = Instant::now() + Duration::from_secs(90);
    let metric = |name: String| {
        let gateway = &gateway;
        async move { gateway.metric(&name).await.unwrap_or(0.0) }
    };
    let mut settled;
    loop {
        let records = metric(counted("logs", "exported_total")).await
            + metric(dropped("logs", "export_failed")).await
            + metric(dropped("logs", "retry_full")).await
            + metric(dropped("logs", "queue_full")).await;
        #[allow(clippy::cast_precision_loss)]
        let all = requests as f64;
        settled = records >= all;
        if settled || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!();
    println!("| signal | exported | dropped: queue_full | export_failed | retry_full |");
    println!("|---|---|---|---|---|");
    for signal in ["traces", "logs"] {
        println!(
            "| {signal} | {} | {} | {} | {} |",
            metric(counted(signal, "exported_total")).await,
            metric(dropped(signal, "queue_full")).await,
            metric(dropped(signal, "export_failed")).await,
            metric(dropped(signal, "retry_full")).await,
        );
    }
    println!("\n{requests} requests, every one answered 200; p99 down / up: {:.2}", p99s[1] / p99s[0]);
    assert!(settled, "usage records neither delivered nor counted dropped 90 s after the collector came back");
    drop(collector);
}
