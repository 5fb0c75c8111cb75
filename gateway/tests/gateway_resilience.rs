//! The gateway under faults and change: drain, hot reload under load, bad
//! configs, timeouts, failover, keep-alive and protocol abuse.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt as _;
use serde_json::Value;
use support::{Fixture, FixtureOptions};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use waycast_crds::config::BackendConfig;
use waycast_gateway::Drained;
use waycast_mock::fixtures::{self as fixture, ALICE_KEY};

const CHAT: &str = r#"{"model":"mistral-7b","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM_CHAT: &str = r#"{"model":"mistral-7b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn code_of(body: &Bytes) -> String {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    value["error"]["code"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn sigterm_lets_a_stream_finish_and_refuses_new_connections() {
    let mut fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let request = fixture.request(
        "/v1/chat/completions",
        Some(ALICE_KEY),
        r#"{"model":"mistral-7b","stream":true,"messages":[]}"#,
        &[("x-mock-chunks", "6"), ("x-mock-interval-ms", "150")],
    );
    let response = fixture.open(request).await;
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();

    let gateway = fixture.gateway.take().unwrap();
    let drain = tokio::spawn(gateway.shutdown());
    // Not ready any more, and no new connections.
    let deadline = Instant::now() + Duration::from_secs(2);
    while TcpStream::connect(fixture.addr).await.is_ok() {
        assert!(Instant::now() < deadline, "the listener still accepts during the drain");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The stream in flight completes.
    let mut text = String::from_utf8_lossy(&first).into_owned();
    while let Some(frame) = body.frame().await {
        text.push_str(&String::from_utf8_lossy(&frame.unwrap().into_data().unwrap()));
    }
    assert!(text.contains("token5") && text.ends_with("data: [DONE]\n\n"), "stream cut short: {text}");
    assert_eq!(drain.await.unwrap(), Drained::Gracefully);
}

/// HTTP/2 during a drain: the connection gets a GOAWAY, so a new stream on
/// it is refused (the client takes it to another pod), while the stream it
/// has open runs to its end; then the connection closes.
#[tokio::test]
async fn a_drain_sends_http2_clients_goaway_and_finishes_their_streams() {
    let mut fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let tcp = TcpStream::connect(fixture.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let url = fixture.url("/v1/chat/completions");
    let request = |chunks: &str| {
        http::Request::post(&url)
            .header("authorization", format!("Bearer {ALICE_KEY}"))
            .header("content-type", "application/json")
            .header("x-mock-chunks", chunks)
            .header("x-mock-interval-ms", "100")
            .body(())
            .unwrap()
    };
    let mut sender = client.clone().ready().await.unwrap();
    let (response, mut body_out) = sender.send_request(request("10"), false).unwrap();
    body_out.send_data(Bytes::from_static(STREAM_CHAT.as_bytes()), true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut text = String::new();
    let first = body.data().await.unwrap().unwrap();
    let _ = body.flow_control().release_capacity(first.len());
    text.push_str(&String::from_utf8_lossy(&first));

    let gateway = fixture.gateway.take().unwrap();
    let drained = tokio::spawn(gateway.shutdown());
    // Once the GOAWAY is in, no new stream is taken on this connection.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let refused = match client.clone().ready().await {
            Err(error) => error.is_go_away(),
            Ok(mut sender) => match sender.send_request(request("1"), true) {
                Err(error) => error.is_go_away(),
                Ok((response, _)) => match response.await {
                    Err(error) => error.is_go_away() || error.reason() == Some(h2::Reason::REFUSED_STREAM),
                    // Taken before the GOAWAY went out.
                    Ok(_) => false,
                },
            },
        };
        if refused {
            break;
        }
        assert!(Instant::now() < deadline, "no GOAWAY within 3 s of the drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("token9") && text.ends_with("data: [DONE]\n\n"), "the open stream was cut: {text}");
    // The connection ends once its last stream has (however the client
    // library words the close).
    let _ =
        tokio::time::timeout(Duration::from_secs(5), connection).await.expect("the connection stayed open").unwrap();
    assert_eq!(drained.await.unwrap(), Drained::Gracefully);
}

#[tokio::test]
async fn the_drain_timeout_bounds_a_stream_that_never_ends() {
    let options = FixtureOptions { drain_timeout: Duration::from_millis(300), ..FixtureOptions::default() };
    let mut fixture = Fixture::start(options, |_, _| {}).await;
    let request = fixture.request(
        "/v1/chat/completions",
        Some(ALICE_KEY),
        r#"{"model":"mistral-7b","stream":true,"messages":[]}"#,
        &[("x-mock-stall", "body")],
    );
    let response = fixture.open(request).await;
    let _body = response.into_body();
    let started = Instant::now();
    let drained = fixture.gateway.take().unwrap().shutdown().await;
    assert_eq!(drained, Drained::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(2), "drain took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_config_swap_under_load_fails_no_request() {
    let fixture = Arc::new(Fixture::start(FixtureOptions::default(), |_, _| {}).await);
    let base = fixture.mock.base_url();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let fixture = fixture.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut results = (0_u32, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let (status, _, body) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
                results.0 += 1;
                if status != StatusCode::OK {
                    results.1.push(format!("{status}: {}", String::from_utf8_lossy(&body)));
                }
            }
            results
        }));
    }
    let reloads_before = fixture.metric("waycast_gateway_config_reloads_total").await.unwrap();
    for round in 0..10_u32 {
        let mut config = fixture::default_config(&base);
        // Each round is a different config: a second backend with another weight.
        let mut backend = BackendConfig::to(base.clone());
        backend.weight = round + 1;
        config.models[1].backends.push(backend);
        fixture.write_config(serde_yaml_ng::to_string(&config).unwrap().as_bytes());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for worker in workers {
        let (count, failures) = worker.await.unwrap();
        total += count;
        assert!(failures.is_empty(), "failed requests during reloads: {failures:?}");
    }
    let reloads = fixture.metric("waycast_gateway_config_reloads_total").await.unwrap() - reloads_before;
    assert!(reloads >= 9.0, "only {reloads} reloads happened");
    assert!(total > 100, "only {total} requests ran during the reloads");
}

