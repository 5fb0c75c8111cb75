//! The operator-wide settings render needs (from its flags).

/// The operator-wide settings render needs.
#[derive(Debug, Clone)]
pub struct RenderSettings {
    /// Gateway image when the Gateway does not name one.
    pub gateway_image: String,
    /// The gateway pods' NetworkPolicy; `None`: none.
    pub network_policy: Option<super::network_policy::NetworkPolicySettings>,
}
