//! What every reconciler of one scope shares: client, caches, index, metrics, events.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Secret};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tender_runtime::Metrics;
use tender_runtime::executor::{Apply, EventOp, Executor, Fingerprint, ObjectKey, Op};
use tender_types::ownership::{Ownership, ownership};
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterGroup, HelmOp, labels, names};

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

    /// Label selector for what the replica serving `shard` wrote into cluster namespaces of
    /// this scope: the workspace label and its shard label (absent for the unsharded replica).
    pub(crate) fn shard_selector(&self, shard: Option<&str>) -> String {
        let own = match shard {
            Some(id) => format!("{}={id}", labels::SHARD),
            None => format!("!{}", labels::SHARD),
        };
        format!("{},{own}", self.workspace_selector())
    }

    /// Short description for logs.
    pub(crate) fn describe(&self) -> String {
        match self {
            Scope::All => "all namespaces".to_string(),
            Scope::Namespace(ns) => format!("namespace {ns}"),
        }
    }
}

/// One kind the operator allows besides Secrets and ConfigMaps, as discovery found it on the
/// hub, with the metadata cache of its sources.
#[derive(Clone)]
pub(crate) struct CarriedKind {
    pub kind: tender_types::copy::CopyableKind,
    pub resource: kube::discovery::ApiResource,
    pub namespaced: bool,
    pub store: Store<PartialObjectMeta<kube::api::DynamicObject>>,
}

/// The caches of one scope (all filled before any controller starts).
#[derive(Clone)]
pub(crate) struct Stores {
    pub bundles: Store<Bundle>,
    pub clusters: Store<Cluster>,
    pub groups: Store<ClusterGroup>,
    pub helmops: Store<HelmOp>,
    pub bundle_deployments: Store<BundleDeployment>,
    pub copy_secrets: Store<PartialObjectMeta<Secret>>,
    pub copy_config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub source_secrets: Store<PartialObjectMeta<Secret>>,
    pub source_config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    pub leases: Store<Lease>,
    /// The rollout state Secrets in the hub's own namespace, whole (decision 0121).
    pub rollout_states: Store<Secret>,
    /// Sources of the other allowed kinds (metadata only), one cache per kind.
    pub carried: Arc<Vec<CarriedKind>>,
}

impl Stores {
    /// The cache of an allowed kind other than Secret/ConfigMap, if the hub serves it.
    pub(crate) fn carried(&self, kind: &tender_types::copy::CopyableKind) -> Option<&CarriedKind> {
        self.carried.iter().find(|c| &c.kind == kind)
    }
}

/// Shared by the reconcilers of one scope.
pub(crate) struct Ctx {
    pub client: Client,
    pub config: Arc<HubConfig>,
    pub metrics: Arc<Metrics>,
    pub hub: HubMetrics,
    /// Carries out every write (apply, delete, status, events) and remembers recent ones.
    pub exec: Executor,
    pub stores: Stores,
    pub sources: SourceIndex,
    /// Content hash and size of a source at a resourceVersion, so an unchanged source is not
    /// re-read.
    pub source_hashes: Mutex<HashMap<SourceId, (String, String, usize)>>,
    /// Clusters (workspace, name) whose namespace and RBAC this process has verified, by uid
    /// and mode.
    pub provisioned: Mutex<HashMap<(String, String), (String, tender_types::ClusterMode)>>,
    /// Push mode: one task per Cluster with a kubeconfig Secret.
    pub push: crate::push::Push,
    /// BundleDeployment names by cluster namespace, kept by the BundleDeployment feed, so a
    /// Cluster's summary reads its own few objects instead of scanning them all.
    pub bd_names: Mutex<HashMap<String, std::collections::BTreeSet<String>>>,
    /// Reverse sync: verdicts on placeholders and the agents' upstream access applied.
    pub upstream: UpstreamMemo,
    /// Per-object retry delays of every controller of this scope (reset on success).
    pub retries: tender_runtime::retry::Backoffs,
    /// Clusters (workspace, name) whose status differs from the written one only by the
    /// BundleDeployment summary, and when that summary is due
    /// (decision 0053-cluster-summary-delay).
    pub summary_due: Mutex<HashMap<(String, String), std::time::Instant>>,
    /// A shard replica's writer of its own `status.shards` entry on Bundles, with its own field
    /// manager so server-side apply never removes another replica's entry
    /// (decision 0062-hub-shards).
    pub shard_exec: Option<Executor>,
    /// Clusters (uid, shard label) already warned about a shard id no replica can have.
    pub invalid_shards: Mutex<std::collections::HashSet<(String, String)>>,
    /// `pollingInterval`: the looks at chart repositories, one per interval per chart.
    pub poller: crate::helm_poll::Poller,
    /// The hub's signing keys (decision 0089-signed-copies), swapped by a roll step.
    pub keys: std::sync::RwLock<Arc<crate::signing::HubKeys>>,
    /// Cluster namespace → hash of the key chain published there.
    pub published_chains: Mutex<HashMap<String, String>>,
    /// Where every reconciler of this scope reads the time (a virtual clock in tests).
    pub clock: crate::clock::Clock,
    /// The rollout state Secrets written a moment ago, until their cache shows them.
    pub rollout_writes: RolloutWrites,
}

