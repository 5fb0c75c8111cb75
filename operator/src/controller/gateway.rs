//! The Gateway reconciler: stores → compile → render → apply → status.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};
use waycast_crds::Gateway;
use waycast_crds::condition::reasons;

use super::config_writer::{NotWritten, Whole, WholeWritten, Writers};
use super::memory::{remember, verified_as};
use super::referenced::fetch_secrets;
use super::shell::{CONCURRENCY, DEBOUNCE, RESYNC, error_policy, succeeded, write_status};
use crate::catalog::Catalog;
use crate::compile::{self, ObjectKey};
use crate::config_plan;
use crate::context::{Context, Written};
use crate::error::Error;
use crate::heartbeats;
use crate::programmed;
use crate::render::config_parts::{Layout, Layouts, TooLarge, fresh_salt};
use crate::render::key_patch::{Basis, Kept};
use crate::render::{self, FIELD_MANAGER};
use crate::status;
use crate::stores::{Stores, once, signals};
use crate::telemetry::Reconcile;

pub(crate) async fn gateway_controller(context: Arc<Context>, writers: Arc<Writers>) {
    let client = context.client.clone();
    let managed = watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={FIELD_MANAGER}"));
    let changed = &context.stores.changed;
    let mut senders =
        vec![&changed.models, &changed.keys, &changed.namespaces, &changed.key_secrets, &changed.credentials];
    senders.extend(context.networks.changed.as_ref());
    // A team owns its Services: one it rewrites in a loop costs every
    // Gateway at most a reconcile a second.
    let services = at_most_every(signals(&[&changed.services]), super::endpoints::CHURN_INTERVAL);
    let inputs_changed = futures_util::stream::select(signals(&senders), services);
    let gateways = context.stores.gateways.clone();
    let (objects, paced) = context.stores.feeds.gateways.subscribe(gateways.clone(), once().chain(inputs_changed));
    Controller::for_stream(futures_util::stream::pending(), gateways)
        .owns(Api::<Deployment>::all(client.clone()), managed)
        .reconcile_on(objects)
        .with_config(ControllerConfig::default().debounce(DEBOUNCE).concurrency(CONCURRENCY))
        .run(move |gateway, context| reconcile_gateway(gateway, context, writers.clone()), error_policy, context)
        .for_each(|reported| {
            paced.finished(&reported);
            futures_util::future::ready(())
        })
        .await;
}

/// `signals`, each let through at most once per `interval` (the first at
/// once).
fn at_most_every(
    signals: impl futures_util::Stream<Item = ()> + Send + 'static,
    interval: Duration,
) -> impl futures_util::Stream<Item = ()> + Send + 'static {
    let start = (signals.boxed(), None::<tokio::time::Instant>);
    futures_util::stream::unfold(start, move |(mut signals, last)| async move {
        if let Some(last) = last {
            tokio::time::sleep_until(last + interval).await;
        }
        signals.next().await?;
        Some(((), (signals, Some(tokio::time::Instant::now()))))
    })
}

/// A Gateway's reconcile, and its span when the operator traces
/// (`--otlp-endpoint`): its outcome is known once it returns, by any path.
pub(crate) async fn reconcile_gateway(
    gateway: Arc<Gateway>,
    context: Arc<Context>,
    writers: Arc<Writers>,
) -> Result<Action, Error> {
    let mut traced = Reconcile::begin(&gateway);
    let reconciled = reconcile(gateway, context.clone(), &writers, &mut traced).await;
    if let Some(traces) = &context.traces {
        traces.reconciled(&traced, reconciled.as_ref().map(|_| ()));
    }
    reconciled
}

