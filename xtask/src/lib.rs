//! The project's developer tooling, shared by the `xtask` binary and the
//! e2e harness: the OCI image packer (`image`), the metrics reference
//! (`docs`) and the many-object fleet the operator's scale benchmarks use
//! (`scale`), the check of each crate's shape (`structure`) and of the
//! docs as reference (`docs_check`). Nothing
//! here ships.

pub mod docs;
pub mod docs_check;
pub mod image;
pub mod memory;
pub mod observability;
pub mod scale;
pub mod structure;
