//! `--config-secret NS/NAME`: a watch on exactly one Secret, so the pod's
//! ServiceAccount needs get/list/watch on that name and nothing else.

use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use waycast_crds::config::{SECRET_KEY_GZIP, SECRET_KEYS_PLAIN};

use tokio::sync::mpsc;

use super::Update;
use super::load::{LoadError, gunzip};

/// Follows the Secret until the applier is gone.
pub async fn watch(client: Client, namespace: String, name: String, updates: mpsc::Sender<Update>) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let source: Arc<str> = Arc::from(format!("secret:{namespace}/{name}"));
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(secret) | Event::InitApply(secret)) => {
                let update = Update { source: source.clone(), bytes: config_bytes(&secret) };
                if updates.send(update).await.is_err() {
                    return;
                }
            }
            Ok(Event::Delete(_)) => {
                tracing::warn!(%source, "config Secret deleted; keeping the last good config");
            }
            Ok(Event::Init | Event::InitDone) => {}
            Err(error) => tracing::warn!(%source, %error, "config Secret watch failed; retrying"),
        }
    }
}

/// The config inside a config Secret.
///
/// # Errors
/// [`LoadError`] when no known data key is present or gzip fails.
pub fn config_bytes(secret: &Secret) -> Result<Vec<u8>, LoadError> {
    let data = secret.data.as_ref();
    if let Some(compressed) = data.and_then(|d| d.get(SECRET_KEY_GZIP)) {
        return gunzip(&compressed.0);
    }
    for key in SECRET_KEYS_PLAIN {
        if let Some(plain) = data.and_then(|d| d.get(*key)) {
            return Ok(plain.0.clone());
        }
    }
    Err(LoadError::Missing(format!("no {SECRET_KEY_GZIP} or {} data key", SECRET_KEYS_PLAIN.join("/"))))
}
