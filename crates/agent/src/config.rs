//! What one agent is responsible for and how it behaves, with the defaults.

use std::time::Duration;

use futures::future::{BoxFuture, Shared};

/// Version reported in the Cluster's `status.agent.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Default interval of Lease renewals on the hub.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// How often a deployment blocked by a conflict or an error looks again, by default.
pub const DEFAULT_CONFLICT_RECHECK: Duration = Duration::from_secs(30);
/// Default minimum interval between writes of the Cluster's `status.agent` (unless it changed).
pub const DEFAULT_CLUSTER_STATUS_INTERVAL: Duration = Duration::from_secs(300);
/// How soon a deployment whose copy is not on the hub yet looks again, by default (the copy's
/// watch normally wakes it first).
pub const DEFAULT_COPY_WAIT: Duration = Duration::from_secs(2);
/// How often a running hook's Job or Pod is looked at when no event woke the deployment, by
/// default.
pub const DEFAULT_HOOK_POLL: Duration = Duration::from_secs(5);
/// How soon a removal whose hook failed tries again, by default.
pub const DEFAULT_REMOVAL_HOOK_RETRY: Duration = Duration::from_secs(30);
/// How soon reverse sync passes again after a failed pass, by default.
pub const DEFAULT_UPSTREAM_RETRY: Duration = Duration::from_secs(3);
/// How long reverse sync gathers a burst of events into one pass, by default.
pub const DEFAULT_UPSTREAM_COALESCE: Duration = Duration::from_millis(100);

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
    /// Bounds on what one chart source can make the agent read, keep and render.
    pub chart_limits: ChartLimits,
    /// The downstream ServiceAccount Bundles are applied as (impersonated;
    /// decision 0079-bundles-applied-as-an-impersonated-service-account); `None`: as the agent
    /// itself (in-process tests, push clusters: the kubeconfig's identity).
    pub bundle_service_account: Option<tender_types::service_account::ServiceAccountRef>,
    /// ServiceAccounts (`<namespace>/<name>`, or `*`) a Bundle may name in `spec.serviceAccount`.
    pub allowed_bundle_service_accounts: Vec<String>,
    /// The hub's public signing keys this agent was registered with (base64, comma-separated;
    /// decision 0089-signed-copies): a copy is deployed only if one of them, or a key the hub's
    /// key chain endorses from them, signed it.
    pub hub_signing_keys: String,
    /// How often a deployment blocked by a conflict or an error looks again (an object someone
    /// else made may go away, a failing apply may succeed): [`DEFAULT_CONFLICT_RECHECK`].
    /// A chart that cannot be fetched or rendered is an Error entry, so this is also the
    /// chart retry. Tests shorten it (or run on tokio's paused clock) to prove "untouched
    /// across two re-checks" in seconds.
    pub conflict_recheck: Duration,
    /// How soon a deployment whose copy is not on the hub yet looks again
    /// ([`DEFAULT_COPY_WAIT`]).
    pub copy_wait: Duration,
    /// How often a running hook is looked at without an event ([`DEFAULT_HOOK_POLL`]); also
    /// the removal's wait for a running removal hook.
    pub hook_poll: Duration,
    /// How soon a removal whose hook failed tries again ([`DEFAULT_REMOVAL_HOOK_RETRY`]).
    pub removal_hook_retry: Duration,
    /// How soon reverse sync passes again after a failed pass ([`DEFAULT_UPSTREAM_RETRY`]).
    pub upstream_retry: Duration,
    /// How long reverse sync gathers a burst of events into one pass
    /// ([`DEFAULT_UPSTREAM_COALESCE`]).
    pub upstream_coalesce: Duration,
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
            chart_limits: ChartLimits::default(),
            bundle_service_account: None,
            allowed_bundle_service_accounts: Vec::new(),
            hub_signing_keys: String::new(),
            conflict_recheck: DEFAULT_CONFLICT_RECHECK,
            copy_wait: DEFAULT_COPY_WAIT,
            hook_poll: DEFAULT_HOOK_POLL,
            removal_hook_retry: DEFAULT_REMOVAL_HOOK_RETRY,
            upstream_retry: DEFAULT_UPSTREAM_RETRY,
            upstream_coalesce: DEFAULT_UPSTREAM_COALESCE,
        }
    }
}

