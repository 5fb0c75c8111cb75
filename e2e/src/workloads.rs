//! Workloads the e2e node runs: the mock upstream and a gateway deployed by
//! hand (a ServiceAccount that may read only its config Secret, hardened
//! pods, Services), shared by the node tests and `make demo`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{Value, json};
use waycast_crds::GatewayConfig;

use crate::cluster::images;
use crate::manifest;
use crate::wait::{Patience, Seen, await_answer, await_condition, within};

/// The hardened container security context every waycast pod uses.
pub fn hardened() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": 65532,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// A one-container Deployment labelled `app=<name>`; `extra` is merged into
/// the container.
pub fn deployment(name: &str, image: &str, args: &[&str], port: u16, extra: Value) -> Value {
    let mut container = json!({
        "name": name,
        "image": image,
        "imagePullPolicy": "Never",
        "args": args,
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
        "securityContext": hardened(),
    });
    if let (Some(container), Some(extra)) = (container.as_object_mut(), extra.as_object()) {
        container.extend(extra.clone());
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
        },
    })
}

/// A ClusterIP Service for `app=<name>`.
pub fn service(name: &str, port: u16, target: u16) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": port, "targetPort": target}]},
    })
}

/// Server-side applies JSON objects into `namespace`.
///
/// # Errors
/// The API server refusing one.
pub async fn apply_values(client: &Client, namespace: &str, values: Vec<Value>) -> anyhow::Result<()> {
    let objects = values.into_iter().map(serde_json::from_value).collect::<Result<Vec<_>, _>>()?;
    manifest::apply_all(client, &objects, namespace).await
}

/// A Service's ClusterIP.
///
/// # Errors
/// No such Service or no ClusterIP.
pub async fn cluster_ip(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let service = Api::<Service>::namespaced(client.clone(), namespace).get(name).await?;
    service.spec.and_then(|s| s.cluster_ip).context("Service has no ClusterIP")
}

/// Opens `addresses` (IPs) of the cluster's closed ranges to the `url`
/// backends of the Gateway `gateway`: egress to the cluster is closed to
/// them by default, and a test that routes a `url` backend to a pod or a
/// ClusterIP says so, as a platform team would.
///
/// # Errors
/// The patch failing.
pub async fn open_egress(client: &Client, namespace: &str, gateway: &str, addresses: &[&str]) -> anyhow::Result<()> {
    let cidrs: Vec<String> =
        addresses.iter().map(|ip| if ip.contains(':') { format!("{ip}/128") } else { format!("{ip}/32") }).collect();
    let gateways: Api<waycast_crds::Gateway> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"spec": {"egress": {"allowedCIDRs": cidrs}}});
    gateways
        .patch(gateway, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch))
        .await
        .with_context(|| format!("opening egress of Gateway {namespace}/{gateway}"))?;
    Ok(())
}

/// Waits until `count` pods matching `label` are Ready.
///
/// # Errors
/// Not within `timeout`.
pub async fn wait_pods_ready(
    client: &Client,
    namespace: &str,
    label: &str,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patience = within(timeout).every(Duration::from_millis(200));
    await_condition(format!("{count} pods {label} ready"), patience, async || {
        let list = pods.list(&ListParams::default().labels(label)).await?.items;
        let ready: Vec<Pod> = list
            .into_iter()
            .filter(|pod| {
                pod.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .collect();
        anyhow::Ok(if ready.len() >= count {
            Seen::Done(ready)
        } else {
            Seen::NotYet(format!("{} ready", ready.len()))
        })
    })
    .await
}

/// The chat completions URL of each of the `count` ready pods of the
/// Gateway `gateway` in `namespace` (its pods by their own addresses, so
/// that a change can be checked on every one of them).
///
/// # Errors
/// Not `count` ready pods within `timeout`.
pub async fn gateway_pod_urls(
    client: &Client,
    namespace: &str,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let pods = wait_pods_ready(client, namespace, "app.kubernetes.io/instance=gateway", count, timeout).await?;
    let ips = pods.iter().map(|pod| pod.status.as_ref().and_then(|s| s.pod_ip.clone()).context("a pod without an IP"));
    ips.map(|ip| ip.map(|ip| crate::chat::url(format!("{ip}:8080")))).collect()
}

/// Deploys the mock upstream (`mock`, port 8000) into `namespace`; returns
/// its OpenAI base URL on the ClusterIP.
///
/// # Errors
/// The API server refusing an object.
pub async fn deploy_mock(client: &Client, namespace: &str) -> anyhow::Result<String> {
    let mock = deployment("mock", images::MOCK_UPSTREAM, &["--listen", "0.0.0.0:8000"], 8000, json!({}));
    apply_values(client, namespace, vec![mock, service("mock", 8000, 8000)]).await?;
    Ok(format!("http://{}:8000/v1", cluster_ip(client, namespace, "mock").await?))
}

/// Deploys `replicas` gateway pods (`gateway`, Service port 80) reading
/// `config` from the Secret `gateway-config` with a ServiceAccount whose
/// Role grants that Secret only; returns the gateway's ClusterIP.
///
/// # Errors
/// The API server refusing an object.
pub async fn deploy_gateway(
    client: &Client,
    namespace: &str,
    config: &GatewayConfig,
    replicas: u32,
) -> anyhow::Result<String> {
    let config_secret = json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gateway-config"},
        "stringData": {"config.json": String::from_utf8(config.to_canonical_json()?)?},
    });
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gateway"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "gateway"},
               "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gateway-config"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "gateway"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gateway"},
               "subjects": [{"kind": "ServiceAccount", "name": "gateway", "namespace": namespace}]}),
        config_secret,
    ];
    let secret_ref = format!("{namespace}/gateway-config");
    let mut gateway = deployment(
        "gateway",
        images::GATEWAY,
        &["--config-secret", &secret_ref, "--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9090"],
        8080,
        json!({"readinessProbe": {"httpGet": {"path": "/readyz", "port": 9090}, "periodSeconds": 1}}),
    );
    gateway["spec"]["replicas"] = json!(replicas);
    gateway["spec"]["template"]["spec"]["serviceAccountName"] = json!("gateway");
    objects.extend([gateway, service("gateway", 80, 8080)]);
    apply_values(client, namespace, objects).await?;
    cluster_ip(client, namespace, "gateway").await
}

