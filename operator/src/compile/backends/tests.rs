//! Table tests of backend resolution: each kind's row, what a kind cannot
//! resolve, and a backend of no single kind.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use waycast_crds::condition::reasons;
use waycast_crds::model_endpoint::{Backend, ServiceBackend};
use waycast_mock::fixtures::objects;

use super::resolve;
use crate::catalog::Catalog;

/// A Service `name` of `namespace` on port 8000 at `ip` ("None": headless)
/// selecting pods (or none with `selects` false).
fn service(namespace: &str, name: &str, ip: &str, selects: bool) -> Service {
    Service {
        metadata: ObjectMeta { namespace: Some(namespace.into()), name: Some(name.into()), ..ObjectMeta::default() },
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            ports: Some(vec![ServicePort { port: 8000, ..ServicePort::default() }]),
            selector: selects.then(|| BTreeMap::from([("app".to_owned(), name.to_owned())])),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn external_name(namespace: &str, name: &str, host: &str) -> Service {
    let mut service = service(namespace, name, "", false);
    if let Some(spec) = service.spec.as_mut() {
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some(host.into());
        spec.cluster_ip = None;
    }
    service
}

fn to_service(name: &str, port: i32) -> Backend {
    Backend { service: Some(ServiceBackend { name: name.into(), port, base_path: None }), ..Backend::default() }
}

fn to_url(url: &str) -> Backend {
    Backend { url: Some(url.into()), ..Backend::default() }
}

/// What a backend of a ModelEndpoint in `demo` resolves to: its URL and
/// endpoints key, or the verdict's reason and message.
fn resolved(backend: &Backend) -> Result<(String, Option<String>), (&'static str, String)> {
    let services = [
        service("demo", "vllm", "10.96.0.50", true),
        service("demo", "v6", "fd00::50", true),
        service("demo", "headless", "None", true),
        service("demo", "manual", "10.96.0.99", false),
        external_name("demo", "outside", "api.example.com"),
        service("team-b", "theirs", "10.96.0.70", true),
    ];
    let namespaces = [Namespace::default()];
    let catalog = Catalog::from_objects(&namespaces, &[], &[], &services, &[]);
    let gateway = objects::gateway("demo", "gw");
    catalog.with_inputs(&gateway, |inputs| match resolve(0, backend, "demo", inputs) {
        Ok(config) => Ok((config.url, config.endpoints)),
        Err(verdict) => Err((verdict.reason, verdict.message.into_owned())),
    })
}

#[test]
fn each_kind_resolves_to_where_its_requests_go() {
    let with_tls = Backend { tls: Some(waycast_crds::common::ClientTls::default()), ..to_service("vllm", 8000) };
    let mut base_path = to_service("vllm", 8000);
    if let Some(service) = base_path.service.as_mut() {
        service.base_path = Some("/openai/v1".into());
    }
    let served = |url: &str, endpoints: Option<&str>| Ok((url.to_owned(), endpoints.map(str::to_owned)));
    let cases = [
        (
            "a Service selecting pods",
            to_service("vllm", 8000),
            served("http://10.96.0.50:8000/v1", Some("demo/vllm:8000")),
        ),
        ("its basePath", base_path, served("http://10.96.0.50:8000/openai/v1", Some("demo/vllm:8000"))),
        ("over TLS: its DNS name", with_tls, served("https://vllm.demo.svc:8000/v1", Some("demo/vllm:8000"))),
        ("an IPv6 ClusterIP", to_service("v6", 8000), served("http://[fd00::50]:8000/v1", Some("demo/v6:8000"))),
        (
            "headless",
            to_service("headless", 8000),
            served("http://headless.demo.svc:8000/v1", Some("demo/headless:8000")),
        ),
        ("ExternalName", to_service("outside", 8000), served("http://api.example.com:8000/v1", None)),
        ("a url", to_url("https://api.openai.com/v1"), served("https://api.openai.com/v1", None)),
        (
            "a url with its query",
            to_url("https://res.openai.azure.com/openai?api-version=2024-06-01"),
            served("https://res.openai.azure.com/openai?api-version=2024-06-01", None),
        ),
    ];
    for (name, backend, expected) in cases {
        assert_eq!(resolved(&backend), expected, "{name}");
    }
}

#[test]
fn what_a_kind_cannot_resolve_refuses_the_backend_with_its_field_named() {
    let cases = [
        (
            "no such Service",
            to_service("missing", 8000),
            reasons::BACKEND_NOT_FOUND,
            "spec.backends[0]: Service demo/missing not found",
        ),
        (
            "another namespace's Service",
            to_service("theirs", 8000),
            reasons::BACKEND_NOT_FOUND,
            "Service demo/theirs not found",
        ),
        ("no such port", to_service("vllm", 9999), reasons::BACKEND_NOT_FOUND, "has no port 9999"),
        (
            "a Service selecting no pods, in a closed range",
            to_service("manual", 8000),
            reasons::NOT_ALLOWED_BY_GATEWAY,
            "selects no pods",
        ),
        (
            "a url to loopback",
            to_url("http://127.0.0.1:8000/v1"),
            reasons::NOT_ALLOWED_BY_GATEWAY,
            "spec.backends[0].url: ",
        ),
        ("neither kind", Backend::default(), reasons::INVALID, "spec.backends[0]: needs exactly one of service or url"),
        (
            "both kinds",
            Backend { url: Some("https://api.openai.com/v1".into()), ..to_service("vllm", 8000) },
            reasons::INVALID,
            "spec.backends[0]: sets service and url",
        ),
    ];
    for (name, backend, reason, words) in cases {
        let (refused, message) = resolved(&backend).expect_err(name);
        assert_eq!(refused, reason, "{name}: {message}");
        assert!(message.contains(words), "{name}: {message}");
    }
}
