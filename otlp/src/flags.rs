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
    /// Share of new traces recorded, 0 to 1 (default 1; else
    /// `OTEL_TRACES_SAMPLER_ARG` when `OTEL_TRACES_SAMPLER` is a ratio
    /// sampler: another sampler's argument is not a ratio).
    #[arg(long = "otlp-sampling", env = "WAYCAST_OTLP_SAMPLING")]
    pub sampling: Option<f64>,
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
        let sampling =
            self.sampling.or_else(|| ratio_from_sdk_variables(|name| std::env::var(name).ok())).unwrap_or(1.0);
        Ok(self.endpoint.clone().map(|endpoint| Otlp { endpoint, sampling, headers }))
    }
}

/// The OpenTelemetry SDKs' ratio, when their sampler is one that takes it.
fn ratio_from_sdk_variables(variable: impl Fn(&str) -> Option<String>) -> Option<f64> {
    let sampler = variable("OTEL_TRACES_SAMPLER")?;
    if !matches!(sampler.trim(), "traceidratio" | "parentbased_traceidratio") {
        return None;
    }
    variable("OTEL_TRACES_SAMPLER_ARG")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_ratio_is_read_only_for_a_ratio_sampler() {
        let with = |sampler: &'static str, argument: &'static str| {
            ratio_from_sdk_variables(move |name| match name {
                "OTEL_TRACES_SAMPLER" => Some(sampler.to_owned()),
                "OTEL_TRACES_SAMPLER_ARG" => Some(argument.to_owned()),
                _ => None,
            })
        };
        assert_eq!(with("parentbased_traceidratio", "0.25"), Some(0.25));
        assert_eq!(with("traceidratio", " 0.5 "), Some(0.5));
        assert_eq!(with("jaeger_remote", "endpoint=http://agent:14250"), None);
        assert_eq!(with("traceidratio", "lots"), None);
        assert_eq!(ratio_from_sdk_variables(|_| None), None);
    }
}
