//! The one [`Context`] every reconcile shares: clients, caches, the two executors, metrics.

use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef as KubeRef;
use kube::runtime::reflector::Store;
use tender_runtime::Executor;
use tender_types::labels::AGENT_FIELD_MANAGER;
use tender_types::{BundleDeployment, Cluster};

use crate::AgentMetrics;
use crate::config::AgentConfig;
use crate::copies::HubCopies;
use crate::downstream::Downstream;
use crate::drift::DriftWatches;
use crate::identity::Identities;
use crate::inventory::{Inventory, Recorded};
use crate::plan::Owner;

/// Everything a reconcile needs, built once and shared by `Arc`.
pub(crate) struct Context {
    /// The BundleDeployments of this cluster namespace on the hub.
    pub(crate) bds: Api<BundleDeployment>,
    /// The Clusters of the workspace on the hub (the agent may read only its own).
    pub(crate) clusters: Api<Cluster>,
    /// Discovery and reads downstream.
    pub(crate) down: Downstream,
    /// Writes downstream as the agent itself (its namespace, inventories).
    pub(crate) down_writer: Arc<Executor>,
    /// Writes of Bundle content downstream, as the identity each deployment is applied as.
    pub(crate) identities: Identities,
    /// Writes on the hub (BundleDeployment status, events, heartbeat).
    pub(crate) hub_writer: Arc<Executor>,
    pub(crate) inventory: Inventory,
    pub(crate) copies: HubCopies,
    pub(crate) drift: DriftWatches,
    /// Helm charts: fetch, cache, render.
    pub(crate) charts: crate::helm::Charts,
    /// Downstream namespaces (metadata), for fan-out by `targetNamespaceSelector`.
    pub(crate) namespaces: Store<PartialObjectMeta<Namespace>>,
    pub(crate) config: AgentConfig,
    pub(crate) metrics: AgentMetrics,
    /// Retry delays of BundleDeployments whose last reconcile failed (the runtime's one
    /// per-object backoff, as the hub's controllers use).
    pub(crate) retries: tender_runtime::retry::Backoffs,
}

impl Context {
    /// The context of an agent writing to `downstream` and reporting to `hub`; `trigger`
    /// reconciles a BundleDeployment when one of its downstream objects changes.
    pub(crate) fn new(
        hub: Client,
        downstream: Client,
        config: AgentConfig,
        metrics: AgentMetrics,
        copies: HubCopies,
        namespaces: Store<PartialObjectMeta<Namespace>>,
        trigger: UnboundedSender<KubeRef<BundleDeployment>>,
    ) -> Self {
        let ns = &config.cluster_namespace;
        let reporter = Reporter {
            controller: "tender-agent".into(),
            instance: Some(config.identity.clone()),
        };
        let writer = |client: &Client| {
            Arc::new(Executor::new(
                client.clone(),
                AGENT_FIELD_MANAGER,
                Recorder::new(client.clone(), reporter.clone()),
                metrics.shared(),
            ))
        };
        let down_writer = writer(&downstream);
        let hub_writer = writer(&hub);
        Self {
            bds: Api::namespaced(hub.clone(), ns),
            clusters: Api::namespaced(hub.clone(), &config.workspace_namespace),
            inventory: Inventory::new(
                downstream.clone(),
                &config.agent_namespace,
                down_writer.clone(),
            ),
            drift: DriftWatches::new(downstream.clone(), ns, trigger, down_writer.clone()),
            down: Downstream::new(downstream),
            identities: Identities::new(
                down_writer.clone(),
                config.bundle_service_account.clone(),
                config.allowed_bundle_service_accounts.clone(),
            ),
            charts: crate::helm::Charts::new(
                config.helm_path.clone(),
                config.chart_cache_dir.clone(),
                config.chart_limits.clone(),
            ),
            down_writer,
            hub_writer,
            copies,
            namespaces,
            config,
            metrics,
            retries: tender_runtime::retry::Backoffs::default(),
        }
    }

    /// The inventory of `owner`: from the cache of managed ConfigMaps when it holds the
    /// version this agent last read or wrote, else from the apiserver.
    pub(crate) async fn read_inventory(&self, owner: &Owner) -> crate::Result<Option<Recorded>> {
        let cached = self.drift.cached(&self.inventory.key(owner));
        self.inventory.read(owner, cached).await
    }
}
