//! Child processes of a cluster run: started from a clean environment with
//! their output in a log file, their PIDs recorded (so a later run can clean
//! up after a crash), checked for early exits, killed on stop.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};

/// A binary of this build: next to the running one, or one directory up
/// when the running one is a test in `target/<profile>/deps/`.
///
/// # Errors
/// The binary is missing (the workspace's binaries were not built).
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running binary")?;
    let mut dir = exe.parent().context("the running binary has no directory")?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().context("deps/ has no parent")?;
    }
    let path = dir.join(name);
    anyhow::ensure!(
        path.is_file(),
        "{} is missing: build the workspace's binaries first (make test does)",
        path.display()
    );
    Ok(path)
}

/// One supervised process.
struct Supervised {
    name: String,
    child: tokio::process::Child,
    log: PathBuf,
}

/// The processes of one run, stopped in reverse start order.
pub struct Processes {
    state_dir: PathBuf,
    running: Vec<Supervised>,
}

impl Processes {
    /// An empty group whose logs and PID list live in `state_dir`.
    pub fn new(state_dir: PathBuf) -> Self {
        Self { state_dir, running: Vec::new() }
    }

    /// Starts `binary` with `args` and `env` (nothing else is inherited but
    /// `PATH`), logging to `<state_dir>/<name>.log`.
    ///
    /// # Errors
    /// The log file or the process cannot be created.
    pub fn spawn(&mut self, name: &str, binary: &Path, args: &[String], env: &[(&str, String)]) -> anyhow::Result<u32> {
        let log = self.state_dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = tokio::process::Command::new(binary);
        command
            .args(args)
            // etcd reads every ETCD_* variable as a flag, and Go tooling reads
            // many more: start each component from a clean environment.
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.state_dir)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().unwrap_or_default();
        record_pid(&self.state_dir, pid)?;
        self.running.push(Supervised { name: name.to_owned(), child, log });
        Ok(pid)
    }

    /// Fails with the log tail of the first process that has exited.
    ///
    /// # Errors
    /// A process exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for process in &mut self.running {
            if let Some(status) = process.child.try_wait()? {
                bail!("{} exited ({status}); its log ends with:\n{}", process.name, log_tail(&process.log, 30));
            }
        }
        Ok(())
    }

    /// Kills every process, newest first, and waits for each.
    pub async fn stop(&mut self) {
        while let Some(mut process) = self.running.pop() {
            let _ = process.child.kill().await;
        }
    }

    /// Kills the named process, if it runs.
    pub async fn stop_one(&mut self, name: &str) {
        if let Some(index) = self.running.iter().position(|p| p.name == name) {
            let mut process = self.running.remove(index);
            let _ = process.child.kill().await;
        }
    }
}

fn record_pid(state_dir: &Path, pid: u32) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(state_dir.join("pids"))?;
    writeln!(file, "{pid}")?;
    Ok(())
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs a command to completion.
///
/// # Errors
/// It cannot start or exits unsuccessfully (the error has its stderr).
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output =
        std::process::Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!("{program} {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A child process killed (and reaped) when dropped: a benchmark's
/// operator or gateway run as a process.
pub struct KilledOnDrop(pub std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The directory under which each run keeps its state: `run-<pid>` where
/// `pid` is the process that owns it.
pub fn runs_root() -> PathBuf {
    std::env::temp_dir().join("waycast-e2e")
}

/// Kills the processes of runs whose owner died without cleaning up (a
/// `kill -9`, a crash) and removes their state.
///
/// Only processes whose command line mentions the dead run's directory are
/// killed, so a reused PID is never hit.
pub fn clean_stale_runs(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(owner) = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("run-")) else {
            continue;
        };
        if Path::new("/proc").join(owner).exists() {
            continue;
        }
        let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
        let marker = dir.display().to_string();
        for pid in pids.lines().map(str::trim).filter(|p| !p.is_empty()) {
            let cmdline = std::fs::read(Path::new("/proc").join(pid).join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&marker) {
                let _ = std::process::Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
