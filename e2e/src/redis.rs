//! A `redis-server` (Debian's, installed by `make node-deps`) on the e2e
//! node's bridge address, where gateway pods reach it: the Redis a
//! Gateway's `rateLimit.redis` names in node tests and benchmarks.

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

use crate::wait::{await_condition_blocking, within};

/// A running `redis-server`, killed on drop.
pub struct HostRedis {
    /// `host:port`, as a Gateway names it.
    pub address: String,
    process: Child,
}

impl HostRedis {
    /// Starts one on `bind` (the node's bridge address, for pods), on a
    /// free port, without persistence.
    ///
    /// # Errors
    /// `redis-server` missing, or not listening within 10 s.
    pub fn start(bind: IpAddr) -> anyhow::Result<Self> {
        let port = waycast_mock::fixtures::free_port(bind)?;
        let process = Command::new("redis-server")
            .args(["--bind", &bind.to_string(), "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting redis-server (make node-deps installs it)")?;
        let redis = Self { address: format!("{bind}:{port}"), process };
        let patience = within(Duration::from_secs(10)).every(Duration::from_millis(20));
        await_condition_blocking(format!("redis-server listens on {bind}:{port}"), patience, || {
            std::net::TcpStream::connect(SocketAddr::new(bind, port)).is_ok()
        })?;
        Ok(redis)
    }
}

impl Drop for HostRedis {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
