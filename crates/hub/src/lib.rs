//! tender's hub: registers clusters, resolves Bundle targets, writes one BundleDeployment per
//! targeted cluster into that cluster's namespace, copies referenced Secrets/ConfigMaps next to
//! it and keeps those copies current by watch.
//!
//! [`run`] is the whole hub; `main.rs` only parses flags. Tests run several hubs in one process,
//! each scoped to its own workspace namespaces ([`HubConfig::workspace_namespaces`]).
//!
//! Controllers (one module each, with a pure planning function next to the reconciler):
//! - [`cluster`]: cluster namespace, agent identity and RBAC, cleanup on deletion, status.
//! - [`group`]: ClusterGroup counts.
//! - [`bundle`]: targeting, BundleDeployments, copies, Bundle status.
//! - [`poll`]: chart polling (`pollingInterval`), recording the version in Bundle status.
//! - [`helmop`]: a HelmOp's Bundle (owned, derived from the HelmOp) and its status.
//! - [`sources`]: the index from source Secrets/ConfigMaps to the Bundles that copy them.
//! - [`push`]: push mode — the agent library run by the hub for Clusters with a kubeconfig
//!   Secret, one task per cluster.

#![warn(missing_docs)]

pub mod bundle;
mod caches;
mod clock;
pub mod cluster;
mod context;
pub mod group;
pub mod helm_poll;
pub mod helmop;
mod poll;
pub mod push;
pub mod signing;
mod slim;
pub mod sources;
mod state_metrics;
mod summary;
#[cfg(test)]
mod testing;
mod triggers;
pub mod upstream;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{
    counter::Counter,
    family::Family,
    gauge::Gauge,
    histogram::{Histogram, exponential_buckets},
};
use prometheus_client::registry::Unit;
use tender_runtime::{Health, LeaderElection, Metrics};

/// How long after the agent's last heartbeat a Cluster is reported offline, by default.
pub const DEFAULT_AGENT_OFFLINE_AFTER: Duration = Duration::from_secs(90);

/// How long a summary-only Cluster status change waits before it is written, by default.
pub const DEFAULT_CLUSTER_SUMMARY_DELAY: Duration = Duration::from_secs(5);

/// How long a Cluster keeps its written summary while a new version of its ready
/// BundleDeployments rolls out, by default (decision 0066-rollout-summary-delay).
pub const DEFAULT_CLUSTER_ROLLOUT_SUMMARY_DELAY: Duration = Duration::from_secs(30);

/// Default of [`HubConfig::max_copied_bytes_per_bundle`]: 256 MiB (a 100 KiB Secret copied to
/// 2 500 clusters), an eighth of etcd's default 2 GiB quota.
pub const DEFAULT_MAX_COPIED_BYTES_PER_BUNDLE: usize = 256 << 20;

/// What one hub instance does.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Copy `downstreamResources` (the `EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM` gate, read by
    /// the binary through `tender_types::gate`).
    pub copy_resources_downstream: bool,
    /// Workspace namespaces to serve; empty means every namespace.
    pub workspace_namespaces: Vec<String>,
    /// Run controllers only while holding this Lease; `None` runs them unconditionally.
    pub leader_election: Option<LeaderConfig>,
    /// A Cluster whose agent has not renewed its heartbeat for this long is `AgentOffline`.
    pub agent_offline_after: Duration,
    /// Reporting instance on Kubernetes Events (the pod name).
    pub instance: String,
    /// Push mode (Clusters with `spec.kubeconfigSecretRef`).
    pub push: push::PushConfig,
    /// Reverse sync: largest placeholder content (keys + values) the hub publishes.
    pub upstream_max_bytes: usize,
    /// Most bytes of content one Bundle's copies may hold on the hub, every cluster's copy
    /// counted (`--max-copied-bytes-per-bundle`).
    pub max_copied_bytes_per_bundle: usize,
    /// Kinds `downstreamResources` may name (`--copyable-kinds`). Secrets and ConfigMaps are
    /// copied as themselves; every other kind travels in a carrier Secret and never comes alive
    /// on the hub.
    pub copyable_kinds: Vec<tender_types::copy::CopyableKind>,
    /// How long a Cluster status change that only moves its BundleDeployment summary waits
    /// before it is written, so the summary's transient states coalesce
    /// (decision 0053-cluster-summary-delay).
    pub cluster_summary_delay: Duration,
    /// How long a summary change that only moves ready BundleDeployments to `WaitApplied` (a
    /// new version rolling out; the agent has not reported on it yet) waits instead: a
    /// rotation that completes within it writes no Cluster status
    /// (decision 0066-rollout-summary-delay).
    pub cluster_rollout_summary_delay: Duration,
    /// Serve only Clusters labelled `tender.dev/shard=<id>` (`--shard-id`); `None` serves the
    /// Clusters without that label and folds every shard's entry into Bundle status
    /// (decision 0062-hub-shards). Checked by [`tender_types::labels::validate_shard_id`].
    pub shard_id: Option<String>,
    /// Where the hub's signing key Secret is (`--signing-key-secret`, `--signing-key-namespace`;
    /// decision 0089-signed-copies).
    pub signing: signing::SigningConfig,
    /// How often the key Secret is read again for a roll step.
    pub signing_key_poll: Duration,
}

