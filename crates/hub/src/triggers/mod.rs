//! From cache events to reconcile requests: which change of which object wakes which
//! reconciler, and the executor's memo entries each event retires.
//!
//! One feed per cache. The Bundle, Cluster, ClusterGroup and HelmOp feeds also hand every
//! applied object to their controller's own trigger stream (`Controller::for_stream`), so each
//! kind is watched exactly once per process.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures::future::{BoxFuture, FutureExt};
use futures::stream::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tender_runtime::ObjectKey;
use tender_types::conditions::{TYPE_AGENT_CONNECTED, TYPE_READY, is_true};
use tender_types::copy::CopyableKind;
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterGroup, HelmOp, SourceKind, labels};

use crate::bundle::depends;
use crate::caches::{CacheEvents, Events};
use crate::context::{Ctx, cluster_for_labels};
use crate::summary::{DeploymentState, classify_with};

/// The streams the controllers run on.
pub(crate) struct ControllerInputs {
    /// Applied Bundles (the controller's own trigger stream).
    pub bundles: UnboundedReceiver<Arc<Bundle>>,
    /// Applied Bundles, for the poll controller.
    pub polls: UnboundedReceiver<Arc<Bundle>>,
    /// Applied Bundles, for the reverse-sync controller.
    pub upstreams: UnboundedReceiver<Arc<Bundle>>,
    /// Bundles another object's change concerns, for the reverse-sync controller.
    pub upstream: UnboundedReceiver<ObjectRef<Bundle>>,
    /// "Every Bundle", for the reverse-sync controller.
    pub all_upstreams: UnboundedReceiver<()>,
    /// Bundles another object's change concerns.
    pub bundle: UnboundedReceiver<ObjectRef<Bundle>>,
    /// "Every Bundle": a change that may retarget any of them.
    pub all_bundles: UnboundedReceiver<()>,
    /// Applied Clusters.
    pub clusters: UnboundedReceiver<Arc<Cluster>>,
    /// Clusters another object's change concerns.
    pub cluster: UnboundedReceiver<ObjectRef<Cluster>>,
    /// Applied ClusterGroups.
    pub groups: UnboundedReceiver<Arc<ClusterGroup>>,
    /// ClusterGroups whose counts may have changed.
    pub group: UnboundedReceiver<ObjectRef<ClusterGroup>>,
    /// Applied HelmOps.
    pub helmops: UnboundedReceiver<Arc<HelmOp>>,
    /// HelmOps whose Bundle changed.
    pub helmop: UnboundedReceiver<ObjectRef<HelmOp>>,
}

#[derive(Clone)]
struct Triggers {
    bundles: UnboundedSender<Arc<Bundle>>,
    polls: UnboundedSender<Arc<Bundle>>,
    upstreams: UnboundedSender<Arc<Bundle>>,
    upstream: UnboundedSender<ObjectRef<Bundle>>,
    all_upstreams: UnboundedSender<()>,
    bundle: UnboundedSender<ObjectRef<Bundle>>,
    all_bundles: UnboundedSender<()>,
    clusters: UnboundedSender<Arc<Cluster>>,
    cluster: UnboundedSender<ObjectRef<Cluster>>,
    groups: UnboundedSender<Arc<ClusterGroup>>,
    group: UnboundedSender<ObjectRef<ClusterGroup>>,
    helmops: UnboundedSender<Arc<HelmOp>>,
    helmop: UnboundedSender<ObjectRef<HelmOp>>,
}

// A closed channel means the controllers are stopping; nothing to do. What wakes the Bundle
// controller wakes reverse sync too (decision 0114-reverse-sync-controller).
impl Triggers {
    fn bundle(&self, r: ObjectRef<Bundle>) {
        let _ = self.upstream.unbounded_send(r.clone());
        let _ = self.bundle.unbounded_send(r);
    }
    fn all_bundles(&self) {
        let _ = self.all_upstreams.unbounded_send(());
        let _ = self.all_bundles.unbounded_send(());
    }
    fn cluster(&self, r: ObjectRef<Cluster>) {
        let _ = self.cluster.unbounded_send(r);
    }
    fn groups_in(&self, groups: &Store<ClusterGroup>, namespace: Option<&str>) {
        for g in groups.state() {
            if namespace.is_none() || g.namespace().as_deref() == namespace {
                let _ = self.group.unbounded_send(ObjectRef::from_obj(g.as_ref()));
            }
        }
    }
}

