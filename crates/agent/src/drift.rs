//! Downstream caches of managed objects, and the watches behind them that turn changes into
//! reconciles of their owner.
//!
//! One reflector per kind the agent has deployed (Secrets and ConfigMaps always), across all
//! namespaces, selected by `managed-by=tender` + this cluster namespace's label, so the
//! caches hold only this agent's objects even when several agents share a cluster. Each event
//! retires the downstream executor's memo entry of its object and maps, through the object's
//! owner annotation, to its BundleDeployment. `sync` reads managed objects from these caches
//! and asks the apiserver only on a miss (an object that does not exist yet, or one somebody
//! else owns, is not in a label-selected cache).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef as KubeRef, Store};
use kube::runtime::watcher::{self, Event};
use tender_runtime::{Executor, ObjectKey};
use tender_types::BundleDeployment;
use tender_types::labels;
use tokio::task::JoinSet;

use crate::plan::{Owner, cluster_selector};

/// A kind by API group and kind name.
type KindId = (String, String);

/// The cache of one kind: usable once its first list is complete.
struct KindCache {
    store: Store<DynamicObject>,
    ready: Arc<AtomicBool>,
}

pub(crate) struct DriftWatches {
    client: Client,
    cluster_namespace: String,
    trigger: UnboundedSender<KubeRef<BundleDeployment>>,
    writer: Arc<Executor>,
    caches: Arc<Mutex<HashMap<KindId, KindCache>>>,
    /// The BundleDeployments that planned an object of each kind: re-checked when the kind
    /// goes, also those whose objects the cache never saw.
    users: Arc<Mutex<HashMap<KindId, BTreeSet<String>>>>,
    tasks: Mutex<JoinSet<()>>,
}

impl DriftWatches {
    /// Caches that wake `trigger` and retire `writer`'s memo entries.
    pub(crate) fn new(
        client: Client,
        cluster_namespace: &str,
        trigger: UnboundedSender<KubeRef<BundleDeployment>>,
        writer: Arc<Executor>,
    ) -> Self {
        Self {
            client,
            cluster_namespace: cluster_namespace.to_string(),
            trigger,
            writer,
            caches: Arc::new(Mutex::new(HashMap::new())),
            users: Arc::new(Mutex::new(HashMap::new())),
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// The cached managed object `key`; `None` when it is not cached (not ours, absent, or
    /// its kind's first list is not complete yet): then only the apiserver can tell.
    pub(crate) fn cached(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        let caches = self.caches.lock().expect("drift caches");
        let cache = caches.get(&(key.resource.group.clone(), key.resource.kind.clone()))?;
        if !cache.ready.load(Ordering::Acquire) {
            return None;
        }
        let mut r = KubeRef::new_with(&key.name, key.resource.clone());
        if let Some(ns) = &key.namespace {
            r = r.within(ns);
        }
        cache.store.get(&r)
    }

    /// Records that BundleDeployment `owner` deploys objects of `resource`, and caches them
    /// ([`ensure`](Self::ensure)).
    pub(crate) fn ensure_for(&self, resource: &ApiResource, owner: &str) {
        self.users
            .lock()
            .expect("drift users")
            .entry((resource.group.clone(), resource.kind.clone()))
            .or_default()
            .insert(owner.to_string());
        self.ensure(resource);
    }

    /// Starts caching and watching `resource` unless already done.
    pub(crate) fn ensure(&self, resource: &ApiResource) {
        let id = (resource.group.clone(), resource.kind.clone());
        let mut caches = self.caches.lock().expect("drift caches");
        if caches.contains_key(&id) {
            return;
        }
        tracing::debug!(kind = %resource.kind, group = %resource.group, "caching downstream objects for drift");
        let writer = reflector::store::Writer::new(resource.clone());
        let ready = Arc::new(AtomicBool::new(false));
        let store = writer.as_reader();
        caches.insert(
            id.clone(),
            KindCache {
                store: store.clone(),
                ready: ready.clone(),
            },
        );
        let all_caches = self.caches.clone();
        let users = self.users.clone();
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
        let config = watcher::Config::default().labels(&cluster_selector(&self.cluster_namespace));
        let trigger = self.trigger.clone();
        let memo_owner = self.writer.clone();
        let cluster_namespace = self.cluster_namespace.clone();
        let resource = resource.clone();
        self.tasks.lock().expect("drift tasks").spawn(async move {
            let mut events = reflector::reflector(writer, tender_runtime::watch::watcher(api, config))
                .default_backoff()
                .boxed();
            // What the cache showed when a re-list began: a re-list drops objects deleted
            // meanwhile (or with their CRD) without a Delete event.
            let mut before_relist: Vec<Arc<DynamicObject>> = Vec::new();
            let forget = |obj: &DynamicObject| {
                memo_owner.memo().forget(&ObjectKey::dynamic(
                    resource.clone(),
                    obj.metadata.namespace.as_deref(),
                    obj.metadata.name.as_deref().unwrap_or_default(),
                ));
            };
            while let Some(event) = events.next().await {
                let changed = matches!(event, Ok(Event::Apply(_)));
                let obj = match event {
                    Ok(Event::Apply(o) | Event::InitApply(o) | Event::Delete(o)) => o,
                    Ok(Event::InitDone) => {
                        ready.store(true, Ordering::Release);
                        for gone in vanished(&std::mem::take(&mut before_relist), &store.state()) {
                            forget(gone);
                            if let Some(owner) = owner_of(gone, &cluster_namespace) {
                                let _ = trigger.unbounded_send(owner);
                            }
                        }
                        continue;
                    }
                    Ok(Event::Init) => {
                        before_relist = store.state();
                        continue;
                    }
                    Err(error) if kind_gone(&error) => {
                        // Its CRD was removed: the objects went with it, but no event says so
                        // and the cache still shows them. Drop the cache (reads go to the
                        // apiserver, a later deploy watches again) and wake their owners.
                        tracing::warn!(kind = %resource.kind, group = %resource.group, "downstream kind no longer served; its deployments are checked again");
                        all_caches.lock().expect("drift caches").remove(&id);
                        for obj in store.state() {
                            // Our last write of it is no reason to skip the next one.
                            forget(&obj);
                            if let Some(owner) = owner_of(&obj, &cluster_namespace) {
                                let _ = trigger.unbounded_send(owner);
                            }
                        }
                        let planned = users.lock().expect("drift users").get(&id).cloned();
                        for name in planned.unwrap_or_default() {
                            let _ = trigger.unbounded_send(KubeRef::new(&name).within(&cluster_namespace));
                        }
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(kind = %resource.kind, %error, "downstream watch failed; retrying with backoff");
                        continue;
                    }
                };
                // The cache now shows this object as it is: decide on it again.
                let key = ObjectKey::dynamic(
                    resource.clone(),
                    obj.metadata.namespace.as_deref(),
                    obj.metadata.name.as_deref().unwrap_or_default(),
                );
                if changed {
                    // The echo of our own write wakes nobody: the reconcile that wrote it
                    // already reported what the cache now shows.
                    if memo_owner.memo().echo(&key, obj.metadata.resource_version.as_deref()) {
                        continue;
                    }
                } else {
                    memo_owner.memo().forget(&key);
                }
                if let Some(owner) = owner_of(&obj, &cluster_namespace) {
                    let _ = trigger.unbounded_send(owner);
                }
            }
        });
    }
}

/// The objects of `before` that `after` no longer holds (by namespace and name).
fn vanished<'a>(
    before: &'a [Arc<DynamicObject>],
    after: &[Arc<DynamicObject>],
) -> Vec<&'a DynamicObject> {
    let id = |o: &DynamicObject| (o.metadata.namespace.clone(), o.metadata.name.clone());
    let present: std::collections::HashSet<_> = after.iter().map(|o| id(o)).collect();
    before
        .iter()
        .filter(|o| !present.contains(&id(o)))
        .map(AsRef::as_ref)
        .collect()
}

