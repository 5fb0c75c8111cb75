//! The admin endpoints: `/metrics` (Prometheus text), `/usage` (what this
//! process counted per key and budget, for the operator: `crate::usage`),
//! `/healthz` (the process is alive), `/readyz` (a config is loaded and
//! the gateway is not draining).

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;

use crate::shared::Shared;

/// Answers one admin request.
pub fn respond<B>(shared: &Shared, request: &Request<B>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match request.uri().path() {
        "/metrics" => {
            // Read at scrape time: the connection task has no metrics of its own.
            let snapshot = shared.config.current();
            let redis = snapshot.as_ref().and_then(|s| s.redis.as_ref());
            shared.metrics.rate_limit_store_up.set(i64::from(redis.is_some_and(|r| r.is_connected())));
            let failed = redis.map_or(0, |r| r.failed_connects());
            shared.metrics.rate_limit_store_failed_connects.set(i64::try_from(failed).unwrap_or(i64::MAX));
            set_budgets_used(&shared.metrics.budget_used, snapshot.as_deref());
            (StatusCode::OK, "text/plain; version=0.0.4", shared.metrics.render())
        }
        "/usage" => match shared.config.current() {
            Some(snapshot) => {
                let report = shared.ledger.report(&snapshot, jiff::Timestamp::now());
                (StatusCode::OK, "application/json", serde_json::to_string(&report).unwrap_or_default())
            }
            None => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "no config loaded yet\n".to_owned()),
        },
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => {
            if shared.is_ready() {
                (StatusCode::OK, "text/plain", "ready\n".to_owned())
            } else if shared.is_draining() {
                (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".to_owned())
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "no config loaded yet\n".to_owned())
            }
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Budgets half spent or more: a series each, the rest none (so a Gateway
/// of many keys with budgets shows only those worth a look).
fn set_budgets_used(gauge: &prometheus::GaugeVec, snapshot: Option<&crate::snapshot::Snapshot>) {
    const SHOWN_FROM: f64 = 0.5;
    gauge.reset();
    let Some(snapshot) = snapshot else { return };
    for (scope, period, ratio) in snapshot.budgets_used(jiff::Timestamp::now(), SHOWN_FROM) {
        let period = match period {
            waycast_crds::period::Period::Day => "day",
            waycast_crds::period::Period::Week => "week",
            waycast_crds::period::Period::Month => "month",
        };
        gauge.with_label_values(&[scope.as_str(), period]).set(ratio);
    }
}
