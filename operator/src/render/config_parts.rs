//! The compiled config as Secrets, in the layout of `waycast_crds::shards`:
//! the manifest in the config Secret `C` (plain JSON, with the config hash
//! the pods report and the layout the next reconcile keeps), the base in
//! `C-base` and each key shard in `C-keys-N-I`, gzipped, each with its
//! digest in an annotation (what the writer compares to skip an unchanged
//! part). One key's change so rewrites one shard and the manifest, not the
//! whole config.
//!
//! ```text
//! GatewayConfig + Layouts {last written, a fresh salt}
//!   ─► count: shard_count(keys, last) ─► salt: the last one while the count is kept, else the fresh one
//!   ─► shards::split ──(a shard too large: more shards, the fresh salt, up to MAX_SHARDS)
//!   ─► sizes checked (base gzipped, JSON in all) ─► manifest, base and shard Secrets
//! ```
//!
//! NB: the fresh salt is drawn by the reconcile shell and passed in: render
//! stays free of randomness, so the same inputs give the same Secrets.

use std::collections::BTreeMap;
use std::io::Write as _;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use waycast_crds::config::MAX_CONFIG_JSON_BYTES;
use waycast_crds::shards::{
    self, MAX_SHARD_BYTES, MAX_SHARDS, PART_DIGEST_ANNOTATION, Parts, SALT_LEN, SECRET_KEY_MANIFEST, SECRET_KEY_PART,
    SplitError,
};
use waycast_crds::{Gateway, GatewayConfig};

use super::meta::{CONFIG_HASH_ANNOTATION, config_secret_name, owned_meta};

/// The shard count of the config a manifest Secret names: kept from the
/// store (which holds Secrets as metadata only) by the next reconcile.
pub const SHARDS_ANNOTATION: &str = "waycast.dev/config-shards";
/// The salt of the config a manifest Secret names, for the same reason.
/// Its readers are those who may read the manifest, which holds it too.
pub const SALT_ANNOTATION: &str = "waycast.dev/config-salt";
/// The largest gzipped base (models and settings) written to a Secret.
/// The API server refuses Secrets whose data exceeds 1 MiB; the rest is
/// headroom for metadata.
pub const MAX_BASE_BYTES: usize = 1024 * 1024 - 16 * 1024;

/// How a config's keys are spread over shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// How many shards.
    pub shards: u32,
    /// The salt placing keys in them.
    pub salt: String,
}

impl Layout {
    /// The layout a manifest Secret's annotations name; `None` when they
    /// are missing or name none a manifest may hold (then a fresh one is
    /// chosen: every shard is written again, nothing breaks).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<Self> {
        let shards: u32 = annotations.get(SHARDS_ANNOTATION)?.parse().ok()?;
        let salt = annotations.get(SALT_ANNOTATION)?;
        (shards.is_power_of_two() && shards <= MAX_SHARDS && salt_ok(salt)).then(|| Self { shards, salt: salt.clone() })
    }
}

/// What a layout is chosen from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layouts {
    /// The layout of the config last written, if any: kept while its count
    /// is (a new salt moves every key, so rewrites every shard).
    pub current: Option<Layout>,
    /// A salt drawn at random by the shell ([`fresh_salt`]), used when the
    /// count changes or none was written.
    pub fresh_salt: String,
}

/// A fresh salt: [`SALT_LEN`] lowercase hex digits of 8 random bytes.
///
/// # Errors
/// The OS random number generator failed.
pub fn fresh_salt(random: &dyn ring::rand::SecureRandom) -> Result<String, ring::error::Unspecified> {
    let mut bytes = [0_u8; SALT_LEN / 2];
    random.fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn salt_ok(salt: &str) -> bool {
    salt.len() == SALT_LEN && salt.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why a config is not written: the pods keep the last one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooLarge {
    /// Its models and settings alone outgrow their Secret.
    #[error("its models and settings are {gzipped} bytes gzipped, and their Secret holds at most {MAX_BASE_BYTES}")]
    Base {
        /// The base's gzipped size.
        gzipped: usize,
    },
    /// A key shard outgrows its Secret even at the most shards: its keys
    /// are too large.
    #[error(
        "a key shard would be {bytes} bytes even split {MAX_SHARDS} ways, and a shard holds at most {MAX_SHARD_BYTES}"
    )]
    Shard {
        /// The JSON size of the shard that did not fit.
        bytes: usize,
    },
    /// It is larger, uncompressed, than a gateway reads (a config of
    /// repeated text can compress a hundredfold).
    #[error("it is {bytes} bytes uncompressed, and a gateway reads at most {MAX_CONFIG_JSON_BYTES}")]
    Json {
        /// Its parts' JSON, in all.
        bytes: u64,
    },
}

