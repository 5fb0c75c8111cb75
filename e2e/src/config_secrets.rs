//! Reading back the config the operator wrote, as a pod does: the manifest
//! in the config Secret, then the base and each key shard it names, each
//! gunzipped, assembled by `waycast_crds::shards::assemble` (which refuses
//! a set that is not the one the manifest names).
//!
//! ```text
//! Secret C (manifest.json) ─► C-base, C-keys-N-0 … C-keys-N-(N-1) (part.json.gz) ─► assemble ─► GatewayConfig
//! ```

use std::io::Read as _;

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use waycast_crds::GatewayConfig;
use waycast_crds::shards::{self, Manifest, SECRET_KEY_MANIFEST, SECRET_KEY_PART};

/// A config as written in a cluster.
#[derive(Debug, Clone)]
pub struct WrittenConfig {
    /// The config its parts assemble to.
    pub config: GatewayConfig,
    /// The manifest naming them.
    pub manifest: Manifest,
    /// The manifest's hash, the config's identity (what pods report).
    pub hash: String,
    /// The data bytes of every Secret read (the manifest, the parts
    /// gzipped): what a Secret-by-Secret copy of the config costs.
    pub secret_bytes: usize,
}

/// The config the operator wrote for config Secret `name` in `namespace`.
///
/// The parts are read after the manifest; the operator writes them before
/// it, so a read racing a write sees either set whole, or a newer part
/// than the manifest names (then `assemble` refuses it, and the caller may
/// read again).
///
/// # Errors
/// A Secret missing or unreadable, or parts that do not assemble.
pub async fn read_config(client: &Client, namespace: &str, name: &str) -> anyhow::Result<WrittenConfig> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let manifest_secret = secrets.get(name).await.with_context(|| format!("config Secret {namespace}/{name}"))?;
    let manifest_bytes = data(&manifest_secret, SECRET_KEY_MANIFEST)?;
    let manifest = Manifest::parse(manifest_bytes).map_err(|e| anyhow!("{namespace}/{name}: {e}"))?;
    let hash = manifest.hash()?;
    let (base, base_bytes) = read_part(&secrets, namespace, &shards::base_secret_name(name)).await?;
    let mut secret_bytes = manifest_bytes.len() + base_bytes;
    let of = u32::try_from(manifest.shards.len())?;
    let mut parts = Vec::with_capacity(manifest.shards.len());
    for index in 0..of {
        let (json, bytes) = read_part(&secrets, namespace, &shards::shard_secret_name(name, index, of)).await?;
        secret_bytes += bytes;
        parts.push(json);
    }
    let held: Vec<Option<&[u8]>> = parts.iter().map(|part| Some(part.as_slice())).collect();
    let config = shards::assemble(&manifest, &base, &held).map_err(|e| anyhow!("{namespace}/{name}: {e}"))?;
    Ok(WrittenConfig { config, manifest, hash, secret_bytes })
}

/// A part's JSON, and its Secret's gzipped bytes.
async fn read_part(secrets: &Api<Secret>, namespace: &str, part: &str) -> anyhow::Result<(Vec<u8>, usize)> {
    let secret = secrets.get(part).await.with_context(|| format!("config part {namespace}/{part}"))?;
    let compressed = data(&secret, SECRET_KEY_PART)?;
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(compressed).read_to_end(&mut json).with_context(|| format!("gunzip {part}"))?;
    Ok((json, compressed.len()))
}

fn data<'a>(secret: &'a Secret, key: &str) -> anyhow::Result<&'a [u8]> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|value| value.0.as_slice())
        .ok_or_else(|| anyhow!("{name} has no {key}"))
}
