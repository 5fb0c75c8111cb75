#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::Ipv4Addr;

use serde_json::Value;
use waycast_mock::collector::{Collector, attribute};
use waycast_mock::fixtures::objects;
use waycast_otlp::wire::{self, Wire, one};

use super::*;

const AT: Duration = Duration::from_secs(1_800_000_000);

fn reconcile_of(namespace: &str, name: &str) -> Reconcile {
    let mut gateway = objects::gateway(namespace, name);
    gateway.metadata.generation = Some(3);
    Reconcile::begin(&Arc::new(gateway))
}

fn text(value: &str) -> Wire {
    Wire::Bytes(value.as_bytes().to_vec())
}

/// The one span an item holds, decoded.
fn the_span(item: &Item) -> Vec<u8> {
    assert_eq!(item.span_count, 1);
    assert!(item.records.is_empty(), "a reconcile sends no log record");
    let spans = wire::all(&item.spans, 2);
    assert_eq!(spans.len(), 1);
    wire::bytes_of(spans.into_iter().next().unwrap())
}

#[test]
fn a_reconcile_is_one_internal_span_with_its_gateway_what_it_compiled_and_ok() {
    let mut reconcile = reconcile_of("platform", "shared");
    reconcile.started = SystemTime::UNIX_EPOCH + AT;
    (reconcile.config_hash, reconcile.keys, reconcile.models) = (Some("c0ffee".into()), Some(2), Some(1));
    let item = span(&reconcile, Ok(()), (&[1; 16], &[2; 8]), reconcile.started + Duration::from_millis(250));
    let span = the_span(&item);
    assert_eq!(one(&span, 1), Wire::Bytes(vec![1; 16]));
    assert_eq!(one(&span, 2), Wire::Bytes(vec![2; 8]));
    assert!(wire::all(&span, 4).is_empty(), "a trace of its own: no parent");
    assert_eq!(wire::text(&span, 5), "reconcile Gateway");
    assert_eq!(one(&span, 6), Wire::Varint(1), "SPAN_KIND_INTERNAL");
    let start = u64::try_from(AT.as_nanos()).unwrap();
    assert_eq!(one(&span, 7), Wire::Fixed64(start));
    assert_eq!(one(&span, 8), Wire::Fixed64(start + 250_000_000));
    assert_eq!(
        wire::attributes(&span, 9),
        vec![
            ("k8s.namespace.name".into(), text("platform")),
            ("waycast.gateway".into(), text("platform/shared")),
            ("waycast.generation".into(), Wire::Varint(3)),
            ("waycast.outcome".into(), text("ok")),
            ("waycast.config.hash".into(), text("c0ffee")),
            ("waycast.keys".into(), Wire::Varint(2)),
            ("waycast.models".into(), Wire::Varint(1)),
        ]
    );
    assert!(wire::all(&span, 15).is_empty(), "no error status");
}

#[test]
fn a_failed_reconcile_says_its_reason_as_the_error_metric_does_and_sets_the_error_status() {
    let reconcile = reconcile_of("platform", "shared");
    let error = Error::Timeout(Duration::from_secs(10));
    assert_eq!(outcome(Err(&error)), error.metric_label());
    assert_eq!(outcome(Ok(())), "ok");
    let item = span(&reconcile, Err(&error), (&[1; 16], &[2; 8]), SystemTime::now());
    let span = the_span(&item);
    assert_eq!(wire::attribute(&span, 9, "waycast.outcome"), Some(text("timeout")));
    assert_eq!(wire::attribute(&span, 9, "error.type"), Some(text("timeout")));
    for unknown in ["waycast.config.hash", "waycast.keys", "waycast.models"] {
        assert_eq!(wire::attribute(&span, 9, unknown), None, "{unknown}: not learned before it failed");
    }
    let status = wire::bytes_of(one(&span, 15));
    assert_eq!((wire::text(&status, 2), one(&status, 3)), ("timeout".into(), Wire::Varint(2)), "STATUS_CODE_ERROR");
}

