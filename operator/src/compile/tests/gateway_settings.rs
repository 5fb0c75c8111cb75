//! The Gateway's own settings: limits, logging, Redis, telemetry.

use super::*;

#[test]
fn gateway_settings_reach_the_config() {
    let mut world = World::quickstart();
    world.gateway.spec.limits =
        Some(waycast_crds::gateway::GatewayLimits { max_request_body_bytes: Some(1024), max_connections: None });
    world.gateway.spec.logging = Some(waycast_crds::gateway::GatewayLogging { level: None, access_log: Some(false) });
    let settings = world.compile().config.settings;
    assert_eq!((settings.max_request_body_bytes, settings.access_log), (1024, false));
}

#[test]
fn redis_counting_reaches_the_config_with_its_password_or_the_gateway_says_why_not() {
    use waycast_crds::gateway::{FailureMode, GatewayRateLimit, RedisRateLimit};
    let mut world = World::quickstart();
    world.gateway.spec.rate_limit = Some(GatewayRateLimit {
        redis: Some(RedisRateLimit {
            address: "redis.infra:6379".into(),
            password_secret_ref: Some(SecretKeyRef { name: "redis".into(), key: "password".into() }),
            username: Some("limiter".into()),
            timeout: Some("50ms".into()),
            tls: None,
        }),
        failure_mode: Some(FailureMode::Closed),
    });
    assert_eq!(
        secrets::redis_secrets(&world.gateway),
        vec![("demo".to_owned(), "redis".to_owned())],
        "the shell fetches the password Secret"
    );

    let missing = world.compile();
    assert_eq!(missing.config.settings.redis, None, "no password: the pods keep counting their shares");
    let refused = missing.gateway.expect("the Gateway says why");
    assert_eq!(refused.reason, reasons::AUTH_SECRET_MISSING);
    assert!(refused.message.contains("demo/redis"), "{}", refused.message);

    world.secrets.push(secret("demo", "redis", "password", "s3cret\n"));
    let compiled = world.compile();
    assert_eq!(compiled.gateway, None);
    assert_eq!(
        compiled.config.settings.redis,
        Some(RedisConfig {
            address: "redis.infra:6379".into(),
            password: Some("s3cret".into()),
            username: Some("limiter".into()),
            timeout: std::time::Duration::from_millis(50),
            fail_closed: true,
            tls: None,
            key_prefix: Some("waycast:demo/gw:".into()),
        })
    );

    // TLS: the CA and the client pair come from the Gateway's namespace,
    // each named in the refusal while missing.
    let redis = world.gateway.spec.rate_limit.as_mut().and_then(|limits| limits.redis.as_mut()).unwrap();
    redis.tls = Some(waycast_crds::common::ClientTls {
        ca_secret_ref: Some(SecretKeyRef { name: "redis-ca".into(), key: "ca.crt".into() }),
        client_cert_secret_ref: Some(waycast_crds::common::SecretRef { name: "redis-client".into() }),
        server_name: Some("redis.infra.svc".into()),
    });
    assert_eq!(
        secrets::redis_secrets(&world.gateway),
        ["redis", "redis-ca", "redis-client"].map(|name| ("demo".to_owned(), name.to_owned())).to_vec()
    );
    let refused = world.compile().gateway.expect("the CA is missing");
    assert!(
        refused.message.contains("tls.caSecretRef") && refused.message.contains("demo/redis-ca"),
        "{}",
        refused.message
    );
    world.secrets.push(secret("demo", "redis-ca", "ca.crt", "CA PEM"));
    let refused = world.compile().gateway.expect("the client pair is missing");
    assert!(refused.message.contains("tls.clientCertSecretRef"), "{}", refused.message);
    let mut pair = secret("demo", "redis-client", "tls.crt", "CERT PEM");
    pair.data.as_mut().unwrap().insert("tls.key".into(), k8s_openapi::ByteString(b"KEY PEM".to_vec()));
    world.secrets.push(pair);
    let compiled = world.compile();
    assert_eq!(compiled.gateway, None);
    let tls = compiled.config.settings.redis.and_then(|redis| redis.tls).unwrap();
    assert_eq!(tls.ca_pem.as_deref(), Some("CA PEM"));
    assert_eq!(tls.client_cert_pem.as_deref(), Some("CERT PEM"));
    assert_eq!(tls.client_key_pem.as_deref(), Some("KEY PEM"));
    assert_eq!(tls.server_name.as_deref(), Some("redis.infra.svc"));
}

#[test]
fn telemetry_reaches_the_config_with_its_headers_or_the_gateway_says_why_not() {
    use waycast_crds::telemetry::{GatewayTelemetry, Ratio};
    let mut world = World::quickstart();
    world.gateway.spec.telemetry = Some(GatewayTelemetry {
        endpoint: "http://otel-collector.observability:4318".into(),
        sampling: Some(0.25),
        headers_secret_ref: Some(waycast_crds::common::SecretRef { name: "otlp-auth".into() }),
        resource_attributes: [("deployment.environment".to_owned(), "prod".to_owned())].into(),
        trust_client_trace_context: Some(false),
        honor_client_sampling: Some(true),
        usage_logs: None,
    });
    assert!(secrets::redis_secrets(&world.gateway).contains(&("demo".to_owned(), "otlp-auth".to_owned())));
    let missing = world.compile();
    assert_eq!(missing.config.settings.telemetry, None, "nothing is sent without its headers");
    let refused = missing.gateway.expect("the Gateway says why");
    assert_eq!(refused.reason, reasons::AUTH_SECRET_MISSING);

    world.secrets.push(secret("demo", "otlp-auth", "Authorization", "Bearer t0ken\n"));
    let compiled = world.compile();
    assert_eq!(compiled.gateway, None);
    let telemetry = compiled.config.settings.telemetry.unwrap();
    assert_eq!(telemetry.endpoint, "http://otel-collector.observability:4318");
    assert_eq!(
        (telemetry.sampling, telemetry.trust_client_trace_context, telemetry.usage_logs),
        (Ratio(0.25), false, true)
    );
    assert!(telemetry.honor_client_sampling, "the Gateway's opt-in reaches the pods");
    assert_eq!(telemetry.headers, [("authorization".to_owned(), "Bearer t0ken".to_owned())].into());
    assert_eq!(telemetry.resource_attributes["deployment.environment"], "prod");

    // A header value that is not one is refused without showing it.
    world.secrets.retain(|s| s.metadata.name.as_deref() != Some("otlp-auth"));
    world.secrets.push(secret("demo", "otlp-auth", "authorization", "line\nbreak-s3cret"));
    let refused = world.compile().gateway.expect("refused");
    assert_eq!(refused.reason, reasons::INVALID);
    assert!(!refused.message.contains("s3cret"), "{}", refused.message);
}
