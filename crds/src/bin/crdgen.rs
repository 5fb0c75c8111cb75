//! Writes the CRD YAML of every waycast kind.
//!
//! `cargo run -p waycast-crds --bin crdgen` prints all of them as one
//! multi-document stream; `crdgen DIR [API_DOC]` writes one file per kind
//! into DIR (the committed `crds/yaml/`) and the API reference to API_DOC
//! (`docs/api.md`). A test fails when those files are stale.

use std::process::ExitCode;

fn main() -> ExitCode {
    let documents = match waycast_crds::crd_yaml_documents() {
        Ok(documents) => documents,
        Err(error) => {
            eprintln!("crdgen: cannot render CRDs: {error}");
            return ExitCode::FAILURE;
        }
    };
    match std::env::args_os().nth(1) {
        None => {
            for (_, yaml) in &documents {
                print!("---\n{yaml}");
            }
        }
        Some(dir) => {
            let dir = std::path::PathBuf::from(dir);
            for (file_name, yaml) in &documents {
                let path = dir.join(file_name);
                if let Err(error) = std::fs::write(&path, yaml) {
                    eprintln!("crdgen: cannot write {}: {error}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            if let Some(doc) = std::env::args_os().nth(2) {
                let reference = waycast_crds::docs::api_reference(&waycast_crds::crds());
                if let Err(error) = std::fs::write(&doc, reference) {
                    eprintln!("crdgen: cannot write {}: {error}", doc.to_string_lossy());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    ExitCode::SUCCESS
}
