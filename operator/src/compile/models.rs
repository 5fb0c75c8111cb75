//! ModelEndpoints → model routes: backends resolved (a Service to its
//! ClusterIP and port, a URL as it is), upstream credentials read from their
//! Secrets, and name conflicts settled oldest-first.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::ResourceExt as _;
use waycast_crds::ModelEndpoint;
use waycast_crds::condition::reasons;
use waycast_crds::config::{BackendConfig, LimitsConfig, ModelConfig, TimeoutsConfig};
use waycast_crds::model_endpoint::{Backend, BackendAuth};

use super::{Inputs, ObjectKey, Verdict, select};

/// The base path of a Service backend without `basePath`.
pub const DEFAULT_BASE_PATH: &str = "/v1";

/// The selected ModelEndpoints, oldest first (creation time, then
/// namespace/name): the order conflicts are settled in.
fn selected<'a>(inputs: &Inputs<'a>) -> Vec<&'a ModelEndpoint> {
    let gateway = inputs.gateway;
    let gateway_namespace = gateway.namespace().unwrap_or_default();
    let mut selected: Vec<&ModelEndpoint> = inputs
        .model_endpoints
        .iter()
        .copied()
        .filter(|endpoint| endpoint.metadata.deletion_timestamp.is_none())
        .filter(|endpoint| {
            select::selects(
                gateway.spec.model_endpoints.as_ref(),
                &gateway_namespace,
                &endpoint.namespace().unwrap_or_default(),
                endpoint.labels(),
                inputs.namespaces,
            )
        })
        .collect();
    selected.sort_by(|a, b| {
        let created = |e: &ModelEndpoint| e.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a)
            .cmp(&created(b))
            .then_with(|| ObjectKey::sort_key(&a.metadata).cmp(&ObjectKey::sort_key(&b.metadata)))
    });
    selected
}

/// Compiles every selected ModelEndpoint.
pub fn compile(inputs: &Inputs<'_>) -> (Vec<ModelConfig>, BTreeMap<ObjectKey, Verdict>) {
    let mut routes = Vec::new();
    let mut verdicts = BTreeMap::new();
    let mut claimed: BTreeMap<String, ObjectKey> = BTreeMap::new();
    for endpoint in selected(inputs) {
        let key = ObjectKey::of(&endpoint.metadata);
        let names: Vec<&String> = std::iter::once(&endpoint.spec.model).chain(endpoint.spec.aliases.iter()).collect();
        if let Some((name, owner)) = names.iter().find_map(|name| claimed.get(name.as_str()).map(|owner| (name, owner)))
        {
            let message = format!("model name {name:?} is already served by {owner}, which is older");
            verdicts.insert(key, Verdict::refused(reasons::MODEL_NAME_CONFLICT, message));
            continue;
        }
        match route(endpoint, &key, inputs) {
            Ok(route) => {
                for name in names {
                    claimed.insert(name.clone(), key.clone());
                }
                routes.push(route);
                verdicts.insert(key, Verdict::accepted(reasons::ACCEPTED, "served"));
            }
            Err(verdict) => {
                verdicts.insert(key, verdict);
            }
        }
    }
    (routes, verdicts)
}

fn route(endpoint: &ModelEndpoint, key: &ObjectKey, inputs: &Inputs<'_>) -> Result<ModelConfig, Verdict> {
    let spec = &endpoint.spec;
    let mut backends = Vec::with_capacity(spec.backends.len());
    for (index, backend) in spec.backends.iter().enumerate() {
        backends.push(resolve_backend(index, backend, &key.namespace, inputs)?);
    }
    let defaults = TimeoutsConfig::default();
    let duration =
        |text: Option<&String>, default| text.and_then(|t| waycast_crds::duration::parse(t).ok()).unwrap_or(default);
    let timeouts = spec.timeouts.as_ref().map_or(defaults, |t| TimeoutsConfig {
        connect: duration(t.connect.as_ref(), defaults.connect),
        first_byte: duration(t.first_byte.as_ref(), defaults.first_byte),
        idle: duration(t.idle.as_ref(), defaults.idle),
    });
    Ok(ModelConfig {
        name: spec.model.clone(),
        aliases: spec.aliases.clone(),
        backends,
        timeouts,
        limits: spec.limits.as_ref().map(limits),
        source: Some(key.to_string()),
    })
}

