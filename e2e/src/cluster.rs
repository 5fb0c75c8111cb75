//! A whole local cluster: the control plane alone, or with a node and the
//! images the project packs. What `waycast-cluster up` runs and the test
//! harness starts.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::control_plane::{self, ControlPlane, ControlPlaneOptions};
use crate::manifest;
use crate::node::{self, Node};
use waycast_xtask::image::{self, ImageSpec, NONROOT};

/// The image names pods use (with `imagePullPolicy: Never`).
pub mod images {
    /// The gateway.
    pub const GATEWAY: &str = "docker.io/waycast/gateway:dev";
    /// The operator.
    pub const OPERATOR: &str = "docker.io/waycast/operator:dev";
    /// The mock upstream.
    pub const MOCK_UPSTREAM: &str = "docker.io/waycast/mock-upstream:dev";
    /// metrics-server.
    pub const METRICS_SERVER: &str = "docker.io/waycast/metrics-server:dev";
}

/// A running cluster.
pub struct Cluster {
    /// The control plane.
    pub plane: ControlPlane,
    /// The node, when asked for.
    pub node: Option<Node>,
    /// The node lock, held until this process exits.
    _node_lock: Option<std::fs::File>,
}

/// Packs the images a node needs into `dir`: the workspace's binaries of
/// this build, the gateway's from `WAYCAST_GATEWAY_BIN` when set (the
/// benchmarks' release build).
///
/// # Errors
/// A binary missing or packing failing.
pub fn pack_images(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let specs = [
        ImageSpec {
            name: node::PAUSE_IMAGE.into(),
            binary: crate::process::workspace_binary("waycast-pause")?,
            args: vec![],
            user: NONROOT,
        },
        ImageSpec {
            name: images::GATEWAY.into(),
            binary: match std::env::var_os("WAYCAST_GATEWAY_BIN") {
                Some(path) => PathBuf::from(path),
                None => crate::process::workspace_binary("waycast-gateway")?,
            },
            args: vec![],
            user: NONROOT,
        },
        ImageSpec {
            name: images::OPERATOR.into(),
            binary: crate::process::workspace_binary("waycast-operator")?,
            args: vec![],
            user: NONROOT,
        },
        ImageSpec {
            name: images::MOCK_UPSTREAM.into(),
            binary: crate::process::workspace_binary("waycast-mock-upstream")?,
            args: vec!["--listen".into(), "0.0.0.0:8000".into()],
            user: NONROOT,
        },
        ImageSpec {
            name: images::METRICS_SERVER.into(),
            binary: control_plane::k8s_binary("metrics-server")?,
            args: vec![],
            user: NONROOT,
        },
    ];
    let mut archives = Vec::new();
    for spec in specs {
        let file = dir.join(format!("{}.tar", spec.name.rsplit('/').next().unwrap_or("image").replace(':', "-")));
        image::pack(&spec, &file).with_context(|| format!("packing {}", spec.name))?;
        archives.push(file);
    }
    Ok(archives)
}

impl Cluster {
    /// Starts a control plane in `state_dir`, and a node when `with_node`;
    /// installs the waycast CRDs (and metrics-server with a node).
    ///
    /// # Errors
    /// Any component failing to start; what was started is stopped again.
    pub async fn start(state_dir: PathBuf, with_node: bool) -> anyhow::Result<Self> {
        if !with_node {
            let plane = ControlPlane::start(ControlPlaneOptions::loopback(state_dir)).await?;
            let cluster = Self { plane, node: None, _node_lock: None };
            return match cluster.install().await {
                Ok(()) => Ok(cluster),
                Err(error) => {
                    cluster.stop().await;
                    Err(error)
                }
            };
        }
        let node_lock = node::lock()?;
        node::prepare_host()?;
        let mut options = ControlPlaneOptions::for_node(state_dir.clone(), node::bridge_address());
        let port = control_plane::free_port("0.0.0.0".parse()?)?;
        options.apiserver_port = Some(port);
        if let Err(error) = node::guard_ports(&[port, node::KUBELET_PORT]) {
            node::teardown();
            return Err(error);
        }
        let plane = match ControlPlane::start(options).await {
            Ok(plane) => plane,
            Err(error) => {
                node::teardown();
                return Err(error);
            }
        };
        let started = async {
            let images = pack_images(&state_dir.join("images"))?;
            Node::start(&plane, &images).await
        };
        let node = match started.await {
            Ok(node) => node,
            Err(error) => {
                node::teardown();
                plane.stop().await;
                return Err(error);
            }
        };
        let cluster = Self { plane, node: Some(node), _node_lock: Some(node_lock) };
        match cluster.install().await {
            Ok(()) => Ok(cluster),
            Err(error) => {
                cluster.stop().await;
                Err(error)
            }
        }
    }

    async fn install(&self) -> anyhow::Result<()> {
        let client = self.plane.client().await?;
        manifest::install_crds(&client).await?;
        if self.node.is_some() {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/metrics-server.yaml");
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            manifest::apply_all(&client, &manifest::parse_documents(&text)?, "kube-system").await?;
        }
        Ok(())
    }

    /// Stops the node (removing everything it made), then the control plane.
    pub async fn stop(self) {
        if let Some(node) = self.node {
            node.stop().await;
        }
        self.plane.stop().await;
    }
}