impl Ctx {
    /// The signing keys in use.
    pub(crate) fn keys(&self) -> Arc<crate::signing::HubKeys> {
        self.keys.read().expect("keys").clone()
    }

    /// The `appliedDeploymentID` an agent reports once it has applied `bd` with the copies the
    /// hub wrote for it: [`tender_types::hash::effective_deployment_id`] of its deploymentID
    /// and the content hashes of its copies in the metadata caches.
    pub(crate) fn expected_deployment_id(&self, bd: &tender_types::BundleDeployment) -> String {
        let ns = bd.namespace().unwrap_or_default();
        let entries = &bd.spec.options.downstream_resources;
        let hashes: Vec<(String, String)> = entries
            .iter()
            .map(|e| {
                let meta = if e.is_carried() || e.kind == "Secret" {
                    let key = ObjectRef::new(&e.copy_name).within(&ns);
                    self.stores
                        .copy_secrets
                        .get(&key)
                        .map(|m| m.metadata.clone())
                } else {
                    let key = ObjectRef::new(&e.copy_name).within(&ns);
                    self.stores
                        .copy_config_maps
                        .get(&key)
                        .map(|m| m.metadata.clone())
                };
                let hash = if e.hash.is_empty() {
                    meta.and_then(|m| {
                        m.annotations?
                            .get(tender_types::labels::CONTENT_HASH)
                            .cloned()
                    })
                    .unwrap_or_default()
                } else {
                    e.hash.clone()
                };
                (e.copy_name.clone(), hash)
            })
            .collect();
        tender_types::hash::effective_deployment_id(
            &bd.spec.deployment_id,
            hashes.iter().map(|(c, h)| (c.as_str(), h.as_str())),
        )
    }
}

/// (cluster ns, placeholder) → (resourceVersion judged, content hash or why refused).
type Verdicts = HashMap<(String, String), (String, Result<String, String>)>;

/// What reverse sync ([`crate::upstream`]) remembers between reconciles (no Secret data). It
/// lives here, with the rest of a scope's shared state, so the context never imports a
/// reconciler.
#[derive(Default)]
pub(crate) struct UpstreamMemo {
    /// (cluster ns, placeholder) → (resourceVersion judged, content hash or why refused).
    pub verdicts: Mutex<Verdicts>,
    /// (cluster ns, Role name) → hash of the Role/RoleBinding this process applied.
    pub access: Mutex<HashMap<(String, String), String>>,
    /// (Bundle namespace, name) → the status lines of its last reverse-sync run, which the
    /// Bundle controller writes (decision 0114-reverse-sync-controller). Absent: not run since
    /// this process started, and the lines in status stay.
    pub lines: Mutex<HashMap<(String, String), Vec<tender_types::UpstreamPublication>>>,
}

