//! Where and how a Gateway's records go.

use waycast_crds::telemetry::TelemetryConfig;

use super::otlp;

/// Where and how a Gateway's records go (its config's, or the flags').
#[derive(PartialEq)]
pub struct Destination {
    /// The OTLP/HTTP base URL.
    pub endpoint: String,
    /// Headers of every export.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The resource and scope.
    pub source: otlp::Source,
    /// The share of new traces recorded.
    pub sampling: f64,
    /// Whether a client's trace is continued.
    pub trust_client: bool,
    /// Whether usage records are sent.
    pub usage_logs: bool,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values (tokens) never reach a log line.
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Destination")
            .field("endpoint", &self.endpoint)
            .field("headers", &headers)
            .finish_non_exhaustive()
    }
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
        let headers = config
            .headers
            .iter()
            .filter_map(|(name, value)| {
                let mut value = http::HeaderValue::from_str(value).ok()?;
                value.set_sensitive(true);
                Some((http::HeaderName::from_bytes(name.as_bytes()).ok()?, value))
            })
            .collect();
        let mut resource: Vec<(String, String)> = Vec::new();
        if !config.resource_attributes.contains_key("service.name") {
            resource.push(("service.name".into(), "waycast-gateway".into()));
        }
        if !config.resource_attributes.contains_key("service.version") {
            resource.push(("service.version".into(), env!("CARGO_PKG_VERSION").into()));
        }
        resource.extend(config.resource_attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
        Ok(Self {
            endpoint: config.endpoint.clone(),
            headers,
            source: otlp::Source { resource, scope_name: "waycast", scope_version: env!("CARGO_PKG_VERSION") },
            sampling: config.sampling.0,
            trust_client: config.trust_client_trace_context,
            usage_logs: config.usage_logs,
        })
    }
}
