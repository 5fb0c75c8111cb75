//! waycast-bench: the sink answers every workload, the source counts what it
//! sends, the fixed-rate mode holds its rate, the REST API runs scenarios
//! and refuses bad ones, the page is served, and the suite compares a real
//! gateway process with the baseline.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use waycast_bench::sink::SinkOptions;
use waycast_bench::{Arrival, Scenario, Sweep, Workload, server, sink, source, study};

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
    let evenly = Scenario { rate: Some(200.0), arrival: Arrival::Uniform, requests: 100, ..scenario(sink) };
    let result = source::run(evenly).await.unwrap();
    let took = started.elapsed();
    assert_eq!(result.ok, 100);
    assert!(took >= Duration::from_millis(490) && took < Duration::from_millis(1500), "100 at 200/s took {took:?}");
    assert!((result.offered_requests_per_second.unwrap() - 200.0).abs() < 1e-6, "{result:?}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let result = source::run(Scenario { requests: 20, concurrency: 2, ..scenario(closed) }).await.unwrap();
    assert_eq!((result.ok, result.errors), (0, 20));
    assert!(result.error_samples[0].contains("connect"), "{:?}", result.error_samples);
    assert_eq!(result.errors_by_kind, [("connect".to_owned(), 20)].into(), "{result:?}");
}

/// A server that answers every request with `answer` and closes.
async fn answering(answer: &'static [u8]) -> SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0; 65536];
                let mut read = 0;
                while !buffer[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer[read..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read += n,
                    }
                }
                let _ = stream.write_all(answer).await;
            });
        }
    });
    address
}

/// Failures are counted by kind: a status, a stream that ends without its
/// end event, a stream cut off mid-body, an empty body.
#[tokio::test]
async fn failures_are_counted_by_kind() {
    use waycast_mock::upstream::{MockOptions, start};
    let mock = start("127.0.0.1:0".parse().unwrap(), MockOptions::default()).await.unwrap();
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let put = http::Request::put(format!("http://{}/_mock/status/503", mock.addr)).body(Full::new(bytes::Bytes::new()));
    assert_eq!(http.request(put.unwrap()).await.unwrap().status(), 200);
    let result = source::run(Scenario { requests: 10, concurrency: 2, ..scenario(mock.addr) }).await.unwrap();
    assert_eq!(result.errors_by_kind, [("status 503".to_owned(), 10)].into(), "{result:?}");

    let unended: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    let cut: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 500\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    let empty: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    for (answer, stream, kind) in [
        (unended, true, "broken stream"),
        (cut, true, "broken stream"),
        (cut, false, "broken body"),
        (empty, false, "empty body"),
    ] {
        let server = answering(answer).await;
        let result = source::run(Scenario { stream, requests: 4, concurrency: 1, ..scenario(server) }).await.unwrap();
        assert_eq!(result.errors_by_kind, [(kind.to_owned(), 4)].into(), "{kind}: {result:?}");
    }
}

/// The vLLM-like mock with 8 slots and 10 tokens of 10 ms an answer serves
/// 80 requests a second; a sweep from half to twice that finds it.
#[tokio::test]
async fn a_rate_sweep_finds_the_vllm_mocks_capacity() {
    let (mock, capacity) = vllm_mock(8, 10, 10).await;
    let sweep = Scenario {
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        max_tokens: Some(10),
        sweep: Some(Sweep { from: 40.0, to: 160.0, steps: 7 }),
        requests: 100,
        concurrency: 64,
        ..scenario(mock)
    };
    let report = study::run(sweep, |_| {}).await.unwrap();
    let sweep = report.sweep.unwrap();
    assert_eq!(sweep.steps.iter().map(|s| s.rate).collect::<Vec<_>>(), [40.0, 60.0, 80.0, 100.0, 120.0, 140.0, 160.0]);
    let saturation = sweep.saturation.unwrap();
    let most = sweep.steps.iter().map(|s| s.target.sustained_requests_per_second).fold(0.0, f64::max);
    assert_eq!(saturation.requests_per_second, most, "the capacity is the most any step sustained");
    let off = (saturation.requests_per_second - capacity).abs() / capacity;
    assert!(off <= 0.1, "found {saturation:?}, the mock serves {capacity}/s");
    assert!(saturation.first_saturated_rate >= 80.0 && saturation.first_saturated_rate <= 100.0, "{saturation:?}");
    for step in &sweep.steps {
        assert_eq!(step.target.errors, 0, "{step:?}");
        // Below capacity, what was offered is served.
        let offered = step.target.offered_requests_per_second.unwrap();
        if offered < capacity * 0.85 {
            assert!(step.target.sustained_requests_per_second >= offered * 0.9, "{step:?}");
        }
    }
}