/// The status write of `K` `namespace/name` (server-side apply of `new` to the status
/// subresource), or none when `new` equals the cached `old`. `desired` keys the content in the
/// executor's memo; `live_version` is the cached object's resourceVersion.
pub(crate) fn status_op<K, S>(
    namespace: &str,
    name: &str,
    live_version: Option<String>,
    old: Option<&S>,
    new: &S,
    desired: String,
) -> Option<Op>
where
    K: Resource<DynamicType = ()>,
    S: serde::Serialize + PartialEq,
{
    if old == Some(new) {
        return None;
    }
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": new,
    });
    Some(Op::ApplyStatus(Apply {
        key: ObjectKey::of::<K>(Some(namespace), name),
        body,
        replace_if_immutable: false,
        fingerprint: Some(Fingerprint {
            live_version,
            desired,
        }),
    }))
}

impl Ctx {
    /// Whether this replica serves `cluster`: its shard label names this replica's shard id
    /// (or, for the unsharded replica, it has none).
    pub(crate) fn serves(&self, cluster: &Cluster) -> bool {
        cluster.labels().get(labels::SHARD).map(String::as_str) == self.config.shard_id.as_deref()
    }

    /// Whether the Cluster an object in a cluster namespace belongs to (from its workspace and
    /// cluster labels) exists and is served by another replica: never delete such an object,
    /// the other replica adopts it (a Cluster leaving this shard is not a deletion).
    pub(crate) fn served_elsewhere(&self, labels: &BTreeMap<String, String>) -> bool {
        match (labels.get(labels::WORKSPACE), labels.get(labels::CLUSTER)) {
            (Some(workspace), Some(cluster)) => self.cluster_served_elsewhere(workspace, cluster),
            _ => false,
        }
    }

    /// Whether Cluster `workspace`/`cluster_label` (its `tender.dev/cluster` label value)
    /// exists and is served by another replica.
    pub(crate) fn cluster_served_elsewhere(&self, workspace: &str, cluster_label: &str) -> bool {
        self.stores
            .clusters
            .find(|c| {
                c.namespace().as_deref() == Some(workspace)
                    && labels::safe_label_value(&c.name_any()) == cluster_label
            })
            .is_some_and(|c| !self.serves(&c))
    }

    /// The shard ids the Clusters of `workspace` are labelled with.
    pub(crate) fn shards_serving(&self, workspace: &str) -> std::collections::BTreeSet<String> {
        self.clusters_in(workspace)
            .iter()
            .filter_map(|c| c.labels().get(labels::SHARD).cloned())
            .collect()
    }

    /// The Clusters of `workspace` this replica serves (see [`Self::serves`]).
    pub(crate) fn own_clusters_in(&self, workspace: &str) -> Vec<Arc<Cluster>> {
        let mut clusters = self.clusters_in(workspace);
        clusters.retain(|c| self.serves(c));
        clusters
    }

    /// The namespace of `cluster` on the hub, when the cache holds the one the hub created
    /// for it (the uid recorded on the Cluster,
    /// decision 0074-cluster-namespaces-provably-the-hubs). Where the hub writes for a Cluster
    /// comes from this alone, never from anything the Cluster's status says.
    pub(crate) fn owned_namespace(&self, cluster: &Cluster) -> Option<String> {
        let workspace = cluster.namespace()?;
        let name = names::cluster_namespace(&workspace, &cluster.name_any());
        let live = self.stores.namespaces.get(&ObjectRef::new(&name))?;
        let recorded = cluster.annotations().get(labels::NAMESPACE_UID);
        (ownership(recorded.map(String::as_str), live.uid().as_deref(), None) == Ownership::Ours)
            .then_some(name)
    }

