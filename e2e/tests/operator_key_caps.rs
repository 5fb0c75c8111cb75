//! Bounded ApiKeys on a real control plane: a Gateway's
//! `tenants[].maxApiKeys` leaves the newest keys of a namespace past its
//! cap out (`TenantKeyLimit` on the key's entry for that Gateway) while
//! another namespace is served in full; a key of a namespace no Gateway
//! admits gets no generated Secret until a Gateway admits it, and is
//! served then. On the e2e node, so that the served keys' `Programmed`
//! also shows the gateway pods' heartbeats work under their Role (Leases
//! applied: `create` and `patch`, never read by name or replaced).

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use waycast_crds::{ApiKey, ApiKeyStatus};
use waycast_e2e::harness::{condition_true, operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::manifest::{self, object};
use waycast_e2e::wait::{Patience, Seen, await_object, holds_for};

/// Waits (by `deadline`) until `done` holds of `namespace/name`'s status.
async fn wait_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    deadline: Instant,
    what: &str,
    done: impl Fn(&ApiKeyStatus) -> bool,
) -> ApiKeyStatus {
    let keys: Api<ApiKey> = Api::namespaced(client.clone(), namespace);
    let patience = Patience::by(deadline).every(Duration::from_millis(250));
    await_object(&keys, name, what, patience, |key| {
        let status = key.status.clone().unwrap_or_default();
        if done(&status) { Seen::Done(status) } else { Seen::NotYet(format!("{status:?}")) }
    })
    .await
    .unwrap()
}

fn refused_for(status: &ApiKeyStatus, gateway: &str, reason: &str) -> bool {
    status.parents.iter().any(|p| p.gateway == gateway && !p.accepted && p.reason == reason)
}

#[tokio::test]
async fn a_namespace_past_its_key_cap_loses_its_newest_keys_and_no_other_namespace_does() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, "caps").await.unwrap();
    let team_a = test_namespace(&client, "team-a").await.unwrap();
    let team_b = test_namespace(&client, "team-b").await.unwrap();
    let team_x = test_namespace(&client, "team-x").await.unwrap();
    let gateway_id = format!("{home}/gateway");
    let admitting = |namespaces: &[&String]| {
        json!({"namespaces": {"from": "Selector", "selector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}}})
    };
    let gateway =
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 1, "apiKeys": admitting(&[&team_a, &team_b]),
                 "tenants": [{"namespaces": {"from": "All"}, "maxApiKeys": 2}]}}));
    manifest::apply_all(&client, &[gateway], &home).await.unwrap();
    let key = |name: &str| {
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "metadata": {"name": name},
            "spec": {"parentRefs": [{"name": "gateway", "namespace": home}]}}))
    };
    // One at a time, so that each is newer than the one before (a tie in
    // creation time goes by name, the same order).
    for name in ["k1", "k2", "k3"] {
        manifest::apply_all(&client, &[key(name)], &team_a).await.unwrap();
    }
    manifest::apply_all(&client, &[key("b1")], &team_b).await.unwrap();
    manifest::apply_all(&client, &[key("x1")], &team_x).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(180);
    let served =
        |status: &ApiKeyStatus| condition_true(&status.conditions, "Ready") && status.gateways.contains(&gateway_id);
    for (namespace, name) in [(&team_b, "b1"), (&team_a, "k1"), (&team_a, "k2")] {
        wait_status(&client, namespace, name, deadline, "was served", served).await;
    }
    let over = wait_status(&client, &team_a, "k3", deadline, "was left out by the cap", |status| {
        refused_for(status, &gateway_id, "TenantKeyLimit")
    })
    .await;
    let ready = over.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "TenantKeyLimit"), "{ready:?}");
    assert!(over.gateways.is_empty(), "no Gateway serves it: {:?}", over.gateways);

    // team-x is admitted by no Gateway: its key says so, and has no Secret.
    wait_status(&client, &team_x, "x1", deadline, "named the Gateway that does not admit it", |status| {
        refused_for(status, &gateway_id, "NotAllowedByGateway")
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &team_x);
    // NB: Secrets are made by another controller than the status, so one
    // look could come before it acts: the absence must hold for a while
    // (a key Secret is made within a second of a status otherwise).
    holds_for("a key nobody serves gets no Secret", Duration::from_secs(5), Duration::from_millis(250), async || {
        secrets.get_opt("x1-key").await.unwrap().is_none()
    })
    .await
    .unwrap();

    // The Gateway admits team-x: its key comes whole, gets its Secret and
    // is served (team-x has one key, under the cap).
    let gateways: Api<waycast_crds::Gateway> = Api::namespaced(client.clone(), &home);
    let patch = json!({"spec": {"apiKeys": admitting(&[&team_a, &team_b, &team_x])}});
    gateways.patch("gateway", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_status(&client, &team_x, "x1", deadline, "was served once admitted", served).await;
    assert!(secrets.get_opt("x1-key").await.unwrap().is_some());

    // An older key of team-a goes: the newest takes its place.
    Api::<ApiKey>::namespaced(client.clone(), &team_a).delete("k1", &DeleteParams::default()).await.unwrap();
    wait_status(&client, &team_a, "k3", deadline, "was served after an older key went", served).await;
    let b1 = Api::<ApiKey>::namespaced(client.clone(), &team_b).get("b1").await.unwrap().status.unwrap();
    assert!(served(&b1), "team-b was never affected: {b1:?}");
    // The pod applied its heartbeat Lease under its Role: the served keys
    // are Programmed (every ready pod reports the config holding them).
    let programmed = |status: &ApiKeyStatus| condition_true(&status.conditions, "Programmed");
    for (namespace, name) in [(&team_b, "b1"), (&team_a, "k3"), (&team_x, "x1")] {
        wait_status(&client, namespace, name, deadline, "was programmed", programmed).await;
    }
}