const MIB: u64 = 1 << 20;

/// Bounds on the work a chart source (a Bundle writer's `spec.helm`) can cause: bytes read per
/// response, bytes of `helm template` output, bytes of the chart cache, and where redirects
/// may go (decision 0076-bounded-chart-sources).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartLimits {
    /// Largest chart archive (an HTTP repository's `.tgz` or an OCI chart layer).
    pub max_chart_bytes: u64,
    /// Largest `index.yaml` of an HTTP chart repository.
    pub max_index_bytes: u64,
    /// Largest OCI manifest, token response, and tag list (all pages together).
    pub max_manifest_bytes: u64,
    /// Largest output of `helm template`; helm is stopped when it prints more.
    pub max_rendered_bytes: u64,
    /// Size of the chart cache; least recently used archives are evicted beyond it.
    pub cache_max_bytes: u64,
    /// Hosts a redirect may leave the repository's origin for (`https://` only).
    pub redirect_hosts: Vec<String>,
}

/// The defaults, in line with Helm's own bounds (a chart file of 5 MiB, 100 MiB unpacked)
/// and the agent pod's 256 Mi memory limit.
const D: ChartLimits = ChartLimits {
    max_chart_bytes: 20 * MIB,
    max_index_bytes: 32 * MIB,
    max_manifest_bytes: 4 * MIB,
    max_rendered_bytes: 16 * MIB,
    cache_max_bytes: 256 * MIB,
    redirect_hosts: Vec::new(),
};

impl Default for ChartLimits {
    fn default() -> Self {
        D
    }
}

/// The [`ChartLimits`] as flags, shared by `tender-agent` and `tender-hub` (push mode runs
/// this library inside the hub).
#[derive(clap::Args, Clone, Debug)]
pub struct ChartLimitFlags {
    /// Largest chart archive downloaded, in bytes (`ChartTooLarge` beyond it).
    #[arg(long, env = "TENDER_MAX_CHART_BYTES", default_value_t = D.max_chart_bytes)]
    pub max_chart_bytes: u64,
    /// Largest chart repository index.yaml read, in bytes (`ChartTooLarge` beyond it).
    #[arg(long, env = "TENDER_MAX_INDEX_BYTES", default_value_t = D.max_index_bytes)]
    pub max_index_bytes: u64,
    /// Largest OCI manifest, token response or tag list (all pages) read, in bytes.
    #[arg(long, env = "TENDER_MAX_MANIFEST_BYTES", default_value_t = D.max_manifest_bytes)]
    pub max_manifest_bytes: u64,
    /// Largest `helm template` output read, in bytes; helm is stopped beyond it
    /// (`RenderedTooLarge`).
    #[arg(long, env = "TENDER_MAX_RENDERED_BYTES", default_value_t = D.max_rendered_bytes)]
    pub max_rendered_bytes: u64,
    /// Size of the chart cache in bytes; least recently used archives are evicted beyond it.
    #[arg(long, env = "TENDER_CHART_CACHE_MAX_BYTES", default_value_t = D.cache_max_bytes)]
    pub chart_cache_max_bytes: u64,
    /// Hosts a chart repository or registry may redirect to besides its own origin
    /// (comma-separated; `https://` targets only), e.g. a registry's blob storage.
    #[arg(long, env = "TENDER_CHART_REDIRECT_HOSTS", value_delimiter = ',')]
    pub chart_redirect_hosts: Vec<String>,
}

impl From<ChartLimitFlags> for ChartLimits {
    fn from(f: ChartLimitFlags) -> Self {
        Self {
            max_chart_bytes: f.max_chart_bytes,
            max_index_bytes: f.max_index_bytes,
            max_manifest_bytes: f.max_manifest_bytes,
            max_rendered_bytes: f.max_rendered_bytes,
            cache_max_bytes: f.chart_cache_max_bytes,
            redirect_hosts: f
                .chart_redirect_hosts
                .into_iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
        }
    }
}

/// Resolves when the agent is asked to stop; every task holds a clone.
pub(crate) type ShutdownSignal = Shared<BoxFuture<'static, ()>>;
