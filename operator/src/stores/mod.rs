//! The shared caches every controller reads: one reflector per kind, a
//! change signal per store that fires only after the store has the change
//! and only when what the operator reads changed (`relevant`), and the
//! feeds that tell each controller which objects to look at.
//!
//! NB: hand-built rather than kube's shared reflectors: see
//! docs/operator.md ("Stores").

pub mod admitted;
mod changes;
pub mod key_log;
pub(crate) mod paced;

pub use paced::Feed;
pub mod views;

pub(crate) use changes::{any_change, endpoint_content, heartbeat, holder, labels, service_content, spec_and_labels};

use std::collections::HashMap;
use std::hash::{BuildHasher as _, Hash};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use waycast_crds::{AccessGrant, ApiKey, Gateway, ModelEndpoint};

use crate::compile::{self};
use crate::error::Error;
use crate::render::{self, FIELD_MANAGER};

pub use waycast_crds::api_key::KEY_SECRET_LABEL;

/// The reflector stores every controller reads, and a signal per store
/// that fires after each change has been applied to it.
///
/// NB: controllers are triggered by these signals rather than by watches
/// of their own: a separate watch can deliver an event before the store has
/// it, and a reconcile would then compile stale inputs with nothing left to
/// trigger a correct one.
#[derive(Clone)]
pub struct Stores {
    /// Gateways.
    pub gateways: Store<Gateway>,
    /// ModelEndpoints.
    pub models: Store<ModelEndpoint>,
    /// ApiKeys.
    pub keys: Store<ApiKey>,
    /// AccessGrants (few: a team's, not a person's).
    pub grants: Store<AccessGrant>,
    /// Namespaces (labels for `Selector` policies).
    pub namespaces: Store<Namespace>,
    /// Services (backend resolution).
    pub services: Store<Service>,
    /// The metadata of Secrets labelled as key Secrets (their data is read
    /// only when a served ApiKey names one: `secret_data`).
    pub key_secrets: Store<PartialObjectMeta<Secret>>,
    /// The metadata of Secrets opted in as upstream credentials
    /// (`waycast.dev/credential`).
    pub credentials: Store<PartialObjectMeta<Secret>>,
    /// Gateway pods' heartbeat Leases.
    pub leases: Store<Lease>,
    /// The metadata of gateway pods (`app.kubernetes.io/name=waycast-gateway`):
    /// a heartbeat counts only when it is a live one's own.
    pub gateway_pods: Store<PartialObjectMeta<Pod>>,
    /// The metadata of Secrets the operator owns (each Gateway's config
    /// manifest, base and key shard Secrets: their digest annotations and
    /// owners, never their data).
    pub config_secrets: Store<PartialObjectMeta<Secret>>,
    /// EndpointSlices, trimmed to their Service, ports and endpoints'
    /// addresses and conditions (gateway pods pick among them).
    pub endpoint_slices: Store<EndpointSlice>,
    /// What each controller is to reconcile.
    pub feeds: Feeds,
    /// Fires after any change to the store of the same name.
    pub changed: Changes,
    /// Which ApiKeys changed, in order (the key lane's).
    pub key_log: Arc<key_log::KeyLog>,
}

/// One change signal per store.
#[derive(Clone)]
pub struct Changes {
    /// Gateways changed.
    pub gateways: broadcast::Sender<()>,
    /// ModelEndpoints changed.
    pub models: broadcast::Sender<()>,
    /// ApiKeys changed.
    pub keys: broadcast::Sender<()>,
    /// Namespaces changed.
    pub namespaces: broadcast::Sender<()>,
    /// Services changed.
    pub services: broadcast::Sender<()>,
    /// Key Secrets changed.
    pub key_secrets: broadcast::Sender<()>,
    /// Credential Secrets changed (a rotated provider key is picked up by watch).
    pub credentials: broadcast::Sender<()>,
    /// EndpointSlices changed (pods became ready, or went away).
    pub endpoint_slices: broadcast::Sender<()>,
}

