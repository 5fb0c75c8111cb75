//! `ModelEndpoint`: a model clients can ask for, and where requests for it go.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Limits, SecretKeyRef};

/// A model that clients can ask for by name, and the backends that serve it.
///
/// Published by the team that runs the model, in its own namespace; every
/// Gateway whose selectors match it serves it. When two ModelEndpoints on one
/// Gateway claim the same name, the older one wins and the other reports
/// `ModelNameConflict`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[kube(
    group = "waycast.dev",
    version = "v1alpha1",
    kind = "ModelEndpoint",
    doc = "A model that clients can ask a waycast Gateway for, and the backends that serve it.",
    namespaced,
    status = "ModelEndpointStatus",
    shortname = "me",
    category = "waycast",
    printcolumn = r#"{"name": "Model", "type": "string", "jsonPath": ".spec.model", "description": "Model name clients send"}"#,
    printcolumn = r#"{"name": "Backends", "type": "integer", "jsonPath": ".status.backendCount", "description": "Backends configured"}"#,
    printcolumn = r#"{"name": "Accepted", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].status", "description": "Served by every selecting Gateway"}"#,
    printcolumn = r#"{"name": "Programmed", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Programmed\")].status", "description": "Every ready gateway pod serves it"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!has(self.aliases) || !(self.model in self.aliases)").message("aliases must not repeat the model name"))]
#[x_kube(validation = Rule::new("self.backends.exists(b, !has(b.weight) || b.weight > 0)").message("at least one backend needs a weight above 0"))]
#[serde(rename_all = "camelCase")]
pub struct ModelEndpointSpec {
    /// The model name clients send in the request's `"model"` field.
    #[schemars(length(min = 1, max = 256), pattern(r"^[^\s*]+$"))]
    pub model: String,

    /// More names clients may use for the same model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256), pattern(r"^[^\s*]+$")))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub aliases: Vec<String>,

    /// Where requests go. With several backends, requests are spread by
    /// weight; a backend that refuses connections is skipped for the next.
    #[schemars(length(min = 1, max = 16))]
    pub backends: Vec<Backend>,

    /// Timeouts towards the backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,

    /// Rate limits for this model, over all keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

/// One upstream that serves the model: an in-cluster Service or an
/// OpenAI-compatible base URL.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = Rule::new("has(self.service) != has(self.url)").message("a backend needs exactly one of service or url"))]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// A Service in the ModelEndpoint's own namespace (vLLM, SGLang, TGI,
    /// Ollama, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceBackend>,

    /// An OpenAI-style base URL such as `https://api.openai.com/v1`, for
    /// external providers: a request for `/v1/X` goes to `<url>/X`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''").message("url must be an absolute http:// or https:// URL"))]
    pub url: Option<String>,

    /// Model name sent upstream instead of the one the client asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub model: Option<String>,

    /// Share of requests relative to the other backends. 0 takes requests
    /// only when all others refuse connections. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub weight: Option<i32>,

    /// A credential the gateway adds to upstream requests. The client's own
    /// Authorization header is never forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<BackendAuth>,
}

/// A Service backend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBackend {
    /// Name of a Service in the ModelEndpoint's namespace.
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Service port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Path prefix of the OpenAI-compatible API on that Service. Default `/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), pattern(r"^/[^\s?#]*$"))]
    pub base_path: Option<String>,
}

/// An upstream credential injected by the gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendAuth {
    /// The Secret key holding the credential.
    pub secret_ref: SecretKeyRef,
    /// Header that carries it. Default `Authorization`, sent as
    /// `Bearer <credential>`; any other header (e.g. `x-api-key`, `api-key`)
    /// carries the credential as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), pattern(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"))]
    pub header: Option<String>,
}

/// Timeouts towards the backends. There is no total-duration timeout: a long
/// stream is never cut while chunks keep coming.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Establishing the connection (e.g. `5s`). Default 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub connect: Option<String>,
    /// From sending the request to the first response byte (e.g. `300s`).
    /// Default 300s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub first_byte: Option<String>,
    /// Longest pause between two response chunks (e.g. `60s`). Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub idle: Option<String>,
}

/// What the operator last saw and did for a ModelEndpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelEndpointStatus {
    /// `Accepted` (served by every Gateway that selects it), `ResolvedRefs`
    /// (Services and Secrets found), `Programmed` (every ready gateway pod
    /// serves it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Per Gateway that selects this ModelEndpoint: whether it serves it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["gateway".into()]))]
    pub gateways: Vec<GatewayAcceptance>,
    /// Number of backends in the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_count: Option<i32>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Whether one Gateway serves the object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAcceptance {
    /// The Gateway, as `namespace/name`.
    pub gateway: String,
    /// Whether that Gateway serves the object.
    pub accepted: bool,
    /// CamelCase reason, e.g. `Accepted`, `ModelNameConflict`, `BackendNotFound`.
    pub reason: String,
    /// What a person needs to know, e.g. which ModelEndpoint won a conflict.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
