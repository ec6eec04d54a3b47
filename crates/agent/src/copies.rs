//! The copies on the hub: one reflector per kind over the cluster namespace (Secrets and
//! ConfigMaps the hub copied there), each change mapped to the BundleDeployments that use it,
//! and the look-up of a copy the agent trusts: signed by the hub for exactly that entry
//! (decision 0089-signed-copies).

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
use tender_types::signing::{CopyClaim, KeyChain, Refusal, TrustedKeys};
use tender_types::{
    BundleDeployment, CopiedResource, ObjectRef, ObjectState, ObjectStatus, hash, labels, names,
};
use tokio::task::JoinSet;

use crate::plan::{self, Owner, Planned};

/// The hub's copies in this cluster namespace, as the reflectors last saw them.
pub(crate) struct HubCopies {
    hub: Client,
    namespace: String,
    /// The hub keys this agent was registered with (decision 0089-signed-copies).
    registered: TrustedKeys,
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
pub(crate) fn stores(
    hub: Client,
    namespace: &str,
    registered: TrustedKeys,
) -> (HubCopies, CopyFeeds) {
    let (secrets, secret_writer) = reflector::store::<Secret>();
    let (config_maps, config_map_writer) = reflector::store::<ConfigMap>();
    let copies = HubCopies {
        hub: hub.clone(),
        namespace: namespace.to_string(),
        registered,
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
        if kind == "ConfigMap" && name == names::HUB_KEYS_CONFIG_MAP {
            // The hub's key chain: a copy refused as signed by an unknown key may be trusted now.
            for bd in bds.state() {
                let _ = trigger.unbounded_send(KubeRef::new(&bd.name_any()).within(&ns));
            }
            continue;
        }
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

/// A copy on the hub the agent trusts: its object, content hash and `signedAt` (0: verified
/// against a hash in the BundleDeployment spec, an older hub's).
pub(crate) struct Verified<K> {
    pub(crate) object: K,
    pub(crate) hash: String,
    pub(crate) signed_at: u64,
}

impl HubCopies {
    /// The keys trusted now: the registered ones and those the hub's key chain in this
    /// namespace endorses from them.
    fn trusted(&self) -> TrustedKeys {
        let key = KubeRef::new(names::HUB_KEYS_CONFIG_MAP).within(&self.namespace);
        let chain: Option<KeyChain> = self
            .config_maps
            .get(&key)
            .and_then(|c| c.data.as_ref()?.get(names::HUB_KEYS_KEY).cloned())
            .and_then(|json| serde_json::from_str(&json).ok());
        match chain {
            Some(chain) => self.registered.with_chain(&chain),
            None => self.registered.clone(),
        }
    }

    /// The Secret and ConfigMap stores (reverse sync reads its placeholders from them).
    pub(crate) fn stores(&self) -> (Store<Secret>, Store<ConfigMap>) {
        (self.secrets.clone(), self.config_maps.clone())
    }

    /// The content hash of each copy of `bd` the agent trusts now, by copy name ("" for one it
    /// does not): with `spec.deploymentID`, what this agent deploys (decision 0089-signed-copies).
    pub(crate) async fn hashes(
        &self,
        bd: &str,
        entries: &[CopiedResource],
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for entry in entries {
            let hash = if entry.kind == "ConfigMap" && !entry.is_carried() {
                self.verified(&self.config_maps, bd, entry, hash::config_map_hash)
                    .await
                    .map(|v| v.hash)
            } else if entry.is_carried() {
                self.verified(&self.secrets, bd, entry, carrier_hash)
                    .await
                    .map(|v| v.hash)
            } else {
                self.verified(&self.secrets, bd, entry, hash::secret_hash)
                    .await
                    .map(|v| v.hash)
            };
            out.push((entry.copy_name.clone(), hash.unwrap_or_default()));
        }
        out
    }

    /// The downstream object for copy `entry` in `copies_ns`, or why there is none (Missing: the
    /// hub's copy is absent; Error: refused — its signature — or a kind that cannot be copied).
    pub(crate) async fn desired(
        &self,
        entry: &CopiedResource,
        copies_ns: &str,
        owner: &Owner,
        keep: bool,
    ) -> Planned {
        let key = ObjectRef::new("v1", &entry.kind, Some(copies_ns), &entry.name);
        let failed = |f: Failure| f.status(&key);
        match entry.kind.as_str() {
            "Secret" => self
                .verified(&self.secrets, &owner.name, entry, hash::secret_hash)
                .await
                .map(|c| plan::secret_copy(&c.object, entry, copies_ns, owner, keep, c.signed_at))
                .map_err(failed),
            "ConfigMap" => self
                .verified(&self.config_maps, &owner.name, entry, hash::config_map_hash)
                .await
                .map(|c| {
                    plan::config_map_copy(&c.object, entry, copies_ns, owner, keep, c.signed_at)
                })
                .map_err(failed),
            other => Err(ObjectStatus::new(
                &key,
                ObjectState::Error,
                Some(format!(
                    "kind {other} cannot be copied (only Secret and ConfigMap)"
                )),
            )),
        }
    }

    /// The object carried by carrier `entry` (any kind but a Secret/ConfigMap), verified, and
    /// its `signedAt`.
    pub(crate) async fn carried(
        &self,
        bd: &str,
        entry: &CopiedResource,
    ) -> Result<(serde_json::Value, u64), Failure> {
        let carrier = self
            .verified(&self.secrets, bd, entry, carrier_hash)
            .await?;
        carried_object(&carrier.object)
            .map(|o| (o, carrier.signed_at))
            .ok_or_else(|| Failure::Missing(format!("carrier {} holds no object", entry.copy_name)))
    }

    /// The copy on the hub for `entry` of BundleDeployment `bd`, if the agent trusts it: its
    /// content hashes to what the hub signed for exactly this entry, with a key the agent
    /// trusts (or, from an older hub, to the hash in the BundleDeployment spec). From the watch
    /// cache, else fetched. The content is hashed, never the annotation read, so a copy edited
    /// on the hub by anyone else is never deployed.
    async fn verified<K>(
        &self,
        store: &Store<K>,
        bd: &str,
        entry: &CopiedResource,
        content_hash: fn(&K) -> String,
    ) -> Result<Verified<K>, Failure>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let check = |k: &K| -> Result<Verified<K>, Failure> {
            let hash = content_hash(k);
            if !entry.hash.is_empty() {
                return if hash == entry.hash {
                    Ok(Verified {
                        object: k.clone(),
                        hash,
                        signed_at: 0,
                    })
                } else {
                    Err(Failure::Missing(format!(
                        "copy {} on the hub does not match this deployment yet",
                        entry.copy_name
                    )))
                };
            }
            let claim = CopyClaim {
                cluster_namespace: &self.namespace,
                bundle_deployment: bd,
                api_version: entry.api_version(),
                kind: &entry.kind,
                name: &entry.name,
                copy_name: &entry.copy_name,
                content_hash: &hash,
                signed_at: 0,
            };
            let signature = k.annotations().get(labels::HUB_SIGNATURE);
            let signed_at = self
                .trusted()
                .verify(&claim, signature.map(String::as_str))
                .map_err(Failure::Refused)?;
            Ok(Verified {
                object: k.clone(),
                hash,
                signed_at,
            })
        };
        let key = KubeRef::<K>::new(&entry.copy_name).within(&self.namespace);
        let cached = store.get(&key).map(|k| check(&k));
        if let Some(Ok(v)) = cached {
            return Ok(v);
        }
        // The cache may be behind: read the copy itself before refusing it.
        let api: Api<K> = Api::namespaced(self.hub.clone(), &self.namespace);
        match api.get_opt(&entry.copy_name).await {
            Ok(Some(k)) => check(&k),
            Ok(None) => Err(Failure::Missing(format!(
                "copy {} not found in the cluster namespace on the hub",
                entry.copy_name
            ))),
            Err(e) => Err(Failure::Missing(format!(
                "cannot read copy {} on the hub: {}",
                entry.copy_name,
                error_text(&e, entry.kind == "Secret")
            ))),
        }
    }
}

/// Why a copy is not deployed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Not there (yet), or not readable.
    Missing(String),
    /// There, and not trusted: its signature ([`tender_types::signing::Refusal`]).
    Refused(Refusal),
}

impl Failure {
    /// The copy's status: Missing, or Error with the refusal's reason first (`<Reason>: ...`).
    pub(crate) fn status(self, key: &ObjectRef) -> ObjectStatus {
        match self {
            Self::Missing(msg) => ObjectStatus::new(key, ObjectState::Missing, Some(msg)),
            Self::Refused(r) => ObjectStatus::new(key, ObjectState::Error, Some(r.to_string())),
        }
    }
}
