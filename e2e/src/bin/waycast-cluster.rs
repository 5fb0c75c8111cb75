//! `waycast-cluster`: runs a local waycast cluster until told to stop.
//!
//! ```text
//! waycast-cluster up [--node [--demo]] [--exit-on-stdin-eof] [--apply FILE]...
//! ```
//!
//! Starts the control plane (see `waycast_e2e::control_plane`) and, with
//! `--node`, a node with our images (see `waycast_e2e::node`; needs root),
//! installs the waycast CRDs, applies the given manifests, prints
//! `ready kubeconfig=<path>` on stdout, then waits for Ctrl-C, SIGTERM or —
//! with `--exit-on-stdin-eof`, as the test harness runs it — the end of its
//! standard input. Then it stops every component and removes its state.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use tokio::signal::unix::{SignalKind, signal};
use waycast_e2e::cluster::Cluster;
use waycast_e2e::control_plane;
use waycast_e2e::{harness, manifest};

struct Args {
    node: bool,
    demo: bool,
    exit_on_stdin_eof: bool,
    manifests: Vec<PathBuf>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some("up") {
        bail!("usage: waycast-cluster up [--node [--demo]] [--exit-on-stdin-eof] [--apply FILE]...");
    }
    let mut parsed = Args { node: false, demo: false, exit_on_stdin_eof: false, manifests: Vec::new() };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exit-on-stdin-eof" => parsed.exit_on_stdin_eof = true,
            "--node" => parsed.node = true,
            "--demo" => parsed.demo = true,
            "--apply" => parsed.manifests.push(args.next().context("--apply needs a file")?.into()),
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(parsed)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("waycast-cluster: {error}");
            return ExitCode::from(64);
        }
    };
    let root = control_plane::runs_root();
    control_plane::clean_stale_runs(&root);
    let state_dir = root.join(format!("run-{}", std::process::id()));
    let started = std::time::Instant::now();
    let cluster = match Cluster::start(state_dir.clone(), args.node).await {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("waycast-cluster: the cluster failed to start: {error:#}");
            let _ = std::fs::remove_dir_all(&state_dir);
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = apply(&cluster, &args.manifests).await {
        eprintln!("waycast-cluster: {error:#}");
        cluster.stop().await;
        return ExitCode::FAILURE;
    }
    if args.demo && args.node {
        let deployed = match cluster.plane.client().await {
            Ok(client) => waycast_e2e::workloads::deploy_demo(&client).await,
            Err(error) => Err(error),
        };
        match deployed {
            Ok(demo) => println!("demo gateway={} key={}", demo.gateway_ip, demo.key),
            Err(error) => {
                eprintln!("waycast-cluster: the demo failed to deploy: {error:#}");
                cluster.stop().await;
                std::process::exit(1);
            }
        }
    }
    let what = if args.node { "control plane and node" } else { "control plane" };
    eprintln!(
        "waycast-cluster: {what} ready in {:.1}s at {}",
        started.elapsed().as_secs_f64(),
        cluster.plane.server_url
    );
    println!("{}{}", harness::READY_PREFIX, cluster.plane.kubeconfig.display());
    let mut cluster = cluster;
    wait_for_stop(args.exit_on_stdin_eof, &mut cluster).await;
    eprintln!("waycast-cluster: stopping");
    // NB: `stop` consumes the cluster; the node lock inside it is released
    // only once tear-down has finished.
    cluster.stop().await;
    eprintln!("waycast-cluster: stopped");
    // NB: exit here rather than return: the runtime would otherwise wait
    // for the thread still blocked reading stdin.
    std::process::exit(0);
}

async fn apply(cluster: &Cluster, manifests: &[PathBuf]) -> anyhow::Result<()> {
    let client = cluster.plane.client().await?;
    for path in manifests {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let objects = manifest::parse_documents(&text).with_context(|| format!("parsing {}", path.display()))?;
        manifest::apply_all(&client, &objects, "default")
            .await
            .with_context(|| format!("applying {}", path.display()))?;
    }
    Ok(())
}

/// Waits for Ctrl-C, SIGTERM or (with `--exit-on-stdin-eof`) the end of
/// stdin. Lines on stdin are commands: `restart-apiserver`.
async fn wait_for_stop(exit_on_stdin_eof: bool, cluster: &mut Cluster) {
    use tokio::io::AsyncBufReadExt as _;
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let reading = exit_on_stdin_eof;
    loop {
        tokio::select! {
            line = lines.next_line(), if reading => match line {
                Ok(Some(command)) if command.trim() == "restart-apiserver" => {
                    eprintln!("waycast-cluster: restarting kube-apiserver");
                    if let Err(error) = cluster.plane.restart_apiserver().await {
                        eprintln!("waycast-cluster: kube-apiserver did not come back: {error:#}");
                    }
                }
                Ok(Some(other)) => eprintln!("waycast-cluster: unknown command {other:?}"),
                _ => return,
            },
            Some(()) = async { match terminate.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => return,
            _ = tokio::signal::ctrl_c() => return,
        }
    }
}
