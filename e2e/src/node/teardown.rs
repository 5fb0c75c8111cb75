//! Removing what a node made — only what the harness owns — and telling
//! another node's state apart from the harness's own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::names::{
    BRIDGE, CONTAINERD_SOCKET, KUBERNETES_CHAIN_PREFIXES, NODE_ROOT, NODE_RUN, OWN_CHAIN_PREFIX, OWNED_MARKER,
    sysctl_file,
};
use crate::process::run;
use crate::wait::{await_condition_blocking, within};

pub(super) fn kill_containers() {
    let tasks = run("ctr", &["--address", CONTAINERD_SOCKET, "-n", "k8s.io", "tasks", "ls", "-q"]).unwrap_or_default();
    for task in tasks.lines().map(str::trim).filter(|t| !t.is_empty()) {
        let _ = run("ctr", &["--address", CONTAINERD_SOCKET, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task]);
    }
}

/// Removes everything a node creates, whether or not one is running: safe
/// to call any time, and called before every bring-up. What Kubernetes
/// names itself is removed only under the ownership marker.
pub fn teardown() {
    // Agents first, so nothing recreates what is being removed.
    stop_own_agents();
    let owned = owns_node_state();
    if Path::new(CONTAINERD_SOCKET).exists() {
        kill_containers();
    }
    let _ = run("pkill", &["-9", "-f", &format!("containerd-shim-runc-v2 .*-address {CONTAINERD_SOCKET}")]);
    if owned {
        kill_cgroup_processes();
    }
    unmount_under(&[NODE_ROOT, NODE_RUN]);
    if owned {
        remove_pod_netns();
    }
    if run("ip", &["link", "show", BRIDGE]).is_ok() {
        let _ = run("ip", &["link", "delete", BRIDGE]);
    }
    remove_iptables_chains(owned);
    if owned {
        remove_cgroups();
    }
    restore_sysctls();
    let _ = std::fs::remove_dir_all(NODE_RUN);
    let _ = std::fs::remove_dir_all(NODE_ROOT);
    // The marker goes last.
    let _ = std::fs::remove_file(OWNED_MARKER);
}

/// Kills the harness's own node agents, found by their command lines (which
/// name its state directories): before ownership is judged, since a killed
/// run leaves them running and they would look like another node's.
pub(super) fn stop_own_agents() {
    for pattern in [
        format!("kubelet.*--root-dir={NODE_ROOT}"),
        "kube-proxy --config=.*waycast-e2e".to_owned(),
        "containerd --config .*waycast-e2e".to_owned(),
    ] {
        let _ = run("pkill", &["-9", "-f", &pattern]);
    }
}

/// This boot's id (the kernel's random `boot_id`; empty if unreadable, which
/// matches no marker).
pub(super) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|id| id.trim().to_owned()).unwrap_or_default()
}

/// Whether what Kubernetes names on this machine is the harness's: its
/// marker holds this boot's id, and no node agent but its own runs (its
/// own are stopped first by their own command lines).
pub(super) fn owns_node_state() -> bool {
    let marked = std::fs::read_to_string(OWNED_MARKER).is_ok_and(|id| !id.is_empty() && id.trim() == boot_id());
    marked && foreign_agents().is_empty()
}

/// Node agents running that are not the harness's (checked after its own
/// were stopped: a killed agent takes a moment to go).
fn foreign_agents() -> Vec<String> {
    let mut found = Vec::new();
    for name in ["kubelet", "kube-proxy", "k3s", "k3s-server", "k3s-agent", "kubelite", "k0s", "rke2"] {
        let gone = await_condition_blocking(format!("no {name} runs"), within(Duration::from_secs(2)), || {
            run("pgrep", &["-x", name]).is_err()
        });
        if gone.is_err() {
            found.push(format!("a {name} process"));
        }
    }
    found
}

