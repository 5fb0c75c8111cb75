//! `waycast-image`: packs a binary into an OCI image archive without Docker
//! (the same layout as the Dockerfile's images), for `ctr images import` or
//! any tool that reads OCI layouts.
//!
//! ```text
//! waycast-image BINARY IMAGE_NAME OUT.tar
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use waycast_e2e::image::{ImageSpec, NONROOT, pack, shared_libraries};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [binary, name, out] = args.as_slice() else {
        eprintln!("usage: waycast-image BINARY IMAGE_NAME OUT.tar");
        return ExitCode::from(64);
    };
    let spec = ImageSpec { name: name.clone(), binary: PathBuf::from(binary), args: vec![], user: NONROOT };
    let result = pack(&spec, out.as_ref()).and_then(|digest| {
        let size = |path: &std::path::Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or_default();
        let libraries: u64 = shared_libraries(&spec.binary)?.iter().map(|l| size(l)).sum();
        println!(
            "{name}: {out} {digest}\n  image {:.1} MiB = binary {:.1} MiB + shared libraries {:.1} MiB + metadata",
            mib(size(out.as_ref())),
            mib(size(&spec.binary)),
            mib(libraries)
        );
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("waycast-image: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[allow(clippy::cast_precision_loss, reason = "sizes for display")]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
