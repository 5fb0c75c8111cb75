//! `ModelEndpoint`: a model clients can ask for, and where requests for it go.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::backend::{Backend, BackendAuth, BackendKind, ServiceBackend};
pub use crate::common::GatewayAcceptance;
use crate::common::{Limits, ParentReference};
use crate::gateway::NamespacePolicy;

/// A model that clients can ask for by name, and the backends that serve it.
///
/// Published by the team that runs the model, in its own namespace. A
/// Gateway serves it when both sides agree: the Gateway's `modelEndpoints`
/// rules admit the namespace, and `parentRefs` names the Gateway (or is
/// empty and the Gateway is in the same namespace). When two ModelEndpoints
/// on one Gateway claim the same name, one in the Gateway's namespace wins,
/// else the older one; the other reports `ModelNameConflict`.
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
    printcolumn = r#"{"name": "Gateways", "type": "string", "jsonPath": ".status.gateways[?(@.accepted==true)].gateway", "description": "Gateways that serve it"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!has(self.aliases) || !(self.model in self.aliases)").message("aliases must not repeat the model name"))]
#[x_kube(validation = Rule::new("self.backends.exists(b, !has(b.weight) || b.weight > 0)").message("at least one backend needs a weight above 0"))]
#[serde(rename_all = "camelCase")]
pub struct ModelEndpointSpec {
    /// The model name clients send in the request's `"model"` field.
    #[schemars(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}*]+$"))]
    pub model: String,

    /// More names clients may use for the same model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}*]+$")))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub aliases: Vec<String>,

    /// Where requests go: each backend is of exactly one kind, `service` (a
    /// Service in this namespace) or `url` (an external base URL), with the
    /// same `model`, `weight`, `priority`, `auth` and `tls` for every kind.
    /// With several backends, requests are spread by weight; a backend that
    /// refuses connections is skipped for the next.
    #[schemars(length(min = 1, max = 16))]
    pub backends: Vec<Backend>,

    /// Timeouts towards the backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,

    /// Rate limits for this model, over all keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,

    /// When this model is full: past it, each gateway pod queues the
    /// model's requests and sends them on fairly (by class, then by the
    /// teams' weights) as requests end. Absent: never queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<crate::sharing::ModelCapacity>,

    /// What this model's tokens cost: each request's cost goes in its
    /// usage record and the cost counters. Absent: not priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<crate::spend::Pricing>,

    /// The Gateways that may serve this model. A Gateway serves it only
    /// when its `modelEndpoints` rules admit this namespace AND this list
    /// names it; an empty list means the Gateways of this namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub parent_refs: Vec<ParentReference>,

    /// Client headers sent on to this model's backends besides the ones an
    /// inference API needs (content type, accept, user agent,
    /// `anthropic-version`, `openai-beta`, `x-stainless-*`, trace context):
    /// lowercase names, or a prefix ending in `*` (e.g. `x-session-*`).
    /// Headers that choose what the provider bills under the backend's
    /// credential (`openai-organization`, `openai-project`,
    /// `anthropic-beta`, any other `openai-*` or `anthropic-*`) go only when
    /// listed here by their whole name (a prefix never covers them). Client credentials, cookies, hop-by-hop headers and the
    /// endpoint picker's (`x-gateway-inference-*`, `x-llm-d-*`) are never
    /// forwarded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 128), pattern(r"^[a-z0-9!#$%&'+.^_`|~-]+\*?$")))]
    pub forward_headers: Vec<String>,

    /// Query parameters of a client's request sent on to the backends, by
    /// name (e.g. `api-version`); every other parameter of the client's
    /// query is dropped. A backend URL's own query is always sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 128), pattern(r"^[A-Za-z0-9._~-]+$")))]
    pub forward_query_parameters: Vec<String>,

    /// Output tokens a request that sets no `max_tokens` (nor
    /// `max_completion_tokens`, `max_output_tokens`) reserves against token
    /// limits until its usage is known. Default 1024. Not sent upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000_000))]
    pub output_token_reservation: Option<i64>,

