//! Where a provider's key set comes from, and the key sets the operator
//! holds, as compile reads them. The fetching is `key_sets`' (a shell, off
//! the reconcile); compile only copies a held document into the provider's
//! config entry — and only one fetched from the source the provider names
//! now, so an edited issuer never serves the old issuer's keys.
//!
//! ```text
//! spec.identity.providers[] ─► KeySource::of_spec ─► key_sets fetches ─► HeldKeySet (by Gateway, provider)
//! ProviderConfig ────────────► KeySource::of_config ─► same source? ─► ProviderConfig.keySet
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use waycast_crds::config::ProviderConfig;
use waycast_crds::identity::IdentityProvider;

use super::verdict::ObjectKey;

/// The document a key set is fetched from. Two providers with the same
/// source hold the same document; how it is fetched (a CA bundle) is not
/// part of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeySource {
    /// OIDC discovery at the issuer, then its `jwks_uri`.
    Discovery {
        /// The issuer as configured.
        issuer: String,
    },
    /// A JWKS URL given outright.
    JwksUri {
        /// The URL.
        uri: String,
    },
    /// A key of a ConfigMap.
    ConfigMap {
        /// Its namespace (the Gateway's).
        namespace: String,
        /// Its name.
        name: String,
        /// The data key.
        key: String,
    },
    /// The API server's own key set (`/openid/v1/jwks`): the cluster's
    /// ServiceAccount issuer.
    Cluster,
}

impl KeySource {
    /// The source `spec`, a provider of a Gateway in `namespace`, names;
    /// `None` when it names no issuer (the schema refuses such a provider).
    pub fn of_spec(spec: &IdentityProvider, namespace: &str) -> Option<Self> {
        if let Some(pinned) = &spec.config_map_ref {
            return Some(Self::ConfigMap {
                namespace: namespace.to_owned(),
                name: pinned.name.clone(),
                key: pinned.key.clone(),
            });
        }
        if spec.service_account_issuer.is_some() {
            return Some(Self::Cluster);
        }
        if let Some(uri) = &spec.jwks_uri {
            return Some(Self::JwksUri { uri: uri.clone() });
        }
        spec.issuer.as_ref().map(|issuer| Self::Discovery { issuer: issuer.clone() })
    }

    /// The source of a compiled provider entry: the same as
    /// [`KeySource::of_spec`] of the spec it was compiled from (a test
    /// holds the two together).
    pub fn of_config(provider: &ProviderConfig) -> Self {
        match (&provider.jwks_config_map, &provider.jwks_uri) {
            (Some(pinned), _) => Self::ConfigMap {
                namespace: pinned.namespace.clone(),
                name: pinned.name.clone(),
                key: pinned.key.clone(),
            },
            (None, _) if provider.service_accounts => Self::Cluster,
            (None, Some(uri)) => Self::JwksUri { uri: uri.clone() },
            (None, None) => Self::Discovery { issuer: provider.issuer.clone() },
        }
    }
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Discovery { issuer } => write!(f, "discovery at {issuer}"),
            Self::JwksUri { uri } => write!(f, "{uri}"),
            Self::ConfigMap { namespace, name, key } => write!(f, "ConfigMap {namespace}/{name} key {key}"),
            Self::Cluster => write!(f, "the API server's /openid/v1/jwks"),
        }
    }
}

/// A provider's key set as the operator holds it: the last good document
/// and how its latest fetch went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKeySet {
    /// Where it was fetched from.
    pub source: KeySource,
    /// The last good document (`None`: none yet).
    pub document: Option<Arc<str>>,
    /// Its signing keys.
    pub keys: usize,
    /// When the document held was fetched (its content last changed);
    /// `None` with a document: kept from the config written before the
    /// operator started.
    pub fetched_at: Option<jiff::Timestamp>,
    /// Why the latest fetch failed; `None`: it succeeded (or none ran yet).
    pub error: Option<String>,
    /// For a provider of the cluster's own issuer, seeded from the config
    /// written before the operator started: the issuer that config named.
    /// It serves this Gateway alone, until the API server's is known —
    /// never another Gateway, whose config a tenant who may write Secrets
    /// in this Gateway's namespace could otherwise name an issuer for.
    pub seeded_issuer: Option<String>,
}

/// Every held key set, by Gateway and provider name.
pub type KeySetIndex = BTreeMap<(ObjectKey, String), HeldKeySet>;

/// The cluster's issuer the config written for `gateway` named for its
/// provider `name` (see [`HeldKeySet::seeded_issuer`]).
pub fn seeded_issuer<'a>(index: &'a KeySetIndex, gateway: &ObjectKey, name: &str) -> Option<&'a str> {
    index.get(&(gateway.clone(), name.to_owned()))?.seeded_issuer.as_deref()
}

/// The document held for provider `name` of `gateway`, when it was fetched
/// from `source`.
pub fn held_document<'a>(
    index: &'a KeySetIndex,
    gateway: &ObjectKey,
    name: &str,
    source: &KeySource,
) -> Option<&'a str> {
    // NB: a look-up by an owned key: the index holds few entries (16 per
    // Gateway at most) and this runs once per provider per compile.
    let held = index.get(&(gateway.clone(), name.to_owned()))?;
    (held.source == *source).then_some(held.document.as_deref()).flatten()
}
