//! The chart's Grafana dashboards and PrometheusRule, generated from one
//! source (`source.rs`) by `make generate`, with every metric name they
//! use checked against the gateway's and the operator's registries.

pub mod source;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::Context as _;
use prometheus::proto::MetricType;
use serde_json::{Value, json};

pub use source::{ALERTS, Alert, DASHBOARDS, Dashboard};

/// Where the generated dashboards go.
pub const DASHBOARD_DIR: &str = "charts/waycast/dashboards";
/// The generated rule groups.
pub const RULES_FILE: &str = "charts/waycast/rules/waycast.rules.yaml";

/// Every generated file: (path under the repository, contents).
///
/// # Errors
/// A query names a metric neither binary exports.
pub fn generated() -> anyhow::Result<Vec<(String, String)>> {
    let known = metric_names()?;
    let mut files = Vec::new();
    for dashboard in DASHBOARDS {
        for panel in dashboard.rows.iter().flat_map(|(_, panels)| panels.iter()) {
            for (expr, _) in panel.queries {
                check_names(expr, &known).with_context(|| format!("{}: panel {:?}", dashboard.file, panel.title))?;
            }
        }
        for (_, query, _) in dashboard.variables {
            check_names(query, &known).with_context(|| format!("{}: a variable", dashboard.file))?;
        }
        let text = serde_json::to_string_pretty(&dashboard_json(dashboard))? + "\n";
        files.push((format!("{DASHBOARD_DIR}/{}", dashboard.file), text));
    }
    for alert in ALERTS {
        check_names(alert.expr, &known).with_context(|| format!("alert {}", alert.name))?;
        anyhow::ensure!(
            alert.expr.starts_with(alert.probe),
            "alert {}: its probe is not its expression's start",
            alert.name
        );
    }
    files.push((RULES_FILE.to_owned(), rules_yaml()));
    Ok(files)
}

/// Every query a dashboard panel or variable runs and every alert's
/// expression and probe, with the dashboards' variables as a test fills
/// them in (every model, every namespace, a one-minute rate window):
/// (where it is from, the expression).
pub fn queries_for_test() -> Vec<(String, String)> {
    let fill = |expr: &str| {
        expr.replace("$__rate_interval", "1m")
            .replace("($namespace)", "[^/]+")
            .replace("$namespace", ".+")
            .replace("$model", ".+")
    };
    let mut queries = Vec::new();
    for dashboard in DASHBOARDS {
        for panel in dashboard.rows.iter().flat_map(|(_, panels)| panels.iter()) {
            for (expr, legend) in panel.queries {
                queries.push((format!("{} / {} / {legend}", dashboard.title, panel.title), fill(expr)));
            }
        }
    }
    for alert in ALERTS {
        queries.push((format!("alert {} (probe)", alert.name), alert.probe.to_owned()));
    }
    queries
}

/// The alerts' full expressions (which return data only while firing).
pub fn alert_expressions() -> Vec<(&'static str, &'static str)> {
    ALERTS.iter().map(|alert| (alert.name, alert.expr)).collect()
}

/// Every family both binaries export, with a histogram's series names.
fn metric_names() -> anyhow::Result<BTreeSet<String>> {
    let gateway = waycast_gateway::metrics::Metrics::new().context("gateway metrics")?;
    let operator = waycast_operator::metrics::Metrics::new().context("operator metrics")?;
    let mut names = BTreeSet::new();
    for collector in gateway.collectors().into_iter().chain(operator.collectors()) {
        for desc in collector.desc() {
            names.insert(desc.fq_name.clone());
        }
        for family in collector.collect() {
            if family.get_field_type() == MetricType::HISTOGRAM {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{}{suffix}", family.name()));
                }
            }
        }
    }
    // A histogram's series whose family has no series yet: named from its
    // description (`collect` shows only families with a child).
    for name in names.clone() {
        for suffix in ["_bucket", "_sum", "_count"] {
            names.insert(format!("{name}{suffix}"));
        }
    }
    Ok(names)
}

fn check_names(expr: &str, known: &BTreeSet<String>) -> anyhow::Result<()> {
    for name in metric_tokens(expr) {
        anyhow::ensure!(known.contains(name), "{name} is not a metric the gateway or the operator exports");
    }
    Ok(())
}

/// The `waycast_…` identifiers of an expression.
pub fn metric_tokens(expr: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("waycast_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        // Inside a label value (`scope="key:…"`) is not a metric.
        if !rest[..at].ends_with(':') {
            tokens.push(&tail[..end]);
        }
        rest = &tail[end..];
    }
    tokens
}

