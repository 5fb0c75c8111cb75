//! Telemetry: where a Gateway's pods send their traces and usage records
//! (OTLP over HTTP), as the platform team writes it
//! (`Gateway.spec.telemetry`) and as the pods read it
//! (`settings.telemetry` of the config).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most resource attributes a Gateway adds to what its pods send.
pub const MAX_RESOURCE_ATTRIBUTES: usize = 32;
/// Most headers sent with each export.
pub const MAX_HEADERS: usize = 16;

/// `Gateway.spec.telemetry`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayTelemetry {
    /// The OTLP/HTTP base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` (e.g.
    /// `http://otel-collector.observability:4318`): traces go to
    /// `/v1/traces`, usage records to `/v1/logs`.
    #[schemars(length(min = 8, max = 2048), pattern(r"^https?://[^\s]+$"))]
    pub endpoint: String,
    /// The share of traces recorded, from 0 to 1, decided from the trace
    /// id (a continued client trace too, unless `honorClientSampling`).
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub sampling: Option<f64>,
    /// A Secret in the Gateway's namespace whose entries are sent as
    /// headers with every export (each key a header name, e.g.
    /// `authorization`; at most 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_secret_ref: Option<crate::common::SecretRef>,
    /// Attributes added to the resource of everything the pods send
    /// (`service.name` is `waycast-gateway` unless set here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub resource_attributes: BTreeMap<String, String>,
    /// Continue the trace a client's `traceparent` names (its trace id and
    /// parent span; its sampled flag only with `honorClientSampling`).
    /// False: every request starts a trace of its own (the client's header
    /// is still not passed upstream). Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_client_trace_context: Option<bool>,
    /// Let a continued client trace's sampled flag decide whether it is
    /// recorded, instead of `sampling`: a client could otherwise have the
    /// platform record (and pay for) every one of its requests. Only with
    /// `trustClientTraceContext`. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honor_client_sampling: Option<bool>,
    /// Send each finished request's usage record as an OTLP log record.
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_logs: Option<bool>,
}

/// A sampling ratio from 0 to 1 (validated: never NaN, so equality holds).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(transparent)]
pub struct Ratio(pub f64);

impl Eq for Ratio {}

impl Default for Ratio {
    fn default() -> Self {
        Self(1.0)
    }
}

/// `settings.telemetry` of the config.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL.
    pub endpoint: String,
    /// The share of new traces recorded.
    #[serde(default)]
    pub sampling: Ratio,
    /// Headers sent with every export.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Resource attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_attributes: BTreeMap<String, String>,
    /// Whether a client's `traceparent` is continued.
    #[serde(default = "yes")]
    pub trust_client_trace_context: bool,
    /// Whether a continued client trace's sampled flag replaces the ratio.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub honor_client_sampling: bool,
    /// Whether usage records are exported as logs.
    #[serde(default = "yes")]
    pub usage_logs: bool,
}

impl Default for TelemetryConfig {
    /// Nowhere yet; the defaults a written config gets.
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            sampling: Ratio::default(),
            headers: BTreeMap::new(),
            resource_attributes: BTreeMap::new(),
            trust_client_trace_context: true,
            honor_client_sampling: false,
            usage_logs: true,
        }
    }
}

/// Headers the exporter writes itself: one of these from a Secret or the
/// flags would corrupt the export.
const SET_BY_EXPORTER: [&str; 6] = ["host", "content-length", "content-type", "transfer-encoding", "connection", "te"];

impl std::fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values (tokens) never reach a log line.
        let headers: Vec<&str> = self.headers.keys().map(String::as_str).collect();
        f.debug_struct("TelemetryConfig")
            .field("endpoint", &self.endpoint)
            .field("sampling", &self.sampling.0)
            .field("headers", &headers)
            .field("resource_attributes", &self.resource_attributes)
            .field("trust_client_trace_context", &self.trust_client_trace_context)
            .field("honor_client_sampling", &self.honor_client_sampling)
            .field("usage_logs", &self.usage_logs)
            .finish()
    }
}

fn yes() -> bool {
    true
}

/// At most 64 characters of what was written, for a message.
fn shown(text: &str) -> String {
    text.chars().take(64).collect()
}

