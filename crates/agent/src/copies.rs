//! The copies on the hub: one reflector per kind over the cluster namespace (Secrets and
//! ConfigMaps the hub copied there), each change mapped to the BundleDeployments that use it,
//! and the look-up of a copy the agent trusts: signed by the hub for exactly that entry
//! (decision 0089-signed-copies).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Mutex;

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
    /// What each copy version was found to be, so a reconcile that finds the same version
    /// does not hash and verify it again (reconciles outnumber rotations three to one).
    checked: Mutex<HashMap<CheckKey, Checked>>,
    /// The trusted keys, by the resourceVersion of the key chain they were built from.
    trust: Mutex<Option<(Option<String>, TrustedKeys)>>,
}

/// One entry of one BundleDeployment read from one kind's store: `(kind of the store,
/// BundleDeployment, apiVersion, kind, name, copyName, hash in the spec)`.
type CheckKey = (String, String, String, String, String, String, String);

/// The verdict on one version of a copy: the object's uid and resourceVersion (one stored
/// content), the keys trusted then, and the content hash and `signedAt`, or the failure.
struct Checked {
    version: (Option<String>, Option<String>),
    trusted: Vec<String>,
    verdict: Result<(String, u64), Failure>,
}

/// A bound on remembered verdicts (copies × BundleDeployments of one cluster); past it the
/// memo starts again rather than keep verdicts of copies long gone.
const CHECKED_MAX: usize = 4096;

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
        checked: Mutex::default(),
        trust: Mutex::default(),
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

