//! The Bundle reconcile's one read step: everything the plan and the report need, from the
//! caches (Clusters, groups, BundleDeployments, copies, the workspace's Bundles for
//! `dependsOn`), the sources' content hashes (a GET only for a source that changed since it
//! was hashed), the chart version the poll controller recorded and the status lines reverse
//! sync left, and the rollout state (its cache in the hub's namespace, or the hub's own last
//! write of it while the cache does not show that yet, decision 0121). Nothing is written here but the source index (read before, so a source change
//! after this point always reaches the Bundle again).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tender_types::{
    Bundle, BundleDeployment, BundleState, Cluster, ClusterGroup, UpstreamPublication, names,
};

use super::depends::{self, Node, Resolution};
use super::observe;
use super::ops::{LiveCopy, SourceObject};
use super::plan::{self, SourceKey, SourceState};
use super::poll;
use super::revisions::{self, Kept, Unreadable};
use crate::Error;
use crate::context::Ctx;

/// What one Bundle reconcile reads, owned so that planning can run on a blocking thread.
pub(super) struct Seen {
    pub(super) bundle: Arc<Bundle>,
    /// The chart version the poll controller recorded, if any.
    pub(super) version: Option<String>,
    /// This replica's Clusters of the workspace, and the namespace the hub made for each.
    pub(super) clusters: Vec<Arc<Cluster>>,
    pub(super) owned: Vec<Option<String>>,
    pub(super) groups: Vec<Arc<ClusterGroup>>,
    pub(super) sources: BTreeMap<SourceKey, SourceState>,
    pub(super) copying: plan::Copying,
    /// Sources read in full while hashing them, kept for the copies.
    pub(super) fetched: HashMap<SourceKey, SourceObject>,
    /// The Bundle's BundleDeployments, by cluster namespace.
    pub(super) existing: HashMap<String, Arc<BundleDeployment>>,
    /// The Bundle's copies, by cluster namespace.
    pub(super) copies_by_ns: HashMap<String, Vec<LiveCopy>>,
    /// `dependsOn`: what it resolves to, and the state of each dependency's BundleDeployment
    /// by (dependency, cluster namespace).
    pub(super) depends: Option<(Resolution, DependencyStates)>,
    /// Cluster namespaces whose BundleDeployment belongs to a Cluster another shard serves.
    pub(super) served_elsewhere: BTreeSet<String>,
    /// Reverse sync's status lines (`None`: not run yet; the lines in status stay).
    pub(super) upstream: Option<Vec<UpstreamPublication>>,
    /// `--max-copied-bytes-per-bundle`.
    pub(super) copy_limit: usize,
    /// The rollout state and the previous revisions kept (nothing without a strategy).
    pub(super) rollout: Result<Kept, Unreadable>,
}

/// Reads what `bundle`'s reconcile needs; `None` while the poll controller has not looked
/// at its spec yet (its status write wakes the Bundle again).
pub(super) async fn read(ctx: &Ctx, bundle: &Arc<Bundle>) -> Result<Option<Seen>, Error> {
    let version = match poll::recorded(bundle) {
        poll::Recorded::Waiting => return Ok(None),
        poll::Recorded::NotPolling => None,
        poll::Recorded::Version(v) => v,
    };
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let copying = plan::Copying {
        enabled: ctx.config.copy_resources_downstream,
        allowed: ctx.config.copyable_kinds.clone(),
    };
    let (sources, fetched) = sources(ctx, bundle, copying.enabled).await?;
    // Targeting is over this replica's Clusters only (decision 0062-hub-shards). Where a
    // cluster's BundleDeployment goes is the namespace the hub created for it, never what the
    // Cluster's status (which its agent may write) says (decision 0073-hub-writes-where-it-derives).
    let clusters = ctx.own_clusters_in(&ns);
    let owned: Vec<Option<String>> = clusters.iter().map(|c| ctx.owned_namespace(c)).collect();
    let existing: HashMap<String, Arc<BundleDeployment>> = observe::deployments_of(ctx, bundle)
        .into_iter()
        .map(|bd| (bd.namespace().unwrap_or_default(), bd))
        .collect();
    let served_elsewhere = existing
        .iter()
        .filter(|(_, bd)| ctx.served_elsewhere(bd.labels()))
        .map(|(cns, _)| cns.clone())
        .collect();
    let depends = (!bundle.spec.depends_on.is_empty()).then(|| dependencies(ctx, bundle, &owned));
    let upstream = ctx
        .upstream
        .lines
        .lock()
        .expect("lines")
        .get(&(ns.clone(), name.clone()))
        .cloned();
    Ok(Some(Seen {
        bundle: Arc::clone(bundle),
        version,
        groups: observe::groups_in(ctx, &ns),
        copies_by_ns: observe::bundle_copies(ctx, &ns, &name),
        clusters,
        owned,
        sources,
        copying,
        fetched,
        existing,
        depends,
        served_elsewhere,
        upstream,
        copy_limit: ctx.config.max_copied_bytes_per_bundle,
        rollout: match bundle.spec.rollout_strategy {
            Some(_) => rollout_state(ctx, &ns, &name, bundle.meta().uid.as_deref()),
            None => Ok(Kept::default()),
        },
    }))
}

