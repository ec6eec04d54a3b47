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

use std::collections::HashMap;
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
    caches: Mutex<HashMap<(String, String), KindCache>>,
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
            caches: Mutex::new(HashMap::new()),
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
        caches.insert(
            id,
            KindCache {
                store: writer.as_reader(),
                ready: ready.clone(),
            },
        );
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
            while let Some(event) = events.next().await {
                let obj = match event {
                    Ok(Event::Apply(o) | Event::InitApply(o) | Event::Delete(o)) => o,
                    Ok(Event::InitDone) => {
                        ready.store(true, Ordering::Release);
                        continue;
                    }
                    Ok(Event::Init) => continue,
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
                memo_owner.memo().forget(&key);
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
                    .and_then(|a| Owner::parse(a));
                if let Some(owner) = owner.filter(|o| o.cluster_namespace == cluster_namespace)
                    && !is_inventory
                {
                    let _ = trigger.unbounded_send(KubeRef::new(&owner.name).within(&cluster_namespace));
                }
            }
        });
    }
}
