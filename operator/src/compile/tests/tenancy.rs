//! Tenant policies: weights, classes, caps, budgets and key caps per namespace.

use super::*;

/// A Gateway's tenant policies: the first that selects a namespace applies
/// to it (weight, classes, caps); a key whose class its namespace may not
/// use is left out (`ClassNotAllowed`) and its neighbours are served; the
/// status lists what each policy matched.
#[test]
fn tenant_policies_give_each_namespace_its_weight_classes_and_caps() {
    use waycast_crds::sharing::{GatewaySharing, SharingQueue, TenantPolicy};
    let mut world = World::quickstart();
    world.gateway = gateway("platform", GatewaySpec::default());
    world.namespaces = vec![
        namespace("platform", &[]),
        namespace("gold-team", &[("tier", "gold")]),
        namespace("batch-team", &[]),
        namespace("other", &[]),
    ];
    world.gateway.spec.api_keys = Some(RouteSelector {
        namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
        selector: None,
    });
    let gold = NamespacePolicy {
        from: NamespaceFrom::Selector,
        selector: Some(LabelSelector {
            match_labels: Some([("tier".to_owned(), "gold".to_owned())].into()),
            ..LabelSelector::default()
        }),
    };
    world.gateway.spec.tenants = vec![
        TenantPolicy {
            namespaces: gold,
            weight: Some(4),
            classes: vec!["interactive".into(), "standard".into()],
            limits: Some(KeyLimits {
                requests_per_minute: Some(6000),
                max_concurrent: Some(200),
                ..KeyLimits::default()
            }),
            budgets: vec![Budget { period: Period::Month, tokens: Some(50_000_000), cost: Some("1250.00".into()) }],
            max_api_keys: None,
        },
        TenantPolicy {
            namespaces: NamespacePolicy { from: NamespaceFrom::All, selector: None },
            classes: vec!["batch".into()],
            ..TenantPolicy::default()
        },
        // Never reached: the policy before it selects every namespace.
        TenantPolicy { namespaces: NamespacePolicy::default(), weight: Some(9), ..TenantPolicy::default() },
    ];
    world.gateway.spec.sharing = Some(GatewaySharing {
        queue: Some(SharingQueue { max_wait: Some("2s".into()), max_queued: Some(50) }),
        burst_percent: Some(25),
        inference_headers: Some(true),
        ..GatewaySharing::default()
    });
    let team_key = |namespace: &str, name: &str, class: Option<&str>| {
        let mut key = api_key(namespace, name, ApiKeySpec { class: class.map(str::to_owned), ..ApiKeySpec::default() });
        key.spec.parent_refs = parent("platform", "gw");
        key
    };
    world.gateway.spec.budgets =
        Some(GatewayBudgets { time_zone: Some("Europe/Berlin".into()), currency: Some("EUR".into()) });
    let mut chat = team_key("gold-team", "chat", Some("interactive"));
    chat.spec.budgets = vec![Budget { period: Period::Day, tokens: Some(200_000), cost: None }];
    world.keys = vec![
        chat,
        team_key("gold-team", "plain", None),
        team_key("batch-team", "jobs", None),
        team_key("batch-team", "sneaky", Some("interactive")),
        team_key("batch-team", "unknown", Some("gold")),
    ];
    let texts = [
        KEY_A,
        KEY_B,
        "wc_ccccccccccccccccccccccccccccccccccccccccccc",
        "wc_ddddddddddddddddddddddddddddddddddddddddddd",
        "wc_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
    ];
    world.secrets = world
        .keys
        .iter()
        .zip(texts)
        .map(|(key, text)| {
            key_secret(&key.metadata.namespace.clone().unwrap(), &key.metadata.name.clone().unwrap(), text)
        })
        .collect();
    let compiled = world.compile();
    let verdict = |namespace: &str, name: &str| compiled.keys[&key(namespace, name)].verdict.clone();
    assert!(verdict("gold-team", "chat").accepted && verdict("gold-team", "plain").accepted);
    assert!(verdict("batch-team", "jobs").accepted, "no class: the lowest its namespace may use");
    for (name, says) in [("sneaky", "not one this namespace may use"), ("unknown", "not one of the Gateway's classes")]
    {
        let refused = verdict("batch-team", name);
        assert_eq!((refused.accepted, refused.reason), (false, reasons::CLASS_NOT_ALLOWED), "{name}");
        assert!(refused.message.contains(says), "{name}: {}", refused.message);
    }
    let settings = &compiled.config.settings;
    assert_eq!(settings.sharing.max_wait, std::time::Duration::from_secs(2));
    assert_eq!((settings.sharing.max_queued, settings.sharing.burst_percent), (50, 25));
    assert!(settings.sharing.inference_headers);
    let tenants: Vec<(&str, u32, Option<u64>)> = settings
        .tenants
        .iter()
        .map(|t| (t.namespace.as_str(), t.weight, t.limits.and_then(|l| l.max_concurrent)))
        .collect();
    assert_eq!(tenants, [("batch-team", 1, None), ("gold-team", 4, Some(200))]);
    assert_eq!(settings.tenants[0].classes.as_deref(), Some(&["batch".to_owned()][..]));
    // Budgets: the namespace's and the key's, in the Gateway's zone and currency.
    let month = BudgetConfig { period: Period::Month, tokens: Some(50_000_000), cost: Some("1250.00".into()) };
    assert_eq!((settings.tenants[0].budgets.as_slice(), &settings.tenants[1].budgets[..]), (&[][..], &[month][..]));
    let day = BudgetConfig { period: Period::Day, tokens: Some(200_000), cost: None };
    let chat = compiled.config.keys.iter().find(|k| k.id == "gold-team/chat").unwrap();
    assert_eq!(chat.budgets, [day]);
    assert_eq!((settings.budgets.time_zone.as_str(), settings.budgets.currency.as_str()), ("Europe/Berlin", "EUR"));
    let matched: Vec<(i32, Vec<String>)> = compiled.tenants.iter().map(|t| (t.index, t.namespaces.clone())).collect();
    assert_eq!(matched, [(0, vec!["gold-team".to_owned()]), (1, vec!["batch-team".to_owned()]), (2, vec![])]);
    assert!(compiled.gateway.is_none(), "{:?}", compiled.gateway);

    // A time zone the database does not know: UTC stands in, and the Gateway says so.
    world.gateway.spec.budgets = Some(GatewayBudgets { time_zone: Some("Mars/Olympus".into()), currency: None });
    let compiled = world.compile();
    assert_eq!(compiled.config.settings.budgets.time_zone, "UTC");
    let refused = compiled.gateway.clone().expect("the Gateway names the unknown zone");
    assert!(refused.message.contains("spec.budgets.timeZone"), "{}", refused.message);
    assert!(compiled.keys[&key("gold-team", "chat")].verdict.accepted, "the keys are served in UTC");
    world.gateway.spec.budgets = None;

    // A class the Gateway lacks in a policy: ignored, and the Gateway says so.
    world.gateway.spec.tenants[1].classes.push("gold".into());
    let compiled = world.compile();
    let refused = compiled.gateway.expect("the Gateway names the unknown class");
    assert!(refused.message.contains("spec.tenants[1].classes[1]"), "{}", refused.message);
    assert!(compiled.keys[&key("batch-team", "jobs")].verdict.accepted);
}

