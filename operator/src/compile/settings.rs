//! The Gateway's own settings in its config: body limit, access log,
//! egress ranges, Redis counting. A value that cannot be used is the
//! Gateway's problem, shown in its `Accepted` condition; the rest is
//! still written.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use waycast_crds::common::SecretKeyRef;
use waycast_crds::condition::reasons;
use waycast_crds::config::{ClientTlsConfig, RedisConfig, Settings};
use waycast_crds::telemetry::{Ratio, TelemetryConfig};

use super::inputs::Inputs;
use super::verdict::Verdict;

/// The settings, and why the Gateway's spec is not served as written, if
/// it is not.
pub fn settings(inputs: &Inputs<'_>) -> (Settings, Option<Verdict>) {
    let spec = &inputs.gateway.spec;
    let mut settings = Settings::default();
    if let Some(limit) = spec.limits.as_ref().and_then(|l| l.max_request_body_bytes).and_then(|b| u64::try_from(b).ok())
    {
        settings.max_request_body_bytes = limit;
    }
    if let Some(access_log) = spec.logging.as_ref().and_then(|l| l.access_log) {
        settings.access_log = access_log;
    }
    settings.minimum_pods = u32::try_from(spec.minimum_replicas()).unwrap_or(1);
    let mut refused = None;
    if let Err(invalid) = egress_settings(inputs, &mut settings) {
        refused = Some(invalid);
    }
    match redis(inputs) {
        Ok(redis) => settings.redis = redis,
        // The pods keep counting each their share; the Gateway says why.
        Err(invalid) => refused = Some(invalid),
    }
    match telemetry(inputs) {
        Ok(telemetry) => settings.telemetry = telemetry,
        // The pods send nothing meanwhile; the Gateway says why (the
        // first problem found, if there are several).
        Err(invalid) => refused = refused.or(Some(invalid)),
    }
    (settings, refused)
}

/// Where the pods send traces and usage records, with the headers of the
/// Secret the Gateway names.
fn telemetry(inputs: &Inputs<'_>) -> Result<Option<TelemetryConfig>, Verdict> {
    let Some(spec) = &inputs.gateway.spec.telemetry else { return Ok(None) };
    let namespace = inputs.gateway.metadata.namespace.as_deref().unwrap_or_default();
    let mut headers = std::collections::BTreeMap::new();
    if let Some(reference) = &spec.headers_secret_ref {
        let secret = super::secrets::find::<Secret>(inputs.secrets, namespace, &reference.name).ok_or_else(|| {
            Verdict::refused(
                reasons::AUTH_SECRET_MISSING,
                format!(
                    "spec.telemetry.headersSecretRef: no Secret {namespace}/{}; nothing is sent meanwhile",
                    reference.name
                ),
            )
        })?;
        for (name, value) in secret.data.iter().flatten() {
            let value = std::str::from_utf8(&value.0).map(str::trim).unwrap_or_default();
            headers.insert(name.to_ascii_lowercase(), value.to_owned());
        }
    }
    let config = TelemetryConfig {
        endpoint: spec.endpoint.clone(),
        sampling: Ratio(spec.sampling.unwrap_or(1.0)),
        headers,
        resource_attributes: spec.resource_attributes.clone(),
        trust_client_trace_context: spec.trust_client_trace_context.unwrap_or(true),
        honor_client_sampling: spec.honor_client_sampling.unwrap_or(false),
        usage_logs: spec.usage_logs.unwrap_or(true),
    };
    let problems = config.problems();
    if !problems.is_empty() {
        // Never the header values: they are secrets.
        return Err(Verdict::refused(
            reasons::INVALID,
            format!("spec.telemetry: {}; nothing is sent meanwhile", problems.join("; ")),
        ));
    }
    Ok(Some(config))
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
        super::secrets::find::<Secret>(inputs.secrets, namespace, &reference.name)
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
