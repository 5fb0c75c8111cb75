//! waycast's end-to-end harness: a real control plane on this machine, the
//! helpers tests use on it (the image packer and the scale fleet are in
//! `waycast-xtask`).
//!
//! ```text
//! tests ──► harness::shared_cluster() ──► waycast-cluster (supervisor process)
//!                                            └─► control_plane: etcd, apiserver, controller-manager
//! ```
//!
//! Each test binary gets one cluster, started by a supervisor process that
//! tears it down when the test binary exits however it exits (its stdin
//! closes). Tests get a fresh namespace each.

pub mod argocd;
pub mod chat;
pub mod cluster;
pub mod config_secrets;
pub mod control_plane;
pub mod harness;
pub mod keycloak;
pub mod load;
pub mod manifest;
pub mod memory;
pub mod node;
pub mod process;
pub mod redis;
pub mod wait;
pub mod workloads;
