//! tender's agent: runs on a downstream cluster, reads ITS cluster namespace on the hub and
//! makes the downstream cluster match its BundleDeployments.
//!
//! For each BundleDeployment: copy the referenced Secrets/ConfigMaps into the deployment
//! namespace, only then apply the manifests (server-side apply, field manager `tender-agent`),
//! prune what the previous deployment had and this one does not, and report status. It
//! corrects drift by watching the objects it manages, cleans up on deletion (or leaves the
//! objects without tender's metadata with `keepResources`), sweeps leftovers of vanished
//! BundleDeployments at start-up, and heartbeats to the hub.
//!
//! Modules: [`plan`] (pure decisions), `deploy` (copy → apply → prune → status), [`status`]
//! (pure status computation), `cleanup` (finalizer and start-up sweep), `inventory`
//! (per-BundleDeployment object list downstream), `drift` (downstream watches), `heartbeat`,
//! [`metrics`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use kube::Client;
use tender_runtime::{Health, Metrics};

mod cleanup;
mod deploy;
mod downstream;
mod drift;
mod heartbeat;
mod inventory;
pub mod metrics;
pub mod plan;
pub mod status;

pub use metrics::AgentMetrics;

/// Version reported in the Cluster's `status.agent.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Default interval of Lease renewals on the hub.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// Default minimum interval between writes of the Cluster's `status.agent` (unless it changed).
pub const DEFAULT_CLUSTER_STATUS_INTERVAL: Duration = Duration::from_secs(300);

/// What one agent is responsible for and how it behaves.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Namespace of the Cluster object on the hub (the workspace).
    pub workspace_namespace: String,
    /// Name of the Cluster object on the hub.
    pub cluster_name: String,
    /// The cluster's own namespace on the hub, usually `names::cluster_namespace(ws, name)`.
    pub cluster_namespace: String,
    /// Namespace the agent runs in downstream; holds its inventories.
    pub agent_namespace: String,
    /// The feature gate `EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM`.
    pub copy_resources_downstream: bool,
    /// How often the heartbeat Lease is renewed.
    pub heartbeat_interval: Duration,
    /// Minimum interval between two writes of the Cluster's `status.agent`.
    pub cluster_status_interval: Duration,
    /// `holderIdentity` of the heartbeat Lease (pod name in a Deployment).
    pub identity: String,
    /// How many BundleDeployments are deployed at once.
    pub concurrency: u16,
}

impl AgentConfig {
    /// A configuration for Cluster `cluster_name` in `workspace_namespace` with the defaults:
    /// cluster namespace computed, agent namespace `tender-system`, copying on, 30 s heartbeat,
    /// Cluster status at most every 5 min.
    pub fn new(workspace_namespace: &str, cluster_name: &str) -> Self {
        Self {
            workspace_namespace: workspace_namespace.to_string(),
            cluster_name: cluster_name.to_string(),
            cluster_namespace: tender_types::names::cluster_namespace(
                workspace_namespace,
                cluster_name,
            ),
            agent_namespace: tender_types::namespaces::DEFAULT_AGENT_NAMESPACE.to_string(),
            copy_resources_downstream: true,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            cluster_status_interval: DEFAULT_CLUSTER_STATUS_INTERVAL,
            identity: "tender-agent".to_string(),
            concurrency: 4,
        }
    }
}

/// Errors of the agent; each names the object and what failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the hub or the downstream apiserver failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done, on which object.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Adding/removing the cleanup finalizer or the cleanup itself failed.
    #[error("BundleDeployment {name}: {source}")]
    Finalizer {
        /// The BundleDeployment.
        name: String,
        /// What failed.
        #[source]
        source: Box<kube::runtime::finalizer::Error<Error>>,
    },
    /// The agent's configuration is unusable.
    #[error("invalid agent configuration: {0}")]
    Config(String),
}

impl Error {
    /// Wraps a client error with what was being done.
    pub(crate) fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            what: what.into(),
            source,
        }
    }

    /// Stable CamelCase word for metrics.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "KubeError",
            Self::Finalizer { .. } => "CleanupFailed",
            Self::Config(_) => "InvalidConfig",
        }
    }
}

/// Result with the agent's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) type ShutdownSignal = Shared<BoxFuture<'static, ()>>;

/// Runs the agent until `shutdown` resolves: `hub` is a client with the agent's narrow hub
/// identity, `downstream` an admin-ish client of the downstream cluster.
///
/// Start-up: ensure the agent namespace downstream, start the heartbeat, list the
/// BundleDeployments on the hub (retrying with backoff until it succeeds) and sweep
/// downstream leftovers of BundleDeployments that no longer exist, then run the controller.
/// `health` becomes ready once the controller's caches are filled.
pub async fn run(
    hub: Client,
    downstream: Client,
    config: AgentConfig,
    metrics: AgentMetrics,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    if config.cluster_namespace.is_empty() || config.cluster_name.is_empty() {
        return Err(Error::Config(
            "cluster name and cluster namespace must be set".into(),
        ));
    }
    let shutdown: ShutdownSignal = shutdown.boxed().shared();
    deploy::run(hub, downstream, config, metrics, health, shutdown).await
}

/// Convenience for binaries: registers the agent's metric families into `metrics`.
pub fn register_metrics(metrics: Metrics) -> AgentMetrics {
    AgentMetrics::register(metrics)
}

/// Re-exported so callers share the exact `Arc<Metrics>` type.
pub type SharedMetrics = Arc<Metrics>;
