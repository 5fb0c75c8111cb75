//! `AccessGrant`: which people and workloads, as an identity provider of a
//! Gateway names them, may call which models, with which limits and
//! budgets — for all of them together and for each one.
//!
//! NB: named `AccessGrant`, not `Grant` (too generic beside RBAC's
//! bindings and Gateway API's `ReferenceGrant`) nor `UserPolicy` (it covers
//! workloads too): it grants access, as an ApiKey does, to members instead
//! of to a key holder.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::common::{GatewayAcceptance, ParentReference};
use crate::sharing::KeyLimits;

/// Who may call, by the identity a Gateway's provider vouches for.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[kube(
    group = "waycast.dev",
    version = "v1alpha1",
    kind = "AccessGrant",
    doc = "Which people and workloads (by the groups, users or ServiceAccounts an identity provider of a Gateway names) may call which models, with limits and budgets for all of them together and for each one.",
    namespaced,
    status = "AccessGrantStatus",
    shortname = "ag",
    category = "waycast",
    printcolumn = r#"{"name": "Provider", "type": "string", "jsonPath": ".spec.provider", "description": "The Gateway's identity provider that names the members"}"#,
    printcolumn = r#"{"name": "Accepted", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].status", "description": "A Gateway serves the grant"}"#,
    printcolumn = r#"{"name": "Programmed", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Programmed\")].status", "description": "Every ready gateway pod has the grant"}"#,
    printcolumn = r#"{"name": "Class", "type": "string", "priority": 1, "jsonPath": ".spec.class", "description": "Priority class when a model is full"}"#,
    printcolumn = r#"{"name": "Members", "type": "integer", "jsonPath": ".status.usage.members", "description": "Members who spent from their own budgets this period"}"#,
    printcolumn = r#"{"name": "Requests", "type": "integer", "priority": 1, "jsonPath": ".status.usage.requests", "description": "Requests this month, all members together"}"#,
    printcolumn = r#"{"name": "Input", "type": "integer", "priority": 1, "jsonPath": ".status.usage.inputTokens", "description": "Prompt tokens this month"}"#,
    printcolumn = r#"{"name": "Output", "type": "integer", "priority": 1, "jsonPath": ".status.usage.outputTokens", "description": "Completion tokens this month"}"#,
    printcolumn = r#"{"name": "Cost", "type": "string", "jsonPath": ".status.usage.cost", "description": "Cost this month at the models' prices"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = kube::core::Rule::new("has(self.groups) || has(self.users) || has(self.serviceAccounts)").message("a grant needs at least one subject: groups, users or serviceAccounts"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.users) || self.users.all(u, !u.startsWith('system:serviceaccount:'))").message("users cannot name a ServiceAccount (system:serviceaccount:...): list the grant's own namespace's ServiceAccounts in serviceAccounts"))]
#[serde(rename_all = "camelCase")]
pub struct AccessGrantSpec {
    /// The Gateways that may serve this grant. A Gateway serves it only
    /// when its `apiKeys` rules admit this namespace AND this list names
    /// it; an empty list means the Gateways of this namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub parent_refs: Vec<ParentReference>,

    /// The name of the identity provider (`Gateway.spec.identity.providers[].name`)
    /// whose tokens name the members. A Gateway without a provider of this
    /// name does not serve the grant (`Accepted=False`, `UnknownProvider`).
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub provider: String,

    /// Members by group: a token whose groups claim lists one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 256), pattern(r"^[^\p{Cc}]+$")))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub groups: Vec<String>,

    /// Members by name: a token whose user claim (`sub` or `email`, as the
    /// provider says) is one of these. Never a ServiceAccount
    /// (`system:serviceaccount:…`): those are `serviceAccounts`, of the
    /// grant's own namespace only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 256), inner(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}]+$")))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub users: Vec<String>,

    /// Workloads by ServiceAccount, as `namespace/name`, for a provider
    /// that is the cluster's own issuer (`serviceAccountIssuer`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 256),
        inner(
            length(min = 3, max = 317),
            pattern(
                r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
            )
        )
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub service_accounts: Vec<String>,

    /// Model names the members may use, as on an ApiKey: `*` globs, and
    /// `namespace/name` to opt in to another team's shared models. Absent:
    /// every model of this namespace and the platform's shared with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}]+$")))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub models: Option<Vec<String>>,

    /// The priority class of the members' requests when a model is full,
    /// as on an ApiKey. Absent: the Gateway's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub class: Option<String>,

    /// Rate and concurrency limits for all members together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<KeyLimits>,

    /// What all members together may spend per calendar period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub budgets: Vec<crate::spend::Budget>,

    /// Each member's own share: limits (`maxConcurrent` is each person's
    /// requests in flight at once) and budgets, on top of the grant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_user: Option<PerUser>,
}

/// What each member of a grant may use on their own.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("has(self.limits) || has(self.budgets)").message("perUser sets limits, budgets or both"))]
#[serde(rename_all = "camelCase")]
pub struct PerUser {
    /// Each member's rate limits and requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<KeyLimits>,
    /// What each member may spend per calendar period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub budgets: Vec<crate::spend::Budget>,
}

/// What the operator last saw and did for an AccessGrant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessGrantStatus {
    /// `Accepted` (a Gateway serves the grant; reasons such as
    /// `UnknownProvider`, `NotAllowedByGateway`, `Invalid`) and
    /// `Programmed` (every ready pod of every Gateway that serves it has it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Per Gateway this grant names (or, without `parentRefs`, per Gateway
    /// of its namespace that admits it): whether that Gateway serves it, and why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["gateway".into()]))]
    pub parents: Vec<GatewayAcceptance>,
    /// What the grant's members used this month together over every
    /// Gateway that serves it, as the operator last collected it from the
    /// gateway pods (written apart from the rest of the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Box<crate::usage::GrantUsageStatus>>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
