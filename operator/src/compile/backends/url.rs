//! A `url` backend: an external provider's OpenAI-style base URL, served
//! as written (its query too) when the Gateway's egress rules allow it.

use waycast_crds::condition::reasons;

use super::scope::{Scope, Target};
use crate::compile::verdict::Verdict;

/// The base URL `base` as the backend's target.
///
/// # Errors
/// `NotAllowedByGateway` when the Gateway's egress rules refuse its host.
pub fn resolve(base: &str, scope: &Scope<'_>) -> Result<Target, Verdict> {
    scope
        .egress(base)
        .map_err(|why| Verdict::refused(reasons::NOT_ALLOWED_BY_GATEWAY, format!("{}.url: {why}", scope.field())))?;
    Ok(Target { url: base.to_owned(), endpoints: None })
}
