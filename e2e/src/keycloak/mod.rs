//! Keycloak, a real OpenID provider, started by tests that sign in:
//! installed from Maven Central by `e2e/scripts/install-keycloak.sh`
//! (`make keycloak`, a prerequisite of `make test`), run from that cache
//! with a throwaway TLS certificate and H2 database, configured through
//! its real admin REST API.
//!
//! ```text
//! Keycloak::start(bind) ─► kc.sh start --optimized (https://bind:port, its own process group)
//!   └─ waits for /health/ready on the management port
//! admin API (master realm's admin-cli, password grant) ─► realms, clients, groups, users, keys
//! token endpoint ─► password and client-credentials grants, as a user or workload would
//! ```
//!
//! Issuers must be `https` for the gateway, so Keycloak serves only TLS,
//! from a certificate for the bind address signed by a CA generated per
//! instance ([`Keycloak::ca_pem`] is what an operator is told to trust).

mod admin;
mod client;
mod spec;

pub use spec::{ClientSpec, OldKeys, Tokens, UserSpec, decode_jwt};

use std::net::IpAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use http::{Method, StatusCode};
use serde_json::Value;

use crate::wait::{Seen, await_condition, within};
use client::Http;

/// A start takes about 20 s on two busy cores; a loaded CI machine gets
/// several times that.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// Where `install-keycloak.sh` put Keycloak, and the Java it runs on.
#[derive(Debug, Clone)]
pub struct Installation {
    /// The pre-built Keycloak home (`bin/kc.sh`).
    pub home: PathBuf,
    /// A Java 21 or newer.
    pub java_home: PathBuf,
    /// The H2 database each instance starts from a copy of: schema, master
    /// realm and administrator made (a fresh one costs a start ~10 s).
    pub db_template: PathBuf,
    /// The master realm's administrator in that database.
    pub admin_user: String,
    /// Its password (the instance listens only where a test binds it and
    /// lives as long as the test).
    pub admin_password: String,
}

/// The installed Keycloak, as `install-keycloak.sh --find` reports it
/// (installing nothing).
///
/// # Errors
/// Keycloak or a Java 21 is missing; the message says which and how to
/// install it.
pub fn installation() -> anyhow::Result<Installation> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-keycloak.sh");
    let found = Command::new("bash").arg(&script).arg("--find").output().context("running install-keycloak.sh")?;
    let stdout = String::from_utf8_lossy(&found.stdout);
    let value = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let reported = (value("kc_home"), value("java_home"), value("db_template"), value("admin_user"));
    match (found.status.success(), reported, value("admin_password")) {
        (true, (Some(home), Some(java_home), Some(db_template), Some(admin_user)), Some(admin_password)) => {
            Ok(Installation {
                home: home.into(),
                java_home: java_home.into(),
                db_template: db_template.into(),
                admin_user,
                admin_password,
            })
        }
        _ => bail!("{} (run `make keycloak`)", String::from_utf8_lossy(&found.stderr).trim()),
    }
}

/// Whether a missing Keycloak fails a test instead of skipping it: under
/// `make test` (`WAYCAST_REQUIRE_UPSTREAM_SERVERS=1`) and in CI.
pub fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("WAYCAST_REQUIRE_UPSTREAM_SERVERS").is_ok_and(|v| v == "1")
}

/// A running Keycloak, killed (with its Java process) on drop.
pub struct Keycloak {
    /// `https://bind:port`, no trailing slash.
    base: String,
    management: String,
    ca_pem: String,
    admin_user: String,
    admin_password: String,
    http: Http,
    process: Child,
    dir: PathBuf,
}