/// A stream that yields once per signal (a lagging receiver still yields).
pub(crate) fn signals(senders: &[&broadcast::Sender<()>]) -> impl futures_util::Stream<Item = ()> + Send + 'static {
    let streams = senders.iter().map(|sender| {
        futures_util::stream::unfold(sender.subscribe(), |mut receiver| async move {
            match receiver.recv().await {
                Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => Some(((), receiver)),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        })
        .boxed()
    });
    futures_util::stream::select_all(streams)
}

/// A signal every `period`: every object is looked at again. One timer
/// instead of a requeue per object, which at 10,000 ApiKeys held 9 MB of
/// scheduler entries.
pub(crate) fn every(period: Duration) -> impl futures_util::Stream<Item = ()> + Send + 'static {
    futures_util::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
}

/// One signal at once: every object is looked at when a controller starts.
pub(crate) fn once() -> impl futures_util::Stream<Item = ()> + Send + 'static {
    futures_util::stream::once(futures_util::future::ready(()))
}

/// Called with each object whose relevant fields changed, and whether it
/// was deleted.
pub(crate) type Listener<K> = Box<dyn FnMut(&K, bool) + Send>;

/// Fills a store from `watch` and signals relevant changes; `listener`
/// hears of each changed object.
pub(crate) fn store_of<K, W>(
    watch: W,
    relevant: fn(&K) -> u64,
    mut listener: Listener<K>,
) -> (Store<K>, broadcast::Sender<()>)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    W: futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let (changed, _) = broadcast::channel(64);
    let sender = changed.clone();
    let view = reader.clone();
    // NB: managedFields (and kubectl's last-applied copy) are dropped
    // before objects reach the store: the operator never reads them, and at
    // 10,000 objects they were a large share of its memory.
    let watch = watch.modify(trimmed);
    let stream = reflector::reflector(writer, watch).default_backoff();
    // What each object's relevant fields were when last announced (with the
    // object, so that one gone after a re-list can still be announced).
    // NB: keyed by a digest of the namespace and name, not the reflector's
    // reference (its name, namespace, uid and version, each a string of its
    // own): at 100,000 ApiKeys and as many key Secrets the references were
    // about 35 MB. The digest is keyed per process, so no one can make two
    // names collide on purpose; by chance, among 100,000 names, about once
    // in a billion.
    let identities = std::hash::RandomState::new();
    let identity =
        move |object: &K| identities.hash_one((object.meta().namespace.as_deref(), object.meta().name.as_deref()));
    let mut seen: Announced<u64, Arc<K>> = HashMap::new();
    // The reflector has applied each event to the store before it reaches
    // here — except during a re-list, whose objects it buffers until
    // `InitDone`: the whole new state is compared then. (Comparing each
    // `InitApply` object against the store missed every object created or
    // changed while a watch was being re-established.)
    tokio::spawn(stream.for_each(move |event| {
        let changed = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                let current =
                    view.get(&ObjectRef::from_obj(&object)).map(|current| (relevant(current.as_ref()), current));
                event_change(&mut seen, identity(&object), current, || Arc::new(object)).into_iter().collect()
            }
            Ok(watcher::Event::InitDone) => {
                let now = view
                    .state()
                    .into_iter()
                    .map(|object| (identity(object.as_ref()), (relevant(object.as_ref()), object)))
                    .collect();
                relist_changes(&mut seen, now)
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Vec::new(),
            Err(_) => {
                let _ = sender.send(());
                Vec::new()
            }
        };
        if !changed.is_empty() {
            let _ = sender.send(());
            for (object, deleted) in changed {
                listener(object.as_ref(), deleted);
            }
        }
        futures_util::future::ready(())
    }));
    (reader, changed)
}

/// What every store drops of an object: its managedFields and kubectl's
/// copy of it as last applied, never read.
pub(crate) fn trimmed<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// `object` as a store keeps it after `view`: the reflector's key and its
/// copy (what `xtask memory-figures` counts).
pub fn kept<K: Resource<DynamicType = ()> + Clone>(mut object: K, view: fn(&mut K)) -> (ObjectRef<K>, Arc<K>) {
    view(&mut object);
    trimmed(&mut object);
    (ObjectRef::from_obj(&object), Arc::new(object.clone()))
}

