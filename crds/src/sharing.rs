//! Sharing a Gateway's capacity between teams (DESIGN "Sharing capacity and
//! spend"): the platform's policy per team (`Gateway.spec.tenants[]`), the
//! priority classes and the queue (`Gateway.spec.sharing`), a model's
//! capacity (`ModelEndpoint.spec.capacity`), a key's own limits
//! (`ApiKey.spec.limits`, with `maxConcurrent`), and the compiled forms the
//! gateway reads (`settings.sharing`, `settings.tenants[]`, a model's
//! `capacity`).
//!
//! ```text
//! Gateway.spec.tenants[] ─┐ operator: each namespace of a served key gets the first policy that matches it
//! Gateway.spec.sharing ───┼─► settings.tenants[] {namespace, weight, classes, limits} + settings.sharing
//! ApiKey.spec.class ──────┘   (a class its tenant may not use: the key is left out, ClassNotAllowed)
//! ModelEndpoint.spec.capacity ─► models[].capacity ─► the gateway queues a model's requests when it is full
//! ```
//!
//! The tenant is always the ApiKey's namespace and the class its
//! `spec.class`: nothing a client sends changes either.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::NamespacePolicy;

/// A priority class name: a DNS label.
pub const CLASS_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// The classes a Gateway has when `spec.sharing.classes` is not set,
/// highest first.
pub const DEFAULT_CLASSES: [&str; 3] = ["interactive", "standard", "batch"];
/// The class of a key that names none, when the Gateway has it.
pub const DEFAULT_CLASS: &str = "standard";
/// Longest a request waits in a full model's queue by default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);
/// Most requests one pod queues for one model by default.
pub const DEFAULT_MAX_QUEUED: u32 = 10_000;
/// How far above its capacity a pod may go for a tenant (or class) under
/// its share, in percent of the capacity, by default.
pub const DEFAULT_BURST_PERCENT: u32 = 50;
/// Most tenant policies on one Gateway.
pub const MAX_TENANT_POLICIES: usize = 64;
/// Most classes on one Gateway.
pub const MAX_CLASSES: usize = 8;

// === the API ===

/// The platform team's policy for the teams (namespaces) it selects: their
/// share of a saturated model, the classes their keys may use, and caps for
/// each namespace as a whole. The first policy that selects a namespace
/// applies to it; a namespace no policy selects has weight 1, the default
/// class only and no caps.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantPolicy {
    /// The namespaces this policy is for (`Same`, `All`, or `Selector` with
    /// a namespace label selector). Each namespace is a tenant of its own:
    /// its caps are not shared with the other namespaces selected.
    pub namespaces: NamespacePolicy,
    /// The share of a saturated model each selected namespace gets against
    /// the others (by tokens): a namespace of weight 3 is served three
    /// times the tokens of one of weight 1 while both wait. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: Option<i32>,
    /// The priority classes (of `spec.sharing.classes`) the namespace's
    /// ApiKeys may use. A key naming another is not served
    /// (`Accepted=False`, reason `ClassNotAllowed`). Empty: every class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")))]
    pub classes: Vec<String>,
    /// Caps for all the namespace's keys together on this Gateway: its
    /// keys' own limits only divide what these allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<KeyLimits>,
    /// What all the namespace's keys together may spend per calendar
    /// period: its keys' own budgets never let it exceed these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub budgets: Vec<crate::spend::Budget>,
    /// The most ApiKeys of each selected namespace this Gateway serves.
    /// The oldest are served (by creation time, then name); each newer
    /// key past the cap is left out of the config with `Accepted=False`,
    /// reason `TenantKeyLimit`, and the other namespaces are unaffected.
    /// Only keys that would otherwise be served count. Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub max_api_keys: Option<i32>,
}

/// Requests, tokens and concurrent requests of a key, or of a namespace's
/// keys together.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, kube::KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("has(self.requestsPerMinute) || has(self.tokensPerMinute) || has(self.maxConcurrent)").message("limits must set requestsPerMinute, tokensPerMinute or maxConcurrent"))]
#[serde(rename_all = "camelCase")]
pub struct KeyLimits {
    /// Requests admitted per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000))]
    pub requests_per_minute: Option<i64>,
    /// Tokens (prompt + completion, from the responses' `usage`) admitted per
    /// minute. A request is admitted while the remaining budget is positive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000_000_i64))]
    pub tokens_per_minute: Option<i64>,
    /// Requests in flight at once (a stream counts until it ends); more get
    /// 429. Without Redis each gateway pod allows its share (the limit
    /// divided by the live pods, at least 1); with Redis the whole fleet
    /// holds exactly this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_concurrent: Option<i64>,
}

