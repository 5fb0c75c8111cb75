//! What each peer is given: one bearer key, and three models, each to a
//! sink whose default answer is one cell's shape, in the config format of
//! each peer.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context as _;
use serde_json::json;

/// The bearer key every peer checks. LiteLLM wants its master key to start
/// with `sk-`; the others take any.
pub const PEERS_KEY: &str = "sk-waycast-bench-0123456789abcdefghijklmnop";

/// One cell's shape: the model that routes to its sink, and the sink's answer.
pub(super) struct Cell {
    pub(super) model: &'static str,
    pub(super) chunks: u32,
    pub(super) chunk_interval_ms: u64,
}

pub(super) const SATURATION: Cell = Cell { model: "bench-saturation", chunks: 20, chunk_interval_ms: 0 };
pub(super) const STREAMING: Cell = Cell { model: "bench-streaming", chunks: 20, chunk_interval_ms: 10 };
pub(super) const HELD: Cell = Cell { model: "bench-held", chunks: 20, chunk_interval_ms: 250 };
pub(super) const CELLS: [&Cell; 3] = [&SATURATION, &STREAMING, &HELD];

/// The waycast gateway's config: each model to its sink, access log on.
pub fn waycast_config(sinks: &[SocketAddr; 3]) -> anyhow::Result<Vec<u8>> {
    let models: Vec<_> = CELLS
        .iter()
        .zip(sinks)
        .map(|(cell, sink)| {
            json!({
                "name": cell.model,
                "backends": [{"url": format!("http://{sink}/v1"), "weight": 1}],
                "timeouts": {"connect": "5s", "firstByte": "300s", "idle": "60s"},
            })
        })
        .collect();
    let config = json!({
        "apiVersion": "waycast.dev/config-v1",
        "models": models,
        "keys": [{"id": "bench/peers", "sha256": waycast_mock::fixtures::sha256_hex(PEERS_KEY)}],
        "settings": {"maxRequestBodyBytes": 10_485_760, "accessLog": true},
    });
    let bytes = serde_json::to_vec_pretty(&config)?;
    waycast_crds::GatewayConfig::from_slice(&bytes).context("the peers' waycast config is invalid")?;
    Ok(bytes)
}

/// nginx's config: the key checked by a `map` on the Authorization header
/// (nginx never reads the body, so it cannot route by model: the path
/// prefix `/<model>/` picks the sink — see [`nginx_path`]), unbuffered
/// proxying over kept-alive upstream connections, access log on.
pub fn nginx_config(dir: &Path, listen: SocketAddr, sinks: &[SocketAddr; 3], workers: usize) -> String {
    let dir = dir.display();
    let mut upstreams = String::new();
    let mut locations = String::new();
    for (cell, sink) in CELLS.iter().zip(sinks) {
        let _ = writeln!(
            upstreams,
            "  upstream {} {{ server {sink}; keepalive 1024; keepalive_requests 1000000; }}",
            cell.model
        );
        let _ = writeln!(
            locations,
            "    location /{model}/ {{\n      if ($authorized = 0) {{ return 401 '{{\"error\":{{\"message\":\"invalid key\",\"type\":\"invalid_request_error\"}}}}'; }}\n      proxy_pass http://{model}/;\n    }}",
            model = cell.model
        );
    }
    format!(
        r#"daemon off;
master_process on;
user root;
worker_processes {workers};
worker_rlimit_nofile 65536;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 16384; }}
http {{
  access_log {dir}/nginx-access.log;
  client_body_temp_path {dir}/nginx-body;
  proxy_temp_path {dir}/nginx-proxy;
  fastcgi_temp_path {dir}/nginx-fastcgi;
  uwsgi_temp_path {dir}/nginx-uwsgi;
  scgi_temp_path {dir}/nginx-scgi;
  default_type application/json;
  keepalive_requests 1000000;
  client_max_body_size 10m;
  client_body_buffer_size 128k;
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_buffering off;
  map_hash_bucket_size 128;
  map $http_authorization $authorized {{ "Bearer {PEERS_KEY}" 1; default 0; }}
{upstreams}  server {{
    listen {listen} backlog=4096;
{locations}  }}
}}
"#
    )
}

/// Where a request for `model` goes on nginx: nginx routes by path, not
/// by the body's model, so each model has a prefix in front of `/v1`.
pub fn nginx_path(model: &str) -> String {
    format!("/{model}")
}

/// onwards' config: each model a target to its sink, the key a global key.
pub fn onwards_config(sinks: &[SocketAddr; 3]) -> String {
    let targets: serde_json::Map<String, serde_json::Value> = CELLS
        .iter()
        .zip(sinks)
        .map(|(cell, sink)| (cell.model.to_owned(), json!({"url": format!("http://{sink}"), "keys": [PEERS_KEY]})))
        .collect();
    json!({
        "auth": {"global_keys": [PEERS_KEY]},
        "targets": targets,
        "http_pool": {"max_idle_per_host": 2000, "idle_timeout_secs": 90},
    })
    .to_string()
}

/// LiteLLM's proxy config: each model an OpenAI-compatible deployment at its sink, the key its master key.
pub fn litellm_config(sinks: &[SocketAddr; 3]) -> String {
    let mut config = String::from("model_list:\n");
    for (cell, sink) in CELLS.iter().zip(sinks) {
        let _ = writeln!(
            config,
            "  - model_name: {model}\n    litellm_params:\n      model: openai/{model}\n      api_base: http://{sink}/v1\n      api_key: unused",
            model = cell.model
        );
    }
    let _ = writeln!(config, "general_settings:\n  master_key: {PEERS_KEY}");
    config
}