/// CRD limits → config limits (the schema keeps them positive).
pub fn limits(limits: &waycast_crds::common::Limits) -> LimitsConfig {
    LimitsConfig {
        requests_per_minute: limits.requests_per_minute.and_then(|v| u64::try_from(v).ok()),
        tokens_per_minute: limits.tokens_per_minute.and_then(|v| u64::try_from(v).ok()),
    }
}

fn resolve_backend(
    index: usize,
    backend: &Backend,
    namespace: &str,
    inputs: &Inputs<'_>,
) -> Result<BackendConfig, Verdict> {
    let url = match (&backend.service, &backend.url) {
        (Some(service), _) => {
            let found = find::<Service>(inputs.services, namespace, &service.name).ok_or_else(|| {
                Verdict::refused(
                    reasons::BACKEND_NOT_FOUND,
                    format!("backends[{index}]: Service {namespace}/{} not found", service.name),
                )
            })?;
            let spec = found.spec.as_ref();
            let cluster_ip = spec
                .and_then(|s| s.cluster_ip.as_deref())
                .filter(|ip| !ip.is_empty() && *ip != "None")
                .ok_or_else(|| {
                    Verdict::refused(
                        reasons::BACKEND_NOT_FOUND,
                        format!("backends[{index}]: Service {namespace}/{} has no ClusterIP", service.name),
                    )
                })?;
            let has_port =
                spec.and_then(|s| s.ports.as_ref()).is_some_and(|ports| ports.iter().any(|p| p.port == service.port));
            if !has_port {
                let message =
                    format!("backends[{index}]: Service {namespace}/{} has no port {}", service.name, service.port);
                return Err(Verdict::refused(reasons::BACKEND_NOT_FOUND, message));
            }
            let host = if cluster_ip.contains(':') { format!("[{cluster_ip}]") } else { cluster_ip.to_owned() };
            let base_path = service.base_path.as_deref().unwrap_or(DEFAULT_BASE_PATH);
            format!("http://{host}:{}{base_path}", service.port)
        }
        (None, Some(url)) => url.clone(),
        (None, None) => {
            return Err(Verdict::refused(reasons::INVALID, format!("backends[{index}]: needs a service or a url")));
        }
    };
    let mut headers = BTreeMap::new();
    if let Some(auth) = &backend.auth {
        let (name, value) = credential(index, auth, namespace, inputs.secrets)?;
        headers.insert(name, value);
    }
    Ok(BackendConfig {
        url,
        model: backend.model.clone(),
        weight: backend.weight.and_then(|w| u32::try_from(w).ok()).unwrap_or(1),
        headers,
    })
}

/// The header an upstream credential is sent in: `Authorization: Bearer
/// <value>` by default, the value as it is in any other header.
fn credential(
    index: usize,
    auth: &BackendAuth,
    namespace: &str,
    secrets: &[&Secret],
) -> Result<(String, String), Verdict> {
    let reference = &auth.secret_ref;
    let missing = |what: &str| {
        Verdict::refused(
            reasons::AUTH_SECRET_MISSING,
            format!("backends[{index}].auth: {what} in Secret {namespace}/{}", reference.name),
        )
    };
    let secret = find::<Secret>(secrets, namespace, &reference.name).ok_or_else(|| missing("no such Secret"))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&reference.key))
        .ok_or_else(|| missing(&format!("no key {:?}", reference.key)))?;
    let value = std::str::from_utf8(&bytes.0).map_err(|_| missing("a value that is not text"))?.trim().to_owned();
    let header = auth.header.as_deref().unwrap_or("authorization").to_ascii_lowercase();
    if header == "authorization" { Ok((header, format!("Bearer {value}"))) } else { Ok((header, value)) }
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

/// The credential Secrets the selected ModelEndpoints name (and the Redis
/// password the Gateway names), as
/// `(namespace, name)`: the shell fetches these before compiling.
pub fn credential_secrets(inputs: &Inputs<'_>) -> std::collections::BTreeSet<(String, String)> {
    let redis_password = inputs
        .gateway
        .spec
        .rate_limit
        .as_ref()
        .and_then(|r| r.redis.as_ref()?.password_secret_ref.as_ref())
        .map(|reference| (inputs.gateway.namespace().unwrap_or_default(), reference.name.clone()));
    selected(inputs)
        .iter()
        .flat_map(|endpoint| {
            let namespace = endpoint.namespace().unwrap_or_default();
            endpoint
                .spec
                .backends
                .iter()
                .filter_map(move |b| b.auth.as_ref().map(|a| (namespace.clone(), a.secret_ref.name.clone())))
        })
        .chain(redis_password)
        .collect()
}
