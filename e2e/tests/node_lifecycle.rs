//! The node leaves the machine as it found it: iptables rules, mounts,
//! network links, network namespaces and the sysctls it touches are the
//! same after tear-down as before bring-up — also when the first run was
//! killed with SIGKILL and a second bring-up had to clean up after it. And
//! beside another node's state it refuses to start and touches nothing.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use waycast_e2e::harness::start_supervisor;
use waycast_e2e::node::{BRIDGE, NODE_ROOT};
use waycast_e2e::wait::{await_condition_blocking, within};

#[derive(Debug, PartialEq, Eq)]
struct MachineState {
    iptables: BTreeSet<String>,
    ip6tables: BTreeSet<String>,
    mounts: BTreeSet<String>,
    links: BTreeSet<String>,
    netns: BTreeSet<String>,
    sysctls: Vec<String>,
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The rules of an iptables dump, without counters and comments, and
/// without tables that hold nothing (no rules, builtin chains accepting):
/// listing a table can create it, which changes nothing that matters.
fn rules(dump: &str) -> BTreeSet<String> {
    let mut kept = BTreeSet::new();
    let mut table = String::new();
    let mut lines = Vec::new();
    let flush = |table: &str, lines: &mut Vec<String>, kept: &mut BTreeSet<String>| {
        let meaningful = lines.iter().any(|l| l.starts_with("-A") || (l.starts_with(':') && !l.contains(" ACCEPT")));
        if meaningful {
            kept.extend(lines.iter().map(|l| format!("{table} {l}")));
        }
        lines.clear();
    };
    for line in dump.lines() {
        if line.starts_with('#') || line == "COMMIT" {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            flush(&table, &mut lines, &mut kept);
            table = name.to_owned();
            continue;
        }
        let without_counters = match line.rfind(" [") {
            Some(at) if line.starts_with(':') => &line[..at],
            _ => line,
        };
        lines.push(without_counters.to_owned());
    }
    flush(&table, &mut lines, &mut kept);
    kept
}

fn machine_state() -> MachineState {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    MachineState {
        iptables: rules(&output("iptables-save", &[])),
        ip6tables: rules(&output("ip6tables-save", &[])),
        mounts: mounts.lines().map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).collect(),
        links: output("ip", &["-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().to_owned())
            .collect(),
        netns: output("ip", &["netns", "list"]).lines().map(str::to_owned).collect(),
        sysctls: [
            "net.ipv4.ip_forward",
            "net.bridge.bridge-nf-call-iptables",
            "kernel.panic",
            "kernel.panic_on_oops",
            "vm.overcommit_memory",
        ]
        .iter()
        .map(|key| format!("{key}={}", output("sysctl", &["-n", key]).trim()))
        .collect(),
    }
}

fn wait_exit(child: &mut std::process::Child, timeout: Duration) {
    await_condition_blocking("the supervisor stops", within(timeout), || child.try_wait().unwrap().is_some()).unwrap();
}

#[test]
fn bring_up_and_tear_down_leave_the_machine_as_found_even_after_a_kill_9() {
    let supervisor = env!("CARGO_BIN_EXE_waycast-cluster");
    // A node from an earlier test binary may still be tearing down.
    drop(waycast_e2e::node::lock().unwrap());
    let before = machine_state();

    // A first run, killed without a chance to clean up.
    let (first, mut first_child) = start_supervisor(supervisor, true).unwrap();
    first_child.kill().unwrap();
    first_child.wait().unwrap();
    drop(first);
    assert!(output("ip", &["link", "show", BRIDGE]).contains(BRIDGE), "the killed run's node should still be there");
    assert!(std::path::Path::new(NODE_ROOT).exists());

    // A second run cleans up after it and comes up.
    let started = Instant::now();
    let (second, mut second_child) = start_supervisor(supervisor, true).unwrap();
    eprintln!("second bring-up (incl. cleaning the killed run) took {:?}", started.elapsed());
    let during = machine_state();
    assert_ne!(during, before, "a running node changes the machine (or this test sees nothing)");

    // Closing its stdin stops it; everything it made goes away.
    drop(second);
    wait_exit(&mut second_child, Duration::from_secs(60));
    drop(waycast_e2e::node::lock().unwrap());
    let after = machine_state();
    if after != before {
        let diff = |name: &str, a: &BTreeSet<String>, b: &BTreeSet<String>| {
            format!(
                "{name}: gone {:?}, new {:?}",
                a.difference(b).collect::<Vec<_>>(),
                b.difference(a).collect::<Vec<_>>()
            )
        };
        panic!(
            "the machine changed:\n{}\n{}\n{}\n{}\n{}\nsysctls {:?} -> {:?}",
            diff("iptables", &before.iptables, &after.iptables),
            diff("ip6tables", &before.ip6tables, &after.ip6tables),
            diff("mounts", &before.mounts, &after.mounts),
            diff("links", &before.links, &after.links),
            diff("netns", &before.netns, &after.netns),
            before.sysctls,
            after.sysctls
        );
    }
    // Every process of a run names its state directory on its command line.
    let leftovers = output("pgrep", &["-f", "waycast-e2e/run-|/var/lib/waycast-e2e|/run/waycast-e2e"]);
    assert!(leftovers.trim().is_empty(), "processes left running: {leftovers}");

    // Then (in the same test: node bring-ups run one at a time) beside
    // another node's state.
    another_nodes_state_is_refused_and_left_alone(supervisor);
}

/// Another node's state on the machine (here a kube-proxy-style chain with
/// a jump to it, as k3s or kind leave): the harness refuses to start,
/// naming it, and leaves it exactly as it was.
fn another_nodes_state_is_refused_and_left_alone(supervisor: &str) {
    let chain = "KUBE-SOMEONE-ELSE";
    let iptables = |args: &[&str]| Command::new("iptables").args(args).status().unwrap().success();
    assert!(iptables(&["-N", chain]));
    assert!(iptables(&["-A", "FORWARD", "-j", chain]));
    let before = machine_state();

    let refused = start_supervisor(supervisor, true).map(drop);
    drop(waycast_e2e::node::lock().unwrap());
    let after = machine_state();
    // Removed before asserting, so a failure does not leave it behind.
    let _ = iptables(&["-D", "FORWARD", "-j", chain]);
    let _ = iptables(&["-X", chain]);

    let message = format!("{:#}", refused.expect_err("the harness started beside another node's state"));
    assert!(message.contains("did not start") && message.contains(chain), "{message}");
    assert_eq!(after.iptables, before.iptables, "the other node's rules were touched");
    assert!(!std::path::Path::new(NODE_ROOT).exists(), "the refused run left its state directory");
}
