//! What end-to-end tests use: one cluster per test binary, a client, and a
//! fresh namespace per test.
//!
//! The cluster is run by the `waycast-cluster` supervisor process with its
//! stdin connected to this process: when the test binary exits — passing,
//! failing, panicking or killed — the pipe closes and the supervisor stops
//! every component and removes its state. Set `WAYCAST_E2E_KUBECONFIG` to use
//! a cluster that is already running instead.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// The line the supervisor prints once the cluster is usable.
pub const READY_PREFIX: &str = "ready kubeconfig=";

/// A cluster shared by every test of one test binary.
pub struct SharedCluster {
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    // NB: held open for the life of the process; its closing stops the cluster.
    supervisor_stdin: Option<ChildStdin>,
}

static CLUSTER: OnceLock<Result<SharedCluster, String>> = OnceLock::new();

/// The shared control-plane-only cluster, started on first use by the
/// supervisor binary at `supervisor` (pass
/// `env!("CARGO_BIN_EXE_waycast-cluster")`).
///
/// # Panics
/// When the cluster cannot be started; every test using it then fails with
/// the reason.
pub fn shared_cluster(supervisor: &str) -> &'static SharedCluster {
    shared(supervisor, false)
}

/// The shared cluster with a node (kubelet, containerd, kube-proxy,
/// metrics-server and our images). Needs root.
///
/// # Panics
/// When the cluster cannot be started.
pub fn shared_cluster_with_node(supervisor: &str) -> &'static SharedCluster {
    shared(supervisor, true)
}

fn shared(supervisor: &str, node: bool) -> &'static SharedCluster {
    let result = CLUSTER.get_or_init(|| start_shared(supervisor, node).map_err(|error| format!("{error:#}")));
    match result {
        Ok(cluster) => cluster,
        Err(error) => panic!("the e2e cluster could not be started: {error}"),
    }
}

/// Starts a cluster supervisor and waits until it is ready.
///
/// # Errors
/// The supervisor exiting before it is ready (its log is in the error).
pub fn start_supervisor(supervisor: &str, node: bool) -> anyhow::Result<(SharedCluster, std::process::Child)> {
    let log_path = std::env::temp_dir().join(format!("waycast-cluster-{}-{}.log", std::process::id(), node));
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut command = Command::new(supervisor);
    command.args(["up", "--exit-on-stdin-eof"]);
    if node {
        command.arg("--node");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {supervisor}"))?;
    let stdout = child.stdout.take().context("supervisor stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(path) = line.strip_prefix(READY_PREFIX) {
            let cluster = SharedCluster { kubeconfig: PathBuf::from(path), supervisor_stdin: child.stdin.take() };
            return Ok((cluster, child));
        }
    }
    let status = child.wait()?;
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    bail!("waycast-cluster exited ({status}) before the cluster was ready:\n{log_text}")
}

fn start_shared(supervisor: &str, node: bool) -> anyhow::Result<SharedCluster> {
    if let Some(kubeconfig) = std::env::var_os("WAYCAST_E2E_KUBECONFIG") {
        return Ok(SharedCluster { kubeconfig: kubeconfig.into(), supervisor_stdin: None });
    }
    start_supervisor(supervisor, node).map(|(cluster, _child)| cluster)
}

impl SharedCluster {
    /// Asks the supervisor to restart the API server (it comes back within
    /// seconds; clients see errors meanwhile).
    ///
    /// # Panics
    /// When this cluster is not one the harness started.
    pub fn restart_apiserver(&self) {
        use std::io::Write as _;
        let mut stdin = self.supervisor_stdin.as_ref().expect("a cluster started by the harness");
        stdin.write_all(b"restart-apiserver\n").expect("supervisor reads commands");
    }

    /// A new admin client. Make one per test: a client belongs to the tokio
    /// runtime it was made on, and each `#[tokio::test]` has its own.
    ///
    /// # Panics
    /// When the kubeconfig cannot be read.
    pub async fn client(&self) -> Client {
        crate::control_plane::client_from_kubeconfig(&self.kubeconfig).await.expect("e2e kubeconfig is readable")
    }
}

/// Creates a namespace named `<prefix>-<unique suffix>` for one test.
///
/// # Errors
/// The API server refusing it.
pub async fn test_namespace(client: &Client, prefix: &str) -> anyhow::Result<String> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let name = format!("{prefix}-{}-{:05}", COUNTER.fetch_add(1, Ordering::Relaxed), nanos % 100_000);
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([("waycast.dev/e2e".to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(name)
}

/// What several tests of one binary share — a namespace with a Gateway
/// that serves, say — set up once by the first test to ask, on a thread
/// and runtime of its own (a test's runtime ends with the test, and a
/// client belongs to the runtime it was made on): keep only plain data
/// (names, keys, URLs) in it. Each test is its own `#[test]`, so a failing
/// one hides none of the others.
///
/// # Panics
/// When the setup failed (or panicked): every test sharing it fails with
/// the reason.
pub fn shared_setup<T, F, Fut>(cell: &'static OnceLock<Result<T, String>>, setup: F) -> &'static T
where
    T: Send + Sync + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let result = cell.get_or_init(|| {
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|error| format!("a runtime for the setup: {error}"))?;
            runtime.block_on(setup()).map_err(|error| format!("{error:#}"))
        });
        thread.join().unwrap_or_else(|_| Err("the setup panicked (its message is above)".into()))
    });
    match result {
        Ok(shared) => shared,
        Err(error) => panic!("the shared setup failed: {error}"),
    }
}

/// Runs the operator in this process against `cluster`, once per process,
/// on a thread and runtime of its own (so it outlives each test's runtime).
///
/// # Panics
/// When the operator cannot start.
pub fn operator_in_process(cluster: &SharedCluster) {
    static OPERATOR: OnceLock<()> = OnceLock::new();
    OPERATOR.get_or_init(|| {
        let kubeconfig = cluster.kubeconfig.clone();
        // The operator's log goes to a file next to the cluster's state.
        let log = std::env::temp_dir().join(format!("waycast-operator-{}.log", std::process::id()));
        if let Ok(file) = std::fs::File::create(&log) {
            // WAYCAST_E2E_OPERATOR_LOG (a tracing filter) turns up the detail.
            let filter = std::env::var("WAYCAST_E2E_OPERATOR_LOG").unwrap_or_else(|_| "info".into());
            let filter = tracing_subscriber::EnvFilter::try_new(filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            let _ = tracing_subscriber::fmt()
                .with_writer(std::sync::Arc::new(file))
                .with_ansi(false)
                .with_env_filter(filter)
                .try_init();
        }
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let client = crate::control_plane::client_from_kubeconfig(&kubeconfig).await.expect("kubeconfig");
                let options = waycast_operator::OperatorOptions {
                    gateway_image: crate::cluster::images::GATEWAY.into(),
                    admin_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                    leader_election: None,
                    cluster_cidrs: Vec::new(),
                    network_policy: None,
                    telemetry: None,
                };
                if let Err(error) = waycast_operator::run(client, options, std::future::pending()).await {
                    panic!("the operator stopped: {error}");
                }
            });
        });
    });
}

/// Whether `conditions` hold `type_` with status `True` (waycast's statuses
/// carry meta/v1 conditions).
pub fn condition_true(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}
