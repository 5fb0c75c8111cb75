//! The processes a benchmark starts and measures from the outside: pinning
//! with `taskset`, readiness by a raw HTTP/1.1 exchange, and CPU time and
//! resident memory read from /proc — of one process, or of a process and
//! all its descendants (nginx's workers, a Python server's children).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A started process; it and every process it started are killed on drop.
pub struct Process(pub Child);

impl Process {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// How it ended, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().ok().flatten()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Children first, read before the parent dies and they are
        // re-parented: nginx's workers outlive a killed master otherwise.
        let descendants: Vec<String> = process_tree(self.0.id())
            .into_iter()
            .filter(|&pid| pid != self.0.id())
            .map(|pid| pid.to_string())
            .collect();
        let _ = self.0.kill();
        let _ = self.0.wait();
        if !descendants.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(&descendants).status();
        }
    }
}

/// `program` under `taskset -c CPUS` when `cpus` (a taskset list: `0`, `0-3`) is given.
pub fn pinned(cpus: Option<&str>, program: &Path) -> Command {
    match cpus {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpus).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// How many CPUs a taskset list names (`0`, `0-3`, `0,2-3`); 1 for a list it cannot read.
pub fn cpu_count(cpus: &str) -> usize {
    let count: usize = cpus
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((low, high)) => match (low.trim().parse::<usize>(), high.trim().parse::<usize>()) {
                (Ok(low), Ok(high)) if high >= low => high - low + 1,
                _ => 0,
            },
            None => usize::from(part.trim().parse::<usize>().is_ok()),
        })
        .sum();
    count.max(1)
}

/// A free port on 127.0.0.1.
///
/// # Errors
/// No port can be bound.
pub fn local_address() -> anyhow::Result<SocketAddr> {
    let port = waycast_mock::fixtures::free_port(std::net::Ipv4Addr::LOCALHOST.into())?;
    Ok(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)))
}

/// Starts `waycast-bench sink` (the `bench` binary, pinned to `cpus`) with
/// `answers` (its default-answer flags) on a free port, once it answers.
///
/// # Errors
/// It cannot start or does not answer within 10 s.
pub async fn start_sink(bench: &Path, cpus: Option<&str>, answers: &[String]) -> anyhow::Result<(Process, SocketAddr)> {
    let address = local_address()?;
    let process = Process(
        pinned(cpus, bench)
            .args(["sink", "--listen", &address.to_string()])
            .args(answers)
            .stdin(std::process::Stdio::null())
            .spawn()
            .context("starting the sink")?,
    );
    wait_for(address, &get("/v1/models"), Duration::from_secs(10)).await?;
    Ok((process, address))
}

/// A minimal HTTP/1.1 exchange on a fresh connection: (status, body).
pub async fn raw_request(address: SocketAddr, request: &[u8]) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(address).await.ok()?;
    stream.write_all(request).await.ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// A `GET` that closes its connection.
pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").into_bytes()
}

/// A small chat completion for `model` with `key` under the path
/// `prefix` (usually empty), on a connection it closes.
pub fn chat(prefix: &str, key: &str, model: &str) -> Vec<u8> {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    format!(
        "POST {prefix}/v1/chat/completions HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `request` until it is answered 200; how long that took.
///
/// # Errors
/// No 200 within `deadline`.
pub async fn wait_for(address: SocketAddr, request: &[u8], deadline: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if raw_request(address, request).await.is_some_and(|(status, _)| status == 200) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > deadline {
            bail!("{address} did not answer 200 within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// (parent pid, user + system ticks) of a process, from /proc/PID/stat.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at ") ".
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let parent = fields.get(1)?.parse().ok()?;
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((parent, ticks))
}

/// User + system CPU seconds a process has used (/proc counts USER_HZ = 100 ticks per second).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat(pid).map(|(_, ticks)| ticks as f64 / 100.0)
}

/// `root` and every live process below it.
pub fn process_tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok())
                && let Some((parent, _)) = stat(pid)
            {
                children.entry(parent).or_default().push(pid);
            }
        }
    }
    let mut tree = vec![root];
    let mut next = 0;
    while let Some(&pid) = tree.get(next) {
        tree.extend(children.get(&pid).into_iter().flatten());
        next += 1;
    }
    tree
}

/// CPU seconds used by `root` and its live descendants.
pub fn tree_cpu_seconds(root: u32) -> f64 {
    process_tree(root).into_iter().filter_map(stat).map(|(_, ticks)| ticks as f64 / 100.0).sum()
}

/// A memory figure of /proc/PID/status (`VmHWM:` the peak, `VmRSS:` now), in MiB.
pub fn memory_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 =
        status.lines().find_map(|l| l.strip_prefix(field))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

/// The highest resident memory a process has had, in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    memory_mib(pid, "VmHWM:")
}

/// Resident memory of `root` and its live descendants now, in MiB.
pub fn tree_rss_mib(root: u32) -> f64 {
    process_tree(root).into_iter().filter_map(|pid| memory_mib(pid, "VmRSS:")).sum()
}

/// Samples a process tree's resident memory every few milliseconds until
/// stopped: a tree has no kernel-kept peak, as one process has VmHWM.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<f64>,
}

impl RssSampler {
    /// Starts sampling `root`'s tree.
    pub fn start(root: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = 0.0_f64;
            while !stopped.load(Ordering::Relaxed) {
                peak = peak.max(tree_rss_mib(root));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak.max(tree_rss_mib(root))
        });
        Self { stop, thread }
    }

    /// The highest sum seen, in MiB.
    pub fn peak_mib(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taskset_lists_are_counted() {
        assert_eq!(cpu_count("0"), 1);
        assert_eq!(cpu_count("0-3"), 4);
        assert_eq!(cpu_count("0,2-3"), 3);
        assert_eq!(cpu_count("x"), 1);
    }

    #[test]
    fn a_process_tree_holds_its_children_and_their_memory() {
        let shell = Process(Command::new("sh").args(["-c", "sleep 30 & sleep 30 & wait"]).spawn().expect("sh runs"));
        let root = shell.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_tree(root).len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let tree = process_tree(root);
        assert_eq!(tree.len(), 3, "the shell and its two sleeps: {tree:?}");
        assert!(tree_rss_mib(root) > memory_mib(root, "VmRSS:").unwrap_or(f64::MAX));
        drop(shell);
        std::thread::sleep(Duration::from_millis(100));
        for pid in tree {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            assert!(state.is_empty() || state.contains(") Z "), "{pid} outlived its tree: {state}");
        }
    }
}
