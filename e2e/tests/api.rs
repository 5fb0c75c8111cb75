//! The waycast.dev API against a real API server: the CRDs install, every
//! example applies, bad objects are refused with a message that names the
//! problem, and `kubectl explain` documents every field.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, CustomResourceExt as _};
use serde_json::{Value, json};
use waycast_crds::{AccessGrant, ApiKey, Gateway, ModelEndpoint};
use waycast_e2e::control_plane::k8s_binary;
use waycast_e2e::harness::{SharedCluster, shared_cluster, test_namespace};
use waycast_e2e::manifest;

fn cluster() -> &'static SharedCluster {
    shared_cluster(env!("CARGO_BIN_EXE_waycast-cluster"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e/ has a parent").to_path_buf()
}

fn kubectl(args: &[&str]) -> String {
    let output = Command::new(k8s_binary("kubectl").expect("kubectl is built"))
        .args(args)
        .env("KUBECONFIG", &cluster().kubeconfig)
        .output()
        .expect("kubectl runs");
    assert!(output.status.success(), "kubectl {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn committed_crds_install_and_become_established() {
    let client = cluster().client().await;
    for entry in std::fs::read_dir(repo_root().join("crds/yaml")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for object in manifest::parse_documents(&text).unwrap() {
            manifest::apply(&client, &object, "default").await.unwrap();
        }
    }
    for name in
        ["gateways.waycast.dev", "modelendpoints.waycast.dev", "apikeys.waycast.dev", "accessgrants.waycast.dev"]
    {
        manifest::wait_established(&client, name, std::time::Duration::from_secs(30)).await.unwrap();
    }
    // Short names and the shared category resolve through discovery.
    let resources = kubectl(&["api-resources", "--api-group=waycast.dev", "--no-headers"]);
    for expected in ["apikeys  ", "ak ", "gateways ", "wgw ", "modelendpoints ", "me ", "accessgrants ", "ag "] {
        assert!(resources.contains(expected.trim_end()), "missing {expected:?} in:\n{resources}");
    }
    let namespace = test_namespace(&client, "category").await.unwrap();
    let quickstart = std::fs::read_to_string(repo_root().join("examples/quickstart/quickstart.yaml")).unwrap();
    manifest::apply_all(&client, &manifest::parse_documents(&quickstart).unwrap(), &namespace).await.unwrap();
    let listed = kubectl(&["get", "waycast", "-n", &namespace, "-o", "name"]);
    for expected in
        ["gateway.waycast.dev/gateway", "modelendpoint.waycast.dev/llama-3-1-8b", "apikey.waycast.dev/alice"]
    {
        assert!(listed.contains(expected), "`kubectl get waycast` lacks {expected}:\n{listed}");
    }
    // Printer columns are what `kubectl get` shows.
    let table = kubectl(&["get", "wgw,me,ak", "-n", &namespace]);
    for column in ["READY", "PODS", "MODELS", "KEYS", "ADDRESS", "MODEL", "BACKENDS", "ACCEPTED", "PREFIX", "EXPIRES"] {
        assert!(table.contains(column), "no {column} column in:\n{table}");
    }
    let identity = std::fs::read_to_string(repo_root().join("examples/identity/identity.yaml")).unwrap();
    manifest::apply_all(&client, &manifest::parse_documents(&identity).unwrap(), &namespace).await.unwrap();
    let listed = kubectl(&["get", "waycast", "-n", &namespace, "-o", "name"]);
    assert!(listed.contains("accessgrant.waycast.dev/ml-research"), "`kubectl get waycast` lacks grants:\n{listed}");
    let table = kubectl(&["get", "ag", "-n", &namespace]);
    for column in ["PROVIDER", "ACCEPTED", "PROGRAMMED", "AGE", "corp", "cluster"] {
        assert!(table.contains(column), "no {column} in:\n{table}");
    }
}

#[tokio::test]
async fn every_example_applies() {
    let client = cluster().client().await;
    // The ArgoCD examples are checked against ArgoCD's real Application CRD,
    // fetched from the argo-cd module by the project's script.
    let argocd_crds = script_output("e2e/scripts/fetch-argocd-crds.sh");
    let application_crd = std::fs::read_to_string(Path::new(argocd_crds.trim()).join("application-crd.yaml")).unwrap();
    for object in manifest::parse_documents(&application_crd).unwrap() {
        manifest::apply(&client, &object, "default").await.unwrap();
    }
    manifest::wait_established(&client, "applications.argoproj.io", std::time::Duration::from_secs(30)).await.unwrap();
    let argocd_namespace =
        manifest::parse_documents("apiVersion: v1\nkind: Namespace\nmetadata: {name: argocd}").unwrap();
    manifest::apply_all(&client, &argocd_namespace, "default").await.unwrap();
    let mut applied = 0;
    let mut files = example_files();
    // The health checks ship with the chart as an argocd-cm patch: a real ConfigMap.
    files.push(repo_root().join(waycast_e2e::argocd::HEALTH_CHECKS));
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        if path.ends_with("standalone/gateway.yaml") {
            // Not a Kubernetes object: the config format the gateway reads.
            waycast_crds::GatewayConfig::from_slice(text.as_bytes())
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            continue;
        }
        let namespace = test_namespace(&client, "examples").await.unwrap();
        let objects = manifest::parse_documents(&text).unwrap();
        manifest::apply_all(&client, &objects, &namespace)
            .await
            .unwrap_or_else(|error| panic!("{} does not apply: {error:#}", path.display()));
        applied += objects.len();
    }
    assert!(applied >= 18, "expected every example to contribute objects, applied {applied}");
}

/// Runs one of the project's scripts and returns what it printed.
fn script_output(script: &str) -> String {
    let output = Command::new("bash").arg(repo_root().join(script)).output().expect("bash runs");
    assert!(output.status.success(), "{script} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn example_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![repo_root().join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 6, "examples/ should hold every documented example: {files:?}");
    files
}

/// One object the API server must refuse, and words its message must have.
struct Refusal {
    what: &'static str,
    kind: ApiResource,
    spec: Value,
    expected: &'static [&'static str],
}

fn refusals() -> Vec<Refusal> {
    let gateway = ApiResource::erase::<Gateway>(&());
    let model = ApiResource::erase::<ModelEndpoint>(&());
    let key = ApiResource::erase::<ApiKey>(&());
    let grant = ApiResource::erase::<AccessGrant>(&());
    let corp = json!({"name": "corp", "issuer": "https://sso.example.com/realms/corp", "audiences": ["waycast"]});
    let service = json!({"name": "vllm", "port": 8000});
    vec![
        Refusal {
            what: "backend with both service and url",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"service": service, "url": "http://x:8000/v1"}]}),
            expected: &["spec.backends[0]", "a backend needs exactly one of service or url"],
        },
        Refusal {
            what: "backend with neither service nor url",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"weight": 1}]}),
            expected: &["spec.backends[0]", "a backend needs exactly one of service or url"],
        },
        Refusal {
            what: "service port 0",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"service": {"name": "vllm", "port": 0}}]}),
            expected: &["spec.backends[0].service.port", "greater than or equal to 1"],
        },
        Refusal {
            what: "empty model name",
            kind: model.clone(),
            spec: json!({"model": "", "backends": [{"service": service}]}),
            expected: &["spec.model", "at least 1 chars long"],
        },
        Refusal {
            what: "no backends",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": []}),
            expected: &["spec.backends", "at least 1 items"],
        },
        Refusal {
            what: "url with another scheme",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"url": "ftp://files.example.com/v1"}]}),
            expected: &["spec.backends[0].url", "url must be an absolute http:// or https:// URL"],
        },
        Refusal {
            what: "malformed timeout",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"service": service}], "timeouts": {"connect": "5 seconds"}}),
            expected: &["spec.timeouts.connect", "should match"],
        },
        Refusal {
            what: "alias repeating the model name",
            kind: model.clone(),
            spec: json!({"model": "m", "aliases": ["m"], "backends": [{"service": service}]}),
            expected: &["aliases must not repeat the model name"],
        },
        Refusal {
            what: "a status that is not an endpoint's failure in retryOnStatus",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"service": service}], "loadBalancing": {"retryOnStatus": [503, 501]}}),
            expected: &["spec.loadBalancing.retryOnStatus", "retryOnStatus may list only 429, 500, 502, 503 and 504"],
        },
        Refusal {
            what: "only zero-weight backends",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"service": service, "weight": 0}]}),
            expected: &["at least one backend needs a weight above 0"],
        },
        Refusal {
            what: "minReplicas above maxReplicas",
            kind: gateway.clone(),
            spec: json!({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}),
            expected: &["spec.autoscaling", "minReplicas must not exceed maxReplicas"],
        },
        Refusal {
            what: "replicas together with autoscaling",
            kind: gateway.clone(),
            spec: json!({"replicas": 2, "autoscaling": {"maxReplicas": 4}}),
            expected: &["set either replicas or autoscaling, not both"],
        },
        Refusal {
            what: "unknown namespaces.from",
            kind: gateway.clone(),
            spec: json!({"modelEndpoints": {"namespaces": {"from": "Everywhere"}}}),
            expected: &["spec.modelEndpoints.namespaces.from", "Unsupported value: \"Everywhere\"", "\"Selector\""],
        },
        Refusal {
            what: "Selector without a selector",
            kind: gateway.clone(),
            spec: json!({"apiKeys": {"namespaces": {"from": "Selector"}}}),
            expected: &["spec.apiKeys.namespaces", "namespaces.selector is required when from is Selector"],
        },
        Refusal {
            what: "service port out of range",
            kind: gateway.clone(),
            spec: json!({"service": {"port": 70000}}),
            expected: &["spec.service.port", "less than or equal to 65535"],
        },
        Refusal {
            what: "expiresAt that is not a date",
            kind: key.clone(),
            spec: json!({"expiresAt": "next tuesday"}),
            expected: &["spec.expiresAt", "date-time"],
        },
        Refusal {
            what: "negative limit",
            kind: key.clone(),
            spec: json!({"limits": {"requestsPerMinute": -5}}),
            expected: &["spec.limits.requestsPerMinute", "greater than or equal to 1"],
        },
        Refusal {
            what: "limits without any limit",
            kind: key.clone(),
            spec: json!({"limits": {}}),
            expected: &["limits must set requestsPerMinute, tokensPerMinute or maxConcurrent"],
        },
        Refusal {
            what: "no concurrency at all",
            kind: key.clone(),
            spec: json!({"limits": {"maxConcurrent": 0}}),
            expected: &["spec.limits.maxConcurrent", "greater than or equal to 1"],
        },
        Refusal {
            what: "a class that is not a label",
            kind: key.clone(),
            spec: json!({"class": "Gold Class"}),
            expected: &["spec.class"],
        },
        Refusal {
            what: "a capacity of nothing",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"service": service}], "capacity": {"maxInFlightPerEndpoint": 0}}),
            expected: &["spec.capacity.maxInFlightPerEndpoint", "greater than or equal to 1"],
        },
        Refusal {
            what: "a price in floating point",
            kind: model.clone(),
            spec: json!({"model": "m", "backends": [{"service": service}],
                         "pricing": {"currency": "USD", "inputPerMillionTokens": "1e-3", "outputPerMillionTokens": "0.60"}}),
            expected: &["spec.pricing.inputPerMillionTokens"],
        },
        Refusal {
            what: "a budget of nothing",
            kind: key.clone(),
            spec: json!({"budgets": [{"period": "Day"}]}),
            expected: &["a budget sets tokens, cost or both"],
        },
        Refusal {
            what: "a budget in floating point",
            kind: key.clone(),
            spec: json!({"budgets": [{"period": "Month", "cost": "5e1"}]}),
            expected: &["spec.budgets[0].cost"],
        },
        Refusal {
            what: "a budget past a billion",
            kind: key.clone(),
            spec: json!({"budgets": [{"period": "Month", "cost": "5000000000"}]}),
            expected: &["spec.budgets[0].cost"],
        },
        Refusal {
            what: "a budget of a year",
            kind: key.clone(),
            spec: json!({"budgets": [{"period": "Year", "tokens": 5}]}),
            expected: &["spec.budgets[0].period", "Unsupported value"],
        },
        Refusal {
            what: "a currency that is not a code",
            kind: gateway.clone(),
            spec: json!({"budgets": {"currency": "usd"}}),
            expected: &["spec.budgets.currency"],
        },
        Refusal {
            what: "a team's weight of zero",
            kind: gateway.clone(),
            spec: json!({"tenants": [{"namespaces": {"from": "All"}, "weight": 0}]}),
            expected: &["spec.tenants[0].weight", "greater than or equal to 1"],
        },
        Refusal {
            what: "a grant with no subjects",
            kind: grant.clone(),
            spec: json!({"provider": "corp", "models": ["llama-*"]}),
            expected: &["a grant needs at least one subject: groups, users or serviceAccounts"],
        },
        Refusal {
            what: "a grant with an empty group list",
            kind: grant.clone(),
            spec: json!({"provider": "corp", "groups": []}),
            expected: &["spec.groups", "at least 1 items"],
        },
        Refusal {
            what: "a grant's ServiceAccount without its namespace",
            kind: grant.clone(),
            spec: json!({"provider": "cluster", "serviceAccounts": ["runner"]}),
            expected: &["spec.serviceAccounts[0]", "should match"],
        },
        Refusal {
            what: "a grant naming a ServiceAccount as a user",
            kind: grant.clone(),
            spec: json!({"provider": "cluster", "users": ["system:serviceaccount:victim:app"]}),
            expected: &["users cannot name a ServiceAccount"],
        },
        Refusal {
            what: "a grant's per-user share of nothing",
            kind: grant.clone(),
            spec: json!({"provider": "corp", "users": ["alice@example.com"], "perUser": {}}),
            expected: &["perUser sets limits, budgets or both"],
        },
        Refusal {
            what: "a provider with two key sources",
            kind: gateway.clone(),
            spec: json!({"identity": {"providers": [{"name": "corp", "issuer": "https://sso.example.com/realms/corp",
                "audiences": ["waycast"], "jwksUri": "https://sso.example.com/keys",
                "configMapRef": {"name": "corp-jwks", "key": "jwks.json"}}]}}),
            expected: &["a provider takes its key set from one source: discovery, jwksUri or configMapRef"],
        },
        Refusal {
            what: "a provider over plain http",
            kind: gateway.clone(),
            spec: json!({"identity": {"providers": [{"name": "corp", "issuer": "http://sso.example.com", "audiences": ["waycast"]}]}}),
            expected: &["spec.identity.providers[0].issuer", "issuer must be an absolute https:// URL"],
        },
        Refusal {
            what: "a provider with both an issuer and the cluster's",
            kind: gateway.clone(),
            spec: json!({"identity": {"providers": [{"name": "corp", "issuer": "https://sso.example.com",
                "serviceAccountIssuer": {}, "audiences": ["waycast"]}]}}),
            expected: &["a provider needs exactly one of issuer or serviceAccountIssuer"],
        },
        Refusal {
            what: "a provider without audiences",
            kind: gateway.clone(),
            spec: json!({"identity": {"providers": [{"name": "corp", "issuer": "https://sso.example.com", "audiences": []}]}}),
            expected: &["spec.identity.providers[0].audiences", "at least 1 items"],
        },
        Refusal {
            what: "two providers of one name",
            kind: gateway.clone(),
            spec: json!({"identity": {"providers": [corp.clone(), corp]}}),
            expected: &["spec.identity.providers", "provider names must be unique"],
        },
        Refusal {
            what: "secretRef naming an invalid Secret",
            kind: key.clone(),
            spec: json!({"secretRef": {"name": "Not_A_Name", "key": "api-key"}}),
            expected: &["spec.secretRef.name", "should match"],
        },
    ]
}

