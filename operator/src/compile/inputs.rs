//! What compile reads: a Gateway and what the stores hold.

use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use waycast_crds::{AccessGrant, ApiKey, Gateway, ModelEndpoint};

/// What compile reads.
pub struct Inputs<'a> {
    /// The Gateway being compiled.
    pub gateway: &'a Gateway,
    /// Every namespace (for `Selector` namespace policies).
    pub namespaces: &'a [&'a Namespace],
    /// Every ModelEndpoint.
    pub model_endpoints: &'a [&'a ModelEndpoint],
    /// Every ApiKey.
    pub api_keys: &'a [&'a ApiKey],
    /// Every AccessGrant.
    pub access_grants: &'a [&'a AccessGrant],
    /// The cluster's own ServiceAccount token issuer (`iss` of projected
    /// tokens), as found at the API server; `None` while not known, and
    /// providers that are the cluster's own are left out meanwhile.
    pub service_account_issuer: Option<&'a str>,
    /// The key sets the operator fetched, by Gateway and provider: a
    /// provider's entry carries the one held for its current source.
    pub key_sets: &'a super::key_source::KeySetIndex,
    /// Services that backends may name.
    pub services: &'a [&'a Service],
    /// Upstream credential Secrets (with
    /// their labels: only those with `waycast.dev/credential: "true"` are
    /// used), and referenced Secrets known only by their metadata.
    pub secrets: &'a [&'a Secret],
    /// Key Secrets as the operator keeps them (digests, never the text);
    /// an ApiKey's key is looked up here first, then in `secrets`.
    pub key_secrets: &'a [&'a super::key_secret::KeySecret],
    /// The cluster's Service and Pod ranges (empty: not known, and every
    /// private range is closed to `url` backends instead).
    pub cluster_ranges: &'a [String],
    /// The API server's addresses, as host ranges.
    pub api_server: &'a [String],
    /// Referenced Secrets whose data is too large to be read, as
    /// `(namespace, name)`: the objects naming them are refused.
    pub too_large: &'a std::collections::BTreeSet<(String, String)>,
}