/// What was last announced per object: its fingerprint and the object.
type Announced<R, O> = HashMap<R, (u64, O)>;

/// After one watch event for `reference`: the object to announce (with
/// whether it was deleted), if its fingerprint moved. `current` is what the
/// store holds now (`None`: deleted); `gone` gives the deleted object.
fn event_change<R: Hash + Eq, O: Clone>(
    seen: &mut Announced<R, O>,
    reference: R,
    current: Option<(u64, O)>,
    gone: impl FnOnce() -> O,
) -> Option<(O, bool)> {
    match current {
        Some((print, object)) => {
            let moved = seen.insert(reference, (print, object.clone())).is_none_or(|(old, _)| old != print);
            moved.then_some((object, false))
        }
        None => seen.remove(&reference).map(|_| (gone(), true)),
    }
}

/// After a re-list: every object whose fingerprint moved or that is new,
/// then every object that is gone (deleted while the watch was down).
/// `seen` becomes `now`.
fn relist_changes<R: Hash + Eq, O: Clone>(seen: &mut Announced<R, O>, mut now: Announced<R, O>) -> Vec<(O, bool)> {
    let mut changed: Vec<(O, bool)> = now
        .iter()
        .filter(|(reference, (print, _))| seen.get(*reference).is_none_or(|(old, _)| old != print))
        .map(|(_, (_, object))| (object.clone(), false))
        .collect();
    changed.extend(
        seen.drain().filter(|(reference, _)| !now.contains_key(reference)).map(|(_, (_, object))| (object, true)),
    );
    std::mem::swap(seen, &mut now);
    changed
}

pub(crate) fn all<K>(
    client: &Client,
    config: watcher::Config,
) -> impl futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(Api::<K>::all(client.clone()), config)
}

/// The objects each controller reconciles, as their stores see them change.
/// Controllers share the stores instead of caching every object again in
/// watches of their own (ApiKeys were held three times, key Secrets twice).
#[derive(Clone, Default)]
pub struct Feeds {
    /// Gateways whose spec or labels changed, or one of whose config Secrets
    /// was deleted.
    pub gateways: Feed<Gateway>,
    /// ModelEndpoints whose spec or labels changed.
    pub models: Feed<ModelEndpoint>,
    /// ApiKeys whose spec or labels changed.
    pub keys: Feed<ApiKey>,
    /// ApiKeys whose spec changed or whose key Secret changed.
    pub key_secrets: Feed<ApiKey>,
    /// AccessGrants whose spec or labels changed.
    pub grants: Feed<AccessGrant>,
}

pub(crate) fn announce_self<K: Resource<DynamicType = ()> + Send + Sync + 'static>(feeds: Vec<Feed<K>>) -> Listener<K> {
    Box::new(move |object, _| {
        for feed in &feeds {
            feed.announce(ObjectRef::from_obj(object));
        }
    })
}

/// `listener`, and each object logged as a changed ApiKey.
fn logged(mut listener: Listener<ApiKey>, log: Arc<key_log::KeyLog>) -> Listener<ApiKey> {
    Box::new(move |key, deleted| {
        log.push(key_log::Logged::Key(compile::ObjectKey::of(&key.metadata)));
        listener(key, deleted);
    })
}

pub(crate) fn ignore<K>() -> Listener<K> {
    Box::new(|_, _| {})
}

/// The owner of `object` of kind `K`, by its ownerReferences.
pub(crate) fn owner_of<K: Resource<DynamicType = ()>>(object: &impl Resource) -> Option<ObjectRef<K>> {
    let owner = object.meta().owner_references.as_ref()?.iter().find(|o| o.kind == K::kind(&()))?;
    Some(ObjectRef::new(&owner.name).within(object.meta().namespace.as_deref()?))
}

