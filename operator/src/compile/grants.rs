//! The Gateway's identity providers and the AccessGrants it serves → the
//! config's `providers` and `grants`. Grants are selected with the same
//! two-way consent as ApiKeys (the Gateway's `apiKeys` rules admit the
//! grant's namespace AND the grant names the Gateway, or names none and
//! lives in its namespace); each is checked on its own with the gateway's
//! own checks and left out alone, with a verdict, when it cannot be served.
//!
//! ```text
//! spec.identity.providers[] ─► ProviderConfig (issuer, or the cluster's own; key source; claims;
//!                               the key set held for its source: key_source.rs)
//!                               └ left out: the Gateway's Accepted says why
//! AccessGrants (selected) ───► GrantConfig (unknown provider, class, invalid: left out + verdict)
//! ```

use std::collections::{BTreeMap, HashMap};

use kube::ResourceExt as _;
use waycast_crds::AccessGrant;
use waycast_crds::condition::reasons;
use waycast_crds::config::{ClaimsConfig, ConfigMapKeyConfig, GrantConfig, ProviderConfig};
use waycast_crds::identity::{DEFAULT_GROUPS_CLAIM, DEFAULT_USER_CLAIM, IdentityProvider};
use waycast_crds::identity_config::review_providers;

use super::inputs::Inputs;
use super::key_source::{KeySource, held_document, seeded_issuer};
use super::models::key_limits;
use super::select;
use super::tenants::Tenants;
use super::verdict::{ObjectKey, Verdict};

/// The Gateway's providers as compiled, and why the Gateway's
/// `spec.identity` is not served as written (the first provider left
/// out), if it is not.
pub fn providers(inputs: &Inputs<'_>) -> (Vec<ProviderConfig>, Option<Verdict>) {
    let namespace = inputs.gateway.namespace().unwrap_or_default();
    let gateway = ObjectKey::of(&inputs.gateway.metadata);
    let specs = inputs.gateway.spec.identity.iter().flat_map(|identity| &identity.providers);
    let mut refused = None;
    // Each compiled entry with its index in the spec.
    let mut compiled: Vec<(usize, ProviderConfig)> = Vec::new();
    for (index, spec) in specs.enumerate() {
        // The API server's issuer once known; until then the one this
        // Gateway's own config named before a restart (and only its own).
        let cluster_issuer =
            inputs.service_account_issuer.or_else(|| seeded_issuer(inputs.key_sets, &gateway, &spec.name));
        match provider(spec, &namespace, cluster_issuer) {
            Ok(mut entry) => {
                // NB: a provider without a key set is still compiled: the
                // pods then refuse its tokens (`unknown_key`) and the
                // Gateway's status says why; its grants keep their verdicts.
                let source = KeySource::of_config(&entry);
                entry.key_set = held_document(inputs.key_sets, &gateway, &entry.name, &source).map(str::to_owned);
                compiled.push((index, entry));
            }
            Err(message) => {
                refused.get_or_insert_with(|| invalid(format!("spec.identity.providers[{index}] {message}")));
            }
        }
    }
    // The gateway's own checks on the entries together (and each alone).
    let entries: Vec<ProviderConfig> = compiled.iter().map(|(_, entry)| entry.clone()).collect();
    let left_out = review_providers(&entries);
    if let Some((at, problems)) = left_out.iter().next()
        && refused.is_none()
    {
        let (index, entry) = &compiled[*at];
        let listed: Vec<String> = problems
            .iter()
            .map(|p| format!("{} {}", p.path.split_once('.').map_or("", |(_, field)| field), p.message))
            .collect();
        let message = format!("spec.identity.providers[{index}] ({}): {}; left out", entry.name, listed.join("; "));
        refused = Some(invalid(message));
    }
    let kept = entries.into_iter().enumerate().filter(|(at, _)| !left_out.contains_key(at));
    (kept.map(|(_, entry)| entry).collect(), refused)
}

fn invalid(message: String) -> Verdict {
    Verdict::refused(reasons::INVALID, message)
}

/// One provider as compiled, or why it cannot be.
fn provider(
    spec: &IdentityProvider,
    gateway_namespace: &str,
    service_account_issuer: Option<&str>,
) -> Result<ProviderConfig, String> {
    let issuer = match (&spec.issuer, &spec.service_account_issuer) {
        (Some(issuer), None) => issuer.clone(),
        (None, Some(_)) => service_account_issuer
            .ok_or_else(|| format!("({}): the cluster's ServiceAccount issuer is not known yet; left out", spec.name))?
            .to_owned(),
        _ => return Err(format!("({}): needs exactly one of issuer or serviceAccountIssuer; left out", spec.name)),
    };
    let sources = [spec.discovery.is_some(), spec.jwks_uri.is_some(), spec.config_map_ref.is_some()];
    if sources.iter().filter(|set| **set).count() > 1 {
        return Err(format!("({}): takes its key set from more than one source; left out", spec.name));
    }
    let claims = spec.claims.as_ref();
    Ok(ProviderConfig {
        name: spec.name.clone(),
        issuer,
        audiences: spec.audiences.clone(),
        jwks_uri: spec.jwks_uri.clone(),
        jwks_config_map: spec.config_map_ref.as_ref().map(|reference| ConfigMapKeyConfig {
            namespace: gateway_namespace.to_owned(),
            name: reference.name.clone(),
            key: reference.key.clone(),
        }),
        service_accounts: spec.service_account_issuer.is_some(),
        claims: ClaimsConfig {
            user: claims.and_then(|c| c.user.clone()).unwrap_or_else(|| DEFAULT_USER_CLAIM.to_owned()),
            groups: claims.and_then(|c| c.groups.clone()).unwrap_or_else(|| DEFAULT_GROUPS_CLAIM.to_owned()),
        },
        // Filled by the caller from the key sets held.
        key_set: None,
    })
}

