//! The gateway Deployment. Config changes never reach the pod template (the
//! pods follow their config manifest Secret), so they never restart pods; image,
//! resources and scheduling changes roll them. With autoscaling the replica
//! count is left to the HPA.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Lifecycle, LifecycleHandler,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecretVolumeSource, SecurityContext, SleepAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use waycast_crds::Gateway;
use waycast_crds::gateway::LogLevel;
use waycast_crds::gateway_pod::{arg, env, flag};

use super::meta::{
    ADMIN_PORT, DRAIN_SECONDS, PRE_STOP_SECONDS, PUBLIC_PORT, config_secret_name, owned_meta, selector_labels,
};
use super::settings::RenderSettings;

/// The non-root user of the gateway image.
pub const GATEWAY_USER: i64 = 65532;
/// Where a TLS Secret is mounted.
pub const TLS_MOUNT: &str = "/etc/waycast/tls";

/// Resources of a gateway container whose Gateway sets none: a request the
/// scheduler and a CPU-based HPA can count on, and a memory limit so one
/// pod's trouble stays its own (the data plane bounds its buffers well
/// under it). `spec.resources` replaces all of it.
pub fn default_resources() -> ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let quantities = |pairs: &[(&str, &str)]| {
        Some(pairs.iter().map(|(name, value)| ((*name).to_owned(), Quantity((*value).to_owned()))).collect())
    };
    ResourceRequirements {
        requests: quantities(&[("cpu", "100m"), ("memory", "64Mi")]),
        limits: quantities(&[("memory", "1Gi")]),
        ..ResourceRequirements::default()
    }
}

/// The gateway's `--workers`: its container's CPU limit, else its CPU
/// request, rounded up (at least 1) — as many data-plane threads as cores
/// the pod is meant to use, not the node's core count (each worker keeps its
/// own upstream connections). None when neither is set or readable: the
/// gateway then counts the CPUs it may use.
pub fn workers(resources: &ResourceRequirements) -> Option<u32> {
    let cpu = |list: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
        list.as_ref()?.get("cpu").map(|quantity| quantity.0.trim().to_owned())
    };
    let text = cpu(&resources.limits).or_else(|| cpu(&resources.requests))?;
    let cores = match text.strip_suffix('m') {
        Some(millis) => millis.parse::<f64>().ok()? / 1000.0,
        None => text.parse::<f64>().ok()?,
    };
    if !cores.is_finite() || cores <= 0.0 {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped to 1..=1024 first")]
    Some(cores.ceil().clamp(1.0, 1024.0) as u32)
}