/// The feeds of one scope (to be run until the scope stops) and the controllers' inputs.
pub(crate) fn feeds(
    ctx: &Arc<Ctx>,
    events: CacheEvents,
) -> (Vec<BoxFuture<'static, ()>>, ControllerInputs) {
    let (bundles_tx, bundles) = unbounded();
    let (polls_tx, polls) = unbounded();
    let (upstreams_tx, upstreams) = unbounded();
    let (upstream_tx, upstream) = unbounded();
    let (all_upstreams_tx, all_upstreams) = unbounded();
    let (bundle_tx, bundle) = unbounded();
    let (all_tx, all_bundles) = unbounded();
    let (clusters_tx, clusters) = unbounded();
    let (cluster_tx, cluster) = unbounded();
    let (groups_tx, groups) = unbounded();
    let (group_tx, group) = unbounded();
    let (helmops_tx, helmops) = unbounded();
    let (helmop_tx, helmop) = unbounded();
    let t = Triggers {
        bundles: bundles_tx,
        polls: polls_tx,
        upstreams: upstreams_tx,
        upstream: upstream_tx,
        all_upstreams: all_upstreams_tx,
        bundle: bundle_tx,
        all_bundles: all_tx,
        clusters: clusters_tx,
        cluster: cluster_tx,
        groups: groups_tx,
        group: group_tx,
        helmops: helmops_tx,
        helmop: helmop_tx,
    };
    let mut feeds = vec![
        bundle_feed(ctx.clone(), t.clone(), events.bundles),
        key_feed(ctx.clone(), t.clone()),
        cluster_feed(ctx.clone(), t.clone(), events.clusters),
        group_feed(ctx.clone(), t.clone(), events.groups),
        helmop_feed(ctx.clone(), t.clone(), events.helmops),
        bundle_deployment_feed(ctx.clone(), t.clone(), events.bundle_deployments),
        metadata_feed(
            ctx.clone(),
            t.clone(),
            SourceKind::Secret,
            meta_events(events.copy_secrets),
            copy_changed,
        ),
        metadata_feed(
            ctx.clone(),
            t.clone(),
            SourceKind::ConfigMap,
            meta_events(events.copy_config_maps),
            copy_changed,
        ),
        metadata_feed(
            ctx.clone(),
            t.clone(),
            SourceKind::Secret,
            meta_events(events.source_secrets),
            source_changed,
        ),
        metadata_feed(
            ctx.clone(),
            t.clone(),
            SourceKind::ConfigMap,
            meta_events(events.source_config_maps),
            source_changed,
        ),
        namespace_feed(ctx.clone(), t.clone(), meta_events(events.namespaces)),
        lease_feed(ctx.clone(), t.clone(), events.leases),
        rollout_state_feed(ctx.clone(), t.clone(), events.rollout_states),
    ];
    for (kind, events) in events.carried {
        feeds.push(carried_source_feed(
            ctx.clone(),
            t.clone(),
            kind,
            meta_events(events),
        ));
    }
    let inputs = ControllerInputs {
        bundles,
        polls,
        upstreams,
        upstream,
        all_upstreams,
        bundle,
        all_bundles,
        clusters,
        cluster,
        groups,
        group,
        helmops,
        helmop,
    };
    (feeds, inputs)
}

/// Consumes a cache's events, calling `on_event` for each.
fn drive<K: Send + 'static>(
    events: Events<K>,
    mut on_event: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> BoxFuture<'static, ()> {
    events
        .for_each(move |event| {
            on_event(&event);
            futures::future::ready(())
        })
        .boxed()
}