impl Default for HubConfig {
    fn default() -> Self {
        Self {
            copy_resources_downstream: false,
            workspace_namespaces: Vec::new(),
            leader_election: None,
            agent_offline_after: DEFAULT_AGENT_OFFLINE_AFTER,
            instance: "tender-hub".to_string(),
            push: push::PushConfig::default(),
            upstream_max_bytes: tender_types::upstream::DEFAULT_MAX_BYTES,
            max_copied_bytes_per_bundle: DEFAULT_MAX_COPIED_BYTES_PER_BUNDLE,
            copyable_kinds: tender_types::copy::CopyableKind::parse_list(
                tender_types::copy::DEFAULT_COPYABLE_KINDS,
            )
            .expect("the default copyable kinds parse"),
            cluster_summary_delay: DEFAULT_CLUSTER_SUMMARY_DELAY,
            cluster_rollout_summary_delay: DEFAULT_CLUSTER_ROLLOUT_SUMMARY_DELAY,
            shard_id: None,
            signing: signing::SigningConfig::default(),
            signing_key_poll: Duration::from_secs(10),
        }
    }
}

impl HubConfig {
    /// The hub's own namespace (where its signing keys are): what only the hub and the
    /// cluster's administrators write, so the hub keeps there what it must trust on reading
    /// back, such as rollout state (decision 0112-rollout-state-in-the-hubs-namespace).
    pub fn own_namespace(&self) -> &str {
        &self.signing.namespace
    }
}

/// The Lease a hub instance competes for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease (one per independent hub instance).
    pub lease_name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
}

/// Labels of the per-kind status write counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `Bundle`, `Cluster` or `ClusterGroup`.
    pub kind: String,
}

/// The hub's own metric families (the shared ones live in [`tender_runtime::Metrics`]).
#[derive(Clone, Debug)]
pub struct HubMetrics {
    /// Copies of sources written into cluster namespaces.
    pub copies_written: Counter,
    /// Copies left alone because their content hash was already current.
    pub copies_skipped: Counter,
    /// Copies deleted because they are no longer referenced.
    pub copies_deleted: Counter,
    /// BundleDeployments created or updated.
    pub bundle_deployments_written: Counter,
    /// BundleDeployments left alone because their spec was already current.
    pub bundle_deployments_skipped: Counter,
    /// BundleDeployments deleted because their cluster is no longer targeted.
    pub bundle_deployments_deleted: Counter,
    /// Status subresource writes, by kind.
    pub status_writes: Family<KindLabels, Counter>,
    /// Time a Bundle reconcile spent writing BundleDeployments and copies, when it wrote any.
    pub fanout_duration: Histogram,
    /// 1 while this replica runs the controllers (leads, or runs without leader election).
    pub leader: Gauge,
    /// Clusters, Bundles and BundleDeployments by state, counted from the caches on scrape.
    pub state: state_metrics::StateGauges,
}

