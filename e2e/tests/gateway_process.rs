//! The gateway binary as a process: SIGTERM during a stream lets the stream
//! finish, refuses new connections, and exits 0; SIGHUP re-reads the config.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use waycast_e2e::control_plane::free_port;
use waycast_e2e::fixture::{self, ALICE_KEY, BOB_KEY};
use waycast_e2e::mock_upstream::{self, MockOptions};

fn gateway_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_waycast-mock-upstream")).with_file_name("waycast-gateway");
    assert!(path.is_file(), "{} is missing: build the workspace's binaries first (make test does)", path.display());
    path
}

fn signal(child: &tokio::process::Child, name: &str) {
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-s", name, &pid]).status().unwrap().success());
}

#[tokio::test]
async fn sigterm_drains_and_sighup_reloads() {
    let mock = mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap();
    let dir = fixture::temp_dir("process");
    let config_path = dir.join("gateway.yaml");
    let mut config = fixture::default_config(&mock.base_url());
    config.keys.retain(|k| k.id == "team-a/alice");
    std::fs::write(&config_path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let loopback = "127.0.0.1".parse().unwrap();
    let (public, admin) = (free_port(loopback).unwrap(), free_port(loopback).unwrap());
    let mut child = tokio::process::Command::new(gateway_binary())
        .args(["--config-file", &config_path.display().to_string()])
        .args(["--listen", &format!("127.0.0.1:{public}"), "--admin-listen", &format!("127.0.0.1:{admin}")])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let url = format!("http://127.0.0.1:{public}/v1/chat/completions");
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_for(ALICE_KEY).await != Some(StatusCode::OK) {
        assert!(Instant::now() < deadline, "the gateway did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

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
    signal(&child, "HUP");
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
    let mut text = String::from_utf8_lossy(&body.frame().await.unwrap().unwrap().into_data().unwrap()).into_owned();
    signal(&child, "TERM");
    let readyz = format!("http://127.0.0.1:{admin}/readyz");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let refused = tokio::net::TcpStream::connect(("127.0.0.1", public)).await.is_err();
        let ready = client.get(readyz.parse().unwrap()).await.map(|r| r.status());
        if refused && ready.as_ref().map_or(true, |s| *s == StatusCode::SERVICE_UNAVAILABLE) {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting or ready after SIGTERM: {ready:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while let Some(frame) = body.frame().await {
        text.push_str(&String::from_utf8_lossy(&frame.unwrap().into_data().unwrap()));
    }
    assert!(text.contains("token7") && text.ends_with("data: [DONE]\n\n"), "the stream was cut: {text}");
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(dir);
}