/// The object an event is about (`None` for list bookkeeping), and whether it was deleted.
fn touched<K>(event: &watcher::Event<K>) -> Option<(&K, bool)> {
    match event {
        watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => Some((obj, false)),
        watcher::Event::Delete(obj) => Some((obj, true)),
        _ => None,
    }
}

/// Like [`touched`], but only for changes after the initial list (whose end, `InitDone`,
/// triggers every Bundle once instead).
fn changed<K>(event: &watcher::Event<K>) -> Option<(&K, bool)> {
    match event {
        watcher::Event::InitApply(_) => None,
        other => touched(other),
    }
}

/// The executor memo entry of `obj`: its watch event arrived, so the cache decides again.
fn forget<K: Resource<DynamicType = ()>>(ctx: &Ctx, obj: &K) {
    let key = ObjectKey::of::<K>(obj.meta().namespace.as_deref(), &obj.name_any());
    ctx.exec.memo().forget(&key);
    if let Some(exec) = &ctx.shard_exec {
        exec.memo().forget(&key);
    }
}

fn key_of(parts: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// The Bundle an object written for it belongs to, from its labels (copies and
/// BundleDeployments: bundle-name; reverse-sync placeholders and publications: upstream-bundle).
fn bundle_of(meta: &ObjectMeta) -> Option<ObjectRef<Bundle>> {
    let labels = meta.labels.as_ref()?;
    let name = labels
        .get(labels::BUNDLE_NAME)
        .or_else(|| labels.get(labels::UPSTREAM_BUNDLE))?;
    Some(ObjectRef::new(name).within(labels.get(labels::BUNDLE_NAMESPACE)?))
}

/// Bundles: their own controller (status memo retired first), and the HelmOp of the same
/// name, if there is one (its Bundle's spec, status or deletion).
fn bundle_feed(ctx: Arc<Ctx>, t: Triggers, events: Events<Bundle>) -> BoxFuture<'static, ()> {
    // A shard replica wakes only for what it acts on: every replica's status write reaches
    // every replica, and reconciling each other's entries multiplied the Bundle reconciles by
    // the replica count (decision 0062-hub-shards).
    let shard = ctx.config.shard_id.clone();
    let mut seen: HashMap<ObjectRef<Bundle>, u64> = HashMap::new();
    // dependsOn: a Bundle's existence, spec and labels decide what its dependents resolve to
    // (a missing dependency, a cycle); its status writes do not.
    let mut resolved: HashMap<ObjectRef<Bundle>, u64> = HashMap::new();
    drive(events, move |event| {
        if let Some((b, deleted)) = touched(event) {
            forget(&ctx, b);
            let r = ObjectRef::from_obj(b);
            let key = key_of((b.metadata.generation, b.labels()));
            let before = if deleted {
                resolved.remove(&r)
            } else {
                resolved.insert(r.clone(), key)
            };
            if !matches!(event, watcher::Event::InitApply(_)) && (deleted || before != Some(key)) {
                dependents_changed(&ctx, &t, &r);
            }
            let wake = match &shard {
                None => true,
                Some(id) => {
                    let r = ObjectRef::from_obj(b);
                    if deleted {
                        seen.remove(&r);
                        true
                    } else {
                        let key = shard_wake_key(b, id);
                        seen.insert(r, key) != Some(key)
                    }
                }
            };
            if !deleted && wake {
                let _ = t.bundles.unbounded_send(Arc::new(b.clone()));
                let _ = t.upstreams.unbounded_send(Arc::new(b.clone()));
            }
            if !deleted && shard.is_none() {
                let _ = t.polls.unbounded_send(Arc::new(b.clone()));
            }
            let h =
                ObjectRef::<HelmOp>::new(&b.name_any()).within(&b.namespace().unwrap_or_default());
            if ctx.stores.helmops.get(&h).is_some() {
                let _ = t.helmop.unbounded_send(h);
            }
        }
    })
}