/// Content hash of a carrier: the hash of the object it carries ("" when it carries none).
fn carrier_hash(carrier: &Secret) -> String {
    hash::carrier_hash(carrier).unwrap_or_default()
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
        let published = self.config_maps.get(&key);
        let version = published.as_ref().and_then(|c| c.resource_version());
        let mut trust = self.trust.lock().expect("trust");
        if let Some((seen, keys)) = trust.as_ref()
            && *seen == version
        {
            return keys.clone();
        }
        let chain: Option<KeyChain> = published
            .and_then(|c| c.data.as_ref()?.get(names::HUB_KEYS_KEY).cloned())
            .and_then(|json| serde_json::from_str(&json).ok());
        let keys = match chain {
            Some(chain) => self.registered.with_chain(&chain),
            None => self.registered.clone(),
        };
        *trust = Some((version, keys.clone()));
        keys
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
        hash::carried_object(&carrier.object)
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
        let trusted = self.trusted();
        let memo_key: CheckKey = (
            K::kind(&()).into_owned(),
            bd.to_string(),
            entry.api_version().to_string(),
            entry.kind.clone(),
            entry.name.clone(),
            entry.copy_name.clone(),
            entry.hash.clone(),
        );
        let trusted_ids: Vec<String> = trusted.ids().map(str::to_string).collect();
        // The same stored version under the same keys: the verdict reached before.
        let check = |k: &K| -> Result<Verified<K>, Failure> {
            let version = (k.uid(), k.resource_version());
            if let Some(seen) = self.checked.lock().expect("checked").get(&memo_key)
                && seen.version == version
                && seen.version.1.is_some()
                && seen.trusted == trusted_ids
            {
                return seen.verdict.clone().map(|(hash, signed_at)| Verified {
                    object: k.clone(),
                    hash,
                    signed_at,
                });
            }
            let verdict = self.judge(k, bd, entry, content_hash, &trusted);
            let mut checked = self.checked.lock().expect("checked");
            if checked.len() >= CHECKED_MAX {
                checked.clear();
            }
            checked.insert(
                memo_key.clone(),
                Checked {
                    version,
                    trusted: trusted_ids.clone(),
                    verdict: verdict.clone(),
                },
            );
            verdict.map(|(hash, signed_at)| Verified {
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

    /// Hashes copy `k` and checks it against `entry` of BundleDeployment `bd`: its hub
    /// signature under `trusted` (or, from an older hub, the hash in the spec); the content
    /// hash and `signedAt`.
    fn judge<K: Resource>(
        &self,
        k: &K,
        bd: &str,
        entry: &CopiedResource,
        content_hash: fn(&K) -> String,
        trusted: &TrustedKeys,
    ) -> Result<(String, u64), Failure> {
        let hash = content_hash(k);
        if !entry.hash.is_empty() {
            return if hash == entry.hash {
                Ok((hash, 0))
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
        let signed_at = trusted
            .verify(&claim, signature.map(String::as_str))
            .map_err(Failure::Refused)?;
        Ok((hash, signed_at))
    }
}

/// Why a copy is not deployed.
#[derive(Clone, Debug)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::watcher::Event;
    use ring::rand::SystemRandom;
    use ring::signature::Ed25519KeyPair;
    use tender_types::conditions::reason;
    use tender_types::signing::HubKey;

    const NS: &str = "cluster-ws-c1-12345678";
    const COPY: &str = "app-secret-creds";

    fn key() -> HubKey {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        HubKey::from_pkcs8(doc.as_ref()).unwrap()
    }

    fn entry() -> CopiedResource {
        CopiedResource {
            api_version: None,
            kind: "Secret".into(),
            name: "creds".into(),
            copy_name: COPY.into(),
            hash: String::new(),
        }
    }

    /// Copy version `rv` holding `password`, with `key`'s signature over `signed` (the
    /// password the hub copied; another one is an edit on the hub by someone else).
    fn copy(key: &HubKey, rv: &str, password: &str, signed: &str) -> Secret {
        let body = |p: &str| Secret {
            metadata: ObjectMeta {
                name: Some(COPY.into()),
                namespace: Some(NS.into()),
                uid: Some("uid-1".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            data: Some([("password".to_string(), ByteString(p.into()))].into()),
            ..Default::default()
        };
        let content_hash = hash::secret_hash(&body(signed));
        let signature = key.sign(&CopyClaim {
            cluster_namespace: NS,
            bundle_deployment: "app",
            api_version: "v1",
            kind: "Secret",
            name: "creds",
            copy_name: COPY,
            content_hash: &content_hash,
            signed_at: 7,
        });
        let mut s = body(password);
        s.metadata.annotations = Some([(labels::HUB_SIGNATURE.to_string(), signature)].into());
        s
    }

    /// The copy the hub's apiserver holds, for the read the agent makes before refusing one.
    type OnHub = std::sync::Arc<Mutex<Option<Secret>>>;

    fn copies(registered: &HubKey, on_hub: &OnHub) -> (HubCopies, CopyFeeds) {
        let on_hub = on_hub.clone();
        let apiserver = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            let body = serde_json::to_vec(&*on_hub.lock().unwrap()).unwrap();
            async move {
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(200)
                        .body(kube::client::Body::from(body))
                        .unwrap(),
                )
            }
        });
        let trusted = TrustedKeys::parse(&registered.public_key()).unwrap();
        stores(Client::new(apiserver, NS), NS, trusted)
    }

    async fn verdict(copies: &HubCopies) -> Result<u64, String> {
        copies
            .verified(&copies.secrets, "app", &entry(), hash::secret_hash)
            .await
            .map(|v| v.signed_at)
            .map_err(|f| match f {
                Failure::Refused(r) => r.reason.to_string(),
                Failure::Missing(m) => m,
            })
    }

    #[tokio::test]
    async fn each_stored_version_is_judged_once_and_a_new_one_again() {
        let hub_key = key();
        let on_hub = OnHub::default();
        let (copies, mut feeds) = copies(&hub_key, &on_hub);
        let mut put = |s: Secret| {
            *on_hub.lock().unwrap() = Some(s.clone());
            feeds.secrets.apply_watcher_event(&Event::Apply(s));
        };

        put(copy(&hub_key, "1", "one", "one"));
        assert_eq!(verdict(&copies).await, Ok(7));
        // Edited on the hub by someone else: a new version, judged again and refused.
        put(copy(&hub_key, "2", "edited", "one"));
        assert_eq!(
            verdict(&copies).await,
            Err(reason::COPY_SIGNATURE_INVALID.to_string())
        );
        // The hub's next write is trusted again.
        put(copy(&hub_key, "3", "two", "two"));
        assert_eq!(verdict(&copies).await, Ok(7));
        // The same version is not hashed again: content that could only differ under the
        // same resourceVersion in a test keeps the verdict of that version.
        put(copy(&hub_key, "3", "edited", "two"));
        assert_eq!(verdict(&copies).await, Ok(7));
    }

    #[tokio::test]
    async fn a_verdict_is_not_reused_for_other_keys_or_another_entry() {
        let hub_key = key();
        let on_hub = OnHub::default();
        let (copies, mut feeds) = copies(&key(), &on_hub);
        let mut put = |s: Secret| {
            *on_hub.lock().unwrap() = Some(s.clone());
            feeds.secrets.apply_watcher_event(&Event::Apply(s));
        };
        put(copy(&hub_key, "1", "one", "one"));
        assert_eq!(
            verdict(&copies).await,
            Err(reason::HUB_KEY_UNKNOWN.to_string())
        );
        // The same version for another BundleDeployment's claim: judged on its own.
        let other = copies
            .verified(&copies.secrets, "other", &entry(), hash::secret_hash)
            .await;
        assert!(matches!(other, Err(Failure::Refused(_))));
        // Trusted keys changing (a published chain) re-judges the same version.
        let trusting = HubCopies {
            registered: TrustedKeys::parse(&hub_key.public_key()).unwrap(),
            trust: Mutex::default(),
            ..copies
        };
        assert_eq!(verdict(&trusting).await, Ok(7));
    }
}
