//! Every identity provider's key set, fetched by the operator off the
//! reconcile and kept per (Gateway, provider): the last good JWKS document
//! and how its latest fetch went. Compile copies a held document into the
//! provider's config entry (the pods fetch nothing from an issuer); the
//! Gateway's status says per provider whether one is loaded.
//!
//! ```text
//! Gateway store ─► wanted: (Gateway, provider) ─► Want {source, CA}
//!   refresher.rs, each slot when due (30 s; sooner on Cache-Control, never under 10 s), a task per fetch:
//!   fetch.rs (bounded I/O) ─► slot.rs settle (pure: keep, replace, record the error), each answer as it comes
//!   ─► KeySets::publish (ArcSwap; controller/key_sets.rs) ─► changed: the Gateway is reconciled ─► Catalog ─► compile
//! heartbeats naming a provider refused `unknown_key` ─► nudges.rs ─► that slot sooner (≤ once per 10 s)
//! ```
//!
//! What this does not do: decide which keys verify a token (the gateway
//! reads the document key by key), or fetch on the request path.

pub mod document;
pub mod fetch;
pub mod nudges;
pub mod refresher;
pub mod seed;
pub mod slot;

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt as _;
use waycast_crds::Gateway;
use waycast_crds::condition::reasons;
use waycast_crds::identity::{GatewayIdentityStatus, ProviderKeySetStatus};

use crate::compile::ObjectKey;
use crate::compile::key_source::{HeldKeySet, KeySetIndex, KeySource};
use crate::events::EventType;
use fetch::Want;

/// What compile and the status read: every held key set, and the
/// cluster's ServiceAccount issuer once known.
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// Held key sets by Gateway and provider.
    pub index: Arc<KeySetIndex>,
    /// The API server's ServiceAccount issuer (`iss` of projected tokens).
    pub cluster_issuer: Option<String>,
}

/// The key sets held, as last published by the refresher.
#[derive(Default)]
pub struct KeySets {
    published: arc_swap::ArcSwap<Published>,
}

impl KeySets {
    /// What is held now.
    pub fn load(&self) -> Arc<Published> {
        self.published.load_full()
    }

    /// Replaces what is held (the refresher's, and only its).
    pub fn publish(&self, published: Published) {
        self.published.store(Arc::new(published));
    }
}

/// A held key set's place: its Gateway and the provider's name.
pub type SlotKey = (ObjectKey, String);

/// What every Gateway's providers want fetched, and whether any trusts
/// the cluster's own issuer. A Gateway being deleted wants nothing.
pub fn wanted<'a>(gateways: impl IntoIterator<Item = &'a Gateway>) -> (BTreeMap<SlotKey, Want>, bool) {
    let mut wanted = BTreeMap::new();
    let mut cluster = false;
    for gateway in gateways.into_iter().filter(|gateway| gateway.metadata.deletion_timestamp.is_none()) {
        let key = ObjectKey::of(&gateway.metadata);
        let namespace = gateway.namespace().unwrap_or_default();
        for provider in gateway.spec.identity.iter().flat_map(|identity| &identity.providers) {
            cluster |= provider.service_account_issuer.is_some();
            let Some(source) = KeySource::of_spec(provider, &namespace) else { continue };
            // The CA bundle serves only remote sources (the schema refuses
            // it elsewhere).
            let remote = matches!(source, KeySource::Discovery { .. } | KeySource::JwksUri { .. });
            let ca = provider.ca_config_map_ref.clone().filter(|_| remote).map(|ca| (namespace.clone(), ca));
            wanted.insert((key.clone(), provider.name.clone()), Want { source, ca });
        }
    }
    (wanted, cluster)
}

/// `status.identity` of `gateway` from the key sets held: one entry per
/// provider of its spec, in its order; `None` without providers.
pub fn status_of(gateway: &Gateway, published: &Published) -> Option<GatewayIdentityStatus> {
    let providers = &gateway.spec.identity.as_ref()?.providers;
    if providers.is_empty() {
        return None;
    }
    let key = ObjectKey::of(&gateway.metadata);
    let namespace = gateway.namespace().unwrap_or_default();
    let entries = providers
        .iter()
        .map(|provider| {
            let source = KeySource::of_spec(provider, &namespace);
            let held = published
                .index
                .get(&(key.clone(), provider.name.clone()))
                .filter(|held| Some(&held.source) == source.as_ref());
            let loaded = held.filter(|held| held.document.is_some());
            let message = match (held.and_then(|held| held.error.as_deref()), loaded) {
                (Some(error), Some(_)) => Some(format!("{error}; the key set loaded before keeps serving")),
                (Some(error), None) => Some(format!("{error}; no key set: the pods refuse this provider's tokens")),
                (None, None) => {
                    Some("the key set is not fetched yet: the pods refuse this provider's tokens".to_owned())
                }
                (None, Some(_)) => None,
            };
            ProviderKeySetStatus {
                name: provider.name.clone(),
                keys: loaded.map(|held| i32::try_from(held.keys).unwrap_or(i32::MAX)),
                fetched_at: loaded
                    .and_then(|held| held.fetched_at)
                    .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
                message,
            }
        })
        .collect();
    Some(GatewayIdentityStatus { providers: entries })
}

/// The Event of `provider`'s held set as it is now: its error (ours
/// alone, at most `slot::MAX_ERROR_BYTES`) and what it means, or that it
/// was fetched.
pub fn event_of(provider: &str, held: &HeldKeySet) -> (EventType, &'static str, String) {
    match &held.error {
        Some(error) => {
            let consequence = if held.document.is_some() {
                "the key set loaded before keeps serving"
            } else {
                "no key set: the pods refuse this provider's tokens"
            };
            (EventType::Warning, reasons::KEY_SET_FETCH_FAILED, format!("provider {provider}: {error}; {consequence}"))
        }
        None => {
            let keys = held.keys;
            (
                EventType::Normal,
                reasons::KEY_SET_FETCHED,
                format!("provider {provider}: key set fetched ({keys} signing keys)"),
            )
        }
    }
}

#[cfg(test)]
mod echo_tests;
#[cfg(test)]
mod https_tests;
#[cfg(test)]
mod seed_tests;
#[cfg(test)]
mod tests;