/// A config's Secrets, ready to apply.
#[derive(Debug, Clone)]
pub struct ConfigParts {
    /// The manifest, in the config Secret `C`.
    pub manifest: Secret,
    /// The base, in `C-base`.
    pub base: Secret,
    /// Each shard's Secret's metadata (its name `C-keys-N-I`, its digest),
    /// by index. Its data is gzipped only when it is written
    /// ([`shard_secret`](Self::shard_secret)): a key change writes one
    /// shard of a hundred, and gzipping every one was most of a render.
    pub shards: Vec<ObjectMeta>,
    /// Each shard's JSON, by index.
    shard_json: Vec<Vec<u8>>,
    /// The manifest's hash: the config's identity, what pods report.
    pub hash: String,
    /// The layout split by.
    pub layout: Layout,
    /// The parts' JSON in all, uncompressed.
    pub json_bytes: usize,
}

impl ConfigParts {
    /// Every Secret's metadata in the order they are written: the base and
    /// the shards first, the manifest last, so a pod that sees a manifest
    /// can fetch every part it names.
    pub fn in_write_order(&self) -> impl Iterator<Item = &ObjectMeta> {
        std::iter::once(&self.base.metadata).chain(&self.shards).chain(std::iter::once(&self.manifest.metadata))
    }

    /// Shard `index`'s Secret, its JSON gzipped now.
    ///
    /// # Errors
    /// Only if compression into memory fails (it does not).
    pub fn shard_secret(&self, index: usize) -> std::io::Result<Option<Secret>> {
        let (Some(metadata), Some(json)) = (self.shards.get(index), self.shard_json.get(index)) else {
            return Ok(None);
        };
        Ok(Some(Secret {
            metadata: metadata.clone(),
            type_: Some("Opaque".into()),
            data: Some([(SECRET_KEY_PART.to_owned(), ByteString(gzip(json)?))].into()),
            ..Secret::default()
        }))
    }

    /// The Secret of the part or manifest named `name`, if it is one.
    ///
    /// # Errors
    /// Only if compression into memory fails (it does not).
    pub fn secret(&self, name: &str) -> std::io::Result<Option<Secret>> {
        let named = |meta: &ObjectMeta| meta.name.as_deref() == Some(name);
        if named(&self.manifest.metadata) {
            return Ok(Some(self.manifest.clone()));
        }
        if named(&self.base.metadata) {
            return Ok(Some(self.base.clone()));
        }
        match self.shards.iter().position(named) {
            Some(index) => self.shard_secret(index),
            None => Ok(None),
        }
    }
}

impl ConfigParts {
    /// Shard `index`'s JSON.
    pub fn shard_json(&self, index: usize) -> Option<&[u8]> {
        self.shard_json.get(index).map(Vec::as_slice)
    }

    /// These parts with the shards `replaced` (by index) in place of
    /// theirs: each one's digest, the manifest naming them and the config's
    /// hash follow. A shard index out of range is left out.
    ///
    /// # Errors
    /// The manifest held does not read (it was written here), or does not
    /// serialize (it does).
    pub fn replace_shards(&mut self, replaced: Vec<(usize, Vec<u8>)>) -> std::io::Result<()> {
        let data = self.manifest.data.as_ref().and_then(|data| data.get(SECRET_KEY_MANIFEST));
        let mut manifest =
            shards::Manifest::parse(data.map_or(&[][..], |bytes| &bytes.0)).map_err(std::io::Error::other)?;
        for (index, json) in replaced {
            let (Some(meta), Some(named), Some(held)) =
                (self.shards.get_mut(index), manifest.shards.get_mut(index), self.shard_json.get_mut(index))
            else {
                continue;
            };
            let digest = waycast_crds::digest::sha256_hex(&json);
            meta.annotations = Some([(PART_DIGEST_ANNOTATION.to_owned(), digest.clone())].into());
            *named = digest;
            self.json_bytes = self.json_bytes - held.len() + json.len();
            *held = json;
        }
        let manifest_json = manifest.to_canonical_json().map_err(std::io::Error::other)?;
        self.hash = waycast_crds::digest::sha256_hex(&manifest_json);
        let annotations = self.manifest.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(CONFIG_HASH_ANNOTATION.to_owned(), self.hash.clone());
        self.manifest.data = Some([(SECRET_KEY_MANIFEST.to_owned(), ByteString(manifest_json))].into());
        Ok(())
    }

