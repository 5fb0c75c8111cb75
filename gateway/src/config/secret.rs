//! `--config-secret NS/NAME`: a watch on exactly one Secret, so the pod's
//! ServiceAccount needs get/list/watch on that name — and, for a config in
//! parts, `get` on the parts' names — and nothing else.

use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use std::time::Duration;

use waycast_crds::config::{SECRET_KEY_GZIP, SECRET_KEYS_PLAIN};
use waycast_crds::shards::{Manifest, SECRET_KEY_MANIFEST};

use tokio::sync::mpsc;

use super::load::{LoadError, gunzip};
use super::parts::{Parts, PartsError};
use super::{ConfigUpdate, Update};

/// Follows the Secret until the applier is gone. A Secret holding a
/// manifest ([`SECRET_KEY_MANIFEST`]) names a config in parts
/// ([`super::parts`]), whose parts are read here and sent to be built; one holding a whole config
/// is sent as it is.
pub async fn watch(client: Client, namespace: String, name: String, updates: mpsc::Sender<ConfigUpdate>) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let source: Arc<str> = Arc::from(format!("secret:{namespace}/{name}"));
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api.clone(), config).default_backoff().boxed();
    let mut parts = Parts::default();
    // The manifest whose parts were not all there yet, and how often that
    // was found: tried again until they are, or a newer one comes.
    let mut pending: Option<(Manifest, u32)> = None;
    // The manifest whose parts were last sent (a re-list sends it again).
    let mut assembled: Option<Manifest> = None;
    loop {
        let again = async {
            match &pending {
                Some((_, tries)) => tokio::time::sleep(retry_wait(*tries)).await,
                None => std::future::pending().await,
            }
        };
        let (manifest, tries) = tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Ok(Event::Apply(secret) | Event::InitApply(secret))) => match manifest_in(&secret) {
                    Some(Ok(manifest)) => (manifest, 0),
                    Some(Err(error)) => {
                        pending = None;
                        let update = Update { source: source.clone(), bytes: Err(error) };
                        if updates.send(update.into()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    None => {
                        (pending, assembled) = (None, None);
                        let update = Update { source: source.clone(), bytes: config_bytes(&secret) };
                        if updates.send(update.into()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                },
                Some(Ok(Event::Delete(_))) => {
                    tracing::warn!(%source, "config Secret deleted; keeping the last good config");
                    continue;
                }
                Some(Ok(Event::Init | Event::InitDone)) => continue,
                Some(Err(error)) => {
                    tracing::warn!(%source, %error, "config Secret watch failed; retrying");
                    continue;
                }
            },
            () = again => match pending.take() {
                Some((manifest, tries)) => (manifest, tries),
                None => continue,
            },
        };
        if assembled.as_ref() == Some(&manifest) {
            pending = None;
            continue;
        }
        let identity = match manifest.hash() {
            Ok(identity) => identity,
            Err(error) => {
                tracing::error!(%source, %error, "config manifest does not serialize");
                continue;
            }
        };
        // Bounded: a read that hangs must not keep a newer manifest waiting.
        let read = tokio::time::timeout(READ_DEADLINE, parts.read(&api, &name, &manifest)).await;
        match read.unwrap_or(Err(PartsError::TimedOut(READ_DEADLINE))) {
            Ok(parts) => {
                (pending, assembled) = (None, Some(manifest));
                let update = ConfigUpdate::Parts { source: source.clone(), parts: Box::new(parts), identity };
                if updates.send(update).await.is_err() {
                    return;
                }
            }
            // The writer is between its writes (parts go first, the
            // manifest last; a newer write may have overtaken this one),
            // or the API server is busy: the last good config serves
            // meanwhile, and the parts are tried again until they are
            // there or a newer manifest comes — a part rewritten later
            // (the operator's resync) mends it without a manifest event.
            Err(error) if error.is_transient() => {
                tracing::debug!(%source, %error, tries, "config parts not all there yet; trying again");
                pending = Some((manifest, tries.saturating_add(1)));
                if tries + 1 == PATIENCE {
                    let update =
                        ConfigUpdate::Unassembled { source: source.clone(), identity, reason: error.to_string() };
                    if updates.send(update).await.is_err() {
                        return;
                    }
                }
            }
            Err(error) => {
                pending = None;
                let update = ConfigUpdate::Unassembled { source: source.clone(), identity, reason: error.to_string() };
                if updates.send(update).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Longest one read of a manifest's parts may take (a thousand parts,
/// eight at a time, take a second or two).
const READ_DEADLINE: Duration = Duration::from_secs(20);

/// Tries of one manifest's parts before its failure is reported, in the
/// heartbeat too (the waits below add up to some 40 s; a newer manifest is
/// tried at once).
const PATIENCE: u32 = 12;

/// The wait before try `tries + 1` of a manifest's parts: 100 ms doubling
/// to 5 s, then every 30 s once its failure is reported.
fn retry_wait(tries: u32) -> Duration {
    if tries >= PATIENCE {
        return Duration::from_secs(30);
    }
    Duration::from_millis(100).saturating_mul(1 << tries.min(6)).min(Duration::from_secs(5))
}

/// The manifest a config Secret holds, if it holds one.
fn manifest_in(secret: &Secret) -> Option<Result<Manifest, LoadError>> {
    let bytes = secret.data.as_ref()?.get(SECRET_KEY_MANIFEST)?;
    Some(Manifest::parse(&bytes.0).map_err(|error| LoadError::Missing(error.to_string())))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest whose parts are not there is tried again soon, then,
    /// once its failure is reported, still every half minute: a part the
    /// writer mends later is picked up without a new manifest.
    #[test]
    fn a_manifests_parts_are_tried_again_for_good() {
        assert_eq!(retry_wait(0), Duration::from_millis(100));
        assert_eq!(retry_wait(PATIENCE - 1), Duration::from_secs(5));
        assert_eq!(retry_wait(PATIENCE), Duration::from_secs(30));
        assert_eq!(retry_wait(u32::MAX), Duration::from_secs(30));
    }
}