    /// The Clusters of `workspace` that are not being deleted, from the cache (every shard's).
    pub(crate) fn clusters_in(&self, workspace: &str) -> Vec<Arc<Cluster>> {
        self.stores
            .clusters
            .state()
            .into_iter()
            .filter(|c| c.namespace().as_deref() == Some(workspace))
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect()
    }

    /// Carries out a status write from [`status_op`] (none: nothing changed) and counts it.
    pub(crate) async fn write_status(&self, op: Option<Op>) -> Result<(), crate::Error> {
        let Some(op) = op else { return Ok(()) };
        self.write_status_with(&self.exec, op).await
    }

    /// Carries out status write `op` with `exec` (a writer with its own field manager: the
    /// poller's, a shard replica's) and counts it; the executor skips it when `exec` wrote the
    /// same a moment ago.
    pub(crate) async fn write_status_with(
        &self,
        exec: &Executor,
        op: Op,
    ) -> Result<(), crate::Error> {
        let kind = op.key().map(|k| k.kind().to_string()).unwrap_or_default();
        if exec.execute(op).await?.wrote {
            self.hub
                .status_writes
                .get_or_create(&crate::KindLabels { kind })
                .inc();
        }
        Ok(())
    }

    /// Whether the executor just wrote this status (its watch event is still on the way).
    pub(crate) fn status_just_written(&self, op: &Op) -> bool {
        match op {
            Op::ApplyStatus(Apply {
                key,
                fingerprint: Some(fp),
                ..
            }) => self.exec.memo().written(key, fp).is_some(),
            _ => false,
        }
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
        let op = Op::Event(EventOp {
            regarding: regarding.clone(),
            type_,
            reason: reason.to_string(),
            action: action.to_string(),
            note,
        });
        // Events never fail: the executor logs a publishing error.
        let _ = self.exec.execute(op).await;
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

/// The rollout state Secrets this process wrote, by name, until the cache
/// (`Stores::rollout_states`) shows each at or past what was written (decision 0121). A
/// reconcile that read the cache before the write's watch event arrived would otherwise take
/// the state before it: a "new" revision, its kept previous revisions dropped, and a later
/// rollback with nothing to restore.
#[derive(Debug, Default)]
pub(crate) struct RolloutWrites(Mutex<WrittenStates>);

#[derive(Debug, Default)]
struct WrittenStates {
    by_name: HashMap<String, Arc<Secret>>,
    /// While the cache relists: the highest resourceVersion listed so far.
    relisted_up_to: Option<u64>,
}

impl RolloutWrites {
    /// The apiserver's answer to a rollout state write.
    pub(crate) fn record(&self, secret: Secret) {
        let mut w = self.0.lock().expect("rollout writes");
        w.by_name.insert(secret.name_any(), Arc::new(secret));
    }

    /// Forgets `name` (its Bundle went).
    pub(crate) fn forget(&self, name: &str) {
        self.0.lock().expect("rollout writes").by_name.remove(name);
    }

    /// The cache applied `event`: an entry retires once the cache shows its Secret at or past
    /// the version written, deleted since, or absent from a relist made after the write (one
    /// that lists any object at or past it).
    pub(crate) fn seen(&self, event: &kube::runtime::watcher::Event<Secret>) {
        use kube::runtime::watcher::Event;
        let mut w = self.0.lock().expect("rollout writes");
        match event {
            Event::Init => w.relisted_up_to = Some(0),
            Event::InitDone => {
                if let Some(up_to) = w.relisted_up_to.take() {
                    let up_to = up_to.to_string();
                    w.by_name
                        .retain(|_, written| !at_or_past(Some(&up_to), written));
                }
            }
            Event::Apply(s) | Event::InitApply(s) | Event::Delete(s) => {
                let version = s.resource_version();
                if let (Event::InitApply(_), Some(up_to)) = (event, w.relisted_up_to.as_mut()) {
                    let listed = version.as_deref().and_then(|v| v.parse().ok());
                    *up_to = (*up_to).max(listed.unwrap_or(0));
                }
                let name = s.name_any();
                if w.by_name
                    .get(&name)
                    .is_some_and(|written| at_or_past(version.as_deref(), written))
                {
                    w.by_name.remove(&name);
                }
            }
        }
    }

    /// What a reconcile reads for `name`: the cached Secret, or the one written here when the
    /// cache does not show it yet.
    pub(crate) fn newest(&self, name: &str, cached: Option<Arc<Secret>>) -> Option<Arc<Secret>> {
        let mut w = self.0.lock().expect("rollout writes");
        let Some(written) = w.by_name.get(name) else {
            return cached;
        };
        match cached {
            Some(c) if at_or_past(c.resource_version().as_deref(), written) => {
                w.by_name.remove(name);
                Some(c)
            }
            _ => Some(written.clone()),
        }
    }

    /// Secrets written and not yet shown by the cache.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().expect("rollout writes").by_name.len()
    }
}

/// Whether an object at `version` is the one `written` or a later one. resourceVersions are
/// opaque; every apiserver backed by etcd (and the fake) gives integers that grow, and a
/// version that is not one only counts when it is the very one written.
fn at_or_past(version: Option<&str>, written: &Secret) -> bool {
    let written = written.resource_version();
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
    match (number(version), number(written.as_deref())) {
        (Some(v), Some(w)) => v >= w,
        _ => version.is_some() && version == written.as_deref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn state(version: &str) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("tender-rollout-ws-app".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn version(s: Option<Arc<Secret>>) -> Option<String> {
        s?.resource_version()
    }

    const NAME: &str = "tender-rollout-ws-app";

    #[test]
    fn the_write_is_read_until_the_cache_shows_it_or_a_later_version() {
        let w = RolloutWrites::default();
        w.record(state("10"));
        assert_eq!(
            version(w.newest(NAME, None)),
            Some("10".into()),
            "not cached yet"
        );
        let older = Some(Arc::new(state("9")));
        assert_eq!(version(w.newest(NAME, older)), Some("10".into()));
        let later = Some(Arc::new(state("12")));
        assert_eq!(version(w.newest(NAME, later)), Some("12".into()));
        assert_eq!(w.len(), 0, "the cache decides from then on");
        assert_eq!(w.newest("other", None), None);
    }

    #[test]
    fn the_watch_retires_the_write_at_its_echo_a_deletion_or_a_relist() {
        let w = RolloutWrites::default();
        w.record(state("10"));
        w.seen(&Event::Apply(state("9")));
        assert_eq!(w.len(), 1, "an event from before the write");
        w.seen(&Event::Apply(state("10")));
        assert_eq!(w.len(), 0, "its echo");

        w.record(state("20"));
        w.seen(&Event::Delete(state("25")));
        assert_eq!(
            w.len(),
            0,
            "deleted since (an administrator clearing the state)"
        );

        // A relist that lists anything at or past the write shows what is there now, even
        // without the Secret (deleted while the watch was down) ...
        w.record(state("30"));
        w.seen(&Event::Init);
        let mut another = state("31");
        another.metadata.name = Some("tender-rollout-ws-other".into());
        w.seen(&Event::InitApply(another));
        w.seen(&Event::InitDone);
        assert_eq!(w.len(), 0);
        // ... one that may be older than the write does not.
        w.record(state("40"));
        w.seen(&Event::Init);
        w.seen(&Event::InitApply(state("39")));
        w.seen(&Event::InitDone);
        assert_eq!(w.len(), 1);
        w.forget(NAME);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn a_version_that_is_no_number_counts_only_when_it_is_the_one_written() {
        let w = RolloutWrites::default();
        w.record(state("abc"));
        assert_eq!(
            version(w.newest(NAME, Some(Arc::new(state("abd"))))),
            Some("abc".into())
        );
        assert_eq!(
            version(w.newest(NAME, Some(Arc::new(state("abc"))))),
            Some("abc".into())
        );
        assert_eq!(w.len(), 0);
    }
}
