//! The pure heart of the operator: a Gateway and what the stores hold →
//! the GatewayConfig its pods serve, and a verdict for every ModelEndpoint
//! and ApiKey it selects.
//!
//! ```text
//! Inputs { gateway, namespaces, model endpoints, api keys, services, secrets }, now
//!   ─► select.rs  which objects the Gateway takes (two-way consent: parentRefs + namespace rules)
//!   ─► models.rs  backends resolved (Service → ClusterIP), egress rules, opted-in credentials,
//!                 key visibility, per-entry validation, conflicts (own namespace, then oldest)
//!   ─► keys.rs    key Secrets (owned, when generated) → SHA-256, length, expiry, disabled,
//!                 per-entry validation, duplicates
//!   ─► Compiled { config, verdicts }
//! ```
//!
//! No I/O, no clock (`now` is passed in), no randomness, and `BTreeMap`
//! wherever order reaches the output: the same inputs give byte-identical
//! config. Plaintext keys are hashed here and go no further.

pub mod fit;
pub mod keys;
pub mod models;
pub mod select;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::ResourceExt as _;
use waycast_crds::common::SecretKeyRef;
use waycast_crds::condition::reasons;
use waycast_crds::config::{ClientTlsConfig, GatewayConfig, RedisConfig, Settings};
use waycast_crds::{ApiKey, Gateway, ModelEndpoint};

/// What compile reads.
pub struct Inputs<'a> {
    /// The Gateway being compiled.
    pub gateway: &'a Gateway,
    /// Every namespace (for `Selector` namespace policies).
    pub namespaces: &'a [&'a Namespace],
    /// Every ModelEndpoint.
    pub model_endpoints: &'a [&'a ModelEndpoint],
    /// Every ApiKey.
    pub api_keys: &'a [&'a ApiKey],
    /// Services that backends may name.
    pub services: &'a [&'a Service],
    /// Key Secrets (labels stripped), upstream credential Secrets (with
    /// their labels: only those with `waycast.dev/credential: "true"` are
    /// used), and referenced Secrets known only by their metadata.
    pub secrets: &'a [&'a Secret],
    /// The cluster's Service and Pod ranges (empty: not known, and every
    /// private range is closed to `url` backends instead).
    pub cluster_ranges: &'a [String],
    /// The API server's addresses, as host ranges.
    pub api_server: &'a [String],
    /// Referenced Secrets whose data is too large to be read, as
    /// `(namespace, name)`: the objects naming them are refused.
    pub too_large: &'a std::collections::BTreeSet<(String, String)>,
}

/// Every team Secret the Gateway's served objects reference (key Secrets,
/// credentials, CA and client certificates), as `(namespace, name)`: the
/// Secrets whose data compile needs, and the only ones read.
pub fn referenced_secrets(inputs: &Inputs<'_>) -> std::collections::BTreeSet<(String, String)> {
    keys::key_secrets(inputs).chain(models::credential_secrets(inputs)).collect()
}

/// `namespace/name` of an object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// The key of a namespaced object.
    pub fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        Self { namespace: meta.namespace.clone().unwrap_or_default(), name: meta.name.clone().unwrap_or_default() }
    }

    /// `(namespace, name)`, borrowed: sorts objects in `ObjectKey` order
    /// without allocating (sorting 10,000 keys by owned keys made over half
    /// a million small allocations).
    pub fn sort_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (&str, &str) {
        (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Whether the Gateway serves an object, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Served.
    pub accepted: bool,
    /// A reason from `waycast_crds::condition::reasons`.
    pub reason: &'static str,
    /// For a person. Borrowed when constant: 10,000 served keys share
    /// one "the key is served".
    pub message: std::borrow::Cow<'static, str>,
}

impl Verdict {
    /// Served.
    pub fn accepted(reason: &'static str, message: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Self { accepted: true, reason, message: message.into() }
    }

    /// Not served, because `reason`.
    pub fn refused(reason: &'static str, message: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Self { accepted: false, reason, message: message.into() }
    }
}

/// What compile produces for one Gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    /// The config its pods serve.
    pub config: GatewayConfig,
    /// Every selected ModelEndpoint.
    pub models: BTreeMap<ObjectKey, Verdict>,
    /// Every selected ApiKey.
    pub keys: BTreeMap<ObjectKey, keys::KeyVerdict>,
    /// Why the Gateway's own spec is not served as written (its `Accepted`
    /// condition), if it is not.
    pub gateway: Option<Verdict>,
}

/// Compiles one Gateway.
pub fn gateway(inputs: &Inputs<'_>, now: jiff::Timestamp) -> Compiled {
    let (models, model_verdicts) = models::compile(inputs);
    let (keys, key_verdicts) = keys::compile(inputs, now);
    let spec = &inputs.gateway.spec;
    let mut settings = Settings::default();
    if let Some(limit) = spec.limits.as_ref().and_then(|l| l.max_request_body_bytes).and_then(|b| u64::try_from(b).ok())
    {
        settings.max_request_body_bytes = limit;
    }
    if let Some(access_log) = spec.logging.as_ref().and_then(|l| l.access_log) {
        settings.access_log = access_log;
    }
    let mut gateway = None;
    if let Err(refused) = egress_settings(inputs, &mut settings) {
        gateway = Some(refused);
    }
    match redis(inputs) {
        Ok(redis) => settings.redis = redis,
        // The pods keep counting each their share; the Gateway says why.
        Err(refused) => gateway = Some(refused),
    }
    let config = GatewayConfig { models, keys, settings, ..GatewayConfig::empty() };
    Compiled { config, models: model_verdicts, keys: key_verdicts, gateway }
}

