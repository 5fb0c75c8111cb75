//! The endpoints of the Services the config routes to, kept apart from the
//! config (`waycast_crds::endpoints`): pod churn changes only this table,
//! never the Snapshot.
//!
//! The table keeps each endpoint's state (in flight, ejection) across
//! documents; its sources are in `config::endpoints`. Requests load the
//! table once per pick.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use waycast_crds::endpoints::EndpointsDocument;

use super::pick::{ANSWER_BUCKETS, EndpointSet, SetHandle};

type Sets = HashMap<Arc<str>, Arc<EndpointSet>>;

/// Slots of a thread's handles on endpoint sets (a Service's slot is chosen
/// by its key, so its successive sets take the same one).
const HANDLE_SLOTS: usize = 64;

thread_local! {
    static HANDLES: std::cell::RefCell<crate::per_worker::Handles<EndpointSet>> =
        std::cell::RefCell::new(crate::per_worker::Handles::new(HANDLE_SLOTS));
}

/// Every known Service's endpoints, by `namespace/name:port`.
#[derive(Default)]
pub struct EndpointTable {
    sets: ArcSwap<Sets>,
}

impl EndpointTable {
    /// The endpoints of the Service `key`, if any are known.
    pub fn get(&self, key: &str) -> Option<Arc<EndpointSet>> {
        self.sets.load().get(key).cloned()
    }

    /// The same, through this thread's own handle on the set (made when
    /// the thread first routes to it; one slot per Service, so a set that
    /// changed is let go at the thread's next request to its Service).
    pub fn get_here(&self, key: &str) -> Option<Arc<SetHandle>> {
        let sets = self.sets.load();
        let set = sets.get(key)?;
        let slot = (super::pick::affinity_hash(key.as_bytes()) % HANDLE_SLOTS as u64) as usize;
        Some(HANDLES.with_borrow_mut(|handles| handles.on(slot, set)))
    }

    /// Replaces the table with `document`; an endpoint that stays keeps its
    /// state (in flight, failures, its counts in `/metrics`); one that left
    /// leaves `/metrics` with it. Returns how many endpoints are known now.
    pub fn apply(&self, document: &EndpointsDocument) -> usize {
        let previous = self.sets.load_full();
        let next: Sets = document
            .services
            .iter()
            .map(|(key, addresses)| {
                let set = EndpointSet::new(addresses, previous.get(key.as_str()).map(AsRef::as_ref));
                (Arc::from(key.as_str()), Arc::new(set))
            })
            .collect();
        let known = next.values().map(|set| set.endpoints().len()).sum();
        self.sets.store(Arc::new(next));
        known
    }
}

/// The per-endpoint series, read from the table's endpoints when `/metrics`
/// is rendered: requests write only the endpoint's own counts
/// (`pick::Endpoint`), never a labelled series.
#[derive(Clone)]
pub struct EndpointSeries {
    table: Arc<EndpointTable>,
    in_flight: Desc,
    requests: Desc,
    response: Desc,
}

impl EndpointSeries {
    /// The series of `table`'s endpoints.
    pub fn new(table: Arc<EndpointTable>) -> Result<Self, prometheus::Error> {
        let desc = |name: &str, help: &str| {
            Desc::new(
                name.to_owned(),
                help.to_owned(),
                vec!["service".to_owned(), "endpoint".to_owned()],
                HashMap::new(),
            )
        };
        Ok(Self {
            table,
            in_flight: desc(
                "waycast_gateway_endpoint_requests_in_flight",
                "Requests in flight to each endpoint of a Service (streams until they end).",
            )?,
            requests: desc("waycast_gateway_endpoint_requests_total", "Requests sent to each endpoint of a Service.")?,
            response: desc(
                "waycast_gateway_endpoint_response_seconds",
                "Request sent to response headers, per endpoint of a Service (its queue and, for most servers, prefill).",
            )?,
        })
    }

    /// The table whose endpoints it reads.
    pub fn table(&self) -> &Arc<EndpointTable> {
        &self.table
    }
}

