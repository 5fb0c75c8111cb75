//! A few ApiKeys compiled alone, over the Gateway's other inputs as the
//! stores hold them: what a patch of a kept config writes
//! (`config_writer`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kube::runtime::reflector::ObjectRef;
use waycast_crds::Gateway;
use waycast_crds::condition::reasons;
use waycast_crds::config::KeyConfig;

use super::referenced::fetch_referenced;
use crate::catalog::Catalog;
use crate::compile::ObjectKey;
use crate::compile::keys::KeyVerdict;
use crate::context::Context;
use crate::error::Error;
use crate::render::key_patch::Unpatchable;
use crate::stores::key_log::Changed;

/// Why a few keys could not be compiled alone.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotAlone {
    #[error(transparent)]
    Unpatchable(#[from] Unpatchable),
    #[error(transparent)]
    Failed(#[from] Error),
}

/// The ApiKeys `changed` names, and those reading its key Secrets (an
/// ApiKey's own generated Secret, or one it names in `secretRef`).
pub(super) fn changed_keys(context: &Context, changed: Changed) -> BTreeSet<ObjectKey> {
    let Changed { mut keys, secrets } = changed;
    if secrets.is_empty() {
        return keys;
    }
    let namespaces: BTreeSet<&str> = secrets.iter().map(|secret| secret.namespace.as_str()).collect();
    for api_key in context.stores.keys.state() {
        let Some(namespace) = api_key.metadata.namespace.as_deref().filter(|n| namespaces.contains(n)) else {
            continue;
        };
        let secret = ObjectKey { namespace: namespace.to_owned(), name: crate::compile::keys::key_source(&api_key).0 };
        if secrets.contains(&secret) {
            keys.insert(ObjectKey::of(&api_key.metadata));
        }
    }
    keys
}

/// The entry (`None`: not served) and verdict of each of `keys`, compiled
/// alone over the Gateway's other inputs as the stores hold them.
pub(super) async fn compile_keys(
    context: &Context,
    gateway: &Gateway,
    keys: &BTreeSet<ObjectKey>,
) -> Result<(Vec<(String, Option<KeyConfig>)>, BTreeMap<ObjectKey, KeyVerdict>), NotAlone> {
    let stores = &context.stores;
    // A key's entry reads its ApiKey, its Secret, the namespaces (for
    // selection) and the Gateway's spec — no model, Service or credential.
    let mut catalog = Catalog {
        namespaces: stores.namespaces.state(),
        keys: keys.iter().filter_map(|k| stores.keys.get(&ObjectRef::new(&k.name).within(&k.namespace))).collect(),
        ..Catalog::default()
    };
    fetch_referenced(&mut catalog, context, gateway).await?;
    let compiled = catalog.compile(gateway, jiff::Timestamp::now());
    if compiled.keys.values().any(|key| key.verdict.reason == reasons::DUPLICATE_KEY) {
        return Err(Unpatchable::Duplicate.into());
    }
    let mut served: HashMap<String, KeyConfig> =
        compiled.config.keys.into_iter().map(|key| (key.id.clone(), key)).collect();
    let changes = keys
        .iter()
        .map(|key| {
            let id = key.to_string();
            let entry = served.remove(&id);
            (id, entry)
        })
        .collect();
    Ok((changes, compiled.keys))
}
