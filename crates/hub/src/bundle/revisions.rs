//! Where a rollout's state and the previous revisions it may roll back to are kept: one Secret
//! per Bundle in the hub's own namespace (`names::rollout_secret`), never in the workspace,
//! where a user with Secret rights only could forge the waves released or what a rollback
//! deploys, nor in a cluster namespace, where an agent reads (decisions 0094 and
//! 0112-rollout-state-in-the-hubs-namespace). What is read back is checked all the same: every
//! kept spec and copy must hash to the key it is kept under, and a kept copy must be one the
//! hub signed; anything else is [`Unreadable`] and halts the rollout. Bounded: past
//! [`MAX_SNAPSHOT_BYTES`] no more revisions are kept and a failure pauses instead of rolling
//! back (`RollbackUnavailable`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta};
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tender_runtime::executor::{Apply, ObjectKey, Op, body_of};
use tender_types::signing::{CopyClaim, TrustedKeys};
use tender_types::{
    Bundle, BundleDeployment, BundleDeploymentSpec, SourceKind, hash, labels, names,
};

use super::plan::{SourceKey, SourceState};
use super::rollout::State;

/// Bytes of previous revisions kept per Bundle (the Secret stays well under etcd's 1.5 MiB).
pub const MAX_SNAPSHOT_BYTES: usize = 512 * 1024;
const STATE_KEY: &str = "state.json";
const PREVIOUS_KEY: &str = "previous.json";

/// One cluster's previous revision: its BundleDeployment spec and its copies, by key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterPrevious {
    /// Key in [`Snapshot::specs`].
    pub spec: String,
    /// Keys in [`Snapshot::copies`].
    pub copies: Vec<String>,
}

/// The previous revisions of the clusters released so far (deduplicated by content).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// BundleDeployment specs by spec hash.
    pub specs: BTreeMap<String, Value>,
    /// Copies (kind, name, content, source metadata) by `name@content-hash`.
    pub copies: BTreeMap<String, Value>,
    /// Per cluster.
    pub clusters: BTreeMap<String, ClusterPrevious>,
    /// A revision did not fit in [`MAX_SNAPSHOT_BYTES`]: rollback is not possible.
    #[serde(default)]
    pub overflow: bool,
}

/// What the rollout Secret held when read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kept {
    /// The rollout state.
    pub state: Option<State>,
    /// The previous revisions.
    pub snapshot: Snapshot,
}

/// The revision a Bundle wants: its spec (but the strategy and `paused`) and the content hash
/// of every source it copies. A change of either starts a new rollout.
pub fn revision(
    spec: &tender_types::BundleSpec,
    sources: &BTreeMap<SourceKey, SourceState>,
) -> String {
    let mut spec = spec.clone();
    spec.rollout_strategy = None;
    spec.paused = false;
    let hashes: Vec<(String, String, String)> = sources
        .iter()
        .map(|((kind, name), state)| {
            let h = match state {
                SourceState::Found { hash, .. } => hash.clone(),
                SourceState::Missing => "missing".into(),
                SourceState::Refused => "refused".into(),
            };
            (kind.kind.clone(), name.clone(), h)
        })
        .collect();
    hash::value_hash(&serde_json::json!({"spec": spec, "sources": hashes}))
}

/// Why a kept state is not used: it cannot be parsed, or it does not verify. Never names a
/// value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub String);

/// What `secret` keeps for the Bundle of uid `bundle_uid`, checked: the state and snapshot
/// parse, and every kept spec and copy hashes to the key it is kept under.
pub fn parse(secret: Option<&Secret>, bundle_uid: Option<&str>) -> Result<Kept, Unreadable> {
    let Some(secret) = secret else {
        return Ok(Kept::default());
    };
    let kept_for = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::BUNDLE_UID))
        .map(String::as_str);
    if kept_for != bundle_uid {
        return Ok(Kept::default());
    }
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let state = match data.get(STATE_KEY) {
        None => None,
        Some(b) => Some(
            serde_json::from_slice(&b.0)
                .map_err(|_| Unreadable(format!("{STATE_KEY} is not a rollout state")))?,
        ),
    };
    let snapshot: Snapshot = match data.get(PREVIOUS_KEY) {
        None => Snapshot::default(),
        Some(b) => serde_json::from_slice(&b.0)
            .map_err(|_| Unreadable(format!("{PREVIOUS_KEY} is not a set of revisions")))?,
    };
    verify(&snapshot)?;
    Ok(Kept { state, snapshot })
}

