//! The pure heart of the operator: a Gateway and what the stores hold →
//! the GatewayConfig its pods serve, and a verdict for every ModelEndpoint
//! and ApiKey it selects.
//!
//! ```text
//! Inputs { gateway, namespaces, model endpoints, api keys, grants, services, secrets }, now   (inputs.rs)
//!   ─► select.rs    which objects the Gateway takes (two-way consent: parentRefs + namespace rules)
//!   ─► models.rs    routes: key visibility, per-entry validation, conflicts (own namespace,
//!                   then oldest); each backend by its kind (backends/: service.rs, url.rs),
//!                   egress rules, credentials
//!   ─► secrets.rs   opted-in credentials, CA and client certificates; lookups
//!   ─► keys.rs      key Secrets (owned, when generated) → SHA-256, length, expiry, disabled,
//!                   per-entry validation, duplicates (oldest first)
//!   ─► tenants.rs   sharing (classes, queue) and the policy of each served key's namespace;
//!                   a key's class checked against both (ClassNotAllowed)
//!   ─► grants.rs    the Gateway's identity providers (each with the key set held for its source:
//!                   key_source.rs), and the AccessGrants it selects (consent as for keys; unknown
//!                   provider, class, per-entry validation)
//!   ─► settings.rs  the Gateway's own settings: body limit, access log, egress ranges, Redis
//!   ─► Compiled { config, verdicts (verdict.rs), what each tenant policy matched }
//!   ─► fit.rs       (by the shell) the newest team objects left out until the config fits its Secrets
//! ```
//!
//! No I/O, no clock (`now` is passed in), no randomness, and `BTreeMap`
//! wherever order reaches the output: the same inputs give byte-identical
//! config. Plaintext keys are hashed here and go no further.

pub mod backends;
pub mod fit;
pub mod grants;
pub mod inputs;
pub mod key_secret;
pub mod key_source;
pub mod keys;
pub mod models;
pub mod secrets;
pub mod select;
pub mod settings;
pub mod tenants;
pub mod verdict;

pub use inputs::Inputs;
pub use verdict::{ObjectKey, Verdict};

use std::collections::BTreeMap;

use waycast_crds::config::{GatewayConfig, GrantConfig, KeyConfig};

/// Every team Secret the Gateway's served objects reference (key Secrets,
/// credentials, CA and client certificates), as `(namespace, name)`: the
/// Secrets whose data compile needs, and the only ones read.
pub fn referenced_secrets(inputs: &Inputs<'_>) -> std::collections::BTreeSet<(String, String)> {
    keys::key_secrets(inputs).chain(models::credential_secrets(inputs)).collect()
}

/// What compile produces for one Gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    /// The config its pods serve.
    pub config: GatewayConfig,
    /// Every selected ModelEndpoint.
    pub models: BTreeMap<ObjectKey, Verdict>,
    /// Every selected ApiKey.
    pub keys: BTreeMap<ObjectKey, keys::KeyVerdict>,
    /// Every selected AccessGrant.
    pub grants: BTreeMap<ObjectKey, Verdict>,
    /// Why the Gateway's own spec is not served as written (its `Accepted`
    /// condition), if it is not.
    pub gateway: Option<Verdict>,
    /// What each of the Gateway's tenant policies matched.
    pub tenants: Vec<waycast_crds::sharing::TenantPolicyStatus>,
}

/// Compiles one Gateway.
pub fn gateway(inputs: &Inputs<'_>, now: jiff::Timestamp) -> Compiled {
    let (models, model_verdicts) = models::compile(inputs);
    let (sharing, sharing_refused) = tenants::sharing(inputs);
    let policy_refused = tenants::policy_problems(inputs, &sharing);
    let mut policies = tenants::Tenants::new(inputs, sharing);
    let (keys, key_verdicts) = keys::compile(inputs, now, &mut policies);
    let (providers, identity_refused) = grants::providers(inputs);
    let (grants, grant_verdicts) = grants::compile(inputs, &providers, &mut policies);
    let (mut settings, refused) = settings::settings(inputs);
    let (budgets, budgets_refused) = tenants::budgets(inputs);
    settings.budgets = budgets;
    settings.sharing = policies.sharing().clone();
    // A grant's namespace is a tenant as a key's is: its class and caps
    // come from the same policy.
    let served = keys.iter().map(KeyConfig::namespace).chain(grants.iter().map(GrantConfig::namespace));
    let (tenant_entries, tenants) = policies.compile(served);
    settings.tenants = tenant_entries;
    let config = GatewayConfig { models, keys, settings, providers, grants, ..GatewayConfig::empty() };
    let gateway = refused.or(sharing_refused).or(policy_refused).or(budgets_refused).or(identity_refused);
    Compiled { config, models: model_verdicts, keys: key_verdicts, grants: grant_verdicts, gateway, tenants }
}

#[cfg(test)]
mod tests;
