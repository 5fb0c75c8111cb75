//! Upstream credentials and backend TLS: opted-in Secrets only, read within a size.

use super::*;

#[test]
fn upstream_credentials_go_into_headers() {
    let mut world = World::quickstart();
    world.secrets.push(credential("demo", "openai", "api-key", "sk-upstream\n"));
    let auth = |header: Option<&str>| BackendAuth {
        secret_ref: SecretKeyRef { name: "openai".into(), key: "api-key".into() },
        header: header.map(Into::into),
        style: None,
    };
    let mut openai = model_endpoint(
        "demo",
        "gpt",
        10,
        "gpt-4o",
        vec![Backend { url: Some("https://api.openai.com/v1".into()), auth: Some(auth(None)), ..Backend::default() }],
    );
    openai.spec.backends.push(Backend {
        url: Some("https://proxy.example/v1".into()),
        auth: Some(auth(Some("X-Api-Key"))),
        weight: Some(0),
        ..Backend::default()
    });
    world.models.push(openai);
    let compiled = world.compile();
    let route = compiled.config.models.iter().find(|m| m.name == "gpt-4o").unwrap();
    assert_eq!(
        route.backends[0].headers,
        BTreeMap::from([("authorization".to_owned(), "Bearer sk-upstream".to_owned())])
    );
    assert_eq!(route.backends[1].headers, BTreeMap::from([("x-api-key".to_owned(), "sk-upstream".to_owned())]));
    assert_eq!(route.backends[1].weight, 0);
}

/// Anthropic's and Azure OpenAI's ways of sending a credential, and the
/// format a backend speaks, compiled into the config.
#[test]
fn provider_auth_styles_and_formats_are_compiled() {
    use waycast_crds::backend::{AuthStyle, BackendFormat};
    let mut world = World::quickstart();
    world.secrets.push(credential("demo", "provider", "key", "sk-provider\n"));
    let backend = |url: &str, style: AuthStyle, format: Option<BackendFormat>| Backend {
        url: Some(url.into()),
        auth: Some(BackendAuth {
            secret_ref: SecretKeyRef { name: "provider".into(), key: "key".into() },
            header: None,
            style: Some(style),
        }),
        format,
        ..Backend::default()
    };
    let mut claude = model_endpoint(
        "demo",
        "claude",
        10,
        "claude",
        vec![backend("https://api.anthropic.com/v1", AuthStyle::Anthropic, Some(BackendFormat::Anthropic))],
    );
    claude.spec.backends.push(backend(
        "https://res.openai.azure.com/openai/deployments/gpt-4o?api-version=2024-10-21",
        AuthStyle::AzureOpenAI,
        None,
    ));
    world.models.push(claude);
    let compiled = world.compile();
    let route = compiled.config.models.iter().find(|m| m.name == "claude").unwrap();
    let headers = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    };
    assert_eq!(
        route.backends[0].headers,
        headers(&[("anthropic-version", "2023-06-01"), ("x-api-key", "sk-provider")])
    );
    assert_eq!(route.backends[0].format, BackendFormat::Anthropic);
    assert_eq!(route.backends[1].headers, headers(&[("api-key", "sk-provider")]));
    assert_eq!(route.backends[1].format, BackendFormat::OpenAI);
}

/// Only opted-in Secrets are sent upstream; a key Secret can never be.
#[test]
fn credentials_need_the_opt_in_label() {
    let mut world = World::quickstart();
    world.secrets.push(secret("demo", "plain", "k", "sk-plain"));
    let with_auth = |name: &str, secret: &str, key: &str| {
        let mut endpoint = model_endpoint(
            "demo",
            name,
            10,
            name,
            vec![Backend { url: Some("https://api.example.com/v1".into()), ..Backend::default() }],
        );
        endpoint.spec.backends[0].auth = Some(BackendAuth {
            secret_ref: SecretKeyRef { name: secret.into(), key: key.into() },
            header: None,
            style: None,
        });
        endpoint
    };
    // A key Secret opted in as a credential too: kept as digests, never
    // sent upstream.
    let mut both = secret("demo", "both", "k", "sk-both-labels");
    both.metadata.labels = Some(
        [(waycast_crds::api_key::KEY_SECRET_LABEL, "true"), (super::secrets::CREDENTIAL_LABEL, "true")]
            .map(|(label, value)| (label.to_owned(), value.to_owned()))
            .into(),
    );
    world.secrets.push(both);
    world.models.push(with_auth("plain", "plain", "k"));
    world.models.push(with_auth("steal", "alice-key", "api-key"));
    world.models.push(with_auth("both", "both", "k"));
    let compiled = world.compile();
    for name in ["plain", "steal", "both"] {
        let verdict = &compiled.models[&key("demo", name)];
        assert_eq!((verdict.accepted, verdict.reason), (false, reasons::SECRET_NOT_LABELLED), "{name}");
    }
    let config = String::from_utf8_lossy(&compiled.config.to_canonical_json().unwrap()).into_owned();
    assert!(!config.contains("sk-plain") && !config.contains("sk-both-labels"));
}

