//! A real Kubernetes node on this machine: containerd (from Debian), the
//! kubelet and kube-proxy (built like the control plane), a CNI bridge, and
//! images imported from archives we pack ourselves.
//!
//! ```text
//! prepare_host    clean leftovers ─► save sysctls ─► bridge waycast0 10.88.0.1/16 ─► service route
//! ControlPlane    binds 0.0.0.0, guarded by iptables to lo + waycast0; advertises 10.88.0.1
//! Node::start     containerd ─► import images ─► kubelet ─► kube-proxy ─► Ready ─► metrics-server
//! teardown        kill agents ─► kill containers ─► unmount ─► netns ─► bridge ─► iptables ─► cgroups ─► sysctls
//! ```
//!
//! Everything the node creates lives under fixed paths ([`NODE_ROOT`],
//! [`NODE_RUN`]), fixed names (bridge [`BRIDGE`], iptables chains `KUBE-*`,
//! `CNI-*`, `WAYCAST-*`) so that [`teardown`] can remove it even after a
//! crashed run, and does so before every bring-up. One node per machine.
//!
//! Some of those names are Kubernetes' own (the kubelet's `kubepods`
//! cgroups, kube-proxy's `KUBE-*` chains, the CRI's `cni-*` network
//! namespaces), so a machine that runs another node (k3s, kind, podman …)
//! has them too. The harness therefore refuses to start where it finds
//! any of them it did not make ([`foreign_node_state`]), and removes them
//! only while its ownership marker ([`OWNED_MARKER`], written before it
//! makes any) says they are its own.

mod names;
mod teardown;

pub use names::{
    BRIDGE, BRIDGE_IP, KUBELET_PORT, LOCK_FILE, NODE_NAME, NODE_ROOT, NODE_RUN, OWNED_MARKER, PAUSE_IMAGE, POD_CIDR,
};
use names::{CONTAINERD_SOCKET, SYSCTLS, sysctl_file};
use teardown::kill_containers;
pub use teardown::{foreign_node_state, teardown};

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;

use crate::control_plane::{ControlPlane, SERVICE_CIDR, k8s_binary, write_kubeconfig};
use crate::process::{Processes, run};
use crate::wait::{await_condition, within};
use waycast_mock::pki::Usage;

/// The bridge address as an `IpAddr`.
pub fn bridge_address() -> IpAddr {
    IpAddr::V4(BRIDGE_IP)
}

/// Takes the node lock, waiting for a previous run to finish tearing down.
///
/// # Errors
/// The lock file cannot be opened or locked.
pub fn lock() -> anyhow::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .with_context(|| format!("opening {LOCK_FILE}"))?;
    file.lock().with_context(|| format!("locking {LOCK_FILE}"))?;
    Ok(file)
}

// === host preparation ===