/// What a shard replica `id` acts on in a Bundle: its spec (generation), deletion, finalizers,
/// labels and annotations, its own status entry (so a removed entry is written again) and what
/// the poll controller recorded (the version it deploys) — not the other replicas' entries
/// nor the folded status.
fn shard_wake_key(b: &Bundle, id: &str) -> u64 {
    let polled = b.status.as_ref().map(|s| {
        let looked = tender_types::conditions::find_condition(
            &s.conditions,
            tender_types::conditions::TYPE_POLLED,
        )
        .map(|c| c.observed_generation);
        (s.version.clone(), looked)
    });
    let own = b
        .status
        .as_ref()
        .and_then(|s| s.shards.iter().find(|e| e.id == id))
        .map(|e| serde_json::to_string(e).unwrap_or_default());
    let m = b.meta();
    key_of((
        m.generation,
        m.deletion_timestamp.is_some(),
        &m.finalizers,
        &m.labels,
        &m.annotations,
        own,
        polled,
    ))
}

/// HelmOps: their own controller (status memo retired first).
fn helmop_feed(ctx: Arc<Ctx>, t: Triggers, events: Events<HelmOp>) -> BoxFuture<'static, ()> {
    drive(events, move |event| {
        if let Some((h, deleted)) = touched(event) {
            forget(&ctx, h);
            if !deleted {
                let _ = t.helmops.unbounded_send(Arc::new(h.clone()));
            }
        }
    })
}

/// Clusters: labels, annotations, templateValues, deletion, namespace readiness and pausing
/// retarget Bundles; labels,
/// readiness and deletion change group counts. Heartbeats alone trigger neither.
fn cluster_feed(ctx: Arc<Ctx>, t: Triggers, events: Events<Cluster>) -> BoxFuture<'static, ()> {
    let groups = ctx.stores.groups.clone();
    let mut seen: HashMap<ObjectRef<Cluster>, (u64, u64)> = HashMap::new();
    drive(events, move |event| {
        if let watcher::Event::InitDone = event {
            t.all_bundles();
            t.groups_in(&groups, None);
            return;
        }
        let Some((c, deleted)) = touched(event) else {
            return;
        };
        forget(&ctx, c);
        let r = ObjectRef::from_obj(c);
        let ns = c.namespace();
        if deleted {
            seen.remove(&r);
            t.all_bundles();
            t.groups_in(&groups, ns.as_deref());
            return;
        }
        let _ = t.clusters.unbounded_send(Arc::new(c.clone()));
        let deleting = c.metadata.deletion_timestamp.is_some();
        let status_ns = c.status.as_ref().and_then(|s| s.namespace.clone());
        let ready = c
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, TYPE_READY));
        // Connectivity flips mark reverse-sync publications stale (or fresh again).
        let reachable = c.status.as_ref().map(|s| {
            (
                is_true(&s.conditions, TYPE_AGENT_CONNECTED),
                is_true(
                    &s.conditions,
                    tender_types::conditions::TYPE_CLUSTER_CONNECTED,
                ),
            )
        });
        // Annotations and templateValues are read by values templates.
        let template_values = c
            .spec
            .template_values
            .as_ref()
            .map(|v| serde_json::to_string(v).unwrap_or_default());
        let keys = (
            key_of((
                c.labels(),
                deleting,
                &status_ns,
                c.spec.paused,
                reachable,
                (c.annotations(), template_values),
            )),
            key_of((c.labels(), deleting, ready)),
        );
        let before = seen.insert(r, keys);
        if matches!(event, watcher::Event::InitApply(_)) {
            return; // InitDone retargets everything once
        }
        if before.map(|b| b.0) != Some(keys.0) {
            t.all_bundles();
        }
        if before.map(|b| b.1) != Some(keys.1) {
            t.groups_in(&groups, ns.as_deref());
        }
    })
}

