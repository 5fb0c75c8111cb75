//! Golden test: each case's inputs compiled and rendered — every owned
//! object, every object's verdict and the Gateway's status — compared with
//! the committed `golden/<case>/output.yaml`. `UPDATE_GOLDEN=1 cargo test
//! -p waycast-operator --test golden` rewrites the files after an intended
//! change; review the diff.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::path::Path;

use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Deserialize as _;
use waycast_crds::{ApiKey, Gateway, ModelEndpoint};
use waycast_operator::catalog::Catalog;
use waycast_operator::render::{self, RenderSettings};
use waycast_operator::status;

/// The layout chosen afresh, with a fixed salt (the operator draws one at
/// random), so the goldens are stable.
fn layouts() -> render::config_parts::Layouts {
    render::config_parts::Layouts { current: None, fresh_salt: "0123456789abcdef".into() }
}

fn render_case(input: &str) -> String {
    let (mut gateways, mut models, mut keys, mut services, mut secrets) = (vec![], vec![], vec![], vec![], vec![]);
    let mut namespaces = vec![];
    let mut slices: Vec<EndpointSlice> = vec![];
    for document in serde_yaml_ng::Deserializer::from_str(input) {
        let value = serde_yaml_ng::Value::deserialize(document).unwrap();
        match value["kind"].as_str().unwrap() {
            "Gateway" => gateways.push(serde_yaml_ng::from_value::<Gateway>(value).unwrap()),
            "ModelEndpoint" => models.push(serde_yaml_ng::from_value::<ModelEndpoint>(value).unwrap()),
            "ApiKey" => keys.push(serde_yaml_ng::from_value::<ApiKey>(value).unwrap()),
            "Service" => services.push(serde_yaml_ng::from_value::<Service>(value).unwrap()),
            "Secret" => secrets.push(serde_yaml_ng::from_value::<Secret>(value).unwrap()),
            "Namespace" => namespaces.push(serde_yaml_ng::from_value::<Namespace>(value).unwrap()),
            "EndpointSlice" => slices.push(serde_yaml_ng::from_value::<EndpointSlice>(value).unwrap()),
            other => panic!("unexpected kind {other}"),
        }
    }
    let gateway = &gateways[0];
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let mut catalog = Catalog::from_objects(&namespaces, &models, &keys, &services, &secrets);
    // The EndpointSlices as the operator's store keeps them.
    for slice in &mut slices {
        waycast_operator::store_views::endpoint_slice(slice);
    }
    catalog.endpoint_slices = slices.into_iter().map(std::sync::Arc::new).collect();
    let compiled = catalog.compile(gateway, now);
    // The chart's defaults: a NetworkPolicy letting the monitoring
    // namespace scrape the pods.
    let metrics_from = serde_json::from_value(serde_json::json!([
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]))
    .unwrap();
    let settings = RenderSettings {
        gateway_image: "docker.io/waycast/gateway:dev".into(),
        network_policy: Some(render::network_policy::NetworkPolicySettings { metrics_from, egress: Vec::new() }),
    };
    let desired =
        render::desired(gateway, &compiled.config, &layouts(), &catalog.endpoints(&compiled.config), &settings)
            .unwrap();
    let parts = desired.config.as_ref().unwrap();
    let mut documents = vec![
        format!("# config hash {}\n{}", desired.config_hash, serde_yaml_ng::to_string(&compiled.config).unwrap()),
        serde_yaml_ng::to_string(&desired.service_account).unwrap(),
        serde_yaml_ng::to_string(&desired.role).unwrap(),
        serde_yaml_ng::to_string(&desired.role_binding).unwrap(),
    ];
    // The config's Secrets, metadata only (their data is the config above).
    documents.extend(parts.in_write_order().map(|meta| serde_yaml_ng::to_string(meta).unwrap()));
    documents.extend([
        serde_yaml_ng::to_string(&desired.deployment).unwrap(),
        serde_yaml_ng::to_string(&desired.service).unwrap(),
        serde_yaml_ng::to_string(&desired.network_policy).unwrap(),
    ]);
    // The endpoints ConfigMap, from the Services' EndpointSlices.
    documents.push(serde_yaml_ng::to_string(&desired.endpoints).unwrap());
    // Each object's verdict, as its status will show it.
    let mut verdicts = String::from("# verdicts\n");
    for (id, verdict) in &compiled.models {
        verdicts
            .push_str(&format!("ModelEndpoint {id}: {} {} {}\n", verdict.accepted, verdict.reason, verdict.message));
    }
    for (id, verdict) in &compiled.keys {
        let v = &verdict.verdict;
        verdicts.push_str(&format!("ApiKey {id}: {} {} {}\n", v.accepted, v.reason, v.message));
    }
    documents.push(verdicts);
    documents.extend(desired.hpa.as_ref().map(|hpa| serde_yaml_ng::to_string(hpa).unwrap()));
    documents.extend(desired.pdb.as_ref().map(|pdb| serde_yaml_ng::to_string(pdb).unwrap()));
    // The Gateway's status once its Deployment is ready and every pod
    // serves the config.
    let wanted = render::scaling::minimum_replicas(gateway);
    let facts = status::GatewayFacts {
        refused: compiled.gateway.as_ref(),
        hash: &desired.config_hash,
        too_large: desired.config.as_ref().err(),
        left_out: 0,
        models: compiled.config.models.len(),
        keys: compiled.config.keys.len(),
        refusing: &[],
        up_to_date: usize::try_from(wanted).unwrap(),
        replicas: wanted,
        ready: wanted,
        wanted,
        address: Some("10.96.0.10:80".into()),
        tenants: &compiled.tenants,
        // No key set fetched (the inputs have no identity providers).
        identity: waycast_operator::key_sets::status_of(gateway, &Default::default()),
    };
    let gateway_status = status::gateway_status(gateway, &facts, now);
    documents
        .push(format!("# Gateway status, every pod serving\n{}", serde_yaml_ng::to_string(&gateway_status).unwrap()));
    documents.join("---\n")
}