/// What the rollout Secret of Bundle `ns/name` (of uid `uid`) keeps, checked
/// ([`revisions::parse`]): the cached Secret, or the one this process wrote while the cache is
/// older than it.
fn rollout_state(ctx: &Ctx, ns: &str, name: &str, uid: Option<&str>) -> Result<Kept, Unreadable> {
    let secret_name = names::rollout_secret(ns, name, ctx.config.shard_id.as_deref());
    let key = ObjectRef::new(&secret_name).within(ctx.config.own_namespace());
    let cached = ctx.stores.rollout_states.get(&key);
    let secret = ctx.rollout_writes.newest(&secret_name, cached);
    revisions::parse(secret.as_deref(), uid)
}

/// The state of each dependency's BundleDeployment by (dependency, cluster namespace).
pub(super) type DependencyStates = HashMap<(String, String), BundleState>;

type Sources = (
    BTreeMap<SourceKey, SourceState>,
    HashMap<SourceKey, SourceObject>,
);

/// The state of every source the Bundle copies: index first, then read.
async fn sources(ctx: &Ctx, bundle: &Bundle, enabled: bool) -> Result<Sources, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let refs = if enabled {
        plan::referenced_sources(&bundle.spec)
    } else {
        BTreeSet::new()
    };
    ctx.sources.set(
        &(ns.clone(), bundle.name_any()),
        refs.iter()
            .map(|(kind, source)| {
                let source_ns = observe::source_namespace(ctx, &ns, kind);
                (source_ns, kind.clone(), source.clone())
            })
            .collect(),
    );
    let mut fetched = HashMap::new();
    let mut states = BTreeMap::new();
    for key in &refs {
        let state = observe::source_state(ctx, &ns, key, &mut fetched).await?;
        states.insert(key.clone(), state);
    }
    Ok((states, fetched))
}

/// `dependsOn` over the workspace's cached Bundles, and the cached state of each resolved
/// dependency's BundleDeployment in each of this replica's cluster namespaces.
fn dependencies(
    ctx: &Ctx,
    bundle: &Bundle,
    owned: &[Option<String>],
) -> (Resolution, DependencyStates) {
    let ns = bundle.namespace().unwrap_or_default();
    let workspace: Vec<Arc<Bundle>> = ctx
        .stores
        .bundles
        .state()
        .into_iter()
        .filter(|b| b.namespace().as_deref() == Some(ns.as_str()))
        .filter(|b| b.metadata.deletion_timestamp.is_none())
        .collect();
    let nodes: Vec<Node<'_>> = workspace
        .iter()
        .map(|b| Node {
            name: b.metadata.name.as_deref().unwrap_or_default(),
            labels: b.metadata.labels.as_ref().unwrap_or(observe::no_labels()),
            depends_on: &b.spec.depends_on,
        })
        .collect();
    let resolution = depends::resolve(&bundle.name_any(), &bundle.spec.depends_on, &nodes);
    let mut states = HashMap::new();
    if let Resolution::Resolved(deps) = &resolution {
        let dependencies: BTreeSet<&String> = deps.iter().flat_map(|(_, n)| n).collect();
        for dependency in dependencies {
            let bd_name = names::bundle_deployment_name(dependency);
            for cns in owned.iter().flatten() {
                let Some(bd) = observe::live_deployment(ctx, cns, &bd_name)
                    .filter(|bd| bd.metadata.deletion_timestamp.is_none())
                else {
                    continue;
                };
                let expected = ctx.expected_deployment_id(&bd);
                let state = depends::bundle_state(crate::summary::classify_with(&bd, &expected));
                states.insert((dependency.clone(), cns.clone()), state);
            }
        }
    }
    (resolution, states)
}
