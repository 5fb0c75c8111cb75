//! Where the endpoints document comes from (`waycast_crds::endpoints`), and
//! how it reaches the endpoint table (`upstream::endpoints`): pod churn
//! changes only that table, never the Snapshot.
//!
//! ```text
//! --endpoints-file (poll + SIGHUP) ─┐
//! --endpoints-configmap (watch)    ─┴─► Update (bytes) ─► apply_updates ─► EndpointTable (one ArcSwap)
//! ```
//!
//! A refused document is logged and counted, and the last good table keeps
//! serving.

use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use waycast_crds::endpoints::EndpointsDocument;

use super::Update;
use super::load::LoadError;
use crate::metrics::Metrics;
use crate::upstream::endpoints::EndpointTable;

/// Applies each endpoints document in turn until every source has ended.
pub async fn apply_updates<S>(mut updates: mpsc::Receiver<Update>, serving: Arc<S>)
where
    S: AsRef<EndpointTable> + AsRef<Metrics> + Send + Sync + 'static,
{
    let (table, metrics): (&EndpointTable, &Metrics) = ((*serving).as_ref(), (*serving).as_ref());
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
                let known = table.apply(&document);
                metrics.endpoints_known.set(i64::try_from(known).unwrap_or(i64::MAX));
                tracing::info!(%source, services = document.services.len(), endpoints = known, "endpoints applied");
                last_applied = Some(hash);
            }
            Err(error) => {
                metrics.endpoints_update_errors.inc();
                tracing::error!(%source, %error, "endpoints refused; keeping the last good ones");
            }
        }
    }
}

/// `--endpoints-configmap NS/NAME` (and `--usage-configmap`): a watch on
/// exactly that ConfigMap, sending its `data_key`.
pub async fn watch_config_map(
    client: Client,
    namespace: String,
    name: String,
    data_key: &'static str,
    updates: mpsc::Sender<Update>,
) {
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
                    .and_then(|data| data.get(data_key))
                    .map(|text| text.clone().into_bytes())
                    .ok_or_else(|| LoadError::Missing(format!("no {data_key} data key")));
                if updates.send(Update { source: source.clone(), bytes }).await.is_err() {
                    return;
                }
            }
            Ok(Event::Delete(_)) => tracing::warn!(%source, "ConfigMap deleted; keeping what it said last"),
            Ok(Event::Init | Event::InitDone) => {}
            Err(error) => tracing::warn!(%source, %error, "ConfigMap watch failed; retrying"),
        }
    }
}