#[tokio::test]
async fn bad_objects_are_refused_with_a_readable_message() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "refusals").await.unwrap();
    let cases = refusals();
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        let message = create_refused(&client, &namespace, &case.kind, &format!("bad-{index}"), &case.spec).await;
        match message {
            None => failures.push(format!("{}: was accepted", case.what)),
            Some(message) => {
                let missing: Vec<_> = case.expected.iter().filter(|e| !message.contains(*e)).collect();
                if !missing.is_empty() {
                    failures.push(format!("{}: message lacks {missing:?}: {message}", case.what));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Creates the object; returns the API server's refusal message, or `None`
/// when it was accepted.
async fn create_refused(
    client: &Client,
    namespace: &str,
    kind: &ApiResource,
    name: &str,
    spec: &Value,
) -> Option<String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, kind);
    let mut object = DynamicObject::new(name, kind);
    object.data = json!({ "spec": spec });
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "refusals are validation errors: {status:?}");
            Some(status.message)
        }
        Err(other) => panic!("unexpected error creating {name}: {other}"),
    }
}

#[tokio::test]
async fn good_objects_are_accepted_and_defaulted() {
    let client = cluster().client().await;
    let namespace = test_namespace(&client, "accepted").await.unwrap();
    let kind = ApiResource::erase::<Gateway>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &kind);
    let mut object = DynamicObject::new("ok", &kind);
    object.data = json!({"spec": {"autoscaling": {"minReplicas": 2, "maxReplicas": 2}, "apiKeys": {"namespaces": {}}}});
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    // The typed client reads back what the API server stored.
    let typed: Gateway = serde_json::from_value(serde_json::to_value(&created).unwrap()).unwrap();
    let policy = typed.spec.api_keys.unwrap().namespaces.unwrap();
    assert_eq!(policy.from, waycast_crds::gateway::NamespaceFrom::Same);

    // The cluster's own issuer and discovery are written `{}`: the API
    // server keeps them (an empty object is not pruned away).
    let mut identity = DynamicObject::new("identity", &kind);
    identity.data = json!({"spec": {"identity": {"providers": [
        {"name": "cluster", "serviceAccountIssuer": {}, "audiences": ["waycast"]},
        {"name": "corp", "issuer": "https://sso.example.com/realms/corp", "audiences": ["waycast"], "discovery": {}},
    ]}}});
    let created = api.create(&PostParams::default(), &identity).await.unwrap();
    let typed: Gateway = serde_json::from_value(serde_json::to_value(&created).unwrap()).unwrap();
    let providers = typed.spec.identity.unwrap().providers;
    assert!(providers[0].service_account_issuer.is_some() && providers[1].discovery.is_some(), "{providers:?}");
}

