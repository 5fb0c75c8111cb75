//! The reconcile shells: read from the stores, call the pure compile and
//! render steps, server-side apply the result, and write status.
//!
//! ```text
//! reflectors (Gateway, ModelEndpoint, ApiKey, Namespace, Service, key Secrets,
//!             config Secret metadata, heartbeat Leases) ─► Stores ─► Feeds + change signals
//! Gateway controller:       stores ─► compile ─► render ─► apply (SSA, prune HPA/PDB) ─► Gateway status
//!                           └─ stores every verdict in `compiled`, announces the objects whose
//!                              verdict or Programmed state moved (programmed.rs)
//! key Secret controller:    generate <name>-key if needed (its own queue: never behind status work)
//! ApiKey controller:        verdict from `compiled` per selecting Gateway ─► ApiKey status
//! ModelEndpoint controller: verdict from `compiled` per selecting Gateway ─► ModelEndpoint status
//! ```
//!
//! The controllers read the shared stores and are fed by them (one cache of
//! each kind). Each kind's status is written only by its own controller, with one field
//! manager. A change the operator reads (spec, labels, Secret data — not
//! status) re-triggers the controllers that read it, after the store has it;
//! bursts are coalesced by the debounce, a request for an object already
//! queued is merged, and at most [`CONCURRENCY`] reconciles of a kind run at
//! once. One compile per Gateway change serves every object's status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, mpsc};
use waycast_crds::condition::{reasons, types};
use waycast_crds::{ApiKey, ApiKeyStatus, Gateway, GatewayStatus, ModelEndpoint, ModelEndpointStatus};

use crate::compile::{self, Inputs, ObjectKey, keys, select};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::programmed::{self, CompiledFrom, Decision};
use crate::render::{self, FIELD_MANAGER, RenderSettings};
use crate::status;

/// The label key Secrets carry (generated ones and user-supplied ones).
pub const KEY_SECRET_LABEL: &str = "waycast.dev/api-key";
/// How long bursts of changes are coalesced before a reconcile.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Reconciles of one kind in flight at once. Unbounded, a re-check of
/// 10,000 ApiKeys opened thousands of API connections at once, and a new
/// key's reconcile waited behind them for tens of seconds.
pub const CONCURRENCY: u16 = 16;
/// Periodic re-reconcile (picks up rotated upstream credentials).
pub const RESYNC: Duration = Duration::from_secs(300);

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
    /// Namespaces (labels for `Selector` policies).
    pub namespaces: Store<Namespace>,
    /// Services (backend resolution).
    pub services: Store<Service>,
    /// Secrets labelled as key Secrets.
    pub key_secrets: Store<Secret>,
    /// Secrets opted in as upstream credentials (`waycast.dev/credential`).
    pub credentials: Store<Secret>,
    /// Gateway pods' heartbeat Leases.
    pub leases: Store<Lease>,
    /// The metadata of Secrets the operator owns (config Secrets).
    pub config_secrets: Store<PartialObjectMeta<Secret>>,
    /// What each controller is to reconcile.
    pub feeds: Feeds,
    /// Fires after any change to the store of the same name.
    pub changed: Changes,
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
}

/// A stream that yields once per signal (a lagging receiver still yields).
fn signals(senders: &[&broadcast::Sender<()>]) -> impl futures_util::Stream<Item = ()> + Send + 'static {
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
fn every(period: Duration) -> impl futures_util::Stream<Item = ()> + Send + 'static {
    futures_util::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
}

/// One signal at once: every object is looked at when a controller starts.
fn once() -> impl futures_util::Stream<Item = ()> + Send + 'static {
    futures_util::stream::once(futures_util::future::ready(()))
}

/// Shared by every reconcile.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Stores.
    pub stores: Stores,
    /// Render settings.
    pub settings: RenderSettings,
    /// Metrics.
    pub metrics: Metrics,
    /// What each Gateway's current config was compiled from.
    pub compiled: tokio::sync::RwLock<BTreeMap<ObjectKey, CompiledFrom>>,
    /// Publishes Events.
    pub events: crate::events::Publisher,
    /// The last config each Gateway wrote, for the propagation metric.
    pub written: tokio::sync::RwLock<BTreeMap<ObjectKey, Written>>,
    /// Gateways (uid, generation) whose owned objects were found to be
    /// their own or absent, and then applied: not looked up again until the
    /// spec changes. NB: the check guards against objects that existed
    /// before the Gateway; at 10,000 keys its eight reads per reconcile
    /// doubled the reconcile time.
    pub verified: tokio::sync::RwLock<std::collections::BTreeSet<(String, i64)>>,
    /// Consecutive failed reconciles per object, for exponential backoff.
    pub failures: arc_swap::ArcSwap<BTreeMap<String, u32>>,
}

/// The retry delay after `failures` consecutive transient errors: 1 s,
/// doubling, capped at 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let seconds = 1_u64.checked_shl(failures.saturating_sub(1).min(16)).unwrap_or(u64::MAX).min(300);
    Duration::from_secs(seconds)
}

impl Context {
    fn record_failure(&self, object: &str) -> u32 {
        let mut count = 0;
        self.failures.rcu(|current| {
            let mut next = (**current).clone();
            let entry = next.entry(object.to_owned()).or_insert(0);
            *entry += 1;
            count = *entry;
            next
        });
        count
    }

    fn record_success(&self, object: &str) {
        if self.failures.load().contains_key(object) {
            self.failures.rcu(|current| {
                let mut next = (**current).clone();
                next.remove(object);
                next
            });
        }
    }
}

/// Publishes an Event for every condition whose status changed (Normal when
/// it became True, Warning when False). Failures are logged, not fatal.
async fn emit_transitions<K: Resource<DynamicType = ()>>(
    context: &Context,
    object: &K,
    old: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    new: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) {
    use crate::events::EventType;
    for condition in new {
        let before = old.iter().find(|o| o.type_ == condition.type_).map(|o| o.status.as_str());
        if before == Some(condition.status.as_str()) {
            continue;
        }
        let type_ = if condition.status == "True" { EventType::Normal } else { EventType::Warning };
        let note = format!("{}: {}", condition.type_, condition.message);
        let published = context.events.publish(object.object_ref(&()), type_, &condition.reason, note, "Reconcile");
        if let Err(error) = bounded(published).await {
            tracing::debug!(%error, "could not publish an Event");
        }
    }
}

/// When a Gateway's current config was written, until every pod reports it.
#[derive(Debug, Clone)]
pub struct Written {
    /// The config hash written.
    pub hash: String,
    /// When.
    pub at: std::time::Instant,
    /// Whether its propagation was already measured.
    pub measured: bool,
}

