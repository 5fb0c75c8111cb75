//! The node's fixed names and paths: what [`super::teardown`] can find and
//! remove after any run, crashed or not.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The node's name.
pub const NODE_NAME: &str = "waycast-node";
/// The CNI bridge.
pub const BRIDGE: &str = "waycast0";
/// The bridge's address: the node IP, and where pods reach the API server.
pub const BRIDGE_IP: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
/// The pod network.
pub const POD_CIDR: &str = "10.88.0.0/16";
/// Persistent node state (containerd root, kubelet root, CNI IPAM).
pub const NODE_ROOT: &str = "/var/lib/waycast-e2e";
/// Runtime node state (containerd state and socket).
pub const NODE_RUN: &str = "/run/waycast-e2e";
/// The kubelet's port on the bridge address.
pub const KUBELET_PORT: u16 = 10250;
/// The pause image every pod sandbox runs.
pub const PAUSE_IMAGE: &str = "docker.io/waycast/pause:dev";

/// Held (flock) by the process running the node, from before bring-up
/// until after tear-down: the next run waits for it, and the kernel
/// releases it even when the holder is killed.
pub const LOCK_FILE: &str = "/run/waycast-e2e.lock";

/// Present while this machine's `kubepods` cgroups, `KUBE-*`/`CNI-*`
/// chains and `cni-*` network namespaces are the harness's: written after
/// [`super::foreign_node_state`] found none, removed by [`super::teardown`] last. On a
/// tmpfs (gone at reboot) and holding the boot's id: a marker of another
/// boot, or one found while another node's agents run, owns nothing.
pub const OWNED_MARKER: &str = "/run/waycast-e2e-owns-node-state";

pub(super) const CONTAINERD_SOCKET: &str = "/run/waycast-e2e/containerd.sock";
/// Chains the harness names itself: always its own.
pub(super) const OWN_CHAIN_PREFIX: &str = "WAYCAST-";
/// Chains kube-proxy and the CNI plugins name: the harness's only while it owns the node state.
pub(super) const KUBERNETES_CHAIN_PREFIXES: &[&str] = &["KUBE-", "CNI-"];
pub(super) const SYSCTLS: &[&str] = &[
    "net.ipv4.ip_forward",
    "net.bridge.bridge-nf-call-iptables",
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
];

/// Where the sysctls the node changes are saved before it changes them.
pub(super) fn sysctl_file() -> PathBuf {
    Path::new(NODE_ROOT).join("sysctls.before")
}
