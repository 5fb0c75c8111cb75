//! The committed CRD YAML must be what `make crds` renders now.

use std::path::Path;

#[test]
fn committed_crd_yaml_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("yaml");
    let documents = waycast_crds::crd_yaml_documents().expect("render CRDs");
    let mut stale = Vec::new();
    for (file_name, rendered) in &documents {
        let committed = std::fs::read_to_string(dir.join(file_name)).unwrap_or_default();
        if &committed != rendered {
            stale.push(file_name.clone());
        }
    }
    assert!(stale.is_empty(), "stale CRD YAML {stale:?}: run `make crds` and commit the result");
    let on_disk = std::fs::read_dir(&dir).expect("crds/yaml exists").count();
    assert_eq!(on_disk, documents.len(), "crds/yaml holds files `make crds` no longer renders");
}

#[test]
fn committed_api_reference_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let rendered = waycast_crds::docs::api_reference(&waycast_crds::crds());
    assert!(committed == rendered, "docs/api.md is stale: run `make crds` and commit the result");
}

#[test]
fn chart_crds_are_the_generated_ones() {
    // The Helm chart installs CRDs from its own crds/ folder; they must be
    // byte-for-byte the generated ones, so there is one source of truth.
    let chart_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/waycast/crds");
    let documents = waycast_crds::crd_yaml_documents().expect("render CRDs");
    let mut differing = Vec::new();
    for (file_name, rendered) in &documents {
        let in_chart = std::fs::read_to_string(chart_dir.join(file_name)).unwrap_or_default();
        if &in_chart != rendered {
            differing.push(file_name.clone());
        }
    }
    assert!(
        differing.is_empty(),
        "charts/waycast/crds differs in {differing:?}: run `make crds` and commit the result"
    );
    let in_chart = std::fs::read_dir(&chart_dir).expect("charts/waycast/crds exists").count();
    assert_eq!(in_chart, documents.len(), "charts/waycast/crds holds files `make crds` does not render");
}
