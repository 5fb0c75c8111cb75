//! waycast-bench: the sink answers every workload, the source counts what it
//! sends, the fixed-rate mode holds its rate, the REST API runs scenarios
//! and refuses bad ones, the page is served, and the suite compares a real
//! gateway process with the baseline.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use waycast_bench::sink::SinkOptions;
use waycast_bench::{Scenario, Workload, server, sink, source};

fn scenario(target: SocketAddr) -> Scenario {
    serde_json::from_value(serde_json::json!({"target": format!("http://{target}"), "requests": 300, "concurrency": 8}))
        .unwrap()
}

#[tokio::test]
async fn every_workload_streamed_or_not_completes_without_errors() {
    let sink = sink::start("127.0.0.1:0".parse().unwrap(), SinkOptions::default()).await.unwrap();
    for workload in [Workload::Chat, Workload::Responses, Workload::Messages] {
        for stream in [false, true] {
            let result = source::run(Scenario { workload, stream, chunks: 3, ..scenario(sink) }).await.unwrap();
            assert_eq!((result.ok, result.errors), (300, 0), "{workload:?} stream={stream}: {result:?}");
            assert_eq!(result.time_to_first_byte.is_some(), stream);
            let latency = result.latency.unwrap();
            assert!(latency.p50 <= latency.p99 && latency.p99 <= latency.max, "{latency:?}");
        }
    }
}

#[tokio::test]
async fn the_sink_waits_and_spaces_chunks_as_asked() {
    let sink = sink::start("127.0.0.1:0".parse().unwrap(), SinkOptions::default()).await.unwrap();
    let result = source::run(Scenario {
        stream: true,
        wait_ms: 50,
        chunks: 4,
        chunk_interval_ms: 20,
        requests: 20,
        concurrency: 4,
        ..scenario(sink)
    })
    .await
    .unwrap();
    let (latency, first) = (result.latency.unwrap(), result.time_to_first_byte.unwrap());
    // First byte after the wait; the end after four more 20 ms pauses.
    assert!(first.p50 >= 50.0 && first.p50 < 90.0, "{first:?}");
    assert!(latency.p50 >= 130.0 && latency.p50 < 200.0, "{latency:?}");
}

