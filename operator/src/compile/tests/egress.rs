//! Egress: the Gateway's rules and the ranges closed by default, for url backends and Services that act like them.

use super::*;

#[test]
fn egress_rules_of_the_gateway_apply_to_url_backends() {
    let mut world = World::quickstart();
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        denied_cidrs: vec!["10.0.0.0/8".into()],
        allowed_hosts: vec!["*.openai.azure.com".into(), "10.1.2.3".into()],
        ..Default::default()
    });
    let url = |name: &str, u: &str| {
        model_endpoint("demo", name, 10, name, vec![Backend { url: Some(u.into()), ..Backend::default() }])
    };
    world.models.extend([
        url("azure", "https://res.openai.azure.com/v1"),
        url("elsewhere", "https://api.example.com/v1"),
        url("internal", "http://10.1.2.3/v1"),
    ]);
    let compiled = world.compile();
    assert!(compiled.models[&key("demo", "azure")].accepted);
    for name in ["elsewhere", "internal"] {
        assert_eq!(compiled.models[&key("demo", name)].reason, reasons::NOT_ALLOWED_BY_GATEWAY, "{name}");
    }
    assert!(compiled.models[&key("demo", "llama")].accepted, "Service backends are not url backends");
    assert_eq!(compiled.config.settings.denied_cidrs, ["10.0.0.0/8"]);
}

/// Egress is closed by default: a `url` backend naming loopback, the
/// cluster's ranges or the API server is not served unless the Gateway
/// opens them; the closed ranges are written for the gateway to check
/// every address a name resolves to.
#[test]
fn loopback_the_cluster_and_the_api_server_are_closed_to_url_backends_by_default() {
    let mut world = World::quickstart();
    let url = |name: &str, u: &str| {
        model_endpoint("demo", name, 10, name, vec![Backend { url: Some(u.into()), ..Backend::default() }])
    };
    world.models.extend([
        url("loopback", "http://127.0.0.1:8000/v1"),
        url("mapped", "http://[::ffff:127.0.0.1]:8000/v1"),
        url("service-ip", "http://10.96.0.20:8000/v1"),
        url("pod-ip", "http://10.244.0.7:8000/v1"),
        url("apiserver", "https://192.168.49.2:6443/v1"),
        url("external", "https://api.openai.com/v1"),
        url("private", "http://172.16.5.5:8000/v1"),
    ]);
    let catalog_world = |world: &World, ranges: &[&str], api_server: &[&str]| {
        let mut catalog =
            Catalog::from_objects(&world.namespaces, &world.models, &world.keys, &world.services, &world.secrets);
        catalog.cluster_ranges = std::sync::Arc::new(ranges.iter().map(|r| (*r).to_owned()).collect());
        catalog.api_server = api_server.iter().map(|r| (*r).to_owned()).collect();
        catalog.compile(&world.gateway, now())
    };
    let compiled = catalog_world(&world, &["10.96.0.0/12", "10.244.0.0/16"], &["192.168.49.2/32"]);
    for name in ["loopback", "mapped", "service-ip", "pod-ip", "apiserver"] {
        assert_eq!(compiled.models[&key("demo", name)].reason, reasons::NOT_ALLOWED_BY_GATEWAY, "{name}");
    }
    assert!(compiled.models[&key("demo", "external")].accepted);
    assert!(compiled.models[&key("demo", "llama")].accepted, "the model's own Service is not a url backend");
    let closed = &compiled.config.settings.closed_cidrs;
    for range in ["127.0.0.0/8", "::1/128", "10.96.0.0/12", "10.244.0.0/16", "192.168.49.2/32"] {
        assert!(closed.iter().any(|c| c == range), "{range} not closed: {closed:?}");
    }
    // Not known, or known in part: every private range is closed still.
    let unknown = catalog_world(&world, &[], &[]);
    assert_eq!(unknown.models[&key("demo", "pod-ip")].reason, reasons::NOT_ALLOWED_BY_GATEWAY);
    let public = catalog_world(&world, &["198.18.0.0/15"], &[]);
    assert!(public.config.settings.closed_cidrs.iter().any(|c| c == "198.18.0.0/15"), "a public cluster range");
    for known in [&compiled, &unknown, &public] {
        let closed = &known.config.settings.closed_cidrs;
        for range in waycast_crds::egress::PRIVATE_RANGES {
            assert!(closed.iter().any(|c| c == range), "{range} not closed: {closed:?}");
        }
        // A private address outside every range the operator found.
        assert_eq!(known.models[&key("demo", "private")].reason, reasons::NOT_ALLOWED_BY_GATEWAY);
    }
    // Opened by the Gateway.
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        allowed_cidrs: vec!["10.244.0.0/16".into()],
        ..Default::default()
    });
    let opened = catalog_world(&world, &["10.96.0.0/12", "10.244.0.0/16"], &["192.168.49.2/32"]);
    assert!(opened.models[&key("demo", "pod-ip")].accepted);
    assert!(!opened.models[&key("demo", "service-ip")].accepted);
    assert!(!opened.models[&key("demo", "loopback")].accepted);
    assert_eq!(opened.config.settings.allowed_cidrs, ["10.244.0.0/16"]);
}