/// How a Gateway shares a saturated model: priority classes and the queue.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySharing {
    /// Priority classes, highest first: when a model is full, a waiting
    /// request of a higher class always goes before one of a lower class.
    /// Default `[interactive, standard, batch]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")))]
    pub classes: Vec<String>,
    /// The class of a key that names none. Default `standard` when it is
    /// one of the classes, else the lowest class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub default_class: Option<String>,
    /// The queue of a full model, in each gateway pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<SharingQueue>,
    /// How far above a full model's capacity a pod may go for a request of
    /// a team (or class) below its share, in percent of the capacity: the
    /// headroom that keeps such a team from waiting for another team's long
    /// generations. 0 turns it off. Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 400))]
    pub burst_percent: Option<i32>,
    /// Send the endpoint picker's headers upstream, both generations
    /// (`x-gateway-inference-fairness-id` and `x-llm-d-inference-fairness-id`:
    /// the key's namespace; `x-gateway-inference-objective` and
    /// `x-llm-d-inference-objective`: its class), for an llm-d or
    /// endpoint-picker backend. A client's are never sent, either way.
    /// Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_headers: Option<bool>,
}

/// Bounds of a full model's queue, per gateway pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharingQueue {
    /// Longest a request waits (e.g. `30s`); then 429 with `Retry-After`.
    /// Default 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub max_wait: Option<String>,
    /// Most requests waiting for one model in one pod; past it the newest
    /// of the lowest class waiting is refused (429). Default 10,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_queued: Option<i32>,
}

/// When a model is full.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCapacity {
    /// Requests one endpoint (an inference pod, or a `url` backend) takes at
    /// once before the model counts as full: past it, requests wait in the
    /// gateway's fair queue instead of piling onto the pods. Set it at or
    /// somewhat below the server's own batch size (vLLM's `--max-num-seqs`).
    #[schemars(range(min = 1, max = 100_000))]
    pub max_in_flight_per_endpoint: i32,
}

/// One tenant policy as compiled: the namespaces it matched.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantPolicyStatus {
    /// Its index in `spec.tenants`.
    pub index: i32,
    /// The namespaces with ApiKeys on this Gateway it applies to (the
    /// first 100, sorted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// How many namespaces it applies to.
    pub namespace_count: i32,
}

// === the compiled config ===

/// `settings.sharing`: classes and the queue, as compiled.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SharingConfig {
    /// Priority classes, highest first.
    #[serde(default = "SharingConfig::default_classes")]
    pub classes: Vec<String>,
    /// The class of a key that names none.
    #[serde(default = "SharingConfig::default_default_class")]
    pub default_class: String,
    /// Longest a request waits in a full model's queue.
    #[serde(with = "crate::duration::serde_text", default = "SharingConfig::default_max_wait")]
    pub max_wait: Duration,
    /// Most requests one pod queues for one model.
    #[serde(default = "SharingConfig::default_max_queued")]
    pub max_queued: u32,
    /// Headroom above capacity for a request under its share, in percent.
    #[serde(default = "SharingConfig::default_burst_percent")]
    pub burst_percent: u32,
    /// Stamp the picker's fairness and objective headers upstream (both
    /// generations: `x-gateway-inference-*`, `x-llm-d-inference-*`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inference_headers: bool,
}

impl SharingConfig {
    fn default_classes() -> Vec<String> {
        DEFAULT_CLASSES.iter().map(|c| (*c).to_owned()).collect()
    }
    fn default_default_class() -> String {
        DEFAULT_CLASS.to_owned()
    }
    fn default_max_wait() -> Duration {
        DEFAULT_MAX_WAIT
    }
    fn default_max_queued() -> u32 {
        DEFAULT_MAX_QUEUED
    }
    fn default_burst_percent() -> u32 {
        DEFAULT_BURST_PERCENT
    }

    /// Whether every field is at its default (then it is not written).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The index of class `name` (0 is the highest), if it is one.
    pub fn class_index(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|class| class == name)
    }
}

impl Default for SharingConfig {
    fn default() -> Self {
        Self {
            classes: Self::default_classes(),
            default_class: Self::default_default_class(),
            max_wait: DEFAULT_MAX_WAIT,
            max_queued: DEFAULT_MAX_QUEUED,
            burst_percent: DEFAULT_BURST_PERCENT,
            inference_headers: false,
        }
    }
}

/// `settings.tenants[]`: one namespace's policy, as compiled.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantConfig {
    /// The namespace (a key's namespace is the part of its id before `/`).
    pub namespace: String,
    /// Its share of a saturated model against other tenants.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// The classes its keys may use; absent: every class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<String>>,
    /// Caps for all its keys together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::common::LimitsConfig>,
    /// Budgets for all its keys together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<crate::spend::BudgetConfig>,
}

fn default_weight() -> u32 {
    1
}

impl TenantConfig {
    /// The namespace with weight 1, every class and no caps.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), weight: 1, classes: None, limits: None, budgets: Vec::new() }
    }

    /// Whether its keys may use `class`.
    pub fn allows_class(&self, class: &str) -> bool {
        self.classes.as_ref().is_none_or(|classes| classes.iter().any(|c| c == class))
    }
}

/// A model's `capacity`, as compiled.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CapacityConfig {
    /// Requests one endpoint takes at once before the model is full.
    pub max_in_flight_per_endpoint: u32,
}

