//! Types shared by more than one kind: references to Secrets, limits, the
//! string patterns the schemas enforce.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// RFC 1123 DNS subdomain: the names of Secrets and most other objects.
pub const DNS_SUBDOMAIN_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// RFC 1035 DNS label: the names of Services.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z]([-a-z0-9]*[a-z0-9])?$";
/// A key inside a Secret's `data`.
pub const SECRET_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";
/// A model name as clients send it: no whitespace (ASCII or Unicode, e.g. a
/// non-breaking space), no control character, no `*` (reserved for globs).
///
/// NB: the API server's regexes are RE2, where `\s` is ASCII only; `\p{Z}`
/// adds the Unicode separators and `\p{Cc}` the control characters, so this
/// refuses exactly what [`is_forbidden_in_name`] refuses.
pub const MODEL_NAME_PATTERN: &str = r"^[^\s\p{Z}\p{Cc}*]+$";
/// A model name or a glob over model names (`*` matches any run of characters).
pub const MODEL_GLOB_PATTERN: &str = r"^[^\s\p{Z}\p{Cc}]+$";
/// A duration such as `500ms`, `5s`, `1m30s` or `2h`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";
/// An HTTP header field name (RFC 9110 token).
pub const HEADER_NAME_PATTERN: &str = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$";

/// Whether `c` may not appear in a model name, alias or glob: whitespace of
/// any kind and control characters. The schemas' [`MODEL_NAME_PATTERN`]
/// says the same to the API server.
pub fn is_forbidden_in_name(c: char) -> bool {
    c.is_whitespace() || c.is_control()
}

/// Header names a configured upstream credential may not use: the gateway
/// sets them itself or they are hop-by-hop (RFC 9110 section 7.6.1).
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

/// Client headers that never go upstream, whatever a model forwards: the
/// client's own credentials and cookies.
pub const CLIENT_CREDENTIAL_HEADERS: &[&str] =
    &["authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"];

/// The only client headers of a provider's own (`openai-*`,
/// `anthropic-*`) that go upstream unless a model forwards more: they say
/// which version of the protocol the client speaks. The rest choose what
/// the provider bills and to whom (`openai-organization`, `openai-project`,
/// `anthropic-beta`'s priced features) or are unknown to us: the backend's
/// to set, or the ModelEndpoint's `forwardHeaders` to name.
pub const PROVIDER_PROTOCOL_HEADERS: &[&str] = &["anthropic-version", "openai-beta"];

/// Headers an endpoint picker reads (the Inference Extension's
/// `x-gateway-inference-*` and llm-d's `x-llm-d-*`): the gateway stamps
/// them from the authenticated key, and strips a client's, whatever a model
/// forwards.
pub const PICKER_HEADER_PREFIXES: &[&str] = &["x-gateway-inference-", "x-llm-d-"];

/// Why `pattern` cannot be a forwarded-header pattern (a lowercase header
/// name, or a prefix of one followed by `*`), if it cannot.
pub fn forward_header_problem(pattern: &str) -> Option<&'static str> {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    if name.is_empty() {
        return Some("must name a header or a prefix of one before '*'");
    }
    let token = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'+-.^_`|~".contains(&b);
    if !name.bytes().all(token) {
        return Some("must be a lowercase header name, optionally ending in '*'");
    }
    let covers = |reserved: &&str| if pattern.ends_with('*') { reserved.starts_with(name) } else { *reserved == name };
    if RESERVED_HEADERS.iter().chain(CLIENT_CREDENTIAL_HEADERS).any(covers) {
        return Some("must not cover a client credential, Host or a hop-by-hop header");
    }
    None
}

/// A Gateway an object asks to be served by (after Gateway API's
/// `parentRefs`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// Name of the Gateway.
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Namespace of the Gateway. Default: the object's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: Option<String>,
}

/// Whether one Gateway serves the object, like Gateway API's
/// `RouteParentStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAcceptance {
    /// The Gateway, as `namespace/name`.
    pub gateway: String,
    /// Whether that Gateway serves the object.
    pub accepted: bool,
    /// CamelCase reason, e.g. `Accepted`, `ModelNameConflict`,
    /// `NotAllowedByGateway`, `GatewayNotFound`.
    pub reason: String,
    /// What a person needs to know, e.g. which ModelEndpoint won a conflict.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A reference to one key of a Secret in the referring object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret, in the same namespace as the object that refers to it.
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Key within the Secret's data whose value is used.
    #[schemars(length(min = 1, max = 253), pattern(r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// A Secret in the referring object's namespace, as a whole (e.g. a
