//! The ArgoCD health checks the chart ships, run with Lua 5.1 (ArgoCD's
//! dialect) on fixture objects in every state the operator writes.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::path::{Path, PathBuf};

use serde_json::Value;
use waycast_e2e::argocd::{Health, health_scripts, run_health_check};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn one_health_check_serves_every_kind() {
    let scripts = health_scripts(&repo_root()).unwrap();
    let kinds: Vec<&str> = scripts.keys().map(String::as_str).collect();
    assert_eq!(kinds, ["AccessGrant", "ApiKey", "Gateway", "ModelEndpoint"]);
    let first = &scripts["Gateway"];
    assert!(scripts.values().all(|script| script == first), "every kind should be judged by one script");
}

#[test]
fn health_follows_the_conditions_of_every_fixture() {
    let scripts = health_scripts(&repo_root()).unwrap();
    let fixtures_path = repo_root().join("charts/waycast/argocd/health-fixtures.yaml");
    let fixtures: Vec<Value> = serde_yaml_ng::from_str(&std::fs::read_to_string(fixtures_path).unwrap()).unwrap();
    assert!(fixtures.len() >= 12, "too few fixtures: {}", fixtures.len());
    let mut seen_statuses = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for fixture in &fixtures {
        let name = fixture["name"].as_str().unwrap();
        let object = &fixture["object"];
        let kind = object["kind"].as_str().unwrap();
        let expected = Health {
            status: fixture["expect"]["status"].as_str().unwrap().to_owned(),
            message: fixture["expect"]["message"].as_str().unwrap().to_owned(),
        };
        let actual = run_health_check(&scripts[kind], object).unwrap();
        if actual != expected {
            failures.push(format!("{name}: expected {expected:?}, got {actual:?}"));
        }
        seen_statuses.insert(expected.status);
    }
    assert!(failures.is_empty(), "health checks disagree with fixtures:\n{}", failures.join("\n"));
    let statuses: Vec<&str> = seen_statuses.iter().map(String::as_str).collect();
    assert_eq!(statuses, ["Degraded", "Healthy", "Progressing", "Suspended"], "every status is exercised");
}

#[test]
fn a_script_error_is_reported_not_hidden() {
    let result = run_health_check("return obj.status.conditions[1].type", &serde_json::json!({"kind": "ApiKey"}));
    assert!(result.is_err(), "indexing a missing status must fail loudly: {result:?}");
}
