//! The gateway binary as a process: SIGTERM during a stream lets the stream
//! finish, refuses new connections, and exits 0; SIGHUP re-reads the config;
//! a burst of connections that arrives while it is not accepting waits in
//! the listen queue instead of being dropped; every worker's access lines
//! and metric counts reach their outputs.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::GatewayProcess;
use waycast_mock::fixtures::{self as fixture, ALICE_KEY, BOB_KEY};
use waycast_mock::upstream::{self as mock_upstream, MockOptions};

#[tokio::test]
async fn sigterm_drains_and_sighup_reloads() {
    let mock = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap();
    let mut config = fixture::default_config(&mock.base_url());
    config.keys.retain(|k| k.id == "team-a/alice");
    let mut gateway = GatewayProcess::start(&config, &[]).await;
    let config_path = gateway.config_path.clone();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let url = gateway.url("/v1/chat/completions");
    let status_for = |key: &'static str| {
        let client = client.clone();
        let url = url.clone();
        async move {
            client
                .request(fixture::post_request(&url, Some(key), r#"{"model":"mistral-7b"}"#))
                .await
                .map(|r| r.status())
                .ok()
        }
    };
    assert_eq!(status_for(ALICE_KEY).await, Some(StatusCode::OK));

    // SIGHUP re-reads the file even when its metadata looks unchanged: write
    // Bob in with the same size and modification time as before.
    assert_eq!(status_for(BOB_KEY).await, Some(StatusCode::UNAUTHORIZED));
    let before = std::fs::metadata(&config_path).unwrap();
    let mut with_bob = fixture::default_config(&mock.base_url());
    with_bob.keys.retain(|k| k.id == "team-b/bob");
    with_bob.keys[0].models = None;
    let text = serde_yaml_ng::to_string(&with_bob).unwrap();
    let original = std::fs::read_to_string(&config_path).unwrap();
    let padded = format!("{text}{}", "#".repeat(original.len().saturating_sub(text.len() + 1)));
    std::fs::write(&config_path, format!("{padded}\n")).unwrap();
    let file = std::fs::File::options().write(true).open(&config_path).unwrap();
    file.set_modified(before.modified().unwrap()).unwrap();
    gateway.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(3);
    while status_for(BOB_KEY).await != Some(StatusCode::OK) {
        assert!(Instant::now() < deadline, "SIGHUP did not reload the config");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A stream in flight when SIGTERM arrives.
    let mut request = fixture::post_request(&url, Some(BOB_KEY), r#"{"model":"mistral-7b","stream":true}"#);
    request.headers_mut().insert("x-mock-chunks", "8".parse().unwrap());
    request.headers_mut().insert("x-mock-interval-ms", "100".parse().unwrap());
    let response = Client::builder(TokioExecutor::new()).build_http().request(request).await.unwrap();
    let mut body = response.into_body();
    let first = String::from_utf8_lossy(&body.frame().await.unwrap().unwrap().into_data().unwrap()).into_owned();
    // The rest is read as it comes, each frame with the time it came.
    let reader = tokio::spawn(async move {
        let mut frames = vec![(Instant::now(), first)];
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            frames.push((Instant::now(), String::from_utf8_lossy(&data).into_owned()));
        }
        frames
    });
    gateway.signal("TERM");
    let readyz = format!("http://{}/readyz", gateway.admin);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let refused = tokio::net::TcpStream::connect(gateway.public).await.is_err();
        let ready = client.get(readyz.parse().unwrap()).await.map(|r| r.status());
        if refused && ready.as_ref().map_or(true, |s| *s == StatusCode::SERVICE_UNAVAILABLE) {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting or ready after SIGTERM: {ready:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let draining_since = Instant::now();
    let frames = reader.await.unwrap();
    let text: String = frames.iter().map(|(_, data)| data.as_str()).collect();
    assert!(text.contains("token7") && text.ends_with("data: [DONE]\n\n"), "the stream was cut: {text}");
    // The stream was still running once the gateway had stopped accepting:
    // frames came after that, and its last one well after.
    let after = frames.iter().filter(|(at, _)| *at > draining_since).count();
    let last = frames.last().unwrap().0;
    assert!(
        after >= 2 && last > draining_since + Duration::from_millis(100),
        "the stream ended before the drain began ({after} frames after it)"
    );
    let status = tokio::time::timeout(Duration::from_secs(5), gateway.child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// A gateway that cannot accept for a moment (here: stopped; in production:
/// every core busy) must not lose a burst of new connections. With too short
/// a listen queue the kernel drops the SYNs past it (the client retries after
/// 1 s, 3 s, …) or, worse, the handshake's last ACK, so a client that speaks
/// only after being greeted sees an open connection the gateway never gets.
#[tokio::test]
async fn a_burst_of_connections_while_busy_waits_in_the_listen_queue() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const BURST: usize = 1_000;
    let mock = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap();
    let config = fixture::default_config(&mock.base_url());
    let gateway = GatewayProcess::start(&config, &["--header-timeout", "1s"]).await;
    gateway.signal("STOP");
    let connects = (0..BURST).map(|_| {
        let public = gateway.public;
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(900), tokio::net::TcpStream::connect(public)).await
        })
    });
    let mut streams = Vec::new();
    for connect in connects.collect::<Vec<_>>() {
        match connect.await.unwrap() {
            Ok(Ok(stream)) => streams.push(stream),
            other => {
                gateway.signal("CONT");
                panic!("connection {} of a burst of {BURST} was not queued: {other:?}", streams.len() + 1);
            }
        }
    }
    // Every tenth asks something while the gateway is still stopped.
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {ALICE_KEY}\r\n\
         content-type: application/json\r\ncontent-length: 22\r\nconnection: close\r\n\r\n{{\"model\":\"mistral-7b\"}}"
    );
    for stream in streams.iter_mut().step_by(10) {
        stream.write_all(request.as_bytes()).await.unwrap();
    }
    gateway.signal("CONT");
    let resumed = Instant::now();
    let answers = streams.into_iter().enumerate().map(|(index, mut stream)| {
        tokio::spawn(async move {
            let mut answer = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
            (index, read.map(|r| r.is_ok()), String::from_utf8_lossy(&answer).lines().next().map(str::to_owned))
        })
    });
    for answer in answers.collect::<Vec<_>>() {
        let (index, ended, status_line) = answer.await.unwrap();
        assert_eq!(ended, Ok(true), "connection {index} was still open 10 s after the gateway resumed");
        if index % 10 == 0 {
            assert_eq!(status_line.as_deref(), Some("HTTP/1.1 200 OK"), "connection {index}");
        } else {
            assert_eq!(status_line, None, "connection {index} sent nothing and gets nothing");
        }
    }
    println!("{BURST} queued connections answered or closed {:?} after the gateway resumed", resumed.elapsed());
}

#[tokio::test]
async fn every_workers_access_lines_are_written_soon_and_none_lost_at_shutdown() {
    let mock = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap();
    let config = fixture::default_config(&mock.base_url());
    let mut gateway = GatewayProcess::start(&config, &["--workers", "2", "--log", "info"]).await;
    // A connection per request: the kernel spreads them over both workers.
    let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
    let url = gateway.url("/v1/chat/completions");
    let served = |requests: usize| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            for _ in 0..requests {
                let request = fixture::post_request(&url, Some(ALICE_KEY), r#"{"model":"mistral-7b"}"#);
                let response = client.request(request).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                response.into_body().collect().await.unwrap();
            }
        }
    };
    let logged = |text: &str| {
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["path"] == "/v1/chat/completions" && line["status"] == 200)
            .count()
    };

    // Soon: every line is out while the gateway runs on, in well under a
    // second (each worker hands its batch over 5 ms after its first line).
    served(40).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while logged(&gateway.stdout()) < 40 {
        assert!(Instant::now() < deadline, "access lines missing:\n{}", gateway.stdout());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // At shutdown: lines still gathered in a worker are written.
    served(20).await;
    gateway.signal("TERM");
    let exited = tokio::time::timeout(Duration::from_secs(10), gateway.child.wait()).await.unwrap().unwrap();
    assert!(exited.success(), "{exited}");
    assert_eq!(logged(&gateway.stdout()), 60, "{}", gateway.stdout());
}

/// Each worker counts on copies of its own and publishes them (when it has
/// no request in flight, else within 5 ms: `proxy/series.rs` tests when):
/// once every answer is in, `/metrics` holds every request of both
/// workers, none lost or counted twice.
#[tokio::test]
async fn every_workers_metric_counts_are_published_once_it_is_idle() {
    let mock = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap();
    let config = fixture::default_config(&mock.base_url());
    let gateway = GatewayProcess::start(&config, &["--workers", "2"]).await;
    // A connection per request: the kernel spreads them over both workers.
    let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
    let url = gateway.url("/v1/chat/completions");
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, url) = (client.clone(), url.clone());
        clients.spawn(async move {
            for _ in 0..15 {
                let request = fixture::post_request(&url, Some(ALICE_KEY), r#"{"model":"mistral-7b"}"#);
                let response = client.request(request).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                response.into_body().collect().await.unwrap();
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    let series = [
        r#"waycast_gateway_requests_total{code="200",key="team-a/alice",model="mistral-7b"}"#,
        r#"waycast_gateway_request_duration_seconds_count{model="mistral-7b"}"#,
        r#"waycast_gateway_time_to_first_byte_seconds_count{model="mistral-7b"}"#,
        "waycast_gateway_overhead_seconds_count",
    ];
    for name in series {
        assert_eq!(gateway.metric(name).await, Some(120.0), "{name}");
    }
}