/// Cleans leftovers of earlier runs, saves the sysctls the node changes, and
/// creates the bridge and the route to the Service network.
///
/// # Errors
/// A system command failing (the message names it).
pub fn prepare_host() -> anyhow::Result<()> {
    let refuse = |foreign: Vec<String>| {
        anyhow::anyhow!(
            "this machine already runs Kubernetes node components the e2e harness did not start ({}); \
             the harness would clash with them and its clean-up would remove their state, so it stops here. \
             Stop that node (k3s, kind, minikube, podman's kube play …) or run the tests in a VM or container of their own",
            foreign.join("; ")
        )
    };
    // Without a marker of this boot, nothing Kubernetes names is the
    // harness's: look before any clean-up, which would remove it. A killed
    // run's own agents are stopped first, or they would count as foreign.
    teardown::stop_own_agents();
    if !teardown::owns_node_state() {
        let foreign = teardown::foreign_node_state();
        if !foreign.is_empty() {
            return Err(refuse(foreign));
        }
    }
    teardown();
    let foreign = foreign_node_state();
    if !foreign.is_empty() {
        return Err(refuse(foreign));
    }
    std::fs::create_dir_all(NODE_ROOT)?;
    std::fs::create_dir_all(NODE_RUN)?;
    std::fs::write(OWNED_MARKER, teardown::boot_id()).with_context(|| format!("writing {OWNED_MARKER}"))?;
    let mut saved = String::new();
    for key in SYSCTLS {
        let value = run("sysctl", &["-n", key]).unwrap_or_default();
        saved.push_str(&format!("{key}={}\n", value.trim()));
    }
    std::fs::write(sysctl_file(), saved)?;
    let _ = run("modprobe", &["br_netfilter"]);
    run("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    // Pod → Service → pod on the same bridge needs the bridge traffic to
    // pass through iptables (kube-proxy's DNAT).
    run("sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run("ip", &["addr", "add", &format!("{BRIDGE_IP}/16"), "dev", BRIDGE])?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    // Host traffic to ClusterIPs leaves through the bridge; kube-proxy's
    // OUTPUT rules rewrite it on the way.
    run("ip", &["route", "add", SERVICE_CIDR, "dev", BRIDGE])?;
    Ok(())
}

/// Lets `ports` be reached only from loopback and the bridge: the API
/// server and the kubelet bind all addresses but must not be exposed.
///
/// # Errors
/// iptables failing.
pub fn guard_ports(ports: &[u16]) -> anyhow::Result<()> {
    let _ = run("iptables", &["-N", "WAYCAST-GUARD"]);
    run("iptables", &["-F", "WAYCAST-GUARD"])?;
    for port in ports {
        let port = port.to_string();
        run("iptables", &["-A", "WAYCAST-GUARD", "-p", "tcp", "--dport", &port, "-i", "lo", "-j", "RETURN"])?;
        run("iptables", &["-A", "WAYCAST-GUARD", "-p", "tcp", "--dport", &port, "-i", BRIDGE, "-j", "RETURN"])?;
        run("iptables", &["-A", "WAYCAST-GUARD", "-p", "tcp", "--dport", &port, "-j", "DROP"])?;
    }
    run("iptables", &["-I", "INPUT", "1", "-j", "WAYCAST-GUARD"])?;
    Ok(())
}

// === the node ===

/// A running node.
pub struct Node {
    processes: Processes,
    /// Where the node's own logs and configs are.
    pub state_dir: PathBuf,
}

/// Free disk the node wants beyond the kubelet's eviction threshold (1 %
/// of the filesystem): pods' logs, images and emptyDirs.
const DISK_HEADROOM_BYTES: u64 = 3 << 30;

/// Refuses to start on a nearly full disk: the kubelet would evict the
/// test pods (ephemeral-storage pressure), and tests would fail far from
/// the cause.
fn check_free_disk() -> anyhow::Result<()> {
    std::fs::create_dir_all(NODE_ROOT)?;
    let output = std::process::Command::new("df").args(["-B1", "--output=avail,size", NODE_ROOT]).output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers: Vec<u64> =
        text.lines().nth(1).unwrap_or_default().split_whitespace().filter_map(|n| n.parse().ok()).collect();
    let [available, size] = numbers[..] else { anyhow::bail!("cannot read free disk space from df: {text}") };
    let needed = size / 100 + DISK_HEADROOM_BYTES;
    anyhow::ensure!(
        available >= needed,
        "the e2e node needs {:.1} GiB free on {NODE_ROOT}'s filesystem and has {:.1} GiB: the kubelet evicts pods below 1 % free. \
         Free some space (Rust target directories are the usual culprit: `cargo clean`, or delete target/debug/incremental).",
        needed as f64 / f64::from(1 << 30),
        available as f64 / f64::from(1 << 30)
    );
    Ok(())
}

impl Node {
    /// Starts containerd, imports `images`, starts the kubelet and
    /// kube-proxy, waits for the node to be Ready, and installs
    /// metrics-server.
    ///
    /// # Errors
    /// A component failing to start (with its log tail) or not getting ready.
    pub async fn start(plane: &ControlPlane, images: &[PathBuf]) -> anyhow::Result<Self> {
        let state_dir = plane.state_dir.join("node");
        std::fs::create_dir_all(&state_dir)?;
        check_free_disk()?;
        let mut node = Self { processes: Processes::new(state_dir.clone()), state_dir: state_dir.clone() };
        node.start_containerd().await?;
        for image in images {
            run(
                "ctr",
                &[
                    "--address",
                    CONTAINERD_SOCKET,
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--no-unpack=false",
                    &image.display().to_string(),
                ],
            )
            .with_context(|| format!("importing {}", image.display()))?;
        }
        node.start_kubelet(plane).await?;
        node.start_kube_proxy(plane)?;
        node.wait_ready(plane).await?;
        Ok(node)
    }

    async fn start_containerd(&mut self) -> anyhow::Result<()> {
        let net_d = self.state_dir.join("net.d");
        std::fs::create_dir_all(&net_d)?;
        let cni = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "waycast",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": format!("{NODE_ROOT}/cni/networks"),
                        "ranges": [[{"subnet": POD_CIDR, "gateway": BRIDGE_IP.to_string(), "rangeStart": "10.88.1.1", "rangeEnd": "10.88.255.254"}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        std::fs::write(net_d.join("10-waycast.conflist"), serde_json::to_vec_pretty(&cni)?)?;
        let config = format!(
            r#"version = 2
root = "{NODE_ROOT}/containerd"
state = "{NODE_RUN}/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine's processes lack CAP_SYS_RESOURCE: runc cannot lower
  # oom_score_adj below its own, and sandboxes fail to start otherwise.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{net_d}"
"#,
            net_d = net_d.display()
        );
        let config_path = self.state_dir.join("containerd.toml");
        std::fs::write(&config_path, config)?;
        self.processes.spawn(
            "containerd",
            Path::new("containerd"),
            &["--config".into(), config_path.display().to_string()],
            &[],
        )?;
        let what = format!("containerd answers on {CONTAINERD_SOCKET}");
        await_condition(what, within(Duration::from_secs(30)), async || {
            if run("ctr", &["--address", CONTAINERD_SOCKET, "version"]).is_ok() {
                return Ok(true);
            }
            self.processes.check_alive().map(|()| false)
        })
        .await
    }

    async fn start_kubelet(&mut self, plane: &ControlPlane) -> anyhow::Result<()> {
        let pki = &plane.pki_dir;
        let node_ip = BRIDGE_IP.to_string();
        let client = plane.authority.issue(
            pki,
            "kubelet-client",
            &format!("system:node:{NODE_NAME}"),
            &["system:nodes"],
            &[],
            Usage::Client,
        )?;
        let serving = plane.authority.issue(
            pki,
            "kubelet-serving",
            NODE_NAME,
            &[],
            &[node_ip.clone(), NODE_NAME.into()],
            Usage::Server,
        )?;
        let kubeconfig = self.state_dir.join("kubelet.kubeconfig");
        write_kubeconfig(&kubeconfig, &plane.server_url, &plane.ca, &client)?;
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip}
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
containerRuntimeEndpoint: unix://{CONTAINERD_SOCKET}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
podLogsDir: {NODE_ROOT}/pod-logs
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 2s
shutdownGracePeriod: 0s
"#,
            ca = plane.ca.display(),
            cert = serving.cert.display(),
            key = serving.key.display(),
        );
        let config_path = self.state_dir.join("kubelet.yaml");
        std::fs::write(&config_path, config)?;
        let kubelet = k8s_binary("kubelet")?;
        self.processes.spawn(
            "kubelet",
            &kubelet,
            &[
                format!("--config={}", config_path.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={NODE_ROOT}/kubelet"),
                format!("--cert-dir={NODE_ROOT}/kubelet-pki"),
                format!("--node-ip={node_ip}"),
                format!("--hostname-override={NODE_NAME}"),
                "--v=1".into(),
            ],
            &[],
        )?;
        Ok(())
    }

    fn start_kube_proxy(&mut self, plane: &ControlPlane) -> anyhow::Result<()> {
        let client =
            plane.authority.issue(&plane.pki_dir, "kube-proxy", "system:kube-proxy", &[], &[], Usage::Client)?;
        let kubeconfig = self.state_dir.join("kube-proxy.kubeconfig");
        write_kubeconfig(&kubeconfig, &plane.server_url, &plane.ca, &client)?;
        let config = format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
mode: iptables
clusterCIDR: {POD_CIDR}
hostnameOverride: {NODE_NAME}
bindAddress: {BRIDGE_IP}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the host's conntrack sysctls alone.
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
iptables: {{localhostNodePorts: false, syncPeriod: 30s, minSyncPeriod: 0s}}
"#,
            kubeconfig = kubeconfig.display()
        );
        let config_path = self.state_dir.join("kube-proxy.yaml");
        std::fs::write(&config_path, config)?;
        let proxy = k8s_binary("kube-proxy")?;
        self.processes.spawn(
            "kube-proxy",
            &proxy,
            &[format!("--config={}", config_path.display()), "--v=1".into()],
            &[],
        )?;
        Ok(())
    }

    async fn wait_ready(&mut self, plane: &ControlPlane) -> anyhow::Result<()> {
        let nodes: Api<NodeObject> = Api::all(plane.client().await?);
        let patience = within(Duration::from_secs(90)).every(Duration::from_millis(200));
        await_condition(format!("node {NODE_NAME} is Ready"), patience, async || {
            let ready = nodes
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.status)
                .and_then(|s| s.conditions)
                .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                return Ok(true);
            }
            self.processes.check_alive().map(|()| false)
        })
        .await
    }

    /// Stops the node and removes everything it created.
    pub async fn stop(mut self) {
        self.processes.stop_one("kube-proxy").await;
        self.processes.stop_one("kubelet").await;
        kill_containers();
        self.processes.stop().await;
        teardown();
    }
}
