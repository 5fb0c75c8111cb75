//! How the operator runs a gateway pod: the flags it passes and the
//! environment it sets, named once for the operator that writes them and
//! the gateway that reads them.

/// Long flag names (without the leading `--`) of `waycast-gateway`.
pub mod flag {
    /// `NAMESPACE/NAME` of the Secret holding the config.
    pub const CONFIG_SECRET: &str = "config-secret";
    /// `NAMESPACE/NAME` of the ConfigMap holding the endpoints document.
    pub const ENDPOINTS_CONFIGMAP: &str = "endpoints-configmap";
    /// `NAMESPACE/NAME` of the ConfigMap holding the fleet's budget spend.
    pub const USAGE_CONFIGMAP: &str = "usage-configmap";
    /// The public listener's address.
    pub const LISTEN: &str = "listen";
    /// The admin listener's address.
    pub const ADMIN_LISTEN: &str = "admin-listen";
    /// How long in-flight requests may run after SIGTERM.
    pub const DRAIN_TIMEOUT: &str = "drain-timeout";
    /// The log filter.
    pub const LOG: &str = "log";
    /// Most client connections open at once.
    pub const MAX_CONNECTIONS: &str = "max-connections";
    /// PEM certificate chain for TLS.
    pub const TLS_CERT: &str = "tls-cert";
    /// PEM private key for TLS.
    pub const TLS_KEY: &str = "tls-key";
    /// Data-plane worker threads.
    pub const WORKERS: &str = "workers";
}

/// Environment variables the operator sets on gateway pods (from the
/// downward API and the Gateway), read for the heartbeat Lease.
pub mod env {
    /// The pod's name.
    pub const POD_NAME: &str = "POD_NAME";
    /// The pod's namespace.
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// The pod's uid (the heartbeat Lease's owner).
    pub const POD_UID: &str = "POD_UID";
    /// The name of the Gateway the pod serves.
    pub const GATEWAY: &str = "WAYCAST_GATEWAY";
}

/// `--<flag>`.
pub fn arg(flag: &str) -> String {
    format!("--{flag}")
}
