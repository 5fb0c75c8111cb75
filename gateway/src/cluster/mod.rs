//! What a gateway pod does as a member of its Gateway's fleet in a
//! cluster: it renews a heartbeat Lease that tells the operator which
//! config it serves (`heartbeat.rs`), and counts its live siblings, by
//! which each pod takes its share of the rate limits (`fleet.rs`).

pub mod fleet;
pub mod heartbeat;

use waycast_crds::gateway_pod::env;

/// Who this pod is.
#[derive(Debug, Clone)]
pub struct PodIdentity {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name (also the Lease's).
    pub pod: String,
    /// Pod uid (the Lease's owner).
    pub uid: String,
    /// The Gateway the pod belongs to.
    pub gateway: String,
}

impl PodIdentity {
    /// From `POD_NAMESPACE`, `POD_NAME`, `POD_UID` and `WAYCAST_GATEWAY`, when
    /// all are set (the operator's Deployment sets them).
    pub fn from_env() -> Option<Self> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Some(Self {
            namespace: get(env::POD_NAMESPACE)?,
            pod: get(env::POD_NAME)?,
            uid: get(env::POD_UID)?,
            gateway: get(env::GATEWAY)?,
        })
    }
}
