//! `Gateway.spec.identity`: the token issuers a platform trusts, so that
//! people and workloads call with the identity they already hold (an OIDC
//! token of the company's provider, a projected ServiceAccount token)
//! instead of a waycast key. Who of them may call what is an
//! [`AccessGrant`](crate::access_grant::AccessGrant), written by a team.
//!
//! ```text
//! Gateway.spec.identity.providers[] ─┐ (platform: whom to trust)
//! AccessGrant (team namespace) ──────┴─► operator compile ─► config providers[] + grants[]
//! ```

use kube::core::{Message, Rule};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most providers one Gateway trusts.
pub const MAX_PROVIDERS: usize = 16;
/// The most audiences one provider accepts.
pub const MAX_AUDIENCES: usize = 16;
/// The claim naming the person when a provider names none.
pub const DEFAULT_USER_CLAIM: &str = "sub";
/// The claim listing the person's groups when a provider names none.
pub const DEFAULT_GROUPS_CLAIM: &str = "groups";

/// The fields of a provider that say where its key set comes from; at most
/// one is set (none: OIDC discovery from the issuer).
pub const KEY_SOURCES: &[&str] = &["discovery", "jwksUri", "configMapRef"];

/// The schema's rule on a provider: at most one key source.
pub fn at_most_one_key_source() -> Rule {
    let set: Vec<String> = KEY_SOURCES.iter().map(|field| format!("has(self.{field})")).collect();
    Rule::new(format!("[{}].filter(named, named).size() <= 1", set.join(", "))).message(Message::Message(
        "a provider takes its key set from one source: discovery, jwksUri or configMapRef (none set: discovery)"
            .to_owned(),
    ))
}

/// Who a Gateway trusts to say who a caller is.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayIdentity {
    /// Token issuers this Gateway trusts, each by a name AccessGrants use
    /// (`spec.provider`). A bearer that is a JWT signed by one of them, for
    /// one of its audiences, is served through the grants that name the
    /// provider; an API key is served as before. NB: tokens are not yet
    /// verified by the gateway pods: grants are compiled, not served.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q.name == p.name))").message("provider names must be unique"))]
    pub providers: Vec<IdentityProvider>,
}

/// One token issuer: an OIDC provider (Keycloak, Entra ID, Okta, Google)
/// or the cluster itself (projected ServiceAccount tokens).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[x_kube(validation = Rule::new("has(self.issuer) != has(self.serviceAccountIssuer)").message("a provider needs exactly one of issuer or serviceAccountIssuer"))]
#[x_kube(validation = crate::identity::at_most_one_key_source())]
#[x_kube(validation = Rule::new("!has(self.serviceAccountIssuer) || !has(self.discovery) && !has(self.jwksUri)").message("serviceAccountIssuer takes its key set from the API server: set no discovery or jwksUri (a configMapRef may pin it)"))]
#[x_kube(validation = Rule::new("!has(self.caConfigMapRef) || !has(self.serviceAccountIssuer) && !has(self.configMapRef)").message("caConfigMapRef is the CA for fetching from the issuer or jwksUri over https: not with serviceAccountIssuer or configMapRef"))]
#[serde(rename_all = "camelCase")]
pub struct IdentityProvider {
    /// The name AccessGrants name it by (`spec.provider`): a DNS label,
    /// unique among this Gateway's providers.
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,

    /// The issuer's URL exactly as its tokens carry it in `iss` (e.g.
    /// `https://sso.example.com/realms/corp`): `https`, no query or
    /// fragment. Discovery reads `<issuer>/.well-known/openid-configuration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 9, max = 2048))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != ''").message("issuer must be an absolute https:// URL"))]
    #[x_kube(validation = Rule::new("!self.contains('?') && !self.contains('#')").message("issuer must have no query or fragment"))]
    pub issuer: Option<String>,

    /// The cluster's own ServiceAccount token issuer, instead of `issuer`:
    /// a workload calls with a projected ServiceAccount token (with one of
    /// `audiences`) and is known as `namespace/serviceaccount`. The operator
    /// finds the API server's issuer and key set itself
    /// (`/.well-known/openid-configuration`, `/openid/v1/jwks`). Write `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_issuer: Option<ServiceAccountIssuer>,

    /// Token audiences (`aud`) this Gateway accepts: a token for none of
    /// them is refused. For ServiceAccount tokens, the audience the pods
    /// request in their projected token (never the API server's own).
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}]+$")))]
    #[x_kube(validation = Rule::new("self.all(a, self.exists_one(b, b == a))").message("audiences must not repeat"))]
    pub audiences: Vec<String>,

    /// Take the key set from OIDC discovery at the issuer (its
    /// `jwks_uri`). The default when no key source is set. Write `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,

    /// Take the key set from this URL (`https`) instead of discovery, for
    /// issuers whose discovery document is not reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 9, max = 2048))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != ''").message("jwksUri must be an absolute https:// URL"))]
    #[x_kube(validation = Rule::new("!self.contains('#')").message("jwksUri must have no fragment"))]
    pub jwks_uri: Option<String>,

    /// Take the key set (a JWKS document) from a key of a ConfigMap in the
    /// Gateway's namespace, for air-gapped clusters: the platform team
    /// updates it when the issuer rotates its keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeyRef>,

    /// The certificate authorities (PEM) that sign the issuer's TLS
    /// certificate, from a key of a ConfigMap in the Gateway's namespace,
    /// for an issuer behind an internal CA (e.g. Keycloak with a company
    /// CA). Used for discovery and `jwksUri` in place of the public roots,
    /// and read again at each fetch, so a renewed CA is picked up. Absent:
    /// the public web PKI roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map_ref: Option<ConfigMapKeyRef>,

    /// Which claims of a token name the person and their groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<IdentityClaims>,
}

/// The cluster's own ServiceAccount issuer (no settings yet).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ServiceAccountIssuer {}

/// OIDC discovery from the issuer (no settings yet).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Discovery {}

/// A key of a ConfigMap in the referring object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// Name of the ConfigMap, in the Gateway's namespace.
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Key within the ConfigMap's `data` (for `configMapRef` a JWKS
    /// document, for `caConfigMapRef` PEM certificates).
    #[schemars(length(min = 1, max = 253), pattern(r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// Which claims name the person and their groups.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityClaims {
    /// The claim naming the person, e.g. `sub` (stable, opaque) or `email`.
    /// Default `sub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}]+$"))]
    pub user: Option<String>,
    /// The claim listing the person's groups (a list of strings), e.g.
    /// `groups` or a namespaced claim such as
    /// `https://example.com/groups`. Default `groups`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), pattern(r"^[^\s\p{Z}\p{Cc}]+$"))]
    pub groups: Option<String>,
}

/// `Gateway.status.identity`: where each provider's key set stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayIdentityStatus {
    /// One entry per provider of `spec.identity.providers`, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub providers: Vec<ProviderKeySetStatus>,
}

/// Whether a provider's key set is loaded: the operator fetches it (at
/// least every 30 s) and writes it into the config the pods verify tokens
/// with.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderKeySetStatus {
    /// The provider's name.
    pub name: String,
    /// Signing keys (`kty` RSA, EC or OKP; `use` absent or `sig`) in the
    /// key set served. Absent: no key set yet, and the pods refuse this
    /// provider's tokens (`unknown_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i32>,
    /// When the key set served was fetched (its content last changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Why the last fetch failed, when it did (the last good key set, if
    /// any, keeps serving); absent when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
