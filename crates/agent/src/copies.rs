//! The copies on the hub: one reflector per kind over the cluster namespace (Secrets and
//! ConfigMaps the hub copied there), each change mapped to the BundleDeployments that use it,
//! and the look-up of a copy whose content matches what a BundleDeployment was planned with.

use std::collections::BTreeSet;
use std::fmt::Debug;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef as KubeRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tender_runtime::reconcile::error_text;
use tender_types::{
    BundleDeployment, CopiedResource, ObjectRef, ObjectState, ObjectStatus, hash, labels,
};
use tokio::task::JoinSet;

use crate::plan::{self, Owner, Planned};

/// The hub's copies in this cluster namespace, as the reflectors last saw them.
pub(crate) struct HubCopies {
    hub: Client,
    namespace: String,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
}

/// The write halves of the [`HubCopies`] stores, consumed by [`CopyFeeds::spawn`].
pub(crate) struct CopyFeeds {
    /// Reverse sync: pinged on every placeholder event (placeholders wake no BundleDeployment).
    pub(crate) upstream: Option<UnboundedSender<()>>,
    hub: Client,
    namespace: String,
    secrets: Writer<Secret>,
    config_maps: Writer<ConfigMap>,
}

/// Empty stores of the copies in `namespace` on the hub and the feeds that fill them.
pub(crate) fn stores(hub: Client, namespace: &str) -> (HubCopies, CopyFeeds) {
    let (secrets, secret_writer) = reflector::store::<Secret>();
    let (config_maps, config_map_writer) = reflector::store::<ConfigMap>();
    let copies = HubCopies {
        hub: hub.clone(),
        namespace: namespace.to_string(),
        secrets,
        config_maps,
    };
    let feeds = CopyFeeds {
        upstream: None,
        hub,
        namespace: namespace.to_string(),
        secrets: secret_writer,
        config_maps: config_map_writer,
    };
    (copies, feeds)
}

impl CopyFeeds {
    /// Starts both reflectors in `tasks`; each change triggers the BundleDeployments (from
    /// `bds`) that reference the copy.
    pub(crate) fn spawn(
        self,
        bds: Store<BundleDeployment>,
        trigger: UnboundedSender<KubeRef<BundleDeployment>>,
        tasks: &mut JoinSet<()>,
    ) {
        tasks.spawn(feed(
            Api::<Secret>::namespaced(self.hub.clone(), &self.namespace),
            self.secrets,
            bds.clone(),
            trigger.clone(),
            self.upstream.clone(),
        ));
        tasks.spawn(feed(
            Api::<ConfigMap>::namespaced(self.hub, &self.namespace),
            self.config_maps,
            bds,
            trigger,
            self.upstream,
        ));
    }
}

