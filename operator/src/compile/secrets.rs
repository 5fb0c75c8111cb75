//! The Secrets compile reads: a team's only when it opted them in with the
//! credential label (upstream credentials, CA and client certificates), and
//! never one too large to have been read; lookups by namespace and name.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use waycast_crds::backend::AuthStyle;
use waycast_crds::condition::reasons;
use waycast_crds::config::ClientTlsConfig;
use waycast_crds::model_endpoint::BackendAuth;

use super::inputs::Inputs;
use super::verdict::Verdict;

pub use waycast_crds::common::CREDENTIAL_LABEL;

/// The most data a referenced Secret may hold (all its values): keys,
/// credentials and PEM bundles are far smaller. The operator reads no more
/// of one (`secret_data`).
pub const MAX_SECRET_BYTES: usize = 256 * 1024;

/// What a key Secret's size counts for each of its values besides its
/// bytes (`secret_data`): about what keeping one costs the operator, so
/// thousands of tiny values cost what their count says, not their bytes.
pub const KEPT_VALUE_BYTES: usize = 256;

/// Why a Secret is not read, after its name.
pub const TOO_LARGE: &str = "holds more than 262144 bytes (a key Secret: counting 256 a value): it is not read";

const _: () = assert!(MAX_SECRET_BYTES == 262_144 && KEPT_VALUE_BYTES == 256, "TOO_LARGE names both");

/// The headers an upstream credential is sent in: `Authorization: Bearer
/// <value>` by default, the value as it is in any other header named, or
/// the provider's own (`style`).
pub(super) fn credential(
    index: usize,
    auth: &BackendAuth,
    namespace: &str,
    inputs: &Inputs<'_>,
) -> Result<Vec<(String, String)>, Verdict> {
    let field = format!("spec.backends[{index}].auth");
    let reference = &auth.secret_ref;
    let secret = opted_in_secret(&field, namespace, &reference.name, inputs)?;
    let value = secret_text(&field, namespace, secret, &reference.key, inputs)?.trim().to_owned();
    let header = |name: &str, value: String| (name.to_owned(), value);
    Ok(match auth.style.unwrap_or_default() {
        AuthStyle::Anthropic => {
            vec![header("x-api-key", value), header("anthropic-version", ANTHROPIC_VERSION.to_owned())]
        }
        AuthStyle::AzureOpenAI => vec![header("api-key", value)],
        AuthStyle::Bearer => match auth.header.as_deref().map(str::to_ascii_lowercase) {
            Some(named) if named != "authorization" => vec![(named, value)],
            _ => vec![header("authorization", format!("Bearer {value}"))],
        },
    })
}

/// The Messages API version the gateway asks an Anthropic-style backend
/// for (the one every current Anthropic SDK sends).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A backend's TLS settings with the PEM material read from the
/// ModelEndpoint's namespace (opted-in Secrets only, as for credentials).
pub(super) fn backend_tls(
    index: usize,
    tls: &waycast_crds::common::ClientTls,
    namespace: &str,
    inputs: &Inputs<'_>,
) -> Result<ClientTlsConfig, Verdict> {
    let field = format!("spec.backends[{index}].tls");
    let ca_pem = match &tls.ca_secret_ref {
        None => None,
        Some(reference) => {
            let path = format!("{field}.caSecretRef");
            let secret = opted_in_secret(&path, namespace, &reference.name, inputs)?;
            Some(secret_text(&path, namespace, secret, &reference.key, inputs)?.to_owned())
        }
    };
    let (client_cert_pem, client_key_pem) = match &tls.client_cert_secret_ref {
        None => (None, None),
        Some(reference) => {
            let path = format!("{field}.clientCertSecretRef");
            let secret = opted_in_secret(&path, namespace, &reference.name, inputs)?;
            let certificate = secret_text(&path, namespace, secret, "tls.crt", inputs)?.to_owned();
            (Some(certificate), Some(secret_text(&path, namespace, secret, "tls.key", inputs)?.to_owned()))
        }
    };
    Ok(ClientTlsConfig { ca_pem, client_cert_pem, client_key_pem, server_name: tls.server_name.clone() })
}

