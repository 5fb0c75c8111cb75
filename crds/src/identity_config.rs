//! The compiled form of identity: the providers a Gateway trusts and the
//! grants it serves, as `GatewayConfig.providers` and `.grants`, and their
//! checks (one entry on its own, then the entries together: names and ids
//! unique, each grant's provider known).
//!
//! NB: the gateway pods read these and serve nothing from them yet: token
//! verification comes later. Old configs have neither (both default empty).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::common::LimitsConfig;
use crate::identity::{DEFAULT_GROUPS_CLAIM, DEFAULT_USER_CLAIM, MAX_AUDIENCES, MAX_PROVIDERS};
use crate::problems::{Collector, Problem, Problems};
use crate::spend::BudgetConfig;

/// The most subjects of one kind a grant lists.
pub const MAX_SUBJECTS: usize = 256;
/// How the API server names a ServiceAccount in its tokens' `sub`
/// (`system:serviceaccount:<namespace>:<name>`).
pub const SERVICE_ACCOUNT_SUBJECT: &str = "system:serviceaccount:";

/// One trusted token issuer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderConfig {
    /// The name grants use (a DNS label).
    pub name: String,
    /// `iss` of its tokens (an `https` URL); for the cluster's own issuer,
    /// the API server's as the operator found it.
    pub issuer: String,
    /// `aud` values accepted (1 to 16).
    pub audiences: Vec<String>,
    /// The key set's URL. Absent (and no `jwksConfigMap`): OIDC discovery
    /// from `issuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// The key set from a key of a ConfigMap (air-gapped clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_config_map: Option<ConfigMapKeyConfig>,
    /// The cluster's own ServiceAccount issuer: a token names
    /// `system:serviceaccount:<namespace>:<name>`, matched against the
    /// grants' `serviceAccounts`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub service_accounts: bool,
    /// Which claims name the person and their groups.
    #[serde(default)]
    pub claims: ClaimsConfig,
    /// The key set (a JWKS document) as the operator last fetched it from
    /// the provider's source. Absent: none fetched yet, and the gateway
    /// refuses the provider's tokens (401 `unknown_key`) until one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_set: Option<String>,
}

/// Largest key set document carried in a config (real ones are 1–10 KiB).
pub const MAX_KEY_SET_BYTES: usize = 64 * 1024;

impl ProviderConfig {
    /// The provider `name` at `issuer` for `audience`, discovery, default claims.
    pub fn new(name: impl Into<String>, issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            issuer: issuer.into(),
            audiences: vec![audience.into()],
            jwks_uri: None,
            jwks_config_map: None,
            service_accounts: false,
            claims: ClaimsConfig::default(),
            key_set: None,
        }
    }
}

/// A key of a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigMapKeyConfig {
    /// The ConfigMap's namespace (the Gateway's).
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// The data key holding the JWKS document.
    pub key: String,
}

/// Which claims name the person and their groups.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimsConfig {
    /// The claim naming the person. Default `sub`.
    #[serde(default = "default_user_claim")]
    pub user: String,
    /// The claim listing their groups. Default `groups`.
    #[serde(default = "default_groups_claim")]
    pub groups: String,
}

fn default_user_claim() -> String {
    DEFAULT_USER_CLAIM.to_owned()
}

fn default_groups_claim() -> String {
    DEFAULT_GROUPS_CLAIM.to_owned()
}

impl Default for ClaimsConfig {
    fn default() -> Self {
        Self { user: default_user_claim(), groups: default_groups_claim() }
    }
}

/// One served grant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrantConfig {
    /// `namespace/name` of its AccessGrant; the namespace is its tenant.
    pub id: String,
    /// The provider (`providers[].name`) whose tokens name its members.
    pub provider: String,
    /// Members by group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Members by user claim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// Members by ServiceAccount, `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    /// Model names or `*` globs the members may use. Absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Its priority class; absent: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Limits for all members together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsConfig>,
    /// Budgets for all members together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetConfig>,
    /// Each member's own limits and budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_user: Option<PerUserConfig>,
}

impl GrantConfig {
    /// The grant `id` through `provider`, with no members yet.
    pub fn new(id: impl Into<String>, provider: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            provider: provider.into(),
            groups: Vec::new(),
            users: Vec::new(),
            service_accounts: Vec::new(),
            models: None,
            class: None,
            limits: None,
            budgets: Vec::new(),
            per_user: None,
        }
    }

    /// Its namespace: the id up to the first `/`.
    pub fn namespace(&self) -> &str {
        self.id.split_once('/').map_or("", |(namespace, _)| namespace)
    }
}

/// Each member's share of a grant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PerUserConfig {
    /// Each member's limits (`maxConcurrent`: their requests in flight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsConfig>,
    /// Each member's budgets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetConfig>,
}

/// `parent.child`, or `child` at the top.
fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() { child.to_owned() } else { format!("{parent}.{child}") }
}

fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

fn is_dns_subdomain(text: &str) -> bool {
    !text.is_empty() && text.len() <= 253 && text.split('.').all(is_dns_label)
}

/// A claim value or audience: 1 to 256 characters, none whitespace or control.
fn is_token_word(text: &str) -> bool {
    !text.is_empty() && text.len() <= 256 && !text.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Why `url` is not an `https` URL with a host (and, for an issuer, no
/// query), if it is not.
pub fn https_url_problem(url: &str, query_allowed: bool) -> Option<&'static str> {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return Some("is not a valid URL");
    };
    if uri.scheme_str() != Some("https") || uri.host().is_none_or(str::is_empty) {
        Some("must be an absolute https:// URL")
    } else if url.len() > 2048 {
        Some("must be at most 2048 characters")
    } else if url.contains('#') || (!query_allowed && uri.query().is_some()) {
        Some(if query_allowed { "must have no fragment" } else { "must have no query or fragment" })
    } else {
        None
    }
}

impl ProviderConfig {
    /// Checks one provider entry on its own; paths relative to it.
    ///
    /// # Errors
    /// [`Problems`] listing every invalid value with its path.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut problems = Collector::default();
        check_provider("", self, &mut problems);
        problems.into_result()
    }
}

impl GrantConfig {
    /// Checks one grant entry on its own (not its provider, class or
    /// duplicates); paths relative to it.
    ///
    /// # Errors
    /// [`Problems`] listing every invalid value with its path.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut problems = Collector::default();
        check_grant("", self, &mut problems);
        problems.into_result()
    }
}

fn check_provider(path: &str, provider: &ProviderConfig, problems: &mut Collector) {
    if !is_dns_label(&provider.name) {
        problems.add(join(path, "name"), "must be a DNS label (a-z, 0-9, '-'), at most 63 characters");
    }
    if let Some(message) = https_url_problem(&provider.issuer, false) {
        problems.add(join(path, "issuer"), message);
    }
    if provider.audiences.is_empty() || provider.audiences.len() > MAX_AUDIENCES {
        problems.add(join(path, "audiences"), format!("must list 1 to {MAX_AUDIENCES} audiences"));
    }
    for (index, audience) in provider.audiences.iter().enumerate() {
        if !is_token_word(audience) {
            problems.add(join(path, &format!("audiences[{index}]")), "must be 1 to 256 characters without whitespace");
        } else if provider.audiences[..index].contains(audience) {
            problems.add(join(path, &format!("audiences[{index}]")), format!("{audience:?} is listed twice"));
        }
    }
    if let Some(uri) = &provider.jwks_uri
        && let Some(message) = https_url_problem(uri, true)
    {
        problems.add(join(path, "jwksUri"), message);
    }
    if let Some(config_map) = &provider.jwks_config_map {
        if provider.jwks_uri.is_some() {
            problems.add(join(path, "jwksConfigMap"), "a provider takes its key set from one source, not jwksUri too");
        }
        let valid = is_dns_label(&config_map.namespace)
            && is_dns_subdomain(&config_map.name)
            && !config_map.key.is_empty()
            && config_map.key.len() <= 253
            && config_map.key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
        if !valid {
            problems.add(join(path, "jwksConfigMap"), "must name a ConfigMap (namespace, name) and a data key");
        }
    }
    if provider.key_set.as_ref().is_some_and(|set| set.len() > MAX_KEY_SET_BYTES) {
        problems.add(join(path, "keySet"), format!("must be at most {MAX_KEY_SET_BYTES} bytes"));
    }
    for (field, claim) in [("claims.user", &provider.claims.user), ("claims.groups", &provider.claims.groups)] {
        if !is_token_word(claim) {
            problems.add(join(path, field), "must be a claim name: 1 to 256 characters without whitespace");
        }
    }
}

