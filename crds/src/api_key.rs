//! `ApiKey`: a bearer key for one consumer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::common::{GatewayAcceptance, ParentReference, SecretKeyRef};
use crate::sharing::KeyLimits;

/// A bearer key for one consumer of the gateway.
///
/// Without `secretRef` the operator generates the key and stores it in the
/// Secret `<name>-key` (data key `api-key`). The plaintext key exists only in
/// that Secret; gateways receive its SHA-256.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[kube(
    group = "waycast.dev",
    version = "v1alpha1",
    kind = "ApiKey",
    doc = "A bearer key for one consumer of waycast Gateways. The plaintext key lives only in its Secret.",
    namespaced,
    status = "ApiKeyStatus",
    shortname = "ak",
    category = "waycast",
    printcolumn = r#"{"name": "Prefix", "type": "string", "jsonPath": ".status.keyPrefix", "description": "First characters of the key, safe to show"}"#,
    printcolumn = r#"{"name": "Expires", "type": "date", "jsonPath": ".spec.expiresAt", "description": "When the key stops working"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "description": "The key is valid and served"}"#,
    printcolumn = r#"{"name": "Programmed", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Programmed\")].status", "description": "Every ready gateway pod accepts it"}"#,
    printcolumn = r#"{"name": "Gateways", "type": "string", "jsonPath": ".status.gateways", "description": "Gateways that accept it"}"#,
    printcolumn = r#"{"name": "RPM", "type": "integer", "priority": 1, "jsonPath": ".status.limits.requestsPerMinute", "description": "Requests per minute the Gateways enforce for this key"}"#,
    printcolumn = r#"{"name": "TPM", "type": "integer", "priority": 1, "jsonPath": ".status.limits.tokensPerMinute", "description": "Tokens per minute the Gateways enforce for this key"}"#,
    printcolumn = r#"{"name": "Class", "type": "string", "priority": 1, "jsonPath": ".spec.class", "description": "Priority class when a model is full"}"#,
    printcolumn = r#"{"name": "Requests", "type": "integer", "priority": 1, "jsonPath": ".status.usage.requests", "description": "Requests this month"}"#,
    printcolumn = r#"{"name": "Input", "type": "integer", "priority": 1, "jsonPath": ".status.usage.inputTokens", "description": "Prompt tokens this month"}"#,
    printcolumn = r#"{"name": "Output", "type": "integer", "priority": 1, "jsonPath": ".status.usage.outputTokens", "description": "Completion tokens this month"}"#,
    printcolumn = r#"{"name": "Cost", "type": "string", "jsonPath": ".status.usage.cost", "description": "Cost this month at the models' prices"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeySpec {
    /// A Secret in this namespace holding the key, for keys managed outside
    /// the cluster (SealedSecrets, ExternalSecrets). The Secret must carry the
    /// label `waycast.dev/api-key: "true"`; keys shorter than 32 characters
    /// are refused. Absent: the operator generates a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,

    /// Model names this key may use; `*` matches any run of characters
    /// (`llama-*`). A name resolves in this namespace first, then among the
    /// Gateway namespace's (platform) models. An entry `namespace/name`
    /// (or `namespace/pattern`) opts in to another team's models that it
    /// shares with this namespace (`ModelEndpoint.spec.apiKeys`): nothing of
    /// another namespace is reached without it. (Such an entry is also
    /// matched against this namespace's and the platform's model names,
    /// which may hold a `/`.) Absent: every model of this
    /// namespace and the platform's that is shared with this namespace.
    /// This list only narrows what the models' owners share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}]+$")))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub models: Option<Vec<String>>,

    /// Rate and concurrency limits for this key. They only divide what its
    /// namespace's policy on the Gateway (`Gateway.spec.tenants[].limits`)
    /// allows all its keys together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<KeyLimits>,

    /// The priority class of this key's requests when a model is full (one
    /// of the Gateway's `spec.sharing.classes`, and of the classes its
    /// namespace's policy allows). Absent: the Gateway's default class.
    /// A class the namespace may not use keeps the key from being served
    /// (`Accepted=False`, reason `ClassNotAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub class: Option<String>,

    /// What this key may spend per calendar period (tokens, money or both),
    /// on top of its namespace's budgets on the Gateway
    /// (`Gateway.spec.tenants[].budgets`). Past one, 429
    /// `insufficient_quota` until the period starts over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub budgets: Vec<crate::spend::Budget>,

    /// When the key stops working (RFC 3339, e.g. `2027-01-01T00:00:00Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,

    /// Turn the key off without deleting it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,

    /// The Gateways that may accept this key. A Gateway accepts it only
    /// when its `apiKeys` rules admit this namespace AND this list names it;
    /// an empty list means the Gateways of this namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub parent_refs: Vec<ParentReference>,
}

