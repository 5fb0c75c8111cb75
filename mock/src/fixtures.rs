//! What tests say to a gateway in front of the mock: the keys and the
//! config every gateway test starts from, requests, free ports, scratch
//! directories. Shared by the gateway's in-process tests and the
//! real-cluster tests.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use waycast_crds::GatewayConfig;
use waycast_crds::config::{KeyConfig, ModelConfig};

/// Alice may use every model.
pub const ALICE_KEY: &str = "wc_alice_test_key_0123456789abcdefghijklmnop";
/// Bob may use `mistral-*` only.
pub const BOB_KEY: &str = "wc_bob_test_key_0123456789abcdefghijklmnopqr";
/// Expired in 2020.
pub const EXPIRED_KEY: &str = "wc_expired_test_key_0123456789abcdefghijklm";
/// Disabled.
pub const DISABLED_KEY: &str = "wc_disabled_test_key_0123456789abcdefghijkl";
/// The upstream credential the gateway injects.
pub const UPSTREAM_SECRET: &str = "upstream-secret-value";

/// Lowercase hex SHA-256 of a key's text.
pub fn sha256_hex(text: &str) -> String {
    waycast_crds::digest::sha256_hex(text.as_bytes())
}

fn key(id: &str, text: &str) -> KeyConfig {
    KeyConfig::new(id, sha256_hex(text))
}

fn model(name: &str, aliases: &[&str], url: &str) -> ModelConfig {
    let mut model = ModelConfig::to(name, url);
    model.aliases = aliases.iter().map(|a| (*a).to_owned()).collect();
    // The mock upstream is driven by x-mock-* request headers.
    model.forward_headers = vec!["x-mock-*".into()];
    model
}

/// The config every gateway test starts from: three models on the mock
/// (one with a model rewrite and an injected credential) and four keys.
pub fn default_config(upstream: &str) -> GatewayConfig {
    let mut llama = model("llama-3.1-8b", &["llama3"], upstream);
    llama.backends[0].model = Some("meta-llama/Llama-3.1-8B-Instruct".into());
    llama.backends[0].headers.insert("authorization".into(), format!("Bearer {UPSTREAM_SECRET}"));
    let mut bob = key("team-b/bob", BOB_KEY);
    bob.models = Some(vec!["mistral-*".into()]);
    let mut expired = key("team-a/expired", EXPIRED_KEY);
    expired.expires_at = "2020-01-01T00:00:00Z".parse().ok();
    let mut disabled = key("team-a/disabled", DISABLED_KEY);
    disabled.disabled = true;
    GatewayConfig {
        models: vec![llama, model("mistral-7b", &[], upstream), model("embed-small", &[], upstream)],
        keys: vec![key("team-a/alice", ALICE_KEY), bob, expired, disabled],
        ..GatewayConfig::empty()
    }
}

/// A fresh temporary directory for one test.
pub fn temp_dir(prefix: &str) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "waycast-{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The lowest port [`free_port`] hands out: above the fixed ports of the
/// e2e node's kubelet and kube-proxy (10248–10259).
const LOWEST_FREE_PORT: u16 = 11_000;
/// Above what [`free_port`] hands out: Kubernetes' NodePort range starts
/// here, and a node port with a listener's number would take its traffic.
const NODE_PORTS_START: u16 = 30_000;

/// A port nothing listens on now, on `address`, below the kernel's range of
/// ephemeral ports and Kubernetes' node ports. An ephemeral port, given
/// back and bound again later by a server (the API server binds seconds
/// after its port is chosen, once etcd runs), can be taken in between by
/// any outgoing connection on the machine, and the server then fails with
/// "address already in use" (seen in CI).
///
/// # Errors
/// Binding failing.
pub fn free_port(address: IpAddr) -> std::io::Result<u16> {
    let end = ephemeral_start().min(NODE_PORTS_START);
    if let Some(span) = end.checked_sub(LOWEST_FREE_PORT).filter(|span| *span >= 1_000) {
        for _ in 0..64 {
            let port = LOWEST_FREE_PORT + (random() % u64::from(span)) as u16;
            if TcpListener::bind(SocketAddr::new(address, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = TcpListener::bind(SocketAddr::new(address, 0))?;
    Ok(listener.local_addr()?.port())
}

/// The first port of the kernel's ephemeral range (Linux's default when it
/// cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768)
}

/// A random number from the standard library's per-process hash keys (each
/// `RandomState` differs), so that parallel tests pick apart.
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static PICKS: AtomicU32 = AtomicU32::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(PICKS.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// A POST with JSON and an optional bearer key.
///
/// # Panics
/// On an invalid URL.
pub fn post_request(url: &str, key: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut builder = Request::post(url).header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("authorization", format!("Bearer {key}"));
    }
    builder.body(Full::new(Bytes::from(body.to_owned()))).expect("request")
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// Free ports come from below the ephemeral range (no outgoing
    /// connection takes one before its server binds it) and the node
    /// ports; and they are free.
    #[test]
    fn free_ports_are_bindable_and_not_ephemeral() {
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let end = ephemeral_start().min(NODE_PORTS_START);
        let ports: Vec<u16> = (0..20).map(|_| free_port(loopback).unwrap()).collect();
        for port in &ports {
            assert!((LOWEST_FREE_PORT..end).contains(port), "{port}");
            TcpListener::bind(SocketAddr::new(loopback, *port)).unwrap();
        }
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 15, "picks should spread: {ports:?}");
    }
}

pub mod fleet;

/// The CRD objects as a test writes them: named and namespaced (with a
/// uid, as the API server gives one), every field of the spec at its
/// default. Tests change what they need on the result, so a new spec field
/// touches no test. The one home of CRD builders: every crate's tests and
/// the benchmarks build Gateways, ModelEndpoints and ApiKeys here.
pub mod objects {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use waycast_crds::common::ParentReference;
    use waycast_crds::{ApiKey, ApiKeySpec, Gateway, GatewaySpec, ModelEndpoint, ModelEndpointSpec};

    fn meta(namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(format!("uid-{namespace}-{name}")),
            ..ObjectMeta::default()
        }
    }

    /// A Gateway with the default spec.
    pub fn gateway(namespace: &str, name: &str) -> Gateway {
        let mut gateway = Gateway::new(name, GatewaySpec::default());
        gateway.metadata = meta(namespace, name);
        gateway
    }

    /// A ModelEndpoint serving `model`, with no backend yet.
    pub fn model_endpoint(namespace: &str, name: &str, model: &str) -> ModelEndpoint {
        let spec = ModelEndpointSpec { model: model.into(), ..ModelEndpointSpec::default() };
        let mut endpoint = ModelEndpoint::new(name, spec);
        endpoint.metadata = meta(namespace, name);
        endpoint
    }

    /// An ApiKey whose key the operator generates.
    pub fn api_key(namespace: &str, name: &str) -> ApiKey {
        let mut key = ApiKey::new(name, ApiKeySpec::default());
        key.metadata = meta(namespace, name);
        key
    }

    /// A `parentRefs` naming the Gateway `namespace/name`.
    pub fn parent(namespace: &str, name: &str) -> Vec<ParentReference> {
        vec![ParentReference { name: name.into(), namespace: Some(namespace.into()) }]
    }
}
