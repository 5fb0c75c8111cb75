//! ModelEndpoints → model routes: backends resolved by their kind
//! (`backends/`: a Service to its endpoints, a URL as it is, within the
//! Gateway's egress rules; credentials from opted-in Secrets), whose keys may
//! call each model (`spec.apiKeys`), every entry checked on its own by the
//! gateway's validation, and name conflicts within one namespace settled
//! oldest-first (a name is its namespace's own: see [`compile`]).
//!
//! NB: an object that fails here is left out with its verdict; it never
//! makes the whole config invalid, so one team's mistake stays its own.

use std::collections::BTreeMap;

use kube::ResourceExt as _;
use waycast_crds::ModelEndpoint;
use waycast_crds::condition::reasons;
use waycast_crds::config::{LimitsConfig, LoadBalancingConfig, ModelConfig, TimeoutsConfig};

use super::backends;
use super::inputs::Inputs;
use super::select;
use super::verdict::{ObjectKey, Verdict};

/// The ModelEndpoints the Gateway serves (both sides consent), in the order
/// name conflicts are settled: the Gateway's own namespace first, then
/// oldest (creation time, then namespace/name).
fn selected<'a>(inputs: &Inputs<'a>) -> Vec<&'a ModelEndpoint> {
    let gateway = inputs.gateway;
    let gateway_namespace = gateway.namespace().unwrap_or_default();
    let name = gateway.name_any();
    let gateway_ref = select::GatewayRef {
        namespace: &gateway_namespace,
        name: &name,
        policy: gateway.spec.model_endpoints.as_ref(),
    };
    let mut selected: Vec<&ModelEndpoint> = inputs
        .model_endpoints
        .iter()
        .copied()
        .filter(|endpoint| endpoint.metadata.deletion_timestamp.is_none())
        .filter(|endpoint| {
            let namespace = endpoint.metadata.namespace.as_deref().unwrap_or_default();
            let parent = select::parent(
                &gateway_ref,
                namespace,
                endpoint.labels(),
                &endpoint.spec.parent_refs,
                inputs.namespaces,
            );
            parent == select::Parent::Admitted
        })
        .collect();
    selected.sort_by(|a, b| {
        let foreign = |e: &ModelEndpoint| e.metadata.namespace.as_deref() != Some(gateway_namespace.as_str());
        let created = |e: &ModelEndpoint| e.metadata.creation_timestamp.as_ref().map(|t| t.0);
        foreign(a)
            .cmp(&foreign(b))
            .then_with(|| created(a).cmp(&created(b)))
            .then_with(|| ObjectKey::sort_key(&a.metadata).cmp(&ObjectKey::sort_key(&b.metadata)))
    });
    selected
}

