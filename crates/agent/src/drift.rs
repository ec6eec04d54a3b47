//! Downstream watches that turn changes to managed objects into reconciles of their owner.
//!
//! One watch per kind the agent has deployed (Secrets and ConfigMaps always), across all
//! namespaces, selected by `managed-by=tender` + this cluster namespace's label, so the
//! watches see only this agent's objects even when several agents share a cluster. Each event
//! maps, through the object's owner annotation, to its BundleDeployment.

use std::collections::HashSet;
use std::sync::Mutex;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef as KubeRef;
use kube::runtime::watcher::{self, Event};
use tender_types::BundleDeployment;
use tender_types::labels;
use tokio::task::JoinSet;

use crate::plan::{Owner, cluster_selector};

pub(crate) struct DriftWatches {
    client: Client,
    cluster_namespace: String,
    trigger: UnboundedSender<KubeRef<BundleDeployment>>,
    watched: Mutex<HashSet<(String, String)>>,
    tasks: Mutex<JoinSet<()>>,
}

impl DriftWatches {
    pub(crate) fn new(
        client: Client,
        cluster_namespace: &str,
        trigger: UnboundedSender<KubeRef<BundleDeployment>>,
    ) -> Self {
        Self {
            client,
            cluster_namespace: cluster_namespace.to_string(),
            trigger,
            watched: Mutex::new(HashSet::new()),
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// Starts watching `resource` unless already watched.
    pub(crate) fn ensure(&self, resource: &ApiResource) {
        let key = (resource.group.clone(), resource.kind.clone());
        if !self.watched.lock().expect("drift set").insert(key) {
            return;
        }
        tracing::debug!(kind = %resource.kind, group = %resource.group, "watching downstream objects for drift");
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
        let config = watcher::Config::default().labels(&cluster_selector(&self.cluster_namespace));
        let trigger = self.trigger.clone();
        let cluster_namespace = self.cluster_namespace.clone();
        let kind = resource.kind.clone();
        self.tasks.lock().expect("drift tasks").spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let obj = match event {
                    Ok(Event::Apply(o) | Event::InitApply(o) | Event::Delete(o)) => o,
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::warn!(%kind, %error, "downstream watch failed; retrying with backoff");
                        continue;
                    }
                };
                let annotations = &obj.metadata.annotations;
                let is_inventory = obj
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(labels::INVENTORY));
                let owner = annotations
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

fn watcher(
    api: Api<DynamicObject>,
    config: watcher::Config,
) -> impl futures::Stream<Item = watcher::Result<Event<DynamicObject>>> {
    watcher::watcher(api, config)
}
