//! A hostile upstream (`hostile_upstream.rs`) behind a real gateway
//! in-process, with a token limit on so the usage tap and the usage-chunk
//! filter run: each misbehaviour ends in bounded time and memory, costs
//! only its own request, and never locks a key out.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::LimitsConfig;
use waycast_mock::fixtures::ALICE_KEY;
use waycast_mock::hostile as hostile_upstream;

const CHAT: &str = r#"{"model":"mistral-7b","messages":[{"role":"user","content":"hi"}]}"#;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// Adds the model `hostile` (the hostile upstream at `address`, driven by
/// `x-hostile`, 2 s idle timeout) and gives Alice a token limit, so the
/// usage tap and the usage-chunk filter run.
fn with_hostile_model(config: &mut waycast_crds::GatewayConfig, address: SocketAddr, tokens_per_minute: u64) {
    let mut model = config.models[1].clone();
    model.name = "hostile".into();
    model.backends[0].url = format!("http://{address}/v1");
    model.forward_headers = vec!["x-hostile".into()];
    model.timeouts.idle = Duration::from_secs(2);
    config.models.push(model);
    config.keys[0].limits = Some(LimitsConfig::tokens(tokens_per_minute));
}

#[tokio::test]
async fn a_hostile_upstream_costs_only_its_own_requests() {
    let hostile = hostile_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
    let fixture =
        Fixture::start(FixtureOptions::default(), |config, _| with_hostile_model(config, hostile, 100_000)).await;
    let before = rss_bytes();
    let stream = r#"{"model":"hostile","stream":true,"messages":[]}"#;
    let plain = r#"{"model":"hostile","messages":[]}"#;
    let mut outcomes = Vec::new();
    for (mode, body) in [
        ("endless-event", stream),
        ("drip", plain),
        ("huge-header", plain),
        ("reset", stream),
        ("absurd-usage", plain),
        ("one-write", stream),
    ] {
        let started = Instant::now();
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), body, &[("x-hostile", mode)]);
        let outcome = tokio::time::timeout(Duration::from_secs(20), async {
            let response = fixture.open(request).await;
            let status = response.status();
            let body = response.into_body().collect().await.map(|c| c.to_bytes().len());
            (status, body)
        })
        .await
        .unwrap_or_else(|_| panic!("{mode}: the request did not end within 20 s"));
        println!("{mode}: {outcome:?} after {:?}", started.elapsed());
        // Every other client is served meanwhile and after.
        let (status, _, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
        assert_eq!(status, StatusCode::OK, "after {mode}");
        outcomes.push((mode, outcome));
    }
    // The endless event went through unfiltered, and was counted.
    let (status, relayed) = &outcomes[0].1;
    assert_eq!(*status, StatusCode::OK);
    assert!(relayed.as_ref().is_ok_and(|bytes| *bytes > 2_000_000), "{relayed:?}");
    let too_long = r#"waycast_gateway_upstream_errors_total{model="hostile",reason="sse_event_too_long"}"#;
    assert_eq!(fixture.metric(too_long).await, Some(1.0));
    // A 1 MiB response header is refused: 502.
    assert_eq!(outcomes[2].1.0, StatusCode::BAD_GATEWAY);
    // A whole stream in one read, its usage chunk taken out (the client did
    // not ask for it): the shorter body is framed for what is sent.
    let (status, relayed) = &outcomes[5].1;
    assert_eq!(*status, StatusCode::OK);
    let content = r#"data: {"choices":[{"index":0,"delta":{"content":"a"}}]}"#;
    let without_usage = content.len() + "\n\n".len() + "data: [DONE]\n\n".len();
    assert_eq!(relayed.as_ref().ok(), Some(&without_usage), "{relayed:?}");
    // 10^15 reported tokens are capped at what the bytes make plausible:
    // the key is not locked out.
    let (status, headers, _) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), CHAT).await;
    assert_eq!(status, StatusCode::OK);
    let left: u64 = headers["x-ratelimit-remaining-tokens"].to_str().unwrap().parse().unwrap();
    assert!(left > 50_000, "absurd usage drained the key: {left} left");
    let grown = rss_bytes().saturating_sub(before);
    println!("RSS grew by {} KiB", grown / 1024);
    assert!(grown < 64 << 20, "RSS grew by {grown} bytes");
}

