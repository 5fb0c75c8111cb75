//! The README's standalone quickstart, run as printed (ports moved to free
//! ones, binaries from this build): both curls work, and the gateway's log
//! never shows the key.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Where cargo put the workspace's binaries: beside this test's own
/// directory (`target/<profile>/deps/..`).
fn binaries() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    if dir.file_name().is_some_and(|n| n == "deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() }
}

/// A loopback port free right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_standalone_quickstart_works_as_printed() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block =
        readme.split("<!-- standalone:begin -->").nth(1).unwrap().split("<!-- standalone:end -->").next().unwrap();
    let script: String =
        block.lines().filter(|l| !l.starts_with("```") && !l.starts_with("cargo build")).collect::<Vec<_>>().join("\n");

    let bin_dir = binaries();
    for binary in ["waycast-gateway", "waycast-mock-upstream"] {
        let path = bin_dir.join(binary);
        assert!(path.is_file(), "{} is missing: build the workspace's binaries first (make test does)", path.display());
    }
    let (upstream, public, admin) = (free_port(), free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("waycast-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let example = std::fs::read_to_string(repo().join("examples/standalone/gateway.yaml")).unwrap();
    let config = dir.join("gateway.yaml");
    std::fs::write(&config, example.replace("127.0.0.1:8000", &format!("127.0.0.1:{upstream}"))).unwrap();

    let script = script
        .replace("target/release/", &format!("{}/", bin_dir.display()))
        .replace("examples/standalone/gateway.yaml", &config.display().to_string())
        .replace("127.0.0.1:8000", &format!("127.0.0.1:{upstream}"))
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{public}"))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{admin}"));
    let script = format!("set -e\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n{script}\n");
    let output = Command::new("bash").arg("-c").arg(&script).current_dir(repo()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the quickstart failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("\"object\":\"chat.completion\""), "no chat completion:\n{stdout}");
    assert!(stdout.contains("chat.completion.chunk") && stdout.contains("data: [DONE]"), "no stream:\n{stdout}");
    assert!(stdout.contains("config applied"), "the gateway log is part of the output:\n{stdout}");
    assert!(
        stdout.lines().any(|l| l.contains("\"log\":\"access\"") && l.contains("\"key\":\"local/demo\"")),
        "access log lines (JSON) name the key id:\n{stdout}"
    );
    assert!(
        !stdout.contains("wc_standalone_demo_key") && !stderr.contains("wc_standalone_demo_key"),
        "key material in a log:\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