/// Node state on this machine that the harness did not make (checked after
/// [`teardown`], so none of the harness's own is left): another kubelet or
/// kube-proxy running, `kubepods` cgroups, `KUBE-*`/`CNI-*` chains, `cni-*`
/// network namespaces. Empty on a machine the harness may use.
pub fn foreign_node_state() -> Vec<String> {
    let mut found = foreign_agents();
    let cgroups: Vec<String> = kubepods_cgroups().iter().map(|path| path.display().to_string()).collect();
    if !cgroups.is_empty() {
        found.push(format!("pod cgroups ({})", cgroups.join(", ")));
    }
    for save in ["iptables-save", "ip6tables-save"] {
        let dump = run(save, &[]).unwrap_or_default();
        let chains = chains_named(&dump, KUBERNETES_CHAIN_PREFIXES);
        if !chains.is_empty() {
            found.push(format!(
                "{} chains ({}{})",
                save.trim_end_matches("-save"),
                chains[..chains.len().min(3)].join(", "),
                if chains.len() > 3 { ", …" } else { "" }
            ));
        }
    }
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("cni-"))
                .collect()
        })
        .unwrap_or_default();
    if !netns.is_empty() {
        found.push(format!("{} cni-* network namespaces", netns.len()));
    }
    found
}

/// Every process left in the kubepods cgroups (containers whose shim died).
fn kill_cgroup_processes() {
    for root in kubepods_cgroups() {
        for _ in 0..5 {
            let mut any = false;
            for procs in walk_files(&root, "cgroup.procs") {
                for pid in std::fs::read_to_string(&procs).unwrap_or_default().lines() {
                    any = true;
                    let _ = run("kill", &["-9", pid.trim()]);
                }
            }
            if !any {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The kubelet's pod cgroups (cgroupfs `kubepods`, systemd `kubepods.slice`),
/// in every v1 controller or the v2 unified tree.
fn kubepods_cgroups() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut trees: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|controllers| controllers.flatten().map(|c| c.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    trees.push(root.to_path_buf());
    trees
        .iter()
        .flat_map(|tree| [tree.join("kubepods"), tree.join("kubepods.slice")])
        .filter(|path| path.is_dir())
        .collect()
}

fn walk_files(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == name) {
                found.push(path);
            }
        }
    }
    found
}

/// Removes the kubepods cgroup trees, deepest first.
fn remove_cgroups() {
    for root in kubepods_cgroups() {
        let mut dirs = vec![root.clone()];
        let mut all = Vec::new();
        while let Some(dir) = dirs.pop() {
            all.push(dir.clone());
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
        for dir in all.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Unmounts every mount point under `roots`, deepest first.
fn unmount_under(roots: &[&str]) {
    for _ in 0..3 {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut points: Vec<String> = mounts
            .lines()
            .filter_map(|line| line.split_whitespace().nth(1))
            .map(|p| p.replace("\\040", " "))
            .filter(|p| roots.iter().any(|root| Path::new(p).starts_with(root)))
            .collect();
        if points.is_empty() {
            return;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = run("umount", &["-l", &point]);
        }
    }
}

/// The network namespaces the CRI made for pod sandboxes (`cni-*`).
fn remove_pod_netns() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("cni-") {
            let _ = run("ip", &["netns", "delete", &name]);
            let _ = run("umount", &["-l", &entry.path().display().to_string()]);
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Removes the harness's chains — `WAYCAST-*` always, `KUBE-*` and `CNI-*`
/// when it owns the node state — and every rule that jumps to one, in every
/// table, for IPv4 and IPv6. Each table's removal is one
/// `iptables-restore --noflush` transaction of `-D`, `-F` and `-X`
/// commands: no other rule is rewritten, so a rule another program adds
/// meanwhile is kept.
fn remove_iptables_chains(owned: bool) {
    let mut prefixes = vec![OWN_CHAIN_PREFIX];
    if owned {
        prefixes.extend_from_slice(KUBERNETES_CHAIN_PREFIXES);
    }
    for (save, restore) in [("iptables-save", "iptables-restore"), ("ip6tables-save", "ip6tables-restore")] {
        let Ok(dump) = run(save, &[]) else { continue };
        let Some(script) = removal_script(&dump, &prefixes) else { continue };
        let mut child = match std::process::Command::new(restore)
            .args(["--noflush", "--wait"])
            .stdin(std::process::Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(_) => continue,
        };
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            let _ = stdin.write_all(script.as_bytes());
        }
        let _ = child.wait();
    }
}

/// The chains in an `iptables-save` dump whose names start with one of `prefixes`.
fn chains_named(dump: &str, prefixes: &[&str]) -> Vec<String> {
    dump.lines()
        .filter_map(|line| line.strip_prefix(':')?.split_whitespace().next())
        .filter(|chain| prefixes.iter().any(|prefix| chain.starts_with(prefix)))
        .map(str::to_owned)
        .collect()
}

/// The `iptables-restore --noflush` input that removes the chains named
/// with `prefixes` from `dump` and the rules of other chains that jump to
/// them; `None` when there are none.
fn removal_script(dump: &str, prefixes: &[&str]) -> Option<String> {
    let ours = |chain: &str| prefixes.iter().any(|prefix| chain.starts_with(prefix));
    let mut script = String::new();
    let mut table = None;
    let (mut unhook, mut chains) = (Vec::new(), Vec::new());
    for line in dump.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Some(name.to_owned());
        } else if let Some(chain) = line.strip_prefix(':').and_then(|rest| rest.split_whitespace().next()) {
            if ours(chain) {
                chains.push(chain.to_owned());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or_default();
            let target = rule.split_whitespace().skip_while(|word| *word != "-j" && *word != "-g").nth(1);
            if !ours(chain) && target.is_some_and(ours) {
                unhook.push(format!("-D {rule}"));
            }
        } else if line == "COMMIT" {
            if let Some(name) = table.take()
                && !(unhook.is_empty() && chains.is_empty())
            {
                script.push_str(&format!("*{name}\n"));
                for rule in unhook.drain(..) {
                    script.push_str(&format!("{rule}\n"));
                }
                for chain in &chains {
                    script.push_str(&format!("-F {chain}\n"));
                }
                for chain in chains.drain(..) {
                    script.push_str(&format!("-X {chain}\n"));
                }
                script.push_str("COMMIT\n");
            }
            unhook.clear();
            chains.clear();
        }
    }
    (!script.is_empty()).then_some(script)
}

fn restore_sysctls() {
    let Ok(saved) = std::fs::read_to_string(sysctl_file()) else { return };
    for line in saved.lines() {
        if let Some((key, value)) = line.split_once('=')
            && !value.is_empty()
        {
            let _ = run("sysctl", &["-qw", &format!("{key}={value}")]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = r#"# Generated by iptables-save
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:WAYCAST-GUARD - [0:0]
:DOCKER-USER - [0:0]
-A INPUT -j WAYCAST-GUARD
-A INPUT -p tcp --dport 22 -j ACCEPT
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -j DOCKER-USER
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A WAYCAST-GUARD -p tcp --dport 6443 -i lo -j RETURN
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
COMMIT
"#;

    #[test]
    fn only_the_harness_chains_and_the_jumps_to_them_are_removed() {
        let script = removal_script(DUMP, &["WAYCAST-"]).unwrap();
        assert_eq!(script, "*filter\n-D INPUT -j WAYCAST-GUARD\n-F WAYCAST-GUARD\n-X WAYCAST-GUARD\nCOMMIT\n");
        let owned = removal_script(DUMP, &["WAYCAST-", "KUBE-", "CNI-"]).unwrap();
        assert!(owned.contains("-D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n"));
        assert!(owned.contains("-X KUBE-FORWARD\n") && owned.contains("-X WAYCAST-GUARD\n"));
        for kept in ["DOCKER-USER", "dport 22", "MASQUERADE", "*nat"] {
            assert!(!owned.contains(kept), "{kept} would be touched:\n{owned}");
        }
        assert_eq!(removal_script(DUMP, &["CNI-"]), None, "nothing to remove");
        assert_eq!(chains_named(DUMP, KUBERNETES_CHAIN_PREFIXES), ["KUBE-FORWARD"]);
    }
}
