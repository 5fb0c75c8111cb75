//! `Gateway`: a fleet of gateway pods and the routes and keys it serves.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::common::{NamespaceFrom, NamespacePolicy};

/// A fleet of waycast gateway pods, and which ModelEndpoints and ApiKeys it serves.
///
/// The operator turns each Gateway into a Deployment (or an HPA-driven one),
/// a Service, RBAC for the pods, and a config Secret holding the compiled
/// routes and key hashes. Config changes never restart pods.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[kube(
    group = "waycast.dev",
    version = "v1alpha1",
    kind = "Gateway",
    doc = "A fleet of waycast gateway pods and the models and API keys it serves.",
    namespaced,
    status = "GatewayStatus",
    shortname = "wgw",
    category = "waycast",
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "description": "Enough gateway pods are ready"}"#,
    printcolumn = r#"{"name": "Pods", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Gateway pods ready"}"#,
    printcolumn = r#"{"name": "Models", "type": "integer", "jsonPath": ".status.modelCount", "description": "Models served"}"#,
    printcolumn = r#"{"name": "Keys", "type": "integer", "jsonPath": ".status.apiKeyCount", "description": "API keys served"}"#,
    printcolumn = r#"{"name": "Address", "type": "string", "jsonPath": ".status.address", "description": "Where clients connect"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!(has(self.replicas) && has(self.autoscaling))").message("set either replicas or autoscaling, not both"))]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Number of gateway pods when autoscaling is not used. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,

    /// Scale the gateway pods with a HorizontalPodAutoscaler instead of a
    /// fixed replica count. The operator then never sets the Deployment's
    /// replicas, so it does not fight the autoscaler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,

    /// Which namespaces (and labels) this Gateway takes ModelEndpoints from.
    /// Default: the Gateway's own namespace. An admitted ModelEndpoint in
    /// another namespace must still name this Gateway in its `parentRefs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_endpoints: Option<RouteSelector>,

    /// Which namespaces (and labels) this Gateway takes ApiKeys from.
    /// Default: the Gateway's own namespace. An admitted ApiKey in another
    /// namespace must still name this Gateway in its `parentRefs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<RouteSelector>,

    /// The token issuers this Gateway trusts (OIDC providers, the
    /// cluster's own ServiceAccount issuer): people and workloads then call
    /// with their own tokens, served through the AccessGrants of the
    /// namespaces `apiKeys` admits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::identity::GatewayIdentity>,

    /// The Service in front of the gateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<GatewayService>,

    /// Terminate TLS in the gateway with a certificate from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTls>,

    /// Limits on requests the gateway accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<GatewayLimits>,

    /// How the rate limits of ApiKeys and ModelEndpoints are counted.
    /// Absent: each pod counts its share of every limit (the limit divided
    /// by the live pods of this Gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<GatewayRateLimit>,

    /// Extra egress rules for `url` backends (external providers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<GatewayEgress>,

    /// The platform's policy per team (namespace): its share of a saturated
    /// model (`weight`), the priority classes its keys may use, and caps for
    /// all its keys together. The first policy that selects a namespace
    /// applies; a namespace none selects has weight 1, the default class
    /// only, no caps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tenants: Vec<crate::sharing::TenantPolicy>,

    /// How a saturated model is shared: priority classes, the queue's
    /// bounds, the headroom kept for teams under their share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<crate::sharing::GatewaySharing>,

    /// The time zone budget periods start in, and the currency cost
    /// budgets count in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<crate::spend::GatewayBudgets>,

    /// Where the gateway pods send traces and usage records (OTLP/HTTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<crate::telemetry::GatewayTelemetry>,

    /// Log level and access log of the gateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<GatewayLogging>,

    /// Container image of the gateway pods. Default: the image the operator
    /// was started with (`--gateway-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// Compute resources of the gateway container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Scheduling and metadata of the gateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<GatewayPodTemplate>,
}

impl GatewaySpec {
    /// The fewest gateway pods it runs: its replicas, or its autoscaler's
    /// minimum (1 when unset).
    pub fn minimum_replicas(&self) -> i32 {
        match &self.autoscaling {
            Some(autoscaling) => autoscaling.min_replicas.unwrap_or(1),
            None => self.replicas.unwrap_or(1),
        }
    }
}

/// Egress rules for `url` backends, on top of the fixed guard that no
/// backend reaches link-local or cloud metadata addresses.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayEgress {
    /// Address ranges `url` backends may not reach (e.g. `10.0.0.0/8` to
    /// keep external-provider routes off the cluster network). Checked on
    /// IP addresses in URLs when compiling, and on every address a host
    /// name resolves to when the gateway connects.
    #[serde(default, rename = "deniedCIDRs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 64)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("every deniedCIDRs entry must be a CIDR such as 10.0.0.0/8"))]
    pub denied_cidrs: Vec<String>,
    /// Address ranges `url` backends may reach although they are closed by
    /// default: loopback, the cluster's Service and Pod ranges and the API
    /// server are closed to `url` backends unless opened here or by
    /// `allowedHosts` (a ModelEndpoint's own Service backends are not `url`
    /// backends). `deniedCIDRs` are never opened.
    #[serde(default, rename = "allowedCIDRs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 64)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("every allowedCIDRs entry must be a CIDR such as 10.20.0.0/16"))]
    pub allowed_cidrs: Vec<String>,
    /// When set, `url` backends may only name these hosts: exact names or
    /// `*.example.com` for any subdomain. A ModelEndpoint naming another
    /// host is not served (`NotAllowedByGateway`). An exact name here (not
    /// a `*.` pattern) may also reach the ranges closed by default (see
    /// `allowedCIDRs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 256),
        inner(
            length(min = 1, max = 253),
            pattern(r"^(\*\.)?[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$")
        )
    )]
    pub allowed_hosts: Vec<String>,
}

