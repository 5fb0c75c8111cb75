//! The OTLP flags both binaries take, with the OpenTelemetry SDKs'
//! environment variables as their defaults.

use std::collections::BTreeMap;

use crate::headers::{HiddenText, parse_headers};

/// `--otlp-endpoint`, `--otlp-sampling`, `--otlp-headers`.
#[derive(Debug, Clone, clap::Args)]
pub struct OtlpFlags {
    /// OTLP/HTTP base URL telemetry goes to: spans to `/v1/traces`, the
    /// gateway's usage records to `/v1/logs` (a gateway's config naming
    /// its own in `settings.telemetry` wins). Unset: none sent.
    #[arg(long = "otlp-endpoint", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub endpoint: Option<String>,
    /// Share of new traces recorded, 0 to 1.
    #[arg(long = "otlp-sampling", env = "OTEL_TRACES_SAMPLER_ARG", default_value_t = 1.0)]
    pub sampling: f64,
    /// Headers of every export, `name=value,name=value` (as
    /// `OTEL_EXPORTER_OTLP_HEADERS`).
    #[arg(long = "otlp-headers", env = "OTEL_EXPORTER_OTLP_HEADERS", hide_env_values = true, default_value = "")]
    pub headers: HiddenText,
}

/// The flags, read: endpoint, sampling and headers.
pub struct Otlp {
    /// The base URL.
    pub endpoint: String,
    /// Share of new traces recorded.
    pub sampling: f64,
    /// The export headers, decoded.
    pub headers: BTreeMap<String, String>,
}

impl OtlpFlags {
    /// What the flags say: `None` without an endpoint.
    ///
    /// # Errors
    /// A malformed `--otlp-headers`, named by flag and entry, never by value.
    pub fn read(&self) -> Result<Option<Otlp>, String> {
        let headers = parse_headers(&self.headers.0).map_err(|why| format!("--otlp-headers: {why}"))?;
        Ok(self.endpoint.clone().map(|endpoint| Otlp { endpoint, sampling: self.sampling, headers }))
    }
}
