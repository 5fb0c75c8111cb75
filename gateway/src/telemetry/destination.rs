//! Where and how a Gateway's records go.

use std::sync::Arc;

use waycast_crds::telemetry::TelemetryConfig;

/// Where and how a Gateway's records go (its config's, or the flags').
#[derive(Debug, PartialEq)]
pub struct Destination {
    /// The collector, its headers and the resource (what the exporter
    /// needs; its Debug shows no header value).
    pub export: Arc<waycast_otlp::Destination>,
    /// The share of new traces recorded.
    pub sampling: f64,
    /// Whether a client's trace is continued.
    pub trust_client: bool,
    /// Whether a continued client trace's sampled flag replaces `sampling`.
    pub honor_client_sampling: bool,
    /// Whether usage records are sent.
    pub usage_logs: bool,
}

impl Destination {
    /// From the config's (or the flags') settings.
    ///
    /// # Errors
    /// What is wrong with them.
    pub fn of(config: &TelemetryConfig) -> Result<Self, String> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let export = waycast_otlp::Destination::new(
            &config.endpoint,
            &config.headers,
            &config.resource_attributes,
            "waycast-gateway",
        );
        Ok(Self {
            export: Arc::new(export),
            sampling: config.sampling.0,
            trust_client: config.trust_client_trace_context,
            honor_client_sampling: config.honor_client_sampling,
            usage_logs: config.usage_logs,
        })
    }
}