/// `spec.tenants[].maxApiKeys`: per namespace, the oldest keys (creation
/// time, then name) are served up to the cap and each newer one is left
/// out (`TenantKeyLimit`); a key refused for another reason takes no
/// place; another namespace under the same policy counts its own keys.
#[test]
fn a_tenant_key_cap_leaves_out_the_newest_keys_of_that_namespace_only() {
    use waycast_crds::sharing::TenantPolicy;
    // (case, cap, team-a's keys as (name, created, disabled), served names)
    type Row = (&'static str, Option<i32>, &'static [(&'static str, i64, bool)], &'static [&'static str]);
    let rows: &[Row] = &[
        ("no cap", None, &[("x", 1, false), ("y", 2, false), ("z", 3, false)], &["x", "y", "z"]),
        ("newest out", Some(2), &[("z", 1, false), ("y", 2, false), ("x", 3, false)], &["y", "z"]),
        ("same time: by name", Some(2), &[("c", 5, false), ("a", 5, false), ("b", 5, false)], &["a", "b"]),
        (
            "a disabled key takes no place",
            Some(2),
            &[("d", 1, true), ("x", 2, false), ("y", 3, false), ("z", 4, false)],
            &["x", "y"],
        ),
        ("cap 0", Some(0), &[("x", 1, false)], &[]),
        ("under the cap", Some(5), &[("x", 1, false), ("y", 2, false)], &["x", "y"]),
    ];
    for (case, cap, keys, served) in rows {
        let mut world = World::quickstart();
        world.gateway = gateway("platform", GatewaySpec::default());
        world.namespaces = vec![namespace("platform", &[]), namespace("team-a", &[]), namespace("team-b", &[])];
        let all = NamespacePolicy { from: NamespaceFrom::All, selector: None };
        world.gateway.spec.api_keys = Some(RouteSelector { namespaces: Some(all.clone()), selector: None });
        world.gateway.spec.tenants =
            vec![TenantPolicy { namespaces: all, max_api_keys: *cap, ..TenantPolicy::default() }];
        let team_key = |namespace: &str, name: &str, created: i64, disabled: bool| {
            let mut key = api_key(namespace, name, ApiKeySpec { disabled, ..ApiKeySpec::default() });
            key.metadata.creation_timestamp = Some(at(created));
            key.spec.parent_refs = parent("platform", "gw");
            key
        };
        world.keys =
            keys.iter().map(|(name, created, disabled)| team_key("team-a", name, *created, *disabled)).collect();
        // team-b's key is the oldest of all, and alone in its namespace.
        world.keys.push(team_key("team-b", "only", 0, false));
        world.secrets = world
            .keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let (namespace, name) = (key.metadata.namespace.clone().unwrap(), key.metadata.name.clone().unwrap());
                key_secret(&namespace, &name, &format!("wc_{i:0>43}"))
            })
            .collect();
        let compiled = world.compile();
        let ids: Vec<&str> = compiled.config.keys.iter().map(|entry| entry.id.as_str()).collect();
        let mut expected: Vec<String> = served.iter().map(|name| format!("team-a/{name}")).collect();
        // A tenant of its own: only a cap of 0 leaves its one key out.
        let team_b_served = *cap != Some(0);
        if team_b_served {
            expected.push("team-b/only".into());
        }
        assert_eq!(ids, expected, "{case}: the config's keys");
        for (name, _, disabled) in *keys {
            let verdict = &compiled.keys[&key("team-a", name)].verdict;
            let reason = if served.contains(name) {
                reasons::KEY_READY
            } else if *disabled {
                reasons::DISABLED
            } else {
                reasons::TENANT_KEY_LIMIT
            };
            assert_eq!(verdict.reason, reason, "{case}: team-a/{name}");
            assert_eq!(verdict.accepted, served.contains(name), "{case}: team-a/{name}");
            if reason == reasons::TENANT_KEY_LIMIT {
                assert!(verdict.message.contains("spec.tenants[0].maxApiKeys"), "{case}: {}", verdict.message);
            }
        }
        assert_eq!(compiled.keys[&key("team-b", "only")].verdict.accepted, team_b_served, "{case}: team-b");
    }
}
