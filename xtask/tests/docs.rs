//! Generated docs must be what the code renders now.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

#[test]
fn committed_metrics_reference_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let rendered = waycast_xtask::docs::metrics_reference().unwrap();
    assert!(committed == rendered, "docs/metrics.md is stale: run `make generate` and commit the result");
    // Every metric of both binaries is listed, with the project's prefix.
    let rows: Vec<&str> = rendered.lines().filter(|l| l.starts_with("| `")).collect();
    assert!(rows.len() >= 17, "{rendered}");
    assert!(rows.iter().all(|row| row.starts_with("| `waycast_")), "{rendered}");
    assert!(rendered.contains("| `waycast_gateway_inflight_requests` | gauge |"), "{rendered}");
}