impl Collector for EndpointSeries {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.in_flight, &self.requests, &self.response]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let family = |desc: &Desc, kind: MetricType| {
            let mut family = MetricFamily::default();
            family.set_name(desc.fq_name.clone());
            family.set_help(desc.help.clone());
            family.set_field_type(kind);
            family
        };
        let mut in_flight = family(&self.in_flight, MetricType::GAUGE);
        let mut requests = family(&self.requests, MetricType::COUNTER);
        let mut response = family(&self.response, MetricType::HISTOGRAM);
        for (service, set) in self.table.sets.load().iter() {
            for endpoint in set.endpoints() {
                let traffic = endpoint.traffic();
                // Label pairs sorted by name, as the exposition wants them.
                let pair = |name: &str, value: String| {
                    let mut pair = proto::LabelPair::default();
                    pair.set_name(name.to_owned());
                    pair.set_value(value);
                    pair
                };
                let pairs = vec![pair("endpoint", endpoint.address.to_string()), pair("service", service.to_string())];
                let labels = || pairs.clone();
                let mut gauge = proto::Gauge::default();
                gauge.set_value(f64::from(traffic.inflight));
                let mut metric = proto::Metric::from_gauge(gauge);
                metric.set_label(labels());
                in_flight.mut_metric().push(metric);

                let mut counter = proto::Counter::default();
                #[allow(clippy::cast_precision_loss, reason = "the exposition carries counts as f64")]
                counter.set_value(traffic.sent as f64);
                let mut metric = proto::Metric::from_label(labels());
                metric.set_counter(counter);
                requests.mut_metric().push(metric);

                let mut histogram = proto::Histogram::default();
                histogram.set_sample_count(traffic.answered);
                histogram.set_sample_sum(traffic.answer_seconds);
                let buckets = ANSWER_BUCKETS.iter().zip(traffic.answered_within).map(|(bound, count)| {
                    let mut bucket = proto::Bucket::default();
                    bucket.set_upper_bound(*bound);
                    bucket.set_cumulative_count(count);
                    bucket
                });
                histogram.set_bucket(buckets.collect());
                let mut metric = proto::Metric::from_label(labels());
                metric.set_histogram(histogram);
                response.mut_metric().push(metric);
            }
        }
        vec![in_flight, requests, response]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn a_new_document_keeps_the_state_of_endpoints_that_stay() {
        let metrics = Metrics::new().unwrap();
        let table = metrics.endpoint_series.table();
        let document = |addresses: &[&str]| EndpointsDocument {
            services: [("models/vllm:8000".to_owned(), addresses.iter().map(|a| a.parse().unwrap()).collect())].into(),
            ..EndpointsDocument::new()
        };
        assert_eq!(table.apply(&document(&["10.0.0.1:8000", "10.0.0.2:8000"])), 2);
        let set = table.get_here("models/vllm:8000").unwrap();
        let second = set.endpoints()[1].clone();
        let streaming = set.start(1);
        let done = set.start(1);
        drop(done);
        let series = |name: &str, value: &str| {
            format!(r#"waycast_gateway_endpoint_{name}{{endpoint="10.0.0.2:8000",service="models/vllm:8000"}} {value}"#)
        };
        let text = metrics.render();
        assert!(text.contains(&series("requests_in_flight", "1")), "{text}");
        assert!(text.contains(&series("requests_total", "2")), "{text}");
        assert!(text.contains(&series("response_seconds_count", "0")), "none answered yet: {text}");

        second.observe_response(std::time::Duration::from_millis(40));
        second.observe_response(std::time::Duration::from_millis(200));
        second.observe_response(std::time::Duration::from_secs(200));
        let text = metrics.render();
        let bucket = |le: &str, count: u64| {
            format!(
                r#"waycast_gateway_endpoint_response_seconds_bucket{{endpoint="10.0.0.2:8000",service="models/vllm:8000",le="{le}"}} {count}"#
            )
        };
        for (le, count) in [("0.025", 0), ("0.1", 1), ("0.25", 2), ("120", 2), ("+Inf", 3)] {
            assert!(text.contains(&bucket(le, count)), "le={le}: {text}");
        }
        assert!(text.contains(&series("response_seconds_count", "3")), "{text}");
        assert!(text.contains(&series("response_seconds_sum", "200.24")), "{text}");

        assert_eq!(table.apply(&document(&["10.0.0.2:8000", "10.0.0.3:8000"])), 2);
        let text = metrics.render();
        assert!(!text.contains(r#"endpoint="10.0.0.1:8000""#), "a gone endpoint's series are gone: {text}");
        assert!(text.contains(&series("requests_total", "2")), "10.0.0.2 kept its counts: {text}");
        let set = table.get("models/vllm:8000").unwrap();
        assert_eq!(set.endpoints()[0].inflight(), 1, "10.0.0.2 kept its stream");
        drop(streaming);
        assert_eq!(set.endpoints()[0].inflight(), 0);
        assert!(table.get("models/other:80").is_none());
    }

    /// A thread routes through one handle of its own per set, until the
    /// Service's set changes; another thread has its own.
    #[test]
    fn each_thread_routes_through_its_own_handle_on_a_set() {
        let table = EndpointTable::default();
        let document = |addresses: &[&str]| EndpointsDocument {
            services: [("models/vllm:8000".to_owned(), addresses.iter().map(|a| a.parse().unwrap()).collect())].into(),
            ..EndpointsDocument::new()
        };
        table.apply(&document(&["10.0.0.1:8000"]));
        let first = table.get_here("models/vllm:8000").unwrap();
        assert!(Arc::ptr_eq(&first, &table.get_here("models/vllm:8000").unwrap()));
        assert!(first.is_on(&table.get("models/vllm:8000").unwrap()));
        let elsewhere =
            std::thread::scope(|scope| scope.spawn(|| table.get_here("models/vllm:8000").unwrap()).join().unwrap());
        assert!(!Arc::ptr_eq(&first, &elsewhere));
        let streaming = first.start(0);
        table.apply(&document(&["10.0.0.1:8000", "10.0.0.2:8000"]));
        let second = table.get_here("models/vllm:8000").unwrap();
        assert_eq!(second.endpoints().len(), 2, "the new set");
        assert_eq!(second.endpoints()[0].inflight(), 1, "whose kept endpoint still counts the stream");
        drop(streaming);
        assert_eq!(second.endpoints()[0].inflight(), 0);
        assert_eq!(Arc::strong_count(&first), 1, "the thread let the old handle go");
        assert!(table.get_here("models/other:80").is_none());
    }
}
