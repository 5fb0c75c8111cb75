//! Which ModelEndpoints, ApiKeys and AccessGrants a Gateway serves: two-way consent, after
//! Gateway API's `parentRefs` + `allowedRoutes`. Pure.
//!
//! ```text
//! object names the Gateway in parentRefs ─┐
//!   (or names none and shares its namespace) ├─ both ─► Admitted
//! Gateway's namespace policy + label selector ┘   only the first ─► NotAllowed (status says so)
//!                                                  not the first ─► not a parent (no status entry)
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use waycast_crds::Gateway;
use waycast_crds::common::{GatewayAcceptance, ParentReference};
use waycast_crds::condition::reasons;
use waycast_crds::gateway::{NamespaceFrom, NamespacePolicy, RouteSelector};

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

/// How a Gateway stands towards one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    /// The object does not ask for this Gateway: no status entry.
    NotParent,
    /// Both sides agree: the Gateway serves it.
    Admitted,
    /// The object names the Gateway, whose rules do not admit it.
    NotAllowed,
}

/// Where a Gateway is, and the rules it admits objects of one kind by.
pub struct GatewayRef<'a> {
    /// The Gateway's namespace.
    pub namespace: &'a str,
    /// The Gateway's name.
    pub name: &'a str,
    /// Its `modelEndpoints` or `apiKeys` rules.
    pub policy: Option<&'a RouteSelector>,
}

/// How `gateway` stands towards an object in `namespace` with `labels` and
/// `parent_refs`.
pub fn parent(
    gateway: &GatewayRef<'_>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    parent_refs: &[ParentReference],
    namespaces: &[&Namespace],
) -> Parent {
    let named = parent_refs.iter().any(|reference| {
        reference.name == gateway.name && reference.namespace.as_deref().unwrap_or(namespace) == gateway.namespace
    });
    let implicit = parent_refs.is_empty() && namespace == gateway.namespace;
    if !named && !implicit {
        return Parent::NotParent;
    }
    if selects(gateway.policy, gateway.namespace, namespace, labels, namespaces) {
        Parent::Admitted
    } else if named {
        Parent::NotAllowed
    } else {
        // A Gateway's label selector leaving out an object of its own
        // namespace is a choice, not an error.
        Parent::NotParent
    }
}

/// Which rules of a Gateway apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `spec.modelEndpoints`.
    ModelEndpoints,
    /// `spec.apiKeys`.
    ApiKeys,
    /// `spec.apiKeys` too: a grant gives access as a key does, so a Gateway
    /// admits grants by the same rules (`grants::selected`).
    AccessGrants,
}

/// An object's parents among `gateways`: those that serve it, and a
/// refused entry for each it names that does not (`NotAllowedByGateway`)
/// or does not exist (`GatewayNotFound`), sorted by Gateway.
pub struct Parents<'g> {
    /// Gateways that admit the object.
    pub admitted: Vec<&'g Gateway>,
    /// Status entries for the parents that do not serve it.
    pub refused: Vec<GatewayAcceptance>,
}

/// The parents of an object of `kind` in `namespace`.
pub fn parents<'g>(
    gateways: &[&'g Gateway],
    kind: Kind,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    parent_refs: &[ParentReference],
    namespaces: &[&Namespace],
) -> Parents<'g> {
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    let field = match kind {
        Kind::ModelEndpoints => "modelEndpoints",
        Kind::ApiKeys | Kind::AccessGrants => "apiKeys",
    };
    for gateway in gateways.iter().copied() {
        let gateway_namespace = gateway.metadata.namespace.as_deref().unwrap_or_default();
        let policy = match kind {
            Kind::ModelEndpoints => gateway.spec.model_endpoints.as_ref(),
            Kind::ApiKeys | Kind::AccessGrants => gateway.spec.api_keys.as_ref(),
        };
        let name = gateway.metadata.name.as_deref().unwrap_or_default();
        let reference = GatewayRef { namespace: gateway_namespace, name, policy };
        match parent(&reference, namespace, labels, parent_refs, namespaces) {
            Parent::NotParent => {}
            Parent::Admitted => admitted.push(gateway),
            Parent::NotAllowed => refused.push(GatewayAcceptance {
                gateway: format!("{gateway_namespace}/{name}"),
                accepted: false,
                reason: reasons::NOT_ALLOWED_BY_GATEWAY.to_owned(),
                message: format!("the Gateway's spec.{field} rules do not admit namespace {namespace} or its labels"),
            }),
        }
    }
    for reference in parent_refs {
        let gateway_namespace = reference.namespace.as_deref().unwrap_or(namespace);
        let exists = gateways.iter().any(|g| {
            g.metadata.namespace.as_deref() == Some(gateway_namespace)
                && g.metadata.name.as_deref() == Some(&reference.name)
        });
        let id = format!("{gateway_namespace}/{}", reference.name);
        if !exists && !refused.iter().any(|entry| entry.gateway == id) {
            refused.push(GatewayAcceptance {
                message: format!("spec.parentRefs names Gateway {id}, which does not exist"),
                gateway: id,
                accepted: false,
                reason: reasons::GATEWAY_NOT_FOUND.to_owned(),
            });
        }
    }
    refused.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    Parents { admitted, refused }
}

