//! The data of the Secrets that served objects reference, and only theirs.
//!
//! Labelled Secrets (key Secrets, opted-in credentials) are watched as
//! metadata only: anyone who may create Secrets can label a thousand of
//! them, a MiB each. The operator reads a Secret's data when a Gateway it
//! reconciles serves an object that references it — an ApiKey's key
//! Secret, a ModelEndpoint's credential and TLS Secrets — keeps it under
//! the resource version it read, and keeps nothing of a Secret whose data
//! exceeds [`MAX_SECRET_BYTES`] but that fact (the object says why). Of a
//! key Secret it keeps the digests of its values, never the text: a
//! [`KeySecret`] (327 bytes a key, where the Secret was ~1.5 KB). Kept, a
//! one-byte value costs ~200 bytes, so a key Secret's size counts
//! [`KEPT_VALUE_BYTES`] for each of its values besides its bytes: one of
//! thousands of tiny values is too large (about 1,000 real keys fit).
//!
//! ```text
//! compile: referenced (ns, name) ─► metadata store: resourceVersion ─► cache hit? ─► data
//!                                                                      └─ GET (bounded) ─► ≤ cap: kept │ > cap: too large
//! kept: key Secret ─► KeySecret (owner uid, SHA-256 + prefix + length per value) │ other ─► its data
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::apply::bounded;
use crate::compile::keys::{KeySecret, is_key_secret};
use waycast_crds::common::CREDENTIAL_LABEL;

pub use crate::compile::secrets::{KEPT_VALUE_BYTES, MAX_SECRET_BYTES};

/// Reads at once.
const CONCURRENT_READS: usize = 16;

/// `(namespace, name)`.
pub type SecretName = (String, String);

/// How long a Secret's data is kept after the last reconcile that wanted
/// it: every Gateway is compiled again within the resync (5 minutes), so
/// what no served object references leaves the cache within this.
pub const UNWANTED_FOR: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// A Secret as last read, and when a reconcile last wanted it.
#[derive(Debug, Clone)]
struct Entry {
    read: Read,
    wanted_at: std::time::Instant,
}

/// A Secret as last read.
#[derive(Debug, Clone)]
enum Read {
    /// Its data (labels and annotations left out), at `version`.
    Data { version: String, secret: Arc<Secret> },
    /// A key Secret's digests, at `version`.
    Key { version: String, secret: Arc<KeySecret> },
    /// More than [`MAX_SECRET_BYTES`] at `version`: not kept.
    TooLarge { version: String },
}

impl Read {
    fn version(&self) -> &str {
        match self {
            Read::Data { version, .. } | Read::Key { version, .. } | Read::TooLarge { version } => version,
        }
    }
}

/// What a reconcile gets: the Secrets with their data, and those too large.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Referenced Secrets with their data.
    pub secrets: Vec<Arc<Secret>>,
    /// Referenced key Secrets, as kept.
    pub key_secrets: Vec<Arc<KeySecret>>,
    /// Referenced Secrets whose data is over [`MAX_SECRET_BYTES`].
    pub too_large: BTreeSet<SecretName>,
}

/// The cache of referenced Secrets' data, shared by every reconcile.
#[derive(Default)]
pub struct SecretData {
    read: tokio::sync::RwLock<HashMap<SecretName, Entry>>,
}

impl SecretData {
    /// The data of `wanted` (each with the resource version its metadata
    /// shows), read again where the version moved. Entries of Secrets that
    /// are no longer there (as `exists` says), or that no reconcile wanted
    /// for [`UNWANTED_FOR`], go. A Secret that cannot be read counts as
    /// missing: the object naming it is refused, the rest served.
    pub async fn fetch(
        &self,
        client: &kube::Client,
        wanted: Vec<(SecretName, String)>,
        exists: impl Fn(&SecretName) -> bool,
    ) -> Fetched {
        let stale: Vec<(SecretName, String)> = {
            let read = self.read.read().await;
            wanted
                .iter()
                .filter(|(name, version)| read.get(name).is_none_or(|e| e.read.version() != version))
                .cloned()
                .collect()
        };
        let reads: Vec<(SecretName, Option<Read>)> = futures_util::stream::iter(stale)
            .map(|((namespace, name), _)| read_one(client, namespace, name))
            .buffer_unordered(CONCURRENT_READS)
            .collect()
            .await;
        let now = std::time::Instant::now();
        let mut cache = self.read.write().await;
        for (name, read) in reads {
            match read {
                Some(read) => {
                    cache.insert(name, Entry { read, wanted_at: now });
                }
                None => {
                    cache.remove(&name);
                }
            }
        }
        let mut fetched = Fetched::default();
        for (name, _) in &wanted {
            let Some(entry) = cache.get_mut(name) else { continue };
            entry.wanted_at = now;
            match &entry.read {
                Read::Data { secret, .. } => fetched.secrets.push(secret.clone()),
                Read::Key { secret, .. } => fetched.key_secrets.push(secret.clone()),
                Read::TooLarge { .. } => {
                    fetched.too_large.insert(name.clone());
                }
            }
        }
        // What this reconcile wanted exists (its metadata was just found):
        // only the rest is looked up — at 100,000 key Secrets, a look-up of
        // each on every reconcile was a large part of one.
        cache.retain(|name, entry| {
            entry.wanted_at == now || (now.saturating_duration_since(entry.wanted_at) < UNWANTED_FOR && exists(name))
        });
        fetched
    }

