//! Sign-in with the identity a caller already holds, on the e2e node: a
//! real Keycloak (on loopback, where the in-process operator fetches its
//! key set through the CA a ConfigMap names) and the cluster's own
//! ServiceAccount issuer, Gateways trusting them, AccessGrants admitting
//! their people and workloads, and the gateway pods verifying every token.
//!
//! - A person in a granted group reaches the model with no ApiKey; someone
//!   only a grant of a namespace the Gateway does not admit names gets
//!   `no_grant`; an expired, wrongly addressed, tampered, unsigned or
//!   HMAC-"signed" token gets its own 401, before the body is read.
//! - Keycloak rotates its signing key: a token of the new key is served
//!   within a minute; rotated again, the pod that refuses the new key's
//!   token `unknown_key` names the provider in its heartbeat Lease (the
//!   operator's cue to fetch the set sooner), and the token is served;
//!   Keycloak stops: tokens of the last good key set keep being served, and
//!   the Gateway says the fetch fails.
//! - A pod calls with its projected ServiceAccount token: its grant's model
//!   answers; another ServiceAccount's pod gets `no_grant`.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, LogParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use waycast_crds::Gateway;
use waycast_crds::heartbeat::{UNKNOWN_KEY_ANNOTATION, unknown_key_providers};
use waycast_crds::identity::ProviderKeySetStatus;
use waycast_e2e::cluster::images;
use waycast_e2e::harness::{operator_in_process, shared_cluster_with_node, test_namespace};
use waycast_e2e::keycloak::{ClientSpec, Keycloak, OldKeys, UserSpec, decode_jwt};
use waycast_e2e::manifest::{self, object};
use waycast_e2e::wait::{Seen, await_condition, await_object, holds_for, within};
use waycast_e2e::workloads::{deploy_mock, hardened, wait_pods_ready};
use waycast_mock::fixtures as fixture;
use waycast_mock::tokens::{hmac_signed, tampered, unsigned};

const REALM: &str = "corp";
const AUDIENCE: &str = "waycast";
const CHAT: &str = r#"{"model":"llm","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
/// The gateway's allowance for clock skew on `exp` (`SKEW_SECONDS`).
const SKEW: Duration = Duration::from_secs(30);

/// A status and the answer's JSON (Null when it is not JSON).
async fn chat(ip: &str, bearer: &str) -> (StatusCode, Value) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = fixture::post_request(&format!("http://{ip}:8080/v1/chat/completions"), Some(bearer), CHAT);
    let response = tokio::time::timeout(Duration::from_secs(10), http.request(request)).await.unwrap().unwrap();
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// The `error.code` of a refusal, and its status.
async fn refusal(ip: &str, bearer: &str) -> (StatusCode, String) {
    let (status, body) = chat(ip, bearer).await;
    (status, body["error"]["code"].as_str().unwrap_or_default().to_owned())
}

fn refused(code: &str) -> (StatusCode, String) {
    (StatusCode::UNAUTHORIZED, code.to_owned())
}

/// Namespaces a Gateway's `apiKeys` (and a ModelEndpoint's) admits.
fn admitting(namespaces: &[&String]) -> Value {
    json!({"namespaces": {"from": "Selector", "selector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}}})
}

/// The mock model `llm` in `home`, shared with `team`.
async fn model(client: &kube::Client, home: &str, team: &String) {
    deploy_mock(client, home).await.unwrap();
    let model =
        object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "ModelEndpoint", "metadata": {"name": "llm"},
        "spec": {"model": "llm", "backends": [{"service": {"name": "mock", "port": 8000}}],
                 "apiKeys": admitting(&[team])}}));
    manifest::apply_all(client, &[model], home).await.unwrap();
}

/// An AccessGrant of `provider` naming the Gateway `home/gateway`.
fn grant(name: &str, home: &str, provider: &str, members: Value) -> kube::api::DynamicObject {
    let mut spec = json!({"parentRefs": [{"name": "gateway", "namespace": home}], "provider": provider,
                          "models": ["llm"]});
    spec.as_object_mut().unwrap().extend(members.as_object().unwrap().clone());
    object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "AccessGrant", "metadata": {"name": name},
                  "spec": spec}))
}