/// Horizontal autoscaling of the gateway pods (an autoscaling/v2 HPA).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas").message("minReplicas must not exceed maxReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Fewest gateway pods. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub min_replicas: Option<i32>,
    /// Most gateway pods.
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// Average CPU utilisation (percent of the CPU request) to keep the pods
    /// at. Default 80 when no other target is set.
    #[serde(default, rename = "targetCPUUtilizationPercentage", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub target_cpu_utilization_percentage: Option<i32>,
    /// Average in-flight requests per pod to keep the pods at. Needs a custom
    /// metrics adapter (prometheus-adapter or KEDA) serving the pods metric
    /// `waycast_gateway_inflight_requests`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub target_inflight_requests: Option<i32>,
}

/// Selects objects by namespace and by label.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteSelector {
    /// Which namespaces the objects may live in. Default: the Gateway's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<NamespacePolicy>,
    /// Only objects whose labels match this selector. Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// The Service in front of the gateway pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayService {
    /// Service type. Default ClusterIP.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<ServiceType>,
    /// Port clients connect to. Default 80 (443 with TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// Annotations on the Service (load-balancer settings, for example).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Kubernetes Service types the gateway can be exposed with.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ServiceType {
    /// Reachable inside the cluster.
    #[default]
    ClusterIP,
    /// Also on a port of every node.
    NodePort,
    /// Also through a cloud load balancer.
    LoadBalancer,
}

/// TLS termination in the gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayTls {
    /// A `kubernetes.io/tls` Secret in the Gateway's namespace. Renewed
    /// certificates are picked up without a restart.
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret_name: String,
}

/// Limits on requests the gateway accepts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayLimits {
    /// Largest request body accepted, in bytes; larger ones get 413.
    /// Default 10 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_073_741_824))]
    pub max_request_body_bytes: Option<i64>,
    /// Most client connections one gateway pod keeps open; more are closed
    /// as they arrive and counted in
    /// `waycast_gateway_connections_refused_total`. Default 10,000.
    /// Changing it rolls the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_connections: Option<i32>,
}

/// How rate limits are counted.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRateLimit {
    /// Count in Redis instead: exact limits across all pods, at one round
    /// trip per limited request. Each Gateway counts under keys of its own
    /// (`waycast:<namespace>/<name>:`), so Gateways may share a Redis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisRateLimit>,
    /// What a pod does while Redis cannot be reached: `Open` admits
    /// requests unlimited, `Closed` refuses them with 503. Default Open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<FailureMode>,
}

/// A Redis server that counts the limits.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.username) || has(self.passwordSecretRef)").message("username needs passwordSecretRef"))]
#[serde(rename_all = "camelCase")]
pub struct RedisRateLimit {
    /// `host:port` of the Redis server (e.g. `redis.infra:6379`).
    #[schemars(length(min = 3, max = 512), pattern(r"^[^\s/:]+:[0-9]{1,5}$"))]
    pub address: String,
    /// The ACL user to authenticate as (`AUTH <username> <password>`, Redis
    /// 6+). Absent: the default user. Needs `passwordSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), pattern(r"^[^\s\p{Cc}]+$"))]
    pub username: Option<String>,
    /// A Secret in the Gateway's namespace holding the Redis password
    /// (`AUTH`). Absent: no password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<crate::common::SecretKeyRef>,
    /// Longest a request waits for Redis before the failure mode applies
    /// (e.g. `50ms`). Default 100ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// Talk to Redis over TLS (what `rediss://` means to other clients):
    /// the CA to trust, a client certificate for `tls-auth-clients`, the
    /// name to verify. Absent: plain TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::common::ClientTls>,
}

/// What to do while the rate-limit store is unreachable.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FailureMode {
    /// Admit requests without limits (and count the failures).
    #[default]
    Open,
    /// Refuse requests with 503 until the store is back.
    Closed,
}

/// Logging of the gateway pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayLogging {
    /// Log level. Default info.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LogLevel>,
    /// One line per request at info level (never key material). Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<bool>,
}

/// Log levels, least to most verbose.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings.
    Warn,
    /// Normal operation, including the access log.
    #[default]
    Info,
    /// Diagnostics.
    Debug,
    /// Everything.
    Trace,
}

/// Scheduling and metadata of the gateway pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPodTemplate {
    /// Extra labels on the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations on the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Node labels the pods must be scheduled on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node and pod (anti-)affinity of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How the pods spread across topology domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// PriorityClass of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
}

/// What the operator last saw and did for a Gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// `Accepted` (the spec is valid), `Programmed` (the config Secret is
    /// written), `Ready` (enough replicas are ready).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Gateway pods that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Gateway pods that are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Ready gateway pods that serve the current config (`configHash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_replicas: Option<i32>,
    /// SHA-256 of the current compiled config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// Models (names and aliases not counted) in the current config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_count: Option<i32>,
    /// API keys in the current config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_count: Option<i32>,
    /// Where clients connect: the Service's address and port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Per policy of `spec.tenants`: the namespaces (with ApiKeys on this
    /// Gateway) it applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<crate::sharing::TenantPolicyStatus>,
    /// Per identity provider: whether its key set is loaded, and why its
    /// last fetch failed. Absent: no providers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::identity::GatewayIdentityStatus>,
    /// This month's usage per namespace, as the operator last collected
    /// it from the pods (written apart from the rest of the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::usage::GatewayUsageStatus>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
