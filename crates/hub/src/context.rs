//! What every reconciler of one scope shares: client, caches, index, metrics, events.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Secret};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tender_runtime::Metrics;
use tender_types::{BundleDeployment, Cluster, ClusterGroup, labels, names};

use crate::sources::{SourceId, SourceIndex};
use crate::{HubConfig, HubMetrics};

/// The namespaces one set of controllers serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every namespace.
    All,
    /// One workspace namespace (and the cluster namespaces of its Clusters).
    Namespace(String),
}

impl Scope {
    /// A namespaced Api over this scope.
    pub(crate) fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }

    /// Label selector for objects the hub writes into cluster namespaces of this scope.
    pub(crate) fn workspace_selector(&self) -> String {
        match self {
            Scope::All => labels::WORKSPACE.to_string(),
            Scope::Namespace(ns) => format!("{}={ns}", labels::WORKSPACE),
        }
    }

    /// Short description for logs.
    pub(crate) fn describe(&self) -> String {
        match self {
            Scope::All => "all namespaces".to_string(),
            Scope::Namespace(ns) => format!("namespace {ns}"),
        }
    }
}

/// The caches of one scope (all filled before any controller starts).
#[derive(Clone)]
pub(crate) struct Stores {
    pub clusters: Store<Cluster>,
    pub groups: Store<ClusterGroup>,
    pub bundle_deployments: Store<BundleDeployment>,
    pub copy_secrets: Store<PartialObjectMeta<Secret>>,
    pub copy_config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub source_secrets: Store<PartialObjectMeta<Secret>>,
    pub source_config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    pub leases: Store<Lease>,
}

/// Shared by the reconcilers of one scope.
pub(crate) struct Ctx {
    pub client: Client,
    pub config: Arc<HubConfig>,
    pub metrics: Arc<Metrics>,
    pub hub: HubMetrics,
    pub recorder: Recorder,
    pub stores: Stores,
    pub sources: SourceIndex,
    /// Content hash of a source at a resourceVersion, so an unchanged source is not re-read.
    pub source_hashes: Mutex<HashMap<SourceId, (String, String)>>,
    /// Clusters (workspace, name) whose namespace and RBAC this process has verified, by uid.
    pub provisioned: Mutex<HashMap<(String, String), String>>,
    /// Writes whose watch event has not reached the caches yet.
    pub recent: RecentWrites,
    /// BundleDeployment names by cluster namespace, kept by the BundleDeployment feed, so a
    /// Cluster's summary reads its own few objects instead of scanning them all.
    pub bd_names: Mutex<HashMap<String, std::collections::BTreeSet<String>>>,
}

impl Ctx {
    /// The Clusters of `workspace` that are not being deleted, from the cache.
    pub(crate) fn clusters_in(&self, workspace: &str) -> Vec<Arc<Cluster>> {
        self.stores
            .clusters
            .state()
            .into_iter()
            .filter(|c| c.namespace().as_deref() == Some(workspace))
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect()
    }

    /// Server-side applies `status` to the status subresource of `K` `namespace/name` as
    /// tender-hub, remembers it in the recent-writes memo (`memo`: key, resourceVersion before
    /// the write, desired content key) and counts it. Callers decide first that it differs.
    pub(crate) async fn apply_status<K>(
        &self,
        namespace: &str,
        name: &str,
        status: &impl serde::Serialize,
        memo: (String, Option<String>, String),
    ) -> Result<(), crate::Error>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let kind = K::kind(&()).to_string();
        let patch = serde_json::json!({
            "apiVersion": tender_types::API_GROUP_VERSION,
            "kind": kind,
            "status": status,
        });
        Api::<K>::namespaced(self.client.clone(), namespace)
            .patch_status(
                name,
                &kube::api::PatchParams::apply(labels::HUB_FIELD_MANAGER).force(),
                &kube::api::Patch::Apply(&patch),
            )
            .await
            .map_err(crate::kube_err(format!(
                "write status of {kind} {namespace}/{name}"
            )))?;
        let (key, before, desired) = memo;
        self.recent.record(key, before, desired, String::new());
        self.hub
            .status_writes
            .get_or_create(&crate::KindLabels { kind })
            .inc();
        Ok(())
    }

    /// The BundleDeployments in `namespace` (from the cache; index entries for objects the cache
    /// no longer holds are skipped).
    pub(crate) fn bundle_deployments_in(
        &self,
        namespace: &str,
    ) -> Vec<Arc<tender_types::BundleDeployment>> {
        let names = self
            .bd_names
            .lock()
            .expect("bd index")
            .get(namespace)
            .cloned()
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|n| {
                self.stores
                    .bundle_deployments
                    .get(&kube::runtime::reflector::ObjectRef::new(n).within(namespace))
            })
            .collect()
    }
}

/// Remembers what the hub last wrote to an object, and the resourceVersion the cache held
/// before that write. Until the cache moves past that version, a reconcile reading the cache
/// would see the old object and write the same content again; this tells it not to. Once the
/// cache has the written object (or somebody else's change), the cache decides again.
#[derive(Debug, Default)]
pub(crate) struct RecentWrites(Mutex<HashMap<String, Recent>>);

#[derive(Debug, Clone)]
struct Recent {
    before: Option<String>,
    desired: String,
    uid: String,
}

impl RecentWrites {
    /// The uid written, if `desired` was written to `key` while the cache still holds `live_rv`.
    pub(crate) fn get(&self, key: &str, live_rv: Option<&str>, desired: &str) -> Option<String> {
        let map = self.0.lock().expect("recent writes lock");
        let r = map.get(key)?;
        (r.before.as_deref() == live_rv && r.desired == desired).then(|| r.uid.clone())
    }

    /// Forgets `key` once its watch event has reached the cache (the cache decides again).
    pub(crate) fn forget(&self, key: &str) {
        self.0.lock().expect("recent writes lock").remove(key);
    }

    /// Records a write of `desired` (creating `uid`) over the cached version `before`.
    pub(crate) fn record(&self, key: String, before: Option<String>, desired: String, uid: String) {
        self.0.lock().expect("recent writes lock").insert(
            key,
            Recent {
                before,
                desired,
                uid,
            },
        );
    }
}

impl Ctx {
    /// Publishes a Kubernetes Event; failures are logged, never fatal.
    pub(crate) async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(%error, reason, object = ?regarding.name, "cannot publish event");
        }
    }

    /// The Cluster whose namespace on the hub is `namespace`, if any.
    pub(crate) fn cluster_of_namespace(&self, namespace: &str) -> Option<ObjectRef<Cluster>> {
        let ns = self.stores.namespaces.get(&ObjectRef::new(namespace))?;
        cluster_for_labels(&self.stores.clusters, ns.labels(), namespace)
    }
}

/// Finds the Cluster a cluster namespace belongs to from its workspace and cluster labels
/// (the cluster label may be hashed for long names; then the Cluster store is searched).
pub(crate) fn cluster_for_labels(
    clusters: &Store<Cluster>,
    labels: &BTreeMap<String, String>,
    namespace: &str,
) -> Option<ObjectRef<Cluster>> {
    let workspace = labels.get(labels::WORKSPACE)?;
    if let Some(name) = labels.get(labels::CLUSTER)
        && names::cluster_namespace(workspace, name) == namespace
    {
        return Some(ObjectRef::new(name).within(workspace));
    }
    clusters
        .find(|c| {
            c.namespace().as_deref() == Some(workspace.as_str())
                && names::cluster_namespace(workspace, &c.name_any()) == namespace
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
}
