//! The config Secret: the compiled config as gzipped canonical JSON, with
//! its SHA-256 in an annotation (what gateway pods report back).

use std::io::Write as _;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use waycast_crds::config::SECRET_KEY_GZIP;
use waycast_crds::{Gateway, GatewayConfig};

use super::meta::{CONFIG_HASH_ANNOTATION, config_secret_name, owned_meta};

/// The largest gzipped config written to a Secret. The API server refuses
/// Secrets whose data exceeds 1 MiB; the rest is headroom for metadata.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024 - 16 * 1024;

/// The Secret, the config hash (SHA-256 of the uncompressed JSON, as the
/// gateway computes it) and the uncompressed size.
///
/// # Errors
/// Only if serialization or compression into memory fails.
pub fn config_secret(gateway: &Gateway, config: &GatewayConfig) -> std::io::Result<(Secret, String, usize)> {
    let json = config.to_canonical_json().map_err(std::io::Error::other)?;
    let hash = waycast_crds::digest::config_hash(&json);
    // NB: flate2 writes a zero mtime in the gzip header, so equal configs
    // give equal bytes and an unchanged config is a no-op apply.
    let mut encoder = flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 4), flate2::Compression::default());
    encoder.write_all(&json)?;
    let compressed = encoder.finish()?;
    let mut metadata = owned_meta(gateway, config_secret_name(gateway));
    metadata.annotations = Some([(CONFIG_HASH_ANNOTATION.to_owned(), hash.clone())].into());
    let secret = Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some([(SECRET_KEY_GZIP.to_owned(), ByteString(compressed))].into()),
        ..Secret::default()
    };
    Ok((secret, hash, json.len()))
}

/// Whether `config` fits in its Secret gzipped and, uncompressed, within
/// what a gateway reads.
pub fn fits(gateway: &Gateway, config: &GatewayConfig) -> bool {
    config_secret(gateway, config).is_ok_and(|(secret, _, json_bytes)| {
        let gzipped = secret.data.as_ref().and_then(|d| d.values().next()).map_or(0, |b| b.0.len());
        gzipped <= MAX_CONFIG_BYTES && json_bytes as u64 <= waycast_crds::config::MAX_CONFIG_JSON_BYTES
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;
    use crate::render::fixtures;

    #[test]
    fn gzipped_json_with_its_hash_and_an_owner() {
        let gateway = fixtures::gateway(Default::default());
        let config = GatewayConfig::empty();
        let (secret, hash, _) = config_secret(&gateway, &config).unwrap();
        let (again, _, _) = config_secret(&gateway, &config).unwrap();
        assert_eq!(secret, again, "byte-identical for equal configs");
        assert_eq!(secret.metadata.name.as_deref(), Some("shared-config"));
        assert_eq!(secret.metadata.annotations.as_ref().unwrap()[CONFIG_HASH_ANNOTATION], hash);
        assert_eq!(secret.metadata.owner_references.as_ref().unwrap()[0].kind, "Gateway");
        let compressed = &secret.data.as_ref().unwrap()[SECRET_KEY_GZIP].0;
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(&compressed[..]).read_to_end(&mut json).unwrap();
        assert_eq!(GatewayConfig::from_slice(&json).unwrap(), config);
        assert_eq!(waycast_crds::digest::config_hash(&json), hash);
    }
}