/// Groups: their own controller; selector or labels retarget Bundles.
fn group_feed(ctx: Arc<Ctx>, t: Triggers, events: Events<ClusterGroup>) -> BoxFuture<'static, ()> {
    let mut seen: HashMap<ObjectRef<ClusterGroup>, u64> = HashMap::new();
    drive(events, move |event| {
        if let watcher::Event::InitDone = event {
            t.all_bundles();
            return;
        }
        let Some((g, deleted)) = touched(event) else {
            return;
        };
        forget(&ctx, g);
        let r = ObjectRef::from_obj(g);
        if deleted {
            seen.remove(&r);
            t.all_bundles();
            return;
        }
        let _ = t.groups.unbounded_send(Arc::new(g.clone()));
        let key = key_of((
            g.labels(),
            serde_json::to_string(&g.spec.selector).unwrap_or_default(),
        ));
        if seen.insert(r, key) != Some(key) && !matches!(event, watcher::Event::InitApply(_)) {
            t.all_bundles();
        }
    })
}

/// BundleDeployments: their Bundle (status, recreate) and their Cluster (summary).
fn bundle_deployment_feed(
    ctx: Arc<Ctx>,
    t: Triggers,
    events: Events<BundleDeployment>,
) -> BoxFuture<'static, ()> {
    // dependsOn: the state each BundleDeployment was last seen in; only a change of it wakes
    // the Bundles that depend on its Bundle (decision 0097-depends-on-per-cluster).
    let mut states: HashMap<ObjectRef<BundleDeployment>, DeploymentState> = HashMap::new();
    drive(events, move |event| {
        match event {
            watcher::Event::Init => {
                ctx.bd_names.lock().expect("bd index").clear();
                states.clear();
            }
            watcher::Event::InitDone => {
                t.all_bundles();
                return;
            }
            _ => {}
        }
        let Some((bd, deleted)) = touched(event) else {
            return;
        };
        index_bd(&ctx, bd, deleted);
        let r = ObjectRef::from_obj(bd);
        let state_changed = if deleted {
            states.remove(&r).is_some()
        } else {
            let state = classify_with(bd, &ctx.expected_deployment_id(bd));
            states.insert(r, state) != Some(state)
        };
        if matches!(event, watcher::Event::InitApply(_)) {
            return;
        }
        forget(&ctx, bd);
        if let Some(b) = bundle_of(&bd.metadata) {
            if state_changed {
                dependents_changed(&ctx, &t, &b);
            }
            t.bundle(b);
        }
        if let Some(c) = bd.namespace().and_then(|ns| ctx.cluster_of_namespace(&ns)) {
            t.cluster(c);
        }
    })
}

/// Rollout state Secrets: each event retires the memo of the hub's own write it shows
/// (decision 0121); a deletion (an administrator clearing an invalid state) wakes the Bundle.
/// The hub's own writes wake nothing: the reconcile that wrote already acted on them.
fn rollout_state_feed(
    ctx: Arc<Ctx>,
    t: Triggers,
    events: Events<Secret>,
) -> BoxFuture<'static, ()> {
    drive(events, move |event| {
        ctx.rollout_writes.seen(event);
        if let watcher::Event::Delete(secret) = event
            && let Some(b) = bundle_of(&secret.metadata)
        {
            t.bundle(b);
        }
    })
}

/// dependsOn: Bundle `changed` (or one of its BundleDeployments) changed in a way its
/// dependents see: each Bundle of its namespace that may depend on it is woken.
fn dependents_changed(ctx: &Ctx, t: &Triggers, changed: &ObjectRef<Bundle>) {
    let Some(ns) = changed.namespace.as_deref() else {
        return;
    };
    let labels = ctx.stores.bundles.get(changed);
    let labels = labels.as_ref().and_then(|b| b.metadata.labels.as_ref());
    for b in ctx.stores.bundles.state() {
        if b.namespace().as_deref() == Some(ns)
            && b.name_any() != changed.name
            && depends::may_depend_on(&b.spec, &changed.name, labels)
        {
            t.bundle(ObjectRef::from_obj(b.as_ref()));
        }
    }
}

