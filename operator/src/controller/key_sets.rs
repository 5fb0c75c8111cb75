//! The key-set refresher's shell: one task, run by the Lease holder beside
//! the controllers, that keeps every provider's key set current off the
//! reconcile (`key_sets::refresher`: each fetch a task of its own, each
//! answer taken as it arrives). Here is what it does to the operator: what
//! is held is published for compile and the status, the reconcile of each
//! Gateway whose key set or fetch error changed is asked for (its config
//! writer writes and propagates a new document; its status says where each
//! provider stands), an Event when a fetch error appears, changes or
//! clears, and the metrics. An unchanged document triggers nothing.
//!
//! ```text
//! start: seeds (the configs written) ─┐
//! Gateway changes ──► wanted slots ───┴─► refresher::run ─► Outcome ─► publish, announce, Events, metrics
//! every second: heartbeats' nudges ──────────┘ (key_sets::nudges)
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use kube::Resource as _;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::apply::bounded;
use crate::compile::ObjectKey;
use crate::compile::key_source::HeldKeySet;
use crate::context::Context;
use crate::key_sets::fetch::{Fetcher, Want};
use crate::key_sets::nudges::Nudges;
use crate::key_sets::refresher::{self, Outcome, Refresher, Shell, Wake};
use crate::key_sets::{Published, SlotKey, seed, wanted};
use crate::stores::{every, signals};

/// How often the heartbeats are read for nudges: a pod's note reaches the
/// refresher within this (the Lease store has it already).
const READ_NUDGES_EVERY: Duration = Duration::from_secs(1);

/// The refresher of a starting operator: the key sets of the configs
/// written (seeds), published before any Gateway compiles, so that the
/// first compile after a restart keeps serving them.
pub(crate) async fn seeded(context: &Context) -> Refresher {
    let gateways = context.stores.gateways.state();
    let seeds = seed::seeds(&context.client, &gateways).await;
    if !seeds.is_empty() {
        tracing::info!(key_sets = seeds.len(), "key sets of the configs written held until fetched");
    }
    let mut refresher = Refresher::new(seeds, Instant::now());
    refresher.sync(wanted(gateways.iter().map(AsRef::as_ref)).0, Instant::now());
    context.key_sets.publish(refresher.published());
    refresher
}

/// Keeps the key sets current for as long as the task runs.
pub(crate) async fn keep_key_sets(context: Arc<Context>, refresher: Refresher) {
    let fetcher = Fetcher::new(context.client.clone());
    let gateways = signals(&[&context.stores.changed.gateways]).map(|()| Wake::Gateways);
    let nudges = every(READ_NUDGES_EVERY).map(|()| Wake::Nudges);
    let wakes = futures_util::stream::select(gateways, nudges).boxed();
    let shell = Operator { context: &context, nudges: Nudges::default() };
    refresher::run(refresher, fetcher, shell, wakes).await;
}

/// The operator, as the refresher acts on it.
struct Operator<'c> {
    context: &'c Context,
    nudges: Nudges,
}

impl Shell for Operator<'_> {
    fn wanted(&self) -> (BTreeMap<SlotKey, Want>, bool) {
        wanted(self.context.stores.gateways.state().iter().map(AsRef::as_ref))
    }

    async fn settled(&self, outcome: Outcome, published: Option<Published>) {
        let context = self.context;
        if let Some(published) = published {
            context.key_sets.publish(published);
        }
        if let Some(result) = outcome.result {
            context.metrics.key_set_fetches.with_label_values(&[result]).inc();
        }
        if let Some(error) = &outcome.issuer_error {
            tracing::warn!(%error, known = ?context.key_sets.load().cluster_issuer, "cannot read the cluster's ServiceAccount issuer");
        }
        let mut announce: Vec<ObjectKey> = outcome.announce.iter().cloned().collect();
        if outcome.issuer_changed {
            tracing::info!(issuer = ?context.key_sets.load().cluster_issuer, "the cluster's ServiceAccount issuer");
            // Providers of the cluster's issuer compile only once it is known.
            let gateways = context.stores.gateways.state();
            let trusting = gateways.iter().filter(|gateway| {
                let providers = gateway.spec.identity.iter().flat_map(|identity| &identity.providers);
                providers.into_iter().any(|provider| provider.service_account_issuer.is_some())
            });
            announce.extend(trusting.map(|gateway| ObjectKey::of(&gateway.metadata)));
        }
        for gateway in announce {
            context.stores.feeds.gateways.announce(ObjectRef::new(&gateway.name).within(&gateway.namespace));
        }
        if let Some(((gateway, provider), keys)) = &outcome.fetched {
            tracing::info!(gateway = %gateway, provider = %provider, keys, "key set fetched");
        }
        if let Some((key, held)) = &outcome.moved {
            report(context, key, held).await;
        }
    }

    fn nudges(&mut self) -> Vec<SlotKey> {
        let stores = &self.context.stores;
        let asked = self.nudges.read(&stores.leases.state(), &stores.gateways, &stores.gateway_pods);
        for (gateway, provider) in &asked {
            tracing::debug!(gateway = %gateway, %provider, "a pod refused a token of a key not in the set");
        }
        asked
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
