//! The key sets a starting operator holds before its first fetch: those of
//! the config each Gateway's pods already serve (its base Secret). Without
//! them a restart while an issuer is unreachable would compile its
//! providers without a key set, and the pods would refuse tokens they
//! served a moment before. A seed is a held set like any other: the first
//! fetch replaces it, or keeps it when the fetch fails.
//!
//! NB: best effort. A Gateway whose config cannot be read (none written
//! yet, another owner, another format) starts with nothing held.
//!
//! NB: a seed serves only the Gateway whose config it was read from. A
//! config Secret lives in its Gateway's namespace, where others than the
//! platform team may write Secrets; what it says of the cluster's
//! ServiceAccount issuer is that Gateway's seed alone
//! (`HeldKeySet::seeded_issuer`), never the issuer every Gateway is
//! compiled with (the refresher reads that from the API server).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt as _};
use serde::Deserialize;
use waycast_crds::Gateway;
use waycast_crds::config::{MAX_CONFIG_JSON_BYTES, ProviderConfig};
use waycast_crds::shards::{SECRET_KEY_PART, base_secret_name};

use super::SlotKey;
use super::document;
use crate::compile::ObjectKey;
use crate::compile::key_source::{HeldKeySet, KeySource};

/// What a base part holds that seeds read; the rest is skipped.
#[derive(Deserialize)]
struct Base {
    #[serde(default)]
    providers: Vec<ProviderConfig>,
}

/// The key sets of the configs written for `gateways` (those with
/// providers).
pub async fn seeds(client: &kube::Client, gateways: &[Arc<Gateway>]) -> BTreeMap<SlotKey, HeldKeySet> {
    let with_providers = gateways.iter().filter(|g| g.spec.identity.as_ref().is_some_and(|i| !i.providers.is_empty()));
    let read: Vec<(Arc<Gateway>, Vec<ProviderConfig>)> = futures_util::stream::iter(with_providers)
        .map(|gateway| async move { (gateway.clone(), written_providers(client, gateway).await) })
        .buffer_unordered(8)
        .collect()
        .await;
    seeds_of(&read)
}

/// The seeds of each Gateway's written providers, each under its own
/// Gateway and provider.
pub fn seeds_of(written: &[(Arc<Gateway>, Vec<ProviderConfig>)]) -> BTreeMap<SlotKey, HeldKeySet> {
    let mut held = BTreeMap::new();
    for (gateway, providers) in written {
        let key = ObjectKey::of(&gateway.metadata);
        for provider in providers {
            if let Some(seed) = seed_of(gateway, provider) {
                held.insert((key.clone(), provider.name.clone()), seed);
            }
        }
    }
    held
}

/// The held set `provider`, as written for `gateway`, seeds: its key set
/// when it still passes the checks, fetched when the Gateway's status
/// said, and for the cluster's own provider the issuer it named.
pub fn seed_of(gateway: &Gateway, provider: &ProviderConfig) -> Option<HeldKeySet> {
    let document = provider.key_set.as_deref()?;
    let keys = document::signing_keys(document.as_bytes()).ok()?;
    let fetched_at = gateway
        .status
        .as_ref()
        .and_then(|status| status.identity.as_ref())
        .and_then(|identity| identity.providers.iter().find(|p| p.name == provider.name))
        .and_then(|status| status.fetched_at.as_ref())
        .map(|time| time.0);
    Some(HeldKeySet {
        source: KeySource::of_config(provider),
        document: Some(Arc::from(document)),
        keys,
        fetched_at,
        error: None,
        seeded_issuer: provider.service_accounts.then(|| provider.issuer.clone()),
    })
}

/// The providers of the config written for `gateway`, read from its base
/// Secret when it is the Gateway's own; none when it cannot be read.
async fn written_providers(client: &kube::Client, gateway: &Gateway) -> Vec<ProviderConfig> {
    let (Some(namespace), Some(uid)) = (gateway.namespace(), gateway.metadata.uid.as_deref()) else {
        return Vec::new();
    };
    let name = base_secret_name(&crate::render::config_secret_name(gateway));
    let api = Api::<Secret>::namespaced(client.clone(), &namespace);
    let secret = match crate::apply::bounded(api.get_opt(&name)).await {
        Ok(Some(secret)) if !crate::ownership::foreign(&secret.metadata, uid) => secret,
        Ok(_) => return Vec::new(),
        Err(error) => {
            tracing::debug!(%error, secret = %format!("{namespace}/{name}"), "cannot read a written config's key sets");
            return Vec::new();
        }
    };
    let Some(compressed) = secret.data.as_ref().and_then(|data| data.get(SECRET_KEY_PART)) else {
        return Vec::new();
    };
    let mut json = Vec::new();
    let read = flate2::read::GzDecoder::new(compressed.0.as_slice()).take(MAX_CONFIG_JSON_BYTES).read_to_end(&mut json);
    match read.map_err(|e| e.to_string()).and_then(|_| serde_json::from_slice::<Base>(&json).map_err(|e| e.to_string()))
    {
        Ok(base) => base.providers,
        Err(error) => {
            tracing::debug!(%error, secret = %format!("{namespace}/{name}"), "a written config's base does not read");
            Vec::new()
        }
    }
}