    /// A key shard Secret no manifest names any more, emptied: its data and
    /// digest gone, the Secret kept (the Gateway's, collected with it).
    ///
    /// NB: emptied rather than deleted: the operator may not delete
    /// Secrets (its ClusterRole grants no `delete` on them, and the chart's
    /// test holds it to that), and applying this with the field manager
    /// that wrote the data removes the data.
    pub fn retired(&self, name: &str) -> Secret {
        let mut metadata = self.manifest.metadata.clone();
        metadata.name = Some(name.to_owned());
        metadata.annotations = None;
        Secret { metadata, type_: Some("Opaque".into()), ..Secret::default() }
    }
}

impl ConfigParts {
    /// The data bytes of every Secret, each shard gzipped for it: what
    /// writing the whole config costs (benchmarks and goldens; a reconcile
    /// writes only what changed).
    ///
    /// # Errors
    /// Only if compression into memory fails (it does not).
    pub fn data_bytes_in_all(&self) -> std::io::Result<usize> {
        let mut bytes = data_bytes(&self.manifest) + data_bytes(&self.base);
        for index in 0..self.shards.len() {
            bytes += self.shard_secret(index)?.as_ref().map_or(0, data_bytes);
        }
        Ok(bytes)
    }
}

/// `config` as Secrets of `gateway`, in a layout chosen from `layouts`.
///
/// # Errors
/// The outer error only if serialization or compression into memory fails
/// (they do not); the inner one when the config does not fit its Secrets.
pub fn config_parts(
    gateway: &Gateway,
    config: &GatewayConfig,
    layouts: &Layouts,
) -> std::io::Result<Result<ConfigParts, TooLarge>> {
    parts_of(gateway, check(config, layouts)?)
}

/// A config split and checked against its Secrets' bounds: made once per
/// reconcile for both questions, whether it fits ([`Checked::fits`]) and
/// what its Secrets are ([`parts_of`]); at 10,000 keys a second split was
/// some megabytes of a reconcile's peak.
pub struct Checked(Result<Split, TooLarge>);

impl Checked {
    /// Whether the config fits its Secrets.
    pub fn fits(&self) -> bool {
        self.0.is_ok()
    }
}

/// `config` split in a layout chosen from `layouts`, and checked.
///
/// # Errors
/// Only if serialization or compression into memory fails (they do not).
pub fn check(config: &GatewayConfig, layouts: &Layouts) -> std::io::Result<Checked> {
    checked_split(config, layouts).map(Checked)
}

/// The Secrets of `gateway` for a config [`check`]ed.
///
/// # Errors
/// The outer error only if serialization fails (it does not); the inner
/// one when the config does not fit its Secrets.
pub fn parts_of(gateway: &Gateway, checked: Checked) -> std::io::Result<Result<ConfigParts, TooLarge>> {
    let Split { parts, layout, base_gzipped: base } = match checked.0 {
        Ok(split) => split,
        Err(too_large) => return Ok(Err(too_large)),
    };
    let name = config_secret_name(gateway);
    let json_bytes = parts.base.len() + parts.shards.iter().map(Vec::len).sum::<usize>();
    let base = part_secret(gateway, shards::base_secret_name(&name), base, &parts.manifest.base);
    let of = layout.shards;
    let shard_meta = (0..of)
        .zip(&parts.manifest.shards)
        .map(|(index, digest)| part_meta(gateway, shards::shard_secret_name(&name, index, of), digest))
        .collect();
    let manifest_json = parts.manifest.to_canonical_json().map_err(std::io::Error::other)?;
    let hash = waycast_crds::digest::sha256_hex(&manifest_json);
    let mut metadata = owned_meta(gateway, name);
    metadata.annotations = Some(BTreeMap::from([
        (CONFIG_HASH_ANNOTATION.to_owned(), hash.clone()),
        (SHARDS_ANNOTATION.to_owned(), of.to_string()),
        (SALT_ANNOTATION.to_owned(), layout.salt.clone()),
    ]));
    let manifest = Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some([(SECRET_KEY_MANIFEST.to_owned(), ByteString(manifest_json))].into()),
        ..Secret::default()
    };
    let shard_json = parts.shards;
    Ok(Ok(ConfigParts { manifest, base, shards: shard_meta, shard_json, hash, layout, json_bytes }))
}

