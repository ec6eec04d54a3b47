//! Per-BundleDeployment inventory downstream: a ConfigMap in the agent namespace listing the
//! objects (apiVersion, kind, namespace, name — never values) a deployment may have created.
//!
//! It is written as the union of the previous and the new object list BEFORE anything is
//! created, and narrowed to the new list after pruning, so a crash at any point leaves every
//! created object findable. Pruning, cleanup and the start-up sweep read it to know which kinds
//! and objects to look at; each object's own owner annotation is still checked before any
//! delete.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::json;
use tender_runtime::executor::Apply;
use tender_runtime::{Executor, ObjectKey, Op};
use tender_types::ObjectRef;
use tender_types::hash::sha256_hex;
use tender_types::labels;

use crate::plan::{InventoryWrite, Owner, cluster_selector, inventory_write, ownership_labels};
use crate::{Error, Result};

const OBJECTS_KEY: &str = "objects";
/// The deployment's Helm release: `<revision>/<deploymentID>`, the revision (1: the install) the
/// deploymentID renders as (`--is-upgrade` and `.Release.Revision` after the first).
const CHART_RELEASE: &str = "tender.dev/chart-release";

/// Name of the inventory of `owner`: `tender-inventory-<20 hex of sha256(owner annotation)>`,
/// unique across cluster namespaces sharing one downstream cluster.
pub(crate) fn name(owner: &Owner) -> String {
    format!(
        "tender-inventory-{}",
        &sha256_hex(owner.annotation().as_bytes())[..20]
    )
}

/// The inventory ConfigMap body for server-side apply.
pub(crate) fn body(
    agent_namespace: &str,
    owner: &Owner,
    objects: &[ObjectRef],
    chart_release: Option<&str>,
) -> serde_json::Value {
    let mut labels: BTreeMap<&str, String> = ownership_labels(owner).into_iter().collect();
    labels.insert(labels::INVENTORY, "true".into());
    let mut annotations = json!({ labels::OWNER_ANNOTATION: owner.annotation() });
    if let Some(id) = chart_release {
        annotations[CHART_RELEASE] = json!(id);
    }
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name(owner),
            "namespace": agent_namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "data": { OBJECTS_KEY: serde_json::to_string(objects).expect("refs serialize") },
    })
}

/// Owner and object list of an inventory ConfigMap; `None` when it is not a valid inventory.
pub(crate) fn parse(cm: &ConfigMap) -> Option<(Owner, Vec<ObjectRef>)> {
    let owner = Owner::parse(
        cm.metadata
            .annotations
            .as_ref()?
            .get(labels::OWNER_ANNOTATION)?,
    )?;
    let objects = cm
        .data
        .as_ref()
        .and_then(|d| d.get(OBJECTS_KEY))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    Some((owner, objects))
}

/// Selector of every inventory of a cluster namespace.
pub(crate) fn selector(cluster_namespace: &str) -> String {
    format!(
        "{},{}=true",
        cluster_selector(cluster_namespace),
        labels::INVENTORY
    )
}

/// What an inventory records, and which incarnation of the ConfigMap holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Recorded {
    /// uid of the inventory ConfigMap (its delete is bound to it).
    pub(crate) uid: Option<String>,
    /// The objects a deployment may have created.
    pub(crate) objects: Vec<ObjectRef>,
    /// Its Helm release (`<revision>/<deploymentID>`), if it has a chart.
    pub(crate) chart_release: Option<String>,
}

fn release_of(cm: &ConfigMap) -> Option<String> {
    cm.metadata
        .annotations
        .as_ref()?
        .get(CHART_RELEASE)
        .cloned()
}

/// The inventories of one agent namespace: read through the client, or from the cache of
/// managed ConfigMaps when it holds the version this agent last read or wrote; written by the
/// executor.
pub(crate) struct Inventory {
    api: Api<ConfigMap>,
    agent_namespace: String,
    writer: Arc<Executor>,
    /// resourceVersion of each inventory (by name) as this agent last read or wrote it.
    seen: Mutex<HashMap<String, String>>,
}