impl TelemetryConfig {
    /// What is wrong with it, each problem on its own line (empty: fine).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let scheme_ok = self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://");
        let parsed = self.endpoint.parse::<http::Uri>();
        // Credentials belong in headersSecretRef: an endpoint carrying them
        // would be shown in conditions and logs. Its text is not repeated.
        let carries_credentials = parsed.as_ref().is_ok_and(|uri| {
            uri.authority().is_some_and(|authority| authority.as_str().contains('@')) || uri.query().is_some()
        });
        if carries_credentials {
            problems
                .push("endpoint carries user info or a query: put credentials in headersSecretRef instead".to_owned());
        } else if !scheme_ok || parsed.is_err() || self.endpoint.len() > 2048 {
            problems.push(format!("endpoint {:?} is not an http(s) URL", shown(&self.endpoint)));
        }
        if !(0.0..=1.0).contains(&self.sampling.0) {
            problems.push(format!("sampling {} is not between 0 and 1", self.sampling.0));
        }
        if self.headers.len() > MAX_HEADERS {
            problems.push(format!("{} headers: at most {MAX_HEADERS}", self.headers.len()));
        }
        for (place, (name, value)) in self.headers.iter().enumerate() {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                // A mistyped entry (`authorization:Bearer …`) can hold the
                // token in its name: named by its place, never its text.
                problems
                    .push(format!("header {} (in name order) has a name that is not an HTTP header name", place + 1));
            } else if http::HeaderValue::from_str(value).is_err() {
                problems.push(format!("header {:?} has a value that is not an HTTP header value", shown(name)));
            } else if SET_BY_EXPORTER.contains(&name.to_ascii_lowercase().as_str()) {
                problems.push(format!("header {:?} is set by the exporter itself", shown(name)));
            }
        }
        if self.resource_attributes.len() > MAX_RESOURCE_ATTRIBUTES {
            problems.push(format!(
                "{} resource attributes: at most {MAX_RESOURCE_ATTRIBUTES}",
                self.resource_attributes.len()
            ));
        }
        for (key, value) in &self.resource_attributes {
            if key.is_empty() || key.len() > 256 || value.len() > 1024 {
                let key = shown(key);
                problems.push(format!("resource attribute {key:?}: a key of 1 to 256 bytes, a value of at most 1,024"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    fn config(endpoint: &str) -> TelemetryConfig {
        TelemetryConfig { endpoint: endpoint.into(), ..TelemetryConfig::default() }
    }

    #[test]
    fn defaults_and_the_problems_of_each_field() {
        let read: TelemetryConfig = serde_json::from_str(r#"{"endpoint":"http://collector:4318"}"#).unwrap();
        assert_eq!((read.sampling, read.trust_client_trace_context, read.usage_logs), (Ratio(1.0), true, true));
        assert!(!read.honor_client_sampling, "a client's sampled flag decides nothing unless the Gateway says so");
        assert!(read.problems().is_empty());
        assert_eq!(config("ftp://collector").problems().len(), 1);
        assert_eq!(config("http://bad host").problems().len(), 1);
        let mut bad = config("https://collector:4318");
        bad.sampling = Ratio(1.5);
        bad.headers.insert("bad header".into(), "v".into());
        bad.resource_attributes.insert(String::new(), "v".into());
        bad.headers.insert("Content-Length".into(), "5".into());
        assert_eq!(bad.problems().len(), 4, "{:?}", bad.problems());
        // A token typed into a name is never repeated.
        let mut mistyped = config("https://collector:4318");
        mistyped.headers.insert("authorization:Bearer s3cret".into(), "x".into());
        let said = mistyped.problems().join("; ");
        assert!(said.contains("header 1") && !said.contains("s3cret"), "{said}");
        // Credentials in the endpoint are refused, and not repeated.
        for endpoint in ["https://user:s3cret@collector:4318", "https://collector:4318/?api_key=s3cret"] {
            let said = config(endpoint).problems().join("; ");
            assert!(said.contains("headersSecretRef") && !said.contains("s3cret"), "{said}");
        }
        let mut many = config("http://collector:4318");
        many.headers = (0..=MAX_HEADERS).map(|n| (format!("x-h{n}"), "v".into())).collect();
        many.resource_attributes = (0..=MAX_RESOURCE_ATTRIBUTES).map(|n| (format!("k{n}"), "v".into())).collect();
        assert_eq!(many.problems().len(), 2, "{:?}", many.problems());
    }

    #[test]
    fn header_values_never_reach_debug_output() {
        let mut secret = config("http://collector:4318");
        secret.headers.insert("authorization".into(), "Bearer s3cret".into());
        let shown = format!("{secret:?}");
        assert!(shown.contains("authorization") && !shown.contains("s3cret"), "{shown}");
    }
}