/// The BundleDeployment of this cluster namespace that owns `obj` (inventories own nothing).
fn owner_of(obj: &DynamicObject, cluster_namespace: &str) -> Option<KubeRef<BundleDeployment>> {
    let is_inventory = obj
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(labels::INVENTORY));
    let owner = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::OWNER_ANNOTATION))
        .and_then(|a| Owner::parse(a))
        .filter(|o| o.cluster_namespace == cluster_namespace && !is_inventory)?;
    Some(KubeRef::new(&owner.name).within(cluster_namespace))
}

/// Whether a watch failed because the apiserver no longer serves the kind (404 on list or
/// watch: its CRD was removed), rather than for a reason a retry may cure.
fn kind_gone(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) => {
            tender_runtime::reconcile::is_not_found(e)
        }
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::core::Status {
        kube::core::Status {
            code,
            ..Default::default()
        }
    }

    #[test]
    fn only_a_404_on_list_or_watch_means_the_kind_is_gone() {
        let api = |code| kube::Error::Api(status(code).boxed());
        assert!(kind_gone(&watcher::Error::InitialListFailed(api(404))));
        assert!(kind_gone(&watcher::Error::WatchStartFailed(api(404))));
        assert!(kind_gone(&watcher::Error::WatchError(status(404).boxed())));
        for code in [403, 410, 500, 503] {
            assert!(
                !kind_gone(&watcher::Error::InitialListFailed(api(code))),
                "{code}"
            );
            assert!(
                !kind_gone(&watcher::Error::WatchError(status(code).boxed())),
                "{code}"
            );
        }
        assert!(!kind_gone(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn a_relist_names_the_objects_it_dropped() {
        let cm = |ns: &str, name: &str| {
            let mut o = DynamicObject::new(
                name,
                &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            );
            o.metadata.namespace = Some(ns.into());
            Arc::new(o)
        };
        let before = [cm("a", "x"), cm("a", "y"), cm("b", "x")];
        let after = [cm("a", "x"), cm("c", "z")];
        let gone: Vec<_> = vanished(&before, &after)
            .iter()
            .map(|o| {
                (
                    o.metadata.namespace.clone().unwrap(),
                    o.metadata.name.clone().unwrap(),
                )
            })
            .collect();
        assert_eq!(gone, [("a".into(), "y".into()), ("b".into(), "x".into())]);
        assert!(
            vanished(&before, &before).is_empty(),
            "nothing dropped, nothing to do"
        );
    }

    #[test]
    fn objects_map_to_their_own_clusters_deployment_only() {
        let obj = |owner: &str, inventory: bool| {
            let mut o = DynamicObject::new(
                "x",
                &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            );
            o.metadata.annotations =
                Some([(labels::OWNER_ANNOTATION.to_string(), owner.to_string())].into());
            if inventory {
                o.metadata.labels =
                    Some([(labels::INVENTORY.to_string(), "true".to_string())].into());
            }
            o
        };
        let mine = Owner::new("cluster-a", "app").annotation();
        let theirs = Owner::new("cluster-b", "app").annotation();
        assert_eq!(
            owner_of(&obj(&mine, false), "cluster-a"),
            Some(KubeRef::new("app").within("cluster-a"))
        );
        assert_eq!(owner_of(&obj(&theirs, false), "cluster-a"), None);
        assert_eq!(owner_of(&obj(&mine, true), "cluster-a"), None);
    }
}