/// The cached inventory, when it is the version this agent last read or wrote (`seen`). A
/// cache behind our own last write, or showing a version we never saw, is not trusted: a
/// stale inventory would leave an object it no longer lists unpruned.
fn confirmed(seen: Option<&str>, cached: Option<&DynamicObject>) -> Option<ConfigMap> {
    let cached = cached?;
    let rv = cached.metadata.resource_version.as_deref()?;
    if seen != Some(rv) {
        return None;
    }
    serde_json::to_value(cached)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

impl Inventory {
    pub(crate) fn new(client: Client, agent_namespace: &str, writer: Arc<Executor>) -> Self {
        Self {
            api: Api::namespaced(client, agent_namespace),
            agent_namespace: agent_namespace.to_string(),
            writer,
            seen: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn key(&self, owner: &Owner) -> ObjectKey {
        ObjectKey::of::<ConfigMap>(Some(&self.agent_namespace), &name(owner))
    }

    /// The version of inventory `name` this agent last read or wrote, if known.
    fn seen(&self, name: &str) -> Option<String> {
        self.seen
            .lock()
            .expect("inventory versions")
            .get(name)
            .cloned()
    }

    /// Remembers `rv` as the version of inventory `name` this agent knows (`None`: unknown).
    fn see(&self, name: String, rv: Option<String>) {
        let mut seen = self.seen.lock().expect("inventory versions");
        match rv {
            Some(rv) => seen.insert(name, rv),
            None => seen.remove(&name),
        };
    }

    /// The recorded objects of `owner` (`None`: no inventory yet). `cached` is the inventory
    /// as the cache of managed ConfigMaps holds it: used when it is the version this agent
    /// last read or wrote (every reconcile reads the inventory; most find it unchanged),
    /// else the apiserver is asked.
    pub(crate) async fn read(
        &self,
        owner: &Owner,
        cached: Option<Arc<DynamicObject>>,
    ) -> Result<Option<Recorded>> {
        let name = name(owner);
        let cm = match confirmed(self.seen(&name).as_deref(), cached.as_deref()) {
            Some(cm) => Some(cm),
            None => {
                let cm = self.api.get_opt(&name).await.map_err(|e| {
                    Error::kube(format!("read inventory {}", self.key(owner)), false, e)
                })?;
                self.see(
                    name,
                    cm.as_ref()
                        .and_then(|c| c.metadata.resource_version.clone()),
                );
                cm
            }
        };
        Ok(cm.as_ref().and_then(|cm| {
            let (o, objects) = parse(cm)?;
            (o == *owner).then(|| Recorded {
                uid: cm.metadata.uid.clone(),
                objects,
                chart_release: release_of(cm),
            })
        }))
    }

    /// Records `objects` (and who installed the chart) for `owner`, unless `current` already
    /// says the same.
    pub(crate) async fn write(
        &self,
        owner: &Owner,
        current: Option<&Recorded>,
        objects: &[ObjectRef],
        chart_release: Option<&str>,
    ) -> Result<()> {
        if let Some(op) = write_op(
            self.key(owner),
            &self.agent_namespace,
            owner,
            current,
            objects,
            chart_release,
        ) {
            self.apply(owner, op).await?;
        }
        Ok(())
    }

    /// Carries out an inventory write the deployment plan decided.
    pub(crate) async fn put(&self, owner: &Owner, write: &InventoryWrite) -> Result<()> {
        let op = put_op(self.key(owner), &self.agent_namespace, owner, write);
        self.apply(owner, op).await
    }

    async fn apply(&self, owner: &Owner, op: Op) -> Result<()> {
        // Until the write is answered nothing is known of the version it makes.
        self.see(name(owner), None);
        // Only a write that was made returns the object, and with it the new version.
        let outcome = self.writer.execute(op).await?;
        let rv = outcome.object.and_then(|o| o.metadata.resource_version);
        self.see(name(owner), rv);
        Ok(())
    }

    /// Deletes the inventory of `owner` (only incarnation `uid` when known).
    pub(crate) async fn delete(&self, owner: &Owner, uid: Option<String>) -> Result<()> {
        let key = self.key(owner);
        self.see(name(owner), None);
        self.writer.execute(Op::Delete { key, uid }).await?;
        Ok(())
    }

    /// Every inventory of `cluster_namespace`.
    pub(crate) async fn list(&self, cluster_namespace: &str) -> Result<Vec<(Owner, Recorded)>> {
        let list = self
            .api
            .list(&ListParams::default().labels(&selector(cluster_namespace)))
            .await
            .map_err(|e| {
                Error::kube(
                    format!("list inventories in {}", self.agent_namespace),
                    false,
                    e,
                )
            })?;
        Ok(list
            .items
            .iter()
            .filter_map(|cm| {
                let (owner, objects) = parse(cm)?;
                let uid = cm.metadata.uid.clone();
                let chart_release = release_of(cm);
                Some((
                    owner,
                    Recorded {
                        uid,
                        objects,
                        chart_release,
                    },
                ))
            })
            .filter(|(o, _)| o.cluster_namespace == cluster_namespace)
            .collect())
    }
}

/// The write recording `objects` for `owner`; `None` when `current` already says the same.
fn write_op(
    key: ObjectKey,
    agent_namespace: &str,
    owner: &Owner,
    current: Option<&Recorded>,
    objects: &[ObjectRef],
    chart_release: Option<&str>,
) -> Option<Op> {
    let recorded = current.map(|c| (c.objects.as_slice(), c.chart_release.as_deref()));
    inventory_write(recorded, objects, chart_release)
        .map(|write| put_op(key, agent_namespace, owner, &write))
}

/// The apply of inventory `write`.
fn put_op(key: ObjectKey, agent_namespace: &str, owner: &Owner, write: &InventoryWrite) -> Op {
    Op::Apply(Apply {
        key,
        body: body(
            agent_namespace,
            owner,
            &write.objects,
            write.release.as_deref(),
        ),
        replace_if_immutable: false,
        fingerprint: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::key;

    #[test]
    fn names_are_unique_per_cluster_namespace_and_valid() {
        let a = name(&Owner::new("cluster-ws-a-11111111", "app"));
        let b = name(&Owner::new("cluster-ws-b-22222222", "app"));
        assert_ne!(a, b);
        assert!(tender_types::names::is_dns_subdomain(&a), "{a}");
        assert_eq!(a, name(&Owner::new("cluster-ws-a-11111111", "app")));
    }

    #[test]
    fn body_round_trips_and_holds_no_values() {
        let owner = Owner::new("cluster-ws-a-11111111", "app");
        let objects = vec![
            key("v1", "Secret", Some("apps"), "db"),
            key("apps/v1", "Deployment", Some("apps"), "web"),
        ];
        let cm: ConfigMap =
            serde_json::from_value(body("tender-system", &owner, &objects, None)).unwrap();
        assert_eq!(parse(&cm), Some((owner.clone(), objects)));
        let l = cm.metadata.labels.unwrap();
        assert_eq!(l[labels::INVENTORY], "true");
        assert_eq!(l[labels::BUNDLE_DEPLOYMENT], owner.label());
        assert!(selector(&owner.cluster_namespace).ends_with("tender.dev/inventory=true"));
    }

    #[test]
    fn an_unchanged_inventory_is_not_written() {
        let owner = Owner::new("cluster-ws-a-11111111", "app");
        let objects = vec![key("v1", "Secret", Some("apps"), "db")];
        let at = ObjectKey::of::<ConfigMap>(Some("tender-system"), &name(&owner));
        let write = |current: Option<&Recorded>, installed: Option<&str>| {
            write_op(
                at.clone(),
                "tender-system",
                &owner,
                current,
                &objects,
                installed,
            )
        };
        let recorded = |objects: Vec<ObjectRef>, installed: Option<&str>| Recorded {
            uid: None,
            objects,
            chart_release: installed.map(str::to_string),
        };
        assert_eq!(write(Some(&recorded(objects.clone(), None)), None), None);
        let Some(Op::Apply(apply)) = write(None, None) else {
            panic!("a new inventory is applied");
        };
        assert_eq!(apply.body, body("tender-system", &owner, &objects, None));
        assert!(write(Some(&recorded(vec![], None)), None).is_some());
        // Who installed the chart is part of the record.
        assert!(write(Some(&recorded(objects.clone(), None)), Some("d1")).is_some());
        assert_eq!(
            write(Some(&recorded(objects.clone(), Some("d1"))), Some("d1")),
            None
        );
    }

    #[test]
    fn the_cache_is_trusted_only_at_the_version_last_read_or_written() {
        let owner = Owner::new("cluster-ws-a-11111111", "app");
        let objects = vec![key("v1", "Secret", Some("apps"), "db")];
        let at = |rv: &str| {
            let mut o: DynamicObject =
                serde_json::from_value(body("tender-system", &owner, &objects, None)).unwrap();
            o.metadata.resource_version = Some(rv.into());
            o
        };
        let cm = confirmed(Some("7"), Some(&at("7"))).expect("the version we know");
        assert_eq!(parse(&cm), Some((owner.clone(), objects.clone())));
        // Behind our own last write, or a version we never saw (somebody else wrote it):
        // the apiserver is asked.
        assert_eq!(confirmed(Some("8"), Some(&at("7"))), None);
        assert_eq!(confirmed(None, Some(&at("7"))), None);
        // Not cached (absent, or the cache not ready): asked too.
        assert_eq!(confirmed(Some("7"), None), None);
        let mut no_rv = at("7");
        no_rv.metadata.resource_version = None;
        assert_eq!(confirmed(None, Some(&no_rv)), None);
    }
}