/// Waits until the Gateway's status shows `provider`'s key set loaded.
async fn await_keys(gateways: &Api<Gateway>, provider: &str) -> ProviderKeySetStatus {
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(250));
    await_object(gateways, "gateway", format!("has provider {provider}'s keys"), patience, |gateway| {
        let status = gateway.status.as_ref().and_then(|s| s.identity.as_ref());
        let provider = status.and_then(|s| s.providers.iter().find(|p| p.name == provider));
        match provider {
            Some(p) if p.keys.is_some_and(|k| k > 0) => Seen::Done(p.clone()),
            _ => Seen::NotYet(format!("{status:?}")),
        }
    })
    .await
    .unwrap()
}

/// The IP of the Gateway's one ready pod.
async fn gateway_ip(client: &kube::Client, home: &str) -> String {
    let pods =
        wait_pods_ready(client, home, "app.kubernetes.io/instance=gateway", 1, Duration::from_secs(180)).await.unwrap();
    pods[0].status.as_ref().unwrap().pod_ip.clone().unwrap()
}

/// Waits until `bearer` is served (200) by the pod at `ip`.
async fn await_served(ip: &str, bearer: &str, what: &str, timeout: Duration) {
    let patience = within(timeout).every(Duration::from_millis(250));
    await_condition(what, patience, async || {
        let (status, body) = chat(ip, bearer).await;
        Seen::when(status == StatusCode::OK, (status, body))
    })
    .await
    .unwrap();
}

/// Keycloak's realm with the client `waycast` (audience `waycast`), a
/// client of another audience, the group `ml`, alice in it and eve in none.
struct Realm {
    keycloak: Keycloak,
    client: ClientSpec,
    alice: UserSpec,
    eve: UserSpec,
}

impl Realm {
    async fn start(test: &str) -> Option<Self> {
        let keycloak = Keycloak::start_or_skip(IpAddr::V4(Ipv4Addr::LOCALHOST), test).await.unwrap()?;
        keycloak.create_realm(REALM).await.unwrap();
        let client =
            ClientSpec { client_id: "waycast".into(), secret: Some("s3cret".into()), audience: AUDIENCE.into() };
        keycloak.create_client(REALM, &client).await.unwrap();
        keycloak.create_group(REALM, "ml").await.unwrap();
        let user = |name: &str, groups: Vec<String>| UserSpec {
            username: name.into(),
            password: format!("{name}'s password"),
            email: format!("{name}@example.com"),
            groups,
        };
        let (alice, eve) = (user("alice", vec!["ml".into()]), user("eve", vec![]));
        keycloak.create_user(REALM, &alice).await.unwrap();
        keycloak.create_user(REALM, &eve).await.unwrap();
        Some(Self { keycloak, client, alice, eve })
    }

    async fn token(&self, user: &UserSpec) -> String {
        self.keycloak.password_token(REALM, &self.client, &user.username, &user.password).await.unwrap().access_token
    }

    /// A Gateway in `home` trusting this realm as `corp` (its CA from a
    /// ConfigMap), admitting `team`'s grants.
    async fn gateway(&self, client: &kube::Client, home: &str, team: &String) {
        let ca = object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keycloak-ca"},
                               "data": {"ca.crt": self.keycloak.ca_pem()}}));
        let gateway =
            object(json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
            "spec": {"replicas": 1, "apiKeys": admitting(&[team]),
                     "identity": {"providers": [{"name": "corp", "issuer": self.keycloak.issuer(REALM),
                        "audiences": [AUDIENCE], "caConfigMapRef": {"name": "keycloak-ca", "key": "ca.crt"},
                        "claims": {"user": "preferred_username"}}]}}}));
        manifest::apply_all(client, &[ca, gateway], home).await.unwrap();
    }
}

