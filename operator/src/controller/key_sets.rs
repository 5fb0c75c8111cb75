//! The key-set refresher: one task, run by the Lease holder beside the
//! controllers, that keeps every provider's key set current off the
//! reconcile (`key_sets`). Each round fetches the slots that are due, at
//! most [`AT_ONCE`] at a time, publishes what is held, then asks for the
//! reconcile of each Gateway whose key set or fetch error changed (its
//! config writer writes and propagates a new document; its status says
//! where each provider stands) and publishes an Event when a fetch error
//! appears, changes or clears. An unchanged document triggers nothing.
//!
//! ```text
//! start: seeds (the configs written) ─┐
//! Gateway changes ──► round ──────────┴─► wanted slots ─► due? fetch ─► settle ─► publish
//! the earliest due ──►   │                                    └─► announce Gateways, Events, metrics
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt as _;
use kube::Resource as _;
use kube::runtime::reflector::ObjectRef;

use crate::apply::bounded;
use crate::compile::ObjectKey;
use crate::compile::key_source::{HeldKeySet, KeySetIndex};
use crate::context::Context;
use crate::key_sets::document::{MIN_REFRESH, REFRESH};
use crate::key_sets::fetch::{Answer, Etag, FetchError, Fetcher, Want};
use crate::key_sets::slot::Slot;
use crate::key_sets::{Published, SlotKey, seed, wanted};
use crate::stores::signals;

/// Fetches in flight at once.
pub const AT_ONCE: usize = 8;

/// The refresher's own state: every slot, the seeds not yet taken, the
/// cluster's issuer.
pub(crate) struct Refresher {
    slots: BTreeMap<SlotKey, Slot>,
    seeds: BTreeMap<SlotKey, HeldKeySet>,
    cluster_issuer: Option<String>,
    issuer_error: Option<String>,
    issuer_due: Instant,
}

/// The refresher of a starting operator: the key sets of the configs
/// written (seeds), published before any Gateway compiles, so that the
/// first compile after a restart keeps serving them.
pub(crate) async fn seeded(context: &Context) -> Refresher {
    let gateways = context.stores.gateways.state();
    let (seeds, cluster_issuer) = seed::seeds(&context.client, &gateways).await;
    if !seeds.is_empty() {
        tracing::info!(key_sets = seeds.len(), "key sets of the configs written held until fetched");
    }
    let mut refresher =
        Refresher { slots: BTreeMap::new(), seeds, cluster_issuer, issuer_error: None, issuer_due: Instant::now() };
    refresher.sync(wanted(gateways.iter().map(AsRef::as_ref)).0, Instant::now());
    context.key_sets.publish(refresher.published());
    refresher
}

/// Keeps the key sets current for as long as the task runs.
pub(crate) async fn keep_key_sets(context: Arc<Context>, mut refresher: Refresher) {
    let fetcher = Fetcher::new(context.client.clone());
    let mut gateway_changes = signals(&[&context.stores.changed.gateways]);
    loop {
        let next = refresher.round(&context, &fetcher).await;
        tokio::select! {
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(next)) => {}
            Some(()) = gateway_changes.next() => {}
        }
    }
}

impl Refresher {
    /// One round: the slots the Gateways want now, the cluster's issuer if
    /// due, the slots due fetched; returns when the next is due.
    async fn round(&mut self, context: &Context, fetcher: &Fetcher) -> Instant {
        let gateways = context.stores.gateways.state();
        let (wanted, cluster) = wanted(gateways.iter().map(AsRef::as_ref));
        self.sync(wanted, Instant::now());
        let mut announce = BTreeSet::new();
        if cluster && self.issuer_due <= Instant::now() && self.refresh_issuer(fetcher).await {
            // Providers of the cluster's issuer compile only once it is known.
            let trusting = gateways.iter().filter(|gateway| {
                let providers = gateway.spec.identity.iter().flat_map(|identity| &identity.providers);
                providers.into_iter().any(|provider| provider.service_account_issuer.is_some())
            });
            announce.extend(trusting.map(|gateway| ObjectKey::of(&gateway.metadata)));
        }
        let now = Instant::now();
        let due: Vec<(SlotKey, Want, Option<Etag>)> = self
            .slots
            .iter()
            .filter(|(_, slot)| slot.due <= now)
            .map(|(key, slot)| (key.clone(), slot.want.clone(), slot.etag.clone()))
            .collect();
        let answers: Vec<(SlotKey, Result<Answer, FetchError>)> = futures_util::stream::iter(due)
            .map(|(key, want, etag)| async move { (key, fetcher.key_set(&want, etag.as_ref()).await) })
            .buffer_unordered(AT_ONCE)
            .collect()
            .await;
        let mut moved = Vec::new();
        for (key, answer) in answers {
            let Some(slot) = self.slots.get_mut(&key) else { continue };
            let settled = slot.settle(answer, jiff::Timestamp::now());
            slot.due = Instant::now() + settled.after;
            context.metrics.key_set_fetches.with_label_values(&[settled.result]).inc();
            if settled.document_changed || settled.error_changed {
                announce.insert(key.0.clone());
            }
            if settled.document_changed {
                tracing::info!(gateway = %key.0, provider = %key.1, keys = slot.held.keys, "key set fetched");
            }
            if settled.error_changed {
                moved.push((key, slot.held.clone()));
            }
        }
        context.key_sets.publish(self.published());
        for gateway in announce {
            context.stores.feeds.gateways.announce(ObjectRef::new(&gateway.name).within(&gateway.namespace));
        }
        for (key, held) in moved {
            report(context, &key, &held).await;
        }
        self.next_due(cluster)
    }