/// Waits until the `gateway-endpoints` ConfigMap (the Gateway named
/// `gateway`) lists `count` addresses for `service` (`namespace/name:port`).
///
/// # Errors
/// The API server failing, or another count after `timeout`.
pub async fn wait_endpoints(
    client: &Client,
    namespace: &str,
    service: &str,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), namespace);
    await_condition(format!("{service} lists {count} endpoints"), within(timeout), async || {
        let listed = maps.get_opt("gateway-endpoints").await?.and_then(|map| {
            let text = map.data?.get(waycast_crds::endpoints::ENDPOINTS_DATA_KEY)?.clone();
            let document = waycast_crds::endpoints::EndpointsDocument::from_slice(text.as_bytes()).ok()?;
            Some(document.services.get(service).map_or(0, Vec::len))
        });
        anyhow::Ok(Seen::when(listed == Some(count), format_args!("{listed:?} endpoints")))
    })
    .await
}

/// The value of the first sample at `admin` (a gateway's `/metrics` URL)
/// whose line starts with `sample` (a metric name, with labels if needed);
/// None while it is not there or the pod does not answer.
pub async fn metric_sample(admin: &str, sample: &str) -> Option<f64> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let response = http.get(admin.parse().ok()?).await.ok()?;
    let body = http_body_util::BodyExt::collect(response.into_body()).await.ok()?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    text.lines().find_map(|l| l.strip_prefix(sample)?.trim().rsplit(' ').next()?.parse().ok())
}

/// The namespace `make demo` deploys into.
pub const DEMO_NAMESPACE: &str = "waycast-demo";

/// What the demo deployed: where the gateway is and a key for it.
pub struct Demo {
    /// The gateway Service's ClusterIP (port 80).
    pub gateway_ip: String,
    /// A freshly generated key the gateway accepts.
    pub key: String,
}

