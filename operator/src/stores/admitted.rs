//! Which ApiKeys the operator keeps whole: only those of namespaces some
//! Gateway's `spec.apiKeys.namespaces` admits. An ApiKey of any other
//! namespace is kept *held back* — its name, identity, `parentRefs` and
//! status, nothing else of its spec, no labels, no annotations — so that
//! anyone with `edit` in a namespace no Gateway serves cannot fill the
//! operator's memory with whole ApiKeys. When a Gateway (or a namespace's
//! labels) comes to admit a namespace with held-back keys, the ApiKey
//! watch is started again: its re-list brings them whole.
//!
//! ```text
//! ApiKey watch ─► view: admitted? ─ yes ─► whole ─────────────► store
//!      ▲                            └ no ──► held back (marked) ─► store
//!      └── re-list ◄─ Gateways/Namespaces changed and a held-back namespace is now admitted
//! ```
//!
//! It does not decide whether a Gateway serves a key (`compile::select`
//! does, and never serves a held-back one), nor free a key that stops
//! being admitted: that one stays whole until the next re-list.

use std::collections::BTreeSet;

use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use waycast_crds::{ApiKey, ApiKeySpec, Gateway};

use crate::compile::select;

pub use crate::compile::keys::HELD_BACK_ANNOTATION;

/// Whether some Gateway in `gateways` admits ApiKeys of `namespace`
/// (its `spec.apiKeys.namespaces`; `namespace` as the store has it, if
/// it does).
pub fn admitted(gateways: &[&Gateway], namespace: &str, labelled: Option<&Namespace>) -> bool {
    let namespaces: Vec<&Namespace> = labelled.into_iter().collect();
    gateways.iter().any(|gateway| {
        let home = gateway.metadata.namespace.as_deref().unwrap_or_default();
        let policy = gateway.spec.api_keys.as_ref().and_then(|p| p.namespaces.as_ref());
        select::namespace_admitted(policy, home, namespace, &namespaces)
    })
}

/// `key` as kept: whole when `admitted`, else held back. An annotation
/// claiming to be held back is dropped from every key first (it is the
/// operator's mark, not a team's).
pub fn view(key: &mut ApiKey, admitted: bool) {
    if let Some(annotations) = key.metadata.annotations.as_mut() {
        annotations.remove(HELD_BACK_ANNOTATION);
        if annotations.is_empty() {
            key.metadata.annotations = None;
        }
    }
    if admitted {
        return;
    }
    let meta = std::mem::take(&mut key.metadata);
    key.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp,
        deletion_timestamp: meta.deletion_timestamp,
        annotations: Some([(HELD_BACK_ANNOTATION.to_owned(), "true".to_owned())].into()),
        ..ObjectMeta::default()
    };
    // NB: `parentRefs` stay (16 at most): the key's status names the
    // Gateways it asks for that do not admit its namespace.
    let parent_refs = std::mem::take(&mut key.spec.parent_refs);
    key.spec = ApiKeySpec { parent_refs, ..ApiKeySpec::default() };
}

/// What the ApiKey store compares to announce a key: its spec (by
/// generation), labels, deletion — and whether it is held back, so that a
/// key coming whole with a re-list is announced (same generation, and
/// perhaps no labels to tell it by) and gets its Secret and compile.
pub fn relevant(key: &ApiKey) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (super::changes::spec_and_labels(key), crate::compile::keys::is_held_back(key)).hash(&mut hasher);
    hasher.finish()
}

/// What decides a key's view: the Gateways and Namespaces as stored.
#[derive(Clone)]
pub struct Admission {
    /// Gateways (their `spec.apiKeys.namespaces`).
    pub gateways: Store<Gateway>,
    /// Namespaces (their labels, for `Selector`).
    pub namespaces: Store<Namespace>,
}

impl Admission {
    /// Whether some Gateway admits ApiKeys of `namespace` now.
    pub fn admits(&self, namespace: &str) -> bool {
        let gateways = self.gateways.state();
        let gateways: Vec<&Gateway> = gateways.iter().map(AsRef::as_ref).collect();
        let labelled = self.namespaces.get(&ObjectRef::new(namespace));
        admitted(&gateways, namespace, labelled.as_deref())
    }
}

type Events = BoxStream<'static, Result<watcher::Event<ApiKey>, watcher::Error>>;

/// The ApiKey events of `watch()`, each key through [`view`] by
/// `admission`; on each of `changes` (Gateways or Namespaces moved), a new
/// `watch()` — a re-list — when a namespace with held-back keys is now
/// admitted. Start it once both of `admission`'s stores have listed, or
/// every key is held back until they have.
///
/// NB: it does not wait for them itself: a store's readiness wakes only
/// the latest task waiting for it (kube-runtime's `DelayedInit` keeps one
/// waker), and the operator's start waits for every store.
pub fn admitted_keys<W, S>(
    admission: Admission,
    watch: W,
    changes: impl Stream<Item = ()> + Send + 'static,
) -> impl Stream<Item = Result<watcher::Event<ApiKey>, watcher::Error>> + Send + 'static
where
    W: Fn() -> S + Send + 'static,
    S: Stream<Item = Result<watcher::Event<ApiKey>, watcher::Error>> + Send + 'static,
{
    struct State<W> {
        admission: Admission,
        watch: W,
        events: Option<Events>,
        changes: BoxStream<'static, ()>,
        held_back: BTreeSet<String>,
    }
    let state = State { admission, watch, events: None, changes: changes.boxed(), held_back: BTreeSet::new() };
    futures_util::stream::unfold(state, |mut state| async move {
        if state.events.is_none() {
            state.events = Some((state.watch)().boxed());
        }
        loop {
            let events = state.events.as_mut()?;
            tokio::select! {
                event = events.next() => {
                    let event = event?;
                    let event = event.map(|event| {
                        event.modify(|key| {
                            let namespace = key.metadata.namespace.clone().unwrap_or_default();
                            let admitted = state.admission.admits(&namespace);
                            view(key, admitted);
                            if !admitted {
                                state.held_back.insert(namespace);
                            }
                        })
                    });
                    return Some((event, state));
                }
                Some(()) = state.changes.next() => {
                    let admitted: Vec<&String> =
                        state.held_back.iter().filter(|namespace| state.admission.admits(namespace)).collect();
                    if let Some(first) = admitted.first() {
                        tracing::info!(
                            namespace = %first,
                            namespaces = admitted.len(),
                            "a Gateway now admits namespaces with held-back ApiKeys: listing ApiKeys again"
                        );
                        state.held_back.clear();
                        state.events = Some((state.watch)().boxed());
                    }
                }
            }
        }
    })
}

#[cfg(test)]
#[path = "admitted_tests.rs"]
mod tests;
