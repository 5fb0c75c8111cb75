//! A user's own stack: the vLLM-like mock behind a standalone gateway
//! process, benchmarked through the gateway with the mock reached directly
//! as the baseline — from the page, as a user drives it in headless
//! Chromium (Debian's package, installed by `make browser-deps`), from the
//! REST API and from the CLI. The page test types into the form, clicks
//! Run, and reads the table, the added-time table, the plots and the CSV
//! link, then sweeps the rate against the mock.
//!
//! Chromium is driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: commands on its fd 3, answers on its fd 4,
//! each a JSON text ended by a NUL byte), so no WebSocket client is needed.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use waycast_bench::process::{Process, chat, local_address, wait_for};
use waycast_bench::sink::SinkOptions;
use waycast_bench::suite::{SUITE_KEY, gateway_config_for};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Headless Chromium with one page open.
struct Browser {
    _child: Child,
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
    next_id: u64,
    session: Option<String>,
    profile: PathBuf,
}

impl Browser {
    async fn launch() -> Self {
        let chromium = std::env::var("WAYCAST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&chromium).exists(),
            "{chromium} is missing: `make browser-deps` installs Debian's chromium (or set WAYCAST_CHROMIUM)"
        );
        let profile = waycast_mock::fixtures::temp_dir("bench-chromium");
        // The shell hands our pipes to Chromium as its fds 3 and 4.
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>/dev/null"#)
            .arg(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let commands = child.stdin.take().unwrap();
        let answers = BufReader::new(child.stdout.take().unwrap());
        Self { _child: child, commands, answers, next_id: 0, session: None, profile }
    }

    /// One DevTools command; its result (events in between are skipped).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.commands.write_all(&bytes).await.unwrap();
        loop {
            let mut answer = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(30), self.answers.read_until(0, &mut answer));
            assert!(read.await.unwrap().unwrap() > 0, "chromium closed its pipe during {method}");
            answer.pop();
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    async fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", json!({"url": url})).await;
        let attached =
            self.call("Target.attachToTarget", json!({"targetId": target["targetId"], "flatten": true})).await;
        self.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
        self.wait_until("document.readyState === 'complete' && !!document.getElementById('run')", 20).await;
    }

    /// The value of a script in the page (awaited when a promise).
    async fn eval(&mut self, expression: &str) -> Value {
        let answer = self
            .call("Runtime.evaluate", json!({"expression": expression, "awaitPromise": true, "returnByValue": true}))
            .await;
        assert!(answer.get("exceptionDetails").is_none(), "{expression}: {answer}");
        answer["result"]["value"].clone()
    }

    /// Clears the field named `name` and types `text` into it.
    async fn type_into(&mut self, name: &str, text: &str) {
        let focused = self
            .eval(&format!(
                "(() => {{ const el = document.querySelector('[name=\"{name}\"]'); el.value = ''; el.focus(); return document.activeElement === el; }})()"
            ))
            .await;
        assert_eq!(focused, json!(true), "{name}");
        if !text.is_empty() {
            self.call("Input.insertText", json!({"text": text})).await;
        }
    }

    /// Picks `value` in the select named `name`, as a user's choice does (a change event).
    async fn choose(&mut self, name: &str, value: &str) {
        self.eval(&format!(
            "(() => {{ const el = document.querySelector('select[name=\"{name}\"]'); el.value = '{value}'; el.dispatchEvent(new Event('change')); return el.value; }})()"
        ))
        .await;
    }

    /// A mouse click in the middle of the element `selector` selects.
    async fn click(&mut self, selector: &str) {
        let at = self
            .eval(&format!(
                "(() => {{ const el = document.querySelector('{selector}'); el.scrollIntoView({{block: 'center'}}); const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
            ))
            .await;
        for kind in ["mousePressed", "mouseReleased"] {
            let event = json!({"type": kind, "x": at[0], "y": at[1], "button": "left", "clickCount": 1});
            self.call("Input.dispatchMouseEvent", event).await;
        }
    }

