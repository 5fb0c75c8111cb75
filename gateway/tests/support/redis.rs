//! A real `redis-server` (Debian's; `make node-deps` installs it) on a
//! loopback port for the tests of limits and budgets counted in Redis.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use waycast_crds::config::RedisConfig;
use waycast_mock::fixtures::free_port;
use waycast_mock::pki::{Authority, PemFiles, Usage};

pub const PASSWORD: &str = "redis-test-password";
pub const ACL_USER: &str = "limiter";
pub const ACL_PASSWORD: &str = "limiter-test-password";

/// A `redis-server` on a loopback port, with a password and no persistence;
/// with `tls`, it speaks only TLS and wants a client certificate.
pub struct Redis {
    pub port: u16,
    process: Option<Child>,
    tls: Option<PemFiles>,
    ca: Option<PathBuf>,
}

impl Redis {
    pub fn start() -> Self {
        let port = free_port(Ipv4Addr::LOCALHOST.into()).unwrap();
        let mut redis = Self { port, process: None, tls: None, ca: None };
        redis.restart();
        redis
    }

    /// A TLS-only server whose certificate (for 127.0.0.1) `authority` signs,
    /// and which admits clients whose certificates it signs too.
    pub fn start_tls(authority: &Authority, dir: &Path) -> Self {
        let server = authority.issue(dir, "redis", "redis", &[], &["127.0.0.1".into()], Usage::Server).unwrap();
        let port = free_port(Ipv4Addr::LOCALHOST.into()).unwrap();
        let mut redis = Self { port, process: None, tls: Some(server), ca: Some(authority.files.cert.clone()) };
        redis.restart();
        redis
    }

    pub fn restart(&mut self) {
        let mut command = Command::new("redis-server");
        match (&self.tls, &self.ca) {
            (Some(server), Some(ca)) => command
                .args(["--port", "0", "--tls-port", &self.port.to_string(), "--tls-auth-clients", "yes"])
                .arg("--tls-cert-file")
                .arg(&server.cert)
                .arg("--tls-key-file")
                .arg(&server.key)
                .arg("--tls-ca-cert-file")
                .arg(ca),
            _ => command.args(["--port", &self.port.to_string()]),
        };
        let child = command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--requirepass", PASSWORD])
            // An ACL user that may run the limiter's scripts on its keys only.
            .args(["--user", ACL_USER, "on", &format!(">{ACL_PASSWORD}"), "~waycast:*", "+@all"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (make node-deps installs it)");
        self.process = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.process.as_ref().unwrap().id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
    }

    /// Runs `redis-cli` against it; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "-a", PASSWORD, "--no-auth-warning"])
            .args(args)
            .output()
            .expect("redis-cli (Debian's redis-tools, with redis-server)");
        assert!(output.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    pub fn config(&self, fail_closed: bool) -> RedisConfig {
        RedisConfig {
            address: format!("127.0.0.1:{}", self.port),
            password: Some(PASSWORD.into()),
            username: None,
            timeout: Duration::from_millis(100),
            fail_closed,
            tls: None,
            key_prefix: None,
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