/// The class a key of `tenant` that names `wanted` (or none) is served in,
/// or why it is not served. A namespace no policy selects (`tenant` is
/// `None`) may use the default class only (DESIGN: "a namespace matching
/// none gets weight 1, class standard"): priority is the platform's to
/// grant. A key's own class must be one of the Gateway's and allowed to
/// its tenant; a key that names none gets the default class, or, when its
/// tenant may not use that, the lowest class its tenant may use.
///
/// # Errors
/// A message naming the class and what is allowed.
pub fn key_class<'a>(
    sharing: &'a SharingConfig,
    tenant: Option<&TenantConfig>,
    wanted: Option<&str>,
) -> Result<&'a str, String> {
    let allowed = |class: &str| match tenant {
        Some(tenant) => tenant.allows_class(class),
        None => class == sharing.default_class,
    };
    let allowed_list = || match tenant {
        Some(tenant) => format!("{:?}", tenant.classes.clone().unwrap_or_else(|| sharing.classes.clone())),
        None => format!("[{:?}] (no tenant policy of the Gateway selects this namespace)", sharing.default_class),
    };
    match wanted {
        Some(class) => {
            let Some(index) = sharing.class_index(class) else {
                return Err(format!("class {class:?} is not one of the Gateway's classes {:?}", sharing.classes));
            };
            if !allowed(class) {
                return Err(format!("class {class:?} is not one this namespace may use: {}", allowed_list()));
            }
            Ok(&sharing.classes[index])
        }
        None => {
            if sharing.class_index(&sharing.default_class).is_some() && allowed(&sharing.default_class) {
                return Ok(&sharing.default_class);
            }
            sharing
                .classes
                .iter()
                .rev()
                .find(|class| allowed(class))
                .map(String::as_str)
                .ok_or_else(|| "this namespace may use none of the Gateway's classes".to_owned())
        }
    }
}

/// The class a Gateway's `sharing` makes the default (see
/// [`GatewaySharing::default_class`]).
pub fn default_class_of(classes: &[String], wanted: Option<&str>) -> String {
    match wanted {
        Some(class) => class.to_owned(),
        None if classes.iter().any(|c| c == DEFAULT_CLASS) => DEFAULT_CLASS.to_owned(),
        None => classes.last().cloned().unwrap_or_else(|| DEFAULT_CLASS.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(classes: Option<&[&str]>) -> TenantConfig {
        TenantConfig {
            classes: classes.map(|c| c.iter().map(|s| (*s).to_owned()).collect()),
            ..TenantConfig::new("team-a")
        }
    }

    #[test]
    fn a_key_gets_its_class_the_default_or_the_lowest_its_tenant_may_use() {
        let sharing = SharingConfig::default();
        // (the tenant's classes, the key's class, the class served or why not)
        type Case<'a> = (Option<&'a [&'a str]>, Option<&'a str>, Result<&'a str, &'a str>);
        let cases: [Case<'_>; 7] = [
            (None, None, Ok("standard")),
            (None, Some("interactive"), Ok("interactive")),
            (None, Some("gold"), Err("not one of the Gateway's classes")),
            (Some(&["batch"]), Some("interactive"), Err("not one this namespace may use")),
            (Some(&["batch"]), None, Ok("batch")),
            (Some(&["interactive", "batch"]), None, Ok("batch")),
            (Some(&["interactive"]), None, Ok("interactive")),
        ];
        for (classes, wanted, expected) in cases {
            let tenant = tenant(classes);
            let got = key_class(&sharing, Some(&tenant), wanted);
            match (got, expected) {
                (Ok(got), Ok(expected)) => assert_eq!(got, expected, "{classes:?} {wanted:?}"),
                (Err(got), Err(expected)) => assert!(got.contains(expected), "{got}"),
                (got, expected) => panic!("{classes:?} {wanted:?}: {got:?}, expected {expected:?}"),
            }
        }
        let none_left = tenant(Some(&["gold"]));
        assert!(key_class(&sharing, Some(&none_left), None).is_err());
        // No policy: the default class, and only it.
        assert_eq!(key_class(&sharing, None, None), Ok("standard"));
        assert_eq!(key_class(&sharing, None, Some("standard")), Ok("standard"));
        let refused = key_class(&sharing, None, Some("interactive")).unwrap_err();
        assert!(refused.contains("no tenant policy"), "{refused}");
    }

    #[test]
    fn the_default_class_is_standard_when_there_is_one_else_the_lowest() {
        let classes = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(default_class_of(&classes(&["a", "standard", "b"]), None), "standard");
        assert_eq!(default_class_of(&classes(&["gold", "silver"]), None), "silver");
        assert_eq!(default_class_of(&classes(&["gold", "silver"]), Some("gold")), "gold");
    }

    #[test]
    fn defaults_are_not_written_and_read_back_the_same() {
        let sharing: SharingConfig = serde_json::from_str("{}").unwrap();
        assert!(sharing.is_default());
        assert_eq!(sharing.max_wait, Duration::from_secs(30));
        let written = serde_json::to_string(&sharing).unwrap();
        assert_eq!(serde_json::from_str::<SharingConfig>(&written).unwrap(), sharing);
        assert!(serde_json::from_str::<SharingConfig>(r#"{"queue":1}"#).is_err(), "unknown fields refused");
    }
}
