//! The endpoints of the Services the config routes to, kept apart from the
//! config (`waycast_crds::endpoints`): pod churn changes only this table,
//! never the Snapshot.
//!
//! ```text
//! --endpoints-file (poll + SIGHUP) ─┐
//! --endpoints-configmap (watch)    ─┴─► Update (bytes) ─► apply_updates ─► EndpointTable (one ArcSwap)
//!                                                          keeps each endpoint's state (in flight, ejection)
//! ```
//!
//! A refused document is logged and counted, and the last good table keeps
//! serving. Requests load the table once per pick.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use waycast_crds::endpoints::{ENDPOINTS_DATA_KEY, EndpointsDocument};

use super::pick::{Endpoint, EndpointSet, Observed};
use crate::config::Update;
use crate::config::load::LoadError;
use crate::metrics::Metrics;
use crate::shared::Shared;

/// Every known Service's endpoints, by `namespace/name:port`.
#[derive(Default)]
pub struct EndpointTable {
    sets: ArcSwap<HashMap<Arc<str>, Arc<EndpointSet>>>,
}

impl EndpointTable {
    /// The endpoints of the Service `key`, if any are known.
    pub fn get(&self, key: &str) -> Option<Arc<EndpointSet>> {
        self.sets.load().get(key).cloned()
    }

    /// Replaces the table with `document`; an endpoint that stays keeps its
    /// state (and its series in `metrics`; those of endpoints that left are
    /// removed). Returns how many endpoints are known now.
    pub fn apply(&self, document: &EndpointsDocument, metrics: &Metrics) -> usize {
        let previous = self.sets.load_full();
        let next: HashMap<Arc<str>, Arc<EndpointSet>> = document
            .services
            .iter()
            .map(|(key, addresses)| {
                let before = previous.get(key.as_str()).map(AsRef::as_ref);
                let set = EndpointSet::with(addresses, before, |address| {
                    let labels = [key.as_str(), &address.to_string()];
                    Endpoint::observed(
                        address,
                        Observed {
                            in_flight: metrics.endpoint_in_flight.with_label_values(&labels),
                            requests: metrics.endpoint_requests.with_label_values(&labels),
                            response: metrics.endpoint_response.with_label_values(&labels),
                        },
                    )
                });
                (Arc::from(key.as_str()), Arc::new(set))
            })
            .collect();
        for (key, set) in previous.iter() {
            for endpoint in set.endpoints() {
                let stays = next.get(key).is_some_and(|s| s.endpoint_at(endpoint.address).is_some());
                if !stays {
                    let labels = [key.as_ref(), &endpoint.address.to_string()];
                    let _ = metrics.endpoint_in_flight.remove_label_values(&labels);
                    let _ = metrics.endpoint_requests.remove_label_values(&labels);
                    let _ = metrics.endpoint_response.remove_label_values(&labels);
                }
            }
        }
        let known = next.values().map(|set| set.endpoints().len()).sum();
        self.sets.store(Arc::new(next));
        known
    }
}

/// Applies each endpoints document in turn until every source has ended.
pub async fn apply_updates(mut updates: mpsc::Receiver<Update>, shared: Arc<Shared>) {
    let mut last_applied = None;
    while let Some(Update { source, bytes }) = updates.recv().await {
        let parsed = bytes.and_then(|bytes| {
            let hash = waycast_crds::digest::config_hash(&bytes);
            let document =
                EndpointsDocument::from_slice(&bytes).map_err(|error| LoadError::Missing(error.to_string()))?;
            Ok((hash, document))
        });
        match parsed {
            Ok((hash, _)) if last_applied.as_ref() == Some(&hash) => {}
            Ok((hash, document)) => {
                let known = shared.endpoints.apply(&document, &shared.metrics);
                shared.metrics.endpoints_known.set(i64::try_from(known).unwrap_or(i64::MAX));
                tracing::info!(%source, services = document.services.len(), endpoints = known, "endpoints applied");
                last_applied = Some(hash);
            }
            Err(error) => {
                shared.metrics.endpoints_update_errors.inc();
                tracing::error!(%source, %error, "endpoints refused; keeping the last good ones");
            }
        }
    }
}

/// `--endpoints-configmap NS/NAME`: a watch on exactly that ConfigMap.
pub async fn watch_config_map(client: Client, namespace: String, name: String, updates: mpsc::Sender<Update>) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let source: Arc<str> = Arc::from(format!("configmap:{namespace}/{name}"));
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(map) | Event::InitApply(map)) => {
                let bytes = map
                    .data
                    .as_ref()
                    .and_then(|data| data.get(ENDPOINTS_DATA_KEY))
                    .map(|text| text.clone().into_bytes())
                    .ok_or_else(|| LoadError::Missing(format!("no {ENDPOINTS_DATA_KEY} data key")));
                if updates.send(Update { source: source.clone(), bytes }).await.is_err() {
                    return;
                }
            }
            Ok(Event::Delete(_)) => tracing::warn!(%source, "endpoints ConfigMap deleted; keeping the last endpoints"),
            Ok(Event::Init | Event::InitDone) => {}
            Err(error) => tracing::warn!(%source, %error, "endpoints ConfigMap watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_document_keeps_the_state_of_endpoints_that_stay() {
        let table = EndpointTable::default();
        let document = |addresses: &[&str]| EndpointsDocument {
            services: [("models/vllm:8000".to_owned(), addresses.iter().map(|a| a.parse().unwrap()).collect())].into(),
            ..EndpointsDocument::new()
        };
        let metrics = Metrics::new().unwrap();
        assert_eq!(table.apply(&document(&["10.0.0.1:8000", "10.0.0.2:8000"]), &metrics), 2);
        let streaming = table.get("models/vllm:8000").unwrap().endpoints()[1].start();
        let series =
            r#"waycast_gateway_endpoint_requests_in_flight{endpoint="10.0.0.2:8000",service="models/vllm:8000"} 1"#;
        assert!(metrics.render().contains(series), "{}", metrics.render());
        table.get("models/vllm:8000").unwrap().endpoints()[1].observe_response(std::time::Duration::from_millis(40));
        let answered = r#"waycast_gateway_endpoint_response_seconds_bucket{endpoint="10.0.0.2:8000",service="models/vllm:8000",le="0.1"} 1"#;
        assert!(metrics.render().contains(answered), "{}", metrics.render());
        assert_eq!(table.apply(&document(&["10.0.0.2:8000", "10.0.0.3:8000"]), &metrics), 2);
        assert!(!metrics.render().contains(r#"endpoint="10.0.0.1:8000""#), "a gone endpoint's series are removed");
        let set = table.get("models/vllm:8000").unwrap();
        assert_eq!(set.endpoints()[0].inflight(), 1, "10.0.0.2 kept its stream");
        drop(streaming);
        assert_eq!(set.endpoints()[0].inflight(), 0);
        assert!(table.get("models/other:80").is_none());
    }
}