// What of an object the operator reads (`store_of`'s `relevant`): a change
// signal fires only when this changes, so the operator's own status writes
// do not re-trigger compiles (a stream of 10,000 ApiKey status patches kept
// postponing the debounced Gateway reconcile for seconds), and Lease
// renewals do not either.

fn fingerprint(meta: &ObjectMeta, relevant: impl std::hash::Hash) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    relevant.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    hasher.finish()
}

/// Spec (by generation), labels and deletion.
fn spec_and_labels<K: Resource>(object: &K) -> u64 {
    fingerprint(object.meta(), (object.meta().generation, &object.meta().labels))
}

/// Labels and deletion (Namespaces).
fn labels<K: Resource>(object: &K) -> u64 {
    fingerprint(object.meta(), &object.meta().labels)
}

/// Any change (Services, Secrets: no status the operator writes).
fn any_change<K: Resource>(object: &K) -> u64 {
    fingerprint(object.meta(), &object.meta().resource_version)
}

/// A heartbeat's Gateway, the config hash its pod reports and the config
/// it refused, not its renewals.
fn heartbeat(lease: &Lease) -> u64 {
    fingerprint(&lease.metadata, (&lease.metadata.labels, holder(lease), refused_hash(lease)))
}

fn refused_hash(lease: &Lease) -> Option<&String> {
    lease.annotations().get(waycast_crds::heartbeat::REFUSED_HASH_ANNOTATION)
}

/// Called with each object whose relevant fields changed, and whether it
/// was deleted.
type Listener<K> = Box<dyn FnMut(&K, bool) + Send>;

/// Fills a store from `watch` and signals relevant changes; `listener`
/// hears of each changed object.
fn store_of<K, W>(watch: W, relevant: fn(&K) -> u64, mut listener: Listener<K>) -> (Store<K>, broadcast::Sender<()>)
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
    let watch = watch.modify(|object: &mut K| {
        object.managed_fields_mut().clear();
        // A copy of the whole object as kubectl last applied it: never read.
        object.annotations_mut().remove("kubectl.kubernetes.io/last-applied-configuration");
    });
    let stream = reflector::reflector(writer, watch).default_backoff();
    // What each object's relevant fields were when last announced (with the
    // object, so that one gone after a re-list can still be announced).
    let mut seen: std::collections::HashMap<ObjectRef<K>, (u64, Arc<K>)> = std::collections::HashMap::new();
    // The reflector has applied each event to the store before it reaches
    // here — except during a re-list, whose objects it buffers until
    // `InitDone`: the whole new state is compared then. (Comparing each
    // `InitApply` object against the store missed every object created or
    // changed while a watch was being re-established.)
    tokio::spawn(stream.for_each(move |event| {
        let mut changed = Vec::new();
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                let reference = ObjectRef::from_obj(&object);
                match view.get(&reference) {
                    Some(current) => {
                        let print = relevant(current.as_ref());
                        if seen.insert(reference, (print, current.clone())).is_none_or(|(old, _)| old != print) {
                            changed.push((current, false));
                        }
                    }
                    None => {
                        if seen.remove(&reference).is_some() {
                            changed.push((Arc::new(object), true));
                        }
                    }
                }
            }
            Ok(watcher::Event::InitDone) => {
                let mut now: std::collections::HashMap<ObjectRef<K>, (u64, Arc<K>)> = view
                    .state()
                    .into_iter()
                    .map(|object| (ObjectRef::from_obj(object.as_ref()), (relevant(object.as_ref()), object)))
                    .collect();
                for (reference, (print, object)) in &now {
                    if seen.get(reference).is_none_or(|(old, _)| old != print) {
                        changed.push((object.clone(), false));
                    }
                }
                for (reference, (_, object)) in seen.drain() {
                    if !now.contains_key(&reference) {
                        changed.push((object, true));
                    }
                }
                std::mem::swap(&mut seen, &mut now);
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(_) => {
                let _ = sender.send(());
            }
        }
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

fn all<K>(
    client: &Client,
    config: watcher::Config,
) -> impl futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(Api::<K>::all(client.clone()), config)
}

/// Where a store announces the objects whose relevant fields changed, to
/// the controller that reconciles them once it runs. Nothing is queued
/// before: a standby replica waiting for the leader Lease would otherwise
/// buffer every change it sees.
pub struct Feed<K: Resource<DynamicType = ()>>(Arc<arc_swap::ArcSwapOption<mpsc::UnboundedSender<ObjectRef<K>>>>);

impl<K: Resource<DynamicType = ()>> Clone for Feed<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K: Resource<DynamicType = ()>> Default for Feed<K> {
    fn default() -> Self {
        Self(Arc::new(arc_swap::ArcSwapOption::empty()))
    }
}

impl<K: Resource<DynamicType = ()> + Send + Sync + 'static> Feed<K> {
    fn announce(&self, reference: ObjectRef<K>) {
        if let Some(sender) = self.0.load().as_ref() {
            let _ = sender.send(reference);
        }
    }

    /// The announcements from now on (replacing an earlier subscriber).
    fn subscribe(&self) -> impl futures_util::Stream<Item = ObjectRef<K>> + Send + 'static {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.0.store(Some(Arc::new(sender)));
        futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|reference| (reference, receiver))
        })
    }
}

/// The objects each controller reconciles, as their stores see them change.
/// Controllers share the stores instead of caching every object again in
/// watches of their own (ApiKeys were held three times, key Secrets twice).
#[derive(Clone, Default)]
pub struct Feeds {
    /// Gateways whose spec or labels changed, or whose config Secret was deleted.
    pub gateways: Feed<Gateway>,
    /// ModelEndpoints whose spec or labels changed.
    pub models: Feed<ModelEndpoint>,
    /// ApiKeys whose spec or labels changed.
    pub keys: Feed<ApiKey>,
    /// ApiKeys whose spec changed or whose key Secret changed.
    pub key_secrets: Feed<ApiKey>,
}

fn announce_self<K: Resource<DynamicType = ()> + Send + Sync + 'static>(feeds: Vec<Feed<K>>) -> Listener<K> {
    Box::new(move |object, _| {
        for feed in &feeds {
            feed.announce(ObjectRef::from_obj(object));
        }
    })
}

fn ignore<K>() -> Listener<K> {
    Box::new(|_, _| {})
}

/// The owner of `object` of kind `K`, by its ownerReferences.
fn owner_of<K: Resource<DynamicType = ()>>(object: &impl Resource) -> Option<ObjectRef<K>> {
    let owner = object.meta().owner_references.as_ref()?.iter().find(|o| o.kind == K::kind(&()))?;
    Some(ObjectRef::new(&owner.name).within(object.meta().namespace.as_deref()?))
}

fn holder(lease: &Lease) -> &str {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).unwrap_or_default()
}

