//! Which ModelEndpoints and ApiKeys a Gateway selects: its namespace policy
//! (`Same`, `All`, `Selector`) and its label selector. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use waycast_crds::gateway::{NamespaceFrom, RouteSelector};

/// Whether `selector` matches `labels` (matchLabels and matchExpressions
/// with `In`, `NotIn`, `Exists`, `DoesNotExist`; an unknown operator
/// matches nothing).
pub fn label_selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector.match_labels.iter().flatten().all(|(key, value)| labels.get(key) == Some(value));
    let by_expressions = selector.match_expressions.iter().flatten().all(|expression| {
        let value = labels.get(&expression.key);
        let values = expression.values.as_deref().unwrap_or_default();
        match expression.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// Whether a Gateway in `gateway_namespace` with `policy` selects an object
/// in `namespace` carrying `labels`; `namespaces` are the cluster's
/// namespaces (their labels matter for `Selector`).
pub fn selects(
    policy: Option<&RouteSelector>,
    gateway_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    namespaces: &[&Namespace],
) -> bool {
    let namespace_policy = policy.and_then(|p| p.namespaces.as_ref());
    let namespace_ok = match namespace_policy.map(|p| p.from).unwrap_or_default() {
        NamespaceFrom::Same => namespace == gateway_namespace,
        NamespaceFrom::All => true,
        NamespaceFrom::Selector => {
            let selector = namespace_policy.and_then(|p| p.selector.as_ref());
            let namespace_labels = namespaces
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(namespace))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default();
            // NB: the schema requires a selector with Selector; without one
            // nothing is selected rather than everything.
            selector.is_some_and(|s| label_selector_matches(s, &namespace_labels))
        }
    };
    namespace_ok && policy.and_then(|p| p.selector.as_ref()).is_none_or(|s| label_selector_matches(s, labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
    use waycast_crds::gateway::NamespacePolicy;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn namespace(name: &str, pairs: &[(&str, &str)]) -> Namespace {
        Namespace {
            metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels(pairs)), ..ObjectMeta::default() },
            ..Namespace::default()
        }
    }

    fn policy(
        from: NamespaceFrom,
        namespace_labels: Option<&[(&str, &str)]>,
        object_labels: Option<&[(&str, &str)]>,
    ) -> RouteSelector {
        RouteSelector {
            namespaces: Some(NamespacePolicy {
                from,
                selector: namespace_labels
                    .map(|l| LabelSelector { match_labels: Some(labels(l)), ..LabelSelector::default() }),
            }),
            selector: object_labels
                .map(|l| LabelSelector { match_labels: Some(labels(l)), ..LabelSelector::default() }),
        }
    }

    #[test]
    fn namespace_policies() {
        let namespaces = [namespace("team-a", &[("waycast.dev/team", "enabled")]), namespace("team-b", &[])];
        let none = labels(&[]);
        // Default: the Gateway's own namespace only.
        let namespaces: Vec<&Namespace> = namespaces.iter().collect();
        assert!(selects(None, "platform", "platform", &none, &namespaces));
        assert!(!selects(None, "platform", "team-a", &none, &namespaces));
        let all = policy(NamespaceFrom::All, None, None);
        assert!(selects(Some(&all), "platform", "team-b", &none, &namespaces));
        let teams = policy(NamespaceFrom::Selector, Some(&[("waycast.dev/team", "enabled")]), None);
        assert!(selects(Some(&teams), "platform", "team-a", &none, &namespaces));
        assert!(!selects(Some(&teams), "platform", "team-b", &none, &namespaces));
        assert!(!selects(Some(&teams), "platform", "unknown", &none, &namespaces));
    }

    #[test]
    fn object_label_selectors() {
        let public = policy(NamespaceFrom::All, None, Some(&[("tier", "public")]));
        assert!(selects(Some(&public), "p", "x", &labels(&[("tier", "public"), ("a", "b")]), &[]));
        assert!(!selects(Some(&public), "p", "x", &labels(&[("tier", "internal")]), &[]));
    }

    #[test]
    fn match_expressions() {
        let requirement = |key: &str, operator: &str, values: &[&str]| LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        };
        let selector = LabelSelector {
            match_expressions: Some(vec![
                requirement("env", "In", &["prod", "staging"]),
                requirement("legacy", "DoesNotExist", &[]),
                requirement("team", "NotIn", &["x"]),
            ]),
            ..LabelSelector::default()
        };
        assert!(label_selector_matches(&selector, &labels(&[("env", "prod")])));
        assert!(!label_selector_matches(&selector, &labels(&[("env", "dev")])));
        assert!(!label_selector_matches(&selector, &labels(&[("env", "prod"), ("legacy", "1")])));
        assert!(!label_selector_matches(&selector, &labels(&[("env", "prod"), ("team", "x")])));
        let unknown =
            LabelSelector { match_expressions: Some(vec![requirement("a", "Gt", &["1"])]), ..LabelSelector::default() };
        assert!(!label_selector_matches(&unknown, &labels(&[("a", "2")])));
    }
}