// NB: `limits` and `usage` are boxed: the operator's cache of 100,000
// ApiKeys holds neither, and inline they were 176 bytes of each.
/// What the operator last saw and did for an ApiKey.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyStatus {
    /// `Ready` (reasons `KeyReady`, `SecretMissing`, `KeyTooShort`,
    /// `Expired`, `Disabled`) and `Programmed` (every ready pod of every
    /// Gateway that serves the key accepts it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The Secret that holds the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// The first 6 characters of the key, safe to show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// The Gateways (`namespace/name`) that serve this key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub gateways: Vec<String>,
    /// Per Gateway this key names (or, without `parentRefs`, per Gateway of
    /// its namespace that admits it): whether that Gateway accepts it, and why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["gateway".into()]))]
    pub parents: Vec<GatewayAcceptance>,
    /// The rate limits the Gateways enforce for this key, across all their
    /// pods (each pod enforces its share; see docs/rate-limits.md). Absent
    /// when the key is not served or has no limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Box<KeyLimits>>,
    /// What the key used this month over every Gateway that serves it, as
    /// the operator last collected it from the gateway pods (written
    /// apart from the rest of the status, at most every few seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Box<crate::usage::KeyUsageStatus>>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Never sent to or read from the API server: a digest of what the
    /// operator compares of this status (all but the conditions' times and
    /// `usage`), which the operator's cache keeps in place of those fields
    /// (at 100,000 keys they were about 100 MB of its memory).
    //
    // NB: not `#[serde(skip)]`: the schema derive copies this type without
    // the field's lint attributes, and its copy would never read a skipped
    // field; a predicate that is always true reads it and sends nothing.
    #[serde(skip_deserializing, skip_serializing_if = "never_sent")]
    #[schemars(skip)]
    pub compared_digest: Option<u64>,
}

/// Whether to leave a field out of what is sent: always.
fn never_sent<T>(_: &T) -> bool {
    true
}

/// The prefix of every generated key.
pub const KEY_PREFIX: &str = "wc_";
/// The label a key Secret carries (`"true"`), generated or supplied: the
/// operator watches only Secrets with it.
pub const KEY_SECRET_LABEL: &str = "waycast.dev/api-key";
/// The data key of a generated key Secret (`<apikey>-key`).
pub const GENERATED_DATA_KEY: &str = "api-key";
/// How many leading characters of a key are safe to show (`status.keyPrefix`).
pub const SHOWN_PREFIX_LEN: usize = 6;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The text form of a key made from 32 random bytes: `wc_` followed by the
/// bytes as a 43-digit base62 number. The randomness is the caller's (a
/// CSPRNG), so this stays a pure function.
pub fn key_text_from_bytes(random: &[u8; 32]) -> String {
    // 62^43 > 2^256, so 43 digits hold any 32 bytes; leading zeros are kept
    // so every key has the same length.
    let mut number = *random;
    let mut digits = [0_u8; 43];
    for digit in digits.iter_mut().rev() {
        let mut remainder = 0_u32;
        for byte in &mut number {
            let value = (remainder << 8) | u32::from(*byte);
            *byte = u8::try_from(value / 62).unwrap_or(0);
            remainder = value % 62;
        }
        *digit = BASE62[remainder as usize];
    }
    let mut text = String::with_capacity(KEY_PREFIX.len() + digits.len());
    text.push_str(KEY_PREFIX);
    text.extend(digits.iter().map(|&d| char::from(d)));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_text_is_fixed_length_base62() {
        let zero = key_text_from_bytes(&[0; 32]);
        assert_eq!(zero, format!("wc_{}", "0".repeat(43)));
        let max = key_text_from_bytes(&[0xff; 32]);
        assert_eq!(max.len(), 46);
        assert!(max[3..].bytes().all(|b| b.is_ascii_alphanumeric()));
        let mut one = [0; 32];
        one[31] = 61;
        assert!(key_text_from_bytes(&one).ends_with("0z"));
        one[31] = 62;
        assert!(key_text_from_bytes(&one).ends_with("10"));
    }

    /// The operator's digest of a status is its own: never sent, never
    /// taken from what the API server (or a writer of the status) sends.
    #[test]
    fn the_compared_digest_is_neither_sent_nor_read() {
        let status = ApiKeyStatus { compared_digest: Some(7), observed_generation: Some(1), ..Default::default() };
        let sent = serde_json::to_value(&status).unwrap();
        assert_eq!(sent, serde_json::json!({"observedGeneration": 1}));
        let read: ApiKeyStatus = serde_json::from_value(serde_json::json!({"comparedDigest": 7})).unwrap();
        assert_eq!(read.compared_digest, None);
        let schema = serde_json::to_string(&schemars::schema_for!(ApiKeyStatus)).unwrap();
        assert!(!schema.contains("comparedDigest"), "not in the CRD's schema");
    }
}
