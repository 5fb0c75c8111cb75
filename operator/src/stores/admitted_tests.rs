//! Held-back ApiKeys: what the store keeps of a key no Gateway admits,
//! and the re-list that brings it whole once one does.

use std::time::Duration;

use futures_util::StreamExt as _;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::Event;
use waycast_crds::gateway::{NamespaceFrom, NamespacePolicy, RouteSelector};
use waycast_mock::fixtures::objects;

use super::*;
use crate::compile::keys::is_held_back;

fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    let labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    Namespace {
        metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..ObjectMeta::default() },
        ..Namespace::default()
    }
}

/// A Gateway in `platform` admitting the keys of namespaces labelled `tier: gold`.
fn gold_gateway() -> Gateway {
    let mut gateway = objects::gateway("platform", "shared");
    let selector = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: Some([("tier".to_owned(), "gold".to_owned())].into()),
        ..Default::default()
    };
    gateway.spec.api_keys = Some(RouteSelector {
        namespaces: Some(NamespacePolicy { from: NamespaceFrom::Selector, selector: Some(selector) }),
        selector: None,
    });
    gateway
}

/// A key with all a team may put in it: models, limits, labels and a
/// large annotation.
fn full_key(namespace: &str, name: &str) -> ApiKey {
    let mut key = objects::api_key(namespace, name);
    key.spec.models = Some(vec!["llama-*".into(); 16]);
    key.spec.class = Some("batch".into());
    key.spec.parent_refs = objects::parent("platform", "shared");
    key.metadata.generation = Some(3);
    key.metadata.labels = Some([("team".to_owned(), "x".repeat(63))].into());
    key.metadata.annotations = Some([("note".to_owned(), "y".repeat(200_000))].into());
    key.status = Some(waycast_crds::ApiKeyStatus { observed_generation: Some(3), ..Default::default() });
    key
}

#[test]
fn a_key_no_gateway_admits_keeps_only_its_identity_parents_and_status() {
    let mut held = full_key("team-x", "flood-1");
    view(&mut held, false);
    assert!(is_held_back(&held));
    assert_eq!(held.spec.models, None, "the spec is not kept");
    assert_eq!(held.spec.class, None);
    assert_eq!(held.spec.parent_refs, objects::parent("platform", "shared"), "its status names the parents");
    assert_eq!(held.metadata.labels, None);
    let annotations = held.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations.len(), 1, "only the operator's mark: {annotations:?}");
    assert_eq!(held.metadata.name.as_deref(), Some("flood-1"));
    assert_eq!((held.metadata.generation, held.metadata.uid.as_deref()), (Some(3), Some("uid-team-x-flood-1")));
    assert!(held.status.is_some(), "its status is compared before it is written");
    let whole_size = serde_json::to_vec(&full_key("team-x", "flood-1")).unwrap().len();
    let held_size = serde_json::to_vec(&held).unwrap().len();
    assert!(held_size < 1024 && whole_size > 200_000, "held back: {held_size} bytes, whole: {whole_size}");

    let mut whole = full_key("team-a", "chat");
    view(&mut whole, true);
    assert!(!is_held_back(&whole));
    let json = |key: &ApiKey| serde_json::to_value(key).unwrap();
    assert_eq!(json(&whole), json(&full_key("team-a", "chat")), "an admitted key is kept whole");

    // A team cannot mark its own key held back (and so keep it unserved
    // by a Gateway that admits it, or whole where none does).
    let mut spoofed = full_key("team-a", "spoof");
    spoofed.metadata.annotations = Some([(HELD_BACK_ANNOTATION.to_owned(), "true".to_owned())].into());
    view(&mut spoofed, true);
    assert!(!is_held_back(&spoofed) && spoofed.metadata.annotations.is_none());
}

#[test]
fn a_namespace_is_admitted_by_any_gateway_whose_rules_take_it() {
    let gold = gold_gateway();
    let same = objects::gateway("team-s", "own");
    let gateways = [&gold, &same];
    let labelled = namespace("team-a", &[("tier", "gold")]);
    assert!(admitted(&gateways, "team-a", Some(&labelled)));
    assert!(admitted(&gateways, "team-s", None), "a Gateway's own namespace (Same, the default)");
    assert!(!admitted(&gateways, "platform", None), "Selector: its own namespace only by its labels");
    assert!(!admitted(&gateways, "team-x", Some(&namespace("team-x", &[]))));
    assert!(!admitted(&gateways, "team-x", None), "unknown labels admit nothing by selector");
    assert!(!admitted(&[], "team-a", Some(&labelled)), "no Gateway: nothing");
}

/// Through a real store: a key of a namespace no Gateway admits is held
/// back, and comes whole after the namespace is labelled for a Gateway.
#[tokio::test]
async fn the_store_holds_back_unadmitted_keys_until_a_gateway_admits_their_namespace() {
    let (gateways, mut gateways_writer) = reflector::store::<Gateway>();
    let (namespaces, mut namespaces_writer) = reflector::store::<Namespace>();
    for event in [Event::Init, Event::InitApply(gold_gateway()), Event::InitDone] {
        gateways_writer.apply_watcher_event(&event);
    }
    let team_a = namespace("team-a", &[("tier", "gold")]);
    for event in [Event::Init, Event::InitApply(team_a), Event::InitApply(namespace("team-x", &[])), Event::InitDone] {
        namespaces_writer.apply_watcher_event(&event);
    }
    // team-x's key has no labels: nothing but its view tells the held-back
    // copy from the whole one (the same generation).
    let plain = || {
        let mut key = full_key("team-x", "flood-1");
        (key.metadata.labels, key.metadata.annotations) = (None, None);
        key
    };
    let listed = move || {
        let events =
            [Event::Init, Event::InitApply(full_key("team-a", "chat")), Event::InitApply(plain()), Event::InitDone];
        futures_util::stream::iter(events.into_iter().map(Ok::<_, watcher::Error>))
            .chain(futures_util::stream::pending())
    };
    let (changed, _) = tokio::sync::broadcast::channel(4);
    let changes = crate::stores::signals(&[&changed]);
    let admission = Admission { gateways, namespaces };
    let (hearing, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let listener: crate::stores::Listener<ApiKey> = Box::new(move |key: &ApiKey, _| {
        let _ = hearing.send(key.clone());
    });
    let (store, _) = crate::stores::store_of(admitted_keys(admission, listed, changes), relevant, listener);
    store.wait_until_ready().await.unwrap();
    let get = |namespace: &str, name: &str| store.get(&ObjectRef::new(name).within(namespace)).unwrap();
    assert!(!is_held_back(&get("team-a", "chat")) && get("team-a", "chat").spec.models.is_some());
    let held = get("team-x", "flood-1");
    assert!(is_held_back(&held) && held.spec.models.is_none(), "not kept whole: {held:?}");

    // team-x is labelled gold: the Gateway admits it, the keys are listed again.
    namespaces_writer.apply_watcher_event(&Event::Apply(namespace("team-x", &[("tier", "gold")])));
    changed.send(()).unwrap();
    // Announced (after the store has it) when its fingerprint moves.
    let whole = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(key) = heard.recv().await {
            if key.metadata.namespace.as_deref() == Some("team-x") && !is_held_back(&key) {
                return key;
            }
        }
        panic!("the store stopped")
    })
    .await
    .expect("the key comes whole after its namespace is admitted");
    assert!(!is_held_back(&get("team-x", "flood-1")), "the store has it whole");
    assert_eq!(whole.spec.models, full_key("team-x", "flood-1").spec.models);
}