#[tokio::test]
async fn a_person_from_keycloak_reaches_a_model_through_a_grant_with_no_api_key() {
    let Some(realm) = Realm::start("identity").await else {
        return;
    };
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, "sso").await.unwrap();
    let team = test_namespace(&client, "sso-team").await.unwrap();
    let outsider = test_namespace(&client, "sso-outsider").await.unwrap();
    model(&client, &home, &team).await;
    realm.gateway(&client, &home, &team).await;
    let ml = grant("ml", &home, "corp", json!({"groups": ["ml"]}));
    manifest::apply_all(&client, &[ml], &team).await.unwrap();
    // A grant for eve in a namespace the Gateway does not admit: it names
    // the Gateway, but consent is two-way.
    let sneaky = grant("eve", &home, "corp", json!({"users": ["eve"], "groups": ["ml"]}));
    manifest::apply_all(&client, &[sneaky], &outsider).await.unwrap();

    // A token that expires in 5 s, taken first so that its wait overlaps
    // the other checks.
    let keycloak = &realm.keycloak;
    keycloak.set_access_token_lifespan(REALM, Duration::from_secs(5)).await.unwrap();
    let short = realm.token(&realm.alice).await;
    keycloak.set_access_token_lifespan(REALM, Duration::from_secs(3600)).await.unwrap();
    let expires = decode_jwt(&short).unwrap().1["exp"].as_u64().unwrap();

    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &home);
    let keys = await_keys(&gateways, "corp").await;
    println!("corp's key set: {keys:?}");
    let ip = gateway_ip(&client, &home).await;
    let alice = realm.token(&realm.alice).await;
    let (_, alice_claims) = decode_jwt(&alice).unwrap();
    await_served(&ip, &alice, "alice's token is served", Duration::from_secs(60)).await;
    let (status, body) = chat(&ip, &alice).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "llm", "{body}");

    // eve is in no group of an admitted grant: the outsider's grant naming
    // her serves nothing.
    let eve = realm.token(&realm.eve).await;
    holds_for("eve is refused", Duration::from_secs(3), Duration::from_millis(250), async || {
        let seen = refusal(&ip, &eve).await;
        Seen::when(seen == refused("no_grant"), seen)
    })
    .await
    .unwrap();

    // A token for another audience.
    let other =
        ClientSpec { client_id: "elsewhere".into(), secret: Some("s3cret-2".into()), audience: "elsewhere".into() };
    keycloak.create_client(REALM, &other).await.unwrap();
    let elsewhere = keycloak
        .password_token(REALM, &other, &realm.alice.username, &realm.alice.password)
        .await
        .unwrap()
        .access_token;
    assert_eq!(refusal(&ip, &elsewhere).await, refused("wrong_audience"));

    // Forgeries of alice's token: eve's name under alice's signature; the
    // claims unsigned; "signed" with HMAC keyed by the public key set.
    let mut forged = alice_claims.clone();
    forged["preferred_username"] = json!("eve");
    forged["sub"] = json!("eve");
    assert_eq!(refusal(&ip, &tampered(&alice, &forged)).await, refused("bad_signature"));
    assert_eq!(refusal(&ip, &unsigned(&alice_claims)).await, refused("disallowed_algorithm"));
    let jwks_uri = keycloak.discovery(REALM).await.unwrap()["jwks_uri"].as_str().unwrap().to_owned();
    let jwks = keycloak.get_json(&jwks_uri).await.unwrap().to_string();
    let kid = decode_jwt(&alice).unwrap().0["kid"].as_str().unwrap().to_owned();
    assert_eq!(refusal(&ip, &hmac_signed(jwks.as_bytes(), &kid, &alice_claims)).await, refused("disallowed_algorithm"));

    // A refusal comes before the body is read: a body declared and never
    // sent is not waited for.
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(format!("{ip}:8080")).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: 100000\r\n\r\n{{\"model\":",
        tampered(&alice, &forged)
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let mut buffer = [0_u8; 4096];
    while !String::from_utf8_lossy(&response).contains("bad_signature") {
        let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut buffer)).await.unwrap().unwrap();
        assert!(read > 0, "closed early: {}", String::from_utf8_lossy(&response));
        response.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(2), "answered before the body: {:?}", started.elapsed());

    // The pod's metrics name no person.
    let metrics = fetch_text(&format!("http://{ip}:9090/metrics")).await;
    assert!(metrics.contains("waycast_"), "no metrics: {metrics:.200}");
    let subject = alice_claims["sub"].as_str().unwrap();
    assert!(!metrics.contains("alice") && !metrics.contains(subject), "a person in the metrics");

    // The short token: served until it expires (and the skew passes), then
    // refused as expired.
    let expired_at = std::time::UNIX_EPOCH + Duration::from_secs(expires) + SKEW;
    let left = expired_at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    let patience = within(left + Duration::from_secs(20)).every(Duration::from_millis(500));
    await_condition("the short token is refused as expired", patience, async || {
        let seen = refusal(&ip, &short).await;
        Seen::when(seen == refused("token_expired"), seen)
    })
    .await
    .unwrap();
    assert!(std::time::SystemTime::now() + Duration::from_secs(1) >= expired_at, "refused before it expired");
    // alice still is served.
    assert_eq!(chat(&ip, &alice).await.0, StatusCode::OK);
}

/// The text of a GET of `url`.
async fn fetch_text(url: &str) -> String {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let response =
        tokio::time::timeout(Duration::from_secs(10), http.get(url.parse().unwrap())).await.unwrap().unwrap();
    let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test]
