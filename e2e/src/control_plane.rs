//! A real Kubernetes control plane on loopback: etcd, kube-apiserver (TLS,
//! RBAC, ServiceAccount token signing) and kube-controller-manager (garbage
//! collection, ServiceAccounts, Deployments, HPA), started as child processes
//! from binaries built by `e2e/scripts/build-k8s.sh`.
//!
//! ```text
//! ControlPlane::start
//!   ├─ pki: CA, apiserver serving cert, admin + controller-manager client certs, SA key
//!   ├─ etcd            127.0.0.1:<free>       (plain HTTP, loopback only)
//!   ├─ kube-apiserver  <bind>:<free>          (waits for /readyz)
//!   └─ kube-controller-manager                (waits for the default ServiceAccount)
//! ```
//!
//! The options leave room for a node (kubelet, kube-proxy) to join: the API
//! server can bind a non-loopback address, advertise it, and carry more SANs.
//! Processes die with the [`ControlPlane`] (`kill_on_drop`); a crashed run's
//! leftovers are removed by [`clean_stale_runs`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::process::Processes;
pub use crate::process::{clean_stale_runs, runs_root};
use crate::wait::{Seen, await_condition, within};
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;

use waycast_mock::pki::{self, Authority, Usage};

/// The Service CIDR of every e2e cluster.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The ClusterIP of the `kubernetes` Service in [`SERVICE_CIDR`].
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The ServiceAccount token issuer and audience.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Directory for certificates, etcd data, logs and kubeconfigs. Created;
    /// removed by [`ControlPlane::stop`].
    pub state_dir: PathBuf,
    /// Address the API server listens on.
    pub bind_address: IpAddr,
    /// Address the API server advertises (for the `kubernetes` Service).
    pub advertise_address: IpAddr,
    /// More SANs for the serving certificate (e.g. a node bridge address).
    pub extra_sans: Vec<String>,
    /// With a node: the bridge address pods reach the API server at. The API
    /// server then binds all addresses (guarded by iptables), advertises
    /// this one, talks to the kubelet, serves aggregated APIs, and a
    /// scheduler runs.
    pub node_bridge: Option<IpAddr>,
    /// The API server's port; a free one when `None`.
    pub apiserver_port: Option<u16>,
}

impl ControlPlaneOptions {
    /// Loopback-only options with the given state directory.
    pub fn loopback(state_dir: PathBuf) -> Self {
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        Self {
            state_dir,
            bind_address: loopback,
            advertise_address: loopback,
            extra_sans: Vec::new(),
            node_bridge: None,
            apiserver_port: None,
        }
    }

    /// Options for a control plane a node joins at `bridge`.
    pub fn for_node(state_dir: PathBuf, bridge: IpAddr) -> Self {
        Self {
            state_dir,
            bind_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            advertise_address: bridge,
            extra_sans: vec![bridge.to_string()],
            node_bridge: Some(bridge),
            apiserver_port: None,
        }
    }
}

/// A running control plane.
pub struct ControlPlane {
    /// Where its files live.
    pub state_dir: PathBuf,
    /// An admin (`system:masters`) kubeconfig.
    pub kubeconfig: PathBuf,
    /// `https://<address>:<port>` of the API server.
    pub server_url: String,
    /// The CA certificate, for components that join later.
    pub ca: PathBuf,
    /// The API server's port.
    pub port: u16,
    apiserver: (PathBuf, Vec<String>),
    processes: Processes,
    /// The certificate authority (with its key), to issue node certificates.
    pub authority: Authority,
    /// Where certificates and keys live.
    pub pki_dir: PathBuf,
}

