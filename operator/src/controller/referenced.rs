//! The Secrets a Gateway's compile reads: its Redis Secrets, and those its
//! served objects reference, with their data where the operator may read
//! them (`secret_data`).

use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use waycast_crds::Gateway;

use crate::apply::bounded;
use crate::catalog::Catalog;
use crate::compile;
use crate::context::Context;
use crate::error::Error;
use crate::secret_data::SecretName;
use crate::stores::Stores;

/// The most referenced Secrets without the label looked up per reconcile
/// (to tell "not labelled" from "missing" in a status).
const MAX_METADATA_LOOKUPS: usize = 64;

/// Adds the Secrets compile needs: the Gateway's Redis Secrets (the
/// platform team's own), and the Secrets its served objects reference —
/// with their data when they carry the label that lets the operator read
/// them (`secret_data`: read once per version, never past its size cap),
/// else their metadata alone, looked up so the status can say "not
/// labelled" rather than "missing". A failed metadata look-up counts as
/// missing: it never holds up the rest of the Gateway.
///
/// # Errors
/// A failed read of a Redis Secret (the platform team's own).
pub(super) async fn fetch_secrets(catalog: &mut Catalog, context: &Context, gateway: &Gateway) -> Result<(), Error> {
    for (namespace, name) in compile::secrets::redis_secrets(gateway) {
        let api = Api::<Secret>::namespaced(context.client.clone(), &namespace);
        if let Some(secret) = bounded(api.get_opt(&name)).await? {
            catalog.secrets.push(Arc::new(secret));
        }
    }
    fetch_referenced(catalog, context, gateway).await
}

/// The Secrets the catalog's served objects reference (`fetch_secrets`).
///
/// # Errors
/// Their listing failed (its thread panicked): compiling without them
/// would refuse every key.
pub(super) async fn fetch_referenced(catalog: &mut Catalog, context: &Context, gateway: &Gateway) -> Result<(), Error> {
    let (client, stores) = (&context.client, &context.stores);
    // NB: off the runtime's one thread: at 100,000 keys, a tenth of a
    // second the key lane and the watches would wait.
    let (looking, stores_now, of) = (catalog.clone(), stores.clone(), gateway.clone());
    let (wanted, unlabelled) = tokio::task::spawn_blocking(move || referenced(&looking, &stores_now, &of))
        .await
        .map_err(|failed| Error::Io(std::io::Error::other(failed)))?;
    let labelled = |namespace: &str, name: &str| labelled(stores, namespace, name).is_some();
    // NB: bounded: a team naming thousands of Secrets that do not exist
    // must not make every reconcile of the Gateway slow; past the bound
    // they are reported as missing.
    let looked_up: Vec<Option<Secret>> = futures_util::stream::iter(unlabelled.into_iter().take(MAX_METADATA_LOOKUPS))
        .map(|(namespace, name)| async move {
            let api = Api::<Secret>::namespaced(client.clone(), &namespace);
            match bounded(api.get_metadata_opt(&name)).await {
                Ok(meta) => meta.map(|meta| Secret { metadata: meta.metadata, ..Default::default() }),
                Err(error) => {
                    tracing::debug!(%error, secret = %format!("{namespace}/{name}"), "Secret look-up failed");
                    None
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    catalog.secrets.extend(looked_up.into_iter().flatten().map(Arc::new));
    let fetched = context.secret_data.fetch(client, wanted, |(namespace, name)| labelled(namespace, name)).await;
    catalog.secrets.extend(fetched.secrets);
    catalog.key_secrets = fetched.key_secrets;
    catalog.too_large = fetched.too_large;
    Ok(())
}

/// A labelled Secret's metadata (key or credential), as the stores hold it.
fn labelled(stores: &Stores, namespace: &str, name: &str) -> Option<Arc<PartialObjectMeta<Secret>>> {
    let reference = ObjectRef::new(name).within(namespace);
    stores.key_secrets.get(&reference).or_else(|| stores.credentials.get(&reference))
}

/// The Secrets `catalog`'s served objects reference: those labelled (with
/// the resource version the store shows) and those not.
fn referenced(catalog: &Catalog, stores: &Stores, gateway: &Gateway) -> (Vec<(SecretName, String)>, Vec<SecretName>) {
    let mut wanted = Vec::new();
    let mut unlabelled = Vec::new();
    for (namespace, name) in catalog.with_inputs(gateway, compile::referenced_secrets) {
        match labelled(stores, &namespace, &name) {
            Some(meta) => {
                let version = meta.metadata.resource_version.clone().unwrap_or_default();
                wanted.push(((namespace, name), version));
            }
            None => unlabelled.push((namespace, name)),
        }
    }
    (wanted, unlabelled)
}
