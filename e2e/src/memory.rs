//! A process's resident memory as the benchmarks report it: read from
//! `/proc`, and sampled through a run so each phase can report its own
//! peak (`VmHWM` only gives the whole run's).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A field of `/proc/<pid>/status` in kB (`VmRSS:`, `VmHWM:`), in MiB; 0
/// when the process is gone.
pub fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Samples a process's resident memory every 20 ms until finished.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<Vec<(Instant, f64)>>,
}

impl RssSampler {
    /// Starts sampling `pid`.
    pub fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                samples.push((Instant::now(), status_mib(pid, "VmRSS:")));
                std::thread::sleep(Duration::from_millis(20));
            }
            samples
        });
        Self { stop, sampler }
    }

    /// Stops sampling; the samples taken.
    ///
    /// # Panics
    /// When the sampling thread panicked.
    pub fn finish(self) -> RssSamples {
        self.stop.store(true, Ordering::Relaxed);
        #[expect(clippy::expect_used, reason = "the sampler only reads /proc; its panic is a bug to see")]
        RssSamples(self.sampler.join().expect("the RSS sampler"))
    }
}

/// Resident memory samples: when, and MiB.
pub struct RssSamples(Vec<(Instant, f64)>);

impl RssSamples {
    /// The highest resident memory seen between `from` and `to`, and the last.
    pub fn peak_and_last(&self, from: Instant, to: Instant) -> (f64, f64) {
        let phase: Vec<f64> = self.0.iter().filter(|(at, _)| *at >= from && *at <= to).map(|(_, rss)| *rss).collect();
        (phase.iter().copied().fold(0.0, f64::max), phase.last().copied().unwrap_or(0.0))
    }
}
