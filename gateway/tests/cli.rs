//! The binary's command line: keygen output, and exit code 64 on bad usage.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::process::Command;

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_waycast-gateway"))
}

#[test]
fn keygen_prints_a_key_and_its_hash() {
    let output = gateway().arg("keygen").output().unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    let key = text.lines().find_map(|l| l.strip_prefix("key:    ")).unwrap();
    let hash = text.lines().find_map(|l| l.strip_prefix("sha256: ")).unwrap();
    assert!(key.starts_with("wc_") && key.len() == 46, "{key}");
    assert!(key[3..].bytes().all(|b| b.is_ascii_alphanumeric()));
    assert_eq!(hash, waycast_crds::digest::sha256_hex(key.as_bytes()));
    assert!(text.contains(&format!("    sha256: {hash}")), "a line to paste into a config");
    let again = gateway().arg("keygen").output().unwrap();
    assert_ne!(String::from_utf8(again.stdout).unwrap(), text, "keys are random");
}

#[test]
fn bad_usage_exits_64() {
    for args in [
        vec!["--listen", "not-an-address", "--config-file", "x"],
        vec!["--config-secret", "no-slash"],
        vec!["--drain-timeout", "forever", "--config-file", "x"],
        vec!["--tls-cert", "only-cert.pem", "--config-file", "x"],
        vec![],
    ] {
        let output = gateway().args(&args).output().unwrap();
        assert_eq!(output.status.code(), Some(64), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let help = gateway().arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("--config-secret"));
}
