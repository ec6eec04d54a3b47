//! Caches, triggers and controller wiring for one scope.
//!
//! Every cache is a reflector we own; its events are turned into reconcile requests only after
//! the cache has applied them, so a reconciler never reads a cache older than its trigger.
//! Deletions are seen too (shared subscriber streams drop them, which is why we do not use them).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc::{UnboundedSender, unbounded};
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tender_runtime::{Health, Metrics};
use tender_types::conditions::{TYPE_AGENT_CONNECTED, TYPE_READY, is_true};
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterGroup, SourceKind, labels, names};

use crate::context::{Ctx, Scope, Stores, cluster_for_labels};
use crate::sources::SourceIndex;
use crate::{Error, HubConfig, HubMetrics, bundle, cluster, group};

type Events<K> = BoxStream<'static, watcher::Event<K>>;

fn reflect<K>(what: &'static str, api: Api<K>, config: watcher::Config) -> (Store<K>, Events<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let events = reflector::reflector(writer, watcher(api, config).default_backoff())
        .filter_map(move |event| async move {
            match event {
                Ok(event) => Some(event),
                Err(error) => {
                    tracing::warn!(%error, watch = what, "watch failed; retrying with backoff");
                    None
                }
            }
        })
        .boxed();
    (reader, events)
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
        watcher::Event::Apply(obj) => Some((obj, false)),
        watcher::Event::Delete(obj) => Some((obj, true)),
        _ => None,
    }
}