    /// Makes the slots those `wanted`: a new one (or one whose source
    /// changed) starts from its seed when the seed is of the same source,
    /// else from nothing, due now; one no longer wanted is dropped.
    fn sync(&mut self, wanted: BTreeMap<SlotKey, Want>, now: Instant) {
        self.slots.retain(|key, slot| wanted.get(key).is_some_and(|want| slot.same_source(want)));
        for (key, want) in wanted {
            if let Some(slot) = self.slots.get_mut(&key) {
                // A new CA bundle: the next fetch uses it.
                slot.want = want;
                continue;
            }
            let mut slot = Slot::new(want, now);
            if let Some(seed) = self.seeds.remove(&key).filter(|seed| seed.source == slot.want.source) {
                slot.held = seed;
            }
            self.slots.insert(key, slot);
        }
        // Seeds serve a starting operator's first slots only.
        self.seeds.clear();
    }

    /// Fetches the cluster's issuer; whether it changed.
    async fn refresh_issuer(&mut self, fetcher: &Fetcher) -> bool {
        match fetcher.cluster_issuer().await {
            Ok(issuer) => {
                self.issuer_due = Instant::now() + REFRESH;
                self.issuer_error = None;
                let changed = self.cluster_issuer.as_deref() != Some(issuer.as_str());
                if changed {
                    tracing::info!(issuer = %issuer, "the cluster's ServiceAccount issuer");
                    self.cluster_issuer = Some(issuer);
                }
                changed
            }
            Err(error) => {
                self.issuer_due = Instant::now() + MIN_REFRESH;
                let error = error.to_string();
                if self.issuer_error.as_deref() != Some(error.as_str()) {
                    tracing::warn!(%error, known = ?self.cluster_issuer, "cannot read the cluster's ServiceAccount issuer");
                    self.issuer_error = Some(error);
                }
                false
            }
        }
    }

    fn published(&self) -> Published {
        let index: KeySetIndex = self.slots.iter().map(|(key, slot)| (key.clone(), slot.held.clone())).collect();
        Published { index: Arc::new(index), cluster_issuer: self.cluster_issuer.clone() }
    }

    /// When the next slot (or the cluster's issuer) is due; a while when
    /// nothing is wanted (a Gateway change wakes the refresher sooner).
    fn next_due(&self, cluster: bool) -> Instant {
        let slots = self.slots.values().map(|slot| slot.due);
        let issuer = cluster.then_some(self.issuer_due);
        slots.chain(issuer).min().unwrap_or_else(|| Instant::now() + REFRESH)
    }
}

