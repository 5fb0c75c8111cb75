//! `waycast-bench serve` as a process, locked: `/runs` answers only a
//! request that names the server in `Host` and shows a token (the one it
//! drew and printed, or one of its `--token-file`); a run goes only to
//! loopback or an `--allowed-target`, refused before anything connects;
//! and a run is seen and cancelled only by the token that started it.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use waycast_bench::process::{Process, raw_request};
use waycast_bench::sink::SinkOptions;

/// Starts `waycast-bench serve` on a free loopback port with `args`;
/// returns it, its address and what it printed.
fn serve(args: &[&str]) -> (Process, SocketAddr, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let process = Process(child);
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let address = line
        .strip_prefix("waycast-bench: http://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|address| address.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (process, address, line)
}

/// One request on its own connection: (status, JSON body). `token` goes
/// in `Authorization: Bearer`.
async fn call(address: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let authorization = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = raw_request(address, request.as_bytes()).await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn message(answer: &Value) -> &str {
    answer["error"]["message"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_need_the_printed_token_a_host_and_an_allowed_target() {
    let (_serve, address, printed) = serve(&[]);
    // The page's address carries the token in its fragment, never its query.
    let token = printed.split("/#token=").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap();
    assert!(token.starts_with("wcb_") && token.len() == 68, "{printed}");
    let tiny = json!({"target": format!("http://{address}"), "requests": 1, "concurrency": 1});

    // Without the token, or with another, nothing is read, started or cancelled.
    for shown in [None, Some("wcb_0000000000000000000000000000000000000000000000000000000000000000")] {
        for (method, path, body) in [
            ("GET", "/runs", &Value::Null),
            ("POST", "/runs", &tiny),
            ("GET", "/runs/1", &Value::Null),
            ("DELETE", "/runs/1", &Value::Null),
        ] {
            let (status, answer) = call(address, method, path, shown, body).await;
            assert_eq!(status, 401, "{method} {path} with {shown:?}: {answer}");
            assert!(message(&answer).contains("Authorization: Bearer"), "{answer}");
        }
    }
    assert_eq!(call(address, "GET", "/runs", Some(token), &Value::Null).await, (200, json!([])), "nothing started");

    // HTTP/1.0 without Host: refused, the token notwithstanding.
    let bare = format!("GET /runs HTTP/1.0\r\nAuthorization: Bearer {token}\r\n\r\n");
    let (status, body) = raw_request(address, bare.as_bytes()).await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Host"), "{body}");

    // Outside the allow-list (0.0.0.0 reaches this machine, but is not
    // loopback by name): refused before any connection, with the same
    // answer whether or not something listens there.
    let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open_port = open.local_addr().unwrap().port();
    let closed_port = waycast_mock::fixtures::free_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let mut answers = Vec::new();
    for (port, side) in [(open_port, "target"), (closed_port, "target"), (open_port, "baseline")] {
        let elsewhere = format!("http://0.0.0.0:{port}");
        let mut scenario = json!({"target": format!("http://{address}"), "requests": 1, "concurrency": 1});
        scenario[side] = json!(elsewhere);
        let (status, answer) = call(address, "POST", "/runs", Some(token), &scenario).await;
        assert_eq!(status, 403, "{side} {elsewhere}: {answer}");
        assert!(message(&answer).contains("--allowed-target"), "{answer}");
        answers.push(message(&answer).replace(&port.to_string(), "PORT"));
    }
    assert_eq!(answers[0], answers[1], "an open port and a closed one are refused alike");
    let accepted = tokio::time::timeout(Duration::from_millis(300), open.accept()).await;
    assert!(accepted.is_err(), "a refused target was connected to");
    assert_eq!(call(address, "GET", "/runs", Some(token), &Value::Null).await, (200, json!([])), "nothing started");

    // With the token, to its own sink on loopback: it runs.
    let (status, answer) = call(address, "POST", "/runs", Some(token), &tiny).await;
    assert_eq!((status, &answer["id"]), (202, &json!(1)), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_seen_and_cancelled_only_by_the_token_that_started_it() {
    let dir = waycast_mock::fixtures::temp_dir("bench-serve-tokens");
    let (alice, bob) = ("alice-token-of-at-least-thirty-two-chars", "bob-token-of-at-least-thirty-two-characters");
    let file = dir.join("tokens");
    std::fs::write(&file, format!("{alice}\n\n  {bob}  \n")).unwrap();
    // A sink elsewhere, allowed by flag (0.0.0.0 stands for a host not on loopback).
    let sink = waycast_bench::sink::start("127.0.0.1:0".parse().unwrap(), SinkOptions::default()).await.unwrap();
    let allowed = format!("0.0.0.0:{}", sink.port());
    let (_serve, address, printed) = serve(&["--token-file", file.to_str().unwrap(), "--allowed-target", &allowed]);
    assert!(!printed.contains(alice) && !printed.contains(bob), "tokens from a file are not printed: {printed}");

    // Another port of the allowed host is not allowed.
    let other = json!({"target": format!("http://0.0.0.0:{}", sink.port() ^ 1), "requests": 1, "concurrency": 1});
    assert_eq!(call(address, "POST", "/runs", Some(alice), &other).await.0, 403);
    // Alice's slow run: 50 requests of 100 ms one at a time.
    let slow = json!({"target": format!("http://{allowed}"), "requests": 50, "concurrency": 1, "waitMs": 100});
    let (status, started) = call(address, "POST", "/runs", Some(alice), &slow).await;
    assert_eq!(status, 202, "{started}");
    let id = started["id"].as_u64().unwrap();

    // Bob sees none of it, cannot cancel it, and learns nothing of it from the one-run-at-a-time refusal.
    let (status, list) = call(address, "GET", "/runs", Some(bob), &Value::Null).await;
    assert_eq!((status, list), (200, json!([])));
    for path in [format!("/runs/{id}"), format!("/runs/{id}.json"), format!("/runs/{id}.csv")] {
        assert_eq!(call(address, "GET", &path, Some(bob), &Value::Null).await.0, 404, "{path}");
    }
    assert_eq!(call(address, "DELETE", &format!("/runs/{id}"), Some(bob), &Value::Null).await.0, 404);
    let (status, refused) = call(address, "POST", "/runs", Some(bob), &slow).await;
    assert_eq!(status, 409, "{refused}");
    assert!(!refused.to_string().contains(&allowed) && !message(&refused).contains(&format!("run {id}")), "{refused}");

    // Alice sees it running and cancels it.
    let (status, list) = call(address, "GET", "/runs", Some(alice), &Value::Null).await;
    assert_eq!((status, &list[0]["id"], &list[0]["status"]), (200, &json!(id), &json!("running")), "{list}");
    let (status, cancelled) = call(address, "DELETE", &format!("/runs/{id}"), Some(alice), &Value::Null).await;
    assert_eq!((status, &cancelled["status"]), (200, &json!("cancelled")), "{cancelled}");

    // Bob's own run, now that none is running: Alice does not see it.
    let quick = json!({"target": format!("http://{allowed}"), "requests": 2, "concurrency": 1});
    let (status, bobs) = call(address, "POST", "/runs", Some(bob), &quick).await;
    assert_eq!(status, 202, "{bobs}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, run) = call(address, "GET", &format!("/runs/{}", bobs["id"]), Some(bob), &Value::Null).await;
        if run["status"] == "done" {
            break;
        }
        assert!(Instant::now() < deadline && run["status"] == "running", "{run}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, list) = call(address, "GET", "/runs", Some(alice), &Value::Null).await;
    assert_eq!(list.as_array().unwrap().iter().map(|r| r["id"].clone()).collect::<Vec<_>>(), [json!(id)]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_token_file_that_holds_no_usable_token_stops_it_at_start() {
    let dir = waycast_mock::fixtures::temp_dir("bench-serve-bad-tokens");
    let file = dir.join("tokens");
    for bad in ["", "\n  \n", "too-short"] {
        std::fs::write(&file, bad).unwrap();
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
            .args(["serve", "--listen", "127.0.0.1:0", "--token-file", file.to_str().unwrap()])
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(64), "{bad:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    // Past 256 KiB of good tokens, and an endless file: refused once the
    // bound is read, never read whole.
    let line = format!("{}\n", "t".repeat(63));
    std::fs::write(&file, line.repeat(256 * 1024 / line.len() + 1)).unwrap();
    for path in [file.to_str().unwrap(), "/dev/zero"] {
        let started = tokio::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
            .args(["serve", "--listen", "127.0.0.1:0", "--token-file", path])
            .output();
        let output = tokio::time::timeout(std::time::Duration::from_secs(20), started).await.unwrap().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{path}: {stderr}");
        assert!(stderr.contains("256 KiB"), "{path}: {stderr}");
    }
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_waycast-bench"))
        .args(["serve", "--listen", "127.0.0.1:0", "--allowed-target", "gateway:http"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(64), "{}", String::from_utf8_lossy(&output.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tokens_many_runs_do_not_push_out_anothers() {
    let dir = waycast_mock::fixtures::temp_dir("bench-serve-kept");
    let (alice, bob) = ("alice-token-of-at-least-thirty-two-chars", "bob-token-of-at-least-thirty-two-characters");
    let file = dir.join("tokens");
    std::fs::write(&file, format!("{alice}\n{bob}\n")).unwrap();
    let (_serve, address, _) = serve(&["--token-file", file.to_str().unwrap()]);
    let tiny = json!({"target": format!("http://{address}"), "requests": 1, "concurrency": 1, "warmup": 0});
    // Bob's one run, then Alice's 200: the server keeps 200 runs in all.
    let mut started = Vec::new();
    for token in std::iter::once(bob).chain(std::iter::repeat_n(alice, 200)) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let id = loop {
            let (status, answer) = call(address, "POST", "/runs", Some(token), &tiny).await;
            if status == 202 {
                break answer["id"].as_u64().unwrap();
            }
            // The one before has not ended yet.
            assert!(status == 409 && Instant::now() < deadline, "{status}: {answer}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        started.push(id);
    }
    let ids = |list: Value| list.as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()).collect::<Vec<_>>();
    let (_, bobs) = call(address, "GET", "/runs", Some(bob), &Value::Null).await;
    assert_eq!(ids(bobs), [started[0]], "Bob's run is kept");
    let (_, alices) = call(address, "GET", "/runs", Some(alice), &Value::Null).await;
    let alices = ids(alices);
    assert_eq!((alices.len(), alices.last()), (199, Some(&started[2])), "Alice's oldest run went first");
    let _ = std::fs::remove_dir_all(&dir);
}