/// Whether `policy` (for `home`, the policy owner's namespace; `Same` by
/// default) admits `namespace`.
pub fn namespace_admitted(
    policy: Option<&NamespacePolicy>,
    home: &str,
    namespace: &str,
    namespaces: &[&Namespace],
) -> bool {
    match policy.map(|p| p.from).unwrap_or_default() {
        NamespaceFrom::Same => namespace == home,
        NamespaceFrom::All => true,
        NamespaceFrom::Selector => {
            let selector = policy.and_then(|p| p.selector.as_ref());
            let namespace_labels = namespaces
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(namespace))
                .and_then(|n| n.metadata.labels.as_ref());
            let empty = BTreeMap::new();
            // NB: the schema requires a selector with Selector; without one
            // nothing is selected rather than everything.
            selector.is_some_and(|s| label_selector_matches(s, namespace_labels.unwrap_or(&empty)))
        }
    }
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
    let namespace_ok =
        namespace_admitted(policy.and_then(|p| p.namespaces.as_ref()), gateway_namespace, namespace, namespaces);
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
    fn two_way_consent() {
        let reference = |name: &str, namespace: Option<&str>| ParentReference {
            name: name.into(),
            namespace: namespace.map(Into::into),
        };
        let namespaces = [namespace("team-a", &[("waycast.dev/team", "enabled")]), namespace("team-b", &[])];
        let namespaces: Vec<&Namespace> = namespaces.iter().collect();
        let teams = policy(NamespaceFrom::Selector, Some(&[("waycast.dev/team", "enabled")]), None);
        let all = policy(NamespaceFrom::All, None, None);
        let shared = GatewayRef { namespace: "platform", name: "shared", policy: Some(&teams) };
        let open = GatewayRef { namespace: "rogue", name: "grab", policy: Some(&all) };
        let same = GatewayRef { namespace: "team-a", name: "local", policy: None };
        let none = labels(&[]);
        let to_shared = [reference("shared", Some("platform"))];
        let cases: [(&GatewayRef<'_>, &str, &[ParentReference], Parent); 8] = [
            // Named and admitted.
            (&shared, "team-a", &to_shared, Parent::Admitted),
            // Named, but the namespace is not admitted.
            (&shared, "team-b", &to_shared, Parent::NotAllowed),
            // Admitted by the rules, but not named: a from-All Gateway takes nothing by itself.
            (&open, "team-a", &to_shared, Parent::NotParent),
            (&open, "team-a", &[], Parent::NotParent),
            // No parentRefs: the Gateways of the object's own namespace.
            (&same, "team-a", &[], Parent::Admitted),
            (&shared, "team-a", &[], Parent::NotParent),
            // A reference without a namespace means the object's own.
            (&same, "team-a", &[reference("local", None)], Parent::Admitted),
            // Naming other Gateways only leaves out the same-namespace one.
            (&same, "team-a", &to_shared, Parent::NotParent),
        ];
        for (index, (gateway, object_namespace, refs, expected)) in cases.into_iter().enumerate() {
            assert_eq!(parent(gateway, object_namespace, &none, refs, &namespaces), expected, "case {index}");
        }
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
