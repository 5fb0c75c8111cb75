//! Table-driven tests of compile, by topic (one file each); the fixture
//! builders they share are here.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use waycast_crds::common::{ParentReference, SecretKeyRef};
use waycast_crds::condition::reasons;
use waycast_crds::config::RedisConfig;
use waycast_crds::gateway::{NamespaceFrom, NamespacePolicy, RouteSelector};
use waycast_crds::model_endpoint::{Backend, BackendAuth, ServiceBackend};
use waycast_crds::period::Period;
use waycast_crds::sharing::KeyLimits;
use waycast_crds::spend::{Budget, BudgetConfig, GatewayBudgets};
use waycast_crds::{ApiKey, ApiKeySpec, Gateway, GatewaySpec, ModelEndpoint};

use super::*;
use crate::catalog::Catalog;
use waycast_mock::fixtures::objects;

mod api_keys;
mod credentials;
mod egress;
mod gateway_settings;
mod routes;
mod selection;
mod tenancy;

const KEY_A: &str = "wc_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const KEY_B: &str = "wc_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta { namespace: Some(namespace.into()), name: Some(name.into()), ..ObjectMeta::default() }
}

fn at(seconds: i64) -> Time {
    Time(jiff::Timestamp::from_second(seconds).unwrap())
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(2_000_000_000).unwrap()
}

fn gateway(namespace: &str, spec: GatewaySpec) -> Gateway {
    let mut gateway = objects::gateway(namespace, "gw");
    gateway.spec = spec;
    gateway
}

fn service_backend(name: &str, port: i32) -> Backend {
    Backend { service: Some(ServiceBackend { name: name.into(), port, base_path: None }), ..Backend::default() }
}

fn model_endpoint(namespace: &str, name: &str, created: i64, model: &str, backends: Vec<Backend>) -> ModelEndpoint {
    let mut endpoint = objects::model_endpoint(namespace, name, model);
    endpoint.metadata.creation_timestamp = Some(at(created));
    endpoint.spec.backends = backends;
    endpoint
}

fn service(namespace: &str, name: &str, ip: &str, port: i32) -> Service {
    Service {
        metadata: meta(namespace, name),
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            ports: Some(vec![ServicePort { port, ..ServicePort::default() }]),
            selector: Some([("app".to_owned(), name.to_owned())].into()),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn secret(namespace: &str, name: &str, key: &str, value: &str) -> Secret {
    Secret {
        metadata: meta(namespace, name),
        data: Some([(key.to_owned(), ByteString(value.as_bytes().to_vec()))].into()),
        ..Secret::default()
    }
}

fn api_key(namespace: &str, name: &str, spec: ApiKeySpec) -> ApiKey {
    let mut key = objects::api_key(namespace, name);
    // The uid its generated key Secret names as owner (`key_secret`).
    key.metadata.uid = Some(format!("uid-{name}"));
    key.spec = spec;
    key
}

/// The generated key Secret of ApiKey `api_key`, owned by it.
fn key_secret(namespace: &str, api_key: &str, value: &str) -> Secret {
    let mut secret = secret(namespace, &format!("{api_key}-key"), "api-key", value);
    secret.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        uid: format!("uid-{api_key}"),
        controller: Some(true),
        ..Default::default()
    }]);
    secret
}

/// A Secret its team opted in as an upstream credential.
fn credential(namespace: &str, name: &str, key: &str, value: &str) -> Secret {
    let mut secret = secret(namespace, name, key, value);
    secret.metadata.labels = Some([(secrets::CREDENTIAL_LABEL.to_owned(), "true".to_owned())].into());
    secret
}

fn parent(namespace: &str, name: &str) -> Vec<ParentReference> {
    vec![ParentReference { name: name.into(), namespace: Some(namespace.into()) }]
}

fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    let mut metadata = ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() };
    metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    Namespace { metadata, ..Namespace::default() }
}

struct World {
    gateway: Gateway,
    namespaces: Vec<Namespace>,
    models: Vec<ModelEndpoint>,
    keys: Vec<ApiKey>,
    services: Vec<Service>,
    secrets: Vec<Secret>,
}

impl World {
    fn quickstart() -> Self {
        let mut llama = model_endpoint("demo", "llama", 100, "llama-3.1-8b", vec![service_backend("vllm", 8000)]);
        llama.spec.aliases = vec!["llama3".into()];
        llama.spec.backends[0].model = Some("meta-llama/Llama-3.1-8B-Instruct".into());
        Self {
            gateway: gateway("demo", GatewaySpec::default()),
            namespaces: vec![namespace("demo", &[])],
            models: vec![llama],
            keys: vec![api_key(
                "demo",
                "alice",
                ApiKeySpec { models: Some(vec!["llama-*".into()]), ..ApiKeySpec::default() },
            )],
            services: vec![service("demo", "vllm", "10.96.0.50", 8000)],
            secrets: vec![key_secret("demo", "alice", KEY_A)],
        }
    }

    /// The Gateway takes ModelEndpoints from every namespace, and team-b
    /// runs an Ollama Service.
    fn with_team_b(mut self) -> Self {
        self.namespaces.push(namespace("team-b", &[]));
        self.gateway.spec.model_endpoints = Some(RouteSelector {
            namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
            selector: None,
        });
        self.services.push(service("team-b", "ollama", "10.96.0.60", 11434));
        self
    }

    fn compile(&self) -> Compiled {
        let catalog = Catalog::from_objects(&self.namespaces, &self.models, &self.keys, &self.services, &self.secrets);
        let compiled = catalog.compile(&self.gateway, now());
        compiled.config.validate().unwrap_or_else(|problems| panic!("compile produced an invalid config: {problems}"));
        compiled
    }
}

fn key(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey { namespace: namespace.into(), name: name.into() }
}