/// Deploys the demo the way a user would: the operator as a pod with the
/// project's RBAC (`deploy/operator.yaml`, rendered from the chart), then
/// [`serve_quickstart`].
///
/// # Errors
/// A step failing, or readiness not reached within three minutes.
pub async fn deploy_demo(client: &Client) -> anyhow::Result<Demo> {
    let path = repository_root().join("deploy/operator.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    manifest::apply_all(client, &manifest::parse_documents(&text)?, "waycast-system").await?;
    wait_pods_ready(client, "waycast-system", "app.kubernetes.io/name=waycast-operator", 1, Duration::from_secs(120))
        .await?;
    serve_quickstart(client).await
}

/// Applies `examples/quickstart/` into [`DEMO_NAMESPACE`] (an operator must
/// be running) and waits until the Gateway is Ready and its Service answers
/// with the generated key.
///
/// # Errors
/// A step failing, or readiness not reached within three minutes.
pub async fn serve_quickstart(client: &Client) -> anyhow::Result<Demo> {
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta { name: Some(DEMO_NAMESPACE.into()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .patch(
            DEMO_NAMESPACE,
            &kube::api::PatchParams::apply(manifest::FIELD_MANAGER),
            &kube::api::Patch::Apply(&namespace),
        )
        .await?;
    manifest::apply_all(client, &quickstart()?, DEMO_NAMESPACE).await?;
    let gateways: Api<waycast_crds::Gateway> = Api::namespaced(client.clone(), DEMO_NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), DEMO_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(180);
    let patience = Patience::by(deadline).every(Duration::from_millis(250));
    let key = await_condition("the quickstart Gateway is Ready with its key", patience, async || {
        let gateway = gateways.get_opt("gateway").await?;
        let ready = gateway.as_ref().and_then(|g| g.status.as_ref()).is_some_and(|s| {
            s.conditions.iter().any(|c| c.type_ == waycast_crds::condition::types::READY && c.status == "True")
        });
        let key = secrets
            .get_opt("alice-key")
            .await?
            .and_then(|s| s.data?.get("api-key").map(|k| String::from_utf8_lossy(&k.0).into_owned()));
        anyhow::Ok(key.filter(|_| ready))
    })
    .await?;
    let gateway_ip = cluster_ip(client, DEMO_NAMESPACE, "gateway").await?;
    // The Service answers with the key, within what is left of the 3 minutes.
    let urls = [crate::chat::url(&gateway_ip)];
    await_answer(&urls, &key, "llama3", http::StatusCode::OK, Patience::by(deadline)).await?;
    Ok(Demo { gateway_ip, key })
}

/// The objects of `examples/quickstart/quickstart.yaml`, for a test to
/// change before it applies them.
///
/// # Errors
/// The file unreadable or not valid YAML documents.
pub fn quickstart() -> anyhow::Result<Vec<kube::api::DynamicObject>> {
    let path = repository_root().join("examples/quickstart/quickstart.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    manifest::parse_documents(&text)
}

/// The repository this crate lives in.
pub fn repository_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The last `lines` log lines of every pod matching `selector`, each
/// headed by its pod's name: for a failing assertion to show what the pods
/// said (an error reading them is shown in their place).
pub async fn pod_logs(client: &Client, namespace: &str, selector: &str, lines: i64) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = match pods.list(&ListParams::default().labels(selector)).await {
        Ok(listed) => listed,
        Err(error) => return format!("cannot list pods {selector}: {error}"),
    };
    let mut out = String::new();
    for pod in listed {
        let name = pod.metadata.name.unwrap_or_default();
        let params = kube::api::LogParams { tail_lines: Some(lines), ..Default::default() };
        let text = pods.logs(&name, &params).await.unwrap_or_else(|error| format!("cannot read its log: {error}"));
        out.push_str(&format!("--- {name}\n{text}\n"));
    }
    out
}

/// The key text the operator generated for ApiKey `namespace/name` (its
/// Secret `<name>-key`), waiting up to `timeout` for the Secret.
///
/// # Errors
/// The API server failing, or no such Secret (with an `api-key`) in time.
pub async fn generated_key(client: &Client, namespace: &str, name: &str, timeout: Duration) -> anyhow::Result<String> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), namespace);
    let patience = within(timeout).every(Duration::from_millis(50));
    let key = await_condition(format!("the operator generates {namespace}/{name}-key"), patience, async || {
        let secret = secrets.get_opt(&format!("{name}-key")).await?;
        anyhow::Ok(
            secret.and_then(|s| s.data).and_then(|mut data| data.remove(waycast_crds::api_key::GENERATED_DATA_KEY)),
        )
    })
    .await?;
    String::from_utf8(key.0).context("a key that is not UTF-8")
}

/// `GET /v1/usage` through the gateway pod at `ip` with `key`: the key's
/// budgets as JSON.
///
/// # Errors
/// The pod not answering, or an answer that is not JSON.
pub async fn key_usage(ip: &str, key: &str) -> anyhow::Result<Value> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::get(format!("http://{ip}:8080/v1/usage"))
        .header("authorization", format!("Bearer {key}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let response = http.request(request).await?;
    let body = http_body_util::BodyExt::collect(response.into_body()).await?.to_bytes();
    serde_json::from_slice(&body).context("GET /v1/usage did not answer JSON")
}

/// Waits until Gateway `name` says it compiled `keys` ApiKeys.
///
/// # Errors
/// The API server failing, or not so by `deadline`.
pub async fn wait_keys_compiled(
    gateways: &Api<waycast_crds::Gateway>,
    name: &str,
    keys: usize,
    deadline: Instant,
) -> anyhow::Result<()> {
    await_condition(format!("the Gateway compiles {keys} keys"), Patience::by(deadline), async || {
        let status = gateways.get(name).await?.status.unwrap_or_default();
        let compiled = status.api_key_count.and_then(|n| usize::try_from(n).ok());
        anyhow::Ok(Seen::when(compiled == Some(keys), format_args!("{:?} keys", status.api_key_count)))
    })
    .await
}

/// A benchmark's size from the environment variable `name`, else `default`.
pub fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The 99th percentile of `sorted` (ascending; 0 when empty).
pub fn p99(sorted: &[f64]) -> f64 {
    let rank = (sorted.len() as f64 * 0.99).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied().unwrap_or(0.0)
}

/// The status `gateway` answers a chat completion for `model` with `key`
/// (`None`: no answer within 2 s).
pub async fn chat_status(gateway: std::net::SocketAddr, key: &str, model: &str) -> Option<u16> {
    crate::chat::status(&crate::chat::url(gateway), key, model).await.map(|status| status.as_u16())
}