async fn a_rotated_keycloak_key_is_served_within_a_minute_and_an_outage_keeps_the_last_good_set() {
    let Some(realm) = Realm::start("identity").await else {
        return;
    };
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, "rotate").await.unwrap();
    let team = test_namespace(&client, "rotate-team").await.unwrap();
    model(&client, &home, &team).await;
    realm.gateway(&client, &home, &team).await;
    manifest::apply_all(&client, &[grant("ml", &home, "corp", json!({"groups": ["ml"]}))], &team).await.unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &home);
    await_keys(&gateways, "corp").await;
    let ip = gateway_ip(&client, &home).await;
    let before = realm.token(&realm.alice).await;
    await_served(&ip, &before, "alice's token is served", Duration::from_secs(60)).await;

    // Rotation, the old key kept passive: a token of the new key is
    // refused until the new set reaches the pods, then served.
    let keycloak = &realm.keycloak;
    let rotated_at = Instant::now();
    let new_kid = keycloak.rotate_signing_key(REALM, OldKeys::Passive).await.unwrap();
    let rotated = realm.token(&realm.alice).await;
    assert_eq!(decode_jwt(&rotated).unwrap().0["kid"], new_kid.as_str());
    let rotation_took = rotated_at.elapsed();
    let first = refusal(&ip, &rotated).await;
    let patience = within(Duration::from_secs(90)).every(Duration::from_millis(250));
    await_condition("a token of the rotated key is served", patience, async || {
        let (status, body) = chat(&ip, &rotated).await;
        Seen::when(status == StatusCode::OK, (status, body))
    })
    .await
    .unwrap();
    let took = rotated_at.elapsed();
    println!(
        "a token of the rotated key was served {took:.1?} after the rotation began \
         (Keycloak's admin calls {rotation_took:.1?}; the first answer {first:?})"
    );
    assert!(took <= Duration::from_secs(60), "the rotated key took {took:?}");
    assert_eq!(chat(&ip, &before).await.0, StatusCode::OK, "the passive key's token still is served");

    // Again, at once. The pod that refuses the new key's token names the
    // provider in its heartbeat (written at once, through the pod's own
    // Role), the operator's cue to fetch the set then rather than at its
    // round. NB: Keycloak's key set allows no caching, so its round is the
    // 10 s floor a nudge keeps to as well: what differs here is only the
    // channel, checked on the real pod (the timing: the refresher's tests).
    let again_at = Instant::now();
    let newer_kid = keycloak.rotate_signing_key(REALM, OldKeys::Passive).await.unwrap();
    let newer = realm.token(&realm.alice).await;
    assert_eq!(decode_jwt(&newer).unwrap().0["kid"], newer_kid.as_str());
    assert_eq!(refusal(&ip, &newer).await, refused("unknown_key"), "the new key is not in the set served");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &home);
    let heartbeats = ListParams::default().labels("waycast.dev/gateway=gateway");
    let patience = within(Duration::from_secs(10)).every(Duration::from_millis(200));
    await_condition("the pod's heartbeat names corp", patience, async || {
        let listed = leases.list(&heartbeats).await.map(|list| list.items).unwrap_or_default();
        let named = listed.iter().filter_map(|lease| lease.metadata.annotations.as_ref()?.get(UNKNOWN_KEY_ANNOTATION));
        let named: Vec<&String> = named.collect();
        Seen::when(named.iter().any(|listed| unknown_key_providers(listed).any(|p| p == "corp")), format!("{named:?}"))
    })
    .await
    .unwrap();
    await_served(&ip, &newer, "a token of the key rotated in again is served", Duration::from_secs(60)).await;
    println!("rotated again: a token of the new key was served {:.1?} after the rotation began", again_at.elapsed());

    // Keycloak stops. Tokens of the last good set keep being served for
    // two refresh periods and more — one of them shown to the gateway for
    // the first time only after that — and the Gateway says why.
    let unseen = realm.token(&realm.alice).await;
    drop(realm);
    let stopped = Instant::now();
    holds_for(
        "tokens are served while the issuer is down",
        Duration::from_secs(45),
        Duration::from_secs(1),
        async || {
            let (status, body) = chat(&ip, &rotated).await;
            Seen::when(status == StatusCode::OK, (status, body))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        chat(&ip, &unseen).await.0,
        StatusCode::OK,
        "a token first shown {:?} into the outage",
        stopped.elapsed()
    );
    let patience = within(Duration::from_secs(60)).every(Duration::from_millis(500));
    let failing = await_object(&gateways, "gateway", "says corp's fetch fails", patience, |gateway| {
        let status = gateway.status.as_ref().and_then(|s| s.identity.as_ref());
        let corp = status.and_then(|s| s.providers.iter().find(|p| p.name == "corp")).cloned();
        match corp {
            Some(p) if p.message.is_some() => Seen::Done(p),
            _ => Seen::NotYet(format!("{status:?}")),
        }
    })
    .await
    .unwrap();
    println!("during the outage: {failing:?}");
    assert!(failing.keys.is_some_and(|k| k >= 2), "the last good set (both keys) is still served: {failing:?}");
    let events = Api::<Event>::namespaced(client.clone(), &home).list(&ListParams::default()).await.unwrap();
    assert!(
        events.items.iter().any(|e| e.reason.as_deref() == Some("KeySetFetchFailed")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gateway")),
        "no KeySetFetchFailed Event on the Gateway"
    );
}

/// A pod of ServiceAccount `account` in `namespace` that POSTs a chat to
/// `url` with its projected token (audience `waycast`) and prints the
/// answer; returns the status and the answer's JSON.
async fn call_from_pod(client: &kube::Client, namespace: &str, account: &str, url: &str) -> (u16, Value) {
    let name = format!("call-{account}");
    let objects = [
        object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}})),
        object(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"serviceAccountName": account, "restartPolicy": "Never", "automountServiceAccountToken": false,
                "containers": [{"name": "call", "image": images::MOCK_UPSTREAM, "imagePullPolicy": "Never",
                    "args": ["call", url, "/var/run/waycast/token", CHAT], "securityContext": hardened(),
                    "volumeMounts": [{"name": "token", "mountPath": "/var/run/waycast", "readOnly": true}]}],
                "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken":
                    {"audience": AUDIENCE, "expirationSeconds": 600, "path": "token"}}]}}]}})),
    ];
    manifest::apply_all(client, &objects, namespace).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patience = within(Duration::from_secs(120)).every(Duration::from_millis(250));
    let phase = await_object(&pods, &name, "has run", patience, |pod| {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" { Seen::Done(phase) } else { Seen::NotYet(phase) }
    })
    .await
    .unwrap();
    let log = pods.logs(&name, &LogParams::default()).await.unwrap();
    assert_eq!(phase, "Succeeded", "{log}");
    let (first, rest) = log.split_once('\n').unwrap_or((&log, ""));
    let status = first.strip_prefix("status ").and_then(|s| s.trim().parse().ok()).unwrap_or_else(|| panic!("{log}"));
    (status, serde_json::from_str(rest.trim()).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_pods_projected_service_account_token_reaches_its_grants_model() {
    let cluster = shared_cluster_with_node(env!("CARGO_BIN_EXE_waycast-cluster"));
    operator_in_process(cluster);
    let client = cluster.client().await;
    let home = test_namespace(&client, "workloads").await.unwrap();
    let team = test_namespace(&client, "workloads-team").await.unwrap();
    model(&client, &home, &team).await;
    let gateway = object(
        json!({"apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "metadata": {"name": "gateway"},
        "spec": {"replicas": 1, "apiKeys": admitting(&[&team]),
                 "identity": {"providers": [{"name": "cluster", "serviceAccountIssuer": {}, "audiences": [AUDIENCE]}]}}}),
    );
    manifest::apply_all(&client, &[gateway], &home).await.unwrap();
    let batch = format!("{team}/batch");
    manifest::apply_all(&client, &[grant("batch", &home, "cluster", json!({"serviceAccounts": [batch]}))], &team)
        .await
        .unwrap();
    let gateways: Api<Gateway> = Api::namespaced(client.clone(), &home);
    let keys = await_keys(&gateways, "cluster").await;
    println!("the cluster's key set: {keys:?}");
    let ip = gateway_ip(&client, &home).await;
    let url = format!("http://{ip}:8080/v1/chat/completions");
    // Ready when a token of batch (asked for through the API) is served:
    // the grant has reached the pod.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &team);
    let account = object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "batch"}}));
    manifest::apply_all(&client, &[account], &team).await.unwrap();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![AUDIENCE.into()],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued = accounts.create_token_request("batch", &PostParams::default(), &request).await.unwrap();
    let token = issued.status.unwrap().token;
    await_served(&ip, &token, "batch's token is served", Duration::from_secs(60)).await;

    let (status, body) = call_from_pod(&client, &team, "batch", &url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "llm", "{body}");
    let (status, body) = call_from_pod(&client, &team, "stranger", &url).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("no_grant")), "{body}");
}
