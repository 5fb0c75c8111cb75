//! An upstream trying to make a pooled connection carry one request's
//! answer to another (`waycast_mock::desync`), behind a real gateway
//! in-process, over cleartext and TLS. Two keys of two teams call two
//! models served by the same upstream authority, so they share pooled
//! connections. For each case: no request ever receives bytes meant for
//! another (every answer names the probe it was asked with), the upstream
//! executes each POST once, the time and CPU the case costs are bounded,
//! and bystanders are served throughout.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use support::{Fixture, FixtureOptions};
use waycast_crds::config::ClientTlsConfig;
use waycast_mock::desync::{self, Desync, PLANTED};
use waycast_mock::fixtures::{ALICE_KEY, BOB_KEY, temp_dir};
use waycast_mock::pki::{Authority, Usage, server_tls};

/// Two models on the desync upstream at `address` (`https` with `ca`),
/// forwarding its control headers; Bob may call every model.
async fn gateway(address: SocketAddr, ca: Option<String>) -> Fixture {
    Fixture::start(FixtureOptions::default(), move |config, _| {
        let scheme = if ca.is_some() { "https" } else { "http" };
        for name in ["desync-a", "desync-b"] {
            let mut model = config.models[1].clone();
            model.name = name.into();
            model.aliases.clear();
            model.backends[0].url = format!("{scheme}://127.0.0.1:{}/v1", address.port());
            model.backends[0].headers.clear();
            // The name the certificate carries, at the address it is reached at.
            model.backends[0].tls = ca.clone().map(|ca| ClientTlsConfig {
                ca_pem: Some(ca),
                server_name: Some("upstream.test".into()),
                ..Default::default()
            });
            model.forward_headers = vec!["x-hostile".into(), "x-probe".into()];
            model.timeouts.first_byte = Duration::from_secs(5);
            config.models.push(model);
        }
        config.keys[1].models = None;
    })
    .await
}

/// Asks `model` as `key` with `mode`, naming `probe`: the status and, for
/// a 200, the probe the answer names.
async fn ask(fixture: &Fixture, key: &str, model: &str, mode: &str, probe: &str) -> (StatusCode, Option<String>) {
    let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
    let mut headers = vec![("x-probe", probe)];
    if !mode.is_empty() {
        headers.push(("x-hostile", mode));
    }
    let request = fixture.request("/v1/chat/completions", Some(key), &body, &headers);
    let (status, _, body) = fixture.send(request).await;
    let answered = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["probe"].as_str().map(str::to_owned));
    (status, answered)
}

/// The CPU time this process has used, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// An answer followed by a planted one — in the same write, or while the
/// connection idles — reaches only its own request: the next requests on
/// that authority (another key, another model) get their own answers,
/// never the planted one and never one shifted from an earlier request.
async fn stray_answers_reach_no_other_request(upstream: &Desync, fixture: &Fixture) {
    for round in 0..4 {
        for mode in ["stray", "stray-later"] {
            let first = format!("a-{mode}-{round}");
            assert_eq!(ask(fixture, ALICE_KEY, "desync-a", mode, &first).await, (StatusCode::OK, Some(first.clone())));
            if mode == "stray-later" {
                // The planted answer arrives while the connection is pooled.
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            for (key, model, probe) in [
                (BOB_KEY, "desync-b", format!("b-{mode}-{round}")),
                (ALICE_KEY, "desync-a", format!("a2-{mode}-{round}")),
            ] {
                let (status, answered) = ask(fixture, key, model, "", &probe).await;
                assert_eq!((status, answered.as_deref()), (StatusCode::OK, Some(probe.as_str())), "after {first}");
            }
        }
    }
    assert_eq!(upstream.executions(PLANTED).await, 0, "the planted answer was never asked for");
}

#[tokio::test]
async fn stray_answers_on_pooled_cleartext_connections_reach_no_other_request() {
    let upstream = desync::start("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    let fixture = gateway(upstream.addr, None).await;
    stray_answers_reach_no_other_request(&upstream, &fixture).await;
}

#[tokio::test]
async fn stray_answers_on_pooled_tls_connections_reach_no_other_request() {
    let dir = temp_dir("desync-tls");
    let authority = Authority::generate(&dir, "ca").unwrap();
    let server = authority.issue(&dir, "upstream", "upstream", &[], &["upstream.test".into()], Usage::Server).unwrap();
    let tls = server_tls(&server.cert, &server.key, None).unwrap();
    let upstream = desync::start("127.0.0.1:0".parse().unwrap(), Some(tls)).await.unwrap();
    let fixture = gateway(upstream.addr, Some(std::fs::read_to_string(&authority.files.cert).unwrap())).await;
    stray_answers_reach_no_other_request(&upstream, &fixture).await;
}

/// The other broken answers: each is a 502 for its own request, executed
/// once upstream, in bounded time and CPU; the next request on the same
/// authority, another key's, gets its own answer.
#[tokio::test]
async fn broken_answers_fail_only_their_own_request_once() {
    let upstream = desync::start("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    let fixture = gateway(upstream.addr, None).await;
    // A warm pooled connection, so that the close below hits a reused one.
    assert_eq!(ask(&fixture, BOB_KEY, "desync-b", "", "warm").await.0, StatusCode::OK);
    for mode in ["framed-twice", "close-after-request", "endless-continue", "huge-head"] {
        let probe = format!("case-{mode}");
        let (started, ticks) = (Instant::now(), cpu_ticks());
        let (status, answered) = ask(&fixture, ALICE_KEY, "desync-a", mode, &probe).await;
        let (took, cpu) = (started.elapsed(), cpu_ticks() - ticks);
        println!("{mode}: {status} after {took:?}, {cpu} ticks of CPU");
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{mode}: {answered:?}");
        assert!(took < Duration::from_secs(2), "{mode} took {took:?}");
        assert!(cpu < 100, "{mode} cost {cpu} ticks of CPU");
        assert_eq!(upstream.executions(&probe).await, 1, "{mode}: executed once upstream");
        let bystander = format!("after-{mode}");
        let (status, answered) = ask(&fixture, BOB_KEY, "desync-b", "", &bystander).await;
        assert_eq!((status, answered), (StatusCode::OK, Some(bystander)), "after {mode}");
    }
}
