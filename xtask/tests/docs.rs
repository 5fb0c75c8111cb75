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

/// The chart's dashboards and rules, and their docs, are what the one
/// source renders now (so a panel cannot drift from the metric it reads).
#[test]
fn committed_dashboards_and_rules_are_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = waycast_xtask::observability::generated().unwrap();
    files.push(("docs/dashboards.md".to_owned(), waycast_xtask::observability::dashboards_doc()));
    assert!(files.len() >= 5, "three dashboards, the rules and their docs");
    for (path, rendered) in files {
        let committed = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
        assert!(committed == rendered, "{path} is stale: run `make generate` and commit the result");
    }
}

/// README.md and docs/*.md name no commit and no tracker entry (`make lint`
/// runs the same check).
#[test]
fn committed_docs_are_reference() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = waycast_xtask::docs_check::check(&root).unwrap();
    assert!(found.is_empty(), "move runs and comparisons to CHANGELOG.md or bench/LOG.md:\n{}", found.join("\n"));
}
