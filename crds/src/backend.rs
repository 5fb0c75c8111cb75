//! One backend of a ModelEndpoint: where its requests go, and how.
//!
//! A backend is of exactly one kind, named by one field of [`Backend`]
//! (`service`, `url`). The manifest shape stays flat (each kind an optional
//! field beside `model`, `weight`, `auth`, ...); in code the kind is the
//! tagged [`BackendKind`], read by [`Backend::kind`] from the table
//! [`KINDS`], which also writes the schema's "exactly one of" rule.
//!
//! A new kind: its field on [`Backend`] (with its doc and schema checks), a
//! [`BackendKind`] variant, and one row in [`KINDS`]; then the operator
//! resolves it (`compile/backends/`, one file per kind).

use kube::core::{Message, Rule};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::SecretKeyRef;

/// What a backend is, read from its one kind field.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BackendKind<'a> {
    /// A Service in the ModelEndpoint's own namespace (`service`).
    Service(&'a ServiceBackend),
    /// An OpenAI-style base URL (`url`).
    Url(&'a str),
}

/// Reads one kind from a backend: `Some` when its field is set.
type ReadKind = for<'a> fn(&'a Backend) -> Option<BackendKind<'a>>;

/// Every kind: its field in the manifest and how it is read, in the order
/// the schema's rule and messages name them.
pub const KINDS: &[(&str, ReadKind)] = &[
    ("service", |backend| backend.service.as_ref().map(BackendKind::Service)),
    ("url", |backend| backend.url.as_deref().map(BackendKind::Url)),
];

/// Why a backend is of no single kind (the schema refuses both cases; this
/// is for objects that never met it, such as tests' and hand-made ones).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendKindError {
    /// No kind field is set.
    #[error("needs exactly one of {}", kind_names())]
    Missing,
    /// Several kind fields are set (their names).
    #[error("sets {} but needs exactly one of {}", .0.join(" and "), kind_names())]
    Several(Vec<&'static str>),
}

impl Backend {
    /// Which kind this backend is: exactly one of the [`KINDS`] fields set.
    ///
    /// # Errors
    /// None of them set, or several.
    pub fn kind(&self) -> Result<BackendKind<'_>, BackendKindError> {
        let mut named = KINDS.iter().filter_map(|(field, read)| read(self).map(|kind| (*field, kind)));
        match (named.next(), named.next()) {
            (Some((_, kind)), None) => Ok(kind),
            (None, _) => Err(BackendKindError::Missing),
            (Some((first, _)), Some((second, _))) => {
                let fields = [first, second].into_iter().chain(named.map(|(field, _)| field)).collect();
                Err(BackendKindError::Several(fields))
            }
        }
    }
}

/// The kinds' fields for messages: `service or url`, `a, b or c`.
fn kind_names() -> String {
    match KINDS.split_last() {
        Some(((last, _), [])) => (*last).to_owned(),
        Some(((last, _), rest)) => {
            let rest: Vec<&str> = rest.iter().map(|(field, _)| *field).collect();
            format!("{} or {last}", rest.join(", "))
        }
        None => String::new(),
    }
}

/// The schema's rule on a backend: exactly one of the [`KINDS`] fields.
pub fn exactly_one_kind() -> Rule {
    let set: Vec<String> = KINDS.iter().map(|(field, _)| format!("has(self.{field})")).collect();
    Rule::new(format!("[{}].exists_one(named, named)", set.join(", ")))
        .message(Message::Message(format!("a backend needs exactly one of {}", kind_names())))
}

/// One upstream that serves the model: an in-cluster Service or an
/// OpenAI-compatible base URL.
// NB: each kind is an optional field here (the manifests' shape); code
// reads which one through `Backend::kind`, never the fields themselves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = crate::backend::exactly_one_kind())]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// A Service in the ModelEndpoint's own namespace (vLLM, SGLang, TGI,
    /// Ollama, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceBackend>,

    /// An OpenAI-style base URL such as `https://api.openai.com/v1`, for
    /// external providers: a request for `/v1/X` goes to `<url>/X`. A query
    /// (Azure OpenAI's `?api-version=...`) is sent with every request.
    /// Link-local and cloud metadata addresses are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''").message("url must be an absolute http:// or https:// URL"))]
    #[x_kube(validation = Rule::new("!self.matches('^(?i)https?://([^/?#@]*@)?(169[.]254[.][0-9]+[.][0-9]+|\\\\[(fe[89ab][0-9a-f]:[^\\\\]]*|fd00:ec2::254)\\\\])([:/?]|$)')").message("url must not point at a link-local or cloud metadata address (169.254.0.0/16, fe80::/10, fd00:ec2::254)"))]
    #[x_kube(validation = Rule::new("!self.contains('#')").message("url must not have a fragment"))]
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

    /// Failover tier: backends of the lowest priority serve; the next tier
    /// takes a request only when every backend of the tiers before it
    /// refused it (no pod reachable, or every pod tried answered 503). E.g.
    /// in-cluster pods at 0 and an external provider at 1. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub priority: Option<i32>,

    /// The API the backend speaks, which decides what the gateway passes
    /// through and what it translates: `OpenAI` (the default: every path
    /// passed through as the client sent it, `/v1/messages` included, as
    /// vLLM serves it), `OpenAIChat` (OpenAI's paths but no Messages API:
    /// SGLang, TGI, Ollama, most OpenAI-compatible providers; Messages
    /// clients are translated to chat completions and `count_tokens` is
    /// answered by the gateway) or `Anthropic` (Messages only, as
    /// api.anthropic.com: chat completions clients are translated to
    /// Messages; other OpenAI paths are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<BackendFormat>,

    /// TLS to an `https` backend: a private CA (`caSecretRef`), a client
    /// certificate (`clientCertSecretRef`, a `kubernetes.io/tls` Secret) and
    /// the name the server's certificate carries (`serverName`; with it, a
    /// `service` backend on `https` is served through its endpoints too).
    /// Both Secrets are in this namespace and need the label
    /// `waycast.dev/credential: "true"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::common::ClientTls>,
}

