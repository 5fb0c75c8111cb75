//! ApiKeys: their verdicts, duplicates and the key Secrets they own.

use super::*;

#[test]
fn key_verdicts() {
    let mut world = World::quickstart();
    let user_key = |name: &str| ApiKeySpec {
        secret_ref: Some(SecretKeyRef { name: name.into(), key: "key".into() }),
        ..ApiKeySpec::default()
    };
    world.secrets.push(secret("demo", "short", "key", "too-short"));
    world.secrets.push(secret("demo", "partner", "key", KEY_B));
    world.secrets.push(secret("demo", "same-as-alice", "key", KEY_A));
    world.secrets.push(key_secret("demo", "off", KEY_B));
    world.secrets.push(key_secret("demo", "old", "wc_cccccccccccccccccccccccccccccccccccccccccccc"));
    world.keys.extend([
        api_key("demo", "missing", ApiKeySpec::default()),
        api_key("demo", "short", user_key("short")),
        api_key(
            "demo",
            "partner",
            ApiKeySpec {
                limits: Some(KeyLimits { requests_per_minute: Some(60), ..KeyLimits::default() }),
                ..user_key("partner")
            },
        ),
        api_key("demo", "same-as-alice", user_key("same-as-alice")),
        api_key("demo", "off", ApiKeySpec { disabled: true, ..ApiKeySpec::default() }),
        api_key("demo", "old", ApiKeySpec { expires_at: Some(at(1_000)), ..ApiKeySpec::default() }),
    ]);
    let compiled = world.compile();
    let reason = |name: &str| compiled.keys[&key("demo", name)].verdict.reason;
    assert_eq!(reason("missing"), reasons::SECRET_MISSING);
    assert_eq!(reason("short"), reasons::KEY_TOO_SHORT);
    assert_eq!(reason("partner"), reasons::KEY_READY);
    assert_eq!(reason("same-as-alice"), reasons::DUPLICATE_KEY);
    assert_eq!(reason("off"), reasons::DISABLED);
    assert_eq!(reason("old"), reasons::EXPIRED);
    let served: Vec<&str> = compiled.config.keys.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(served, ["demo/alice", "demo/partner"]);
    assert_eq!(compiled.config.keys[1].limits.unwrap().requests_per_minute, Some(60));
}

/// Of two ApiKeys holding the same key text, the older is served, whatever
/// their names; the config still lists keys in name order.
#[test]
fn a_duplicate_key_is_decided_by_age_not_by_name() {
    let mut world = World::quickstart();
    let shared = "wc_dddddddddddddddddddddddddddddddddddddddddddd";
    world.secrets.push(secret("demo", "a-new", "key", shared));
    world.secrets.push(secret("demo", "z-old", "key", shared));
    let user_key = |name: &str, created: i64| {
        let mut api_key = api_key(
            "demo",
            name,
            ApiKeySpec {
                secret_ref: Some(SecretKeyRef { name: name.into(), key: "key".into() }),
                ..ApiKeySpec::default()
            },
        );
        api_key.metadata.creation_timestamp = Some(at(created));
        api_key
    };
    world.keys.extend([user_key("a-new", 9_000), user_key("z-old", 1_000)]);
    let compiled = world.compile();
    assert_eq!(compiled.keys[&key("demo", "z-old")].verdict.reason, reasons::KEY_READY);
    assert_eq!(compiled.keys[&key("demo", "a-new")].verdict.reason, reasons::DUPLICATE_KEY);
    let served: Vec<&str> = compiled.config.keys.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(served, ["demo/alice", "demo/z-old"]);
}

#[test]
fn a_key_secret_the_api_key_does_not_own_is_not_used() {
    let labelled = |mut secret: Secret| {
        secret.metadata.labels = Some([(waycast_crds::api_key::KEY_SECRET_LABEL.to_owned(), "true".to_owned())].into());
        secret
    };
    let owned_by = |uid: &str, controller: bool| {
        let mut secret = secret("demo", "alice-key", "api-key", &format!("  {KEY_A}\n"));
        secret.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            uid: uid.into(),
            controller: Some(controller),
            ..Default::default()
        }]);
        secret
    };
    // As read, and as the operator keeps a labelled one (its digests).
    for foreign in [
        secret("demo", "alice-key", "api-key", KEY_A),
        labelled(secret("demo", "alice-key", "api-key", KEY_A)),
        labelled(owned_by("uid-mallory", true)),
        labelled(owned_by("uid-alice", false)),
        owned_by("uid-alice", false),
    ] {
        let mut world = World::quickstart();
        world.secrets = vec![foreign];
        let compiled = world.compile();
        assert_eq!(compiled.keys[&key("demo", "alice")].verdict.reason, reasons::SECRET_NOT_OWNED);
        assert!(compiled.config.keys.is_empty());
    }
    // Its own, as read and as kept: the text trimmed either way.
    for own in [owned_by("uid-alice", true), labelled(owned_by("uid-alice", true))] {
        let mut world = World::quickstart();
        world.secrets = vec![own];
        let compiled = world.compile();
        assert_eq!(compiled.keys[&key("demo", "alice")].verdict.reason, reasons::KEY_READY);
        assert_eq!(compiled.config.keys[0].sha256, waycast_crds::digest::sha256_hex(KEY_A.as_bytes()));
    }
}