fn key_of(parts: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// The Bundle an object written for it belongs to, from its labels.
fn bundle_of(meta: &kube::api::ObjectMeta) -> Option<ObjectRef<Bundle>> {
    let labels = meta.labels.as_ref()?;
    Some(
        ObjectRef::new(labels.get(labels::BUNDLE_NAME)?)
            .within(labels.get(labels::BUNDLE_NAMESPACE)?),
    )
}

struct Triggers {
    bundle: UnboundedSender<ObjectRef<Bundle>>,
    bundle_all: UnboundedSender<()>,
    cluster: UnboundedSender<ObjectRef<Cluster>>,
    group: UnboundedSender<ObjectRef<ClusterGroup>>,
}

impl Triggers {
    // A closed channel means the controllers are stopping; nothing to do.
    fn bundle(&self, r: ObjectRef<Bundle>) {
        let _ = self.bundle.unbounded_send(r);
    }
    fn all_bundles(&self) {
        let _ = self.bundle_all.unbounded_send(());
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

/// Builds caches and controllers for every configured scope and runs them.
pub(crate) async fn run_controllers(
    client: Client,
    config: Arc<HubConfig>,
    metrics: Arc<Metrics>,
    hub: HubMetrics,
    health: Health,
) -> Result<(), Error> {
    let scopes: Vec<Scope> = if config.workspace_namespaces.is_empty() {
        vec![Scope::All]
    } else {
        config
            .workspace_namespaces
            .iter()
            .map(|ns| Scope::Namespace(ns.clone()))
            .collect()
    };
    let mut ready = Vec::new();
    let mut running = Vec::new();
    for scope in scopes {
        let (synced, run) = scope_controllers(
            scope,
            client.clone(),
            config.clone(),
            metrics.clone(),
            hub.clone(),
        );
        ready.push(synced);
        running.push(run);
    }
    let readiness = async move {
        for synced in ready {
            synced.await?;
        }
        health.set_ready(true);
        tracing::info!("caches synced; hub ready");
        // Keep this arm pending: readiness is not a reason to stop.
        futures::future::pending::<Result<(), Error>>().await
    };
    tokio::select! {
        result = readiness => result,
        () = async { futures::future::select_all(running).await; } => {
            tracing::warn!("a controller stopped");
            Ok(())
        }
    }
}

/// One scope: returns a future resolving when its caches have synced, and the future that
/// runs its caches and controllers.
fn scope_controllers(
    scope: Scope,
    client: Client,
    config: Arc<HubConfig>,
    metrics: Arc<Metrics>,
    hub: HubMetrics,
) -> (
    BoxFuture<'static, Result<(), Error>>,
    BoxFuture<'static, ()>,
) {
    let wc = watcher::Config::default();
    let in_workspaces = watcher::Config::default().labels(&scope.workspace_selector());

    let (clusters, cluster_events) = reflect("clusters", scope.api::<Cluster>(&client), wc.clone());
    let (groups, group_events) = reflect(
        "clustergroups",
        scope.api::<ClusterGroup>(&client),
        wc.clone(),
    );
    let (bundle_deployments, bd_events) = reflect(
        "bundledeployments",
        Api::<BundleDeployment>::all(client.clone()),
        in_workspaces.clone(),
    );
    let (copy_secrets, copy_secret_events) = reflect(
        "copied secrets",
        Api::<PartialObjectMeta<Secret>>::all(client.clone()),
        in_workspaces.clone(),
    );
    let (copy_config_maps, copy_cm_events) = reflect(
        "copied configmaps",
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        in_workspaces.clone(),
    );
    // Sources: metadata only, never copies (which carry the bundle-name label).
    let not_copies = watcher::Config::default().labels(&format!("!{}", labels::BUNDLE_NAME));
    let (source_secrets, source_secret_events) = reflect(
        "source secrets",
        scope.api::<PartialObjectMeta<Secret>>(&client),
        not_copies.clone(),
    );
    let (source_config_maps, source_cm_events) = reflect(
        "source configmaps",
        scope.api::<PartialObjectMeta<ConfigMap>>(&client),
        not_copies,
    );
    let (namespaces, ns_events) = reflect(
        "cluster namespaces",
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        in_workspaces,
    );
    let (leases, lease_events) = reflect(
        "agent leases",
        Api::<Lease>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", names::AGENT_LEASE)),
    );

    let stores = Stores {
        clusters,
        groups,
        bundle_deployments,
        copy_secrets,
        copy_config_maps,
        source_secrets,
        source_config_maps,
        namespaces,
        leases,
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: labels::HUB_FIELD_MANAGER.to_string(),
            instance: Some(config.instance.clone()),
        },
    );
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        config,
        metrics,
        hub,
        recorder,
        stores: stores.clone(),
        sources: SourceIndex::default(),
        source_hashes: Mutex::default(),
        provisioned: Mutex::default(),
        recent: Default::default(),
        bd_names: Default::default(),
    });

    let (bundle_tx, bundle_rx) = unbounded();
    let (bundle_all_tx, bundle_all_rx) = unbounded();
    let (cluster_tx, cluster_rx) = unbounded();
    let (group_tx, group_rx) = unbounded();
    let triggers = Arc::new(Triggers {
        bundle: bundle_tx,
        bundle_all: bundle_all_tx,
        cluster: cluster_tx,
        group: group_tx,
    });

    let mut feeds: Vec<BoxFuture<'static, ()>> = Vec::new();

    // Clusters: labels, deletion, namespace readiness and pausing retarget Bundles; labels,
    // readiness and deletion change group counts. Heartbeats alone trigger neither.
    {
        let t = triggers.clone();
        let groups = stores.groups.clone();
        let mut seen: HashMap<ObjectRef<Cluster>, (u64, u64)> = HashMap::new();
        feeds.push(drive(cluster_events, move |event| {
            if let watcher::Event::InitDone = event {
                t.all_bundles();
                t.groups_in(&groups, None);
                return;
            }
            let Some((c, deleted)) = touched(event) else {
                return;
            };
            let r = ObjectRef::from_obj(c);
            let ns = c.namespace();
            if deleted {
                seen.remove(&r);
                t.all_bundles();
                t.groups_in(&groups, ns.as_deref());
                return;
            }
            let deleting = c.metadata.deletion_timestamp.is_some();
            let status_ns = c.status.as_ref().and_then(|s| s.namespace.clone());
            let ready = c
                .status
                .as_ref()
                .is_some_and(|s| is_true(&s.conditions, TYPE_READY));
            let keys = (
                key_of((c.labels(), deleting, &status_ns, c.spec.paused)),
                key_of((c.labels(), deleting, ready)),
            );
            let before = seen.insert(r, keys);
            if before.map(|b| b.0) != Some(keys.0) {
                t.all_bundles();
            }
            if before.map(|b| b.1) != Some(keys.1) {
                t.groups_in(&groups, ns.as_deref());
            }
        }));
    }
    // Groups: selector or labels retarget Bundles.
    {
        let t = triggers.clone();
        let mut seen: HashMap<ObjectRef<ClusterGroup>, u64> = HashMap::new();
        feeds.push(drive(group_events, move |event| {
            if let watcher::Event::InitDone = event {
                t.all_bundles();
                return;
            }
            let Some((g, deleted)) = touched(event) else {
                return;
            };
            let r = ObjectRef::from_obj(g);
            if deleted {
                seen.remove(&r);
                t.all_bundles();
                return;
            }
            let key = key_of((
                g.labels(),
                serde_json::to_string(&g.spec.selector).unwrap_or_default(),
            ));
            if seen.insert(r, key) != Some(key) {
                t.all_bundles();
            }
        }));
    }
    // BundleDeployments: their Bundle (status, recreate) and their Cluster (summary).
    {
        let t = triggers.clone();
        let ctx = ctx.clone();
        feeds.push(drive(bd_events, move |event| {
            match event {
                watcher::Event::Init => ctx.bd_names.lock().expect("bd index").clear(),
                watcher::Event::InitApply(bd) => index_bd(&ctx, bd, false),
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
            ctx.recent.forget(&format!(
                "bd/{}/{}",
                bd.namespace().unwrap_or_default(),
                bd.name_any()
            ));
            if let Some(b) = bundle_of(&bd.metadata) {
                t.bundle(b);
            }
            if let Some(c) = bd.namespace().and_then(|ns| ctx.cluster_of_namespace(&ns)) {
                t.cluster(c);
            }
        }));
    }
    // Copies: a changed or deleted copy is rewritten by its Bundle.
    for (kind, events) in [
        (SourceKind::Secret, copy_secret_events.map(meta_of).boxed()),
        (SourceKind::ConfigMap, copy_cm_events.map(meta_of).boxed()),
    ] {
        let t = triggers.clone();
        let ctx = ctx.clone();
        feeds.push(drive(events, move |event| {
            if let watcher::Event::InitDone = event {
                t.all_bundles();
                return;
            }
            let Some((meta, _)) = touched(event) else {
                return;
            };
            ctx.recent.forget(&format!(
                "{kind}/{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ));
            if let Some(b) = bundle_of(meta) {
                t.bundle(b);
            }
        }));
    }
    // Sources: through the index to the Bundles that copy them.
    for (kind, events) in [
        (
            SourceKind::Secret,
            source_secret_events.map(meta_of).boxed(),
        ),
        (SourceKind::ConfigMap, source_cm_events.map(meta_of).boxed()),
    ] {
        let t = triggers.clone();
        let ctx = ctx.clone();
        feeds.push(drive(events, move |event| {
            if let watcher::Event::InitDone = event {
                t.all_bundles();
                return;
            }
            let Some((meta, _)) = touched(event) else {
                return;
            };
            let (Some(ns), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
                return;
            };
            for (bns, bname) in ctx.sources.bundles_for(&(ns, kind, name)) {
                t.bundle(ObjectRef::new(&bname).within(&bns));
            }
        }));
    }
    // Cluster namespaces: a deleted namespace is recreated, a finished deletion unblocks.
    {
        let t = triggers.clone();
        let clusters = stores.clusters.clone();
        feeds.push(drive(ns_events, move |event| {
            let Some((ns, _)) = touched(event) else {
                return;
            };
            if let Some(c) = cluster_for_labels(&clusters, ns.labels(), &ns.name_any()) {
                t.cluster(c);
            }
        }));
    }
    // Agent Leases: only a cluster not yet known as connected needs a nudge; a connected one
    // is re-checked when its heartbeat would expire.
    {
        let t = triggers.clone();
        let ctx = ctx.clone();
        feeds.push(drive(lease_events, move |event| {
            let Some((lease, deleted)) = touched(event) else {
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
        }));
    }

    let synced = {
        let s = stores.clone();
        async move {
            macro_rules! wait {
                ($store:expr, $what:literal) => {
                    $store
                        .wait_until_ready()
                        .await
                        .map_err(|_| Error::CacheSync($what))?
                };
            }
            wait!(s.clusters, "clusters");
            wait!(s.groups, "clustergroups");
            wait!(s.bundle_deployments, "bundledeployments");
            wait!(s.copy_secrets, "copied secrets");
            wait!(s.copy_config_maps, "copied configmaps");
            wait!(s.source_secrets, "source secrets");
            wait!(s.source_config_maps, "source configmaps");
            wait!(s.namespaces, "cluster namespaces");
            wait!(s.leases, "agent leases");
            Ok::<(), Error>(())
        }
    };
    let (synced_tx, synced_rx) = futures::channel::oneshot::channel::<Result<(), String>>();
    let scope_name = scope.describe();

    let controllers = async move {
        // Reconcilers plan against the caches: never start them on a partial view (an empty
        // cluster cache would untarget everything).
        let result = synced.await;
        let failed = result.as_ref().err().map(ToString::to_string);
        let _ = synced_tx.send(result.map_err(|e| e.to_string()));
        if let Some(error) = failed {
            tracing::error!(%error, scope = %scope_name, "caches did not sync");
            return;
        }
        tracing::info!(scope = %scope_name, "caches synced; starting controllers");
        let clusters = Controller::new(
            scope.api::<Cluster>(&ctx.client),
            watcher::Config::default(),
        )
        .reconcile_on(cluster_rx)
        .run(cluster::reconcile, cluster::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
        let groups = Controller::new(
            scope.api::<ClusterGroup>(&ctx.client),
            watcher::Config::default(),
        )
        .reconcile_on(group_rx)
        .run(group::reconcile, group::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
        let bundles = Controller::new(scope.api::<Bundle>(&ctx.client), watcher::Config::default())
            .reconcile_all_on(bundle_all_rx)
            .reconcile_on(bundle_rx)
            .run(bundle::reconcile, bundle::error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(()));
        tokio::join!(clusters, groups, bundles);
    };

    let run = async move {
        tokio::select! {
            _ = futures::future::join_all(feeds) => tracing::warn!("a watch ended"),
            () = controllers => tracing::warn!("controllers ended"),
        }
    }
    .boxed();
    let synced = async move {
        match synced_rx.await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Error::CacheSync("hub caches")),
        }
    }
    .boxed();
    (synced, run)
}

fn meta_of<K: Clone>(
    event: watcher::Event<PartialObjectMeta<K>>,
) -> watcher::Event<kube::api::ObjectMeta> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.metadata),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.metadata),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.metadata),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}
