//! Container images without Docker or a registry: a binary (plus the shared
//! libraries `ldd` says it needs) packed into an OCI image layout archive
//! that `ctr images import` accepts.
//!
//! ```text
//! binary ─► layer.tar (binary, its libraries, /etc/passwd, /tmp) ─► config.json ─► manifest.json ─► index.json
//!                                           all in one OCI layout tar (blobs/sha256/<digest>)
//! ```
//!
//! Layers are uncompressed and file times fixed, so the same inputs give the
//! same image digest.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::json;

/// The numeric user images run as (distroless `nonroot`).
pub const NONROOT: u32 = 65532;

/// What goes into an image.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// Full reference, e.g. `docker.io/waycast/gateway:dev`.
    pub name: String,
    /// The program; it lands at `/<file name>` and is the entrypoint.
    pub binary: PathBuf,
    /// Arguments after the entrypoint (the image's `Cmd`).
    pub args: Vec<String>,
    /// User to run as.
    pub user: u32,
}

/// The shared libraries a dynamically linked binary needs (empty when static).
///
/// # Errors
/// `ldd` failing on a dynamic binary.
pub fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let output = Command::new("ldd").arg(binary).output().context("running ldd")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    let mut libraries = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next().filter(|p| p.starts_with('/')),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libraries.push(PathBuf::from(path));
        }
    }
    if libraries.iter().any(|l| !l.exists()) {
        bail!("ldd named libraries that do not exist: {libraries:?}");
    }
    Ok(libraries)
}

fn append_file(builder: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut header, path, data).with_context(|| format!("adding {path}"))?;
    Ok(())
}

fn append_dir(builder: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(0);
    header.set_mode(mode);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Directory);
    builder.append_data(&mut header, path, std::io::empty()).with_context(|| format!("adding {path}"))?;
    Ok(())
}

/// The binary without debug information (debug builds are mostly DWARF),
/// or as it is when `strip` is not installed.
fn stripped(binary: &Path) -> anyhow::Result<Vec<u8>> {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let unique = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temporary = std::env::temp_dir().join(format!("waycast-strip-{}-{unique}", std::process::id()));
    let status = Command::new("strip").arg("--strip-debug").arg("-o").arg(&temporary).arg(binary).status();
    let data = match status {
        Ok(status) if status.success() => std::fs::read(&temporary),
        _ => std::fs::read(binary),
    }
    .with_context(|| format!("reading {}", binary.display()))?;
    let _ = std::fs::remove_file(&temporary);
    Ok(data)
}

/// The root filesystem layer.
fn layer(spec: &ImageSpec) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for dir in ["etc/", "tmp/"] {
        append_dir(&mut builder, dir, if dir == "tmp/" { 0o1777 } else { 0o755 })?;
    }
    let passwd = format!("root:x:0:0:root:/:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/:/sbin/nologin\n");
    append_file(&mut builder, "etc/passwd", passwd.as_bytes(), 0o644)?;
    append_file(&mut builder, "etc/group", format!("root:x:0:\nnonroot:x:{NONROOT}:\n").as_bytes(), 0o644)?;
    let mut dirs_added = std::collections::BTreeSet::new();
    for library in shared_libraries(&spec.binary)? {
        // Keep the path the dynamic loader expects; resolve symlinks for the content.
        let relative = library.strip_prefix("/").unwrap_or(&library).to_string_lossy().into_owned();
        let mut parent = Path::new(&relative).parent();
        let mut parents = Vec::new();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            parents.push(format!("{}/", dir.display()));
            parent = dir.parent();
        }
        for dir in parents.into_iter().rev() {
            if dirs_added.insert(dir.clone()) {
                append_dir(&mut builder, &dir, 0o755)?;
            }
        }
        let data = std::fs::read(&library).with_context(|| format!("reading {}", library.display()))?;
        append_file(&mut builder, &relative, &data, 0o755)?;
    }
    let name = spec.binary.file_name().context("binary has a file name")?.to_string_lossy().into_owned();
    let data = stripped(&spec.binary)?;
    append_file(&mut builder, &name, &data, 0o755)?;
    Ok(builder.into_inner()?)
}

/// Writes the OCI layout archive for `spec` to `out`; returns the manifest digest.
///
/// # Errors
/// Reading the binary or its libraries, or writing the archive.
pub fn pack(spec: &ImageSpec, out: &Path) -> anyhow::Result<String> {
    let layer = layer(spec)?;
    let layer_digest = format!("sha256:{}", waycast_crds::digest::sha256_hex(&layer));
    let entrypoint = format!("/{}", spec.binary.file_name().context("binary name")?.to_string_lossy());
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": format!("{}:{}", spec.user, spec.user),
            "Entrypoint": [entrypoint],
            "Cmd": spec.args,
            "Env": ["PATH=/"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "waycast-pack", "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z",
    })
    .to_string()
    .into_bytes();
    let config_digest = format!("sha256:{}", waycast_crds::digest::sha256_hex(&config));
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}],
    })
    .to_string()
    .into_bytes();
    let manifest_digest = format!("sha256:{}", waycast_crds::digest::sha256_hex(&manifest));
    let tag = spec.name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": {"io.containerd.image.name": spec.name, "org.opencontainers.image.ref.name": tag},
        }],
    })
    .to_string()
    .into_bytes();

    let mut archive = tar::Builder::new(Vec::new());
    append_file(&mut archive, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644)?;
    append_file(&mut archive, "index.json", &index, 0o644)?;
    append_dir(&mut archive, "blobs/", 0o755)?;
    append_dir(&mut archive, "blobs/sha256/", 0o755)?;
    for (digest, blob) in [(&layer_digest, &layer), (&config_digest, &config), (&manifest_digest, &manifest)] {
        let hex = digest.trim_start_matches("sha256:");
        append_file(&mut archive, &format!("blobs/sha256/{hex}"), blob, 0o644)?;
    }
    let bytes = archive.into_inner()?;
    std::fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))?;
    Ok(manifest_digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_a_dynamic_binary_with_its_libraries_reproducibly() {
        let binary = PathBuf::from("/bin/sh");
        let dir = std::env::temp_dir().join(format!("waycast-pack-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = ImageSpec {
            name: "docker.io/waycast/test:dev".into(),
            binary,
            args: vec!["-c".into(), "true".into()],
            user: NONROOT,
        };
        let first = pack(&spec, &dir.join("a.tar")).unwrap();
        let second = pack(&spec, &dir.join("b.tar")).unwrap();
        assert_eq!(first, second, "same inputs, same digest");
        let mut archive = tar::Archive::new(std::fs::File::open(dir.join("a.tar")).unwrap());
        let names: Vec<String> =
            archive.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        assert!(names.contains(&"index.json".to_owned()) && names.contains(&"oci-layout".to_owned()));
        assert_eq!(names.iter().filter(|n| n.starts_with("blobs/sha256/") && n.len() > 20).count(), 3);
        let layer = layer(&spec).unwrap();
        let mut files = tar::Archive::new(&layer[..]);
        let paths: Vec<String> =
            files.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        assert!(paths.contains(&"sh".to_owned()), "{paths:?}");
        assert!(paths.iter().any(|p| p.contains("libc.so")), "the libraries ldd names: {paths:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
