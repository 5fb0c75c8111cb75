//! Table tests of the status builders.

use super::*;
use waycast_mock::fixtures::objects;

#[test]
fn transition_time_moves_only_with_the_status() {
    let t1 = jiff::Timestamp::from_second(1_000).unwrap();
    let t2 = jiff::Timestamp::from_second(2_000).unwrap();
    let first = condition(&[], "Ready", true, "KeyReady", "ok", Some(1), t1);
    let same = condition(std::slice::from_ref(&first), "Ready", true, "KeyReady", "still ok", Some(2), t2);
    assert_eq!(same.last_transition_time, Time(t1));
    let flipped = condition(&[first], "Ready", false, "Expired", "gone", Some(2), t2);
    assert_eq!(flipped.last_transition_time, Time(t2));
    assert!(changed(std::slice::from_ref(&same), &[flipped]));
    assert!(!changed(std::slice::from_ref(&same), std::slice::from_ref(&same)));
}

/// One row: the facts that differ from an accepted, written, ready
/// Gateway, and the three conditions expected.
#[test]
fn gateway_status_table() {
    use crate::compile::Verdict;
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let mut gateway = crate::render::fixtures::gateway(Default::default());
    gateway.metadata.generation = Some(3);
    let refusal = Verdict { accepted: false, reason: reasons::AUTH_SECRET_MISSING, message: "no password".into() };
    let too_large = crate::render::config_parts::TooLarge::Base { gzipped: 2_000_000 };
    let refusing = [RefusingPod { pod: "gw-1".into(), reason: "bad CIDR".into(), serving: "f".repeat(64) }];
    let base = GatewayFacts {
        refused: None,
        hash: "0123456789abcdef",
        too_large: None,
        left_out: 0,
        models: 2,
        keys: 3,
        refusing: &[],
        up_to_date: 2,
        replicas: 2,
        ready: 2,
        wanted: 2,
        address: Some("10.96.0.10:80".into()),
        tenants: &[],
        identity: None,
    };
    type Row<'a> = (&'a str, GatewayFacts<'a>, [(bool, &'a str, &'a str); 3]);
    let rows: [Row<'_>; 5] = [
        (
            "accepted, written, ready",
            base.clone(),
            [
                (true, reasons::ACCEPTED, "the spec is valid"),
                (true, reasons::CONFIG_WRITTEN, "config 0123456789ab written"),
                (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
            ],
        ),
        (
            "refused spec",
            GatewayFacts { refused: Some(&refusal), ..base.clone() },
            [
                (false, reasons::AUTH_SECRET_MISSING, "no password"),
                (true, reasons::CONFIG_WRITTEN, "config 0123456789ab written"),
                (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
            ],
        ),
        (
            "config too large",
            GatewayFacts { too_large: Some(&too_large), ..base.clone() },
            [
                (true, reasons::ACCEPTED, "the spec is valid"),
                (
                    false,
                    reasons::CONFIG_ERROR,
                    "the compiled config (3 keys, 2 models) does not fit its Secrets: its models and settings are 2000000 bytes gzipped",
                ),
                (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
            ],
        ),
        (
            "a pod refuses",
            GatewayFacts { refusing: &refusing, ..base.clone() },
            [
                (true, reasons::ACCEPTED, "the spec is valid"),
                (
                    false,
                    reasons::CONFIG_REFUSED,
                    "1 pod(s) refused config 0123456789ab; gw-1 keeps serving ffffffffffff: bad CIDR",
                ),
                (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
            ],
        ),
        (
            "not enough replicas",
            GatewayFacts { ready: 1, wanted: 3, ..base.clone() },
            [
                (true, reasons::ACCEPTED, "the spec is valid"),
                (true, reasons::CONFIG_WRITTEN, "config 0123456789ab written"),
                (false, reasons::REPLICAS_NOT_READY, "1 of 3 replicas ready"),
            ],
        ),
    ];
    for (name, facts, expected) in rows {
        let status = gateway_status(&gateway, &facts, now);
        for (condition, (ok, reason, message)) in status.conditions.iter().zip(expected) {
            assert_eq!(condition.status, if ok { "True" } else { "False" }, "{name}: {condition:?}");
            assert_eq!(condition.reason, reason, "{name}");
            assert!(condition.message.starts_with(message), "{name}: {}", condition.message);
            assert_eq!(condition.observed_generation, Some(3), "{name}");
        }
        assert_eq!(status.config_hash.as_deref(), Some(facts.hash), "{name}");
        assert_eq!((status.model_count, status.api_key_count), (Some(2), Some(3)), "{name}");
        assert_eq!(status.address, facts.address, "{name}");
    }
}

#[test]
fn a_name_conflict_sets_every_condition_false_and_keeps_the_rest() {
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let mut gateway = crate::render::fixtures::gateway(Default::default());
    gateway.status = Some(GatewayStatus { config_hash: Some("kept".into()), ..GatewayStatus::default() });
    let status = gateway_name_conflict(&gateway, "ServiceAccount team/gw", now);
    assert_eq!(status.conditions.len(), 3);
    assert!(status.conditions.iter().all(|c| c.status == "False" && c.reason == reasons::NAME_CONFLICT));
    assert!(status.conditions[0].message.starts_with("ServiceAccount team/gw already exists"));
    assert_eq!(status.config_hash.as_deref(), Some("kept"));
    assert!(status_changed(gateway.status.as_ref(), &status));
    assert!(!status_changed(Some(&status), &status.clone()));
}

fn acceptance(gateway: &str, accepted: bool, reason: &str, message: &str) -> GatewayAcceptance {
    GatewayAcceptance { gateway: gateway.into(), accepted, reason: reason.into(), message: message.into() }
}

fn key_verdict(accepted: bool, reason: &'static str, message: &'static str) -> KeyVerdict {
    KeyVerdict {
        verdict: crate::compile::Verdict { accepted, reason, message: message.into() },
        key_prefix: accepted.then(|| "wc_abc".to_owned()),
        generation: None,
    }
}

/// One row: the parents' answers, and the Ready and Programmed
/// conditions and served-by list expected.
#[test]
fn api_key_status_table() {
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let mut api_key = objects::api_key("team", "alice");
    api_key.metadata.generation = Some(2);
    api_key.spec.limits =
        Some(waycast_crds::sharing::KeyLimits { requests_per_minute: Some(60), ..Default::default() });
    let served = key_verdict(true, reasons::ACCEPTED, "the key is served");
    let expired = key_verdict(false, reasons::EXPIRED, "expired at 2020-01-01");
    let refused = acceptance("ops/gw", false, reasons::NOT_ALLOWED_BY_GATEWAY, "team is not allowed");
    type Row<'a> = (
        &'a str,
        Vec<GatewayAcceptance>,
        Vec<(String, KeyVerdict)>,
        (usize, bool),
        (bool, &'a str),
        (bool, &'a str),
        Vec<&'a str>,
    );
    let rows: Vec<Row<'_>> = vec![
        ("no Gateway", vec![], vec![], (0, true), (false, reasons::NO_GATEWAY), (false, reasons::NO_GATEWAY), vec![]),
        (
            "served and programmed",
            vec![],
            vec![("team/gw".into(), served.clone())],
            (1, true),
            (true, reasons::ACCEPTED),
            (true, reasons::PROGRAMMED),
            vec!["team/gw"],
        ),
        (
            "served, pods not there yet",
            vec![],
            vec![("team/gw".into(), served.clone())],
            (1, false),
            (true, reasons::ACCEPTED),
            (false, reasons::PENDING),
            vec!["team/gw"],
        ),
        (
            "refused by its verdict",
            vec![],
            vec![("team/gw".into(), expired.clone())],
            (1, true),
            (false, reasons::EXPIRED),
            (true, reasons::PROGRAMMED),
            vec![],
        ),
        (
            "one Gateway serves it, another's verdict refuses: the serving one wins",
            vec![],
            vec![("a/gw".into(), expired), ("b/gw".into(), served)],
            (2, true),
            (true, reasons::ACCEPTED),
            (true, reasons::PROGRAMMED),
            vec!["b/gw"],
        ),
        (
            "only named by a Gateway that does not take it",
            vec![refused],
            vec![],
            (0, true),
            (false, reasons::NOT_ALLOWED_BY_GATEWAY),
            (false, reasons::NO_GATEWAY),
            vec![],
        ),
    ];
    for (name, refused, decided, programmed, ready, programmed_expected, served_by) in rows {
        let parents = refused.len() + decided.len();
        let status = api_key_status(&api_key, refused, &decided, programmed, now);
        let [ready_condition, programmed_condition] = status.conditions.as_slice() else { panic!("{name}") };
        assert_eq!((ready_condition.status == "True", ready_condition.reason.as_str()), ready, "{name}");
        assert_eq!(
            (programmed_condition.status == "True", programmed_condition.reason.as_str()),
            programmed_expected,
            "{name}"
        );
        assert_eq!(status.gateways, served_by, "{name}");
        assert_eq!(status.parents.len(), parents, "{name}: one entry per parent");
        assert_eq!(status.limits.is_some(), ready.0, "{name}: limits shown only when served");
        assert_eq!(status.key_prefix.is_some(), ready.0, "{name}");
        assert_eq!(status.secret_name.as_deref(), Some("alice-key"), "{name}");
        assert_eq!(status.observed_generation, Some(2), "{name}");
    }
}

#[test]
fn model_endpoint_status_table() {
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let mut endpoint = objects::model_endpoint("team", "llama", "");
    endpoint.metadata.generation = Some(4);
    type Row<'a> = (&'a str, Vec<GatewayAcceptance>, (bool, &'a str), (bool, &'a str));
    let rows: Vec<Row<'_>> = vec![
        ("no Gateway", vec![], (false, reasons::NO_GATEWAY), (true, reasons::RESOLVED)),
        (
            "served by two",
            vec![acceptance("b/gw", true, reasons::ACCEPTED, ""), acceptance("a/gw", true, reasons::ACCEPTED, "")],
            (true, reasons::ACCEPTED),
            (true, reasons::RESOLVED),
        ),
        (
            "a name conflict on one Gateway",
            vec![
                acceptance("a/gw", true, reasons::ACCEPTED, ""),
                acceptance("b/gw", false, reasons::MODEL_NAME_CONFLICT, "llama is taken"),
            ],
            (false, reasons::MODEL_NAME_CONFLICT),
            (true, reasons::RESOLVED),
        ),
        (
            "an unlabelled credential",
            vec![acceptance("a/gw", false, reasons::SECRET_NOT_LABELLED, "label the Secret")],
            (false, reasons::SECRET_NOT_LABELLED),
            (false, reasons::SECRET_NOT_LABELLED),
        ),
    ];
    for (name, entries, accepted, resolved) in rows {
        let count = entries.len();
        let status = model_endpoint_status(&endpoint, entries, (count, true), now);
        let [accepted_condition, resolved_condition, _] = status.conditions.as_slice() else { panic!("{name}") };
        assert_eq!((accepted_condition.status == "True", accepted_condition.reason.as_str()), accepted, "{name}");
        assert_eq!((resolved_condition.status == "True", resolved_condition.reason.as_str()), resolved, "{name}");
        let order: Vec<&str> = status.gateways.iter().map(|g| g.gateway.as_str()).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "{name}: entries sorted by Gateway");
        assert_eq!(status.observed_generation, Some(4), "{name}");
        assert!(!status_changed(Some(&status), &status.clone()), "{name}");
    }
}

/// The operator's cache keeps an ApiKey's status as a digest beside each
/// condition's type, status and time: compared with any next status it
/// says what the whole status says, and a next status carries the same
/// transition times from it.
#[test]
fn a_kept_api_key_status_compares_and_carries_over_as_the_whole_one() {
    let then = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let later = jiff::Timestamp::from_second(1_800_000_600).unwrap();
    let mut api_key = objects::api_key("team", "alice");
    api_key.metadata.generation = Some(2);
    let served = vec![("team/gw".to_owned(), key_verdict(true, reasons::ACCEPTED, "the key is served"))];
    let expired = vec![("team/gw".to_owned(), key_verdict(false, reasons::EXPIRED, "expired at 2020-01-01"))];
    let other_message = vec![("team/gw".to_owned(), key_verdict(false, reasons::EXPIRED, "expired at 2021-01-01"))];
    let refused = vec![acceptance("ops/gw", false, reasons::NOT_ALLOWED_BY_GATEWAY, "team is not allowed")];
    let mut statuses = Vec::new();
    for now in [then, later] {
        statuses.push(api_key_status(&api_key, vec![], &served, (1, true), now));
        statuses.push(api_key_status(&api_key, vec![], &served, (1, false), now));
        // Only the Programmed condition's message moves (two Gateways).
        statuses.push(api_key_status(&api_key, vec![], &served, (2, true), now));
        statuses.push(api_key_status(&api_key, vec![], &expired, (1, true), now));
        statuses.push(api_key_status(&api_key, vec![], &other_message, (1, true), now));
        statuses.push(api_key_status(&api_key, refused.clone(), &[], (0, true), now));
    }
    // Only the rest moves (another prefix), or only a condition's reason or generation.
    let mut other_prefix = statuses[0].clone();
    other_prefix.key_prefix = Some("wc_other".into());
    statuses.push(other_prefix);
    let mut other_reason = statuses[0].clone();
    other_reason.conditions[0].reason = "Another".into();
    statuses.push(other_reason);
    let mut other_generation = statuses[0].clone();
    other_generation.conditions[0].observed_generation = Some(3);
    statuses.push(other_generation);
    // A condition another writer of the status added: kept in the digest only.
    let mut with_foreign = statuses[0].clone();
    with_foreign.conditions.push(condition(&[], "Audited", true, "Audited", "by team-a's bot", None, then));
    statuses.push(with_foreign);
    let mut with_usage = statuses[0].clone();
    with_usage.usage = Some(Box::new(waycast_crds::usage::KeyUsageStatus { requests: 3, ..Default::default() }));
    statuses.push(with_usage);
    let (mut same, mut differ) = (0, 0);
    for old in &statuses {
        let kept = kept_form(old);
        let bare = ApiKeyStatus {
            conditions: kept.conditions.clone(),
            compared_digest: kept.compared_digest,
            ..ApiKeyStatus::default()
        };
        assert_eq!(kept, bare, "the rest is kept as a digest only");
        assert!(kept.conditions.iter().all(|c| c.message.is_empty() && c.reason.is_empty()));
        assert!(kept.conditions.iter().all(|c| [types::READY, types::PROGRAMMED].contains(&c.type_.as_str())));
        for new in &statuses {
            let whole = status_changed(Some(old), new);
            assert_eq!(status_changed(Some(&kept), new), whole, "{old:?} → {new:?}");
            if whole { differ += 1 } else { same += 1 }
        }
        // What a next status carries over from the kept one.
        let mut from_whole = api_key.clone();
        from_whole.status = Some(old.clone());
        let mut from_kept = api_key.clone();
        from_kept.status = Some(kept);
        for decided in [&served, &expired] {
            let a =
                api_key_status(&from_whole, vec![], decided, (1, true), later + jiff::SignedDuration::from_secs(60));
            let b = api_key_status(&from_kept, vec![], decided, (1, true), later + jiff::SignedDuration::from_secs(60));
            assert_eq!(a, b);
        }
    }
    assert!(same > statuses.len() && differ > 0, "the pairs cover both answers: {same} same, {differ} differ");
}

/// A grant in `team` naming `platform/gw`, at generation 5.
fn access_grant() -> AccessGrant {
    let spec = waycast_crds::AccessGrantSpec {
        parent_refs: vec![waycast_crds::common::ParentReference {
            name: "gw".into(),
            namespace: Some("platform".into()),
        }],
        provider: "corp".into(),
        groups: vec!["ml".into()],
        ..waycast_crds::AccessGrantSpec::default()
    };
    let mut grant = AccessGrant::new("ml", spec);
    grant.metadata.namespace = Some("team".into());
    grant.metadata.generation = Some(5);
    grant
}

/// The parent entry `platform/gw` gives a grant of `team` when the
/// Gateway's `modelEndpoints` rules admit every namespace and its `apiKeys`
/// rules (grants') only its own: grants are selected by the latter.
fn not_admitted_grant() -> GatewayAcceptance {
    use waycast_crds::gateway::{NamespaceFrom, NamespacePolicy, RouteSelector};
    let mut gateway = waycast_mock::fixtures::objects::gateway("platform", "gw");
    let all = NamespacePolicy { from: NamespaceFrom::All, selector: None };
    gateway.spec.model_endpoints = Some(RouteSelector { namespaces: Some(all), selector: None });
    gateway.spec.api_keys = None;
    let grant = access_grant();
    let parents = crate::compile::select::parents(
        &[&gateway],
        crate::compile::select::Kind::AccessGrants,
        "team",
        &Default::default(),
        &grant.spec.parent_refs,
        &[],
    );
    assert!(parents.admitted.is_empty());
    let [refused] = &parents.refused[..] else { panic!("{:?}", parents.refused) };
    assert!(refused.message.contains("spec.apiKeys"), "{}", refused.message);
    refused.clone()
}

/// One row: the parents' answers and what they compiled to, and the
/// `Accepted` and `Programmed` conditions expected.
#[test]
fn access_grant_status_table() {
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let grant = access_grant();
    type Row<'a> = (&'a str, Vec<GatewayAcceptance>, (usize, bool), (bool, &'a str), (bool, &'a str));
    let rows: Vec<Row<'_>> = vec![
        ("no Gateway", vec![], (0, true), (false, reasons::NO_GATEWAY), (false, reasons::NO_GATEWAY)),
        (
            "accepted and programmed",
            vec![acceptance("platform/gw", true, reasons::ACCEPTED, "the grant is served")],
            (1, true),
            (true, reasons::ACCEPTED),
            (true, reasons::PROGRAMMED),
        ),
        (
            "accepted, the pods not there yet",
            vec![acceptance("platform/gw", true, reasons::ACCEPTED, "the grant is served")],
            (1, false),
            (true, reasons::ACCEPTED),
            (false, reasons::PENDING),
        ),
        (
            "a provider the Gateway does not trust",
            vec![acceptance("platform/gw", false, reasons::UNKNOWN_PROVIDER, "the Gateway trusts no \"corp\"")],
            (1, false),
            (false, reasons::UNKNOWN_PROVIDER),
            (false, reasons::PENDING),
        ),
        (
            "a class its namespace may not use, beside a Gateway serving it",
            vec![
                acceptance("b/gw", true, reasons::ACCEPTED, "the grant is served"),
                acceptance("a/gw", false, reasons::CLASS_NOT_ALLOWED, "class gold"),
            ],
            (2, false),
            (false, reasons::CLASS_NOT_ALLOWED),
            (false, reasons::PENDING),
        ),
        (
            "named, not admitted",
            vec![not_admitted_grant()],
            (0, true),
            (false, reasons::NOT_ALLOWED_BY_GATEWAY),
            (false, reasons::NO_GATEWAY),
        ),
    ];
    for (name, parents, programmed, accepted, programmed_expected) in rows {
        let sent = parents.clone();
        let status = access_grant_status(&grant, parents, programmed, now);
        let [accepted_condition, programmed_condition] = status.conditions.as_slice() else { panic!("{name}") };
        assert_eq!(accepted_condition.type_, types::ACCEPTED, "{name}");
        assert_eq!((accepted_condition.status == "True", accepted_condition.reason.as_str()), accepted, "{name}");
        assert_eq!(programmed_condition.type_, types::PROGRAMMED, "{name}");
        assert_eq!(
            (programmed_condition.status == "True", programmed_condition.reason.as_str()),
            programmed_expected,
            "{name}"
        );
        // Every parent listed, by Gateway, as it answered.
        let mut expected = sent;
        expected.sort_by(|a, b| a.gateway.cmp(&b.gateway));
        assert_eq!(status.parents, expected, "{name}");
        if let Some(refused) = status.parents.iter().find(|p| !p.accepted) {
            assert!(accepted_condition.message.starts_with(&refused.gateway), "{name}: {}", accepted_condition.message);
        }
        assert_eq!(status.observed_generation, Some(5), "{name}");
        assert!(status.conditions.iter().all(|c| c.observed_generation == Some(5)), "{name}");
        assert!(!status_changed(Some(&status), &status.clone()), "{name}");
    }
}