/// Where a Kubernetes binary is: `$KUBEBUILDER_ASSETS/<name>` when present,
/// else the cache the build script fills (building it first if needed).
///
/// # Errors
/// The build script failing, or the binary still missing after it.
pub fn k8s_binary(name: &str) -> anyhow::Result<PathBuf> {
    if let Some(assets) = std::env::var_os("KUBEBUILDER_ASSETS") {
        let candidate = PathBuf::from(assets).join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let dir = k8s_bin_dir()?;
    let path = dir.join(name);
    if !path.is_file() {
        bail!("{} was not built by e2e/scripts/build-k8s.sh", path.display());
    }
    Ok(path)
}

fn k8s_bin_dir() -> anyhow::Result<PathBuf> {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-k8s.sh");
    // NB: the script builds whatever is missing (minutes, once) and prints the
    // directory on its last line; its progress goes to our stderr.
    let output = std::process::Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed ({})", script.display(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    Ok(DIR.get_or_init(|| dir).clone())
}

pub use waycast_mock::fixtures::free_port;

impl ControlPlane {
    /// Starts etcd, the API server and the controller-manager, and returns
    /// once the API server is ready and the controller-manager works.
    ///
    /// # Errors
    /// A binary missing, a process exiting early (the error carries the tail
    /// of its log), or readiness not reached within a minute.
    pub async fn start(options: ControlPlaneOptions) -> anyhow::Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once(options.clone()).await {
                Err(error) if attempt < START_ATTEMPTS && port_was_taken(&error) => {
                    // A port chosen free was bound by someone else before
                    // our server bound it (seen in CI for etcd's port): the
                    // failed attempt's processes died with it, so start
                    // afresh on new ports (the API server's stays when the
                    // caller chose it).
                    eprintln!(
                        "a control-plane port was taken before it was bound (attempt {attempt}); starting again: {error:#}"
                    );
                    let _ = std::fs::remove_dir_all(&options.state_dir);
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(options: ControlPlaneOptions) -> anyhow::Result<Self> {
        let etcd_bin = k8s_binary("etcd")?;
        let apiserver_bin = k8s_binary("kube-apiserver")?;
        let kcm_bin = k8s_binary("kube-controller-manager")?;

        let dir = options.state_dir.clone();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let pki_dir = dir.join("pki");
        std::fs::create_dir_all(&pki_dir)?;
        let ca = Authority::generate(&pki_dir, "ca")?;
        let mut sans: Vec<String> = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "127.0.0.1",
            KUBERNETES_SERVICE_IP,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        sans.push(options.advertise_address.to_string());
        sans.extend(options.extra_sans.iter().cloned());
        sans.sort();
        sans.dedup();
        let serving = ca.issue(&pki_dir, "apiserver", "kube-apiserver", &[], &sans, Usage::Server)?;
        let admin = ca.issue(&pki_dir, "admin", "waycast-e2e-admin", &["system:masters"], &[], Usage::Client)?;
        let kcm =
            ca.issue(&pki_dir, "controller-manager", "system:kube-controller-manager", &[], &[], Usage::Client)?;
        let service_account = pki::service_account_key(&pki_dir)?;
        let scheduler = ca.issue(&pki_dir, "scheduler", "system:kube-scheduler", &[], &[], Usage::Client)?;

        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let etcd_port = free_port(loopback)?;
        let mut etcd_peer_port = free_port(loopback)?;
        while etcd_peer_port == etcd_port {
            etcd_peer_port = free_port(loopback)?;
        }
        let apiserver_port = match options.apiserver_port {
            Some(port) => port,
            None => free_port(options.bind_address)?,
        };
        let server_url = format!("https://{}", SocketAddr::new(client_address(&options), apiserver_port));

        let kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(&kubeconfig, &server_url, &ca.files.cert, &admin)?;
        let kcm_kubeconfig = dir.join("controller-manager.kubeconfig");
        write_kubeconfig(&kcm_kubeconfig, &server_url, &ca.files.cert, &kcm)?;

        let scheduler_kubeconfig = dir.join("scheduler.kubeconfig");
        write_kubeconfig(&scheduler_kubeconfig, &server_url, &ca.files.cert, &scheduler)?;
        let path = |p: &Path| p.display().to_string();
        let mut node_flags = Vec::new();
        if options.node_bridge.is_some() {
            let kubelet_client = ca.issue(
                &pki_dir,
                "apiserver-kubelet-client",
                "kube-apiserver-kubelet-client",
                &["system:masters"],
                &[],
                Usage::Client,
            )?;
            let front_proxy_ca = Authority::generate(&pki_dir, "front-proxy-ca")?;
            let front_proxy =
                front_proxy_ca.issue(&pki_dir, "front-proxy-client", "front-proxy-client", &[], &[], Usage::Client)?;
            node_flags = vec![
                // Pods reach the API server through the `kubernetes` Service,
                // whose endpoint is the advertised bridge address.
                "--endpoint-reconciler-type=lease".to_owned(),
                format!("--kubelet-client-certificate={}", path(&kubelet_client.cert)),
                format!("--kubelet-client-key={}", path(&kubelet_client.key)),
                "--kubelet-preferred-address-types=InternalIP".to_owned(),
                format!("--requestheader-client-ca-file={}", path(&front_proxy_ca.files.cert)),
                "--requestheader-allowed-names=front-proxy-client".to_owned(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
                "--requestheader-group-headers=X-Remote-Group".to_owned(),
                "--requestheader-username-headers=X-Remote-User".to_owned(),
                format!("--proxy-client-cert-file={}", path(&front_proxy.cert)),
                format!("--proxy-client-key-file={}", path(&front_proxy.key)),
                "--enable-aggregator-routing=true".to_owned(),
            ];
        }
        let pki_dir_kept = pki_dir.clone();
        let ca_cert = ca.files.cert.clone();
        let mut plane = Self {
            state_dir: dir.clone(),
            kubeconfig,
            server_url,
            ca: ca_cert,
            port: apiserver_port,
            apiserver: (apiserver_bin.clone(), Vec::new()),
            processes: Processes::new(dir.clone()),
            authority: ca,
            pki_dir: pki_dir_kept,
        };
        let ca_files = plane.authority.files.clone();

        let etcd_client = format!("http://127.0.0.1:{etcd_port}");
        let etcd_peer = format!("http://127.0.0.1:{etcd_peer_port}");
        plane.spawn(
            "etcd",
            &etcd_bin,
            &[
                "--name=e2e".into(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_client}"),
                format!("--advertise-client-urls={etcd_client}"),
                format!("--listen-peer-urls={etcd_peer}"),
                format!("--initial-advertise-peer-urls={etcd_peer}"),
                format!("--initial-cluster=e2e={etcd_peer}"),
                // A throwaway cluster: durability buys nothing, fsync costs seconds.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        plane.wait_for_port("etcd", SocketAddr::new(loopback, etcd_port)).await?;

        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_client}"),
            format!("--bind-address={}", options.bind_address),
            format!("--advertise-address={}", options.advertise_address),
            format!("--secure-port={apiserver_port}"),
            format!("--tls-cert-file={}", path(&serving.cert)),
            format!("--tls-private-key-file={}", path(&serving.key)),
            format!("--client-ca-file={}", path(&ca_files.cert)),
            "--authorization-mode=Node,RBAC".into(),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!("--api-audiences={SERVICE_ACCOUNT_ISSUER}"),
            format!("--service-account-key-file={}", path(&service_account.cert)),
            format!("--service-account-signing-key-file={}", path(&service_account.key)),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=false".into(),
            // `/debug/pprof` on request, to see where the API server's time
            // goes under the scale benchmark (docs/performance.md).
            format!("--profiling={}", std::env::var_os("WAYCAST_E2E_APISERVER_PROFILING").is_some()),
            format!("--cert-dir={}", path(&pki_dir)),
        ];
        if node_flags.is_empty() {
            // Without a node, a reconciled `kubernetes` endpoint would point
            // at loopback, which means nothing inside a pod.
            apiserver_args.push("--endpoint-reconciler-type=none".into());
        }
        apiserver_args.extend(node_flags);
        plane.spawn("kube-apiserver", &apiserver_bin, &apiserver_args)?;
        plane.apiserver.1 = apiserver_args;
        plane.wait_for_apiserver().await?;

        plane.spawn(
            "kube-controller-manager",
            &kcm_bin,
            &[
                format!("--kubeconfig={}", path(&kcm_kubeconfig)),
                format!("--authentication-kubeconfig={}", path(&kcm_kubeconfig)),
                format!("--authorization-kubeconfig={}", path(&kcm_kubeconfig)),
                "--secure-port=0".into(),
                "--leader-elect=false".into(),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", path(&service_account.key)),
                format!("--root-ca-file={}", path(&ca_files.cert)),
                format!("--cluster-signing-cert-file={}", path(&ca_files.cert)),
                format!("--cluster-signing-key-file={}", path(&ca_files.key)),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--profiling=false".into(),
            ],
        )?;
        if options.node_bridge.is_some() {
            let scheduler_bin = k8s_binary("kube-scheduler")?;
            plane.spawn(
                "kube-scheduler",
                &scheduler_bin,
                &[
                    format!("--kubeconfig={}", path(&scheduler_kubeconfig)),
                    format!("--authentication-kubeconfig={}", path(&scheduler_kubeconfig)),
                    format!("--authorization-kubeconfig={}", path(&scheduler_kubeconfig)),
                    "--secure-port=0".into(),
                    "--leader-elect=false".into(),
                    "--profiling=false".into(),
                ],
            )?;
        }
        plane.wait_for_controller_manager().await?;
        Ok(plane)
    }

    /// A client with admin rights.
    ///
    /// # Errors
    /// The kubeconfig being unreadable.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Kills every process and removes the state directory.
    pub async fn stop(mut self) {
        // NB: SIGKILL is enough: nothing here needs to outlive the run.
        self.processes.stop().await;
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }

    /// Kills the API server and starts it again with the same flags (for
    /// resilience tests); returns once it is ready again.
    ///
    /// # Errors
    /// It does not come back.
    pub async fn restart_apiserver(&mut self) -> anyhow::Result<()> {
        self.processes.stop_one("kube-apiserver").await;
        let (binary, args) = self.apiserver.clone();
        self.spawn("kube-apiserver", &binary, &args)?;
        self.wait_for_apiserver().await
    }

    fn spawn(&mut self, name: &str, binary: &Path, args: &[String]) -> anyhow::Result<()> {
        self.processes.spawn(name, binary, args, &[]).map(drop)
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        self.processes.check_alive()
    }

    // Each wait below also ends at once when a component has died.

    async fn wait_for_port(&mut self, name: &str, address: SocketAddr) -> anyhow::Result<()> {
        let patience = within(Duration::from_secs(60)).every(Duration::from_millis(50));
        await_condition(format!("{name} listens on {address}"), patience, async || {
            if tokio::net::TcpStream::connect(address).await.is_ok() {
                return Ok(true);
            }
            self.check_alive().map(|()| false)
        })
        .await
    }

    async fn wait_for_apiserver(&mut self) -> anyhow::Result<()> {
        let client = self.client().await?;
        await_condition("kube-apiserver is ready", within(Duration::from_secs(90)), async || {
            let request = http::Request::get("/readyz").body(Vec::new())?;
            match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => Ok(Seen::Done(())),
                result => self.check_alive().map(|()| Seen::NotYet(format!("{result:?}"))),
            }
        })
        .await
    }

    async fn wait_for_controller_manager(&mut self) -> anyhow::Result<()> {
        // The ServiceAccount controller creating `default` proves the
        // controller-manager is up and authorised.
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client().await?, "default");
        let what = "kube-controller-manager creates the default ServiceAccount";
        await_condition(what, within(Duration::from_secs(90)), async || {
            if accounts.get_opt("default").await.ok().flatten().is_some() {
                return Ok(true);
            }
            self.check_alive().map(|()| false)
        })
        .await
    }
}

/// How often [`ControlPlane::start`] tries when a port it chose is taken.
const START_ATTEMPTS: u32 = 3;

/// Whether a start failed because a server could not bind its port: the
/// error carries the tail of the exited process's log.
fn port_was_taken(error: &anyhow::Error) -> bool {
    format!("{error:#}").contains("address already in use")
}

fn client_address(options: &ControlPlaneOptions) -> IpAddr {
    // Host-side clients use loopback even when the server binds everything.
    if options.bind_address.is_unspecified() { IpAddr::V4(Ipv4Addr::LOCALHOST) } else { options.bind_address }
}

/// A client from a kubeconfig file.
///
/// # Errors
/// The file being unreadable or invalid.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Writes a kubeconfig for a client certificate.
///
/// # Errors
/// The file write failing.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, client: &pki::PemFiles) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: waycast-e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: waycast-e2e\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: waycast-e2e\n  context:\n    cluster: waycast-e2e\n    user: waycast-e2e\n    namespace: default\ncurrent-context: waycast-e2e\n",
        ca = ca.display(),
        cert = client.cert.display(),
        key = client.key.display(),
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_port_taken_is_told_from_other_failures() {
        let log = "etcd exited (exit status: 1); its log ends with:\n{\"msg\":\"discovery failed\",\"error\":\"listen tcp 127.0.0.1:21354: bind: address already in use\"}";
        let taken = anyhow::anyhow!(log).context("starting the control plane");
        assert!(super::port_was_taken(&taken), "the cause under the context counts");
        let other = anyhow::anyhow!("etcd exited (exit status: 1); its log ends with:\npermission denied");
        assert!(!super::port_was_taken(&other));
    }
}