/// Reflects the copies of one kind and triggers the BundleDeployments that reference them
/// (by ownerReference, and by `copyName` in case the owner reference is missing).
async fn feed<K>(
    api: Api<K>,
    writer: Writer<K>,
    bds: Store<BundleDeployment>,
    trigger: UnboundedSender<KubeRef<BundleDeployment>>,
    upstream: Option<UnboundedSender<()>>,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let kind = K::kind(&());
    let mut stream = reflector::reflector(
        writer,
        tender_runtime::watch::watcher(api, watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .boxed();
    while let Some(item) = stream.next().await {
        let obj = match item {
            Ok(o) => o,
            Err(error) => {
                tracing::warn!(%kind, %error, "watching copies on the hub failed; retrying with backoff");
                continue;
            }
        };
        let is_placeholder = obj
            .labels()
            .get(tender_types::labels::UPSTREAM)
            .is_some_and(|v| v == tender_types::labels::UPSTREAM_PLACEHOLDER);
        if is_placeholder {
            if let Some(ping) = &upstream {
                let _ = ping.unbounded_send(());
            }
            continue;
        }
        let name = obj.name_any();
        let ns = obj.namespace().unwrap_or_default();
        let mut owners: BTreeSet<String> = obj
            .owner_references()
            .iter()
            .filter(|o| o.kind == "BundleDeployment")
            .map(|o| o.name.clone())
            .collect();
        for bd in bds.state() {
            if bd
                .spec
                .options
                .downstream_resources
                .iter()
                .any(|r| r.kind == kind && r.copy_name == name)
            {
                owners.insert(bd.name_any());
            }
        }
        for owner in owners {
            let _ = trigger.unbounded_send(KubeRef::new(&owner).within(&ns));
        }
    }
}

/// The object in a carrier Secret (its JSON under [`labels::CARRIER_KEY`]).
fn carried_object(carrier: &Secret) -> Option<serde_json::Value> {
    let data = carrier.data.as_ref()?.get(labels::CARRIER_KEY)?;
    serde_json::from_slice(&data.0).ok()
}

/// Content hash of a carrier: the hash of the object it carries ("" when it carries none).
fn carrier_hash(carrier: &Secret) -> String {
    carried_object(carrier)
        .map(|o| hash::carried_hash(&o))
        .unwrap_or_default()
}

impl HubCopies {
    /// Whether the hub's copy for `entry` is ahead of the BundleDeployment: its content no
    /// longer hashes to `entry.hash` but to its own content-hash annotation, i.e. the hub wrote
    /// a new version and the BundleDeployment naming it follows (copies are written first).
    pub(crate) fn ahead(&self, entry: &CopiedResource) -> bool {
        let secret = || {
            self.secrets
                .get(&KubeRef::new(&entry.copy_name).within(&self.namespace))
        };
        let (content, annotated) = if entry.is_carried() || entry.kind == "Secret" {
            let Some(s) = secret() else { return false };
            let content = if entry.is_carried() {
                carrier_hash(&s)
            } else {
                hash::secret_hash(&s)
            };
            (content, s.annotations().get(labels::CONTENT_HASH).cloned())
        } else if entry.kind == "ConfigMap" {
            let key = KubeRef::new(&entry.copy_name).within(&self.namespace);
            let Some(c) = self.config_maps.get(&key) else {
                return false;
            };
            let content = hash::config_map_hash(&c);
            (content, c.annotations().get(labels::CONTENT_HASH).cloned())
        } else {
            return false;
        };
        content != entry.hash && annotated.as_deref() == Some(content.as_str())
    }

    /// The Secret and ConfigMap stores (reverse sync reads its placeholders from them).
    pub(crate) fn stores(&self) -> (Store<Secret>, Store<ConfigMap>) {
        (self.secrets.clone(), self.config_maps.clone())
    }

    /// The downstream object for copy `entry` in `copies_ns`, or why there is none yet
    /// (Missing: the hub's copy is absent or behind; Error: a kind that cannot be copied).
    pub(crate) async fn desired(
        &self,
        entry: &CopiedResource,
        copies_ns: &str,
        owner: &Owner,
        keep: bool,
    ) -> Planned {
        let key = ObjectRef::new("v1", &entry.kind, Some(copies_ns), &entry.name);
        let missing = |msg: String| ObjectStatus::new(&key, ObjectState::Missing, Some(msg));
        match entry.kind.as_str() {
            "Secret" => self
                .verified(&self.secrets, entry, hash::secret_hash)
                .await
                .map(|c| plan::secret_copy(&c, entry, copies_ns, owner, keep))
                .map_err(missing),
            "ConfigMap" => self
                .verified(&self.config_maps, entry, hash::config_map_hash)
                .await
                .map(|c| plan::config_map_copy(&c, entry, copies_ns, owner, keep))
                .map_err(missing),
            other => Err(ObjectStatus::new(
                &key,
                ObjectState::Error,
                Some(format!(
                    "kind {other} cannot be copied (only Secret and ConfigMap)"
                )),
            )),
        }
    }

    /// The object carried by carrier `entry` (any kind but a Secret/ConfigMap), verified: the
    /// hash of the carried content equals `entry.hash` from the BundleDeployment spec.
    pub(crate) async fn carried(
        &self,
        entry: &CopiedResource,
    ) -> Result<serde_json::Value, String> {
        let carrier = self.verified(&self.secrets, entry, carrier_hash).await?;
        carried_object(&carrier)
            .ok_or_else(|| format!("carrier {} holds no object", entry.copy_name))
    }

    /// The copy on the hub whose content hashes to `entry.hash` (which only the hub writes, in
    /// the BundleDeployment spec): from the watch cache, else fetched. Content is verified, not
    /// the annotation, so a copy edited on the hub by anyone else is never deployed.
    async fn verified<K>(
        &self,
        store: &Store<K>,
        entry: &CopiedResource,
        content_hash: fn(&K) -> String,
    ) -> Result<K, String>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let matches = |k: &K| content_hash(k) == entry.hash;
        let key = KubeRef::<K>::new(&entry.copy_name).within(&self.namespace);
        if let Some(cached) = store.get(&key).filter(|k| matches(k)) {
            return Ok((*cached).clone());
        }
        let api: Api<K> = Api::namespaced(self.hub.clone(), &self.namespace);
        match api.get_opt(&entry.copy_name).await {
            Ok(Some(k)) if matches(&k) => Ok(k),
            Ok(Some(_)) => Err(format!(
                "copy {} on the hub does not match this deployment yet",
                entry.copy_name
            )),
            Ok(None) => Err(format!(
                "copy {} not found in the cluster namespace on the hub",
                entry.copy_name
            )),
            Err(e) => Err(format!(
                "cannot read copy {} on the hub: {}",
                entry.copy_name,
                error_text(&e, entry.kind == "Secret")
            )),
        }
    }
}
