//! A `service` backend: a Service of the ModelEndpoint's own namespace
//! (looked up there only: a team never names another team's Service).
//!
//! What it resolves to depends on the Service:
//! - it selects pods: served through its ready endpoints, picked by the
//!   gateway; its ClusterIP (with TLS, or headless: its DNS name) is the
//!   fallback and the `Host`;
//! - `ExternalName`: a host the team chose, like a `url`: held to the
//!   Gateway's egress rules here and by the gateway at connect time;
//! - no selector: endpoints written by hand (any address), so it is held
//!   to the egress rules like a `url` to its ClusterIP, never served
//!   through endpoints.

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use waycast_crds::condition::reasons;
use waycast_crds::model_endpoint::ServiceBackend;

use super::scope::{Scope, Target};
use crate::compile::secrets::find;
use crate::compile::verdict::Verdict;

/// The base path of a Service backend without `basePath`.
pub const DEFAULT_BASE_PATH: &str = "/v1";

/// The Service `service` names, as the backend's target.
///
/// # Errors
/// `BackendNotFound` (no such Service, or no such port on it), or
/// `NotAllowedByGateway` (an address a team chose that the Gateway's
/// egress rules refuse).
pub fn resolve(service: &ServiceBackend, scope: &Scope<'_>) -> Result<Target, Verdict> {
    let spec = find_service(service, scope)?.spec.as_ref();
    if let Some(external) = spec.filter(|s| s.type_.as_deref() == Some("ExternalName")) {
        return external_name(service, external, scope);
    }
    let selects_pods = spec.and_then(|s| s.selector.as_ref()).is_some_and(|selector| !selector.is_empty());
    if selects_pods { through_endpoints(service, spec, scope) } else { without_selector(service, spec, scope) }
}

fn find_service<'a>(service: &ServiceBackend, scope: &Scope<'a>) -> Result<&'a Service, Verdict> {
    find::<Service>(scope.inputs.services, scope.namespace, &service.name).ok_or_else(|| {
        let message = format!("{}: Service {}/{} not found", scope.field(), scope.namespace, service.name);
        Verdict::refused(reasons::BACKEND_NOT_FOUND, message)
    })
}

/// An `ExternalName` Service: its host, within the Gateway's egress rules.
fn external_name(service: &ServiceBackend, spec: &ServiceSpec, scope: &Scope<'_>) -> Result<Target, Verdict> {
    let url = base_url(service, spec.external_name.as_deref().unwrap_or_default(), scope);
    scope.egress(&url).map_err(|why| {
        let message = format!("{}: ExternalName Service {}/{}: {why}", scope.field(), scope.namespace, service.name);
        Verdict::refused(reasons::NOT_ALLOWED_BY_GATEWAY, message)
    })?;
    Ok(Target { url, endpoints: None })
}

/// A Service that selects no pods: its ClusterIP (or DNS name), within the
/// Gateway's egress rules.
fn without_selector(
    service: &ServiceBackend,
    spec: Option<&ServiceSpec>,
    scope: &Scope<'_>,
) -> Result<Target, Verdict> {
    let host = cluster_ip(spec).map_or_else(|| dns_name(service, scope), bracketed);
    let url = base_url(service, &host, scope);
    scope.egress(&url).map_err(|why| {
        let message = format!(
            "{}: Service {}/{} selects no pods, so its endpoints are anyone's choice: held to the Gateway's \
             egress rules: {why}",
            scope.field(),
            scope.namespace,
            service.name
        );
        Verdict::refused(reasons::NOT_ALLOWED_BY_GATEWAY, message)
    })?;
    Ok(Target { url, endpoints: None })
}

/// A Service that selects pods, served through its ready endpoints: the
/// URL is the fallback while none is known, and gives the `Host`.
fn through_endpoints(
    service: &ServiceBackend,
    spec: Option<&ServiceSpec>,
    scope: &Scope<'_>,
) -> Result<Target, Verdict> {
    let has_port =
        spec.and_then(|s| s.ports.as_ref()).is_some_and(|ports| ports.iter().any(|p| p.port == service.port));
    if !has_port {
        let message =
            format!("{}: Service {}/{} has no port {}", scope.field(), scope.namespace, service.name, service.port);
        return Err(Verdict::refused(reasons::BACKEND_NOT_FOUND, message));
    }
    // With TLS, the Service's DNS name: what its certificate names (unless
    // `serverName` says otherwise). A headless Service has only its name.
    let host = match cluster_ip(spec) {
        Some(ip) if !scope.tls => bracketed(ip),
        _ => dns_name(service, scope),
    };
    let port = u16::try_from(service.port).unwrap_or_default();
    let endpoints = waycast_crds::endpoints::service_key(scope.namespace, &service.name, port);
    Ok(Target { url: base_url(service, &host, scope), endpoints: Some(endpoints) })
}

/// `<scheme>://<host>:<port><basePath>`.
fn base_url(service: &ServiceBackend, host: &str, scope: &Scope<'_>) -> String {
    let base_path = service.base_path.as_deref().unwrap_or(DEFAULT_BASE_PATH);
    format!("{}://{host}:{}{base_path}", scope.scheme(), service.port)
}

/// The Service's ClusterIP, if it has one (not headless).
fn cluster_ip(spec: Option<&ServiceSpec>) -> Option<&str> {
    spec.and_then(|s| s.cluster_ip.as_deref()).filter(|ip| !ip.is_empty() && *ip != "None")
}

/// An IP as a URL's host (an IPv6 address in brackets).
fn bracketed(ip: &str) -> String {
    if ip.contains(':') { format!("[{ip}]") } else { ip.to_owned() }
}

fn dns_name(service: &ServiceBackend, scope: &Scope<'_>) -> String {
    format!("{}.{}.svc", service.name, scope.namespace)
}