/// TLS to a Service backend: https to the Service's DNS name, through its
/// endpoints, with PEMs from opted-in Secrets only; priority carried over.
#[test]
fn backend_tls_reads_opted_in_secrets_and_serves_the_service_over_https() {
    let mut world = World::quickstart();
    let (ca_pem, cert_pem, key_pem) = waycast_mock::pki::pem_ca_and_client().unwrap();
    world.secrets.push(credential("demo", "models-ca", "ca.crt", &ca_pem));
    let mut pair = credential("demo", "gateway-client", "tls.crt", &cert_pem);
    pair.data.get_or_insert_with(BTreeMap::new).insert("tls.key".into(), ByteString(key_pem.as_bytes().to_vec()));
    world.secrets.push(pair);
    world.secrets.push(secret("demo", "unlabelled-ca", "ca.crt", "OTHER CA"));
    let tls = |ca: &str| waycast_crds::common::ClientTls {
        ca_secret_ref: Some(SecretKeyRef { name: ca.into(), key: "ca.crt".into() }),
        client_cert_secret_ref: Some(waycast_crds::common::SecretRef { name: "gateway-client".into() }),
        server_name: None,
    };
    world.models[0].spec.backends[0].tls = Some(tls("models-ca"));
    world.models[0].spec.backends[0].priority = Some(2);
    let mut refused = model_endpoint("demo", "unlabelled", 20, "u", vec![service_backend("vllm", 8000)]);
    refused.spec.backends[0].tls = Some(tls("unlabelled-ca"));
    world.models.push(refused);
    let compiled = world.compile();
    let backend = &compiled.config.models[0].backends[0];
    assert_eq!(backend.url, "https://vllm.demo.svc:8000/v1");
    assert_eq!(backend.endpoints.as_deref(), Some("demo/vllm:8000"));
    assert_eq!(backend.priority, 2);
    let pems = backend.tls.as_ref().unwrap();
    assert_eq!(
        (pems.ca_pem.as_deref(), pems.client_cert_pem.as_deref(), pems.client_key_pem.as_deref()),
        (Some(ca_pem.as_str()), Some(cert_pem.as_str()), Some(key_pem.as_str()))
    );
    let verdict = &compiled.models[&key("demo", "unlabelled")];
    assert_eq!((verdict.accepted, verdict.reason), (false, reasons::SECRET_NOT_LABELLED));
    assert!(verdict.message.contains("spec.backends[0].tls.caSecretRef"), "{}", verdict.message);
    assert!(!format!("{:?}", compiled.config).contains("KEY PEM"), "the key never reaches Debug output");
}

/// A referenced Secret over the size the operator reads is refused by name
/// (its data never read); every other object is served.
#[test]
fn an_object_naming_a_secret_too_large_to_read_is_refused_alone() {
    let mut world = World::quickstart();
    world.keys.push(api_key("demo", "bob", ApiKeySpec::default()));
    world.secrets.push(key_secret("demo", "bob", KEY_A));
    let mut endpoint = model_endpoint(
        "demo",
        "external",
        10,
        "external",
        vec![Backend { url: Some("https://api.example.com/v1".into()), ..Backend::default() }],
    );
    endpoint.spec.backends[0].auth = Some(BackendAuth {
        secret_ref: SecretKeyRef { name: "huge".into(), key: "k".into() },
        header: None,
        style: None,
    });
    world.models.push(endpoint);
    world.secrets.push(credential("demo", "huge", "k", "sk-whatever"));
    let mut catalog =
        Catalog::from_objects(&world.namespaces, &world.models, &world.keys, &world.services, &world.secrets);
    let referenced = catalog.with_inputs(&world.gateway, referenced_secrets);
    assert!(referenced.contains(&("demo".to_owned(), "bob-key".to_owned())), "{referenced:?}");
    assert!(referenced.contains(&("demo".to_owned(), "huge".to_owned())), "{referenced:?}");
    catalog.too_large = [("demo".to_owned(), "bob-key".to_owned()), ("demo".to_owned(), "huge".to_owned())].into();
    let compiled = catalog.compile(&world.gateway, now());
    assert_eq!(compiled.keys[&key("demo", "bob")].verdict.reason, reasons::SECRET_TOO_LARGE);
    assert_eq!(compiled.models[&key("demo", "external")].reason, reasons::SECRET_TOO_LARGE);
    assert!(compiled.keys[&key("demo", "alice")].verdict.accepted);
    assert!(compiled.models[&key("demo", "llama")].accepted);
}