    /// Whose ApiKeys may call this model. Default: keys in this
    /// ModelEndpoint's namespace only. The name is this namespace's own:
    /// keys of another namespace (admitted here) reach the model only when
    /// they opt in to it with `<this namespace>/<name>` in their `models`,
    /// and their own namespace's and the Gateway namespace's models of the
    /// same name come first. A ModelEndpoint in the Gateway's own namespace
    /// is a platform model: every admitted key resolves it after its own
    /// namespace's. A key that may not call the model gets the same 404 as
    /// for a model that does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<ModelVisibility>,

    /// How requests are spread over the pods behind `service` backends: the
    /// gateway sends each request to one ready endpoint of the Service (not
    /// through its ClusterIP) and picks it by this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancing: Option<LoadBalancing>,

    /// The inference APIs this model offers: a request for another is
    /// refused (404 `unsupported_endpoint`, in the caller's dialect) before
    /// anything is counted or sent. Default: every API its backends' format
    /// serves. E.g. `[ChatCompletions, Messages, CountTokens]` for a chat
    /// model, `[Embeddings]` for an embedding model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 13))]
    pub apis: Option<Vec<crate::model_api::ModelApi>>,
}

/// How requests are spread over a Service's endpoints.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancing {
    /// `LeastRequest` (default): the endpoint with the fewest requests in
    /// flight (streams count until they end; of all up to 8 endpoints, of
    /// two at random beyond). `RoundRobin`: each
    /// in turn. `PrefixAffinity`: requests sharing a prompt prefix (or a
    /// session header) go to the same pod while its load stays within
    /// `loadFactorPercent` of the mean, so inference servers' prefix caches hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<LoadBalancingPolicy>,
    /// `PrefixAffinity`: bytes of the prompt (`messages`, `input` or
    /// `prompt`) hashed. Default 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub prefix_bytes: Option<i32>,
    /// `PrefixAffinity`: a pod keeps its prefixes while it carries at most
    /// this percentage of the mean load. Default 125.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 1000))]
    pub load_factor_percent: Option<i32>,
    /// `PrefixAffinity`: a client header (lowercase) whose value, when
    /// present, is the affinity key instead of the prompt, e.g. a session id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), pattern(r"^[a-z0-9!#$%&'+.^_`|~-]+$"))]
    pub session_header: Option<String>,
    /// Upstream statuses after which a request goes to another pod of the
    /// Service (before any byte reached the client, within a retry budget
    /// of about a tenth of the requests): any of 429, 500, 502, 503, 504.
    /// Default `[429, 503]`; `[]` retries only connect failures and resets.
    /// 5xx answers also count toward ejecting the pod; 429 does not (the
    /// pod is busy, not broken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 5), inner(range(min = 429, max = 504)))]
    #[x_kube(validation = kube::core::Rule::new("self.all(s, s in [429, 500, 502, 503, 504])").message("retryOnStatus may list only 429, 500, 502, 503 and 504"))]
    pub retry_on_status: Option<Vec<i32>>,
}

/// How one request's endpoint is chosen.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum LoadBalancingPolicy {
    /// The fewest requests in flight (of all up to 8, of two at random beyond).
    #[default]
    LeastRequest,
    /// Each endpoint in turn.
    RoundRobin,
    /// The same prompt prefix to the same pod, within a load bound.
    PrefixAffinity,
}

/// Which ApiKeys may call a model.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelVisibility {
    /// The namespaces whose keys may call it: `Same` (this namespace, the
    /// default), `All`, or `Selector` (namespaces whose labels match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<NamespacePolicy>,
}

/// Timeouts towards the backends. There is no total-duration timeout: a long
/// stream is never cut while chunks keep coming.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Establishing the connection (e.g. `5s`). Default 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be longer than 0"))]
    pub connect: Option<String>,
    /// From sending the request to the first response byte (e.g. `300s`).
    /// Default 300s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be longer than 0"))]
    pub first_byte: Option<String>,
    /// Longest pause between two response chunks (e.g. `60s`). Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be longer than 0"))]
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
    /// Per Gateway this ModelEndpoint names (or, without `parentRefs`, per
    /// Gateway of its namespace that admits it): whether it serves it, and
    /// why not (`NotAllowedByGateway`, `GatewayNotFound`, `ModelNameConflict`, ...).
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