/// A Gateway whose config outgrows its Secrets. 30,000 keys (random
/// hashes, so gzip cannot shrink them much: more than 1 MiB gzipped) no
/// longer do — they are split into shards — but models and settings are
/// one part, and a model with 40,000 aliases of random text makes it more
/// than a Secret holds. Its config is not written, the pods keep the last
/// one, and the status says why. The golden holds the sizes and the
/// status, not the megabytes of config.
#[test]
fn an_oversized_config_is_not_written_and_the_status_says_why() {
    let fleet = waycast_mock::fixtures::fleet::fleet("ai", 30_000, 2, "http://upstream.ai:8000/v1");
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta { name: Some("ai".into()), ..Default::default() },
        ..Namespace::default()
    };
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let catalog = Catalog::from_objects(&[namespace], &fleet.models, &fleet.keys, &[], &fleet.secrets);
    let mut compiled = catalog.compile(&fleet.gateway, now);
    assert_eq!(compiled.config.keys.len(), 30_000);
    let settings = RenderSettings { gateway_image: "docker.io/waycast/gateway:dev".into(), network_policy: None };
    let endpoints = waycast_crds::endpoints::EndpointsDocument::new();
    let sharded = render::desired(&fleet.gateway, &compiled.config, &layouts(), &endpoints, &settings).unwrap();
    let parts = sharded.config.as_ref().unwrap();
    let sizes = format!(
        "# 30000 keys: {} shards, {} bytes of Secret data, {} of JSON\n",
        parts.layout.shards,
        parts.data_bytes_in_all().unwrap(),
        parts.json_bytes
    );
    compiled.config.models[0].aliases =
        (0..40_000_u32).map(|n| waycast_crds::digest::sha256_hex(&n.to_le_bytes())).collect();
    let desired = render::desired(&fleet.gateway, &compiled.config, &layouts(), &endpoints, &settings).unwrap();
    let Err(too_large) = &desired.config else { panic!("the config fits its Secrets: make the case larger") };
    let wanted = render::scaling::minimum_replicas(&fleet.gateway);
    // The hash the pods are told to serve is the last one written (the
    // reconciler's `what_to_write`), and they all serve it.
    let last_written = "5e1ec7ed".repeat(8);
    let facts = status::GatewayFacts {
        refused: compiled.gateway.as_ref(),
        hash: &last_written,
        too_large: Some(too_large),
        left_out: 0,
        models: compiled.config.models.len(),
        keys: compiled.config.keys.len(),
        refusing: &[],
        up_to_date: usize::try_from(wanted).unwrap(),
        replicas: wanted,
        ready: wanted,
        wanted,
        address: Some("10.96.0.10:80".into()),
        tenants: &compiled.tenants,
        identity: None,
    };
    let gateway_status = status::gateway_status(&fleet.gateway, &facts, now);
    let rendered = format!(
        "{sizes}# with 40000 aliases: {too_large}\n# Gateway status, every pod serving the last config written\n{}",
        serde_yaml_ng::to_string(&gateway_status).unwrap()
    );
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden-oversized.yaml");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    assert!(expected == rendered, "{} differs; rerun with UPDATE_GOLDEN=1 and review", golden.display());
}

#[test]
fn compile_and_render_match_the_goldens() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for case in std::fs::read_dir(&root).unwrap() {
        let dir = case.unwrap().path();
        let rendered = render_case(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
        let golden = dir.join("output.yaml");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, &rendered).unwrap();
        }
        let expected = std::fs::read_to_string(&golden).unwrap_or_default();
        assert!(
            expected == rendered,
            "{} differs from what compile+render produce now; rerun with UPDATE_GOLDEN=1 and review",
            golden.display()
        );
    }
}