/// Starts the reflectors and waits until they have listed everything.
///
/// # Errors
/// A reflector stopped before it was ready.
pub async fn stores(client: &Client) -> Result<Stores, Error> {
    let feeds = Feeds::default();
    let (gateways, gateways_changed) =
        store_of(all(client, watcher::Config::default()), spec_and_labels, announce_self(vec![feeds.gateways.clone()]));
    let (models, models_changed) =
        store_of(all(client, watcher::Config::default()), spec_and_labels, announce_self(vec![feeds.models.clone()]));
    let (keys, keys_changed) = store_of(
        all(client, watcher::Config::default()),
        spec_and_labels,
        announce_self(vec![feeds.keys.clone(), feeds.key_secrets.clone()]),
    );
    let (namespaces, namespaces_changed) = store_of(all(client, watcher::Config::default()), labels, ignore());
    let (services, services_changed) = store_of(all(client, watcher::Config::default()), any_change, ignore());
    let secrets = watcher::Config::default().labels(&format!("{KEY_SECRET_LABEL}=true"));
    let owners = feeds.key_secrets.clone();
    // Only the data, the owner and what identifies a key Secret are kept:
    // at 10,000 of them their label maps alone were 5 MB (a B-tree node
    // each), and the operator selects them by that label in the watch.
    let key_secret_view = |secret: &mut Secret| {
        let meta = &mut secret.metadata;
        (meta.labels, meta.annotations, meta.uid, meta.creation_timestamp) = (None, None, None, None);
    };
    let (key_secrets, key_secrets_changed) = store_of(
        all(client, secrets).modify(key_secret_view),
        any_change,
        Box::new(move |secret: &Secret, _| {
            if let Some(owner) = owner_of::<ApiKey>(secret) {
                owners.announce(owner);
            }
        }),
    );
    // Upstream credentials: only the Secrets their teams opted in, so the
    // operator neither caches nor reads any other Secret of a team.
    let credentials = watcher::Config::default().labels(&format!("{}=true", compile::models::CREDENTIAL_LABEL));
    let (credentials, credentials_changed) = store_of(all(client, credentials), any_change, ignore());
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
    // Pods' heartbeats: a pod reporting another config moves its Gateway's status.
    let heartbeats = watcher::Config::default().labels(render::GATEWAY_LABEL);
    let gateway_feed = feeds.gateways.clone();
    let (leases, _) = store_of(
        all(client, heartbeats),
        heartbeat,
        Box::new(move |lease: &Lease, _| {
            if let (Some(gateway), Some(namespace)) = (lease.labels().get(render::GATEWAY_LABEL), lease.namespace()) {
                gateway_feed.announce(ObjectRef::new(gateway).within(&namespace));
            }
        }),
    );
    let stores = Stores {
        gateways,
        models,
        keys,
        namespaces,
        services,
        key_secrets,
        credentials,
        leases,
        config_secrets,
        feeds,
        changed: Changes {
            gateways: gateways_changed,
            models: models_changed,
            keys: keys_changed,
            namespaces: namespaces_changed,
            services: services_changed,
            key_secrets: key_secrets_changed,
            credentials: credentials_changed,
        },
    };
    for ready in [
        stores.gateways.wait_until_ready().await,
        stores.models.wait_until_ready().await,
        stores.keys.wait_until_ready().await,
        stores.namespaces.wait_until_ready().await,
        stores.services.wait_until_ready().await,
        stores.key_secrets.wait_until_ready().await,
        stores.credentials.wait_until_ready().await,
        stores.leases.wait_until_ready().await,
        stores.config_secrets.wait_until_ready().await,
    ] {
        ready.map_err(|_| Error::Incomplete("a ready store"))?;
    }
    Ok(stores)
}

/// Runs the three controllers until the process ends.
pub async fn run(context: Arc<Context>) {
    let gateway_controller = gateway_controller(context.clone());
    let key_controller =
        status_controller(context.clone(), context.stores.keys.clone(), &context.stores.feeds.keys, reconcile_api_key);
    let key_secrets = key_secret_controller(context.clone());
    // Conflicts are decided among all of a Gateway's ModelEndpoints: that
    // too comes from its compile.
    let model_controller = status_controller(
        context.clone(),
        context.stores.models.clone(),
        &context.stores.feeds.models,
        reconcile_model_endpoint,
    );
    tokio::join!(gateway_controller, key_controller, key_secrets, model_controller);
}

// === inputs ===

/// Owned snapshots of the stores, borrowed by [`Inputs`].
struct Snapshot {
    namespaces: Vec<Arc<Namespace>>,
    models: Vec<Arc<ModelEndpoint>>,
    keys: Vec<Arc<ApiKey>>,
    services: Vec<Arc<Service>>,
    secrets: Vec<Arc<Secret>>,
}

impl Snapshot {
    fn take(stores: &Stores) -> Self {
        Self {
            namespaces: stores.namespaces.state(),
            models: stores.models.state(),
            keys: stores.keys.state(),
            services: stores.services.state(),
            secrets: stores.key_secrets.state().into_iter().chain(stores.credentials.state()).collect(),
        }
    }

    /// Adds what compile needs beyond the stores: the Gateway's Redis
    /// Secrets (the platform team's own), and the metadata of
    /// credential Secrets the routes name that are not opted in, so their
    /// status can say "not labelled" rather than "missing". A failed look-up
    /// counts as missing: it never holds up the rest of the Gateway.
    async fn fetch_credentials(&mut self, client: &Client, stores: &Stores, gateway: &Gateway) -> Result<(), Error> {
        for (namespace, name) in compile::models::redis_secrets(gateway) {
            if let Some(secret) = bounded(Api::<Secret>::namespaced(client.clone(), &namespace).get_opt(&name)).await? {
                self.secrets.push(Arc::new(secret));
            }
        }
        let wanted = self.with_inputs(gateway, compile::models::credential_secrets);
        for (namespace, name) in wanted {
            if stores.credentials.get(&ObjectRef::new(&name).within(&namespace)).is_some() {
                continue;
            }
            let api = Api::<Secret>::namespaced(client.clone(), &namespace);
            match bounded(api.get_metadata_opt(&name)).await {
                Ok(Some(meta)) => self.secrets.push(Arc::new(Secret { metadata: meta.metadata, ..Secret::default() })),
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(%error, secret = %format!("{namespace}/{name}"), "credential Secret look-up failed")
                }
            }
        }
        Ok(())
    }

    fn with_inputs<T>(&self, gateway: &Gateway, f: impl FnOnce(&Inputs<'_>) -> T) -> T {
        let namespaces: Vec<&Namespace> = self.namespaces.iter().map(AsRef::as_ref).collect();
        let models: Vec<&ModelEndpoint> = self.models.iter().map(AsRef::as_ref).collect();
        let keys: Vec<&ApiKey> = self.keys.iter().map(AsRef::as_ref).collect();
        let services: Vec<&Service> = self.services.iter().map(AsRef::as_ref).collect();
        let secrets: Vec<&Secret> = self.secrets.iter().map(AsRef::as_ref).collect();
        let inputs = Inputs {
            gateway,
            namespaces: &namespaces,
            model_endpoints: &models,
            api_keys: &keys,
            services: &services,
            secrets: &secrets,
        };
        f(&inputs)
    }
}