fn collector_config(endpoint: &str, sampling: f64) -> TelemetryConfig {
    TelemetryConfig {
        endpoint: endpoint.to_owned(),
        sampling: waycast_crds::telemetry::Ratio(sampling),
        ..TelemetryConfig::default()
    }
}

#[tokio::test]
async fn reconcile_spans_reach_a_real_collector_with_their_attributes_and_the_operators_name() {
    let collector = Collector::start(Ipv4Addr::LOCALHOST.into()).unwrap();
    let metrics = crate::metrics::Metrics::new().unwrap();
    let traces = Traces::start(&collector_config(&collector.endpoint, 1.0), metrics.telemetry_counts()).unwrap();
    let mut served = reconcile_of("platform", "shared");
    (served.config_hash, served.keys, served.models) = (Some("c0ffee".into()), Some(2), Some(1));
    traces.reconciled(&served, Ok(()));
    traces.reconciled(&reconcile_of("team-a", "edge"), Err(&Error::Timeout(Duration::from_secs(10))));
    traces.flush(Duration::from_secs(5));

    let spans = collector.until("traces", "two reconcile spans", |spans| spans.len() >= 2).await;
    let of = |gateway: &str| -> &Value {
        spans.iter().find(|s| attribute(s, "waycast.gateway") == Some(&Value::from(gateway))).unwrap()
    };
    let ok = of("platform/shared");
    assert_eq!(ok["name"], "reconcile Gateway");
    assert_eq!(ok["kind"], 1, "INTERNAL: {ok:#}");
    assert_eq!(attribute(ok, "k8s.namespace.name").unwrap(), "platform");
    assert_eq!(attribute(ok, "waycast.outcome").unwrap(), "ok");
    assert_eq!(attribute(ok, "waycast.config.hash").unwrap(), "c0ffee");
    assert_eq!(attribute(ok, "waycast.keys").unwrap(), "2");
    assert_eq!(attribute(ok, "waycast.models").unwrap(), "1");
    let failed = of("team-a/edge");
    assert_eq!(attribute(failed, "waycast.outcome").unwrap(), "timeout");
    assert_eq!(failed["status"]["code"], 2, "STATUS_CODE_ERROR: {failed:#}");
    assert_ne!(ok["traceId"], failed["traceId"], "a fresh trace per reconcile");
    for resource in collector.resources("traces") {
        assert_eq!(attribute(&resource, "service.name").unwrap(), "waycast-operator", "{resource:#}");
    }
    assert_eq!(metrics.telemetry_exported.with_label_values(&["traces"]).get(), 2);
}

#[test]
fn unsampled_reconciles_send_nothing_and_a_collector_that_is_down_costs_a_counted_drop() {
    // Nothing listens there.
    let closed = waycast_mock::fixtures::free_port(Ipv4Addr::LOCALHOST.into()).unwrap();
    let endpoint = format!("http://127.0.0.1:{closed}");
    let dropped = |metrics: &crate::metrics::Metrics| {
        metrics.telemetry_dropped.with_label_values(&["traces", "export_failed"]).get()
    };
    let metrics = crate::metrics::Metrics::new().unwrap();
    let never = Traces::start(&collector_config(&endpoint, 0.0), metrics.telemetry_counts()).unwrap();
    for _ in 0..20 {
        never.reconciled(&reconcile_of("platform", "shared"), Ok(()));
    }
    never.flush(Duration::from_secs(5));
    assert_eq!(dropped(&metrics), 0, "sampling 0: nothing was even tried");
    let always = Traces::start(&collector_config(&endpoint, 1.0), metrics.telemetry_counts()).unwrap();
    always.reconciled(&reconcile_of("platform", "shared"), Ok(()));
    always.flush(Duration::from_secs(5));
    assert_eq!(dropped(&metrics), 1);
    assert_eq!(metrics.telemetry_exported.with_label_values(&["traces"]).get(), 0);
}