/// Compiles every selected ModelEndpoint.
///
/// Model names are a namespace's own: a ModelEndpoint in the Gateway's
/// namespace is a platform model, one elsewhere is its team's (the config
/// entry's `namespace`), and keys resolve names in their own namespace,
/// then among the platform's. Two objects conflict only when they claim a
/// name in one namespace; the verdict then names the other object, which is
/// the same team's.
pub fn compile(inputs: &Inputs<'_>) -> (Vec<ModelConfig>, BTreeMap<ObjectKey, Verdict>) {
    let mut routes = Vec::new();
    let mut verdicts = BTreeMap::new();
    let gateway_namespace = inputs.gateway.namespace().unwrap_or_default();
    let mut claimed: BTreeMap<(String, String), ObjectKey> = BTreeMap::new();
    for endpoint in selected(inputs) {
        let key = ObjectKey::of(&endpoint.metadata);
        let names: Vec<&String> = std::iter::once(&endpoint.spec.model).chain(endpoint.spec.aliases.iter()).collect();
        let claim = |name: &String| (key.namespace.clone(), name.clone());
        if let Some((name, owner)) = names.iter().find_map(|name| claimed.get(&claim(name)).map(|owner| (name, owner)))
        {
            let message = format!("model name {name:?} is already served by {owner}, which is older");
            verdicts.insert(key, Verdict::refused(reasons::MODEL_NAME_CONFLICT, message));
            continue;
        }
        match route(endpoint, &key, inputs) {
            Ok(mut route) => {
                for name in &names {
                    claimed.insert(claim(name), key.clone());
                }
                if key.namespace != gateway_namespace {
                    route.namespace = Some(key.namespace.clone());
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
        backends.push(backends::resolve(index, backend, &key.namespace, inputs)?);
    }
    let defaults = TimeoutsConfig::default();
    let duration =
        |text: Option<&String>, default| text.and_then(|t| waycast_crds::duration::parse(t).ok()).unwrap_or(default);
    let timeouts = spec.timeouts.as_ref().map_or(defaults, |t| TimeoutsConfig {
        connect: duration(t.connect.as_ref(), defaults.connect),
        first_byte: duration(t.first_byte.as_ref(), defaults.first_byte),
        idle: duration(t.idle.as_ref(), defaults.idle),
    });
    let visibility = spec.api_keys.as_ref().and_then(|v| v.namespaces.as_ref());
    let key_namespaces = match visibility.map(|p| p.from).unwrap_or_default() {
        waycast_crds::gateway::NamespaceFrom::All => None,
        _ => Some(
            inputs
                .namespaces
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .chain(std::iter::once(key.namespace.as_str()))
                .filter(|namespace| {
                    select::namespace_admitted(visibility, &key.namespace, namespace, inputs.namespaces)
                })
                .map(str::to_owned)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        ),
    };
    let mut model = ModelConfig::to(spec.model.clone(), String::new());
    model.aliases = spec.aliases.clone();
    model.backends = backends;
    model.timeouts = timeouts;
    model.limits = spec.limits.as_ref().map(limits);
    model.capacity = spec.capacity.as_ref().and_then(|capacity| {
        let most = u32::try_from(capacity.max_in_flight_per_endpoint).ok()?;
        Some(waycast_crds::config::CapacityConfig { max_in_flight_per_endpoint: most })
    });
    model.pricing = spec.pricing.as_ref().map(waycast_crds::spend::Pricing::config);
    model.source = Some(key.to_string());
    model.key_namespaces = key_namespaces;
    model.forward_headers = spec.forward_headers.clone();
    model.forward_query_parameters = spec.forward_query_parameters.clone();
    model.output_token_reservation = spec.output_token_reservation.and_then(|n| u64::try_from(n).ok());
    model.load_balancing = load_balancing(spec.load_balancing.as_ref());
    model.apis = spec.apis.clone();
    // The gateway's own check, on this entry alone: what it would refuse is
    // left out here, with the field named, instead of freezing everyone's config.
    model.validate().map_err(|problems| {
        let fields: Vec<String> = problems.0.iter().map(|p| format!("{}: {}", spec_path(&p.path), p.message)).collect();
        Verdict::refused(reasons::INVALID, format!("not servable: {}", fields.join("; ")))
    })?;
    Ok(model)
}

/// A path in a compiled model entry as the field of the ModelEndpoint it
/// came from (`backends[0].headers.x` is that backend's `auth`).
fn spec_path(config_path: &str) -> String {
    let (head, rest) = config_path.split_once('.').unwrap_or((config_path, ""));
    match (head, rest) {
        ("name", _) => "spec.model".to_owned(),
        (backend, rest) if backend.starts_with("backends[") && rest.starts_with("headers.") => {
            format!("spec.{backend}.auth")
        }
        _ => format!("spec.{config_path}"),
    }
}

/// CRD load balancing → config (the schema keeps the numbers in range).
pub(super) fn load_balancing(wanted: Option<&waycast_crds::model_endpoint::LoadBalancing>) -> LoadBalancingConfig {
    use waycast_crds::config::LoadBalancingPolicy as Config;
    use waycast_crds::model_endpoint::LoadBalancingPolicy as Crd;
    let defaults = LoadBalancingConfig::default();
    let Some(wanted) = wanted else { return defaults };
    let number = |value: Option<i32>, default: u32| value.and_then(|v| u32::try_from(v).ok()).unwrap_or(default);
    LoadBalancingConfig {
        policy: match wanted.policy.unwrap_or_default() {
            Crd::LeastRequest => Config::LeastRequest,
            Crd::RoundRobin => Config::RoundRobin,
            Crd::PrefixAffinity => Config::PrefixAffinity,
        },
        prefix_bytes: number(wanted.prefix_bytes, defaults.prefix_bytes),
        load_factor_percent: number(wanted.load_factor_percent, defaults.load_factor_percent),
        session_header: wanted.session_header.clone(),
        retry_on_status: match &wanted.retry_on_status {
            None => defaults.retry_on_status,
            Some(statuses) => statuses.iter().filter_map(|s| u16::try_from(*s).ok()).collect(),
        },
    }
}

/// A model's CRD limits → config limits (the schema keeps them positive).
pub fn limits(limits: &waycast_crds::common::Limits) -> LimitsConfig {
    LimitsConfig {
        requests_per_minute: limits.requests_per_minute.and_then(|v| u64::try_from(v).ok()),
        tokens_per_minute: limits.tokens_per_minute.and_then(|v| u64::try_from(v).ok()),
        max_concurrent: None,
    }
}

/// A key's or a tenant's CRD limits → config limits (the schema keeps them
/// positive).
pub fn key_limits(limits: &waycast_crds::sharing::KeyLimits) -> LimitsConfig {
    let positive = |value: Option<i64>| value.and_then(|v| u64::try_from(v).ok());
    LimitsConfig {
        requests_per_minute: positive(limits.requests_per_minute),
        tokens_per_minute: positive(limits.tokens_per_minute),
        max_concurrent: positive(limits.max_concurrent),
    }
}

/// The Secrets the served ModelEndpoints name (upstream credentials, CA
/// and client certificates), as `(namespace, name)`: the only team
/// Secrets whose data is read, and those its store lacks are looked up by
/// metadata (to tell "not labelled" from "missing").
pub fn credential_secrets(inputs: &Inputs<'_>) -> impl Iterator<Item = (String, String)> {
    selected(inputs).into_iter().flat_map(|endpoint| {
        let namespace = endpoint.namespace().unwrap_or_default();
        endpoint
            .spec
            .backends
            .iter()
            .flat_map(|b| {
                let tls = b.tls.as_ref();
                [
                    b.auth.as_ref().map(|a| a.secret_ref.name.clone()),
                    tls.and_then(|t| t.ca_secret_ref.as_ref()).map(|r| r.name.clone()),
                    tls.and_then(|t| t.client_cert_secret_ref.as_ref()).map(|r| r.name.clone()),
                ]
            })
            .flatten()
            .map(move |name| (namespace.clone(), name))
            .collect::<Vec<_>>()
    })
}
