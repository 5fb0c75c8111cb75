//! Pure builders, one per object a Gateway owns. Each takes the Gateway
//! (and what compile produced) and returns the object to server-side apply.
//! No I/O; same inputs, same objects.
//!
//! ```text
//! Gateway ─► meta.rs ─┬─► rbac: service_account, role, role_binding (its config manifest, its current
//!                     │        parts and endpoints ConfigMap by name, its Leases, pods read by name)
//!                     ├─► config_parts                    (manifest Secret + hash annotation; base and key
//!                     │                                    shard Secrets, gzipped, each with its digest)
//!                     ├─► endpoints::config_map           (ready addresses of the Services it routes to)
//!                     ├─► deployment                      (never the config hash: config changes don't roll pods)
//!                     ├─► service, network_policy         (the admin port only from the named peers)
//!                     └─► hpa (with autoscaling), pdb (with more than one replica)
//! ```
//!
//! `meta.rs` holds what every owned object carries (labels, owner, names,
//! ports); `desired.rs` renders them all in one call.

pub mod config_parts;
pub mod deployment;
pub mod desired;
pub mod endpoints;
pub mod key_patch;
pub mod meta;
pub mod network_policy;
pub mod rbac;
pub mod scaling;
pub mod service;
pub mod settings;

pub use desired::{Desired, desired, desired_checked};
pub use meta::{CONFIG_HASH_ANNOTATION, FIELD_MANAGER, GATEWAY_LABEL, config_secret_name, selector_labels};
pub use settings::RenderSettings;

#[cfg(test)]
pub(crate) mod fixtures {
    use waycast_crds::{Gateway, GatewaySpec};

    /// The Gateway `platform/shared` as the API server returns it (with a
    /// uid; `waycast_mock::fixtures::objects`), with `spec`.
    pub fn gateway(spec: GatewaySpec) -> Gateway {
        let mut gateway = waycast_mock::fixtures::objects::gateway("platform", "shared");
        gateway.spec = spec;
        gateway
    }
}