/// The gateway binary as its own process, under every hostile case at once
/// with a token limit on: idle and half-open connections, partial HTTP/2
/// prefaces, 1,000 HTTP/2 streams on one connection, slow bodies, and the
/// hostile upstream's cases several times over. Its resident memory stays
/// under 64 MiB, another client is served throughout, the idle connections
/// are closed within the header timeout + 1 s, and afterwards its CPU goes
/// back to idle with no connection left open.
// Several threads: on one, the client side of 1,600 concurrent connections
// can starve its own timers for seconds on a loaded 2-core machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_process_stays_bounded_and_returns_to_idle() {
    use support::GatewayProcess;
    use waycast_mock::fixtures as fixture;
    use waycast_mock::upstream::{self as mock_upstream, MockOptions};

    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let hostile = hostile_upstream::start(loopback).await.unwrap();
    let mock = mock_upstream::start(loopback, MockOptions::default()).await.unwrap();
    let mut config = fixture::default_config(&mock.base_url());
    with_hostile_model(&mut config, hostile, 100_000_000);
    let header_timeout = Duration::from_secs(1);
    let gateway = GatewayProcess::start(
        &config,
        &["--header-timeout", "1s", "--body-timeout", "2s", "--log", "warn", "--workers", "2"],
    )
    .await;

    // Warm up, then take the idle figures.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    for _ in 0..20 {
        let response =
            client.request(fixture::post_request(&gateway.url("/v1/chat/completions"), Some(ALICE_KEY), CHAT));
        assert_eq!(response.await.unwrap().status(), StatusCode::OK);
    }
    let (idle_rss, _) = gateway.memory();

    // Three times: memory the allocator keeps after a storm is reused by the
    // next. Each worker's heap keeps its own high-water mark (mimalloc
    // returns freed pages with MADV_FREE: counted in RSS until the kernel
    // needs them), and which worker takes the 1,000-stream connection is
    // the kernel's choice, so the retained memory may step up once per
    // worker (measured: ~11 MiB a step, 23.5 MiB above idle at most with
    // two workers) and then stays; a leak keeps growing past the bound.
    let first = storm(&gateway).await;
    let second = storm(&gateway).await;
    let third = storm(&gateway).await;
    println!(
        "RSS idle {:.1} MiB; after the storms {:.1}, {:.1}, {:.1} MiB",
        mib(idle_rss),
        mib(first.rss_after),
        mib(second.rss_after),
        mib(third.rss_after)
    );
    for round in [&first, &second, &third] {
        println!(
            "silent connections closed after at most {:?}; 1,000 HTTP/2 streams: {} complete in {:?}; bystander {} served",
            round.slowest_close, round.h2_complete, round.h2_took, round.served
        );
        assert!(round.peak_rss < 64 << 20, "peak RSS {:.1} MiB", mib(round.peak_rss));
        assert!(
            round.slowest_close <= header_timeout + Duration::from_secs(1),
            "an idle connection lived {:?}",
            round.slowest_close
        );
        assert_eq!(round.h2_complete, 1_000, "every HTTP/2 stream ran to [DONE]");
        for (took, status_line) in &round.slow_answers {
            assert!(*took < Duration::from_secs(4), "a slow body was held {took:?}");
            assert!(status_line.is_empty() || status_line.contains(" 408 "), "{status_line}");
        }
        assert!(
            round.failed.is_empty() && round.served > 10,
            "the bystander: {} served, failed {:?}",
            round.served,
            round.failed
        );
        assert!(round.idle_ticks <= 10, "{} ticks of CPU in 2 s with nothing to do", round.idle_ticks);
    }
    for (round, after) in [first.rss_after, second.rss_after, third.rss_after].into_iter().enumerate() {
        assert!(after <= idle_rss + (28 << 20), "RSS {:.1} MiB after storm {round}: a leak", mib(after));
    }
}

/// What one storm of hostile cases did to a gateway process.
struct Storm {
    peak_rss: u64,
    rss_after: u64,
    idle_ticks: u64,
    slowest_close: Duration,
    h2_complete: usize,
    h2_took: Duration,
    slow_answers: Vec<(Duration, String)>,
    served: usize,
    failed: Vec<String>,
}

