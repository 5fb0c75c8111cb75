//! What the operator keeps of a key Secret: its digests, never its text
//! (`secret_data` keeps these; compile reads them).

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use waycast_crds::api_key::SHOWN_PREFIX_LEN;

/// What compile reads of a key text: its digest, its first characters
/// (shown in the ApiKey's status) and its length in characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyText {
    /// SHA-256 (hex) of the trimmed text.
    pub sha256: String,
    /// Its first [`SHOWN_PREFIX_LEN`] characters.
    pub prefix: String,
    /// Its length in characters.
    pub chars: usize,
}

impl KeyText {
    /// Of a Secret value, trimmed (not UTF-8: lossily); `None` when empty.
    pub fn of(bytes: &[u8]) -> Option<Self> {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim();
        (!text.is_empty()).then(|| Self {
            sha256: waycast_crds::digest::sha256_hex(text.as_bytes()),
            prefix: text.chars().take(SHOWN_PREFIX_LEN).collect(),
            chars: text.chars().count(),
        })
    }
}

/// A key Secret as the operator keeps it: who it is, whose (the uid of its
/// controller owner: a generated key must be its ApiKey's own), and each
/// value as a [`KeyText`]. At 100,000 keys the Secrets' plaintext and
/// metadata were ~1.5 KB a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySecret {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its controller owner's uid.
    pub controller: Option<String>,
    /// Each non-empty value, with its data key. NB: a list, not a map: a
    /// B-tree's first node holds room for eleven (~0.9 KB for one key).
    pub texts: Box<[(String, KeyText)]>,
}

impl KeySecret {
    /// The text under data key `key`.
    pub fn text(&self, key: &str) -> Option<&KeyText> {
        self.texts.iter().find(|(name, _)| name == key).map(|(_, text)| text)
    }

    /// What is kept of `secret` (`None`: it has no namespace or name).
    pub fn of(secret: &Secret) -> Option<Self> {
        let controller = secret.owner_references().iter().find(|owner| owner.controller == Some(true));
        Some(Self {
            namespace: secret.metadata.namespace.clone()?,
            name: secret.metadata.name.clone()?,
            controller: controller.map(|owner| owner.uid.clone()),
            texts: secret
                .data
                .iter()
                .flatten()
                .filter_map(|(key, value)| Some((key.clone(), KeyText::of(&value.0)?)))
                .collect(),
        })
    }
}

/// Whether `secret` carries the key Secret label (`waycast.dev/api-key`):
/// what the operator keeps of it is its digests (`secret_data`).
pub fn is_key_secret(secret: &Secret) -> bool {
    secret.metadata.labels.as_ref().is_some_and(|labels| labels.contains_key(waycast_crds::api_key::KEY_SECRET_LABEL))
}