#[tokio::test]
async fn a_bad_config_is_rejected_and_the_last_good_one_keeps_serving() {
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let errors_before = fixture.metric("waycast_gateway_config_reload_errors_total").await.unwrap();
    for bad in
        ["apiVersion: waycast.dev/config-v1\nsettings: {maxRequestBodyBytes: 0}\n", "{{{ not yaml", "apiVersion: v0\n"]
    {
        fixture.write_config(bad.as_bytes());
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let errors = fixture.metric("waycast_gateway_config_reload_errors_total").await.unwrap();
            if errors > errors_before {
                break;
            }
            assert!(Instant::now() < deadline, "bad config not noticed: {bad}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
        assert_eq!(status, StatusCode::OK, "the last good config stopped serving after {bad:?}");
        assert_eq!(fixture.admin_get("/readyz").await.0, StatusCode::OK);
    }
}

/// An entry the gateway cannot serve (here a backend TLS server name that
/// is no DNS name, as one tenant wrote it) is left out alone: the rest of
/// the new config applies — a key disabled in it is refused at once — and
/// the entry is counted and named in the log.
#[tokio::test]
async fn one_bad_entry_is_left_out_and_the_rest_of_the_config_applies() {
    use waycast_crds::config::ClientTlsConfig;
    use waycast_mock::fixtures::BOB_KEY;
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let mistral = r#"{"model":"mistral-7b","messages":[]}"#;
    assert_eq!(fixture.post("/v1/chat/completions", Some(BOB_KEY), mistral).await.0, StatusCode::OK);
    let mut config = fixture::default_config(&fixture.mock.base_url());
    config.models[1].backends[0].tls = Some(ClientTlsConfig { server_name: Some("a..b".into()), ..Default::default() });
    config.keys[1].disabled = true;
    fixture.write_config(serde_yaml_ng::to_string(&config).unwrap().as_bytes());
    let deadline = Instant::now() + Duration::from_secs(3);
    while fixture.post("/v1/chat/completions", Some(BOB_KEY), mistral).await.0 != StatusCode::UNAUTHORIZED {
        assert!(Instant::now() < deadline, "the disabled key was still served: the config did not apply");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fixture.post("/v1/chat/completions", Some(ALICE_KEY), mistral).await.0, StatusCode::NOT_FOUND);
    let llama = r#"{"model":"llama3","messages":[]}"#;
    assert_eq!(fixture.post("/v1/chat/completions", Some(ALICE_KEY), llama).await.0, StatusCode::OK);
    let dropped = fixture.metric("waycast_gateway_config_entries_dropped{kind=\"model\"}").await;
    assert_eq!(dropped, Some(1.0));
    assert_eq!(fixture.metric("waycast_gateway_config_entries_dropped{kind=\"key\"}").await, Some(0.0));
}

#[tokio::test]
async fn timeouts_failover_and_unreachable_backends() {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let fixture = Fixture::start(FixtureOptions::default(), |config, base| {
        let dead = format!("http://127.0.0.1:{closed_port}/v1");
        // Two backends, the first refusing connections: requests fail over.
        config.models[1].backends.insert(0, BackendConfig::to(dead.clone()));
        config.models[1].timeouts.first_byte = Duration::from_millis(500);
        config.models[1].timeouts.idle = Duration::from_millis(500);
        // Only a dead backend: 502.
        config.models[2].backends[0].url = dead;
        let _ = base;
    })
    .await;
    for _ in 0..4 {
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
        assert_eq!(status, StatusCode::OK, "failover to the live backend");
    }
    let (status, _, body) =
        fixture.post("/v1/embeddings", Some(ALICE_KEY), r#"{"model":"embed-small","input":"x"}"#).await;
    assert_eq!((status, code_of(&body).as_str()), (StatusCode::BAD_GATEWAY, "upstream_unreachable"));

    let slow = fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-delay-ms", "3000")]);
    let started = Instant::now();
    let (status, _, body) = fixture.send(slow).await;
    assert_eq!((status, code_of(&body).as_str()), (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"));
    assert!(started.elapsed() < Duration::from_secs(2));

    // A stream that stalls after its first chunk is cut by the idle timeout,
    // while one with steady chunks longer than any single timeout is not.
    let stalled = fixture.request(
        "/v1/chat/completions",
        Some(ALICE_KEY),
        r#"{"model":"mistral-7b","stream":true}"#,
        &[("x-mock-stall", "body")],
    );
    let response = fixture.open(stalled).await;
    let collected = tokio::time::timeout(Duration::from_secs(3), response.into_body().collect()).await.unwrap();
    assert!(collected.is_err(), "an idle upstream must end the stream with an error");
    let steady = fixture.request(
        "/v1/chat/completions",
        Some(ALICE_KEY),
        r#"{"model":"mistral-7b","stream":true}"#,
        &[("x-mock-chunks", "8"), ("x-mock-interval-ms", "200")],
    );
    let (status, _, body) = fixture.send(steady).await;
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).contains("token7"), "a 1.6 s stream with 200 ms gaps must not be cut");
}

#[tokio::test]
async fn keep_alive_never_stalls_on_delayed_acks() {
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    // One connection, many requests; the upstream answers with chunked
    // non-streaming bodies, the shape that stalls 40 ms per request when
    // TCP_NODELAY is missing on either side.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build_http();
    let rounds = 40;
    let started = Instant::now();
    for _ in 0..rounds {
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[("x-mock-chunked", "true")]);
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap();
    }
    let average = started.elapsed() / rounds;
    assert!(average < Duration::from_millis(20), "average {average:?} per request: a delayed-ACK stall");
    assert!(fixture.mock.recorder.connections.load(Ordering::Relaxed) <= 2, "upstream connections were not reused");
}

async fn raw_exchange(fixture: &Fixture, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

/// A body sent in several chunks, apart in time (each its own frame at
/// the gateway), reaches the upstream whole and in order.
#[tokio::test]
async fn a_body_sent_in_pieces_arrives_whole() {
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let pieces = [r#"{"model":"mistral-7b","#, r#""messages":[{"role":"user","#, r#""content":"in three pieces"}]}"#];
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE_KEY}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for piece in pieces {
        stream.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes()).await.unwrap();
        stream.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stream.write_all(b"0\r\n\r\n").await.unwrap();
    let response = read_one_response(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let received = fixture.mock.recorder.last().await.expect("the upstream got the request");
    assert_eq!(received.body, pieces.concat().as_bytes());
}

#[tokio::test]
async fn protocol_abuse_is_refused_cleanly() {
    let options = FixtureOptions {
        body_timeout: Duration::from_millis(500),
        header_read_timeout: Duration::from_millis(500),
        ..FixtureOptions::default()
    };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let auth = format!("Authorization: Bearer {ALICE_KEY}\r\n");

    // A declared body over the limit is refused before it is read.
    let started = Instant::now();
    let response = raw_exchange(
        &fixture,
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 999999999\r\n\r\n{{")
            .as_bytes(),
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(response.contains("request_too_large"), "{response}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // Content-Length and Transfer-Encoding together: a smuggling shape.
    let smuggle = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    );
    let response = raw_exchange(&fixture, smuggle.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");

    // Headers over 32 KB: 431.
    let big = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}X-Big: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "a".repeat(40 * 1024)
    );
    let response = raw_exchange(&fixture, big.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 431"), "{response}");

    // A truncated body times out with 408 and the connection is closed.
    let started = Instant::now();
    let truncated =
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 100\r\n\r\n{{\"model\":");
    let response = raw_exchange(&fixture, truncated.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // Slow headers: the connection is dropped after the header timeout.
    let mut slow = TcpStream::connect(fixture.addr).await.unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), slow.read_to_end(&mut buffer)).await;
    assert!(read.is_ok(), "a client that never finishes its headers must be disconnected");
}

/// Reads one response with a `Content-Length` off a kept-alive connection.
async fn read_one_response(stream: &mut TcpStream) -> String {
    let mut response = Vec::new();
    let mut buffer = [0_u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&response).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase().strip_prefix("content-length: ")?.trim().parse::<usize>().ok()
                })
                .expect("a content-length");
            if body.len() >= length {
                return text;
            }
        }
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await.unwrap().unwrap();
        assert!(read > 0, "closed before the response ended: {text}");
        response.extend_from_slice(&buffer[..read]);
    }
}

/// On HTTP/1 the next request's head must come within the header timeout,
/// as the first did: a kept-alive connection that stays silent, or sends
/// its next head slowly, is closed; one that asks again in time is served.
#[tokio::test]
async fn an_http1_connection_sends_its_next_head_within_the_header_timeout() {
    let header_timeout = Duration::from_secs(1);
    let options = FixtureOptions { header_read_timeout: header_timeout, ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let models = format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE_KEY}\r\n\r\n");
    for next in ["", "GET /v1/models HTTP/1.1\r\nHost: x\r\n"] {
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        for _ in 0..2 {
            stream.write_all(models.as_bytes()).await.unwrap();
            let response = read_one_response(&mut stream).await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            tokio::time::sleep(header_timeout / 2).await;
        }
        let idle_since = Instant::now();
        stream.write_all(next.as_bytes()).await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        let took = idle_since.elapsed();
        assert!(closed.is_ok(), "{next:?}: still open after 5 s");
        assert!(
            took >= header_timeout / 4 && took <= header_timeout * 2,
            "{next:?}: closed {took:?} after the last answer (header timeout {header_timeout:?})"
        );
    }
}

#[tokio::test]
async fn two_hundred_slow_clients_do_not_delay_a_good_one() {
    let options = FixtureOptions {
        header_read_timeout: Duration::from_secs(30),
        body_timeout: Duration::from_secs(30),
        ..FixtureOptions::default()
    };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let mut slow = Vec::new();
    for index in 0..200 {
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        // Half send partial headers, half a partial body.
        if index % 2 == 0 {
            stream.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        } else {
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE_KEY}\r\nContent-Length: 1000\r\n\r\n{{"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
        }
        slow.push(stream);
    }
    let started = Instant::now();
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() < Duration::from_millis(500), "a good client waited {:?}", started.elapsed());
    drop(slow);
}

#[tokio::test]
async fn usage_and_request_metrics_are_counted() {
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let body = r#"{"model":"mistral-7b","messages":[{"role":"user","content":"count me"}]}"#;
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), body).await;
    assert_eq!(status, StatusCode::OK);
    let streamed = r#"{"model":"mistral-7b","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), streamed).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) =
        fixture.post("/v1/messages", Some(ALICE_KEY), r#"{"model":"mistral-7b","stream":true,"messages":[]}"#).await;
    assert_eq!(status, StatusCode::OK);
    // The mock reports 5 completion tokens per response (its chunk count).
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let completion = fixture
            .metric(r#"waycast_gateway_tokens_total{key="team-a/alice",kind="completion",model="mistral-7b"}"#)
            .await;
        if completion == Some(15.0) {
            break;
        }
        assert!(Instant::now() < deadline, "completion tokens {completion:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let prompt = fixture
        .metric(r#"waycast_gateway_tokens_total{key="team-a/alice",kind="prompt",model="mistral-7b"}"#)
        .await
        .unwrap();
    assert!(prompt > 0.0);
    let requests =
        fixture.metric(r#"waycast_gateway_requests_total{code="200",key="team-a/alice",model="mistral-7b"}"#).await;
    assert_eq!(requests, Some(3.0));
    // Each request's tokens; the pace of the two streams (5 tokens, the
    // mock's chunks 1 ms apart), not of the whole answer.
    let per_request = |kind: &str, part: &str| {
        format!(r#"waycast_gateway_tokens_per_request_{part}{{kind="{kind}",model="mistral-7b"}}"#)
    };
    assert_eq!(fixture.metric(&per_request("completion", "count")).await, Some(3.0));
    assert_eq!(fixture.metric(&per_request("completion", "sum")).await, Some(15.0));
    assert_eq!(fixture.metric(&per_request("prompt", "sum")).await, Some(prompt));
    let paced = r#"waycast_gateway_time_per_output_token_seconds_count{model="mistral-7b"}"#;
    assert_eq!(fixture.metric(paced).await, Some(2.0));
    let pace = fixture.metric(r#"waycast_gateway_time_per_output_token_seconds_sum{model="mistral-7b"}"#).await;
    assert!(pace.is_some_and(|seconds| seconds > 0.0 && seconds < 1.0), "{pace:?}");
    let (_, text) = fixture.admin_get("/metrics").await;
    for family in [
        "waycast_gateway_request_duration_seconds_bucket",
        "waycast_gateway_time_to_first_byte_seconds_bucket",
        "waycast_gateway_overhead_seconds_bucket",
        "waycast_gateway_config_info",
    ] {
        assert!(text.contains(family), "no {family} in /metrics");
    }
    assert!(!text.contains(ALICE_KEY));
}

#[tokio::test]
async fn http2_cleartext_works() {
    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).http2_only(true).build_http();
    let request = fixture::post_request(&fixture.url("/v1/chat/completions"), Some(ALICE_KEY), CHAT);
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("chat.completion"));
}

/// A connection that sends nothing, or stalls inside the HTTP/2 preface,
/// is closed within the header timeout (+1 s): before protocol detection
/// had no timer at all.
#[tokio::test]
async fn silent_and_half_preface_connections_are_closed_within_the_header_timeout() {
    let options = FixtureOptions { header_read_timeout: Duration::from_secs(1), ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |_, _| {}).await;
    for sent in [&b""[..], b"PRI * HTTP/2.0\r\n"] {
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        stream.write_all(sent).await.unwrap();
        let started = Instant::now();
        let mut buffer = [0_u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "{sent:?}: the connection is still open: {read:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "{sent:?}: closed after {:?}", started.elapsed());
    }
    // A client that speaks in time is served as before.
    let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK);
}

/// Past `--max-connections` a new connection is closed at once and
/// counted; the open ones are served, and once they close there is room.
#[tokio::test]
async fn connections_past_the_cap_are_closed_and_counted() {
    let options = FixtureOptions { max_connections: 3, ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        stream.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        held.push(stream);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while fixture.metric("waycast_gateway_connections_open").await != Some(3.0) {
        assert!(Instant::now() < deadline, "three connections never counted open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut refused = TcpStream::connect(fixture.addr).await.unwrap();
    let _ = refused.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut buffer = [0_u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), refused.read(&mut buffer)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "a fourth connection was served: {read:?}");
    assert_eq!(fixture.metric("waycast_gateway_connections_refused_total").await, Some(1.0));
    drop(held);
    // Until the gateway has seen them close, a new connection is still
    // refused: try again on a fresh one each time.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), CHAT, &[]);
        if client.request(request).await.is_ok_and(|response| response.status() == StatusCode::OK) {
            break;
        }
        assert!(Instant::now() < deadline, "no room after the held connections closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An HTTP/2 connection with no request in flight for `--idle-timeout` is
/// closed (GOAWAY), so idle connections cannot pile up; one with a request
/// in flight is not.
#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let options = FixtureOptions { idle_timeout: Duration::from_secs(1), ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let stream = TcpStream::connect(fixture.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    // A stream longer than the idle timeout keeps the connection open.
    let mut request = fixture::post_request(&fixture.url("/v1/chat/completions"), Some(ALICE_KEY), STREAM_CHAT);
    request.headers_mut().insert("x-mock-chunks", "15".parse().unwrap());
    request.headers_mut().insert("x-mock-interval-ms", "100".parse().unwrap());
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"), "the stream was cut");
    let idle_since = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection is still open after 5 s");
    assert!(idle_since.elapsed() < Duration::from_secs(3), "closed after {:?}", idle_since.elapsed());
}
