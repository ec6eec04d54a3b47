//! What one agent is responsible for and how it behaves, with the defaults.

use std::time::Duration;

use futures::future::{BoxFuture, Shared};

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
    /// The `helm` binary that renders `spec.helm` charts (`helm template`).
    pub helm_path: std::path::PathBuf,
    /// Where chart archives are cached by digest (charts only, never values or credentials).
    pub chart_cache_dir: std::path::PathBuf,
    /// The downstream owner's policy: namespaces it may write to, kinds it refuses.
    pub policy: crate::policy::Policy,
    /// The downstream ServiceAccount Bundles are applied as (impersonated; decision 0079);
    /// `None`: as the agent itself (in-process tests, push clusters: the kubeconfig's identity).
    pub bundle_service_account: Option<tender_types::service_account::ServiceAccountRef>,
    /// ServiceAccounts (`<namespace>/<name>`, or `*`) a Bundle may name in `spec.serviceAccount`.
    pub allowed_bundle_service_accounts: Vec<String>,
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
            helm_path: "helm".into(),
            chart_cache_dir: std::env::temp_dir().join("tender-charts"),
            policy: crate::policy::Policy::default(),
            bundle_service_account: None,
            allowed_bundle_service_accounts: Vec::new(),
        }
    }
}

/// Resolves when the agent is asked to stop; every task holds a clone.
pub(crate) type ShutdownSignal = Shared<BoxFuture<'static, ()>>;