/// A Service without a selector has endpoints written by hand (any
/// address): it is held to the egress rules like a `url` to its ClusterIP,
/// so in the closed cluster range it is not served.
#[test]
fn a_service_without_a_selector_is_held_to_the_egress_rules() {
    let mut world = World::quickstart();
    let mut manual = service("demo", "manual", "10.96.0.99", 8000);
    if let Some(spec) = manual.spec.as_mut() {
        spec.selector = None;
    }
    // An empty selector selects no pods either.
    let mut empty = service("demo", "empty", "10.96.0.98", 8000);
    if let Some(spec) = empty.spec.as_mut() {
        spec.selector = Some(BTreeMap::new());
    }
    world.services.extend([manual, empty]);
    world.models.push(model_endpoint("demo", "manual", 10, "manual", vec![service_backend("manual", 8000)]));
    world.models.push(model_endpoint("demo", "empty", 11, "empty", vec![service_backend("empty", 8000)]));
    let compiled = world.compile();
    for name in ["manual", "empty"] {
        let verdict = &compiled.models[&key("demo", name)];
        assert_eq!(verdict.reason, reasons::NOT_ALLOWED_BY_GATEWAY, "{name}");
        assert!(verdict.message.contains("selects no pods"), "{name}: {}", verdict.message);
    }
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        allowed_cidrs: vec!["10.96.0.99/32".into()],
        ..Default::default()
    });
    let compiled = world.compile();
    let backend = &compiled.config.models.iter().find(|m| m.name == "manual").unwrap().backends[0];
    assert_eq!((backend.url.as_str(), backend.endpoints.as_deref()), ("http://10.96.0.99:8000/v1", None));
}

/// An ExternalName Service names a host the team chose: it is held to the
/// Gateway's allowed hosts and served as a `url` backend (no endpoints, so
/// the gateway checks every address it resolves to).
#[test]
fn an_external_name_service_is_held_to_the_egress_rules() {
    let mut world = World::quickstart();
    let mut external = service("demo", "outside", "", 443);
    if let Some(spec) = external.spec.as_mut() {
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some("api.example.com".into());
        spec.cluster_ip = None;
    }
    world.services.push(external);
    world.models.push(model_endpoint("demo", "outside", 10, "outside", vec![service_backend("outside", 443)]));
    let compiled = world.compile();
    assert!(compiled.models[&key("demo", "outside")].accepted);
    let backend = &compiled.config.models.iter().find(|m| m.name == "outside").unwrap().backends[0];
    assert_eq!((backend.url.as_str(), backend.endpoints.as_deref()), ("http://api.example.com:443/v1", None));
    world.gateway.spec.egress = Some(waycast_crds::gateway::GatewayEgress {
        allowed_hosts: vec!["api.openai.com".into()],
        ..Default::default()
    });
    let refused = &world.compile().models[&key("demo", "outside")];
    assert_eq!(refused.reason, reasons::NOT_ALLOWED_BY_GATEWAY);
    assert!(refused.message.contains("ExternalName"), "{}", refused.message);
}