/// The Event of a fetch error that appeared, changed or cleared, on the
/// provider's Gateway: once per change, never per fetch.
async fn report(context: &Context, (gateway, provider): &SlotKey, held: &HeldKeySet) {
    if let Some(error) = &held.error {
        tracing::warn!(gateway = %gateway, provider = %provider, %error, kept = held.document.is_some(), "key set fetch failed");
    }
    let (type_, reason, note) = crate::key_sets::event_of(provider, held);
    let Some(object) = context.stores.gateways.get(&ObjectRef::new(&gateway.name).within(&gateway.namespace)) else {
        return;
    };
    let published = context.events.publish(object.object_ref(&()), type_, reason, note, "FetchKeySet");
    if let Err(error) = bounded(published).await {
        tracing::debug!(%error, "could not publish an Event");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use std::time::Duration;

    use waycast_crds::config::ProviderConfig;
    use waycast_crds::identity::{ConfigMapKeyRef, GatewayIdentityStatus, ProviderKeySetStatus};

    use super::*;
    use crate::compile::key_source::KeySource;

    const ISSUER: &str = "https://sso.example.com";
    const SET: &str = r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#;

    fn key(provider: &str) -> SlotKey {
        (ObjectKey { namespace: "platform".into(), name: "gw".into() }, provider.to_owned())
    }

    fn discovery(issuer: &str) -> Want {
        Want { source: KeySource::Discovery { issuer: issuer.into() }, ca: None }
    }

    fn held(source: KeySource) -> HeldKeySet {
        HeldKeySet { source, document: Some(SET.into()), keys: 1, fetched_at: None, error: None }
    }

    fn refresher(seeds: BTreeMap<SlotKey, HeldKeySet>) -> Refresher {
        Refresher {
            slots: BTreeMap::new(),
            seeds,
            cluster_issuer: None,
            issuer_error: None,
            issuer_due: Instant::now(),
        }
    }

    /// A starting operator holds the sets its pods serve, for the sources
    /// the providers still name; later a provider keeps its set while its
    /// source is the same, starts afresh when it changes, and goes when
    /// it is gone.
    #[test]
    fn slots_follow_the_providers_wanted_and_seeds_serve_the_first_only() {
        let start = Instant::now();
        let seeds = [
            (key("corp"), held(KeySource::Discovery { issuer: ISSUER.into() })),
            // Its issuer was edited while the operator was down.
            (key("edited"), held(KeySource::Discovery { issuer: "https://old.example.com".into() })),
            (key("unwanted"), held(KeySource::Cluster)),
        ];
        let mut refresher = refresher(seeds.into_iter().collect());
        let wanted = |entries: &[(&str, Want)]| entries.iter().map(|(name, want)| (key(name), want.clone())).collect();
        refresher.sync(wanted(&[("corp", discovery(ISSUER)), ("edited", discovery("https://new.example.com"))]), start);
        assert_eq!(refresher.slots[&key("corp")].held.document.as_deref(), Some(SET), "seeded");
        assert_eq!(refresher.slots[&key("edited")].held.document, None, "a seed of another source is not used");
        assert!(!refresher.slots.contains_key(&key("unwanted")) && refresher.seeds.is_empty());
        assert!(refresher.slots.values().all(|slot| slot.due == start), "every new slot is fetched at once");
        assert_eq!(refresher.published().index.len(), 2);

        // A CA bundle named later keeps the set; another issuer starts afresh.
        let mut with_ca = discovery(ISSUER);
        with_ca.ca = Some(("platform".into(), ConfigMapKeyRef { name: "ca".into(), key: "ca.crt".into() }));
        refresher.slots.get_mut(&key("corp")).unwrap().due = start + Duration::from_secs(30);
        refresher.sync(wanted(&[("corp", with_ca.clone()), ("edited", discovery("https://newer.example.com"))]), start);
        let corp = &refresher.slots[&key("corp")];
        assert_eq!((corp.held.document.as_deref(), &corp.want), (Some(SET), &with_ca));
        assert_eq!(corp.due, start + Duration::from_secs(30), "not fetched again for it");
        assert_eq!(
            refresher.slots[&key("edited")].want.source,
            KeySource::Discovery { issuer: "https://newer.example.com".into() }
        );
        assert_eq!(refresher.next_due(false), start, "the new slot is due");

        refresher.sync(BTreeMap::new(), start);
        assert!(refresher.slots.is_empty() && refresher.published().index.is_empty());
        assert!(refresher.next_due(false) > start, "nothing wanted: a while");
    }

    #[test]
    fn a_seed_is_the_written_set_when_it_still_passes_and_keeps_its_fetch_time() {
        let mut gateway = waycast_mock::fixtures::objects::gateway("platform", "gw");
        let fetched = jiff::Timestamp::from_second(1_900_000_000).unwrap();
        gateway.status = Some(waycast_crds::GatewayStatus {
            identity: Some(GatewayIdentityStatus {
                providers: vec![ProviderKeySetStatus {
                    name: "corp".into(),
                    keys: Some(1),
                    fetched_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(fetched)),
                    message: None,
                }],
            }),
            ..Default::default()
        });
        let mut written = ProviderConfig::new("corp", ISSUER, "waycast");
        written.key_set = Some(SET.into());
        let seed = seed::seed_of(&gateway, &written).unwrap();
        assert_eq!(seed.source, KeySource::Discovery { issuer: ISSUER.into() });
        assert_eq!((seed.document.as_deref(), seed.keys, seed.fetched_at), (Some(SET), 1, Some(fetched)));
        let mut cluster = ProviderConfig::new("cluster", "https://kubernetes.default.svc", "waycast");
        cluster.service_accounts = true;
        cluster.key_set = Some(SET.into());
        let seed = seed::seed_of(&gateway, &cluster).unwrap();
        assert_eq!((seed.source, seed.fetched_at), (KeySource::Cluster, None));
        written.key_set = Some(r#"{"keys":[]}"#.into());
        assert!(seed::seed_of(&gateway, &written).is_none(), "no signing key: nothing to hold");
        written.key_set = None;
        assert!(seed::seed_of(&gateway, &written).is_none());
    }
}
