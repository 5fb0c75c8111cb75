//! Where a batch goes, and who it says sent it.

use std::collections::BTreeMap;

use crate::proto;

/// An OTLP/HTTP collector and the resource exports to it name.
#[derive(PartialEq)]
pub struct Destination {
    /// The OTLP/HTTP base URL (`/v1/traces` and `/v1/logs` are added).
    pub endpoint: String,
    /// Headers of every export (marked sensitive).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The resource and scope.
    pub source: proto::Source,
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
    /// Exports of `service` to `endpoint`, with `headers` and the resource
    /// `attributes` (which may name `service.name` and `service.version`
    /// themselves). The settings are checked before (the crds crate's
    /// `TelemetryConfig::problems`): a header that is not one is left out.
    pub fn new(
        endpoint: &str,
        headers: &BTreeMap<String, String>,
        attributes: &BTreeMap<String, String>,
        service: &str,
    ) -> Self {
        let headers = headers
            .iter()
            .filter_map(|(name, value)| {
                let mut value = http::HeaderValue::from_str(value).ok()?;
                value.set_sensitive(true);
                Some((http::HeaderName::from_bytes(name.as_bytes()).ok()?, value))
            })
            .collect();
        let mut resource: Vec<(String, String)> = Vec::new();
        if !attributes.contains_key("service.name") {
            resource.push(("service.name".into(), service.into()));
        }
        if !attributes.contains_key("service.version") {
            resource.push(("service.version".into(), env!("CARGO_PKG_VERSION").into()));
        }
        resource.extend(attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
        Self {
            endpoint: endpoint.to_owned(),
            headers,
            source: proto::Source { resource, scope_name: "waycast", scope_version: env!("CARGO_PKG_VERSION") },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    #[test]
    fn the_service_is_named_unless_the_attributes_name_it_and_header_values_stay_hidden() {
        let headers = BTreeMap::from([("authorization".to_owned(), "Bearer s3cret".to_owned())]);
        let plain = Destination::new("http://collector:4318", &headers, &BTreeMap::new(), "waycast-operator");
        assert_eq!(plain.source.resource[0], ("service.name".into(), "waycast-operator".into()));
        assert_eq!(plain.source.resource[1].0, "service.version");
        assert!(plain.headers[0].1.is_sensitive());
        assert!(!format!("{plain:?}").contains("s3cret"), "{plain:?}");
        let named = BTreeMap::from([("service.name".to_owned(), "llm-edge".to_owned())]);
        let renamed = Destination::new("http://collector:4318", &BTreeMap::new(), &named, "waycast-gateway");
        let names: Vec<&str> = renamed.source.resource.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["service.version", "service.name"]);
        assert_eq!(renamed.source.resource[1].1, "llm-edge");
    }
}
