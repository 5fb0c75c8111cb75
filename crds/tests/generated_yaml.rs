//! The committed CRD YAML must be what `crdgen` renders now.

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
    assert!(
        stale.is_empty(),
        "stale CRD YAML {stale:?}: run `cargo run -p waycast-crds --bin crdgen crds/yaml` and commit the result"
    );
    let on_disk = std::fs::read_dir(&dir).expect("crds/yaml exists").count();
    assert_eq!(
        on_disk,
        documents.len(),
        "crds/yaml holds files crdgen no longer renders"
    );
}