#[tokio::test]
async fn kubectl_explain_documents_every_field() {
    let recursive = kubectl(&["explain", "gateway.spec", "--recursive"]);
    for field in ["autoscaling", "maxReplicas", "modelEndpoints", "namespaces", "podTemplate", "tolerations", "tls"] {
        assert!(recursive.contains(field), "`kubectl explain gateway.spec --recursive` lacks {field}:\n{recursive}");
    }
    let leaf = kubectl(&["explain", "gateway.spec.autoscaling.maxReplicas"]);
    assert!(leaf.contains("Most gateway pods."), "{leaf}");
    let backend = kubectl(&["explain", "modelendpoint.spec.backends.url"]);
    assert!(backend.contains("OpenAI-style base URL"), "{backend}");
    let per_user = kubectl(&["explain", "accessgrant.spec.perUser.limits.maxConcurrent"]);
    assert!(per_user.contains("Requests in flight at once"), "{per_user}");
    let provider = kubectl(&["explain", "gateway.spec.identity.providers.serviceAccountIssuer"]);
    assert!(provider.contains("ServiceAccount token issuer"), "{provider}");

    // What kubectl explain reads: the published OpenAPI v3 document. Every
    // waycast-defined field in it must carry a description.
    let client = cluster().client().await;
    let request = http::Request::get("/openapi/v3/apis/waycast.dev/v1alpha1").body(Vec::new()).unwrap();
    let document: Value = serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap();
    let schemas = document["components"]["schemas"].as_object().expect("schemas in the OpenAPI document");
    let mut undocumented = Vec::new();
    let mut checked = 0;
    for crd in [Gateway::crd(), ModelEndpoint::crd(), ApiKey::crd(), AccessGrant::crd()] {
        let kind = crd.spec.names.kind;
        let (_, schema) = schemas
            .iter()
            .find(|(name, _)| name.ends_with(&format!("waycast.v1alpha1.{kind}")))
            .unwrap_or_else(|| panic!("{kind} is not published"));
        for root in ["spec", "status"] {
            checked += undocumented_fields(&schema["properties"][root], &format!("{kind}.{root}"), &mut undocumented);
        }
    }
    assert!(checked > 100, "walked only {checked} fields");
    assert!(undocumented.is_empty(), "fields without documentation: {undocumented:#?}");
}

/// Walks a published schema; returns how many fields it checked and records
/// those without a description.
fn undocumented_fields(schema: &Value, path: &str, undocumented: &mut Vec<String>) -> usize {
    let schema = resolve_all_of(schema);
    let mut checked = 1;
    if schema.get("description").and_then(Value::as_str).is_none_or(str::is_empty) {
        undocumented.push(path.to_owned());
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            checked += undocumented_fields(child, &format!("{path}.{name}"), undocumented);
        }
    }
    if let Some(items) = schema.get("items") {
        let items = resolve_all_of(items);
        if let Some(properties) = items.get("properties").and_then(Value::as_object) {
            for (name, child) in properties {
                checked += undocumented_fields(child, &format!("{path}[].{name}"), undocumented);
            }
        }
    }
    checked
}

fn resolve_all_of(schema: &Value) -> &Value {
    schema.get("allOf").and_then(|all| all.get(0)).unwrap_or(schema)
}