/// The API a backend speaks (see [`Backend::format`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum BackendFormat {
    /// OpenAI's paths and whatever else the server serves: everything
    /// passed through.
    #[default]
    OpenAI,
    /// OpenAI's paths without Anthropic's Messages API: Messages clients
    /// translated to chat completions.
    OpenAIChat,
    /// Anthropic's Messages API only: chat completions clients translated
    /// to it.
    Anthropic,
}

/// How a backend's credential is sent (see [`BackendAuth::style`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AuthStyle {
    /// `Authorization: Bearer <credential>`, or the credential as it is in
    /// `header` when one is named.
    #[default]
    Bearer,
    /// Anthropic's: `x-api-key: <credential>` and `anthropic-version: 2023-06-01`.
    Anthropic,
    /// Azure OpenAI's: `api-key: <credential>` (the deployment is in the
    /// URL's path and `api-version` in its query).
    AzureOpenAI,
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

/// An upstream credential injected by the gateway. The Secret must carry
/// the label `waycast.dev/credential: "true"`: the operator reads no other
/// Secret of a team.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = Rule::new("!(has(self.header) && has(self.style))").message("auth takes a header or a style, not both"))]
#[serde(rename_all = "camelCase")]
pub struct BackendAuth {
    /// The Secret key holding the credential.
    pub secret_ref: SecretKeyRef,
    /// Header that carries it. Default `Authorization`, sent as
    /// `Bearer <credential>`; any other header (e.g. `x-api-key`, `api-key`)
    /// carries the credential as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), pattern(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"))]
    #[x_kube(validation = Rule::new("!(self.lowerAscii() in ['host', 'content-length', 'transfer-encoding', 'connection', 'upgrade', 'te', 'trailer', 'keep-alive', 'proxy-connection'])").message("header must not be Host, Content-Length or a hop-by-hop header: the gateway sets those itself"))]
    pub header: Option<String>,
    /// The provider's way of sending it: `Bearer` (the default),
    /// `Anthropic` (`x-api-key` and `anthropic-version`) or `AzureOpenAI`
    /// (`api-key`). Not with `header`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub style: Option<AuthStyle>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(json: serde_json::Value) -> Backend {
        serde_json::from_value(json).expect("a backend as a manifest writes it")
    }

    #[test]
    fn a_backend_is_of_the_one_kind_its_manifest_names() {
        let service = ServiceBackend { name: "vllm".into(), port: 8000, base_path: None };
        let cases: &[(&str, serde_json::Value, Result<BackendKind<'_>, BackendKindError>)] = &[
            (
                "service",
                serde_json::json!({"service": {"name": "vllm", "port": 8000}, "weight": 2}),
                Ok(BackendKind::Service(&service)),
            ),
            (
                "url",
                serde_json::json!({"url": "https://api.openai.com/v1"}),
                Ok(BackendKind::Url("https://api.openai.com/v1")),
            ),
            ("neither", serde_json::json!({"weight": 1}), Err(BackendKindError::Missing)),
            (
                "both",
                serde_json::json!({"service": {"name": "vllm", "port": 8000}, "url": "http://x/v1"}),
                Err(BackendKindError::Several(vec!["service", "url"])),
            ),
        ];
        for (name, json, expected) in cases {
            assert_eq!(&backend(json.clone()).kind(), expected, "{name}");
        }
        // Every kind has its row above: a new kind is tested once it is in KINDS.
        let named: Vec<&str> = cases.iter().filter(|(_, _, kind)| kind.is_ok()).map(|(name, _, _)| *name).collect();
        let kinds: Vec<&str> = KINDS.iter().map(|(field, _)| *field).collect();
        assert_eq!(named, kinds);
    }

    #[test]
    fn the_wire_shape_is_unchanged_by_reading_the_kind() {
        let json = serde_json::json!({"service": {"name": "vllm", "port": 8000, "basePath": "/api"}, "weight": 3});
        assert_eq!(serde_json::to_value(backend(json.clone())).unwrap(), json);
    }

    #[test]
    fn the_schema_rule_and_the_messages_name_every_kind() {
        let rule = exactly_one_kind();
        assert_eq!(rule.rule, "[has(self.service), has(self.url)].exists_one(named, named)");
        assert_eq!(rule.message, Some(Message::Message("a backend needs exactly one of service or url".into())));
        assert_eq!(BackendKindError::Missing.to_string(), "needs exactly one of service or url");
        assert_eq!(
            BackendKindError::Several(vec!["service", "url"]).to_string(),
            "sets service and url but needs exactly one of service or url"
        );
    }
}
