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
use waycast_crds::config::{BackendConfig, KeyConfig, ModelConfig, TimeoutsConfig};

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
    KeyConfig { id: id.into(), sha256: sha256_hex(text), models: None, expires_at: None, disabled: false, limits: None }
}

fn model(name: &str, aliases: &[&str], url: &str) -> ModelConfig {
    ModelConfig {
        name: name.into(),
        aliases: aliases.iter().map(|a| (*a).to_owned()).collect(),
        backends: vec![BackendConfig::to(url)],
        timeouts: TimeoutsConfig::default(),
        limits: None,
        source: None,
        key_namespaces: None,
        // The mock upstream is driven by x-mock-* request headers.
        forward_headers: vec!["x-mock-*".into()],
        output_token_reservation: None,
        load_balancing: Default::default(),
    }
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

/// A port nothing listens on now, on `address`.
///
/// # Errors
/// Binding failing.
pub fn free_port(address: IpAddr) -> std::io::Result<u16> {
    let listener = TcpListener::bind(SocketAddr::new(address, 0))?;
    Ok(listener.local_addr()?.port())
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
