//! Everything compile reads besides the Gateway, owned: taken from the
//! stores by the operator, built from plain objects by tests and
//! benchmarks. The one place [`Inputs`] is assembled. No I/O: what the
//! stores lack is fetched by the Gateway reconciler.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use waycast_crds::endpoints::EndpointsDocument;
use waycast_crds::{AccessGrant, ApiKey, Gateway, GatewayConfig, ModelEndpoint};

use crate::compile::keys::{KeySecret, is_key_secret};
use crate::compile::{self, Compiled, Inputs};
use crate::render::endpoints::ServiceIndex;
use crate::stores::Stores;

/// The objects compile reads, shared with the stores they came from.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// Every namespace (for `Selector` namespace policies).
    pub namespaces: Vec<Arc<Namespace>>,
    /// Every ModelEndpoint.
    pub models: Vec<Arc<ModelEndpoint>>,
    /// Every ApiKey.
    pub keys: Vec<Arc<ApiKey>>,
    /// Every AccessGrant.
    pub grants: Vec<Arc<AccessGrant>>,
    /// The cluster's ServiceAccount token issuer, once known (`key_sets`
    /// finds it at the API server): until then the cluster's own provider
    /// is left out, and the Gateway says so.
    pub service_account_issuer: Option<String>,
    /// The key sets held, by Gateway and provider (`key_sets`).
    pub key_sets: Arc<crate::compile::key_source::KeySetIndex>,
    /// Services that backends may name.
    pub services: Vec<Arc<Service>>,
    /// Their EndpointSlices (as the store keeps them: see `stores::views`).
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// The Secrets served objects reference, with their data where it was
    /// read (the shell fills this: see `secret_data`), and the Gateway's
    /// Redis Secrets.
    pub secrets: Vec<Arc<Secret>>,
    /// The key Secrets served ApiKeys reference, as kept (`secret_data`).
    pub key_secrets: Vec<Arc<KeySecret>>,
    /// Referenced Secrets too large to be read.
    pub too_large: std::collections::BTreeSet<(String, String)>,
    /// The cluster's Service and Pod ranges (empty: not known).
    pub cluster_ranges: Arc<Vec<String>>,
    /// The API server's addresses, as host ranges.
    pub api_server: Vec<String>,
}

impl Catalog {
    /// What the stores hold now, the cluster's networks and the key sets
    /// as known; no Secret yet (the stores hold their metadata only).
    pub fn from_stores(
        stores: &Stores,
        networks: &crate::networks::ClusterNetworks,
        key_sets: &crate::key_sets::Published,
    ) -> Self {
        Self {
            namespaces: stores.namespaces.state(),
            models: stores.models.state(),
            keys: stores.keys.state(),
            grants: stores.grants.state(),
            service_account_issuer: key_sets.cluster_issuer.clone(),
            key_sets: key_sets.index.clone(),
            services: stores.services.state(),
            endpoint_slices: stores.endpoint_slices.state(),
            secrets: Vec::new(),
            key_secrets: Vec::new(),
            too_large: std::collections::BTreeSet::new(),
            cluster_ranges: networks.ranges(),
            api_server: crate::networks::api_server(&stores.endpoint_slices),
        }
    }

    /// Plain objects (tests, benchmarks), copied; Secrets labelled as key
    /// Secrets are kept as the operator keeps them (`secret_data`).
    pub fn from_objects(
        namespaces: &[Namespace],
        models: &[ModelEndpoint],
        keys: &[ApiKey],
        services: &[Service],
        secrets: &[Secret],
    ) -> Self {
        fn shared<K: Clone>(objects: &[K]) -> Vec<Arc<K>> {
            objects.iter().cloned().map(Arc::new).collect()
        }
        Self {
            namespaces: shared(namespaces),
            models: shared(models),
            keys: shared(keys),
            grants: Vec::new(),
            service_account_issuer: None,
            key_sets: Arc::default(),
            services: shared(services),
            endpoint_slices: Vec::new(),
            secrets: shared(&secrets.iter().filter(|s| !is_key_secret(s)).cloned().collect::<Vec<_>>()),
            key_secrets: secrets.iter().filter(|s| is_key_secret(s)).filter_map(KeySecret::of).map(Arc::new).collect(),
            too_large: std::collections::BTreeSet::new(),
            cluster_ranges: Arc::default(),
            api_server: Vec::new(),
        }
    }

    /// Calls `f` with the [`Inputs`] of `gateway` over this catalog.
    pub fn with_inputs<T>(&self, gateway: &Gateway, f: impl FnOnce(&Inputs<'_>) -> T) -> T {
        fn borrowed<K>(objects: &[Arc<K>]) -> Vec<&K> {
            objects.iter().map(AsRef::as_ref).collect()
        }
        let (namespaces, models, keys) = (borrowed(&self.namespaces), borrowed(&self.models), borrowed(&self.keys));
        let (services, secrets) = (borrowed(&self.services), borrowed(&self.secrets));
        let key_secrets = borrowed(&self.key_secrets);
        let access_grants = borrowed(&self.grants);
        f(&Inputs {
            gateway,
            namespaces: &namespaces,
            model_endpoints: &models,
            api_keys: &keys,
            access_grants: &access_grants,
            service_account_issuer: self.service_account_issuer.as_deref(),
            key_sets: &self.key_sets,
            services: &services,
            secrets: &secrets,
            key_secrets: &key_secrets,
            cluster_ranges: &self.cluster_ranges,
            api_server: &self.api_server,
            too_large: &self.too_large,
        })
    }

    /// Compiles `gateway` over this catalog at `now`.
    pub fn compile(&self, gateway: &Gateway, now: jiff::Timestamp) -> Compiled {
        self.with_inputs(gateway, |inputs| compile::gateway(inputs, now))
    }

    /// The endpoints document of the Services `config` routes to.
    pub fn endpoints(&self, config: &GatewayConfig) -> EndpointsDocument {
        ServiceIndex::new(&self.services, &self.endpoint_slices).document(config)
    }
}