// === apply ===

async fn apply<K>(client: &Client, object: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let namespace = object.meta().namespace.clone().ok_or(Error::Incomplete("namespace"))?;
    let name = object.meta().name.clone().ok_or(Error::Incomplete("name"))?;
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    bounded(api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object))).await
}

/// Longest one API call may take. A request caught in an API server
/// restart can hang with no reply; the reconcile fails instead and is
/// retried (a hung reconcile holds its object: nothing else runs for it).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn bounded<T>(call: impl std::future::Future<Output = Result<T, kube::Error>>) -> Result<T, Error> {
    tokio::time::timeout(CALL_TIMEOUT, call).await.map_err(|_| Error::Timeout(CALL_TIMEOUT))?.map_err(Error::from)
}

async fn prune<K>(client: &Client, namespace: &str, name: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match bounded(api.delete(name, &DeleteParams::background())).await {
        Ok(_) => Ok(()),
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

async fn patch_status<K>(client: &Client, object: &K, status: serde_json::Value) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let namespace = object.meta().namespace.clone().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    bounded(api.patch_status(&object.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(body)))
        .await?;
    Ok(())
}

fn error_policy<K: Resource<DynamicType = ()>>(object: Arc<K>, error: &Error, context: Arc<Context>) -> Action {
    context.metrics.reconcile_errors.with_label_values(&[error.metric_label()]).inc();
    let id = object_id(object.as_ref());
    let failures = context.record_failure(&id);
    tracing::warn!(%error, object = %id, failures, "reconcile failed");
    if error.is_transient() { Action::requeue(backoff(failures)) } else { Action::await_change() }
}

/// `Kind/namespace/name`, the key of an object's failure count.
fn object_id<K: Resource<DynamicType = ()>>(object: &K) -> String {
    let meta = object.meta();
    format!(
        "{}/{}/{}",
        K::kind(&()),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

fn succeeded<K: Resource<DynamicType = ()>>(context: &Context, object: &K) {
    let id = object_id(object);
    context.record_success(&id);
}

// === Gateway ===

async fn gateway_controller(context: Arc<Context>) {
    let client = context.client.clone();
    let managed = watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={FIELD_MANAGER}"));
    let changed = &context.stores.changed;
    let inputs_changed = signals(&[
        &changed.models,
        &changed.keys,
        &changed.namespaces,
        &changed.services,
        &changed.key_secrets,
        &changed.credentials,
    ]);
    Controller::for_stream(futures_util::stream::pending(), context.stores.gateways.clone())
        .owns(Api::<Deployment>::all(client.clone()), managed)
        .reconcile_on(context.stores.feeds.gateways.subscribe())
        .reconcile_all_on(once().chain(inputs_changed))
        .with_config(ControllerConfig::default().debounce(DEBOUNCE).concurrency(CONCURRENCY))
        .run(reconcile_gateway, error_policy, context)
        .for_each(|_| futures_util::future::ready(()))
        .await;
}

async fn reconcile_gateway(gateway: Arc<Gateway>, context: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let client = &context.client;
    let namespace = gateway.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = gateway.name_any();
    let verified_as = (gateway.metadata.uid.clone().unwrap_or_default(), gateway.metadata.generation.unwrap_or(0));
    if !context.verified.read().await.contains(&verified_as)
        && let Some(conflict) = crate::ownership::first_conflict(client, &gateway).await?
    {
        return refuse_name_conflict(&context, &gateway, &conflict).await;
    }
    let mut snapshot = Snapshot::take(&context.stores);
    snapshot.fetch_credentials(client, &context.stores, &gateway).await?;
    let mut compiled = snapshot.with_inputs(&gateway, |inputs| compile::gateway(inputs, jiff::Timestamp::now()));
    let compiled_at = started.elapsed();

    let (config_secret, rendered_hash) = render::config_secret::config_secret(&gateway, &compiled.config)?;
    let config_bytes = config_secret.data.as_ref().and_then(|d| d.values().next()).map_or(0, |b| b.0.len());
    // A config that does not fit in a Secret is not written: the pods keep
    // serving the last one, and the Gateway says why.
    let config_fits = config_bytes <= render::config_secret::MAX_CONFIG_BYTES;
    let hash = if config_fits {
        rendered_hash
    } else {
        tracing::warn!(gateway = %ObjectKey::of(&gateway.metadata), config_bytes, "compiled config too large for a Secret; keeping the last one");
        let written = context.written.read().await;
        written.get(&ObjectKey::of(&gateway.metadata)).map(|w| w.hash.clone()).unwrap_or_default()
    };
    let rendered_at = started.elapsed();
    // The unchanged config Secret is not sent again: at 10,000 keys it is
    // 433 KB, and applying it was the largest part of a reconcile.
    let config_current = context
        .stores
        .config_secrets
        .get(&ObjectRef::new(&render::config_secret_name(&gateway)).within(&namespace))
        .is_some_and(|secret| {
            secret.annotations().get(render::CONFIG_HASH_ANNOTATION) == Some(&hash)
                && secret.owner_references().iter().any(|owner| Some(&owner.uid) == gateway.metadata.uid.as_ref())
        });
    let config = async {
        if config_fits && !config_current {
            apply(client, &config_secret).await?;
        }
        Ok::<_, Error>(())
    };
    // Independent objects go together, in two rounds: what others refer to
    // (the ServiceAccount, the Role a RoleBinding names — the API server
    // checks a binding against its Role — and the config) before what refers
    // to them. Every apply of a round runs to its end (join, not try_join):
    // cancelling the Role's apply when the binding failed kept the Role from
    // ever being created.
    let (account, role, binding) =
        (render::rbac::service_account(&gateway), render::rbac::role(&gateway), render::rbac::role_binding(&gateway));
    let (account, role, config) = tokio::join!(apply(client, &account), apply(client, &role), config);
    account?;
    role?;
    config?;
    let hpa = async {
        match render::scaling::hpa(&gateway) {
            Some(hpa) => apply(client, &hpa).await.map(drop),
            None => prune::<HorizontalPodAutoscaler>(client, &namespace, &name).await,
        }
    };
    let pdb = async {
        match render::scaling::pdb(&gateway) {
            Some(pdb) => apply(client, &pdb).await.map(drop),
            None => prune::<PodDisruptionBudget>(client, &namespace, &name).await,
        }
    };
    let (deployment, service) =
        (render::deployment::deployment(&gateway, &context.settings), render::service::service(&gateway));
    let (binding, deployment, service, hpa, pdb) =
        tokio::join!(apply(client, &binding), apply(client, &deployment), apply(client, &service), hpa, pdb);
    let (_, deployment, service, (), ()) = (binding?, deployment?, service?, hpa?, pdb?);
    let applied_at = started.elapsed();
    {
        let mut verified = context.verified.write().await;
        // One entry per live Gateway: its current generation.
        let live: std::collections::BTreeSet<String> =
            context.stores.gateways.state().iter().filter_map(|g| g.metadata.uid.clone()).collect();
        verified.retain(|(uid, _)| *uid != verified_as.0 && live.contains(uid));
        verified.insert(verified_as);
    }

    let reporting = pods_reporting(&context.stores, &gateway);
    let refusing = pods_refusing(&context.stores, &gateway, &hash);
    let ready = deployment.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    let moved = {
        let decisions = decisions(&snapshot, &mut compiled, hash.clone(), config_fits);
        let pods = programmed::Pods { reporting: &reporting, ready };
        let mut all = context.compiled.write().await;
        // A deleted Gateway is never reconciled again: its bookkeeping
        // (megabytes at 10,000 keys) goes when another Gateway compiles.
        all.retain(|key, _| gateway_exists(&context.stores, key));
        let gateway_key = ObjectKey::of(&gateway.metadata);
        let (next, moved) = programmed::next(all.get(&gateway_key), decisions, &pods);
        all.insert(gateway_key, next);
        moved
    };
    for id in moved.keys {
        context.stores.feeds.keys.announce(ObjectRef::new(&id.name).within(&id.namespace));
    }
    for id in moved.models {
        context.stores.feeds.models.announce(ObjectRef::new(&id.name).within(&id.namespace));
    }
    let up_to_date = reporting.iter().filter(|h| **h == hash).count();
    {
        let gateway_key = ObjectKey::of(&gateway.metadata);
        let mut written = context.written.write().await;
        written.retain(|key, _| gateway_exists(&context.stores, key));
        let entry = written.entry(gateway_key.clone()).or_insert_with(|| Written {
            hash: String::new(),
            at: started,
            measured: true,
        });
        if entry.hash != hash {
            tracing::info!(
                gateway = %gateway_key,
                config.hash = %hash,
                models = compiled.config.models.len(),
                keys = compiled.config.keys.len(),
                refused_models = ?compiled.models.iter().filter(|(_, v)| !v.accepted).map(|(k, v)| format!("{k}: {}", v.reason)).collect::<Vec<_>>(),
                "new config written"
            );
            *entry = Written { hash: hash.clone(), at: started, measured: false };
            context.metrics.config_writes.with_label_values(&[&gateway_key.to_string()]).inc();
        } else if !entry.measured && !reporting.is_empty() && up_to_date == reporting.len() {
            entry.measured = true;
            context.metrics.propagation.observe(entry.at.elapsed().as_secs_f64());
        }
    }

    let replicas = deployment.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let wanted = render::scaling::minimum_replicas(&gateway);
    let now = jiff::Timestamp::now();
    let generation = gateway.metadata.generation;
    let previous = gateway.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let conditions = vec![
        match &compiled.gateway {
            None => status::condition(
                &previous,
                types::ACCEPTED,
                true,
                reasons::ACCEPTED,
                "the spec is valid",
                generation,
                now,
            ),
            Some(refused) => status::condition(
                &previous,
                types::ACCEPTED,
                false,
                refused.reason,
                refused.message.clone().into_owned(),
                generation,
                now,
            ),
        },
        if config_fits && refusing.is_empty() {
            status::condition(
                &previous,
                types::PROGRAMMED,
                true,
                reasons::CONFIG_WRITTEN,
                format!("config {} written", hash.get(..12).unwrap_or(&hash)),
                generation,
                now,
            )
        } else if config_fits {
            let (pod, reason, serving) = &refusing[0];
            status::condition(
                &previous,
                types::PROGRAMMED,
                false,
                reasons::CONFIG_REFUSED,
                format!(
                    "{} pod(s) refused config {}; {pod} keeps serving {}: {reason}",
                    refusing.len(),
                    hash.get(..12).unwrap_or(&hash),
                    serving.get(..12).filter(|s| !s.is_empty()).unwrap_or("no config"),
                ),
                generation,
                now,
            )
        } else {
            status::condition(
                &previous,
                types::PROGRAMMED,
                false,
                reasons::CONFIG_ERROR,
                format!(
                    "the compiled config is {config_bytes} bytes gzipped ({} keys, {} models); a Secret holds at most {}: the pods keep the last config",
                    compiled.config.keys.len(),
                    compiled.config.models.len(),
                    render::config_secret::MAX_CONFIG_BYTES
                ),
                generation,
                now,
            )
        },
        status::condition(
            &previous,
            types::READY,
            ready >= wanted,
            if ready >= wanted { reasons::REPLICAS_READY } else { reasons::REPLICAS_NOT_READY },
            format!("{ready} of {wanted} replicas ready"),
            generation,
            now,
        ),
    ];
    let address = service.spec.as_ref().and_then(|s| {
        let port = s.ports.as_ref()?.first()?.port;
        Some(format!("{}:{port}", s.cluster_ip.as_deref()?))
    });
    let new_status = GatewayStatus {
        conditions,
        replicas: Some(replicas),
        ready_replicas: Some(ready),
        up_to_date_replicas: Some(i32::try_from(up_to_date).unwrap_or(i32::MAX)),
        config_hash: Some(hash),
        model_count: Some(i32::try_from(compiled.config.models.len()).unwrap_or(i32::MAX)),
        api_key_count: Some(i32::try_from(compiled.config.keys.len()).unwrap_or(i32::MAX)),
        address,
        observed_generation: generation,
    };
    if gateway_status_changed(gateway.status.as_ref(), &new_status) {
        patch_status(client, gateway.as_ref(), serde_json::to_value(&new_status)?).await?;
        emit_transitions(&context, gateway.as_ref(), &previous, &new_status.conditions).await;
    }
    tracing::debug!(
        gateway = %ObjectKey::of(&gateway.metadata),
        compile_ms = compiled_at.as_secs_f64() * 1e3,
        render_ms = (rendered_at - compiled_at).as_secs_f64() * 1e3,
        apply_ms = (applied_at - rendered_at).as_secs_f64() * 1e3,
        status_ms = (started.elapsed() - applied_at).as_secs_f64() * 1e3,
        "gateway reconciled"
    );
    context.metrics.config_bytes.with_label_values(&[&format!("{namespace}/{name}")]).set(config_bytes as i64);
    context.metrics.reconciles.with_label_values(&["gateway"]).inc();
    context.metrics.reconcile_duration.with_label_values(&["gateway"]).observe(started.elapsed().as_secs_f64());
    succeeded(&context, gateway.as_ref());
    // Compile again when the next key expires, so its status says Expired
    // on time (the pods already refuse it by its expiresAt).
    let next_expiry = compiled
        .config
        .keys
        .iter()
        .filter_map(|k| k.expires_at)
        .filter_map(|at| u64::try_from(at.as_second() - now.as_second()).ok())
        .filter(|seconds| *seconds > 0)
        .min();
    Ok(Action::requeue(next_expiry.map_or(RESYNC, |s| Duration::from_secs(s + 1).min(RESYNC))))
}

/// What `compiled` decided about each object, for the `Programmed`
/// bookkeeping (the verdict maps are moved out of `compiled`: at 10,000
/// keys they are the bulk of it).
fn decisions(
    snapshot: &Snapshot,
    compiled: &mut compile::Compiled,
    hash: String,
    written: bool,
) -> programmed::Compile {
    use std::collections::HashMap;
    use std::fmt::Write as _;
    // Borrowed keys throughout: this runs over every key on every compile.
    let key_generations: HashMap<(&str, &str), Option<i64>> =
        snapshot.keys.iter().map(|k| (ObjectKey::sort_key(&k.metadata), k.metadata.generation)).collect();
    let model_generations: HashMap<(&str, &str), Option<i64>> =
        snapshot.models.iter().map(|m| (ObjectKey::sort_key(&m.metadata), m.metadata.generation)).collect();
    let key_entries: HashMap<&str, u64> =
        compiled.config.keys.iter().map(|k| (k.id.as_str(), programmed::entry_print(k))).collect();
    let model_entries: HashMap<&str, u64> = compiled
        .config
        .models
        .iter()
        .filter_map(|m| Some((m.source.as_deref()?, programmed::entry_print(m))))
        .collect();
    let mut id_text = String::new();
    let mut entry_of = |entries: &HashMap<&str, u64>, id: &ObjectKey| {
        id_text.clear();
        let _ = write!(id_text, "{id}");
        entries.get(id_text.as_str()).copied().unwrap_or(0)
    };
    let turned_off = |reason: &str| reason == reasons::DISABLED || reason == reasons::EXPIRED;
    let mut keys = BTreeMap::new();
    for (id, v) in &compiled.keys {
        let as_intended = v.verdict.accepted || turned_off(v.verdict.reason);
        let generation = key_generations.get(&(id.namespace.as_str(), id.name.as_str())).copied().flatten();
        keys.insert(id.clone(), Decision::new(generation, as_intended, entry_of(&key_entries, id)));
    }
    let mut models = BTreeMap::new();
    for (id, v) in &compiled.models {
        let generation = model_generations.get(&(id.namespace.as_str(), id.name.as_str())).copied().flatten();
        models.insert(id.clone(), Decision::new(generation, v.accepted, entry_of(&model_entries, id)));
    }
    programmed::Compile {
        hash,
        written,
        keys,
        models,
        key_verdicts: std::mem::take(&mut compiled.keys),
        model_verdicts: compiled.models.clone(),
    }
}

fn gateway_exists(stores: &Stores, key: &ObjectKey) -> bool {
    stores.gateways.get(&ObjectRef::new(&key.name).within(&key.namespace)).is_some()
}

/// The config hash each of `gateway`'s pods reports.
fn pods_reporting(stores: &Stores, gateway: &Gateway) -> Vec<String> {
    let namespace = gateway.namespace();
    let name = gateway.name_any();
    stores
        .leases
        .state()
        .iter()
        .filter(|lease| lease.namespace() == namespace && lease.labels().get(render::GATEWAY_LABEL) == Some(&name))
        .map(|lease| holder(lease).to_owned())
        .collect()
}

/// The pods of `gateway` that refused the config `hash`: `(pod, why, the
/// hash they serve instead)`, from their heartbeats.
fn pods_refusing(stores: &Stores, gateway: &Gateway, hash: &str) -> Vec<(String, String, String)> {
    let namespace = gateway.namespace();
    let name = gateway.name_any();
    let mut refusing: Vec<(String, String, String)> = stores
        .leases
        .state()
        .iter()
        .filter(|lease| lease.namespace() == namespace && lease.labels().get(render::GATEWAY_LABEL) == Some(&name))
        .filter(|lease| refused_hash(lease).is_some_and(|refused| refused == hash))
        .map(|lease| {
            let reason = lease.annotations().get(waycast_crds::heartbeat::REFUSED_REASON_ANNOTATION);
            (lease.name_any(), reason.cloned().unwrap_or_default(), holder(lease).to_owned())
        })
        .collect();
    refusing.sort();
    refusing
}

/// The Gateway's status when an object it would own belongs to someone
/// else: nothing is applied, and the status names the object. Looked at
/// again when owned objects change, and every 30 s.
async fn refuse_name_conflict(context: &Context, gateway: &Gateway, conflict: &str) -> Result<Action, Error> {
    tracing::warn!(gateway = %ObjectKey::of(&gateway.metadata), conflict, "an object the Gateway would own exists and is not its own; nothing applied");
    let now = jiff::Timestamp::now();
    let generation = gateway.metadata.generation;
    let previous = gateway.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let message = format!(
        "{conflict} already exists and is not controlled by this Gateway; it is left untouched. Rename the Gateway or remove that object"
    );
    let mut new_status = gateway.status.clone().unwrap_or_default();
    new_status.conditions = [types::ACCEPTED, types::PROGRAMMED, types::READY]
        .into_iter()
        .map(|kind| status::condition(&previous, kind, false, reasons::NAME_CONFLICT, message.clone(), generation, now))
        .collect();
    new_status.observed_generation = generation;
    if gateway_status_changed(gateway.status.as_ref(), &new_status) {
        patch_status(&context.client, gateway, serde_json::to_value(&new_status)?).await?;
        emit_transitions(context, gateway, &previous, &new_status.conditions).await;
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Whether `gateway` serves `object` at `generation` on every pod.
async fn programmed_on(
    context: &Context,
    gateway: &Gateway,
    object: &ObjectKey,
    generation: Option<i64>,
    models: bool,
) -> bool {
    let compiled = context.compiled.read().await;
    let Some(from) = compiled.get(&ObjectKey::of(&gateway.metadata)) else { return false };
    from.programmed(if models { from.models.get(object) } else { from.keys.get(object) }, generation)
}

fn gateway_status_changed(old: Option<&GatewayStatus>, new: &GatewayStatus) -> bool {
    let Some(old) = old else { return true };
    let mut old_without = old.clone();
    let mut new_without = new.clone();
    old_without.conditions.clear();
    new_without.conditions.clear();
    old_without != new_without || status::changed(&old.conditions, &new.conditions)
}

// === ApiKey ===

/// ApiKey and ModelEndpoint statuses. Selection moves with Gateways and
/// namespaces: then every object is looked at. Verdicts and Programmed come
/// from the Gateways' compiles, which announce just the objects whose state
/// moved (`programmed::next`) on `feed`.
async fn status_controller<K, Reconcile, Reconciled>(
    context: Arc<Context>,
    store: Store<K>,
    feed: &Feed<K>,
    reconcile: Reconcile,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    Reconcile: FnMut(Arc<K>, Arc<Context>) -> Reconciled,
    Reconciled: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let changed = &context.stores.changed;
    let inputs_changed = signals(&[&changed.gateways, &changed.namespaces]);
    Controller::for_stream(futures_util::stream::pending(), store)
        .reconcile_on(feed.subscribe())
        .reconcile_all_on(once().chain(futures_util::stream::select(inputs_changed, every(RESYNC))))
        .with_config(ControllerConfig::default().debounce(DEBOUNCE).concurrency(CONCURRENCY))
        .run(reconcile, error_policy, context)
        .for_each(|_| futures_util::future::ready(()))
        .await;
}

/// Generates key Secrets, apart from the status controller: a new ApiKey's
/// key is created at once instead of after a re-check of every other key's
/// status (10,000 of them took tens of seconds).
async fn key_secret_controller(context: Arc<Context>) {
    Controller::for_stream(futures_util::stream::pending(), context.stores.keys.clone())
        .reconcile_on(context.stores.feeds.key_secrets.subscribe())
        .reconcile_all_on(once())
        .with_config(ControllerConfig::default().concurrency(CONCURRENCY))
        .run(reconcile_key_secret, error_policy, context)
        .for_each(|_| futures_util::future::ready(()))
        .await;
}

async fn reconcile_key_secret(api_key: Arc<ApiKey>, context: Arc<Context>) -> Result<Action, Error> {
    ensure_generated_secret(&context.client, &api_key, &context.stores).await?;
    Ok(Action::await_change())
}

/// Creates `<name>-key` with a fresh key when the ApiKey has no `secretRef`
/// and the Secret does not exist yet. An existing key is never replaced.
async fn ensure_generated_secret(client: &Client, api_key: &ApiKey, stores: &Stores) -> Result<(), Error> {
    if api_key.spec.secret_ref.is_some() {
        return Ok(());
    }
    let namespace = api_key.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = keys::generated_secret_name(&api_key.name_any());
    // NB: a lookup, not a scan: scanning every key Secret for every ApiKey
    // was 10,000 × 10,000 comparisons (and 150 million string copies) at scale.
    if stores.key_secrets.get(&ObjectRef::new(&name).within(&namespace)).is_some() {
        return Ok(());
    }
    let mut random = [0_u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random).map_err(|_| Error::Random)?;
    let key = waycast_crds::api_key::key_text_from_bytes(&random);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.clone()),
            labels: Some(BTreeMap::from([(KEY_SECRET_LABEL.to_owned(), "true".to_owned())])),
            owner_references: api_key.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(keys::GENERATED_DATA_KEY.to_owned(), ByteString(key.into_bytes()))])),
        ..Secret::default()
    };
    match bounded(Api::<Secret>::namespaced(client.clone(), &namespace).create(&PostParams::default(), &secret)).await {
        Ok(_) => Ok(()),
        // Created meanwhile (the store lags): keep the existing key.
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

async fn reconcile_api_key(api_key: Arc<ApiKey>, context: Arc<Context>) -> Result<Action, Error> {
    let client = &context.client;
    let id = ObjectKey::of(&api_key.metadata);
    let now = jiff::Timestamp::now();
    let namespaces: Vec<Arc<Namespace>> = context.stores.namespaces.state();
    let namespaces: Vec<&Namespace> = namespaces.iter().map(AsRef::as_ref).collect();
    let mut served_by = Vec::new();
    let mut verdict = None;
    let mut programmed = (0, true);
    let gateways = context.stores.gateways.state();
    let parents =
        parents_of(&gateways, select::Kind::ApiKeys, api_key.as_ref(), &api_key.spec.parent_refs, &namespaces);
    let mut entries = parents.refused;
    for gateway in parents.admitted {
        programmed.0 += 1;
        programmed.1 &= programmed_on(&context, gateway, &id, api_key.metadata.generation, false).await;
        let Some(found) = decided(&context, gateway, |from| {
            from.keys.get(&id).filter(|d| d.generation == api_key.metadata.generation)?;
            from.key_verdicts.get(&id).cloned()
        })
        .await
        else {
            // This Gateway has not compiled this generation yet; its compile
            // announces this key when it has.
            return Ok(Action::await_change());
        };
        let gateway_id = format!("{}/{}", gateway.namespace().unwrap_or_default(), gateway.name_any());
        if found.verdict.accepted {
            served_by.push(gateway_id.clone());
        }
        entries.push(waycast_crds::common::GatewayAcceptance {
            gateway: gateway_id,
            accepted: found.verdict.accepted,
            reason: found.verdict.reason.to_owned(),
            message: found.verdict.message.to_string(),
        });
        if verdict.is_none() || found.verdict.accepted {
            verdict = Some(found);
        }
    }
    entries.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    let (secret_name, _) = keys::key_source(&api_key);
    let (ready, reason, message, prefix) = match (&verdict, entries.first()) {
        (Some(found), _) => {
            (found.verdict.accepted, found.verdict.reason, found.verdict.message.to_string(), found.key_prefix.clone())
        }
        (None, Some(entry)) => (false, reason_of(&entry.reason), format!("{}: {}", entry.gateway, entry.message), None),
        (None, None) => (false, reasons::NO_GATEWAY, "no Gateway selects this key".to_owned(), None),
    };
    let generation = api_key.metadata.generation;
    let previous = api_key.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    served_by.sort();
    let programmed_condition = programmed_condition(&previous, programmed, generation, now);
    let new_status = ApiKeyStatus {
        conditions: vec![
            status::condition(&previous, types::READY, ready, reason, message, generation, now),
            programmed_condition,
        ],
        secret_name: Some(secret_name),
        key_prefix: prefix,
        limits: if ready { api_key.spec.limits.clone() } else { None },
        gateways: served_by,
        parents: entries,
        observed_generation: generation,
    };
    let old = api_key.status.clone().unwrap_or_default();
    let changed = status::changed(&old.conditions, &new_status.conditions)
        || (old.secret_name, old.key_prefix, old.gateways, old.parents, old.limits, old.observed_generation)
            != (
                new_status.secret_name.clone(),
                new_status.key_prefix.clone(),
                new_status.gateways.clone(),
                new_status.parents.clone(),
                new_status.limits.clone(),
                new_status.observed_generation,
            );
    if changed {
        patch_status(client, api_key.as_ref(), serde_json::to_value(&new_status)?).await?;
        emit_transitions(&context, api_key.as_ref(), &previous, &new_status.conditions).await;
    }
    context.metrics.reconciles.with_label_values(&["apikey"]).inc();
    succeeded(&context, api_key.as_ref());
    // Come back when the key expires, to mark it Expired.
    let until_expiry = api_key.spec.expires_at.as_ref().and_then(|t| {
        let seconds = t.0.as_second() - now.as_second();
        u64::try_from(seconds).ok().filter(|s| *s > 0)
    });
    Ok(match until_expiry {
        Some(seconds) if seconds < RESYNC.as_secs() => Action::requeue(Duration::from_secs(seconds + 1)),
        // The periodic look at every key (`every`) comes first.
        _ => Action::await_change(),
    })
}

/// `object`'s parents among the stored Gateways.
fn parents_of<'g, K: Resource>(
    gateways: &'g [Arc<Gateway>],
    kind: select::Kind,
    object: &K,
    parent_refs: &[waycast_crds::common::ParentReference],
    namespaces: &[&Namespace],
) -> select::Parents<'g> {
    let gateways: Vec<&Gateway> = gateways.iter().map(AsRef::as_ref).collect();
    let meta = object.meta();
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    select::parents(&gateways, kind, meta.namespace.as_deref().unwrap_or_default(), labels, parent_refs, namespaces)
}

