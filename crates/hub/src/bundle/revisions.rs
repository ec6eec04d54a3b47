//! Where a rollout's state and the previous revisions it may roll back to are kept: one Secret
//! `tender-rollout-<bundle>` in the Bundle's namespace, owned by the Bundle (decision
//! 0094-rollout-revisions-on-the-hub). No agent can read it; it is never part of a
//! BundleDeployment. Bounded: past [`MAX_SNAPSHOT_BYTES`] no more revisions are kept and a
//! failure pauses instead of rolling back (`RollbackUnavailable`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta};
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tender_runtime::executor::{Apply, ObjectKey, Op, body_of};
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

/// Reads the rollout Secret of `bundle` (absent → nothing kept).
pub async fn read(
    client: &kube::Client,
    bundle: &Bundle,
    shard: Option<&str>,
) -> Result<Kept, kube::Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let Some(secret) = api
        .get_opt(&names::rollout_secret(&bundle.name_any(), shard))
        .await?
    else {
        return Ok(Kept::default());
    };
    let data = secret.data.unwrap_or_default();
    let raw = |key: &str| data.get(key).map(|b| b.0.as_slice()).unwrap_or_default();
    Ok(Kept {
        state: serde_json::from_slice(raw(STATE_KEY)).ok(),
        snapshot: serde_json::from_slice(raw(PREVIOUS_KEY)).unwrap_or_default(),
    })
}

/// The apply of the rollout Secret holding `state` and `snapshot`.
pub fn write_op(bundle: &Bundle, shard: Option<&str>, state: &State, snapshot: &Snapshot) -> Op {
    let ns = bundle.namespace().unwrap_or_default();
    let name = names::rollout_secret(&bundle.name_any(), shard);
    let owner = OwnerReference {
        api_version: tender_types::API_GROUP_VERSION.into(),
        kind: "Bundle".into(),
        name: bundle.name_any(),
        uid: bundle.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
                (
                    labels::BUNDLE_NAME.into(),
                    labels::safe_label_value(&bundle.name_any()),
                ),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (STATE_KEY.into(), json(state)),
            (PREVIOUS_KEY.into(), json(snapshot)),
        ])),
        ..Default::default()
    };
    Op::Apply(Apply {
        key: ObjectKey::of::<Secret>(Some(&ns), &name),
        body: body_of(&secret),
        replace_if_immutable: false,
        fingerprint: None,
    })
}

fn json<T: Serialize>(value: &T) -> ByteString {
    ByteString(serde_json::to_vec(value).unwrap_or_default())
}

/// Keeps the previous revision of `cluster` (its BundleDeployment in `cluster_ns` and the
/// Bundle's copies there, `copies` = (kind, name)), read from the apiserver. Marks the
/// snapshot overflowing instead when it would pass [`MAX_SNAPSHOT_BYTES`].
pub async fn keep(
    client: &kube::Client,
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
    let Some(bd) = bds
        .get_opt(&names::bundle_deployment_name(bundle_name))
        .await?
    else {
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
        let content_hash = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::CONTENT_HASH))
            .cloned()
            .unwrap_or_default();
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
