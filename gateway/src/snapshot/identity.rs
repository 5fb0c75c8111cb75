//! The providers a config trusts and the grants it serves, built for the
//! request path: each provider's key set read once here (never per
//! request), each grant a caller entry like a key's plus who it admits.
//!
//! ```text
//! providers[] ─► Provider (key set parsed; none yet or unreadable: an empty
//!                set, so its tokens are refused `unknown_key`, alone)
//! grants[]    ─► Grant { members: users | groups | serviceAccounts, entry: KeyEntry }
//! token ─► Verified ─► member_of(verified, asked) ─► the one grant that serves it
//! refused `unknown_key` ─► note_unknown_key ─► the heartbeat names the provider
//!                          (the operator fetches its key set sooner)
//! ```

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use waycast_crds::config::{GrantConfig, ProviderConfig};

use super::dropped::Dropped;
use super::keys::KeyEntry;
use crate::identity::{KeySet, Provider, Verified};
use crate::limit::members::Members;
use waycast_crds::identity_config::SERVICE_ACCOUNT_SUBJECT;

/// The header a caller names one of its grants with, when several serve it.
pub const GRANT_HEADER: http::HeaderName = http::HeaderName::from_static("x-waycast-grant");

/// Who a config trusts and what it grants them.
#[derive(Default)]
pub struct Identity {
    providers: Vec<Provider>,
    /// Whether `providers[i]` is the cluster's ServiceAccount issuer.
    service_accounts: Vec<bool>,
    /// Whether a token of `providers[i]` was refused `unknown_key` since
    /// the heartbeat last took the notes.
    unknown_keys: Vec<AtomicBool>,
    /// In id order (namespace/name): the first a caller is a member of
    /// serves it unless it names another.
    grants: Vec<Grant>,
}

/// One served grant.
pub struct Grant {
    /// Its index in `Identity::providers`.
    provider: usize,
    users: HashSet<Box<str>>,
    groups: HashSet<Box<str>>,
    /// `namespace/name`.
    service_accounts: HashSet<Box<str>>,
    /// What a member is served as: the grant's models, class, tenant,
    /// limits and budgets for all members together.
    pub entry: KeyEntry,
    /// Each member's own limits and budgets (`perUser`), if it sets any.
    pub members: Option<Arc<Members>>,
}

/// Why a verified caller is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotGranted {
    /// No grant of this config names them.
    NoGrant,
    /// They named a grant (`x-waycast-grant`) that does not admit them.
    NotInNamedGrant,
    /// Grants of more than one namespace admit them and they named none:
    /// no team's grant is chosen for them by its name's order.
    Ambiguous,
}

impl Identity {
    /// Whether the config trusts no provider: every bearer is a key.
    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// The provider whose tokens carry `issuer`.
    pub fn provider_for(&self, issuer: &str) -> Option<&Provider> {
        self.providers.iter().find(|provider| provider.issuer() == issuer)
    }