/// The reason constant equal to `text` (status entries carry owned text;
/// conditions want the constant).
fn reason_of(text: &str) -> &'static str {
    [reasons::NOT_ALLOWED_BY_GATEWAY, reasons::GATEWAY_NOT_FOUND]
        .into_iter()
        .find(|r| *r == text)
        .unwrap_or(reasons::INVALID)
}

/// What `gateway`'s latest compile decided, through `pick`.
async fn decided<T>(context: &Context, gateway: &Gateway, pick: impl FnOnce(&CompiledFrom) -> Option<T>) -> Option<T> {
    let compiled = context.compiled.read().await;
    compiled.get(&ObjectKey::of(&gateway.metadata)).and_then(pick)
}

/// `Programmed`: every selecting Gateway serves the object's current
/// generation on every pod (`(selecting gateways, all programmed)`).
fn programmed_condition(
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    (gateways, all): (usize, bool),
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let (ok, reason, message) = match (gateways, all) {
        (0, _) => (false, reasons::NO_GATEWAY, "no Gateway selects it".to_owned()),
        (n, true) => (true, reasons::PROGRAMMED, format!("every pod of {n} Gateway(s) serves its current version")),
        (n, false) => {
            (false, reasons::PENDING, format!("waiting for the pods of {n} Gateway(s) to apply the new config"))
        }
    };
    status::condition(previous, types::PROGRAMMED, ok, reason, message, generation, now)
}

