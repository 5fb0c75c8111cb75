//! Builders of a many-object fleet on one Gateway — ApiKeys with their
//! generated key Secrets, and ModelEndpoints — as the API server would hold
//! them. For tests and benchmarks (the goldens' oversized case, the scale
//! benchmark, `xtask compile-figures`); the operator never calls them.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use waycast_crds::common::ParentReference;
use waycast_crds::{ApiKey, ApiKeySpec, Gateway, GatewaySpec, ModelEndpoint};

use crate::compile;

/// The objects of one Gateway's fleet.
pub struct Fleet {
    /// The Gateway.
    pub gateway: Gateway,
    /// Its ModelEndpoints (external URL backends: no Services needed).
    pub models: Vec<ModelEndpoint>,
    /// Its ApiKeys, each with a generated-style key Secret.
    pub keys: Vec<ApiKey>,
    /// The key Secrets `<key>-key`, as the operator would have generated them.
    pub secrets: Vec<Secret>,
}

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}

/// The key text of key number `index` (deterministic, so a benchmark can
/// use it without reading Secrets back).
pub fn key_text(index: usize) -> String {
    let mut bytes = [0_u8; 32];
    bytes[..8].copy_from_slice(&(index as u64).to_le_bytes());
    bytes[8..16].copy_from_slice(b"waycast!");
    waycast_crds::api_key::key_text_from_bytes(&bytes)
}

fn key_uid(index: usize) -> String {
    format!("00000000-0000-4000-8000-{index:012}")
}

/// A key Secret for `key_name` holding `text`, labelled for the operator.
pub fn key_secret(namespace: &str, key_name: &str, text: &str) -> Secret {
    let mut metadata = meta(namespace, &compile::keys::generated_secret_name(key_name));
    metadata.labels = Some(BTreeMap::from([(waycast_crds::api_key::KEY_SECRET_LABEL.to_owned(), "true".to_owned())]));
    Secret {
        metadata,
        data: Some(BTreeMap::from([(
            compile::keys::GENERATED_DATA_KEY.to_owned(),
            ByteString(text.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

/// `keys` ApiKeys and `models` ModelEndpoints in `namespace`, served by one
/// Gateway named `gateway`. Model `model-N` goes to `upstream` (a base URL).
pub fn fleet(namespace: &str, keys: usize, models: usize, upstream: &str) -> Fleet {
    let mut gateway = Gateway::new("gateway", GatewaySpec::default());
    gateway.metadata = meta(namespace, "gateway");
    let models = (0..models)
        .map(|i| {
            let spec = serde_json::json!({
                "model": format!("model-{i}"),
                "backends": [{"url": upstream}],
                "parentRefs": [{"name": "gateway", "namespace": namespace}],
            });
            let spec = serde_json::from_value(spec).unwrap_or_else(|_| unreachable!("a valid ModelEndpoint spec"));
            let mut endpoint = ModelEndpoint::new(&format!("model-{i}"), spec);
            endpoint.metadata = meta(namespace, &format!("model-{i}"));
            endpoint
        })
        .collect();
    // Each names the Gateway, as teams' objects do on a shared Gateway. The
    // uid stands in for the API server's (which sets its own on create):
    // a generated key's Secret must be owned by its ApiKey.
    let parent = vec![ParentReference { name: "gateway".into(), namespace: Some(namespace.to_owned()) }];
    let key_objects = (0..keys)
        .map(|i| {
            let mut key = ApiKey::new(&format!("key-{i}"), ApiKeySpec::default());
            key.metadata = meta(namespace, &format!("key-{i}"));
            key.metadata.uid = Some(key_uid(i));
            key.spec.parent_refs = parent.clone();
            key
        })
        .collect();
    let secrets = (0..keys)
        .map(|i| {
            let mut secret = key_secret(namespace, &format!("key-{i}"), &key_text(i));
            secret.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "waycast.dev/v1alpha1".into(),
                kind: "ApiKey".into(),
                name: format!("key-{i}"),
                uid: key_uid(i),
                controller: Some(true),
                ..OwnerReference::default()
            }]);
            secret
        })
        .collect();
    Fleet { gateway, models, keys: key_objects, secrets }
}