/// Starts the reflectors and waits until they have listed everything.
///
/// # Errors
/// A reflector stopped before it was ready.
pub async fn stores(client: &Client) -> Result<Stores, Error> {
    let feeds = Feeds::default();
    let key_log = Arc::new(key_log::KeyLog::default());
    let (gateways, gateways_changed) =
        store_of(all(client, watcher::Config::default()), spec_and_labels, announce_self(vec![feeds.gateways.clone()]));
    let (models, models_changed) =
        store_of(all(client, watcher::Config::default()), spec_and_labels, announce_self(vec![feeds.models.clone()]));
    let unknown = key_log.clone();
    let (namespaces, namespaces_changed) = store_of(
        all(client, watcher::Config::default()),
        labels,
        Box::new(move |_: &Namespace, _| unknown.push(key_log::Logged::Unknown)),
    );
    // NB: without their `status.usage` (the usage collector's, never read
    // back): at 10,000 keys it was megabytes, and every collection that
    // moved it replaced each object. And whole only where a Gateway admits
    // their namespace (`admitted`): elsewhere their name and parents.
    // NB: the ApiKey watch starts once Gateways and Namespaces are listed
    // (before, every key would be held back, then listed again), waited
    // for here, by this one task: a store's readiness wakes only the latest
    // task waiting for it.
    gateways.wait_until_ready().await.map_err(|_| Error::Incomplete("a ready store"))?;
    namespaces.wait_until_ready().await.map_err(|_| Error::Incomplete("a ready store"))?;
    let admission = admitted::Admission { gateways: gateways.clone(), namespaces: namespaces.clone() };
    let watch_keys = {
        let client = client.clone();
        move || watcher::watcher(Api::<ApiKey>::all(client.clone()), watcher::Config::default())
    };
    let (keys, keys_changed) = store_of(
        admitted::admitted_keys(admission, watch_keys, signals(&[&gateways_changed, &namespaces_changed]))
            .modify(views::api_key),
        admitted::relevant,
        logged(announce_self(vec![feeds.keys.clone(), feeds.key_secrets.clone()]), key_log.clone()),
    );
    // NB: a changed grant looks at every Gateway again (they are few, and
    // an edit of its parentRefs concerns the Gateway it left too).
    // Its own status is looked at too: a grant no Gateway takes (naming
    // none that admits it) is announced by no compile.
    let (every_gateway, gateway_feed, grant_feed) = (gateways.clone(), feeds.gateways.clone(), feeds.grants.clone());
    let (grants, _) = store_of(
        all(client, watcher::Config::default()),
        spec_and_labels,
        Box::new(move |grant: &AccessGrant, _| {
            for gateway in every_gateway.state() {
                gateway_feed.announce(ObjectRef::from_obj(gateway.as_ref()));
            }
            grant_feed.announce(ObjectRef::from_obj(grant));
        }),
    );
    let (services, services_changed) = store_of(all(client, watcher::Config::default()), service_content, ignore());
    // NB: labelled Secrets are watched as metadata only: anyone who may
    // create Secrets may label many large ones. Their data is read only
    // for the Secrets served objects reference (`secret_data`).
    let secrets = watcher::Config::default().labels(&format!("{KEY_SECRET_LABEL}=true"));
    let owners = feeds.key_secrets.clone();
    let secrets_log = key_log.clone();
    // Only the owner and what identifies a key Secret are kept: at 10,000
    // of them their label maps alone were 5 MB (a B-tree node each), and
    // the operator selects them by that label in the watch.
    let (key_secrets, key_secrets_changed) = store_of(
        all::<PartialObjectMeta<Secret>>(client, secrets).modify(views::key_secret),
        any_change,
        Box::new(move |secret: &PartialObjectMeta<Secret>, _| {
            if let Some(owner) = owner_of::<ApiKey>(secret) {
                owners.announce(owner);
            }
            secrets_log.push(key_log::Logged::Secret(compile::ObjectKey::of(&secret.metadata)));
        }),
    );
    // Upstream credentials: only the Secrets their teams opted in, so the
    // operator neither caches nor reads any other Secret of a team.
    let credentials = watcher::Config::default().labels(&format!("{}=true", compile::secrets::CREDENTIAL_LABEL));
    let (credentials, credentials_changed) =
        store_of(all::<PartialObjectMeta<Secret>>(client, credentials), any_change, ignore());
    // Metadata only: the operator needs to know which config each Secret
    // holds (its hash annotation), not the up-to-1-MiB data.
    let managed = watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={FIELD_MANAGER}"));
    let gateway_feed = feeds.gateways.clone();
    let (config_secrets, _) = store_of(
        all::<PartialObjectMeta<Secret>>(client, managed),
        any_change,
        Box::new(move |secret: &PartialObjectMeta<Secret>, deleted| {
            if deleted && let Some(owner) = owner_of::<Gateway>(secret) {
                gateway_feed.announce(owner);
            }
        }),
    );
    // Every Service's endpoints, but only what picking reads: at a pod's
    // churn the slice's other fields (topology, hints, target refs) change
    // too and would only cost memory.
    let (endpoint_slices, endpoint_slices_changed) =
        store_of(all(client, watcher::Config::default()).modify(views::endpoint_slice), endpoint_content, ignore());
    // Pods' heartbeats: a pod reporting another config moves its Gateway's status.
    let heartbeats = watcher::Config::default().labels(render::GATEWAY_LABEL);
    let gateway_feed = feeds.gateways.clone();
    // Only the heartbeat's own annotations are kept, each bounded: anyone
    // may write a Lease with the label in a namespace of their own.
    let (leases, _) = store_of(
        all(client, heartbeats).modify(views::lease),
        heartbeat,
        Box::new(move |lease: &Lease, _| {
            if let (Some(gateway), Some(namespace)) = (lease.labels().get(render::GATEWAY_LABEL), lease.namespace()) {
                gateway_feed.announce(ObjectRef::new(gateway).within(&namespace));
            }
        }),
    );
    // Gateway pods, metadata only: whose heartbeats are genuine. Only the
    // labels that tell whose pod it is are kept: anyone may label a pod of
    // their own like a gateway pod, with anything else on it.
    let pods = watcher::Config::default().labels("app.kubernetes.io/name=waycast-gateway");
    let gateway_feed = feeds.gateways.clone();
    let (gateway_pods, _) = store_of(
        all::<PartialObjectMeta<Pod>>(client, pods).modify(views::gateway_pod),
        any_change,
        Box::new(move |pod: &PartialObjectMeta<Pod>, _| {
            let instance = pod.labels().get("app.kubernetes.io/instance");
            if let (Some(gateway), Some(namespace)) = (instance, pod.namespace()) {
                gateway_feed.announce(ObjectRef::new(gateway).within(&namespace));
            }
        }),
    );
    let stores = Stores {
        gateways,
        models,
        keys,
        grants,
        namespaces,
        services,
        key_secrets,
        credentials,
        leases,
        gateway_pods,
        config_secrets,
        endpoint_slices,
        feeds,
        key_log,
        changed: Changes {
            gateways: gateways_changed,
            models: models_changed,
            keys: keys_changed,
            namespaces: namespaces_changed,
            services: services_changed,
            key_secrets: key_secrets_changed,
            credentials: credentials_changed,
            endpoint_slices: endpoint_slices_changed,
        },
    };
    for ready in [
        stores.gateways.wait_until_ready().await,
        stores.models.wait_until_ready().await,
        stores.keys.wait_until_ready().await,
        stores.grants.wait_until_ready().await,
        stores.namespaces.wait_until_ready().await,
        stores.services.wait_until_ready().await,
        stores.key_secrets.wait_until_ready().await,
        stores.credentials.wait_until_ready().await,
        stores.leases.wait_until_ready().await,
        stores.gateway_pods.wait_until_ready().await,
        stores.config_secrets.wait_until_ready().await,
        stores.endpoint_slices.wait_until_ready().await,
    ] {
        ready.map_err(|_| Error::Incomplete("a ready store"))?;
    }
    Ok(stores)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announced(entries: &[(&'static str, u64)]) -> Announced<&'static str, &'static str> {
        entries.iter().map(|(name, print)| (*name, (*print, *name))).collect()
    }

    fn sorted(mut changes: Vec<(&'static str, bool)>) -> Vec<(&'static str, bool)> {
        changes.sort();
        changes
    }

    #[test]
    fn a_relist_announces_what_moved_appeared_or_went_and_nothing_else() {
        let mut seen = announced(&[("kept", 1), ("edited", 1), ("deleted-while-down", 1)]);
        let now = announced(&[("kept", 1), ("edited", 2), ("created-while-down", 1)]);
        let changes = sorted(relist_changes(&mut seen, now.clone()));
        assert_eq!(changes, [("created-while-down", false), ("deleted-while-down", true), ("edited", false)]);
        assert_eq!(seen, now, "the new state is what was announced");
        assert!(relist_changes(&mut seen, now).is_empty(), "a second identical re-list announces nothing");
    }

    /// A store announces by namespace and name: a key of the same name in
    /// another namespace is another object, and a status write (same
    /// generation) is no change.
    #[tokio::test]
    async fn a_store_announces_each_object_by_its_namespace_and_name() {
        let key = |namespace: &str, generation: i64| {
            let mut key = waycast_mock::fixtures::objects::api_key(namespace, "x");
            key.metadata.generation = Some(generation);
            key
        };
        let mut status_written = key("team-a", 1);
        status_written.status = Some(waycast_crds::ApiKeyStatus { observed_generation: Some(1), ..Default::default() });
        let events = vec![
            watcher::Event::Init,
            watcher::Event::InitApply(key("team-a", 1)),
            watcher::Event::InitDone,
            watcher::Event::Apply(key("team-b", 1)),
            watcher::Event::Apply(ApiKey {
                metadata: kube::api::ObjectMeta { name: Some("y".into()), ..key("team-a", 1).metadata },
                ..key("team-a", 1)
            }),
            watcher::Event::Apply(status_written),
            watcher::Event::Apply(key("team-b", 2)),
            watcher::Event::Delete(key("team-a", 1)),
        ];
        let (hearing, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let listener: Listener<ApiKey> = Box::new(move |key, deleted| {
            let namespace = key.metadata.namespace.clone().unwrap_or_default();
            let _ = hearing.send((namespace, key.metadata.generation, deleted));
        });
        let (store, _) = store_of(futures_util::stream::iter(events.into_iter().map(Ok)), spec_and_labels, listener);
        let mut announced = Vec::new();
        while let Ok(Some(heard)) = tokio::time::timeout(Duration::from_secs(2), heard.recv()).await {
            announced.push(heard);
        }
        let expected = [
            ("team-a".to_owned(), Some(1), false),
            ("team-b".to_owned(), Some(1), false),
            ("team-a".to_owned(), Some(1), false),
            ("team-b".to_owned(), Some(2), false),
            ("team-a".to_owned(), Some(1), true),
        ];
        assert_eq!(announced, expected);
        assert_eq!(store.state().len(), 2, "team-b's x and team-a's y");
    }

    #[test]
    fn an_event_announces_only_a_moved_fingerprint() {
        let mut seen = announced(&[]);
        assert_eq!(event_change(&mut seen, "a", Some((1, "a")), || "a"), Some(("a", false)), "new");
        assert_eq!(event_change(&mut seen, "a", Some((1, "a")), || "a"), None, "a status write: same print");
        assert_eq!(event_change(&mut seen, "a", Some((2, "a")), || "a"), Some(("a", false)), "spec changed");
        assert_eq!(event_change(&mut seen, "a", None, || "a-gone"), Some(("a-gone", true)), "deleted");
        assert_eq!(event_change(&mut seen, "a", None, || "a-gone"), None, "deleted twice");
    }
}