/// The Secret `name` of `namespace`, if its team opted it in with the
/// credential label.
///
/// NB: a team's Secret is read only when the team opted it in with the
/// label; key Secrets are kept apart as digests (`inputs.key_secrets`), so
/// a key can never be named here.
fn opted_in_secret<'a>(field: &str, namespace: &str, name: &str, inputs: &Inputs<'a>) -> Result<&'a Secret, Verdict> {
    let not_labelled = || {
        Verdict::refused(
            reasons::SECRET_NOT_LABELLED,
            format!(
                "{field}: Secret {namespace}/{name} lacks the label {CREDENTIAL_LABEL}: \"true\"; only Secrets with it are sent upstream"
            ),
        )
    };
    let mut matches = inputs
        .secrets
        .iter()
        .copied()
        .filter(|o| o.metadata.namespace.as_deref() == Some(namespace) && o.metadata.name.as_deref() == Some(name));
    let Some(first) = matches.next() else {
        if inputs.key_secrets.iter().any(|kept| kept.namespace == namespace && kept.name == name) {
            return Err(not_labelled());
        }
        return Err(Verdict::refused(
            reasons::AUTH_SECRET_MISSING,
            format!("{field}: no such Secret in Secret {namespace}/{name}"),
        ));
    };
    let opted_in =
        |s: &Secret| s.metadata.labels.as_ref().and_then(|l| l.get(CREDENTIAL_LABEL)).is_some_and(|v| v == "true");
    std::iter::once(first).chain(matches).find(|s| opted_in(s)).ok_or_else(not_labelled)
}

/// The text under `key` of `secret`.
pub(super) fn secret_text<'a>(
    field: &str,
    namespace: &str,
    secret: &'a Secret,
    key: &str,
    inputs: &Inputs<'_>,
) -> Result<&'a str, Verdict> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    if inputs.too_large.contains(&(namespace.to_owned(), name.to_owned())) {
        let message = format!("{field}: Secret {namespace}/{name} {TOO_LARGE}");
        return Err(Verdict::refused(reasons::SECRET_TOO_LARGE, message));
    }
    let missing = |what: &str| {
        Verdict::refused(reasons::AUTH_SECRET_MISSING, format!("{field}: {what} in Secret {namespace}/{name}"))
    };
    let bytes = secret.data.as_ref().and_then(|d| d.get(key)).ok_or_else(|| missing(&format!("no key {key:?}")))?;
    std::str::from_utf8(&bytes.0).map_err(|_| missing("a value that is not text"))
}

/// `objects` by `(namespace, name)`, for lookups that would otherwise scan
/// the whole list once per ApiKey (quadratic at thousands of keys).
pub fn index<'a, K: kube::Resource>(objects: &[&'a K]) -> std::collections::HashMap<(&'a str, &'a str), &'a K> {
    objects
        .iter()
        .copied()
        .filter_map(|o| Some(((o.meta().namespace.as_deref()?, o.meta().name.as_deref()?), o)))
        .collect()
}

/// The object named `name` in `namespace`.
pub fn find<'a, K: kube::Resource>(objects: &[&'a K], namespace: &str, name: &str) -> Option<&'a K> {
    objects
        .iter()
        .copied()
        .find(|o| o.meta().namespace.as_deref() == Some(namespace) && o.meta().name.as_deref() == Some(name))
}

/// The Secrets a Gateway's own settings name (Redis password, CA, client
/// certificate; the telemetry export's headers; the platform team's own:
/// no label needed), as `(namespace, name)`.
pub fn redis_secrets(gateway: &waycast_crds::Gateway) -> Vec<(String, String)> {
    let redis = gateway.spec.rate_limit.as_ref().and_then(|limits| limits.redis.as_ref());
    let tls = redis.and_then(|redis| redis.tls.as_ref());
    let telemetry = gateway.spec.telemetry.as_ref().and_then(|t| t.headers_secret_ref.as_ref());
    let mut names: Vec<&str> = [
        redis.and_then(|redis| redis.password_secret_ref.as_ref()).map(|r| r.name.as_str()),
        tls.and_then(|tls| tls.ca_secret_ref.as_ref()).map(|r| r.name.as_str()),
        tls.and_then(|tls| tls.client_cert_secret_ref.as_ref()).map(|r| r.name.as_str()),
        telemetry.map(|r| r.name.as_str()),
    ]
    .into_iter()
    .flatten()
    .collect();
    names.sort_unstable();
    names.dedup();
    let namespace = gateway.namespace().unwrap_or_default();
    names.into_iter().map(|name| (namespace.clone(), name.to_owned())).collect()
}