/// The AccessGrants the Gateway serves (both sides consent), in
/// namespace/name order.
pub fn selected<'a>(inputs: &Inputs<'a>) -> Vec<&'a AccessGrant> {
    let gateway = inputs.gateway;
    let gateway_namespace = gateway.namespace().unwrap_or_default();
    let name = gateway.name_any();
    let gateway_ref =
        select::GatewayRef { namespace: &gateway_namespace, name: &name, policy: gateway.spec.api_keys.as_ref() };
    let mut selected: Vec<&AccessGrant> = inputs
        .access_grants
        .iter()
        .copied()
        .filter(|grant| grant.metadata.deletion_timestamp.is_none())
        .filter(|grant| {
            let namespace = grant.metadata.namespace.as_deref().unwrap_or_default();
            select::parent(&gateway_ref, namespace, grant.labels(), &grant.spec.parent_refs, inputs.namespaces)
                == select::Parent::Admitted
        })
        .collect();
    selected.sort_unstable_by(|a, b| ObjectKey::sort_key(&a.metadata).cmp(&ObjectKey::sort_key(&b.metadata)));
    selected
}

/// Compiles every selected AccessGrant against the providers kept;
/// `tenants` decides which classes each namespace may use.
pub fn compile(
    inputs: &Inputs<'_>,
    providers: &[ProviderConfig],
    tenants: &mut Tenants<'_>,
) -> (Vec<GrantConfig>, BTreeMap<ObjectKey, Verdict>) {
    let trusted: HashMap<&str, &ProviderConfig> = providers.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut entries = Vec::new();
    let mut verdicts = BTreeMap::new();
    for grant in selected(inputs) {
        let id = ObjectKey::of(&grant.metadata);
        let spec = &grant.spec;
        let verdict = match trusted.get(spec.provider.as_str()) {
            None => Verdict::refused(
                reasons::UNKNOWN_PROVIDER,
                format!("the Gateway trusts no identity provider {:?} (spec.identity.providers)", spec.provider),
            ),
            Some(provider) if !provider.service_accounts && !spec.service_accounts.is_empty() => Verdict::refused(
                reasons::INVALID,
                format!(
                    "spec.serviceAccounts: provider {:?} is not the cluster's ServiceAccount issuer",
                    spec.provider
                ),
            ),
            Some(_) => match tenants.key_class(&id.namespace, spec.class.as_deref()) {
                Err(refused) => refused,
                Ok(()) => {
                    let entry = entry(&id, grant);
                    // The gateway's own check on this entry alone.
                    match entry.validate() {
                        Ok(()) => {
                            entries.push(entry);
                            Verdict::accepted(reasons::ACCEPTED, "the grant is served")
                        }
                        Err(problems) => {
                            let fields: Vec<String> =
                                problems.0.iter().map(|p| format!("spec.{}: {}", p.path, p.message)).collect();
                            Verdict::refused(reasons::INVALID, format!("not servable: {}", fields.join("; ")))
                        }
                    }
                }
            },
        };
        verdicts.insert(id, verdict);
    }
    (entries, verdicts)
}

/// The config entry of `grant`, whose key is `id`.
fn entry(id: &ObjectKey, grant: &AccessGrant) -> GrantConfig {
    let spec = &grant.spec;
    let budgets = |budgets: &[waycast_crds::spend::Budget]| budgets.iter().map(|b| b.config()).collect();
    let mut entry = GrantConfig::new(id.to_string(), spec.provider.clone());
    entry.groups = spec.groups.clone();
    entry.users = spec.users.clone();
    entry.service_accounts = spec.service_accounts.clone();
    entry.models = spec.models.clone();
    entry.class = spec.class.clone();
    entry.limits = spec.limits.as_ref().map(key_limits);
    entry.budgets = budgets(&spec.budgets);
    entry.per_user = spec.per_user.as_ref().map(|per_user| waycast_crds::config::PerUserConfig {
        limits: per_user.limits.as_ref().map(key_limits),
        budgets: budgets(&per_user.budgets),
    });
    entry
}

#[cfg(test)]
#[path = "grants_tests.rs"]
mod tests;