/// Every kept spec hashes to its key, every kept copy's content to the hash in its key, and
/// each cluster names only what is kept.
fn verify(snapshot: &Snapshot) -> Result<(), Unreadable> {
    for (key, value) in &snapshot.specs {
        let spec: BundleDeploymentSpec = serde_json::from_value(value.clone())
            .map_err(|_| Unreadable(format!("kept spec {key} is not a BundleDeployment spec")))?;
        if hash::spec_hash(&spec) != *key {
            return Err(Unreadable(format!(
                "kept spec {key} does not hash to its key"
            )));
        }
    }
    for (cluster, p) in &snapshot.clusters {
        let spec = previous_spec(snapshot, cluster)
            .ok_or_else(|| Unreadable(format!("cluster {cluster}: its kept spec is missing")))?;
        for key in &p.copies {
            let (name, content_hash) = key
                .rsplit_once('@')
                .ok_or_else(|| Unreadable(format!("kept copy {key}: no content hash")))?;
            let body = snapshot.copies.get(key).ok_or_else(|| {
                Unreadable(format!("cluster {cluster}: kept copy {key} is missing"))
            })?;
            let entry = spec
                .options
                .downstream_resources
                .iter()
                .find(|e| e.copy_name == name)
                .ok_or_else(|| {
                    Unreadable(format!(
                        "kept copy {name} is not in the kept spec of {cluster}"
                    ))
                })?;
            if content_hash_of(body, entry.is_carried()).as_deref() != Some(content_hash) {
                return Err(Unreadable(format!(
                    "kept copy {name} does not hash to its key"
                )));
            }
        }
    }
    Ok(())
}

/// The content hash of a copy's body, as the agent computes it ([`hash`]); `None` when it is
/// not a Secret or ConfigMap (or a carrier without its object).
pub fn content_hash_of(body: &Value, carried: bool) -> Option<String> {
    match body.get("kind").and_then(Value::as_str) {
        Some("ConfigMap") if !carried => {
            let c: ConfigMap = serde_json::from_value(body.clone()).ok()?;
            Some(hash::config_map_hash(&c))
        }
        Some("Secret") if carried => {
            let s: Secret = serde_json::from_value(body.clone()).ok()?;
            hash::carrier_hash(&s)
        }
        Some("Secret") => {
            let s: Secret = serde_json::from_value(body.clone()).ok()?;
            Some(hash::secret_hash(&s))
        }
        _ => None,
    }
}

/// The apply of the rollout Secret holding `state` and `snapshot`, in the hub's namespace
/// `own_ns`. No owner reference (it would have to be in the Bundle's namespace): the Bundle's
/// cleanup deletes it ([`delete_op`]).
pub fn write_op(
    bundle: &Bundle,
    shard: Option<&str>,
    own_ns: &str,
    state: &State,
    snapshot: &Snapshot,
) -> Op {
    let ns = bundle.namespace().unwrap_or_default();
    let name = names::rollout_secret(&ns, &bundle.name_any(), shard);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(own_ns.to_string()),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
                (labels::BUNDLE_NAMESPACE.into(), ns.clone()),
                (
                    labels::BUNDLE_NAME.into(),
                    labels::safe_label_value(&bundle.name_any()),
                ),
            ])),
            annotations: Some(BTreeMap::from([(
                labels::BUNDLE_UID.into(),
                bundle.meta().uid.clone().unwrap_or_default(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (STATE_KEY.into(), json(state)),
            (PREVIOUS_KEY.into(), json(snapshot)),
        ])),
        ..Default::default()
    };
    Op::Apply(Apply {
        key: ObjectKey::of::<Secret>(Some(own_ns), &name),
        body: body_of(&secret),
        replace_if_immutable: false,
        fingerprint: None,
    })
}