/// `kubernetes.io/tls` Secret with `tls.crt` and `tls.key`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret, in the same namespace as the object that refers to it.
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
}

/// TLS from the gateway to a server it calls: which CA to trust, which
/// client certificate to present, which name to expect. Every Secret is
/// read from the referring object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientTls {
    /// A key of a Secret holding the PEM CA certificates that sign the
    /// server's certificate (a private CA, cert-manager's `ca.crt`).
    /// Absent: the public web PKI roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// A `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) presented as the
    /// client certificate (mutual TLS). Absent: no client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_secret_ref: Option<SecretRef>,
    /// The DNS name (RFC 1123) or IP address the server's certificate must
    /// carry. Absent: the host the gateway connects to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*)$")
    )]
    pub server_name: Option<String>,
}

/// Rate limits. Each pod of a Gateway enforces its share of the limit, so the
/// fleet as a whole admits the configured rate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, kube::KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("has(self.requestsPerMinute) || has(self.tokensPerMinute)").message("limits must set requestsPerMinute, tokensPerMinute or both"))]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Requests admitted per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000))]
    pub requests_per_minute: Option<i64>,
    /// Tokens (prompt + completion, from the responses' `usage`) admitted per
    /// minute. A request is admitted while the remaining budget is positive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000_000_i64))]
    pub tokens_per_minute: Option<i64>,
}

/// Requests and tokens per minute.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsConfig {
    /// Requests admitted per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Tokens admitted per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once (keys and tenants; not models, whose
    /// concurrency is their `capacity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
}

/// The checks of a compiled limits entry at `path` (a key's, a tenant's,
/// a model's, a grant's).
pub(crate) fn check_limits(path: &str, limits: &LimitsConfig, problems: &mut crate::problems::Collector) {
    let at = |field: &str| if path.is_empty() { field.to_owned() } else { format!("{path}.{field}") };
    if *limits == LimitsConfig::default() {
        problems.add(path, "must set requestsPerMinute, tokensPerMinute or maxConcurrent");
    }
    if limits.max_concurrent == Some(0) {
        problems.add(at("maxConcurrent"), "must be at least 1");
    }
    if limits.requests_per_minute == Some(0) {
        problems.add(at("requestsPerMinute"), "must be at least 1");
    }
    if limits.tokens_per_minute == Some(0) {
        problems.add(at("tokensPerMinute"), "must be at least 1");
    }
}

impl LimitsConfig {
    /// `per_minute` requests a minute, nothing else limited.
    pub fn requests(per_minute: u64) -> Self {
        Self { requests_per_minute: Some(per_minute), ..Self::default() }
    }

    /// `per_minute` tokens a minute, nothing else limited.
    pub fn tokens(per_minute: u64) -> Self {
        Self { tokens_per_minute: Some(per_minute), ..Self::default() }
    }

    /// `most` requests in flight at once, nothing else limited.
    pub fn concurrent(most: u64) -> Self {
        Self { max_concurrent: Some(most), ..Self::default() }
    }
}

/// Which namespaces a Gateway takes objects from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("self.from == 'Selector' ? has(self.selector) : !has(self.selector)").message("namespaces.selector is required when from is Selector, and allowed only then"))]
#[serde(rename_all = "camelCase")]
pub struct NamespacePolicy {
    /// `Same`: the Gateway's namespace; `All`: every namespace; `Selector`:
    /// namespaces whose labels match `selector`.
    #[serde(default)]
    pub from: NamespaceFrom,
    /// Namespace label selector, used when `from` is `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

/// Where selected objects may live.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NamespaceFrom {
    /// The Gateway's own namespace.
    #[default]
    Same,
    /// Every namespace.
    All,
    /// Namespaces whose labels match the selector.
    Selector,
}

/// The label (`"true"`) a team puts on a Secret it lets the operator send
/// upstream as a credential or TLS material of its ModelEndpoints.
pub const CREDENTIAL_LABEL: &str = "waycast.dev/credential";