/// The Deployment.
pub fn deployment(gateway: &Gateway, settings: &RenderSettings) -> Deployment {
    let spec = &gateway.spec;
    let pod_template = spec.pod_template.clone().unwrap_or_default();
    let mut pod_labels = pod_template.labels.clone();
    pod_labels.extend(selector_labels(gateway));
    let mut annotations = BTreeMap::from([
        ("prometheus.io/scrape".to_owned(), "true".to_owned()),
        ("prometheus.io/port".to_owned(), ADMIN_PORT.to_string()),
        ("prometheus.io/path".to_owned(), "/metrics".to_owned()),
    ]);
    annotations.extend(pod_template.annotations.clone());

    let level = match spec.logging.as_ref().and_then(|l| l.level).unwrap_or_default() {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
    };
    let namespace = gateway.namespace().unwrap_or_default();
    let mut args = vec![
        arg(flag::CONFIG_SECRET),
        format!("{namespace}/{}", config_secret_name(gateway)),
        arg(flag::ENDPOINTS_CONFIGMAP),
        format!("{namespace}/{}", super::meta::config_map_name(gateway)),
        arg(flag::USAGE_CONFIGMAP),
        format!("{namespace}/{}", super::meta::usage_config_map_name(gateway)),
        arg(flag::LISTEN),
        format!("0.0.0.0:{PUBLIC_PORT}"),
        arg(flag::ADMIN_LISTEN),
        format!("0.0.0.0:{ADMIN_PORT}"),
        arg(flag::DRAIN_TIMEOUT),
        format!("{DRAIN_SECONDS}s"),
        arg(flag::LOG),
        level.to_owned(),
    ];
    if let Some(max) = spec.limits.as_ref().and_then(|l| l.max_connections) {
        args.extend([arg(flag::MAX_CONNECTIONS), max.to_string()]);
    }
    let resources = spec.resources.clone().unwrap_or_else(default_resources);
    if let Some(workers) = workers(&resources) {
        args.extend([arg(flag::WORKERS), workers.to_string()]);
    }
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    if let Some(tls) = &spec.tls {
        args.extend([
            arg(flag::TLS_CERT),
            format!("{TLS_MOUNT}/tls.crt"),
            arg(flag::TLS_KEY),
            format!("{TLS_MOUNT}/tls.key"),
        ]);
        volumes.push(Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(tls.secret_name.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "tls".into(),
            mount_path: TLS_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..ObjectFieldSelector::default() }),
        ..EnvVarSource::default()
    };
    // Who the pod is, for its heartbeat Lease.
    let mut env: Vec<EnvVar> =
        [(env::POD_NAME, "metadata.name"), (env::POD_NAMESPACE, "metadata.namespace"), (env::POD_UID, "metadata.uid")]
            .into_iter()
            .map(|(name, path)| EnvVar { name: name.into(), value_from: Some(field(path)), ..EnvVar::default() })
            .collect();
    env.push(EnvVar { name: env::GATEWAY.into(), value: Some(gateway.name_any()), ..EnvVar::default() });
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    let container = Container {
        name: "gateway".into(),
        image: Some(spec.image.clone().unwrap_or_else(|| settings.gateway_image.clone())),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(args),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some("http".into()),
                container_port: PUBLIC_PORT,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("admin".into()),
                container_port: ADMIN_PORT,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
        readiness_probe: Some(probe("/readyz", 1)),
        liveness_probe: Some(probe("/healthz", 10)),
        lifecycle: Some(Lifecycle {
            // Keep serving while endpoints drop the pod; then SIGTERM drains.
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction { seconds: PRE_STOP_SECONDS }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        resources: Some(resources),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(GATEWAY_USER),
            run_as_group: Some(GATEWAY_USER),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Capabilities::default() }),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..SeccompProfile::default() }),
            ..SecurityContext::default()
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Container::default()
    };
    let pod = PodSpec {
        containers: vec![container],
        service_account_name: Some(gateway.name_any()),
        termination_grace_period_seconds: Some(PRE_STOP_SECONDS + DRAIN_SECONDS + 5),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..SeccompProfile::default() }),
            ..PodSecurityContext::default()
        }),
        node_selector: (!pod_template.node_selector.is_empty()).then(|| pod_template.node_selector.clone()),
        tolerations: (!pod_template.tolerations.is_empty()).then(|| pod_template.tolerations.clone()),
        affinity: pod_template.affinity.clone(),
        topology_spread_constraints: (!pod_template.topology_spread_constraints.is_empty())
            .then(|| pod_template.topology_spread_constraints.clone()),
        priority_class_name: pod_template.priority_class_name.clone(),
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..PodSpec::default()
    };
    Deployment {
        metadata: owned_meta(gateway, gateway.name_any()),
        spec: Some(DeploymentSpec {
            // NB: with an HPA the replica count is the HPA's; setting it here
            // would fight it on every reconcile.
            replicas: if spec.autoscaling.is_some() { None } else { Some(spec.replicas.unwrap_or(1)) },
            selector: LabelSelector { match_labels: Some(selector_labels(gateway)), ..LabelSelector::default() },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures;
    use waycast_crds::GatewaySpec;
    use waycast_crds::gateway::{Autoscaling, GatewayPodTemplate, GatewayTls};

    fn settings() -> RenderSettings {
        RenderSettings { gateway_image: "docker.io/waycast/gateway:dev".into(), network_policy: None }
    }

    #[test]
    fn hardened_pods_reading_their_config_secret() {
        let deployment =
            deployment(&fixtures::gateway(GatewaySpec { replicas: Some(3), ..GatewaySpec::default() }), &settings());
        let spec = deployment.spec.unwrap();
        assert_eq!(spec.replicas, Some(3));
        let pod = spec.template.spec.unwrap();
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("docker.io/waycast/gateway:dev"));
        let args = container.args.clone().unwrap();
        assert!(args.windows(2).any(|w| w == ["--config-secret", "platform/shared-config"]), "{args:?}");
        let resources = container.resources.as_ref().unwrap();
        assert_eq!(resources.limits.as_ref().unwrap()["memory"].0, "1Gi", "bounded by default");
        assert_eq!(resources.requests.as_ref().unwrap()["cpu"].0, "100m");
        assert!(args.windows(2).any(|w| w == ["--workers", "1"]), "one worker for 100m: {args:?}");
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(
            (security.run_as_non_root, security.read_only_root_filesystem, security.allow_privilege_escalation),
            (Some(true), Some(true), Some(false))
        );
        assert_eq!(security.capabilities.as_ref().unwrap().drop.as_deref(), Some(&["ALL".to_owned()][..]));
        assert_eq!(security.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        assert!(
            pod.termination_grace_period_seconds.unwrap() > DRAIN_SECONDS + PRE_STOP_SECONDS,
            "the grace period covers preStop + drain"
        );
        assert_eq!(pod.service_account_name.as_deref(), Some("shared"));
        let annotations = spec.template.metadata.unwrap().annotations.unwrap();
        assert_eq!(annotations["prometheus.io/scrape"], "true");
        assert!(!annotations.keys().any(|k| k.contains("config-hash")), "config changes must not roll pods");
    }

    #[test]
    fn workers_follow_the_cpu_limit_else_the_request() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let resources = |limit: Option<&str>, request: Option<&str>| {
            let cpu = |value: Option<&str>| value.map(|v| BTreeMap::from([("cpu".to_owned(), Quantity(v.to_owned()))]));
            ResourceRequirements { limits: cpu(limit), requests: cpu(request), ..ResourceRequirements::default() }
        };
        for (limit, request, expected) in [
            (Some("4"), Some("1"), Some(4)),
            (None, Some("1500m"), Some(2)),
            (None, Some("0.5"), Some(1)),
            (Some("250m"), None, Some(1)),
            (None, None, None),
            (Some("lots"), None, None),
            (None, Some("0"), None),
            (Some("100000"), None, Some(1024)),
        ] {
            assert_eq!(workers(&resources(limit, request)), expected, "limit {limit:?}, request {request:?}");
        }
        let four = GatewaySpec { resources: Some(resources(Some("4"), None)), ..GatewaySpec::default() };
        let args = deployment(&fixtures::gateway(four), &settings()).spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.windows(2).any(|w| w == ["--workers", "4"]), "{args:?}");
    }

    #[test]
    fn autoscaled_gateways_leave_replicas_to_the_hpa() {
        let spec = GatewaySpec {
            autoscaling: Some(Autoscaling { max_replicas: 4, ..Autoscaling::default() }),
            ..GatewaySpec::default()
        };
        assert_eq!(deployment(&fixtures::gateway(spec), &settings()).spec.unwrap().replicas, None);
    }

    #[test]
    fn image_tls_and_scheduling_come_from_the_spec() {
        let spec = GatewaySpec {
            image: Some("registry.example/gateway:1.2".into()),
            tls: Some(GatewayTls { secret_name: "gateway-tls".into() }),
            pod_template: Some(GatewayPodTemplate {
                node_selector: [("pool".to_owned(), "gateways".to_owned())].into(),
                priority_class_name: Some("high".into()),
                labels: [("team".to_owned(), "platform".to_owned())].into(),
                ..GatewayPodTemplate::default()
            }),
            ..GatewaySpec::default()
        };
        let deployment = deployment(&fixtures::gateway(spec), &settings());
        let template = deployment.spec.unwrap().template;
        let pod = template.spec.unwrap();
        assert_eq!(pod.containers[0].image.as_deref(), Some("registry.example/gateway:1.2"));
        assert!(pod.containers[0].args.as_ref().unwrap().contains(&"--tls-cert".to_owned()));
        let mut capped = fixtures::gateway(GatewaySpec::default());
        capped.spec.limits =
            Some(waycast_crds::gateway::GatewayLimits { max_request_body_bytes: None, max_connections: Some(500) });
        let args =
            super::deployment(&capped, &settings()).spec.unwrap().template.spec.unwrap().containers[0].args.clone();
        assert!(args.unwrap().windows(2).any(|w| w == ["--max-connections", "500"]));
        assert_eq!(pod.volumes.unwrap()[0].secret.as_ref().unwrap().secret_name.as_deref(), Some("gateway-tls"));
        assert_eq!(pod.node_selector.unwrap()["pool"], "gateways");
        assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
        let labels = template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["team"], "platform");
        assert_eq!(labels["app.kubernetes.io/instance"], "shared");
    }
}