fn dashboard_json(dashboard: &Dashboard) -> Value {
    let mut panels = Vec::new();
    let mut id = 1;
    let mut y = 0;
    for (row, row_panels) in dashboard.rows {
        panels.push(json!({
            "id": id, "type": "row", "title": row, "collapsed": false,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": [],
        }));
        id += 1;
        y += 1;
        for (index, panel) in row_panels.iter().enumerate() {
            let targets: Vec<Value> = panel
                .queries
                .iter()
                .zip('A'..)
                .map(|((expr, legend), ref_id)| {
                    json!({
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        "expr": expr, "legendFormat": legend, "refId": ref_id.to_string(), "range": true,
                    })
                })
                .collect();
            let column = u32::try_from(index % 3).unwrap_or(0);
            panels.push(json!({
                "id": id, "type": "timeseries", "title": panel.title, "description": panel.description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 8, "x": column * 8, "y": y},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": true},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
                "targets": targets,
            }));
            id += 1;
            if index % 3 == 2 || index + 1 == row_panels.len() {
                y += 8;
            }
        }
    }
    let mut variables = vec![json!({
        "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
        "current": {}, "hide": 0, "refresh": 1,
    })];
    for (name, query, regex) in dashboard.variables {
        variables.push(json!({
            "name": name, "label": name, "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "definition": query, "regex": regex, "refresh": 2, "sort": 1,
            "multi": true, "includeAll": true, "allValue": ".+", "current": {}, "hide": 0,
        }));
    }
    json!({
        "uid": dashboard.uid, "title": dashboard.title, "description": dashboard.description,
        "tags": ["waycast"], "timezone": "browser", "editable": true, "graphTooltip": 1,
        "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": panels,
    })
}

/// The rule groups as Prometheus reads them (`rule_files`, `promtool check
/// rules`) and as the chart's PrometheusRule `spec` holds them. Strings are
/// JSON-quoted: JSON strings are YAML double-quoted scalars.
fn rules_yaml() -> String {
    let quote = |text: &str| Value::String(text.to_owned()).to_string();
    let mut yaml = String::from(
        "# GENERATED by `make generate` from xtask/src/observability/source.rs; do not edit.\n\
         groups:\n  - name: waycast\n    rules:\n",
    );
    for alert in ALERTS {
        let _ = write!(
            yaml,
            "      - alert: {}\n        expr: {}\n        for: {}\n        labels:\n          severity: {}\n        annotations:\n          summary: {}\n          description: {}\n",
            alert.name,
            quote(alert.expr),
            alert.for_,
            alert.severity,
            quote(alert.summary),
            quote(alert.description),
        );
    }
    yaml
}

/// `docs/dashboards.md`: every dashboard panel and alert.
pub fn dashboards_doc() -> String {
    let mut doc = String::from(
        "# Dashboards and alerts\n\n\
         <!-- GENERATED by `make generate` from xtask/src/observability/source.rs; do not edit. -->\n\n\
         The chart's Grafana dashboards (`dashboards.enabled`) and PrometheusRule\n\
         (`prometheusRule.enabled`): what each panel and alert shows. How to turn them\n\
         on, and how they are tested, is in [observability.md](observability.md).\n",
    );
    for dashboard in DASHBOARDS {
        let _ = write!(
            doc,
            "\n## {} (`{}`)\n\n{}\n\n| Row | Panel | Shows |\n|---|---|---|\n",
            dashboard.title, dashboard.file, dashboard.description
        );
        for (row, panels) in dashboard.rows {
            for panel in *panels {
                let _ = writeln!(doc, "| {row} | {} | {} |", panel.title, panel.description);
            }
        }
    }
    let _ = write!(doc, "\n## Alerts (`{RULES_FILE}`)\n\n| Alert | Severity | For | When |\n|---|---|---|---|\n");
    for alert in ALERTS {
        let _ = writeln!(
            doc,
            "| `{}` | {} | {} | {} |",
            alert.name,
            alert.severity,
            alert.for_,
            alert.description.replace('|', "\\|")
        );
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_are_found_outside_label_values() {
        let expr = r#"sum(rate(waycast_gateway_requests_total{scope=~"key:waycast_x"}[1m])) / waycast_operator_b"#;
        assert_eq!(metric_tokens(expr), ["waycast_gateway_requests_total", "waycast_operator_b"]);
    }

    #[test]
    fn a_query_naming_an_unknown_metric_is_refused() {
        let known = metric_names().unwrap();
        assert!(check_names("rate(waycast_gateway_requests_total[1m])", &known).is_ok());
        assert!(check_names("histogram_quantile(0.9, waycast_gateway_overhead_seconds_bucket)", &known).is_ok());
        let renamed = check_names("rate(waycast_gateway_request_total[1m])", &known).unwrap_err();
        assert!(renamed.to_string().contains("waycast_gateway_request_total"), "{renamed}");
    }

    #[test]
    fn every_panel_has_a_query_and_dashboards_fill_their_grid() {
        for dashboard in DASHBOARDS {
            let json = dashboard_json(dashboard);
            let panels = json["panels"].as_array().unwrap();
            for panel in panels.iter().filter(|p| p["type"] == "timeseries") {
                assert!(!panel["targets"].as_array().unwrap().is_empty(), "{panel}");
                assert!(panel["gridPos"]["x"].as_u64().unwrap() + panel["gridPos"]["w"].as_u64().unwrap() <= 24);
            }
        }
    }
}
