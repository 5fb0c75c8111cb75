//! `settings` of a [`crate::config::GatewayConfig`]: what holds for the
//! whole fleet (the body limit, the access log, Redis counting, egress
//! ranges, sharing and tenants), and the TLS settings of a server the
//! gateway calls.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sharing::{SharingConfig, TenantConfig};

/// Default largest request body: 10 MiB.
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 10 * 1024 * 1024;

/// Fleet-wide settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Settings {
    /// Largest request body accepted; larger ones get 413.
    #[serde(default = "Settings::default_max_request_body_bytes")]
    pub max_request_body_bytes: u64,
    /// One info-level log line per request.
    #[serde(default = "Settings::default_access_log")]
    pub access_log: bool,
    /// Counting rate limits in Redis. Absent: each pod counts its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisConfig>,
    /// Address ranges no `url` backend may reach, by name or address, on
    /// top of the fixed link-local/metadata guard (e.g. `["10.0.0.0/8"]`).
    #[serde(default, rename = "deniedCIDRs", skip_serializing_if = "Vec::is_empty")]
    pub denied_cidrs: Vec<String>,
    /// Address ranges `url` backends may not reach unless `allowedCIDRs` or
    /// `allowedHosts` opens them: the operator writes loopback, the
    /// cluster's Service and Pod ranges and the API server's addresses.
    #[serde(default, rename = "closedCIDRs", skip_serializing_if = "Vec::is_empty")]
    pub closed_cidrs: Vec<String>,
    /// Opens `closedCIDRs` for these ranges.
    #[serde(default, rename = "allowedCIDRs", skip_serializing_if = "Vec::is_empty")]
    pub allowed_cidrs: Vec<String>,
    /// Opens `closedCIDRs` for `url` backends naming these hosts (exact
    /// names, or `*.example.com`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Priority classes and the bounds of a full model's queue.
    #[serde(default, skip_serializing_if = "SharingConfig::is_default")]
    pub sharing: SharingConfig,
    /// Each team namespace's policy (weight, classes, caps); a namespace
    /// not listed has weight 1, the default class only, no caps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantConfig>,
    /// The time zone and currency of every budget.
    #[serde(default, skip_serializing_if = "crate::spend::BudgetSettings::is_default")]
    pub budgets: crate::spend::BudgetSettings,
    /// The fewest pods the Gateway runs (its replicas, or its autoscaler's
    /// minimum): each pod counts at least this many sharing the limits and
    /// budgets, also before it has seen its siblings' heartbeats (a pod
    /// that took itself for the only one would spend the whole of each).
    #[serde(default = "Settings::one_pod", skip_serializing_if = "Settings::one_or_none")]
    pub minimum_pods: u32,
    /// Where the pods send traces and usage records (OTLP/HTTP); absent:
    /// nowhere (or the standalone gateway's flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
}

impl Settings {
    fn one_pod() -> u32 {
        1
    }

    #[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
    fn one_or_none(pods: &u32) -> bool {
        *pods <= 1
    }

    /// The policy of `namespace`, if it has one.
    pub fn tenant(&self, namespace: &str) -> Option<&TenantConfig> {
        self.tenants.iter().find(|tenant| tenant.namespace == namespace)
    }
}

/// Rate limits counted in Redis.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RedisConfig {
    /// `host:port`.
    pub address: String,
    /// `AUTH` password, if the server wants one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The ACL user for `AUTH` (Redis 6+); absent: the default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Longest a request waits for Redis.
    #[serde(with = "crate::duration::serde_text", default = "RedisConfig::default_timeout")]
    pub timeout: Duration,
    /// Admit (`open`) or refuse with 503 (`closed`) while Redis is unreachable.
    #[serde(default)]
    pub fail_closed: bool,
    /// TLS to Redis (`rediss://`); absent: plain TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsConfig>,
    /// What every Redis key starts with (default `waycast:`): the operator
    /// writes `waycast:<namespace>/<gateway>:`, so two Gateways sharing one
    /// Redis never count against each other's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
}

impl RedisConfig {
    /// The prefix of every key this config counts under.
    pub fn key_prefix(&self) -> &str {
        self.key_prefix.as_deref().unwrap_or("waycast:")
    }
}

/// TLS from the gateway to a server it calls, with the PEM material inline.
#[derive(Serialize, Deserialize, Clone, Default, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTlsConfig {
    /// PEM CA certificates trusted to sign the server's certificate;
    /// absent: the public web PKI roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// PEM certificate chain presented to the server (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_pem: Option<String>,
    /// PEM private key of `client_cert_pem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_pem: Option<String>,
    /// The name the server's certificate must carry; absent: the host the
    /// gateway connects to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

impl std::fmt::Debug for ClientTlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key never reaches a log line.
        f.debug_struct("ClientTlsConfig")
            .field("ca_pem", &self.ca_pem.as_ref().map(|pem| pem.len()))
            .field("client_cert_pem", &self.client_cert_pem.as_ref().map(|pem| pem.len()))
            .field("client_key_pem", &self.client_key_pem.as_ref().map(|_| "<redacted>"))
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl RedisConfig {
    /// 100 ms.
    pub fn default_timeout() -> Duration {
        Duration::from_millis(100)
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password never reaches a log line.
        f.debug_struct("RedisConfig")
            .field("address", &self.address)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("username", &self.username)
            .field("timeout", &self.timeout)
            .field("fail_closed", &self.fail_closed)
            .field("tls", &self.tls)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl Settings {
    fn default_max_request_body_bytes() -> u64 {
        DEFAULT_MAX_REQUEST_BODY_BYTES
    }
    fn default_access_log() -> bool {
        true
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_request_body_bytes: Self::default_max_request_body_bytes(),
            access_log: Self::default_access_log(),
            redis: None,
            denied_cidrs: Vec::new(),
            closed_cidrs: Vec::new(),
            allowed_cidrs: Vec::new(),
            allowed_hosts: Vec::new(),
            sharing: SharingConfig::default(),
            tenants: Vec::new(),
            budgets: crate::spend::BudgetSettings::default(),
            minimum_pods: 1,
            telemetry: None,
        }
    }
}