    /// Grants served.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// Notes that a token of `provider` (one of these) named a key its set
    /// lacks — as right after the issuer rotated: the heartbeat tells the
    /// operator, which fetches the set sooner.
    pub fn note_unknown_key(&self, provider: &Provider) {
        let at = self.providers.iter().position(|ours| std::ptr::eq(ours, provider));
        if let Some(noted) = at.and_then(|at| self.unknown_keys.get(at)) {
            // Read first: during a flood of such tokens the flag is set
            // already, and every worker only reads its line.
            if !noted.load(Ordering::Relaxed) {
                noted.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Whether any provider is noted.
    pub fn unknown_keys_noted(&self) -> bool {
        self.unknown_keys.iter().any(|noted| noted.load(Ordering::Relaxed))
    }

    /// The providers noted, clearing their notes.
    pub fn take_unknown_keys(&self) -> Vec<&str> {
        let noted = self.providers.iter().zip(&self.unknown_keys);
        noted.filter(|(_, noted)| noted.swap(false, Ordering::Relaxed)).map(|(provider, _)| provider.name()).collect()
    }

    /// Notes the providers named `names` again (taken for a heartbeat that
    /// was not written).
    pub fn renote_unknown_keys(&self, names: &[String]) {
        for (provider, noted) in self.providers.iter().zip(&self.unknown_keys) {
            if names.iter().any(|name| name == provider.name()) {
                noted.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The grant that serves `verified`: the one named by `asked` (a grant
    /// id) when it admits them, else the first in id order that does when
    /// every grant that admits them is of one namespace.
    ///
    /// NB: any team may write a grant naming any group or user of a
    /// provider; were the first grant by name chosen across namespaces, a
    /// team whose namespace sorts first could serve other teams' people
    /// through its own models. Grants of several namespaces admitting one
    /// person therefore make them name one.
    ///
    /// # Errors
    /// [`NotGranted`]: none admits them, the one they named does not, or
    /// grants of several namespaces do and they named none.
    pub fn grant_for(&self, verified: &Verified, asked: Option<&[u8]>) -> Result<&Grant, NotGranted> {
        let Some(provider) = self.providers.iter().position(|p| p.name() == &*verified.provider) else {
            return Err(NotGranted::NoGrant);
        };
        let service_account = self.service_accounts[provider]
            .then(|| verified.user.strip_prefix(SERVICE_ACCOUNT_SUBJECT))
            .flatten()
            .and_then(|rest| rest.split_once(':'))
            .map(|(namespace, name)| format!("{namespace}/{name}"));
        // A ServiceAccount is admitted by `serviceAccounts` only (of the
        // grant's own namespace), never by a `users` entry naming it.
        let admits = |grant: &&Grant| {
            grant.provider == provider
                && ((service_account.is_none() && grant.users.contains(&*verified.user))
                    || verified.groups.iter().any(|group| grant.groups.contains(group))
                    || service_account.as_deref().is_some_and(|sa| grant.service_accounts.contains(sa)))
        };
        match asked {
            Some(asked) => self
                .grants
                .iter()
                .filter(admits)
                .find(|grant| grant.entry.id.as_bytes() == asked.trim_ascii())
                .ok_or(NotGranted::NotInNamedGrant),
            None => {
                let mut admitting = self.grants.iter().filter(admits);
                let first = admitting.next().ok_or(NotGranted::NoGrant)?;
                let namespace = first.entry.tenant.namespace.as_ref();
                if admitting.any(|other| other.entry.tenant.namespace.as_ref() != namespace) {
                    return Err(NotGranted::Ambiguous);
                }
                Ok(first)
            }
        }
    }
}

/// The providers of a screened config: each with its key set, or an empty
/// one (its tokens refused `unknown_key`) when none was fetched or it does
/// not read — that provider alone is affected, listed in `dropped`.
pub(super) fn providers(configs: &[ProviderConfig], dropped: &mut Vec<Dropped>) -> (Vec<Provider>, Vec<bool>) {
    let mut providers = Vec::with_capacity(configs.len());
    let mut service_accounts = Vec::with_capacity(configs.len());
    for config in configs {
        let keys = match config.key_set.as_deref().map(|set| KeySet::parse(set.as_bytes())) {
            Some(Ok(keys)) => keys,
            Some(Err(error)) => {
                dropped.push(Dropped::provider(config, format!("keySet: {error}; its tokens are refused")));
                KeySet::empty()
            }
            None => KeySet::empty(),
        };
        let audiences: Vec<&str> = config.audiences.iter().map(String::as_str).collect();
        let groups = Some(config.claims.groups.as_str());
        match Provider::new(&config.name, &config.issuer, &audiences, &config.claims.user, groups, keys) {
            Ok(provider) => {
                providers.push(provider);
                service_accounts.push(config.service_accounts);
            }
            Err(error) => dropped.push(Dropped::provider(config, error.to_string())),
        }
    }
    (providers, service_accounts)
}

impl Identity {
    /// The identity of a config: `providers` as built, and `grants` each
    /// with its entry (`entry_of` builds it as a key's).
    pub(super) fn new(
        providers: (Vec<Provider>, Vec<bool>),
        grants: &[GrantConfig],
        mut entry_of: impl FnMut(&GrantConfig) -> Option<(KeyEntry, Option<Arc<Members>>)>,
        dropped: &mut Vec<Dropped>,
    ) -> Self {
        let (providers, service_accounts) = providers;
        let mut sorted: Vec<&GrantConfig> = grants.iter().collect();
        sorted.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        let mut served = Vec::with_capacity(sorted.len());
        for grant in sorted {
            let Some(provider) = providers.iter().position(|p| p.name() == grant.provider) else {
                dropped.push(Dropped::grant(grant, format!("provider: no provider {:?} is served", grant.provider)));
                continue;
            };
            let Some((entry, members)) = entry_of(grant) else { continue };
            let set = |listed: &[String]| listed.iter().map(|s| Box::from(s.as_str())).collect();
            served.push(Grant {
                provider,
                users: set(&grant.users),
                groups: set(&grant.groups),
                service_accounts: set(&grant.service_accounts),
                entry,
                members,
            });
        }
        let unknown_keys = providers.iter().map(|_| AtomicBool::new(false)).collect();
        Self { providers, service_accounts, unknown_keys, grants: served }
    }
}