/// The deletion of `bundle`'s rollout Secret (absent is fine), when the Bundle goes.
pub fn delete_op(bundle: &Bundle, shard: Option<&str>, own_ns: &str) -> Op {
    let ns = bundle.namespace().unwrap_or_default();
    let name = names::rollout_secret(&ns, &bundle.name_any(), shard);
    Op::Delete {
        key: ObjectKey::of::<Secret>(Some(own_ns), &name),
        uid: None,
    }
}

fn json<T: Serialize>(value: &T) -> ByteString {
    ByteString(serde_json::to_vec(value).unwrap_or_default())
}

/// Keeps the previous revision of `cluster` (its BundleDeployment in `cluster_ns` and the
/// Bundle's copies there, `copies` = (kind, name)), read from the apiserver. Only what the hub
/// released is kept: a copy whose content does not hash to what it claims, or that the hub's
/// keys (`trusted`) did not sign for this entry, leaves the cluster without a previous
/// revision (a failure then rolls nothing back there). Marks the snapshot overflowing instead
/// when it would pass [`MAX_SNAPSHOT_BYTES`].
pub async fn keep(
    client: &kube::Client,
    trusted: &TrustedKeys,
    snapshot: &mut Snapshot,
    bundle_name: &str,
    cluster: &str,
    cluster_ns: &str,
    copies: &[(SourceKind, String)],
) -> Result<(), kube::Error> {
    if snapshot.overflow {
        return Ok(());
    }
    let bds: Api<BundleDeployment> = Api::namespaced(client.clone(), cluster_ns);
    let bd_name = names::bundle_deployment_name(bundle_name);
    let Some(bd) = bds.get_opt(&bd_name).await? else {
        return Ok(());
    };
    let spec_key = hash::spec_hash(&bd.spec);
    let mut previous = ClusterPrevious {
        spec: spec_key.clone(),
        copies: Vec::new(),
    };
    let mut added: Vec<(String, Value)> = Vec::new();
    for (kind, name) in copies {
        let (meta, mut body) = match kind {
            SourceKind::Secret => {
                let api: Api<Secret> = Api::namespaced(client.clone(), cluster_ns);
                let Some(s) = api.get_opt(name).await? else {
                    continue;
                };
                (
                    s.metadata.clone(),
                    serde_json::to_value(&s).unwrap_or_default(),
                )
            }
            SourceKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), cluster_ns);
                let Some(c) = api.get_opt(name).await? else {
                    continue;
                };
                (
                    c.metadata.clone(),
                    serde_json::to_value(&c).unwrap_or_default(),
                )
            }
        };
        let Some(entry) = bd
            .spec
            .options
            .downstream_resources
            .iter()
            .find(|e| e.copy_name == *name)
        else {
            continue;
        };
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
        let content_hash = annotation(labels::CONTENT_HASH).unwrap_or_default();
        let claim = CopyClaim {
            cluster_namespace: cluster_ns,
            bundle_deployment: &bd_name,
            api_version: entry.api_version(),
            kind: &entry.kind,
            name: &entry.name,
            copy_name: name,
            content_hash: &content_hash,
            signed_at: 0,
        };
        let released = content_hash_of(&body, entry.is_carried()).as_deref()
            == Some(content_hash.as_str())
            && trusted
                .verify(&claim, annotation(labels::HUB_SIGNATURE).as_deref())
                .is_ok();
        if !released {
            tracing::warn!(
                cluster,
                copy = %name,
                "a copy is not as the hub signed it: no previous revision kept for this cluster"
            );
            return Ok(());
        }
        // Only what the copy carries of its source: the hub's own labels are set on restore.
        let kept_labels: BTreeMap<String, String> = meta
            .labels
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| !labels::is_tender_key(k) && k != labels::MANAGED_BY)
            .collect();
        body["metadata"] = serde_json::json!({
            "name": name,
            "labels": kept_labels,
            "annotations": meta.annotations.unwrap_or_default(),
        });
        let key = format!("{name}@{content_hash}");
        previous.copies.push(key.clone());
        added.push((key, body));
    }
    let size = |s: &Snapshot| serde_json::to_vec(s).map(|v| v.len()).unwrap_or(usize::MAX);
    let mut next = snapshot.clone();
    next.specs
        .entry(spec_key)
        .or_insert_with(|| serde_json::to_value(&bd.spec).unwrap_or_default());
    for (key, body) in added {
        next.copies.entry(key).or_insert(body);
    }
    next.clusters.insert(cluster.to_string(), previous);
    if size(&next) > MAX_SNAPSHOT_BYTES {
        snapshot.overflow = true;
    } else {
        *snapshot = next;
    }
    Ok(())
}