fn check_grant(path: &str, grant: &GrantConfig, problems: &mut Collector) {
    let valid_id =
        grant.id.split_once('/').is_some_and(|(namespace, name)| is_dns_label(namespace) && is_dns_subdomain(name));
    if !valid_id {
        problems.add(join(path, "id"), "must be namespace/name");
    }
    if !is_dns_label(&grant.provider) {
        problems.add(join(path, "provider"), "must be a provider's name (a DNS label)");
    }
    if grant.groups.is_empty() && grant.users.is_empty() && grant.service_accounts.is_empty() {
        problems.add(path.to_owned(), "needs at least one subject: groups, users or serviceAccounts");
    }
    let subjects = [("groups", &grant.groups), ("users", &grant.users), ("serviceAccounts", &grant.service_accounts)];
    for (field, listed) in subjects {
        if listed.len() > MAX_SUBJECTS {
            problems.add(join(path, field), format!("must list at most {MAX_SUBJECTS}"));
        }
        for (index, subject) in listed.iter().enumerate() {
            let valid = match field {
                "groups" => !subject.is_empty() && subject.len() <= 256 && !subject.chars().any(char::is_control),
                // A ServiceAccount named as a user would get round the
                // own-namespace rule below.
                "users" => is_token_word(subject) && !subject.starts_with(SERVICE_ACCOUNT_SUBJECT),
                // A team grants its own workloads only: another
                // namespace's ServiceAccount is that namespace's to grant.
                _ => subject.split_once('/').is_some_and(|(ns, name)| {
                    is_dns_label(ns)
                        && is_dns_subdomain(name)
                        && (ns == grant.namespace() || grant.namespace().is_empty())
                }),
            };
            if !valid {
                let message = match field {
                    "groups" => "must be 1 to 256 characters without control characters",
                    "users" => {
                        "must be 1 to 256 characters without whitespace, and not a ServiceAccount (system:serviceaccount:…: list the grant's own in serviceAccounts)"
                    }
                    _ => "must be namespace/name of a ServiceAccount of the grant's own namespace",
                };
                problems.add(join(path, &format!("{field}[{index}]")), message);
            }
        }
    }
    for (index, pattern) in grant.models.iter().flatten().enumerate() {
        if pattern.is_empty() || pattern.chars().any(crate::common::is_forbidden_in_name) {
            problems.add(
                join(path, &format!("models[{index}]")),
                "must be a model name or a glob without whitespace or control characters",
            );
        }
    }
    if let Some(class) = &grant.class
        && !is_dns_label(class)
    {
        problems.add(join(path, "class"), "must be a lowercase DNS label (a-z, 0-9, '-'), at most 63 characters");
    }
    if let Some(limits) = &grant.limits {
        crate::common::check_limits(&join(path, "limits"), limits, problems);
    }
    crate::spend::check_budgets(&join(path, "budgets"), &grant.budgets, problems);
    if let Some(per_user) = &grant.per_user {
        if let Some(limits) = &per_user.limits {
            crate::common::check_limits(&join(path, "perUser.limits"), limits, problems);
        }
        crate::spend::check_budgets(&join(path, "perUser.budgets"), &per_user.budgets, problems);
    }
}

/// The provider entries left out (by index) and why: each on its own,
/// then a name an earlier entry kept, then past [`MAX_PROVIDERS`].
pub fn review_providers(providers: &[ProviderConfig]) -> BTreeMap<usize, Vec<Problem>> {
    let mut left_out = BTreeMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (index, provider) in providers.iter().enumerate() {
        let path = format!("providers[{index}]");
        let mut problems = Collector::default();
        check_provider(&path, provider, &mut problems);
        if let Some(first) = names.get(provider.name.as_str()) {
            problems.add(format!("{path}.name"), format!("{:?} is also the name of providers[{first}]", provider.name));
        } else if problems.0.is_empty() && names.len() >= MAX_PROVIDERS {
            problems.add(path.clone(), format!("a config trusts at most {MAX_PROVIDERS} providers"));
        }
        if problems.0.is_empty() {
            names.insert(&provider.name, index);
        } else {
            left_out.insert(index, problems.0);
        }
    }
    left_out
}

/// The grant entries left out (by index) and why, given the providers
/// kept (`kept`: each kept provider's name and whether it is the cluster's
/// ServiceAccount issuer) and the config's settings (a grant's class, as a
/// key's, must be open to its namespace).
pub fn review_grants(
    settings: &crate::settings::Settings,
    kept: &HashMap<&str, bool>,
    grants: &[GrantConfig],
) -> BTreeMap<usize, Vec<Problem>> {
    let mut left_out = BTreeMap::new();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (index, grant) in grants.iter().enumerate() {
        let path = format!("grants[{index}]");
        let mut problems = Collector::default();
        check_grant(&path, grant, &mut problems);
        match kept.get(grant.provider.as_str()) {
            None => problems.add(format!("{path}.provider"), format!("no provider {:?}", grant.provider)),
            Some(false) if !grant.service_accounts.is_empty() => problems.add(
                format!("{path}.serviceAccounts"),
                format!("provider {:?} is not the cluster's ServiceAccount issuer", grant.provider),
            ),
            Some(_) => {}
        }
        let tenant = settings.tenant(grant.namespace());
        if let Err(message) = crate::sharing::key_class(&settings.sharing, tenant, grant.class.as_deref()) {
            problems.add(format!("{path}.class"), message);
        }
        if let Some(first) = ids.get(grant.id.as_str()) {
            problems.add(format!("{path}.id"), format!("{:?} is also the id of grants[{first}]", grant.id));
        }
        if problems.0.is_empty() {
            ids.insert(&grant.id, index);
        } else {
            left_out.insert(index, problems.0);
        }
    }
    left_out
}

#[cfg(test)]
#[path = "identity_config_tests.rs"]
mod tests;