/// Keeps [`Ctx::bd_names`] in step with the BundleDeployment cache.
fn index_bd(ctx: &Ctx, bd: &BundleDeployment, deleted: bool) {
    let ns = bd.namespace().unwrap_or_default();
    let mut index = ctx.bd_names.lock().expect("bd index");
    if deleted {
        if let Some(names) = index.get_mut(&ns) {
            names.remove(&bd.name_any());
            if names.is_empty() {
                index.remove(&ns);
            }
        }
    } else {
        index.entry(ns).or_default().insert(bd.name_any());
    }
}

/// A feed over a Secret or ConfigMap metadata cache: `InitDone` retargets every Bundle, each
/// later change goes to `on_change`.
fn metadata_feed(
    ctx: Arc<Ctx>,
    t: Triggers,
    kind: SourceKind,
    events: Events<ObjectMeta>,
    on_change: fn(&Ctx, &Triggers, SourceKind, &ObjectMeta),
) -> BoxFuture<'static, ()> {
    drive(events, move |event| {
        if let watcher::Event::InitDone = event {
            t.all_bundles();
        }
        if let Some((meta, _)) = changed(event) {
            on_change(&ctx, &t, kind, meta);
        }
    })
}

/// Copies: a changed or deleted copy is rewritten by its Bundle.
fn copy_changed(ctx: &Ctx, t: &Triggers, kind: SourceKind, meta: &ObjectMeta) {
    let (ns, name) = (
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    );
    let key = match kind {
        SourceKind::Secret => ObjectKey::of::<Secret>(ns, name),
        SourceKind::ConfigMap => ObjectKey::of::<ConfigMap>(ns, name),
    };
    ctx.exec.memo().forget(&key);
    if let Some(b) = bundle_of(meta) {
        t.bundle(b);
    }
    // A rotation writes only the copy (decision 0089-signed-copies): what the Cluster's summary
    // counts as applied moved with it, as it moved with a BundleDeployment write before.
    if let Some(c) = ns.and_then(|ns| ctx.cluster_of_namespace(ns)) {
        t.cluster(c);
    }
}

/// Sources: through the index to the Bundles that copy them; a Secret named by a push
/// Cluster's `kubeconfigSecretRef` wakes that Cluster (a rotated credential).
fn source_changed(ctx: &Ctx, t: &Triggers, kind: SourceKind, meta: &ObjectMeta) {
    if kind == SourceKind::Secret
        && let (Some(ns), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref())
    {
        for c in ctx.stores.clusters.state() {
            if c.namespace().as_deref() == Some(ns)
                && c.spec
                    .kubeconfig_secret_ref
                    .as_ref()
                    .is_some_and(|r| r.name == name)
            {
                t.cluster(ObjectRef::from_obj(c.as_ref()));
            }
        }
    }
    // A publication of reverse sync (edited or deleted by hand): its Bundle restores it.
    if let Some(b) = bundle_of(meta) {
        t.bundle(b);
    }
    source_of_kind_changed(ctx, t, &CopyableKind::core(kind), meta);
}

/// A source of any kind (namespace empty for a cluster-scoped one) → the Bundles copying it.
fn source_of_kind_changed(ctx: &Ctx, t: &Triggers, kind: &CopyableKind, meta: &ObjectMeta) {
    let Some(name) = meta.name.clone() else {
        return;
    };
    let ns = meta.namespace.clone().unwrap_or_default();
    for (bns, bname) in ctx.sources.bundles_for(&(ns, kind.clone(), name)) {
        t.bundle(ObjectRef::new(&bname).within(&bns));
    }
}