/// Runs every hostile case at once against `gateway`, then waits for it to
/// go idle and measures it.
async fn storm(gateway: &support::GatewayProcess) -> Storm {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;
    use waycast_mock::fixtures as fixture;

    let public = gateway.public;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    // Memory sampled every 20 ms while the cases run; another client served throughout.
    let pid = gateway.pid();
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = tokio::spawn({
        let running = running.clone();
        async move {
            let mut peak = 0_u64;
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
                let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
                peak = peak.max(rss.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        }
    });
    let bystander = tokio::spawn({
        let (running, client, url) = (running.clone(), client.clone(), gateway.url("/v1/chat/completions"));
        async move {
            let (mut served, mut failed) = (0, Vec::new());
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                match client.request(fixture::post_request(&url, Some(ALICE_KEY), CHAT)).await {
                    Ok(response) if response.status() == StatusCode::OK => served += 1,
                    other => failed.push(format!("{:?}", other.map(|r| r.status()))),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (served, failed)
        }
    });

    // Connections that send nothing, or stop inside the HTTP/2 preface: each
    // is closed within the header timeout (+ 1 s of slack for two saturated
    // cores). This once failed with one still open after 30 s: the listen
    // queue was the default 128, so of 300 connects at once some had their
    // SYN dropped (1 s late) or their handshake's last ACK (never accepted
    // at all); gateway_process.rs now checks the queue on its own.
    let silent = (0..300).map(|index| {
        tokio::spawn(async move {
            let mut stream = TcpStream::connect(public).await.unwrap();
            if index % 3 == 0 {
                stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
            }
            let opened = Instant::now();
            let mut byte = [0_u8; 1];
            let closed = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await;
            assert!(matches!(closed, Ok(Ok(0) | Err(_))), "connection {index}: {closed:?}");
            opened.elapsed()
        })
    });
    let silent: Vec<_> = silent.collect();

    // Slow bodies: a declared 1,000 bytes sent one byte every 200 ms.
    let slow = (0..20).map(|_| {
        tokio::spawn(async move {
            let mut stream = TcpStream::connect(public).await.unwrap();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {ALICE_KEY}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            let started = Instant::now();
            let mut answer = Vec::new();
            loop {
                if stream.write_all(b" ").await.is_err() {
                    break;
                }
                let mut buffer = [0_u8; 1024];
                match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buffer)).await {
                    Ok(Ok(0) | Err(_)) => break,
                    Ok(Ok(read)) => answer.extend_from_slice(&buffer[..read]),
                    Err(_) => {}
                }
                assert!(started.elapsed() < Duration::from_secs(10), "a slow body was held for 10 s");
            }
            (started.elapsed(), String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_owned())
        })
    });
    let slow: Vec<_> = slow.collect();

    // 1,000 streams on one HTTP/2 connection (the gateway allows 256 at once;
    // the rest wait for a slot, as HTTP/2 intends).
    let h2_streams = tokio::spawn(async move {
        let io = hyper_util::rt::TokioIo::new(TcpStream::connect(public).await.unwrap());
        let (sender, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
        tokio::spawn(connection);
        let started = Instant::now();
        let mut streams = tokio::task::JoinSet::new();
        for _ in 0..1_000 {
            let mut sender = sender.clone();
            let body = r#"{"model":"mistral-7b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
            let mut request = fixture::post_request("http://gateway/v1/chat/completions", Some(ALICE_KEY), body);
            request.headers_mut().insert("x-mock-chunks", "3".parse().unwrap());
            request.headers_mut().insert("x-mock-interval-ms", "50".parse().unwrap());
            streams.spawn(async move {
                sender.ready().await.unwrap();
                let response = sender.send_request(request).await.unwrap();
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, body.ends_with(b"data: [DONE]\n\n"))
            });
        }
        let mut complete = 0;
        while let Some(outcome) = streams.join_next().await {
            let (status, done) = outcome.unwrap();
            assert_eq!(status, StatusCode::OK);
            complete += usize::from(done);
        }
        (complete, started.elapsed())
    });

    // The hostile upstream's cases, four of each at once.
    let hostile_cases = tokio::task::JoinSet::from_iter(
        ["endless-event", "drip", "huge-header", "reset", "absurd-usage"].into_iter().cycle().take(20).map(|mode| {
            let url = gateway.url("/v1/chat/completions");
            async move {
                let stream = mode != "drip" && mode != "huge-header" && mode != "absurd-usage";
                let body = format!(r#"{{"model":"hostile","stream":{stream},"messages":[]}}"#);
                let mut request = fixture::post_request(&url, Some(ALICE_KEY), &body);
                request.headers_mut().insert("x-hostile", mode.parse().unwrap());
                let client =
                    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
                tokio::time::timeout(Duration::from_secs(20), async {
                    let response = client.request(request).await.unwrap();
                    let _ = response.into_body().collect().await;
                })
                .await
                .unwrap_or_else(|_| panic!("{mode} did not end within 20 s"));
            }
        }),
    );

    let mut closed_after = Vec::new();
    for connection in silent {
        closed_after.push(connection.await.unwrap());
    }
    closed_after.sort();
    let slowest_close = closed_after.last().copied().unwrap();
    let mut slow_answers = Vec::new();
    for connection in slow {
        slow_answers.push(connection.await.unwrap());
    }
    let (complete, h2_took) = h2_streams.await.unwrap();
    hostile_cases.join_all().await;
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak_sampled = sampler.await.unwrap();
    let (served, failed) = bystander.await.unwrap();
    let (_, peak_rss) = gateway.memory();

    // Back to idle: no connection left open, no CPU spent.
    let deadline = Instant::now() + Duration::from_secs(10);
    while gateway.metric("waycast_gateway_connections_open").await != Some(0.0) {
        assert!(Instant::now() < deadline, "connections stayed open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ticks_before = gateway.cpu_ticks();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_ticks = gateway.cpu_ticks() - ticks_before;

    let (rss_after, _) = gateway.memory();
    println!(
        "storm: peak RSS {:.1} MiB (sampled {:.1}), after {:.1} MiB; CPU after: {idle_ticks} ticks in 2 s",
        mib(peak_rss),
        mib(peak_sampled),
        mib(rss_after)
    );
    Storm {
        peak_rss,
        rss_after,
        idle_ticks,
        slowest_close,
        h2_complete: complete,
        h2_took,
        slow_answers,
        served,
        failed,
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}