/// The vLLM-like mock: `slots` at once, `tokens` output tokens `token_ms`
/// apart, no prefill; returns where it listens and the requests per second
/// it serves at `max_tokens = tokens`.
async fn vllm_mock(slots: usize, tokens: u32, token_ms: u64) -> (SocketAddr, f64) {
    use waycast_mock::upstream::{MockOptions, start};
    use waycast_mock::vllm::{Engine, VllmOptions};
    let engine = Engine::new(VllmOptions {
        slots,
        prefill_per_byte: Duration::ZERO,
        token_time: Duration::from_millis(token_ms),
        ..VllmOptions::default()
    });
    let options = MockOptions { vllm: Some(std::sync::Arc::new(engine)), ..MockOptions::default() };
    let server = start("127.0.0.1:0".parse().unwrap(), options).await.unwrap();
    let addr = server.addr;
    // Kept running for the test's life.
    std::mem::forget(server);
    (addr, slots as f64 * 1000.0 / (f64::from(tokens) * token_ms as f64))
}

/// The CLI: a run with a baseline in rounds prints the table, writes JSON and CSV.
#[tokio::test]
async fn the_cli_runs_against_a_baseline_and_writes_json_and_csv() {
    let (mock, _) = vllm_mock(4, 5, 2).await;
    // The baseline is a server of its own, so the test sees that it was asked.
    let baseline = {
        use waycast_mock::upstream::{MockOptions, start};
        start("127.0.0.1:0".parse().unwrap(), MockOptions { chunks: 5, ..MockOptions::default() }).await.unwrap()
    };
    let dir = waycast_mock::fixtures::temp_dir("bench-cli");
    let (json_path, csv_path) = (dir.join("run.json"), dir.join("run.csv"));
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
        .args(["run", "--target", &format!("http://{mock}"), "--baseline", &format!("http://{}/v1", baseline.addr)])
        .args([
            "--model",
            "m",
            "--max-tokens",
            "5",
            "--stream",
            "--requests",
            "40",
            "--concurrency",
            "4",
            "--rounds",
            "2",
        ])
        .arg("--out")
        .arg(&json_path)
        .arg("--csv")
        .arg(&csv_path)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("round 2 of 2") && stderr.contains("added by the target over the baseline"), "{stderr}");
    assert!(stderr.contains("timeToFirstToken"), "{stderr}");
    let printed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(printed, written);
    assert_eq!(written["target"]["outputTokens"], 40 * 5, "{written}");
    assert!(written["baseline"]["timeToFirstToken"]["p50"].as_f64().is_some(), "{written}");
    let csv = std::fs::read_to_string(&csv_path).unwrap();
    assert!(csv.lines().any(|l| l.starts_with("pooled,baseline,,,40,40,0,")), "{csv}");
    // The baseline's server got its warm-up (4, the concurrency) and its 40.
    assert_eq!(baseline.recorder.requests().await.len(), 4 + 40);
    let firsts: Vec<&str> =
        written["rounds"].as_array().unwrap().iter().map(|r| r["first"].as_str().unwrap()).collect();
    assert_eq!(firsts, ["target", "baseline"], "the sides take turns going first");
    let _ = std::fs::remove_dir_all(&dir);

    // Bad flags exit 64 with the field named.
    let bad = tokio::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
        .args(["run", "--target", "http://127.0.0.1:1", "--sweep", "9:3:2"])
        .output()
        .await
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("sweep"), "{bad:?}");
    let bad = tokio::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
        .args(["run", "--target", "http://127.0.0.1:1", "--requests", "2", "--rounds", "3"])
        .output()
        .await
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("rounds"), "{bad:?}");
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
    // A stream asks for its usage, which servers send only when asked.
    let streamed: serde_json::Value =
        serde_json::from_slice(&source::request_body(&Scenario { stream: true, ..base() })).unwrap();
    assert_eq!(streamed["stream_options"]["include_usage"], true, "{streamed}");
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

/// The token of the servers these tests start in-process.
const TOKEN: &str = "test-token-of-at-least-thirty-two-characters";

/// A bench server on loopback answering `/runs` also by `allowed_hosts`, with [`TOKEN`].
async fn bench_server(allowed_hosts: Vec<String>) -> SocketAddr {
    let options = server::ServeOptions {
        sink: SinkOptions::default(),
        allowed_hosts,
        targets: waycast_bench::access::Targets::default(),
        tokens: waycast_bench::access::Tokens::from_text(TOKEN).unwrap(),
    };
    server::start("127.0.0.1:0".parse().unwrap(), options).await.unwrap()
}