impl Keycloak {
    /// Starts Keycloak on `bind` (loopback, or the e2e node's bridge
    /// address for pods), HTTPS only, on free ports, and waits until it is
    /// ready.
    ///
    /// # Errors
    /// Keycloak not installed, or not ready within two minutes (with the
    /// end of its log).
    pub async fn start(bind: IpAddr) -> anyhow::Result<Self> {
        let installation = installation()?;
        let port = waycast_mock::fixtures::free_port(bind)?;
        let management_port = waycast_mock::fixtures::free_port(bind)?;
        let dir = std::env::temp_dir().join(format!("waycast-keycloak-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let authority = waycast_mock::pki::Authority::generate(&dir, "ca")?;
        let serving = authority.issue(
            &dir,
            "tls",
            "waycast-e2e keycloak",
            &[],
            &[bind.to_string()],
            waycast_mock::pki::Usage::Server,
        )?;
        let ca_pem = std::fs::read_to_string(&authority.files.cert).context("reading the CA certificate")?;
        let http = Http::trusting(&ca_pem)?;
        let host = match bind {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let base = format!("https://{host}:{port}");
        std::fs::create_dir_all(dir.join("db"))?;
        std::fs::copy(&installation.db_template, dir.join("db/keycloak.mv.db"))
            .with_context(|| format!("copying {}", installation.db_template.display()))?;
        let log_path = dir.join("keycloak.log");
        let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let process = Command::new(installation.home.join("bin/kc.sh"))
            .arg("start")
            .arg("--optimized")
            // Per instance, so that tests can run side by side from one
            // installation: the transaction log (else under the home).
            .arg(format!("-Dquarkus.transaction-manager.object-store.directory={}", dir.join("tx").display()))
            .arg("--cache=local")
            .arg(format!("--db-url=jdbc:h2:file:{};NON_KEYWORDS=VALUE", dir.join("db/keycloak").display()))
            .arg(format!("--http-host={bind}"))
            .arg(format!("--https-port={port}"))
            .arg(format!("--http-management-port={management_port}"))
            // Tokens carry `iss` from this: the address tests reach.
            .arg(format!("--hostname={base}"))
            .arg(format!("--https-certificate-file={}", serving.cert.display()))
            .arg(format!("--https-certificate-key-file={}", serving.key.display()))
            .env("JAVA_HOME", &installation.java_home)
            // C1 only: a test's Keycloak answers a few hundred requests,
            // and C2's compiles cost more CPU than they save (ready in
            // 21 s instead of 35 s on two busy cores).
            .env("JAVA_OPTS_APPEND", "-XX:TieredStopAtLevel=1")
            // kc.sh keeps Java as its child rather than exec'ing it: a
            // group of its own lets drop kill both.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting kc.sh")?;
        let started = std::time::Instant::now();
        let mut keycloak = Self {
            management: format!("https://{host}:{management_port}"),
            http,
            base,
            ca_pem,
            admin_user: installation.admin_user,
            admin_password: installation.admin_password,
            process,
            dir,
        };
        keycloak.await_ready().await.map_err(|error| {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            error.context(format!("Keycloak's log ends:\n{}", tail.join("\n")))
        })?;
        eprintln!("keycloak: ready at {} after {:.1?}", keycloak.base, started.elapsed());
        Ok(keycloak)
    }

    /// [`Keycloak::start`], or `None` when Keycloak is not installed and
    /// the run does not require it (the test then prints a loud SKIPPED).
    ///
    /// # Errors
    /// Keycloak is missing under `make test` or in CI (saying how to
    /// install it), or it did not start.
    pub async fn start_or_skip(bind: IpAddr, test: &str) -> anyhow::Result<Option<Self>> {
        if let Err(missing) = installation() {
            ensure!(!required(), "{test}: Keycloak is not installed: {missing:#}");
            eprintln!("\n*** SKIPPED {test}: {missing:#} (under `make test` or CI this fails) ***\n");
            return Ok(None);
        }
        Self::start(bind).await.map(Some)
    }

    async fn await_ready(&mut self) -> anyhow::Result<()> {
        let ready = format!("{}/health/ready", self.management);
        let patience = within(READY_WITHIN).every(Duration::from_millis(250));
        await_condition(format!("Keycloak is ready at {}", self.base), patience, async || {
            if let Some(status) = self.process.try_wait()? {
                bail!("Keycloak exited ({status})");
            }
            Ok(match self.http.send(Method::GET, &ready, None, None).await {
                Ok((StatusCode::OK, _)) => Seen::Done(()),
                Ok((status, _)) => Seen::NotYet(format!("{ready} answered {status}")),
                Err(error) => Seen::NotYet(format!("{ready}: {error:#}")),
            })
        })
        .await
    }

    /// `https://bind:port`, where Keycloak serves.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The issuer of `realm`'s tokens (`iss`), as a Gateway's provider names it.
    pub fn issuer(&self, realm: &str) -> String {
        format!("{}/realms/{realm}", self.base)
    }

    /// The PEM of the CA that signed Keycloak's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// GETs `url` (Keycloak's, or any the CA's certificate serves) as JSON:
    /// discovery documents, key sets.
    ///
    /// # Errors
    /// Not a 200 with JSON.
    pub async fn get_json(&self, url: &str) -> anyhow::Result<Value> {
        self.http.expect(Method::GET, url, None, None, StatusCode::OK).await
    }

    /// `realm`'s OpenID discovery document.
    ///
    /// # Errors
    /// As [`Keycloak::get_json`].
    pub async fn discovery(&self, realm: &str) -> anyhow::Result<Value> {
        self.get_json(&format!("{}/.well-known/openid-configuration", self.issuer(realm))).await
    }
}

impl Drop for Keycloak {
    fn drop(&mut self) {
        // The whole group: kc.sh and the Java it waits on.
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.process.id())]).status();
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
