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
/// of many keys with budgets shows only those worth a look). Series are set,
/// then those no longer shown removed — never cleared first, so a scrape
/// beside another (an HA pair) sees no budget vanish and return.
fn set_budgets_used(gauge: &prometheus::GaugeVec, snapshot: Option<&crate::snapshot::Snapshot>) {
    const SHOWN_FROM: f64 = 0.5;
    let mut shown = std::collections::HashSet::new();
    if let Some(snapshot) = snapshot {
        for (scope, period, ratio) in snapshot.budgets_used(jiff::Timestamp::now(), SHOWN_FROM) {
            let period = match period {
                waycast_crds::period::Period::Day => "day",
                waycast_crds::period::Period::Week => "week",
                waycast_crds::period::Period::Month => "month",
            };
            gauge.with_label_values(&[scope.as_str(), period]).set(ratio);
            shown.insert((scope, period.to_owned()));
        }
    }
    for family in prometheus::core::Collector::collect(gauge) {
        for metric in family.get_metric() {
            let label = |name: &str| metric.get_label().iter().find(|l| l.name() == name).map(|l| l.value().to_owned());
            if let (Some(scope), Some(period)) = (label("scope"), label("period"))
                && !shown.contains(&(scope.clone(), period.clone()))
            {
                let _ = gauge.remove_label_values(&[scope.as_str(), period.as_str()]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_shown_at_one_scrape_is_gone_at_the_next_when_no_longer_half_spent() {
        let gauge = prometheus::GaugeVec::new(prometheus::Opts::new("used", "test"), &["scope", "period"]).unwrap();
        gauge.with_label_values(&["key:team/k", "day"]).set(0.9);
        set_budgets_used(&gauge, None);
        assert!(prometheus::core::Collector::collect(&gauge).iter().all(|family| family.get_metric().is_empty()));
    }
}