/// The previous spec of `cluster`, if kept.
pub fn previous_spec(snapshot: &Snapshot, cluster: &str) -> Option<BundleDeploymentSpec> {
    let p = snapshot.clusters.get(cluster)?;
    serde_json::from_value(snapshot.specs.get(&p.spec)?.clone()).ok()
}

/// The copies of `cluster`'s previous revision: (kind, name, content hash, body to apply
/// in `cluster_ns`, owned by `owner` and labelled `owned`).
pub fn previous_copies(
    snapshot: &Snapshot,
    cluster: &str,
    cluster_ns: &str,
    owner: &OwnerReference,
    owned: &BTreeMap<String, String>,
) -> Vec<(SourceKind, String, String, Value)> {
    let Some(p) = snapshot.clusters.get(cluster) else {
        return Vec::new();
    };
    p.copies
        .iter()
        .filter_map(|key| {
            let (name, content_hash) = key.rsplit_once('@')?;
            let mut body = snapshot.copies.get(key)?.clone();
            let kind = match body.get("kind").and_then(Value::as_str) {
                Some("ConfigMap") => SourceKind::ConfigMap,
                _ => SourceKind::Secret,
            };
            let meta = body.get_mut("metadata")?.as_object_mut()?;
            meta.insert("namespace".into(), cluster_ns.into());
            meta.insert(
                "ownerReferences".into(),
                serde_json::to_value(vec![owner]).ok()?,
            );
            let labels = meta
                .entry("labels")
                .or_insert_with(|| serde_json::json!({}));
            for (k, v) in owned {
                labels[k] = v.clone().into();
            }
            Some((kind, name.to_string(), content_hash.to_string(), body))
        })
        .collect()
}