async fn call(address: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value, String) {
    call_with(address, method, path, body, &[("content-type", "application/json")]).await
}

async fn call_with(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, serde_json::Value, String) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{address}{path}"))
        .header("authorization", format!("Bearer {TOKEN}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(bytes::Bytes::from(body.to_owned()))).unwrap();
    let response = http.request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (status, serde_json::from_str(&text).unwrap_or_default(), text)
}

/// Run `id` once it is no longer running.
async fn finished(address: SocketAddr, id: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, run, _) = call(address, "GET", &format!("/runs/{id}"), "").await;
        assert_eq!(status, 200);
        if run["status"] != "running" {
            return run;
        }
        assert!(Instant::now() < deadline, "the run never finished: {run}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_rest_api_runs_scenarios_and_the_page_drives_it() {
    let address = bench_server(Vec::new()).await;
    // The server's own /v1 routes are a sink: a run against itself, with
    // itself as the baseline too, in two rounds.
    let body = serde_json::json!({"target": format!("http://{address}"), "baseline": format!("http://{address}/v1"), "rounds": 2,
        "requests": 200, "concurrency": 4, "stream": true, "chunks": 2, "key": "wc_secret", "baselineKey": "sk-secret"});
    let (status, answer, _) = call(address, "POST", "/runs", &body.to_string()).await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_u64().unwrap();
    let run = finished(address, id).await;
    assert_eq!(run["status"], "done", "{run}");
    for side in ["target", "baseline"] {
        let result = &run["result"][side];
        assert_eq!(result["ok"], 200, "{run}");
        assert!(result["timeToFirstToken"]["p99"].as_f64().is_some(), "{run}");
        assert!(result["interTokenLatency"]["p50"].as_f64().is_some(), "{run}");
        // The sink reports 20 output tokens an answer.
        assert_eq!(result["outputTokens"], 200 * 20, "{run}");
        assert!(result["percentiles"].as_array().unwrap().len() > 10, "{run}");
        assert!(result["ttftPercentiles"].as_array().unwrap().len() > 10, "{run}");
    }
    assert_eq!(run["result"]["rounds"].as_array().unwrap().len(), 2, "{run}");
    let added = run["result"]["added"].as_array().unwrap();
    let ttft = added.iter().find(|a| a["figure"] == "timeToFirstToken" && a["percentile"] == "p99").unwrap();
    assert!(ttft["minMs"].as_f64().unwrap() <= ttft["medianMs"].as_f64().unwrap(), "{ttft}");
    assert!(ttft["medianMs"].as_f64().unwrap() <= ttft["maxMs"].as_f64().unwrap(), "{ttft}");
    let (_, list, text) = call(address, "GET", "/runs", "").await;
    assert_eq!(list[0]["id"], id);
    // Keys are sent, never shown.
    assert_eq!(
        (list[0]["scenario"]["key"].as_str(), list[0]["scenario"]["baselineKey"].as_str()),
        (Some("(redacted)"), Some("(redacted)"))
    );
    assert!(!text.contains("secret"), "{text}");

    // The run as files to keep.
    let (status, kept, _) = call(address, "GET", &format!("/runs/{id}.json"), "").await;
    assert_eq!((status, &kept["result"]), (200, &run["result"]));
    let (status, _, csv) = call(address, "GET", &format!("/runs/{id}.csv"), "").await;
    assert_eq!(status, 200);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("row,side,round,rate,requests,ok,errors"), "{csv}");
    assert!(lines.iter().any(|l| l.starts_with("pooled,target,,,200,200,0,")), "{csv}");
    assert!(lines.iter().any(|l| l.starts_with("round,baseline,2,")), "{csv}");
    assert!(lines.iter().any(|l| l.starts_with("added,median,")), "{csv}");
    let columns = lines[0].split(',').count();
    assert!(lines.iter().all(|l| l.split(',').count() == columns), "{csv}");
    let (status, _, _) = call(address, "GET", &format!("/runs/{id}.xml"), "").await;
    assert_eq!(status, 404);

    // Bad scenarios are refused with a message, and nothing starts.
    for (bad, expected) in [
        (r#"{"target":"http://x","requests":0,"concurrency":1}"#, "requests"),
        (r#"{"target":"http://x","requests":1,"concurrency":1,"colour":"red"}"#, "unknown field"),
        (r#"{"target":"http://x","requests":1,"concurrency":1,"baseline":"https://y"}"#, "baseline"),
        (r#"{"target":"http://x","requests":10,"concurrency":1,"sweep":{"from":5,"to":1,"steps":3}}"#, "sweep"),
        (
            r#"{"target":"http://x","requests":10,"concurrency":1,"rate":5,"sweep":{"from":1,"to":5,"steps":3}}"#,
            "not both",
        ),
        (r#"{"target":"http://x","requests":2,"concurrency":1,"rounds":3}"#, "rounds"),
        (r#"{"target":"http://x","requests":1,"concurrency":1,"rate":0.001}"#, "rates must be between"),
        // Each step alone takes under a week; the fifty together do not.
        (r#"{"target":"http://x","requests":600000,"concurrency":1,"sweep":{"from":1,"to":2,"steps":50}}"#, "week"),
        ("not json", "invalid scenario"),
    ] {
        let (status, answer, _) = call(address, "POST", "/runs", bad).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(expected), "{bad}: {answer}");
    }
    let (status, _, _) = call(address, "GET", "/runs/999", "").await;
    assert_eq!(status, 404);

    // Fewer requests a round than rounds: each round still runs its share.
    let thin = serde_json::json!({"target": format!("http://{address}"), "baseline": format!("http://{address}"),
        "requests": 12, "rounds": 4, "concurrency": 2, "warmup": 0});
    let (status, answer, _) = call(address, "POST", "/runs", &thin.to_string()).await;
    assert_eq!(status, 202, "{answer}");
    let thin = finished(address, answer["id"].as_u64().unwrap()).await;
    assert_eq!((thin["status"].as_str(), thin["result"]["target"]["ok"].as_u64()), (Some("done"), Some(12)), "{thin}");
    assert_eq!(thin["result"]["rounds"].as_array().unwrap().len(), 4, "{thin}");

    // Only this server's own page, or a client that is no browser, starts runs.
    let small = serde_json::json!({"target": format!("http://{address}"), "requests": 1, "concurrency": 1}).to_string();
    let (status, answer, _) = call_with(address, "POST", "/runs", &small, &[("content-type", "text/plain")]).await;
    assert_eq!(status, 415, "{answer}");
    let foreign = [("content-type", "application/json"), ("origin", "http://evil.example")];
    let (status, answer, _) = call_with(address, "POST", "/runs", &small, &foreign).await;
    assert_eq!(status, 403, "{answer}");
    // A page behind a proxy that ends TLS is this server's own.
    let proxied_origin = format!("https://{address}");
    let proxied = [("content-type", "application/json"), ("origin", proxied_origin.as_str())];
    let (status, answer, _) = call_with(address, "POST", "/runs", &small, &proxied).await;
    assert_eq!(status, 202, "{answer}");
    finished(address, answer["id"].as_u64().unwrap()).await;
    // A name made to point here (DNS rebinding) neither reads runs nor starts them.
    for (method, body) in [("GET", ""), ("POST", small.as_str())] {
        let rebound = [("content-type", "application/json"), ("host", "evil.example:8090")];
        let (status, answer, _) = call_with(address, method, "/runs", body, &rebound).await;
        assert_eq!(status, 403, "{method}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("--allowed-host"), "{answer}");
    }
    let named = bench_server(vec!["waycast-bench".into()]).await;
    let (status, _, _) = call_with(named, "GET", "/runs", "", &[("host", "waycast-bench:8090")]).await;
    assert_eq!(status, 200, "an allowed name");

    // One run at a time: a second one while the first runs is refused.
    let slow =
        serde_json::json!({"target": format!("http://{address}"), "requests": 20, "concurrency": 1, "waitMs": 100});
    let (status, first, _) = call(address, "POST", "/runs", &slow.to_string()).await;
    assert_eq!(status, 202, "{first}");
    let (status, answer, _) = call(address, "POST", "/runs", &slow.to_string()).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("still running"), "{answer}");
    // Cancelled, it stops (20 requests of 100 ms would take 2 s) and the next may start.
    let first = first["id"].as_u64().unwrap();
    let (status, cancelled, _) = call(address, "DELETE", &format!("/runs/{first}"), "").await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")), "{cancelled}");
    let (status, _, _) = call(address, "DELETE", &format!("/runs/{first}"), "").await;
    assert_eq!(status, 409, "a run is cancelled once");
    let (status, answer, _) = call(address, "POST", "/runs", &small).await;
    assert_eq!(status, 202, "{answer}");
    let (status, _, _) = call(address, "GET", "/", "").await;
    assert_eq!(status, 200, "the page (driven in a browser by tests/own_stack.rs)");
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
        only: None,
    };
    let report = waycast_bench::suite::run(options).await.unwrap();
    assert_eq!(report.comparisons.len(), 4 + 6 + 3);
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
    let held = report.held_streams.as_ref().unwrap();
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