impl HubMetrics {
    /// Creates the families and registers them into `metrics` (call before wrapping it in `Arc`).
    pub fn register(metrics: &mut Metrics) -> Self {
        let this = Self {
            copies_written: Counter::default(),
            copies_skipped: Counter::default(),
            copies_deleted: Counter::default(),
            bundle_deployments_written: Counter::default(),
            bundle_deployments_skipped: Counter::default(),
            bundle_deployments_deleted: Counter::default(),
            status_writes: Family::default(),
            fanout_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            leader: Gauge::default(),
            state: state_metrics::StateGauges::default(),
        };
        let r = metrics
            .registry_mut()
            .sub_registry_with_prefix("tender_hub");
        r.register(
            "copies_written",
            "Copies of Secrets/ConfigMaps written into cluster namespaces",
            this.copies_written.clone(),
        );
        r.register(
            "copies_skipped",
            "Copies not written because their content hash was unchanged",
            this.copies_skipped.clone(),
        );
        r.register(
            "copies_deleted",
            "Copies deleted because no BundleDeployment references them any more",
            this.copies_deleted.clone(),
        );
        r.register(
            "bundle_deployments_written",
            "BundleDeployments created or updated",
            this.bundle_deployments_written.clone(),
        );
        r.register(
            "bundle_deployments_skipped",
            "BundleDeployments not written because their spec was unchanged",
            this.bundle_deployments_skipped.clone(),
        );
        r.register(
            "bundle_deployments_deleted",
            "BundleDeployments deleted because their cluster is no longer targeted",
            this.bundle_deployments_deleted.clone(),
        );
        r.register(
            "status_writes",
            "Status subresource writes, by kind",
            this.status_writes.clone(),
        );
        r.register_with_unit(
            "fanout_duration",
            "Time one Bundle reconcile spent writing BundleDeployments and copies",
            Unit::Seconds,
            this.fanout_duration.clone(),
        );
        r.register(
            "leader",
            "1 while this replica runs the controllers (holds the Lease, or runs without leader election)",
            this.leader.clone(),
        );
        r.register_collector(Box::new(this.state.clone()));
        this
    }
}

/// Why the hub or one reconciliation failed: the vocabulary shared with the agent.
pub use tender_runtime::ReconcileError as Error;

/// Maps a kube error (not about a Secret's content) into [`Error::Kube`] describing `action`.
pub(crate) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::kube(action, false, source)
}

/// Runs the hub until `shutdown` resolves (or a controller stops).
///
/// With [`HubConfig::leader_election`], controllers run only while this instance holds the
/// Lease; caches are built when leadership is gained. `health` turns ready once caches have
/// synced (a standby replica is ready too: it is healthy and waiting).
pub async fn run(
    client: kube::Client,
    config: HubConfig,
    metrics: Arc<Metrics>,
    hub_metrics: HubMetrics,
    health: Health,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    if let Some(id) = &config.shard_id {
        tender_types::labels::validate_shard_id(id).map_err(Error::Config)?;
    }
    let config = Arc::new(config);
    let mut shutdown = std::pin::pin!(shutdown);
    let Some(leader) = config.leader_election.clone() else {
        hub_metrics.leader.set(1);
        tokio::select! {
            result = watch::run_controllers(client, config, metrics, hub_metrics, health) => return result,
            () = &mut shutdown => return Ok(()),
        }
    };

    let election = LeaderElection::start(
        client.clone(),
        &leader.namespace,
        &leader.lease_name,
        &leader.identity,
    );
    let mut is_leader = election.subscribe();
    health.set_ready(true);
    let result = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            gained = async { is_leader.wait_for(|leading| *leading).await.is_ok() } => if !gained { break Ok(()) },
        }
        tracing::info!(lease = %leader.lease_name, "leading: starting controllers");
        health.set_ready(false);
        hub_metrics.leader.set(1);
        let controllers = watch::run_controllers(
            client.clone(),
            config.clone(),
            metrics.clone(),
            hub_metrics.clone(),
            health.clone(),
        );
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            lost = async { is_leader.wait_for(|leading| !*leading).await.is_ok() } => {
                if !lost { break Ok(()) }
                tracing::warn!(lease = %leader.lease_name, "lost leadership: stopping controllers");
                hub_metrics.leader.set(0);
                health.set_ready(true);
            }
            result = controllers => break result,
        }
    };
    hub_metrics.leader.set(0);
    election.release().await;
    result
}