    /// Keeps a Secret the operator wrote (a generated key) without reading
    /// it back.
    pub async fn remember(&self, secret: &Secret) {
        let (Some(namespace), Some(name)) = (&secret.metadata.namespace, &secret.metadata.name) else { return };
        if let Some(read) = kept(secret.clone()) {
            let entry = Entry { read, wanted_at: std::time::Instant::now() };
            self.read.write().await.insert((namespace.clone(), name.clone()), entry);
        }
    }
}

/// A Secret read: `None` when it is gone or could not be read (logged).
async fn read_one(client: &kube::Client, namespace: String, name: String) -> (SecretName, Option<Read>) {
    let read = match bounded(Api::<Secret>::namespaced(client.clone(), &namespace).get_opt(&name)).await {
        Ok(secret) => secret.and_then(kept),
        Err(error) => {
            tracing::warn!(%error, secret = %format!("{namespace}/{name}"), "cannot read a referenced Secret");
            None
        }
    };
    ((namespace, name), read)
}

/// The bytes of `secret`'s data, keys and values.
fn data_size(secret: &Secret) -> usize {
    secret.data.iter().flatten().map(|(key, value)| key.len() + value.0.len()).sum::<usize>()
        + secret.string_data.iter().flatten().map(|(key, value)| key.len() + value.len()).sum::<usize>()
}