/// Where `url` backends may connect: the Gateway's `deniedCIDRs`; closed
/// unless it opens them (`allowedCIDRs`, `allowedHosts`): loopback, every
/// private range, and the cluster's own ranges, Nodes and API server
/// (which matter where they are public addresses). Every private range is
/// closed whatever the operator found: a cluster network it could not see
/// (pods without `podCIDRs`, a Service range it may not list) stays closed.
///
/// # Errors
/// A range of the Gateway's that does not parse (the schema checks them
/// too); the rest is still written.
pub(crate) fn egress_settings(inputs: &Inputs<'_>, settings: &mut Settings) -> Result<(), Verdict> {
    use waycast_crds::egress::{ALWAYS_CLOSED, Cidr, PRIVATE_RANGES};
    let egress = inputs.gateway.spec.egress.as_ref();
    let mut invalid = None;
    let mut parsed = |field: &str, ranges: &[String]| -> Vec<String> {
        ranges
            .iter()
            .filter(|range| match range.parse::<Cidr>() {
                Ok(_) => true,
                Err(error) => {
                    invalid = Some(Verdict::refused(reasons::INVALID, format!("spec.egress.{field}: {error}")));
                    false
                }
            })
            .cloned()
            .collect()
    };
    settings.denied_cidrs = parsed("deniedCIDRs", egress.map(|e| e.denied_cidrs.as_slice()).unwrap_or_default());
    settings.allowed_cidrs = parsed("allowedCIDRs", egress.map(|e| e.allowed_cidrs.as_slice()).unwrap_or_default());
    settings.allowed_hosts = egress.map(|e| e.allowed_hosts.clone()).unwrap_or_default();
    let closed: std::collections::BTreeSet<String> = ALWAYS_CLOSED
        .iter()
        .chain(PRIVATE_RANGES)
        .map(|r| (*r).to_owned())
        .chain(inputs.cluster_ranges.iter().cloned())
        .chain(inputs.api_server.iter().cloned())
        .filter(|range| range.parse::<Cidr>().is_ok())
        .collect();
    settings.closed_cidrs = closed.into_iter().collect();
    invalid.map_or(Ok(()), Err)
}

/// Redis counting as the Gateway asks for it, with its password.
fn redis(inputs: &Inputs<'_>) -> Result<Option<RedisConfig>, Verdict> {
    let Some(rate_limit) = &inputs.gateway.spec.rate_limit else { return Ok(None) };
    let Some(redis) = &rate_limit.redis else { return Ok(None) };
    let timeout = match &redis.timeout {
        Some(text) => waycast_crds::duration::parse(text).map_err(|_| {
            Verdict::refused(reasons::INVALID, format!("spec.rateLimit.redis.timeout: {text:?} is not a duration"))
        })?,
        None => RedisConfig::default_timeout(),
    };
    let namespace = inputs.gateway.metadata.namespace.as_deref().unwrap_or_default();
    let secret_text = |reference: &SecretKeyRef, field: &str| {
        models::find::<Secret>(inputs.secrets, namespace, &reference.name)
            .and_then(|secret| secret.data.as_ref()?.get(&reference.key))
            .and_then(|bytes| std::str::from_utf8(&bytes.0).ok())
            .map(str::to_owned)
            .ok_or_else(|| {
                Verdict::refused(
                    reasons::AUTH_SECRET_MISSING,
                    format!(
                        "spec.rateLimit.redis.{field}: no text at key {:?} of Secret {namespace}/{}; each pod counts its share of the limits meanwhile",
                        reference.key, reference.name
                    ),
                )
            })
    };
    let password = match &redis.password_secret_ref {
        None => None,
        Some(reference) => Some(secret_text(reference, "passwordSecretRef")?.trim_end().to_owned()),
    };
    let tls = match &redis.tls {
        None => None,
        Some(tls) => {
            let ca_pem =
                tls.ca_secret_ref.as_ref().map(|reference| secret_text(reference, "tls.caSecretRef")).transpose()?;
            let (client_cert_pem, client_key_pem) = match &tls.client_cert_secret_ref {
                None => (None, None),
                Some(reference) => {
                    let part = |key: &str| SecretKeyRef { name: reference.name.clone(), key: key.into() };
                    (
                        Some(secret_text(&part("tls.crt"), "tls.clientCertSecretRef")?),
                        Some(secret_text(&part("tls.key"), "tls.clientCertSecretRef")?),
                    )
                }
            };
            Some(ClientTlsConfig { ca_pem, client_cert_pem, client_key_pem, server_name: tls.server_name.clone() })
        }
    };
    let fail_closed = rate_limit.failure_mode == Some(waycast_crds::gateway::FailureMode::Closed);
    let username = redis.username.clone();
    // Two Gateways on one Redis never count against each other's limits.
    let gateway = inputs.gateway;
    let key_prefix = Some(format!("waycast:{}/{}:", gateway.namespace().unwrap_or_default(), gateway.name_any()));
    Ok(Some(RedisConfig { address: redis.address.clone(), password, username, timeout, fail_closed, tls, key_prefix }))
}

#[cfg(test)]
mod tests;