// === ModelEndpoint ===

async fn reconcile_model_endpoint(endpoint: Arc<ModelEndpoint>, context: Arc<Context>) -> Result<Action, Error> {
    let client = &context.client;
    let id = ObjectKey::of(&endpoint.metadata);
    let now = jiff::Timestamp::now();
    let namespaces: Vec<Arc<Namespace>> = context.stores.namespaces.state();
    let namespaces: Vec<&Namespace> = namespaces.iter().map(AsRef::as_ref).collect();
    let mut programmed = (0, true);
    let gateways = context.stores.gateways.state();
    let parents =
        parents_of(&gateways, select::Kind::ModelEndpoints, endpoint.as_ref(), &endpoint.spec.parent_refs, &namespaces);
    let mut entries = parents.refused;
    for gateway in parents.admitted {
        programmed.0 += 1;
        programmed.1 &= programmed_on(&context, gateway, &id, endpoint.metadata.generation, true).await;
        let Some(verdict) = decided(&context, gateway, |from| {
            from.models.get(&id).filter(|d| d.generation == endpoint.metadata.generation)?;
            from.model_verdicts.get(&id).cloned()
        })
        .await
        else {
            // Not compiled at this generation yet: announced when it is.
            return Ok(Action::await_change());
        };
        entries.push(waycast_crds::model_endpoint::GatewayAcceptance {
            gateway: format!("{}/{}", gateway.namespace().unwrap_or_default(), gateway.name_any()),
            accepted: verdict.accepted,
            reason: verdict.reason.to_owned(),
            message: verdict.message.to_string(),
        });
    }
    entries.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    let generation = endpoint.metadata.generation;
    let previous = endpoint.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let refused = entries.iter().find(|e| !e.accepted);
    let (accepted, reason, message) = match (entries.is_empty(), refused) {
        (true, _) => (false, reasons::NO_GATEWAY, "no Gateway selects this ModelEndpoint".to_owned()),
        (false, Some(entry)) => (false, entry.reason.as_str(), format!("{}: {}", entry.gateway, entry.message)),
        (false, None) => (true, reasons::ACCEPTED, format!("served by {} Gateway(s)", entries.len())),
    };
    let unresolved = entries.iter().find(|e| {
        [reasons::BACKEND_NOT_FOUND, reasons::AUTH_SECRET_MISSING, reasons::SECRET_NOT_LABELLED]
            .contains(&e.reason.as_str())
    });
    let resolved = status::condition(
        &previous,
        types::RESOLVED_REFS,
        unresolved.is_none(),
        unresolved.map_or(reasons::RESOLVED, |e| e.reason.as_str()),
        unresolved.map_or_else(|| "every reference resolved".to_owned(), |e| e.message.clone()),
        generation,
        now,
    );
    let new_status = ModelEndpointStatus {
        conditions: vec![
            status::condition(&previous, types::ACCEPTED, accepted, reason, message, generation, now),
            resolved,
            programmed_condition(&previous, programmed, generation, now),
        ],
        gateways: entries,
        backend_count: Some(i32::try_from(endpoint.spec.backends.len()).unwrap_or(i32::MAX)),
        observed_generation: generation,
    };
    let old = endpoint.status.clone().unwrap_or_default();
    let changed = status::changed(&old.conditions, &new_status.conditions)
        || (old.gateways, old.backend_count, old.observed_generation)
            != (new_status.gateways.clone(), new_status.backend_count, new_status.observed_generation);
    if changed {
        patch_status(client, endpoint.as_ref(), serde_json::to_value(&new_status)?).await?;
        emit_transitions(&context, endpoint.as_ref(), &previous, &new_status.conditions).await;
    }
    context.metrics.reconciles.with_label_values(&["modelendpoint"]).inc();
    succeeded(&context, endpoint.as_ref());
    // Looked at again on changes, announcements and the periodic resync (`every`).
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let delays: Vec<u64> = [1, 2, 3, 4, 9, 10, 50].iter().map(|n| backoff(*n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 256, 300, 300]);
    }
}