/// What is kept of `secret`: of a key Secret its digests, of another its
/// data and what compile reads of its metadata; of either only that it is
/// too large.
fn kept(mut secret: Secret) -> Option<Read> {
    let version = secret.metadata.resource_version.clone()?;
    if data_size(&secret) > MAX_SECRET_BYTES {
        return Some(Read::TooLarge { version });
    }
    // NB: a key Secret is never kept as a Secret, so a key is never sent
    // upstream as a credential, whatever its labels.
    if is_key_secret(&secret) {
        let values = secret.data.iter().flatten().filter(|(_, value)| !value.0.is_empty()).count();
        if data_size(&secret).saturating_add(values.saturating_mul(KEPT_VALUE_BYTES)) > MAX_SECRET_BYTES {
            return Some(Read::TooLarge { version });
        }
        return Some(Read::Key { version, secret: Arc::new(KeySecret::of(&secret)?) });
    }
    // What compile reads of the metadata: name, namespace, owners (whose
    // generated key it is) and the credential label. At 10,000 key
    // Secrets each label map alone was half a kilobyte.
    let meta = &mut secret.metadata;
    (meta.annotations, meta.managed_fields, meta.uid, meta.creation_timestamp) = (None, None, None, None);
    (meta.finalizers, meta.generate_name, meta.generation) = (None, None, None);
    meta.labels = meta.labels.take().and_then(|labels| {
        labels.get_key_value(CREDENTIAL_LABEL).map(|(name, value)| [(name.clone(), value.clone())].into())
    });
    Some(Read::Data { version, secret: Arc::new(secret) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;
    use waycast_crds::api_key::KEY_SECRET_LABEL;

    use crate::compile::keys::KeyText;

    fn secret(bytes: usize) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("team".into()),
                resource_version: Some("7".into()),
                annotations: Some(
                    [("kubectl.kubernetes.io/last-applied-configuration".into(), "x".repeat(bytes))].into(),
                ),
                ..Default::default()
            },
            data: Some([("k".to_owned(), ByteString(vec![b'a'; bytes]))].into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_secret_over_the_cap_is_kept_only_as_too_large() {
        assert!(matches!(kept(secret(MAX_SECRET_BYTES + 1)), Some(Read::TooLarge { version }) if version == "7"));
        let Some(Read::Data { secret, .. }) = kept(secret(100)) else { panic!("kept") };
        assert_eq!(secret.metadata.annotations, None, "only what compile reads is kept");
        assert_eq!(secret.data.as_ref().unwrap()["k"].0.len(), 100);
        assert!(kept(Secret::default()).is_none(), "no resource version: not cached");
    }

    fn labelled(labels: &[(&str, &str)], value: &[u8]) -> Secret {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let mut secret = secret(10);
        secret.data = Some([("api-key".to_owned(), ByteString(value.to_vec()))].into());
        let meta = &mut secret.metadata;
        meta.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        meta.uid = Some("uid-1".into());
        meta.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        (meta.finalizers, meta.generation) = (Some(vec!["f".into()]), Some(3));
        meta.owner_references = Some(vec![
            OwnerReference { uid: "other".into(), ..Default::default() },
            OwnerReference { uid: "owner".into(), controller: Some(true), ..Default::default() },
        ]);
        secret
    }

    #[test]
    fn only_the_metadata_compile_reads_is_kept() {
        let kept_data = |secret| {
            let Some(Read::Data { secret, .. }) = kept(secret) else { panic!("kept as data") };
            secret
        };
        let credential = kept_data(labelled(&[(CREDENTIAL_LABEL, "true"), ("team", "a")], b"token"));
        let meta = &credential.metadata;
        assert_eq!(
            meta.labels,
            Some([(CREDENTIAL_LABEL.to_owned(), "true".to_owned())].into()),
            "the opt-in label stays"
        );
        assert_eq!(
            (&meta.uid, &meta.creation_timestamp, &meta.finalizers, meta.generation),
            (&None, &None, &None, None)
        );
        assert_eq!(
            (meta.name.as_deref(), meta.namespace.as_deref(), meta.resource_version.as_deref()),
            (Some("s"), Some("team"), Some("7")),
            "what names it stays"
        );
        assert_eq!(credential.data.as_ref().unwrap()["api-key"].0, b"token");
    }

    #[test]
    fn a_key_secret_is_kept_as_its_digests_never_its_text() {
        let text = b"  wc-0123456789abcdefghijklmnop\n";
        for labels in [&[(KEY_SECRET_LABEL, "true")][..], &[(KEY_SECRET_LABEL, "true"), (CREDENTIAL_LABEL, "true")]] {
            let Some(Read::Key { version, secret }) = kept(labelled(labels, text)) else { panic!("kept as a key") };
            assert_eq!(version, "7");
            assert_eq!((secret.namespace.as_str(), secret.name.as_str()), ("team", "s"));
            assert_eq!(secret.controller.as_deref(), Some("owner"), "whose key it is: the controller owner");
            let expected = KeySecret {
                namespace: "team".into(),
                name: "s".into(),
                controller: Some("owner".into()),
                texts: [(
                    "api-key".to_owned(),
                    KeyText {
                        sha256: waycast_crds::digest::sha256_hex(b"wc-0123456789abcdefghijklmnop"),
                        prefix: "wc-012".into(),
                        chars: 29,
                    },
                )]
                .into(),
            };
            assert_eq!(*secret, expected, "trimmed; nothing but the digests");
        }
        let Some(Read::Key { secret, .. }) = kept(labelled(&[(KEY_SECRET_LABEL, "true")], b"  \n")) else {
            panic!("kept as a key")
        };
        assert!(secret.texts.is_empty(), "an empty value is no key text");
        let mut two = labelled(&[(KEY_SECRET_LABEL, "true")], b"wc-first-key-text-0123456789");
        two.data.get_or_insert_default().insert("other".into(), ByteString(b"wc-second-key-text-9876543210".to_vec()));
        let Some(Read::Key { secret, .. }) = kept(two) else { panic!("kept as a key") };
        let digest = |text: &[u8]| Some(waycast_crds::digest::sha256_hex(text));
        assert_eq!(secret.text("api-key").map(|t| t.sha256.clone()), digest(b"wc-first-key-text-0123456789"));
        assert_eq!(secret.text("other").map(|t| t.sha256.clone()), digest(b"wc-second-key-text-9876543210"));
        assert_eq!(secret.text("nope"), None);
        let mut large = labelled(&[(KEY_SECRET_LABEL, "true")], b"x");
        large.data = Some([("api-key".to_owned(), ByteString(vec![b'a'; MAX_SECRET_BYTES + 1]))].into());
        assert!(matches!(kept(large), Some(Read::TooLarge { .. })), "over the cap: only that fact");
        // Many tiny values, well under the byte cap: each counts what keeping it costs.
        let values = |count: usize| {
            let mut many = labelled(&[(KEY_SECRET_LABEL, "true")], b"x");
            many.data = Some((0..count).map(|i| (format!("k{i:04}"), ByteString(vec![b'a'; 40]))).collect());
            kept(many)
        };
        let fits = MAX_SECRET_BYTES / (5 + 40 + KEPT_VALUE_BYTES);
        assert!(fits >= 800, "a Secret of hundreds of real keys is read: {fits}");
        assert!(matches!(values(fits), Some(Read::Key { secret, .. }) if secret.texts.len() == fits));
        assert!(matches!(values(fits + 1), Some(Read::TooLarge { .. })), "one value too many");
    }
}