/// Clusters of `snapshot` no longer wanted (their clusters not in `keep`).
pub fn prune(snapshot: &mut Snapshot, keep: &BTreeSet<String>) {
    snapshot.clusters.retain(|c, _| keep.contains(c));
    let specs: BTreeSet<&String> = snapshot.clusters.values().map(|p| &p.spec).collect();
    let copies: BTreeSet<&String> = snapshot.clusters.values().flat_map(|p| &p.copies).collect();
    snapshot.specs.retain(|k, _| specs.contains(k));
    snapshot.copies.retain(|k, _| copies.contains(k));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tender_types::BundleSpec;

    fn kept() -> Snapshot {
        let spec = BundleDeploymentSpec {
            deployment_id: "old".into(),
            ..Default::default()
        };
        let key = hash::spec_hash(&spec);
        let copy = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "data": {"password": "b2xk"},
            "metadata": {"name": "app-secret-db", "labels": {"team": "payments"},
                         "annotations": {labels::CONTENT_HASH: "h1"}}
        });
        let cluster = |c: &str| {
            (
                c.to_string(),
                ClusterPrevious {
                    spec: key.clone(),
                    copies: vec!["app-secret-db@h1".into()],
                },
            )
        };
        Snapshot {
            specs: BTreeMap::from([(key.clone(), serde_json::to_value(&spec).unwrap())]),
            copies: BTreeMap::from([("app-secret-db@h1".into(), copy)]),
            clusters: BTreeMap::from([cluster("a"), cluster("b")]),
            overflow: false,
        }
    }

    #[test]
    fn a_kept_revision_is_restored_with_the_hubs_labels_and_the_live_owner() {
        let s = kept();
        assert_eq!(previous_spec(&s, "a").unwrap().deployment_id, "old");
        assert_eq!(previous_spec(&s, "z"), None);
        let owner = OwnerReference {
            uid: "live-uid".into(),
            ..Default::default()
        };
        let owned = BTreeMap::from([(labels::CLUSTER.to_string(), "a".to_string())]);
        let copies = previous_copies(&s, "a", "cluster-ns", &owner, &owned);
        let (kind, name, content_hash, body) = &copies[0];
        assert_eq!(
            (*kind, name.as_str(), content_hash.as_str()),
            (SourceKind::Secret, "app-secret-db", "h1")
        );
        assert_eq!(body["metadata"]["namespace"], "cluster-ns");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "live-uid");
        assert_eq!(body["metadata"]["labels"]["team"], "payments");
        assert_eq!(body["metadata"]["labels"][labels::CLUSTER], "a");
        assert_eq!(body["data"]["password"], "b2xk");
    }

    #[test]
    fn untargeted_clusters_and_what_only_they_used_are_pruned() {
        let mut s = kept();
        prune(&mut s, &BTreeSet::from(["a".to_string()]));
        assert_eq!(s.clusters.len(), 1);
        assert_eq!((s.specs.len(), s.copies.len()), (1, 1), "still used by a");
        prune(&mut s, &BTreeSet::new());
        assert!(s.specs.is_empty() && s.copies.is_empty());
    }

    /// A snapshot as the hub keeps it: a spec with one Secret copy, and the copy's body
    /// (with the annotations a hub copy carries) under its real content hash.
    fn genuine() -> Snapshot {
        let spec = BundleDeploymentSpec {
            deployment_id: "old".into(),
            options: tender_types::BundleDeploymentOptions {
                downstream_resources: vec![tender_types::CopiedResource {
                    api_version: None,
                    kind: "Secret".into(),
                    name: "db".into(),
                    copy_name: "app-secret-db".into(),
                    hash: String::new(),
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let mut copy = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "data": {"password": "b2xk"},
            "metadata": {"name": "app-secret-db", "labels": {"team": "payments"},
                         "annotations": {labels::HUB_SIGNATURE: "k.1.sig"}}
        });
        let content = content_hash_of(&copy, false).unwrap();
        copy["metadata"]["annotations"][labels::CONTENT_HASH] = content.clone().into();
        assert_eq!(
            content_hash_of(&copy, false).unwrap(),
            content,
            "the hub's own annotations are not content"
        );
        let key = hash::spec_hash(&spec);
        let copy_key = format!("app-secret-db@{content}");
        Snapshot {
            specs: BTreeMap::from([(key.clone(), serde_json::to_value(&spec).unwrap())]),
            copies: BTreeMap::from([(copy_key.clone(), copy)]),
            clusters: BTreeMap::from([(
                "a".to_string(),
                ClusterPrevious {
                    spec: key,
                    copies: vec![copy_key],
                },
            )]),
            overflow: false,
        }
    }

    fn stored(state: &[u8], snapshot: &[u8], uid: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    labels::BUNDLE_UID.to_string(),
                    uid.to_string(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                (STATE_KEY.to_string(), ByteString(state.to_vec())),
                (PREVIOUS_KEY.to_string(), ByteString(snapshot.to_vec())),
            ])),
            ..Default::default()
        }
    }

    fn stored_snapshot(snapshot: &Snapshot) -> Secret {
        let state = serde_json::to_vec(&State::default()).unwrap();
        stored(&state, &serde_json::to_vec(snapshot).unwrap(), "u1")
    }

    #[test]
    fn what_the_hub_kept_reads_back_as_kept() {
        let s = genuine();
        let kept = parse(Some(&stored_snapshot(&s)), Some("u1")).unwrap();
        assert_eq!(kept.snapshot, s);
        assert_eq!(kept.state, Some(State::default()));
        assert_eq!(parse(None, Some("u1")), Ok(Kept::default()));
    }

    #[test]
    fn a_state_kept_for_an_earlier_bundle_of_the_name_is_nothing_kept() {
        let secret = stored_snapshot(&genuine());
        assert_eq!(parse(Some(&secret), Some("u2")), Ok(Kept::default()));
    }

    #[test]
    fn an_unreadable_state_or_snapshot_is_refused_not_restarted() {
        let snapshot = serde_json::to_vec(&genuine()).unwrap();
        let bad_state = stored(b"{not json", &snapshot, "u1");
        let Err(Unreadable(why)) = parse(Some(&bad_state), Some("u1")) else {
            panic!("an unreadable state must not read as a fresh start");
        };
        assert!(why.contains(STATE_KEY), "{why}");
        let state = serde_json::to_vec(&State::default()).unwrap();
        assert!(parse(Some(&stored(&state, b"[]", "u1")), Some("u1")).is_err());
    }

    #[test]
    fn a_kept_copy_edited_under_its_key_is_refused() {
        let mut s = genuine();
        let key = s.copies.keys().next().unwrap().clone();
        s.copies.get_mut(&key).unwrap()["data"]["password"] = "ZXZpbA==".into();
        let Err(Unreadable(why)) = parse(Some(&stored_snapshot(&s)), Some("u1")) else {
            panic!("a forged copy must not verify");
        };
        assert!(
            why.contains("does not hash") && !why.contains("ZXZpbA"),
            "{why}"
        );
    }

    #[test]
    fn a_kept_spec_with_an_object_added_is_refused_even_with_its_deployment_id_recomputed() {
        let mut s = genuine();
        let key = s.specs.keys().next().unwrap().clone();
        let spec = s.specs.get_mut(&key).unwrap();
        spec["resources"] = serde_json::json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "forged"}}]);
        spec["deploymentID"] = "recomputed".into();
        assert!(parse(Some(&stored_snapshot(&s)), Some("u1")).is_err());
        // Re-keyed under its new hash, the cluster still names the old key: still refused.
        let moved = s.specs.remove(&key).unwrap();
        let spec: BundleDeploymentSpec = serde_json::from_value(moved.clone()).unwrap();
        s.specs.insert(hash::spec_hash(&spec), moved);
        assert!(parse(Some(&stored_snapshot(&s)), Some("u1")).is_err());
    }

    #[test]
    fn the_revision_moves_with_spec_and_sources_but_not_with_the_strategy() {
        let mut bundle = Bundle::new("app", BundleSpec::default());
        let key = (
            tender_types::copy::CopyableKind {
                api_version: "v1".into(),
                kind: "Secret".into(),
            },
            "db".to_string(),
        );
        let found = |h: &str| {
            BTreeMap::from([(
                key.clone(),
                SourceState::Found {
                    hash: h.into(),
                    bytes: 1,
                },
            )])
        };
        let r1 = revision(&bundle.spec, &found("h1"));
        assert_ne!(r1, revision(&bundle.spec, &found("h2")), "a rotation");
        bundle.spec.rollout_strategy = Some(Default::default());
        bundle.spec.paused = true;
        assert_eq!(r1, revision(&bundle.spec, &found("h1")));
        bundle.spec.default_namespace = Some("x".into());
        assert_ne!(r1, revision(&bundle.spec, &found("h1")));
    }
}