/// Whether `config` fits its Secrets (what `compile::fit` leaves entries
/// out for): it splits at some allowed count, its base fits a Secret
/// gzipped, and its JSON in all is within what a gateway reads. One split
/// when it fits in the layout `layouts` names, and the base gzipped.
pub fn fits(config: &GatewayConfig, layouts: &Layouts) -> bool {
    checked_split(config, layouts).is_ok_and(|split| split.is_ok())
}

/// A config split, in the layout it was split by, with its base gzipped.
pub struct Split {
    parts: Parts,
    layout: Layout,
    base_gzipped: Vec<u8>,
}

/// The split and the gzipped base, when the config fits.
fn checked_split(config: &GatewayConfig, layouts: &Layouts) -> std::io::Result<Result<Split, TooLarge>> {
    let (parts, layout) = match split(config, layouts)? {
        Ok(split) => split,
        Err(too_large) => return Ok(Err(too_large)),
    };
    let json = parts.base.len() as u64 + parts.shards.iter().map(|s| s.len() as u64).sum::<u64>();
    if json > MAX_CONFIG_JSON_BYTES {
        return Ok(Err(TooLarge::Json { bytes: json }));
    }
    let base_gzipped = gzip(&parts.base)?;
    if base_gzipped.len() > MAX_BASE_BYTES {
        return Ok(Err(TooLarge::Base { gzipped: base_gzipped.len() }));
    }
    Ok(Ok(Split { parts, layout, base_gzipped }))
}

/// The split in the count `shard_count` picks, or, while a shard is too
/// large, in more shards (with the fresh salt: a count not kept), up to
/// [`MAX_SHARDS`].
fn split(config: &GatewayConfig, layouts: &Layouts) -> std::io::Result<Result<(Parts, Layout), TooLarge>> {
    let current = layouts.current.as_ref();
    let mut count = shards::shard_count(config.keys.len(), current.map(|layout| layout.shards));
    loop {
        // NB: the current salt whenever the current count is reached, also
        // after a too-large shard moved the count up: a layout grown that
        // way is kept, not given a fresh salt (and every shard rewritten)
        // at every reconcile.
        let salt = match current {
            Some(layout) if layout.shards == count => &layout.salt,
            _ => &layouts.fresh_salt,
        };
        match shards::split(config, salt, count) {
            Ok(parts) => return Ok(Ok((parts, Layout { shards: count, salt: salt.clone() }))),
            Err(SplitError::ShardTooLarge { bytes, .. }) if count >= MAX_SHARDS => {
                return Ok(Err(TooLarge::Shard { bytes }));
            }
            // As many times more shards as the shard is over, at least
            // twice: a large excess is not tried one doubling at a time.
            Err(SplitError::ShardTooLarge { bytes, .. }) => {
                let times = u32::try_from(bytes.div_ceil(MAX_SHARD_BYTES)).unwrap_or(MAX_SHARDS);
                count = count.saturating_mul(times.max(2).next_power_of_two()).min(MAX_SHARDS);
            }
            Err(other) => return Err(std::io::Error::other(other)),
        }
    }
}

/// A part's Secret's metadata: the Gateway's, its digest annotated.
fn part_meta(gateway: &Gateway, name: String, digest: &str) -> ObjectMeta {
    let mut metadata = owned_meta(gateway, name);
    metadata.annotations = Some([(PART_DIGEST_ANNOTATION.to_owned(), digest.to_owned())].into());
    metadata
}

/// A part's Secret: its gzipped JSON, its digest annotated.
fn part_secret(gateway: &Gateway, name: String, gzipped: Vec<u8>, digest: &str) -> Secret {
    Secret {
        metadata: part_meta(gateway, name, digest),
        type_: Some("Opaque".into()),
        data: Some([(SECRET_KEY_PART.to_owned(), ByteString(gzipped))].into()),
        ..Secret::default()
    }
}

/// NB: flate2 writes a zero mtime in the gzip header, so equal parts give
/// equal bytes and an unchanged part is a no-op apply.
fn gzip(json: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 4), flate2::Compression::default());
    encoder.write_all(json)?;
    encoder.finish()
}

/// The bytes of a Secret's data.
pub fn data_bytes(secret: &Secret) -> usize {
    secret.data.iter().flatten().map(|(_, value)| value.0.len()).sum()
}

#[cfg(test)]
#[path = "config_parts_tests.rs"]
mod tests;