/// Stores → compile → desired objects → apply → status, and the
/// bookkeeping that tells ApiKeys and ModelEndpoints where they stand;
/// what it learns on the way is noted in `traced`.
async fn reconcile(
    gateway: Arc<Gateway>,
    context: Arc<Context>,
    writers: &Writers,
    traced: &mut Reconcile,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let key = ObjectKey::of(&gateway.metadata);
    if let Some(conflict) = owned_by_another(&context, &gateway).await? {
        // Its writer writes nothing of a Gateway whose objects are not its own.
        writers.forget(&key).await;
        return refuse_name_conflict(&context, &gateway, &conflict).await;
    }
    // Every key change logged before this position is in the stores read
    // below; its writer patches in those logged after it before writing.
    let read_started = std::time::Instant::now();
    let read_at = context.stores.key_log.drained().await.position();
    // One snapshot of the key sets for the compile and the status both.
    let key_sets = context.key_sets.load();
    let mut catalog = Catalog::from_stores(&context.stores, &context.networks, &key_sets);
    fetch_secrets(&mut catalog, &context, &gateway).await?;
    let layouts = layouts(&context.stores, &gateway, fresh_salt_of(&context, &gateway).await?);
    // NB: off the runtime's one thread: at 100,000 keys this is about a
    // second, and the key lane and the stores' watches go on meanwhile.
    // One Gateway's at a time, as on that thread: a compile's working set
    // is the operator's peak.
    let (settings, compiling) = (context.settings.clone(), gateway.clone());
    let one_at_a_time = COMPILING.acquire().await.map_err(|_| Error::Incomplete("the compile permit"))?;
    let (catalog, mut compiled, mut desired, left_out) =
        tokio::task::spawn_blocking(move || compile_and_render(catalog, &compiling, &layouts, &settings))
            .await
            .map_err(|joined| Error::Io(std::io::Error::other(joined)))??;
    drop(one_at_a_time);
    (traced.keys, traced.models) = (Some(compiled.config.keys.len()), Some(compiled.config.models.len()));
    let compiled_at = started.elapsed();

    let checked_unseen = match foreign_part(&context, &gateway, &desired).await? {
        Ok(checked) => checked,
        Err(conflict) => {
            writers.forget(&key).await;
            return refuse_name_conflict(&context, &gateway, &conflict).await;
        }
    };
    let write_endpoints = endpoints_to_write(&context, &gateway, &desired).await;
    let rendered_at = started.elapsed();
    let endpoints_current = crate::apply::apply_referred(&context.client, &desired, write_endpoints).await?;
    // The parts are their writer's from here (a copy held here would make
    // its next patch copy them): only what the status needs stays.
    let config = std::mem::replace(&mut desired.config, Err(TooLarge::Json { bytes: 0 }));
    let (fits, json_bytes, too_large) =
        (config.is_ok(), config.as_ref().ok().map(|p| p.json_bytes), config.as_ref().err().cloned());
    let writing = async {
        let Ok(parts) = config else {
            writers.forget(&key).await;
            return Ok(None);
        };
        let kept = keepable(&gateway, &compiled, left_out).then(|| {
            let basis =
                Basis { gateway: verified_as(&gateway), position: read_at, tenants: !gateway.spec.tenants.is_empty() };
            Kept::new(parts.clone(), &compiled.config.keys, basis)
        });
        let whole = Whole { gateway: gateway.clone(), parts, kept, read_at, read_started, checked_unseen };
        writers.write_whole(whole).await.map(Some)
    };
    let (written, rest) = tokio::join!(writing, crate::apply::apply_rest(&context.client, &desired));
    let config_written = match written {
        Ok(written) => written,
        Err(NotWritten::CompileAgain) => {
            tracing::debug!(gateway = %key, "the key lane wrote changes this compile cannot take in; compiling again");
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        Err(NotWritten::Conflict(conflict)) => {
            writers.forget(&key).await;
            return refuse_name_conflict(&context, &gateway, &conflict).await;
        }
        Err(NotWritten::Failed(error)) => return Err(error),
    };
    let (hash, bytes_written) = match config_written {
        Some(WholeWritten { hash, verdicts, bytes }) => {
            // The keys patched in were compiled again: theirs are the verdicts.
            compiled.keys.extend(verdicts);
            (hash, bytes)
        }
        None => {
            tracing::warn!(gateway = %key, too_large = ?too_large, "compiled config too large for its Secrets; keeping the last one");
            (last_written_hash(&context, &key).await, 0)
        }
    };
    traced.config_hash = (!hash.is_empty()).then(|| hash.clone());
    let observed = rest?;
    let applied_at = started.elapsed();

    let beats = heartbeats::heartbeats(&context.stores.leases, &context.stores.gateway_pods, &gateway);
    // Off the runtime's one thread, as the compile (each object's decision).
    let settling = hash.clone();
    let (compiled, settled) = tokio::task::spawn_blocking(move || {
        let settled = programmed::settle(&catalog, &mut compiled, &beats, &settling, fits);
        (compiled, settled)
    })
    .await
    .map_err(|joined| Error::Io(std::io::Error::other(joined)))?;
    let deployment_status = observed.deployment.status.as_ref();
    let ready = deployment_status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let endpoints_written = endpoints_current.then(|| desired.endpoints_hash.clone());
    let moved = remember_reconcile(
        &context,
        &gateway,
        &desired,
        endpoints_written,
        &compiled,
        settled.decisions,
        &settled.reporting,
        ready,
        started,
    )
    .await;
    super::statuses::announce(&context, moved);
    let now = jiff::Timestamp::now();
    let facts = status::GatewayFacts {
        refused: compiled.gateway.as_ref(),
        hash: &hash,
        too_large: too_large.as_ref(),
        left_out,
        models: compiled.config.models.len(),
        keys: compiled.config.keys.len(),
        refusing: &settled.refusing,
        up_to_date: settled.up_to_date,
        replicas: deployment_status.and_then(|s| s.replicas).unwrap_or(0),
        ready,
        wanted: render::scaling::minimum_replicas(&gateway),
        address: observed.service.spec.as_ref().and_then(|s| {
            let port = s.ports.as_ref()?.first()?.port;
            Some(format!("{}:{port}", s.cluster_ip.as_deref()?))
        }),
        tenants: &compiled.tenants,
        identity: crate::key_sets::status_of(&gateway, &key_sets),
    };
    let written = status::gateway_status(&gateway, &facts, now);
    write_status(&context, gateway.as_ref(), gateway.status.as_ref(), &written).await?;
    context.metrics.show_conditions(&key.to_string(), &written.conditions);
    tracing::debug!(
        gateway = %key,
        compile_ms = compiled_at.as_secs_f64() * 1e3,
        render_ms = (rendered_at - compiled_at).as_secs_f64() * 1e3,
        apply_ms = (applied_at - rendered_at).as_secs_f64() * 1e3,
        status_ms = (started.elapsed() - applied_at).as_secs_f64() * 1e3,
        "gateway reconciled"
    );
    let metrics = &context.metrics;
    if let Some(json_bytes) = json_bytes {
        metrics.config_bytes.with_label_values(&[&key.to_string()]).set(json_bytes as i64);
    }
    metrics.config_bytes_written.with_label_values(&[&key.to_string()]).inc_by(bytes_written as u64);
    metrics.reconciles.with_label_values(&["gateway"]).inc();
    metrics.reconcile_duration.with_label_values(&["gateway"]).observe(started.elapsed().as_secs_f64());
    succeeded(&context, gateway.as_ref());
    Ok(Action::requeue(until_next_expiry(&compiled.config, now)))
}

/// Held while a Gateway compiles.
static COMPILING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Compile, fit and render: the costly and pure part of a reconcile. One
/// split serves both whether the config fits and what its Secrets are;
/// only a config that does not fit is split again as entries are left out.
///
/// # Errors
/// Serialization or compression into memory failed (they do not).
fn compile_and_render(
    mut catalog: Catalog,
    gateway: &Gateway,
    layouts: &Layouts,
    settings: &render::RenderSettings,
) -> Result<(Catalog, compile::Compiled, render::Desired, usize), Error> {
    let mut compiled = catalog.compile(gateway, jiff::Timestamp::now());
    let mut checked = render::config_parts::check(&compiled.config, layouts)?;
    let left_out = if checked.fits() {
        0
    } else {
        let left_out = fit_in_secret(&catalog, gateway, layouts, &mut compiled);
        checked = render::config_parts::check(&compiled.config, layouts)?;
        left_out
    };
    let endpoints = catalog.endpoints(&compiled.config);
    let desired = render::desired_checked(gateway, &compiled.config, checked, layouts, &endpoints, settings)?;
    // What follows reads only the models: the ApiKeys and key Secrets held
    // until the reconcile's end kept a second copy of each ApiKey its
    // status write replaced meanwhile (at 100,000 keys, up to the store's
    // size again).
    (catalog.keys, catalog.key_secrets) = (Vec::new(), Vec::new());
    Ok((catalog, compiled, desired, left_out))
}

/// Leaves out the newest objects while the config outgrows its Secrets
/// (`compile::fit`): how many.
fn fit_in_secret(
    catalog: &Catalog,
    gateway: &Gateway,
    layouts: &render::config_parts::Layouts,
    compiled: &mut compile::Compiled,
) -> usize {
    use std::collections::HashMap;
    let seconds = |meta: &kube::api::ObjectMeta| meta.creation_timestamp.as_ref().map(|t| t.0.as_second());
    let models: HashMap<(&str, &str), Option<i64>> =
        catalog.models.iter().map(|m| (ObjectKey::sort_key(&m.metadata), seconds(&m.metadata))).collect();
    let keys: HashMap<(&str, &str), Option<i64>> =
        catalog.keys.iter().map(|k| (ObjectKey::sort_key(&k.metadata), seconds(&k.metadata))).collect();
    let created = |kind, id: &ObjectKey| {
        let table = if kind == compile::fit::Kind::Model { &models } else { &keys };
        table.get(&(id.namespace.as_str(), id.name.as_str())).copied().flatten()
    };
    let namespace = gateway.namespace().unwrap_or_default();
    let left_out =
        compile::fit::fit(compiled, &namespace, created, |config| render::config_parts::fits(config, layouts));
    if left_out > 0 {
        tracing::warn!(gateway = %ObjectKey::of(&gateway.metadata), left_out, "the config outgrew its Secrets; the newest objects are left out");
    }
    left_out
}

/// An object the Gateway would own that another controller owns, if any:
/// looked up once per Gateway generation (`GatewayMemory::verified`).
async fn owned_by_another(context: &Context, gateway: &Gateway) -> Result<Option<String>, Error> {
    let key = ObjectKey::of(&gateway.metadata);
    let verified = context.gateways.read().await.get(&key).and_then(|memory| memory.verified.clone());
    if verified == Some(verified_as(gateway)) {
        return Ok(None);
    }
    crate::ownership::first_conflict(&context.client, gateway).await
}

/// The config Secrets of the Gateway's namespace the store holds
/// (metadata: the digest each is annotated with, its owner).
fn config_secrets_of(stores: &Stores, gateway: &Gateway) -> Vec<Arc<PartialObjectMeta<Secret>>> {
    let namespace = gateway.namespace();
    stores.config_secrets.state().into_iter().filter(|secret| secret.metadata.namespace == namespace).collect()
}

/// The salt a new layout of this Gateway takes: drawn here, in the shell
/// (render is free of randomness), once per Gateway and kept in its memory.
///
/// # Errors
/// The OS random number generator failed.
async fn fresh_salt_of(context: &Context, gateway: &Gateway) -> Result<String, Error> {
    let key = ObjectKey::of(&gateway.metadata);
    if let Some(salt) = context.gateways.read().await.get(&key).and_then(|memory| memory.fresh_salt.clone()) {
        return Ok(salt);
    }
    let salt = fresh_salt(&ring::rand::SystemRandom::new()).map_err(|_| Error::Random)?;
    context.gateways.write().await.entry(key).or_default().fresh_salt = Some(salt.clone());
    Ok(salt)
}

/// The layout of the config last written for this Gateway (from its
/// manifest Secret's annotations in the store), and the salt for a new
/// layout.
fn layouts(stores: &Stores, gateway: &Gateway, fresh_salt: String) -> Layouts {
    let namespace = gateway.namespace().unwrap_or_default();
    let manifest = stores.config_secrets.get(&ObjectRef::new(&render::config_secret_name(gateway)).within(&namespace));
    let current = manifest
        .filter(|secret| !crate::ownership::foreign(&secret.metadata, gateway.metadata.uid.as_deref().unwrap_or("")))
        .and_then(|secret| Layout::from_annotations(secret.annotations()));
    Layouts { current, fresh_salt }
}

/// Whether the endpoints ConfigMap needs writing: not when this very
/// Gateway's was written with the same hash (one deleted and made again
/// under its name gets its ConfigMap anew: the old one went with it).
async fn endpoints_to_write(context: &Context, gateway: &Gateway, desired: &render::Desired) -> bool {
    let key = ObjectKey::of(&gateway.metadata);
    let gateways = context.gateways.read().await;
    let memory = gateways.get(&key);
    let uid = gateway.metadata.uid.as_ref();
    let same_gateway = memory.and_then(|m| m.verified.as_ref()).is_some_and(|(verified, _)| uid == Some(verified));
    let written = memory.filter(|_| same_gateway).and_then(|m| m.endpoints_written.as_deref());
    written != Some(desired.endpoints_hash.as_str())
}

/// The hash of the config last written for the Gateway: what its pods
/// serve while a new one is too large to write.
async fn last_written_hash(context: &Context, key: &ObjectKey) -> String {
    let gateways = context.gateways.read().await;
    gateways.get(key).and_then(|memory| memory.written.as_ref()).map(|written| written.hash.clone()).unwrap_or_default()
}

/// Whether a compiled config can be kept to patch: nothing left out, no
/// two keys with one digest, and no namespace's keys capped.
fn keepable(gateway: &Gateway, compiled: &compile::Compiled, left_out: usize) -> bool {
    let duplicates = compiled.keys.values().any(|key| key.verdict.reason == reasons::DUPLICATE_KEY);
    // NB: which keys a `maxApiKeys` cap serves is decided among all of a
    // namespace's keys, oldest first (a key compiled alone would take a
    // place it may not have): a Gateway with a cap is written whole only.
    let capped = gateway.spec.tenants.iter().any(|policy| policy.max_api_keys.is_some());
    left_out == 0 && !duplicates && !capped
}

/// A config Secret about to be written that the store does not show as
/// the Gateway's own and that exists under another owner, if any
/// (`Err`): looked up only for such Secrets (a first write, a new shard
/// count), before anything is applied. Else the names looked up.
async fn foreign_part(
    context: &Context,
    gateway: &Gateway,
    desired: &render::Desired,
) -> Result<Result<Vec<String>, String>, Error> {
    let Ok(parts) = &desired.config else { return Ok(Ok(Vec::new())) };
    let store = config_secrets_of(&context.stores, gateway);
    let existing: Vec<_> = store.iter().filter_map(|secret| config_plan::Existing::of(&secret.metadata)).collect();
    let uid = gateway.metadata.uid.as_deref().ok_or(Error::Incomplete("uid"))?;
    // Which parts the store shows as the Gateway's own does not hang on
    // their digests: the writer's plan names the same ones.
    let unseen = config_plan::plan(parts, &existing, uid).unseen;
    if unseen.is_empty() {
        return Ok(Ok(unseen));
    }
    let namespace = gateway.namespace().ok_or(Error::Incomplete("namespace"))?;
    let foreign = crate::ownership::first_foreign_secret(&context.client, &namespace, &unseen, uid).await?;
    Ok(foreign.map_or(Ok(unseen), Err))
}

/// Everything a reconcile leaves to remember of its Gateway, under one
/// lock: this generation owns what it applied; the endpoints written and
/// the Services they are of; this compile's decisions (returning the
/// objects whose status moved); when a new config was written, and how
/// long it took to reach every pod once they all report it.
#[allow(clippy::too_many_arguments, reason = "each is one fact of the reconcile, named")]
async fn remember_reconcile(
    context: &Context,
    gateway: &Gateway,
    desired: &render::Desired,
    endpoints_written: Option<String>,
    compiled: &compile::Compiled,
    decisions: programmed::Compile,
    reporting: &[String],
    ready: i32,
    started: std::time::Instant,
) -> programmed::Moved {
    let key = ObjectKey::of(&gateway.metadata);
    let hash = decisions.hash.clone();
    remember(context, &key, |memory| {
        memory.verified = Some(verified_as(gateway));
        if endpoints_written.is_some() {
            memory.endpoints_written = endpoints_written;
        }
        memory.services = desired.services.clone();
        let (next, moved) =
            programmed::next(memory.compiled.as_ref(), decisions, &programmed::Pods { reporting, ready });
        memory.compiled = Some(next);
        let up_to_date = reporting.iter().filter(|h| **h == hash).count();
        let entry = memory.written.get_or_insert_with(|| Written { hash: String::new(), at: started, measured: true });
        if entry.hash != hash {
            tracing::info!(
                gateway = %key,
                config.hash = %hash,
                models = compiled.config.models.len(),
                keys = compiled.config.keys.len(),
                "new config written"
            );
            *entry = Written { hash: hash.clone(), at: started, measured: false };
            context.metrics.config_writes.with_label_values(&[&key.to_string()]).inc();
        } else if !entry.measured && !reporting.is_empty() && up_to_date == reporting.len() {
            entry.measured = true;
            context.metrics.propagation.observe(entry.at.elapsed().as_secs_f64());
        }
        moved
    })
    .await
}

/// Compile again when the next key expires, so its status says Expired on
/// time (the pods already refuse it by its expiresAt); else at the resync.
fn until_next_expiry(config: &waycast_crds::GatewayConfig, now: jiff::Timestamp) -> Duration {
    let next_expiry = config
        .keys
        .iter()
        .filter_map(|k| k.expires_at)
        .filter_map(|at| u64::try_from(at.as_second() - now.as_second()).ok())
        .filter(|seconds| *seconds > 0)
        .min();
    next_expiry.map_or(RESYNC, |s| Duration::from_secs(s + 1).min(RESYNC))
}

/// The Gateway's status when an object it would own belongs to someone
/// else: nothing is applied, and the status names the object. Looked at
/// again when owned objects change, and every 30 s.
pub(crate) async fn refuse_name_conflict(
    context: &Context,
    gateway: &Gateway,
    conflict: &str,
) -> Result<Action, Error> {
    tracing::warn!(gateway = %ObjectKey::of(&gateway.metadata), conflict, "an object the Gateway would own exists and is not its own; nothing applied");
    let refused = status::gateway_name_conflict(gateway, conflict, jiff::Timestamp::now());
    write_status(context, gateway, gateway.status.as_ref(), &refused).await?;
    context.metrics.show_conditions(&ObjectKey::of(&gateway.metadata).to_string(), &refused.conditions);
    Ok(Action::requeue(Duration::from_secs(30)))
}
