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
/// fetched by name, never listed or watched); write its heartbeat Lease by
/// server-side apply and watch its Gateway's heartbeats; read a pod's
/// metadata by name (to tell a sibling's heartbeat from a forged one).
///
/// NB: what has a fixed name is granted by name (the config Secrets, the
/// ConfigMaps). A pod's Lease and its siblings' Pods are named after pods,
/// which the ReplicaSet names when it creates them, so RBAC cannot name
/// them in advance: Leases (`create`, `patch` — an apply that creates is
/// checked as `create` of that name, yet the names are unknown; no `get`,
/// `update` or `delete`), their `list`/`watch` and Pod `get` are
/// namespace-wide. Neither the operator nor the pods believe a Lease for
/// that: they count one only when it is named after, and owned by, a live
/// pod of the Gateway's Deployment. See docs/operations.md ("What RBAC
/// allows the gateway pods").
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
            // The heartbeat: one server-side apply (`patch`, and `create`
            // when the Lease is new). Never read back, replaced or deleted.
            PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".into()]),
                resources: Some(vec!["leases".into()]),
                verbs: verbs(&["create", "patch"]),
                ..PolicyRule::default()
            },
            // Each pod counts its Gateway's live pods (their Leases, by
            // label) to enforce its share of the rate limits.
            PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".into()]),
                resources: Some(vec!["leases".into()]),
                verbs: verbs(&["list", "watch"]),
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
    fn the_role_grants_the_config_secrets_one_config_map_heartbeat_applies_and_pod_reads_by_name_only() {
        let role = role(&fixtures::gateway(Default::default()), &[4, 4]);
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 6);
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
        assert_eq!(rules[3].verbs, ["create", "patch"], "the heartbeat is applied: no get, update or delete");
        assert_eq!(rules[4].resources.as_deref(), Some(&["leases".to_owned()][..]));
        assert_eq!(rules[4].verbs, ["list", "watch"], "read, never written, by this rule");
        assert_eq!(rules[5].resources.as_deref(), Some(&["pods".to_owned()][..]));
        assert_eq!(rules[5].verbs, ["get"], "pods are read by name: no list, no watch");
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
