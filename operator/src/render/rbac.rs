//! The gateway pods' identity: a ServiceAccount, and a Role that lets them
//! read their own config's Secrets and endpoints ConfigMap (by name) and
//! keep their heartbeat Leases — nothing else.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt as _;
use waycast_crds::{Gateway, shards};

use super::meta::{config_map_name, config_secret_name, owned_meta, usage_config_map_name};

/// The ServiceAccount gateway pods run as (named like the Gateway).
pub fn service_account(gateway: &Gateway) -> ServiceAccount {
    ServiceAccount { metadata: owned_meta(gateway, gateway.name_any()), ..ServiceAccount::default() }
}

/// Watch its config's manifest Secret and get the parts of the current
/// shard count, `shards` (`C-base`, `C-keys-N-0` … `C-keys-N-(N-1)`:
/// fetched by name, never listed or watched); create and renew Leases for its heartbeats; read
/// a pod's metadata by name (to tell a sibling's heartbeat from a forged one).
///
/// NB: `create` cannot be limited to names (they are the pods' names, not
/// known in advance), so Leases are namespace-wide; Secrets are not. A pod
/// could so write another's Lease: the operator and the pods count a
/// Lease only when it is named after, and owned by, a live pod of the
/// Gateway's Deployment.
pub fn role(gateway: &Gateway, shard_counts: &[u32]) -> Role {
    let verbs = |list: &[&str]| list.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
    let config = config_secret_name(gateway);
    let mut counts = shard_counts.to_vec();
    counts.sort_unstable();
    counts.dedup();
    let parts = std::iter::once(shards::base_secret_name(&config))
        .chain(
            counts
                .into_iter()
                .flat_map(|of| (0..of).map(move |index| (index, of)))
                .map(|(index, of)| shards::shard_secret_name(&config, index, of)),
        )
        .collect();
    Role {
        metadata: owned_meta(gateway, gateway.name_any()),
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".into()]),
                resource_names: Some(vec![config]),
                verbs: verbs(&["get", "list", "watch"]),
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".into()]),
                resource_names: Some(parts),
                verbs: verbs(&["get"]),
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["configmaps".into()]),
                resource_names: Some(vec![config_map_name(gateway), usage_config_map_name(gateway)]),
                verbs: verbs(&["get", "list", "watch"]),
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".into()]),
                resources: Some(vec!["leases".into()]),
                // list/watch: each pod counts its Gateway's live pods to
                // enforce its share of the rate limits.
                verbs: verbs(&["create", "get", "list", "watch", "update", "patch"]),
                ..PolicyRule::default()
            },
            // NB: get by name only (no list, no watch): a pod checks that
            // a heartbeat Lease is a live sibling's own before counting it.
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["pods".into()]),
                verbs: verbs(&["get"]),
                ..PolicyRule::default()
            },
        ]),
    }
}

/// Binds the Role to the ServiceAccount.
pub fn role_binding(gateway: &Gateway) -> RoleBinding {
    RoleBinding {
        metadata: owned_meta(gateway, gateway.name_any()),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: gateway.name_any(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: gateway.name_any(),
            namespace: gateway.namespace(),
            ..Subject::default()
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures;

    #[test]
    fn the_role_grants_the_config_secrets_one_config_map_leases_and_pod_reads_by_name_only() {
        let role = role(&fixtures::gateway(Default::default()), &[4, 4]);
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 5);
        assert_eq!(rules[0].resource_names.as_deref(), Some(&["shared-config".to_owned()][..]));
        assert_eq!(rules[0].verbs, ["get", "list", "watch"], "the manifest is watched by name");
        let parts = ["shared-config-base", "shared-config-keys-4-0", "shared-config-keys-4-1"]
            .into_iter()
            .chain(["shared-config-keys-4-2", "shared-config-keys-4-3"])
            .map(str::to_owned)
            .collect::<Vec<_>>();
        assert_eq!(rules[1].resources.as_deref(), Some(&["secrets".to_owned()][..]));
        assert_eq!(rules[1].resource_names.as_deref(), Some(&parts[..]), "the parts of one count, named once");
        assert_eq!(rules[1].verbs, ["get"], "parts are fetched by name: no list, no watch");
        assert_eq!(rules[2].resources.as_deref(), Some(&["configmaps".to_owned()][..]));
        let maps = ["shared-endpoints".to_owned(), "shared-usage".to_owned()];
        assert_eq!(rules[2].resource_names.as_deref(), Some(&maps[..]));
        assert!(!rules[2].verbs.iter().any(|v| v == "update" || v == "patch" || v == "*"));
        assert_eq!(rules[3].resources.as_deref(), Some(&["leases".to_owned()][..]));
        assert_eq!(rules[4].resources.as_deref(), Some(&["pods".to_owned()][..]));
        assert_eq!(rules[4].verbs, ["get"], "pods are read by name: no list, no watch");
        let one = super::role(&fixtures::gateway(Default::default()), &[1]).rules.unwrap();
        let one_parts = ["shared-config-base".to_owned(), "shared-config-keys-1-0".to_owned()];
        assert_eq!(one[1].resource_names.as_deref(), Some(&one_parts[..]));
        // While a new count's manifest is not yet written, both sets.
        let both = super::role(&fixtures::gateway(Default::default()), &[2, 1]).rules.unwrap();
        let both_parts =
            ["shared-config-base", "shared-config-keys-1-0", "shared-config-keys-2-0", "shared-config-keys-2-1"]
                .map(str::to_owned);
        assert_eq!(both[1].resource_names.as_deref(), Some(&both_parts[..]));
        assert!(
            rules.iter().all(|r| !r.verbs.iter().any(|v| v == "*") && !r.resources.iter().flatten().any(|x| x == "*"))
        );
    }
}
