//! The gzip a config (or a part of one) comes in, and the bound on what it
//! may unpack to.

use std::io::{Read as _, Write as _};

/// Largest config accepted after decompression: a bound against gzip bombs,
/// the same the operator writes within.
pub const MAX_CONFIG_BYTES: u64 = waycast_crds::config::MAX_CONFIG_JSON_BYTES;

/// Decompresses gzip, refusing output over `limit` bytes.
///
/// # Errors
/// Why: not gzip, or larger than `limit` unpacked.
pub fn gunzip_within(compressed: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(compressed).take(limit + 1).read_to_end(&mut out).map_err(|e| e.to_string())?;
    if out.len() as u64 > limit {
        return Err(format!("larger than {limit} bytes unpacked"));
    }
    Ok(out)
}

/// Compresses `bytes` as the operator writes a part (tools and tests).
///
/// # Errors
/// Compression failing.
pub fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes)?;
    encoder.finish()
}