/// Sources of an allowed kind other than Secret/ConfigMap (metadata only): a change reaches the
/// Bundles that copy it by watch, exactly like a Secret rotation.
fn carried_source_feed(
    ctx: Arc<Ctx>,
    t: Triggers,
    kind: CopyableKind,
    events: Events<ObjectMeta>,
) -> BoxFuture<'static, ()> {
    drive(events, move |event| {
        if let watcher::Event::InitDone = event {
            t.all_bundles();
        }
        if let Some((meta, _)) = changed(event) {
            source_of_kind_changed(&ctx, &t, &kind, meta);
        }
    })
}

/// Cluster namespaces: a deleted namespace is recreated, a finished deletion unblocks.
fn namespace_feed(
    ctx: Arc<Ctx>,
    t: Triggers,
    events: Events<ObjectMeta>,
) -> BoxFuture<'static, ()> {
    // Where a Bundle writes depends on the namespace being in this replica's cache (decision
    // 73): one that arrives (a new Cluster, a Cluster moved to this shard) or goes retargets
    // every Bundle, as a Cluster change does. Other namespace events only wake the Cluster.
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    drive(events, move |event| {
        let Some((ns, deleted)) = changed(event) else {
            return;
        };
        let name = ns.name.as_deref().unwrap_or_default();
        let uid = ns.uid.clone().unwrap_or_default();
        let arrived = if deleted {
            seen.remove(name).is_some()
        } else {
            seen.insert(name.to_string(), uid.clone()).as_deref() != Some(uid.as_str())
        };
        if let Some(labels) = &ns.labels
            && let Some(c) = cluster_for_labels(&ctx.stores.clusters, labels, name)
        {
            t.cluster(c);
            if arrived {
                t.all_bundles();
            }
        }
    })
}

/// Agent Leases: only a cluster not yet known as connected needs a nudge; a connected one
/// is re-checked when its heartbeat would expire.
fn lease_feed(
    ctx: Arc<Ctx>,
    t: Triggers,
    events: Events<k8s_openapi::api::coordination::v1::Lease>,
) -> BoxFuture<'static, ()> {
    drive(events, move |event| {
        let Some((lease, deleted)) = changed(event) else {
            return;
        };
        let Some(c) = lease
            .namespace()
            .and_then(|ns| ctx.cluster_of_namespace(&ns))
        else {
            return;
        };
        let connected = ctx.stores.clusters.get(&c).is_some_and(|c| {
            c.status
                .as_ref()
                .is_some_and(|s| is_true(&s.conditions, TYPE_AGENT_CONNECTED))
        });
        if deleted || !connected {
            t.cluster(c);
        }
    })
}

fn meta_events<K: Clone + Send + 'static>(
    events: Events<kube::api::PartialObjectMeta<K>>,
) -> Events<ObjectMeta> {
    events
        .map(|event| match event {
            watcher::Event::Apply(o) => watcher::Event::Apply(o.metadata),
            watcher::Event::Delete(o) => watcher::Event::Delete(o.metadata),
            watcher::Event::InitApply(o) => watcher::Event::InitApply(o.metadata),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
        })
        .boxed()
}

/// The signing keys: the key Secret read again every `signing_key_poll` (a roll step asked
/// for there is carried out); new keys are swapped in and every Bundle looks again, to publish
/// the chain and sign anew what a retired key signed (decision 0089-signed-copies).
fn key_feed(ctx: Arc<Ctx>, t: Triggers) -> BoxFuture<'static, ()> {
    async move {
        loop {
            tokio::time::sleep(ctx.config.signing_key_poll).await;
            match crate::signing::load_or_create(&ctx.client, &ctx.config.signing).await {
                Ok(keys) => {
                    let old = ctx.keys();
                    let changed = old.active_id() != keys.active_id()
                        || old.public_keys != keys.public_keys
                        || old.chain != keys.chain
                        || old.current_ids() != keys.current_ids();
                    if changed {
                        tracing::info!(active = %keys.active_id(), "signing keys changed");
                        *ctx.keys.write().expect("keys") = Arc::new(keys);
                        t.all_bundles();
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot read the signing key Secret"),
            }
        }
    }
    .boxed()
}

#[cfg(test)]
mod tests;
