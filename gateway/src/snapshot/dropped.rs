//! What a pod leaves out of a config, entry by entry, and why.

/// An entry of the config this pod does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// `model <source or name>`, `key <id>`, `provider <name>` or `grant <id>`.
    pub entry: String,
    /// Its path in the config and what is wrong (never a credential).
    pub reason: String,
    /// The key shard it came in, for a key of a config in parts.
    pub(super) shard: Option<u32>,
}

impl Dropped {
    pub(super) fn model(model: &waycast_crds::config::ModelConfig, reason: String) -> Self {
        Self { entry: format!("model {}", model.source.as_deref().unwrap_or(&model.name)), reason, shard: None }
    }

    pub(super) fn key(key: &waycast_crds::config::KeyConfig, reason: String, shard: u32) -> Self {
        Self { entry: format!("key {}", key.id), reason, shard: Some(shard) }
    }

    pub(super) fn provider(provider: &waycast_crds::config::ProviderConfig, reason: String) -> Self {
        Self { entry: format!("provider {}", provider.name), reason, shard: None }
    }

    pub(super) fn grant(grant: &waycast_crds::config::GrantConfig, reason: String) -> Self {
        Self { entry: format!("grant {}", grant.id), reason, shard: None }
    }

    pub(super) fn log(&self) {
        tracing::warn!(entry = %self.entry, reason = %self.reason, "config entry left out; the rest is served");
    }
}