    /// Polls `expression` until it is truthy; returns its value.
    async fn wait_until(&mut self, expression: &str, seconds: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            let value = self.eval(expression).await;
            if !(value.is_null() || value == json!(false) || value == json!("")) {
                return value;
            }
            if Instant::now() >= deadline {
                let page = self.eval("document.getElementById('error').textContent + ' | ' + document.getElementById('results').innerText").await;
                panic!("never true: {expression}\nthe page: {page}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The rows of a run in the results table: its side and cells' text.
    async fn rows(&mut self, run: u64) -> Vec<(String, Vec<String>)> {
        let rows = self
            .eval(&format!(
                "[...document.querySelectorAll('#results tbody tr[data-run=\"{run}\"]')].map((tr) => [tr.dataset.side, [...tr.cells].map((td) => td.textContent)])"
            ))
            .await;
        serde_json::from_value(rows).unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Standard base64 to bytes (a screenshot's).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text.bytes().filter(|c| *c != b'=').map(value).collect();
    digits
        .chunks(4)
        .flat_map(|chunk| {
            let bits = chunk.iter().enumerate().fold(0_u32, |acc, (i, d)| acc | (u32::from(*d) << (18 - 6 * i)));
            let bytes = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
            bytes.into_iter().take(chunk.len().saturating_sub(1))
        })
        .collect()
}

/// A number in a table cell, or none when the cell is empty.
fn number(cell: &str) -> Option<f64> {
    cell.split_whitespace().next()?.parse().ok()
}

/// The token of the bench servers these tests start.
const TOKEN: &str = "wcb_test-token-of-at-least-thirty-two-characters";

/// A bench server on loopback (where the gateway and the mocks are), with [`TOKEN`].
async fn bench_server() -> SocketAddr {
    let options = waycast_bench::server::ServeOptions {
        sink: SinkOptions::default(),
        allowed_hosts: Vec::new(),
        targets: waycast_bench::access::Targets::default(),
        tokens: waycast_bench::access::Tokens::from_text(TOKEN).unwrap(),
    };
    waycast_bench::server::start("127.0.0.1:0".parse().unwrap(), options).await.unwrap()
}

/// The vLLM-like mock: 8 slots, a token every 10 ms, no prefill.
async fn vllm_mock() -> SocketAddr {
    let server = vllm_server().await;
    let address = server.addr;
    // Kept serving for the test's life.
    std::mem::forget(server);
    address
}

async fn vllm_server() -> waycast_mock::upstream::MockUpstream {
    use waycast_mock::upstream::{MockOptions, start};
    use waycast_mock::vllm::{Engine, VllmOptions};
    let engine = Engine::new(VllmOptions {
        slots: 8,
        prefill_per_byte: Duration::ZERO,
        token_time: Duration::from_millis(10),
        ..VllmOptions::default()
    });
    let options = MockOptions { vllm: Some(std::sync::Arc::new(engine)), ..MockOptions::default() };
    start("127.0.0.1:0".parse().unwrap(), options).await.unwrap()
}

/// The gateway binary built beside this test's `waycast-bench`, routing
/// `MODEL` to `upstream`.
async fn gateway(upstream: SocketAddr, dir: &std::path::Path) -> (Process, SocketAddr) {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_waycast-bench")).parent().unwrap().join("waycast-gateway");
    let config = dir.join("gateway.json");
    std::fs::write(&config, gateway_config_for(upstream, MODEL, false).unwrap()).unwrap();
    let (public, admin) = (local_address().unwrap(), local_address().unwrap());
    let child = std::process::Command::new(&binary)
        .arg("--config-file")
        .arg(&config)
        .args(["--listen", &public.to_string(), "--admin-listen", &admin.to_string(), "--log", "warn"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} (built by `cargo build --workspace --bins`): {e}", binary.display()));
    let process = Process(child);
    wait_for(public, &chat("", SUITE_KEY, MODEL), Duration::from_secs(20)).await.unwrap();
    (process, public)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_benchmarks_the_gateway_against_the_server_and_sweeps_the_rate_from_the_page() {
    let dir = waycast_mock::fixtures::temp_dir("bench-page");
    let mock = vllm_mock().await;
    let (_gateway, public) = gateway(mock, &dir).await;
    let bench = bench_server().await;
    let mut browser = Browser::launch().await;
    // As waycast-bench serve prints it: the token in the fragment.
    browser.open(&format!("http://{bench}/#token={TOKEN}")).await;
    assert_eq!(browser.eval("location.hash").await, json!(""), "the token is taken out of the address bar");

    // Through the gateway, with the mock reached directly as the baseline.
    for (name, text) in [
        ("target", format!("http://{public}")),
        ("key", SUITE_KEY.to_owned()),
        ("model", MODEL.to_owned()),
        ("maxTokens", "4".to_owned()),
        ("requests", "120".to_owned()),
        ("concurrency", "8".to_owned()),
        ("baseline", format!("http://{mock}/v1")),
        ("rounds", "3".to_owned()),
    ] {
        browser.type_into(name, &text).await;
    }
    browser.choose("stream", "true").await;
    browser.choose("load", "concurrency").await;
    browser.click("#run").await;
    browser
        .wait_until("document.querySelector('#results tbody tr[data-run=\"1\"]')?.cells[3].textContent === 'done'", 120)
        .await;
    let rows = browser.rows(1).await;
    assert_eq!(rows.iter().map(|(side, _)| side.as_str()).collect::<Vec<_>>(), ["target", "baseline"], "{rows:?}");
    for (side, cells) in &rows {
        assert_eq!((cells[4].as_str(), cells[5].as_str()), ("120", "0"), "{side}: {cells:?}");
        let ttft = number(&cells[8]).unwrap();
        let itl = number(&cells[10]).unwrap();
        let tokens_per_second = number(&cells[7]).unwrap();
        // Four tokens 10 ms apart: the gaps are the mock's token time.
        assert!(ttft >= 0.0 && (9.0..30.0).contains(&itl) && tokens_per_second > 0.0, "{side}: {cells:?}");
    }
    let added = browser
        .eval("[...document.querySelectorAll('#added tbody tr[data-run=\"1\"]')].map((tr) => [...tr.cells].map((td) => td.textContent))")
        .await;
    let added: Vec<Vec<String>> = serde_json::from_value(added).unwrap();
    let ttft = added.iter().find(|row| row[1] == "timeToFirstToken").unwrap_or_else(|| panic!("{added:?}"));
    for spread in &ttft[2..5] {
        // "+0.412 [+0.201, +0.733]": the median and the rounds' spread.
        assert!(spread.contains(" [") && spread.ends_with(']'), "{ttft:?}");
    }
    let lines = browser
        .eval("[...document.querySelectorAll('#plot polyline[data-run=\"1\"]')].map((l) => l.dataset.side)")
        .await;
    assert_eq!(lines, json!(["target", "baseline"]));
    let csv = browser.eval("api(document.getElementById('csv-1').getAttribute('href')).then((r) => r.text())").await;
    let csv = csv.as_str().unwrap();
    assert!(csv.starts_with("row,side,round,rate") && csv.contains("\npooled,baseline,,,120,120,0,"), "{csv}");
    assert!(csv.contains("\nround,baseline,3,") && !csv.contains("\nround,baseline,4,"), "three rounds: {csv}");
    assert!(csv.contains("\nadded,median,"), "{csv}");

    // A rate sweep against the mock: 8 slots × 10 tokens of 10 ms = 80 requests a second.
    browser.choose("load", "sweep").await;
    for (name, text) in [
        ("target", format!("http://{mock}")),
        ("baseline", String::new()),
        ("maxTokens", "10".to_owned()),
        ("requests", "100".to_owned()),
        ("concurrency", "64".to_owned()),
        ("sweepFrom", "40".to_owned()),
        ("sweepTo", "160".to_owned()),
        ("sweepSteps", "7".to_owned()),
    ] {
        browser.type_into(name, &text).await;
    }
    browser.choose("stream", "false").await;
    browser.click("#run").await;
    browser
        .wait_until("document.querySelector('#results tbody tr[data-run=\"2\"]')?.cells[3].textContent === 'done'", 120)
        .await;
    let steps = browser.rows(2).await;
    assert_eq!(steps.len(), 7, "{steps:?}");
    assert_eq!(steps[0].0, "target @40.0/s", "{steps:?}");
    let label = browser.eval("document.querySelector('#sweep-plot text.saturation').textContent").await;
    let label = label.as_str().unwrap();
    let found: f64 = label.split("saturated at ").nth(1).and_then(number).unwrap_or_else(|| panic!("{label}"));
    assert!((found - 80.0).abs() <= 8.0, "{label}: the mock serves 80 a second");
    assert_eq!(
        browser.eval("document.querySelectorAll('#sweep-plot polyline[data-run=\"2\"]').length").await,
        json!(1)
    );
    // To look at what a user sees: WAYCAST_PAGE_SCREENSHOT=page.png.
    if let Ok(path) = std::env::var("WAYCAST_PAGE_SCREENSHOT") {
        let metrics = browser.call("Page.getLayoutMetrics", json!({})).await;
        let size = &metrics["cssContentSize"];
        let clip = json!({"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1});
        let shot = browser.call("Page.captureScreenshot", json!({"clip": clip, "captureBeyondViewport": true})).await;
        std::fs::write(path, base64_decode(shot["data"].as_str().unwrap())).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The REST API's report of a run through the gateway with the mock as baseline.
async fn rest_run(bench: SocketAddr, scenario: Value) -> Value {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let post = http::Request::post(format!("http://{bench}/runs"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(scenario.to_string())))
        .unwrap();
    let answer = http.request(post).await.unwrap();
    assert_eq!(answer.status(), 202);
    let answer: Value =
        serde_json::from_slice(&http_body_util::BodyExt::collect(answer.into_body()).await.unwrap().to_bytes())
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let get = http::Request::get(format!("http://{bench}/runs/{}", answer["id"]))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let run = http.request(get).await.unwrap();
        let run: Value =
            serde_json::from_slice(&http_body_util::BodyExt::collect(run.into_body()).await.unwrap().to_bytes())
                .unwrap();
        if run["status"] != "running" {
            assert_eq!(run["status"], "done", "{run}");
            return run["result"].clone();
        }
        assert!(Instant::now() < deadline, "{run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Both sides streamed every request with its tokens, and the report has
/// the gateway's added time to first token at p50 and p99 with its spread.
fn assert_compared(report: &Value, requests: u64, tokens: u64) {
    for side in ["target", "baseline"] {
        let result = &report[side];
        assert_eq!((result["ok"].as_u64(), result["errors"].as_u64()), (Some(requests), Some(0)), "{side}: {result}");
        assert_eq!(result["outputTokens"].as_u64(), Some(requests * tokens), "{side}: {result}");
        assert!(result["timeToFirstToken"]["p99"].as_f64().is_some_and(|ms| ms > 0.0), "{side}: {result}");
        let itl = result["interTokenLatency"]["p50"].as_f64().unwrap();
        assert!((9.0..30.0).contains(&itl), "{side}: the mock's tokens are 10 ms apart: {result}");
        assert!(result["outputTokensPerSecond"].as_f64().is_some_and(|rate| rate > 0.0), "{side}: {result}");
    }
    for percentile in ["p50", "p99"] {
        let added = report["added"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["figure"] == "timeToFirstToken" && a["percentile"] == percentile)
            .unwrap_or_else(|| panic!("{report}"));
        let (min, median, max) =
            (added["minMs"].as_f64().unwrap(), added["medianMs"].as_f64().unwrap(), added["maxMs"].as_f64().unwrap());
        assert!(min <= median && median <= max, "{added}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_api_and_the_cli_compare_the_gateway_with_the_server() {
    let dir = waycast_mock::fixtures::temp_dir("bench-own-stack");
    // Two alike servers, one behind the gateway and one for the baseline,
    // so the test sees which side reached which.
    let (behind, beside) = (vllm_server().await, vllm_server().await);
    let mock = beside.addr;
    let (_gateway, public) = gateway(behind.addr, &dir).await;
    let asked = async |server: &waycast_mock::upstream::MockUpstream| server.recorder.requests().await.len();
    let (behind_before, beside_before) = (asked(&behind).await, asked(&beside).await);
    let bench = bench_server().await;
    let scenario = json!({
        "target": format!("http://{public}"), "key": SUITE_KEY, "model": MODEL, "maxTokens": 4, "stream": true,
        "baseline": format!("http://{mock}/v1"), "rounds": 3, "requests": 90, "concurrency": 6,
        "rate": 60, "arrival": "poisson",
    });
    let report = rest_run(bench, scenario).await;
    assert_compared(&report, 90, 4);
    // Each server got its side's warm-up (6, the concurrency) and 90 requests.
    assert_eq!(asked(&behind).await - behind_before, 6 + 90, "through the gateway");
    assert_eq!(asked(&beside).await - beside_before, 6 + 90, "the baseline, straight");
    let firsts: Vec<&str> = report["rounds"].as_array().unwrap().iter().map(|r| r["first"].as_str().unwrap()).collect();
    assert_eq!(firsts, ["target", "baseline", "target"]);
    let offered = report["target"]["offeredRequestsPerSecond"].as_f64().unwrap();
    assert!((40.0..90.0).contains(&offered), "Poisson arrivals near 60 a second: {offered}");
    assert!((offered - 60.0).abs() > 1e-6, "Poisson arrivals are not evenly spaced: {offered}");

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
        .args(["run", "--target", &format!("http://{public}"), "--key", SUITE_KEY, "--model", MODEL])
        .args(["--max-tokens", "4", "--stream", "--baseline", &format!("http://{mock}/v1"), "--rounds", "3"])
        .args(["--requests", "60", "--concurrency", "6"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("added by the target over the baseline, ms: median over 3 rounds"), "{stderr}");
    assert_compared(&serde_json::from_slice(&output.stdout).unwrap(), 60, 4);
    let _ = std::fs::remove_dir_all(&dir);
}
