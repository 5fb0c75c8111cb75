//! The operator under a burst: 300 ApiKeys applied at once are coalesced
//! into a handful of config writes, and one more key afterwards does not
//! rewrite the others' statuses. Its own test binary (and cluster), so
//! the burst's load does not skew the propagation timings measured in
//! `operator.rs`.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use waycast_crds::{ApiKey, Gateway};
use waycast_e2e::harness::{condition_true, operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest;
use waycast_e2e::wait::{Seen, await_condition, await_object, await_object_condition, condition, within};

#[tokio::test]
async fn a_burst_of_keys_is_coalesced_into_a_handful_of_config_writes() {
    use futures_util::StreamExt as _;
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let namespace = test_namespace(&client, "operator-burst").await.unwrap();
    manifest::apply_all(&client, &waycast_e2e::workloads::quickstart().unwrap(), &namespace).await.unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &namespace);
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(200));
    await_object(&gateways, "gateway", "2 ready replicas", patience, |gateway| {
        let ready = gateway.status.as_ref().and_then(|s| s.ready_replicas);
        Seen::when(ready == Some(2), ready)
    })
    .await
    .unwrap();

    // Count writes to the config Secret while the burst lands: it holds
    // the manifest, written once per new config (after the parts it
    // names).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let watch = kube::runtime::watcher::watcher(
        secrets,
        kube::runtime::watcher::Config::default().fields("metadata.name=gateway-config"),
    );
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    // A watch error could hide writes (a re-list reports state, not each
    // write): counted, and the test fails on any.
    let watch_errors = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = {
        let (writes, watch_errors) = (writes.clone(), watch_errors.clone());
        tokio::spawn(async move {
            let mut seen = std::collections::BTreeSet::new();
            let mut events = watch.boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(kube::runtime::watcher::Event::Apply(secret))
                        if seen.insert(secret.metadata.resource_version.clone()) =>
                    {
                        writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(error) => {
                        eprintln!("config Secret watch: {error}");
                        watch_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = writes.load(std::sync::atomic::Ordering::Relaxed);
    let count = 300;
    let started = Instant::now();
    let objects: Vec<_> = (0..count)
        .map(|i| serde_json::from_value(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": format!("burst-{i}")}, "spec": {}})).unwrap())
        .collect();
    manifest::apply_all(&client, &objects, &namespace).await.unwrap();
    await_object(&gateways, "gateway", "every key of the burst served", within(Duration::from_secs(120)), |gateway| {
        let keys = gateway.status.as_ref().and_then(|s| s.api_key_count);
        Seen::when(keys == Some(count + 1), keys)
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let config_writes = writes.load(std::sync::atomic::Ordering::Relaxed) - before;
    let written = waycast_e2e::config_secrets::read_config(&client, &namespace, "gateway-config").await.unwrap();
    assert_eq!(written.config.keys.len(), count as usize + 1, "the config's Secrets assemble to every key");
    counter.abort();
    eprintln!(
        "{count} ApiKeys applied → all served in {:?} with {config_writes} config Secret writes",
        started.elapsed()
    );
    assert_eq!(watch_errors.load(std::sync::atomic::Ordering::Relaxed), 0, "the write count may be short");
    assert!(config_writes >= 1, "the burst was served without a config write: the counter saw nothing");
    assert!(config_writes <= 20, "{config_writes} config writes for a burst of {count} keys");

    // More keys once all are Programmed: each new config carries the others
    // unchanged, so their statuses are not written again (they were all
    // flipped to Programmed=False and back on every config change).
    let keys: Api<ApiKey> = Api::namespaced(client.clone(), &namespace);
    let programmed = |key: &ApiKey| key.status.as_ref().is_some_and(|s| condition_true(&s.conditions, "Programmed"));
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(200));
    let versions = await_condition("every ApiKey is Programmed", patience, async || {
        let listed = keys.list(&ListParams::default()).await.unwrap().items;
        if listed.len() == count as usize + 1 && listed.iter().all(programmed) {
            return Seen::Done(
                listed
                    .into_iter()
                    .map(|k| (k.metadata.name.unwrap_or_default(), k.metadata.resource_version))
                    .collect::<std::collections::BTreeMap<_, _>>(),
            );
        }
        let waiting = listed.iter().filter(|k| !programmed(k)).count();
        Seen::NotYet(format!("{} listed, {waiting} not Programmed", listed.len()))
    })
    .await
    .unwrap();
    // Two more, one after the other: the second one's status is written
    // after every status the first one's config change led to (the
    // operator announces the objects a config moved before it goes on), so
    // once it is Programmed, a rewrite caused by the first has happened.
    for name in ["one-more", "two-more"] {
        let extra: ApiKey = serde_json::from_value(
            json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": name, "namespace": &namespace}, "spec": {}}),
        )
        .unwrap();
        keys.create(&PostParams::default(), &extra).await.unwrap();
        await_object_condition(&keys, name, &condition("Programmed"), within(Duration::from_secs(60))).await.unwrap();
    }
    let rewritten: Vec<String> = keys
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|k| {
            let name = k.metadata.name?;
            let before = versions.get(&name)?;
            (*before != k.metadata.resource_version).then_some(name)
        })
        .collect();
    assert!(rewritten.is_empty(), "adding keys rewrote {} other ApiKeys: {rewritten:?}", rewritten.len());
}