#[tokio::test]
async fn a_fixed_rate_is_held_and_an_unreachable_target_is_counted_not_fatal() {
    let sink = sink::start("127.0.0.1:0".parse().unwrap(), SinkOptions::default()).await.unwrap();
    let started = Instant::now();
    let result = source::run(Scenario { rate: Some(200.0), requests: 100, ..scenario(sink) }).await.unwrap();
    let took = started.elapsed();
    assert_eq!(result.ok, 100);
    assert!(took >= Duration::from_millis(490) && took < Duration::from_millis(1500), "100 at 200/s took {took:?}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let result = source::run(Scenario { requests: 20, concurrency: 2, ..scenario(closed) }).await.unwrap();
    assert_eq!((result.ok, result.errors), (0, 20));
    assert!(result.error_samples[0].contains("connect"), "{:?}", result.error_samples);
}

/// Pointed straight at an inference server (the mock in its vLLM-like mode,
/// which generates `max_tokens` tokens): every request names the model and
/// the length asked for, and a generation longer than `--timeout-ms` that
/// keeps streaming is not cut off — silence is.
#[tokio::test]
async fn a_real_servers_model_and_length_and_a_long_stream_within_the_silence_timeout() {
    use waycast_mock::upstream::{MockOptions, start};
    use waycast_mock::vllm::{Engine, VllmOptions};
    let engine = Engine::new(VllmOptions {
        slots: 8,
        prefill_per_byte: Duration::ZERO,
        token_time: Duration::from_millis(20),
        ..VllmOptions::default()
    });
    let server = start(
        "127.0.0.1:0".parse().unwrap(),
        MockOptions { vllm: Some(std::sync::Arc::new(engine)), ..MockOptions::default() },
    )
    .await
    .unwrap();
    let long = Scenario {
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        max_tokens: Some(25),
        stream: true,
        requests: 4,
        concurrency: 4,
        // 25 tokens 20 ms apart: 0.5 s in all, never 0.2 s without a byte.
        timeout_ms: 200,
        ..scenario(server.addr)
    };
    let result = source::run(long.clone()).await.unwrap();
    assert_eq!((result.ok, result.errors), (4, 0), "{:?}", result.error_samples);
    assert!(result.latency.unwrap().p50 >= 480.0, "25 tokens at 20 ms each");
    let sent = server.recorder.last().await.unwrap().json();
    assert_eq!(
        (sent["model"].as_str(), sent["max_tokens"].as_u64()),
        (Some("meta-llama/Llama-3.1-8B-Instruct"), Some(25))
    );

    // Not streamed, the whole answer must come within the timeout.
    let result = source::run(Scenario { stream: false, ..long }).await.unwrap();
    assert_eq!((result.ok, result.errors), (0, 4));
    assert!(result.error_samples[0].contains("no whole answer within 200 ms"), "{:?}", result.error_samples);
}

#[test]
fn request_bodies_name_the_model_and_length_for_each_api_and_are_refused_when_unsendable() {
    let base =
        || Scenario { model: "qwen/Qwen3-8B".into(), max_tokens: Some(7), ..scenario("127.0.0.1:1".parse().unwrap()) };
    for (workload, field) in
        [(Workload::Chat, "max_tokens"), (Workload::Responses, "max_output_tokens"), (Workload::Messages, "max_tokens")]
    {
        let body = source::request_body(&Scenario { workload, ..base() });
        assert_eq!(body.len(), 1024, "{workload:?}");
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((json["model"].as_str(), json[field].as_u64()), (Some("qwen/Qwen3-8B"), Some(7)), "{workload:?}");
    }
    let unlimited = source::request_body(&Scenario { max_tokens: None, ..base() });
    assert!(serde_json::from_slice::<serde_json::Value>(&unlimited).unwrap().get("max_tokens").is_none());
    for bad in [
        Scenario { model: String::new(), ..base() },
        Scenario { model: "a\"b".into(), ..base() },
        Scenario { max_tokens: Some(0), ..base() },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

async fn call(address: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value, String) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{address}{path}"))
        .body(Full::new(bytes::Bytes::from(body.to_owned())))
        .unwrap();
    let response = http.request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (status, serde_json::from_str(&text).unwrap_or_default(), text)
}

#[tokio::test]
async fn the_rest_api_runs_scenarios_and_the_page_drives_it() {
    let address = server::start("127.0.0.1:0".parse().unwrap(), SinkOptions::default()).await.unwrap();
    // The server's own /v1 routes are a sink: a baseline run against itself.
    let body = serde_json::json!({"target": format!("http://{address}"), "requests": 200, "concurrency": 4, "stream": true, "chunks": 2});
    let (status, answer, _) = call(address, "POST", "/runs", &body.to_string()).await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let run = loop {
        let (status, run, _) = call(address, "GET", &format!("/runs/{id}"), "").await;
        assert_eq!(status, 200);
        if run["status"] != "running" {
            break run;
        }
        assert!(Instant::now() < deadline, "the run never finished: {run}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(run["status"], "done", "{run}");
    assert_eq!(run["result"]["ok"], 200, "{run}");
    assert!(run["result"]["timeToFirstByte"]["p99"].as_f64().is_some(), "{run}");
    assert!(run["result"]["percentiles"].as_array().unwrap().len() > 10, "{run}");
    let (_, list, _) = call(address, "GET", "/runs", "").await;
    assert_eq!(list[0]["id"], id);

    // Bad scenarios are refused with a message, and nothing starts.
    for (bad, expected) in [
        (r#"{"target":"http://x","requests":0,"concurrency":1}"#, "requests"),
        (r#"{"target":"http://x","requests":1,"concurrency":1,"colour":"red"}"#, "unknown field"),
        ("not json", "invalid scenario"),
    ] {
        let (status, answer, _) = call(address, "POST", "/runs", bad).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(expected), "{bad}: {answer}");
    }
    let (status, _, _) = call(address, "GET", "/runs/999", "").await;
    assert_eq!(status, 404);

    // The page posts to /runs and polls /runs/ID, and has the table and plot.
    let (status, _, page) = call(address, "GET", "/", "").await;
    assert_eq!(status, 200);
    for needle in [
        "<form id=\"scenario\"",
        "fetch(\"/runs\", { method: \"POST\"",
        "fetch(`/runs/${id}`)",
        "<table id=\"results\"",
        "<svg id=\"plot\"",
    ] {
        assert!(page.contains(needle), "the page lacks {needle}");
    }
}

#[tokio::test]
async fn the_suite_compares_a_gateway_process_with_the_baseline() {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_waycast-bench")).parent().unwrap();
    let out = std::env::temp_dir().join(format!("waycast-bench-suite-{}.json", std::process::id()));
    let options = waycast_bench::suite::SuiteOptions {
        gateway: dir.join("waycast-gateway"),
        bench: env!("CARGO_BIN_EXE_waycast-bench").into(),
        out: out.clone(),
        scale: 0.001,
        gateway_cpu: None,
        load_cpu: None,
        gateway_log: "info".into(),
        // Generous limits: the suite must run through the limit check without a refusal.
        limits: true,
    };
    let report = waycast_bench::suite::run(options).await.unwrap();
    assert_eq!(report.comparisons.len(), 4 + 6);
    for comparison in &report.comparisons {
        for side in [&comparison.baseline, &comparison.gateway] {
            assert_eq!(side.errors, 0, "{}: {:?}", comparison.id, side.error_samples);
            assert_eq!(side.ok, side.requests);
        }
    }
    assert_eq!(report.cold_start_ms.len(), 5);
    assert!(report.cold_start_ms.iter().all(|ms| *ms > 0.0 && *ms < 10_000.0), "{:?}", report.cold_start_ms);
    assert!(report.peak_rss_mib["afterS1"].as_f64().is_some_and(|mib| mib > 1.0), "{}", report.peak_rss_mib);
    assert!(report.s2_gateway_overhead_us.is_some_and(|us| us > 0.0));
    let held = &report.held_streams;
    assert_eq!((held.result.ok, held.result.errors), (10, 0), "{:?}", held.result.error_samples);
    assert!(held.peak_rss_mib >= held.rss_after_start_mib && held.rss_after_start_mib > 1.0, "{held:?}");
    let table = waycast_bench::suite::table(&report);
    assert!(
        table.contains("S1")
            && table.contains("gw - base")
            && table.contains("S5 cold start")
            && table.contains("S8 10 concurrent streams"),
        "{table}"
    );
}
