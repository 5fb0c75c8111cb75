//! Applying YAML manifests and waiting on what they create: server-side
//! apply of multi-document YAML through API discovery, CRD installation.

use std::time::Duration;

use anyhow::{Context as _, anyhow};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Api, Client, ResourceExt as _};

use crate::wait::{await_condition, within};

/// The field manager of everything the harness applies.
pub const FIELD_MANAGER: &str = "waycast-e2e";

/// Splits multi-document YAML into objects, skipping empty documents.
///
/// # Errors
/// A document that is not a Kubernetes object.
pub fn parse_documents(yaml: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(yaml) {
        let value = serde_json::Value::deserialize(document).context("parsing a YAML document")?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject = serde_json::from_value(value).context("a YAML document is not an object")?;
        objects.push(object);
    }
    Ok(objects)
}

use serde::Deserialize as _;

/// An object written as JSON (`json!({...})`), as a manifest states it: the
/// one way tests write the objects they apply.
///
/// # Panics
/// When `value` is not a Kubernetes object (no `apiVersion`, `kind` or
/// `metadata`): a test's own mistake.
pub fn object(value: serde_json::Value) -> DynamicObject {
    serde_json::from_value(value).unwrap_or_else(|error| panic!("not a Kubernetes object: {error}"))
}

/// Resolves an object's kind to its API resource through discovery.
///
/// # Errors
/// The object has no `apiVersion`/`kind`, or the server does not serve it.
pub async fn resolve(client: &Client, object: &DynamicObject) -> anyhow::Result<(ApiResource, ApiCapabilities)> {
    let types = object.types.as_ref().ok_or_else(|| anyhow!("object {} has no apiVersion/kind", object.name_any()))?;
    let gvk = GroupVersionKind::try_from(types).context("reading apiVersion/kind")?;
    kube::discovery::pinned_kind(client, &gvk).await.with_context(|| format!("discovering {}", types.kind))
}

/// Server-side applies `objects` in order. Namespaced objects without a
/// namespace go to `default_namespace`. Namespaces are applied first.
///
/// # Errors
/// The first refusal, with the object's kind and name and the server's
/// message.
pub async fn apply_all(client: &Client, objects: &[DynamicObject], default_namespace: &str) -> anyhow::Result<()> {
    let mut ordered: Vec<&DynamicObject> = objects.iter().collect();
    ordered.sort_by_key(|o| o.types.as_ref().is_none_or(|t| t.kind != "Namespace"));
    for object in ordered {
        apply(client, object, default_namespace).await?;
    }
    Ok(())
}

/// Server-side applies one object.
///
/// # Errors
/// Discovery failing or the server refusing the object (its message is kept).
pub async fn apply(client: &Client, object: &DynamicObject, default_namespace: &str) -> anyhow::Result<DynamicObject> {
    let (resource, capabilities) = resolve(client, object).await?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            Api::namespaced_with(client.clone(), object.namespace().as_deref().unwrap_or(default_namespace), &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let name = object.name_any();
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object))
        .await
        .with_context(|| format!("applying {} {name}", resource.kind))
}

/// Applies every waycast CRD (as this build renders them) and waits until
/// each is Established.
///
/// # Errors
/// The API server refusing a CRD, or a CRD not Established within 30s.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in waycast_crds::crds() {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&crd)).await.with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in waycast_crds::crds() {
        wait_established(client, &crd.name_any(), Duration::from_secs(30)).await?;
    }
    Ok(())
}

/// Waits until the named CRD has `Established=True`.
///
/// # Errors
/// Not Established in time.
pub async fn wait_established(client: &Client, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patience = within(timeout).every(Duration::from_millis(50));
    await_condition(format!("CRD {name} is Established"), patience, async || {
        let crd = api.get(name).await.with_context(|| format!("reading CRD {name}"))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        anyhow::Ok(established)
    })
    .await
}
