//! A ModelEndpoint's backend → the config's backend: its kind read
//! (`Backend::kind` in crds), resolved by that kind's own function into a
//! [`Target`] (where requests go), then what every kind shares added
//! (credential, weight, priority, TLS).
//!
//! ```text
//! Backend ─kind()─► service.rs   a Service of the ModelEndpoint's namespace → its endpoints or address
//!                   url.rs       an external base URL, within the Gateway's egress rules
//!         ─► Target { url, endpoints } ─► finish: credential, weight, priority, TLS ─► BackendConfig
//! ```
//!
//! A new kind is one file here with its `resolve`, and one arm in
//! [`resolve`]'s match; `scope.rs` holds what kinds share (the field's
//! name, the scheme, the egress check). The config format does not change:
//! every kind resolves to a URL, and to an endpoints key when its pods are
//! picked by the gateway.

mod scope;
mod service;
mod url;

pub use scope::{Scope, Target};
pub use service::DEFAULT_BASE_PATH;

use std::collections::BTreeMap;

use waycast_crds::condition::reasons;
use waycast_crds::config::BackendConfig;
use waycast_crds::model_endpoint::{Backend, BackendKind};

use super::inputs::Inputs;
use super::secrets::{backend_tls, credential};
use super::verdict::Verdict;

/// Backend `index` of a ModelEndpoint in `namespace`, resolved by its kind.
///
/// # Errors
/// The verdict that leaves the ModelEndpoint out: a backend of no single
/// kind (`Invalid`), one its kind cannot resolve (not found, not allowed by
/// the Gateway), or a credential or TLS Secret that cannot be read.
pub fn resolve(
    index: usize,
    backend: &Backend,
    namespace: &str,
    inputs: &Inputs<'_>,
) -> Result<BackendConfig, Verdict> {
    let scope = Scope { index, namespace, tls: backend.tls.is_some(), inputs };
    let kind = backend.kind().map_err(|why| Verdict::refused(reasons::INVALID, format!("{}: {why}", scope.field())))?;
    let target = match kind {
        BackendKind::Service(service) => service::resolve(service, &scope)?,
        BackendKind::Url(base) => url::resolve(base, &scope)?,
    };
    finish(backend, target, &scope)
}

/// A backend at `target` with its credential, weight, priority and TLS:
/// what every kind shares.
fn finish(backend: &Backend, target: Target, scope: &Scope<'_>) -> Result<BackendConfig, Verdict> {
    let Scope { index, namespace, inputs, .. } = *scope;
    let mut headers = BTreeMap::new();
    if let Some(auth) = &backend.auth {
        headers.extend(credential(index, auth, namespace, inputs)?);
    }
    let mut config = BackendConfig::to(target.url);
    config.model = backend.model.clone();
    config.weight = backend.weight.and_then(|w| u32::try_from(w).ok()).unwrap_or(1);
    config.headers = headers;
    config.endpoints = target.endpoints;
    config.priority = backend.priority.and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
    config.format = backend.format.unwrap_or_default();
    config.tls = backend.tls.as_ref().map(|tls| backend_tls(index, tls, namespace, inputs)).transpose()?;
    Ok(config)
}

#[cfg(test)]
mod tests;
