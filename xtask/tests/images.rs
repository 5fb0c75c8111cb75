//! The Dockerfile and the project's own packer (what the e2e runs) build the
//! same images: the binary at `/<name>` as the entrypoint, non-root user.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use waycast_xtask::image::NONROOT;

fn repository_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The instructions of the Dockerfile stage named `target`.
fn stage(dockerfile: &str, target: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut inside = false;
    for line in dockerfile.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if line.starts_with("FROM ") {
            inside = line.ends_with(&format!(" AS {target}"));
            continue;
        }
        if inside {
            lines.push(line.to_owned());
        }
    }
    lines
}

#[test]
fn dockerfile_targets_match_the_packed_images() {
    let dockerfile = std::fs::read_to_string(repository_root().join("Dockerfile")).unwrap();
    for binary in ["waycast-gateway", "waycast-operator", "waycast-bench"] {
        let target = binary.trim_start_matches("waycast-");
        let instructions = stage(&dockerfile, target);
        assert!(!instructions.is_empty(), "no `AS {target}` stage in the Dockerfile");
        let expected = [
            format!("COPY --from=build /out/{binary} /{binary}"),
            format!("USER {NONROOT}:{NONROOT}"),
            format!("ENTRYPOINT [\"/{binary}\"]"),
        ];
        for line in expected {
            assert!(instructions.contains(&line), "the {target} stage lacks `{line}`: {instructions:?}");
        }
        let base = dockerfile.lines().find(|l| l.ends_with(&format!(" AS {target}"))).unwrap();
        assert!(base.contains("distroless") && base.contains(":nonroot"), "{base}");
    }
}

#[test]
fn the_packer_builds_a_runnable_image_with_the_dockerfiles_layout() {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_xtask"));
    let out = std::env::temp_dir().join(format!("waycast-image-test-{}.tar", std::process::id()));
    let output = std::process::Command::new(binary)
        .args(["image", binary.to_str().unwrap(), "docker.io/waycast/image-test:dev", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("image ") && printed.contains("MiB"), "{printed}");
    let mut archive = tar::Archive::new(std::fs::File::open(&out).unwrap());
    let mut config = None;
    let mut has_binary = false;
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && value.get("rootfs").is_some()
        {
            config = Some(value);
        } else if bytes.len() > 1024 {
            // The layer: a tar holding /xtask, executable.
            let mut layer = tar::Archive::new(bytes.as_slice());
            has_binary |= layer.entries().unwrap().any(|e| {
                let e = e.unwrap();
                e.path().unwrap().to_string_lossy().trim_start_matches("./") == "xtask"
                    && e.header().mode().unwrap() & 0o111 != 0
            });
        }
    }
    std::fs::remove_file(&out).unwrap();
    let config = config.expect("an image config blob");
    assert_eq!(config["config"]["User"], format!("{NONROOT}:{NONROOT}"));
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/xtask"]));
    assert!(has_binary, "the layer does not hold an executable /xtask");
}
