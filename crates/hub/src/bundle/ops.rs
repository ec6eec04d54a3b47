//! From a Bundle's plan and what the caches hold to the operations the executor carries out.
//! Pure: tests compare operation lists, including "nothing changed → no operations".

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use serde_json::Value;
use tender_runtime::executor::{Apply, Fingerprint, ObjectKey, Op, body_of};
use tender_types::{
    API_GROUP_VERSION, BundleDeployment, BundleDeploymentSpec, SourceKind, copy, hash, labels,
    names,
};

use super::plan::{DesiredCopy, DesiredDeployment, edited_by_others};

/// A source read in full for this reconcile (only when a copy must be written).
#[derive(Clone)]
pub(crate) enum SourceObject {
    /// A Secret source.
    Secret(Secret),
    /// A ConfigMap source.
    ConfigMap(ConfigMap),
    /// A source of any other allowed kind, as JSON; it travels in a carrier Secret.
    Carried(Value),
}

/// One copy that exists in a cluster namespace (from the metadata cache).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LiveCopy {
    pub kind: SourceKind,
    pub name: String,
    pub uid: Option<String>,
}

/// Labels of everything the hub writes for Bundle `ns/name` in `cluster`'s namespace.
pub(crate) fn owned_labels(
    ns: &str,
    name: &str,
    cluster: &str,
    cluster_ns: &str,
    shard: Option<&str>,
) -> BTreeMap<String, String> {
    let mut owned = BTreeMap::from([
        (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
        (labels::BUNDLE_NAMESPACE.into(), ns.into()),
        (labels::BUNDLE_NAME.into(), labels::safe_label_value(name)),
        (labels::CLUSTER.into(), labels::safe_label_value(cluster)),
        (labels::CLUSTER_NAMESPACE.into(), cluster_ns.into()),
        (labels::WORKSPACE.into(), ns.into()),
    ]);
    if let Some(id) = shard {
        owned.insert(labels::SHARD.into(), id.into());
    }
    owned
}

/// What to do with one cluster's BundleDeployment.
#[derive(Debug, PartialEq)]
pub(crate) enum DeploymentStep {
    /// Leave everything as it is: a source is missing (the agent must never deploy manifests
    /// before their copies exist) or the old BundleDeployment is still being deleted.
    Hold,
    /// The live BundleDeployment is current; its uid owns the copies.
    Current { uid: String },
    /// Write it (an [`Op::Apply`]); the outcome's uid owns the copies.
    Write(Box<Op>),
}

/// The step for one cluster's BundleDeployment of Bundle `bundle_ns/bundle_name`, whose whole
/// spec is `spec` ([`super::plan::Plan::spec`] of `desired`), given the cached one.
pub(crate) fn deployment_step(
    bundle_ns: &str,
    bundle_name: &str,
    desired: &DesiredDeployment,
    spec: Option<&BundleDeploymentSpec>,
    live: Option<&BundleDeployment>,
    shard: Option<&str>,
) -> DeploymentStep {
    let Some(spec) = spec else {
        return DeploymentStep::Hold;
    };
    if live.is_some_and(|bd| bd.metadata.deletion_timestamp.is_some()) {
        // Recreated once the agent has finished cleaning up (its deletion event brings us back).
        return DeploymentStep::Hold;
    }
    let bd_labels = owned_labels(
        bundle_ns,
        bundle_name,
        &desired.cluster,
        &desired.namespace,
        shard,
    );
    // The cache keeps a hash of each BundleDeployment's spec, not the spec (decision 60).
    let desired_hash = hash::spec_hash(spec);
    let current = live.filter(|bd| {
        crate::slim::spec_hash(bd) == Some(desired_hash.as_str())
            && bd
                .finalizers()
                .iter()
                .any(|f| f == labels::AGENT_CLEANUP_FINALIZER)
            && bd_labels.iter().all(|(k, v)| bd.labels().get(k) == Some(v))
    });
    if let Some(bd) = current {
        return DeploymentStep::Current {
            uid: bd.uid().unwrap_or_default(),
        };
    }
    let name = names::bundle_deployment_name(bundle_name);
    DeploymentStep::Write(Box::new(Op::Apply(Apply {
        key: ObjectKey::of::<BundleDeployment>(Some(&desired.namespace), &name),
        body: deployment_body(&name, &desired.namespace, spec, bd_labels),
        replace_if_immutable: false,
        fingerprint: Some(Fingerprint {
            live_version: live.and_then(|bd| bd.resource_version()),
            desired: desired_hash,
        }),
    })))
}

fn deployment_body(
    name: &str,
    namespace: &str,
    spec: &BundleDeploymentSpec,
    bd_labels: BTreeMap<String, String>,
) -> Value {
    let mut bd = BundleDeployment::new(name, spec.clone());
    bd.metadata.namespace = Some(namespace.to_string());
    bd.metadata.labels = Some(bd_labels);
    bd.metadata.finalizers = Some(vec![labels::AGENT_CLEANUP_FINALIZER.to_string()]);
    body_of(&bd)
}

/// The ownerReference that makes the garbage collector remove a copy with its BundleDeployment.
pub(crate) fn copy_owner(bundle_name: &str, uid: String) -> OwnerReference {
    OwnerReference {
        api_version: API_GROUP_VERSION.into(),
        kind: "BundleDeployment".into(),
        name: names::bundle_deployment_name(bundle_name),
        uid,
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// What to do with one copy.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CopyStep {
    /// The cached copy has this content hash and owner.
    Current,
    /// Write it; `replace` holds the uid of a copy someone else edited, which is recreated
    /// (its hash annotation can no longer be trusted, and fields another manager owns would
    /// survive an apply).
    Write { replace: Option<String> },
}

/// The step for `copy`, given its cached metadata and the owning BundleDeployment's uid.
pub(crate) fn copy_step(
    copy: &DesiredCopy,
    live: Option<&ObjectMeta>,
    owner_uid: &str,
) -> CopyStep {
    let Some(meta) = live else {
        return CopyStep::Write { replace: None };
    };
    if edited_by_others(meta) {
        return CopyStep::Write {
            replace: Some(meta.uid.clone().unwrap_or_default()),
        };
    }
    let hash_current = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::CONTENT_HASH))
        == Some(&copy.hash);
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == owner_uid);
    if hash_current && owned {
        CopyStep::Current
    } else {
        CopyStep::Write { replace: None }
    }
}

/// Where one cluster's copies of a Bundle go, and what marks them as the hub's.
pub(crate) struct CopyTarget<'a> {
    /// The Bundle's (and the sources') namespace.
    pub bundle_ns: &'a str,
    /// The cluster namespace on the hub.
    pub cluster_ns: &'a str,
    /// The BundleDeployment that owns the copies.
    pub owner: &'a OwnerReference,
    /// [`owned_labels`] of that BundleDeployment.
    pub labels: &'a BTreeMap<String, String>,
}

/// The operation writing `copy` of `source` to `to`; `live_version` is the cached copy's
/// resourceVersion, `replace` the uid of an edited copy to recreate.
pub(crate) fn copy_op(
    source: &SourceObject,
    copy: &DesiredCopy,
    to: &CopyTarget<'_>,
    live_version: Option<String>,
    replace: Option<String>,
) -> Op {
    let (bundle_ns, cluster_ns, owner, bd_labels) =
        (to.bundle_ns, to.cluster_ns, to.owner, to.labels);
    let meta = |src: &ObjectMeta, content_hash: String| {
        let mut labels = copy::copied_metadata(src.labels.as_ref());
        labels.extend(bd_labels.clone());
        let mut annotations = copy::copied_metadata(src.annotations.as_ref());
        annotations.insert(labels::CONTENT_HASH.into(), content_hash);
        annotations.insert(
            labels::COPY_OF.into(),
            format!("{bundle_ns}/{}", copy.source),
        );
        ObjectMeta {
            name: Some(copy.copy_name.clone()),
            namespace: Some(cluster_ns.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        }
    };
    let (key, body) = match source {
        SourceObject::Secret(s) => {
            let obj = Secret {
                metadata: meta(&s.metadata, hash::secret_hash(s)),
                type_: s.type_.clone(),
                data: Some(copy::secret_data(s)).filter(|d| !d.is_empty()),
                immutable: s.immutable,
                string_data: None,
            };
            (
                ObjectKey::of::<Secret>(Some(cluster_ns), &copy.copy_name),
                body_of(&obj),
            )
        }
        SourceObject::Carried(object) => {
            let carried = copy::carried_body(object);
            let content_hash = hash::value_hash(&carried);
            let mut labels = bd_labels.clone();
            labels.insert(labels::CARRIER.into(), "true".into());
            let annotations = BTreeMap::from([
                (labels::CONTENT_HASH.to_string(), content_hash),
                (
                    labels::COPY_OF.to_string(),
                    format!("{bundle_ns}/{}", copy.source),
                ),
                (
                    labels::CARRIED_KIND.to_string(),
                    copy.source_kind.to_string(),
                ),
            ]);
            // The object's own labels stay inside the carried JSON: on the carrier they could
            // make a selector on the hub match what must never live there.
            let obj = Secret {
                metadata: ObjectMeta {
                    name: Some(copy.copy_name.clone()),
                    namespace: Some(cluster_ns.to_string()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    owner_references: Some(vec![owner.clone()]),
                    ..Default::default()
                },
                type_: Some(labels::CARRIER_TYPE.to_string()),
                data: Some(BTreeMap::from([(
                    labels::CARRIER_KEY.to_string(),
                    k8s_openapi::ByteString(hash::canonical_json(&carried).into_bytes()),
                )])),
                immutable: None,
                string_data: None,
            };
            (
                ObjectKey::of::<Secret>(Some(cluster_ns), &copy.copy_name),
                body_of(&obj),
            )
        }
        SourceObject::ConfigMap(c) => {
            let obj = ConfigMap {
                metadata: meta(&c.metadata, hash::config_map_hash(c)),
                data: c.data.clone(),
                binary_data: c.binary_data.clone(),
                immutable: c.immutable,
            };
            (
                ObjectKey::of::<ConfigMap>(Some(cluster_ns), &copy.copy_name),
                body_of(&obj),
            )
        }
    };
    let apply = Apply {
        key,
        body,
        replace_if_immutable: true,
        fingerprint: None,
    };
    match replace {
        Some(uid) => Op::Recreate {
            uid: Some(uid),
            apply,
        },
        None => Op::Apply(Apply {
            fingerprint: Some(copy_fingerprint(copy, owner, live_version)),
            ..apply
        }),
    }
}

/// What the executor's memo knows a copy write by: content hash and owner, over the cached
/// copy's resourceVersion.
pub(crate) fn copy_fingerprint(
    copy: &DesiredCopy,
    owner: &OwnerReference,
    live_version: Option<String>,
) -> Fingerprint {
    Fingerprint {
        live_version,
        desired: format!("{}/{}", copy.hash, owner.uid),
    }
}

/// Deletes of this Bundle's copies in `cluster_ns` that no entry wants any more.
pub(crate) fn stale_copy_ops(
    cluster_ns: &str,
    live: &[LiveCopy],
    desired: &[DesiredCopy],
) -> Vec<Op> {
    let wanted: BTreeSet<(SourceKind, &str)> = desired
        .iter()
        .map(|c| (c.kind, c.copy_name.as_str()))
        .collect();
    live.iter()
        .filter(|c| !wanted.contains(&(c.kind, c.name.as_str())))
        .map(|c| Op::Delete {
            key: copy_key(c.kind, cluster_ns, &c.name),
            uid: c.uid.clone(),
        })
        .collect()
}

/// The key of a copy of `kind`.
pub(crate) fn copy_key(kind: SourceKind, namespace: &str, name: &str) -> ObjectKey {
    match kind {
        SourceKind::Secret => ObjectKey::of::<Secret>(Some(namespace), name),
        SourceKind::ConfigMap => ObjectKey::of::<ConfigMap>(Some(namespace), name),
    }
}

/// Delete of one BundleDeployment (that incarnation only); the agent's finalizer then cleans
/// up downstream and the garbage collector removes its copies.
pub(crate) fn delete_deployment_op(bd: &BundleDeployment) -> Op {
    Op::Delete {
        key: ObjectKey::of::<BundleDeployment>(bd.namespace().as_deref(), &bd.name_any()),
        uid: bd.uid(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::events::{fanout_events, transition_events};
    use crate::bundle::plan::{DesiredSpec, Plan};
    use k8s_openapi::api::core::v1::ObjectReference;
    use tender_types::BundleStatus;

    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use tender_types::BundleDeploymentOptions;

    fn desired() -> DesiredDeployment {
        DesiredDeployment {
            cluster: "east".into(),
            namespace: "cluster-ws-east-1a2b3c".into(),
            spec: Some(DesiredSpec {
                deployment_id: "id-1".into(),
                paused: false,
                options: BundleDeploymentOptions::default(),
            }),
            copies: vec![copy_of("db")],
        }
    }

    /// The whole spec of `d`, for a Bundle without manifests.
    fn full(d: &DesiredDeployment) -> Option<BundleDeploymentSpec> {
        Plan::default().spec(d)
    }

    fn step(d: &DesiredDeployment, live: Option<&BundleDeployment>) -> DeploymentStep {
        deployment_step("ws", "app", d, full(d).as_ref(), live, None)
    }

    fn copy_of(source: &str) -> DesiredCopy {
        DesiredCopy {
            kind: SourceKind::Secret,
            source_kind: tender_types::copy::CopyableKind::core(SourceKind::Secret),
            source: source.into(),
            copy_name: names::copy_name("app", "Secret", source),
            hash: "h1".into(),
        }
    }

    /// The BundleDeployment the hub would have written, as the cache holds it.
    fn written(d: &DesiredDeployment) -> BundleDeployment {
        let Op::Apply(apply) = (match step(d, None) {
            DeploymentStep::Write(op) => *op,
            other => panic!("expected a write, got {other:?}"),
        }) else {
            panic!("expected an apply");
        };
        let mut bd: BundleDeployment = serde_json::from_value(apply.body).unwrap();
        bd.metadata.uid = Some("bd-uid".into());
        bd.metadata.resource_version = Some("7".into());
        crate::slim::deployment(&mut bd);
        bd
    }

    #[test]
    fn a_new_deployment_is_applied_with_finalizer_labels_and_fingerprint() {
        let d = desired();
        let DeploymentStep::Write(op) = step(&d, None) else {
            panic!("expected a write");
        };
        let Op::Apply(apply) = *op else {
            panic!("expected an apply");
        };
        assert_eq!(
            apply.key.to_string(),
            "BundleDeployment cluster-ws-east-1a2b3c/app"
        );
        assert_eq!(apply.body["apiVersion"], "tender.dev/v1alpha1");
        assert_eq!(
            apply.body["metadata"]["finalizers"][0],
            labels::AGENT_CLEANUP_FINALIZER
        );
        assert_eq!(apply.body["metadata"]["labels"][labels::BUNDLE_NAME], "app");
        assert_eq!(apply.fingerprint.unwrap().live_version, None);
    }

    #[test]
    fn nothing_changed_means_no_operations() {
        let d = desired();
        let live = written(&d);
        assert_eq!(
            step(&d, Some(&live)),
            DeploymentStep::Current {
                uid: "bd-uid".into()
            }
        );
        let copy_meta = ObjectMeta {
            uid: Some("c-uid".into()),
            annotations: Some(BTreeMap::from([(labels::CONTENT_HASH.into(), "h1".into())])),
            owner_references: Some(vec![copy_owner("app", "bd-uid".into())]),
            ..Default::default()
        };
        assert_eq!(
            copy_step(&d.copies[0], Some(&copy_meta), "bd-uid"),
            CopyStep::Current
        );
        let live_copies = [LiveCopy {
            kind: SourceKind::Secret,
            name: d.copies[0].copy_name.clone(),
            uid: Some("c-uid".into()),
        }];
        assert!(stale_copy_ops(&d.namespace, &live_copies, &d.copies).is_empty());
        let status = BundleStatus::default();
        let regarding = ObjectReference::default();
        assert!(transition_events(&regarding, Some(&status), &status).is_empty());
        assert!(fanout_events(&regarding, 0, 0).is_empty());
    }

    #[test]
    fn a_changed_spec_is_written_over_the_cached_version() {
        let d = desired();
        let live = written(&d);
        let mut changed = d.clone();
        changed.spec.as_mut().unwrap().deployment_id = "id-2".into();
        let DeploymentStep::Write(op) = step(&changed, Some(&live)) else {
            panic!("expected a write");
        };
        let Op::Apply(apply) = *op else {
            panic!("expected an apply");
        };
        assert_eq!(
            apply.fingerprint.unwrap().live_version.as_deref(),
            Some("7")
        );
        assert_eq!(apply.body["spec"]["deploymentID"], "id-2");
    }

    #[test]
    fn a_spec_edited_behind_an_unchanged_deployment_id_is_written_back() {
        let d = desired();
        let mut edited = full(&d).unwrap();
        edited.resources = vec![tender_types::Manifest(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "planted"}
        }))];
        let mut live = BundleDeployment::new("app", edited);
        live.metadata.namespace = Some(d.namespace.clone());
        live.metadata.labels = Some(owned_labels("ws", "app", &d.cluster, &d.namespace, None));
        live.metadata.finalizers = Some(vec![labels::AGENT_CLEANUP_FINALIZER.into()]);
        // The cache's own annotation key, forged with the desired spec's hash: replaced.
        let forged = hash::spec_hash(&full(&d).unwrap());
        live.metadata.annotations = Some(BTreeMap::from([(
            "tender.dev/cached-spec-hash".into(),
            forged,
        )]));
        crate::slim::deployment(&mut live);
        assert!(
            live.spec.resources.is_empty(),
            "the cache drops the manifests"
        );
        assert!(matches!(step(&d, Some(&live)), DeploymentStep::Write(_)));
    }

    #[test]
    fn blocked_or_terminating_deployments_are_held() {
        let mut blocked = desired();
        blocked.spec = None;
        assert_eq!(step(&blocked, None), DeploymentStep::Hold);
        let d = desired();
        let mut live = written(&d);
        live.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(step(&d, Some(&live)), DeploymentStep::Hold);
    }

    #[test]
    fn copies_are_rewritten_on_new_hash_or_owner_and_recreated_when_edited() {
        let copy = copy_of("db");
        assert_eq!(
            copy_step(&copy, None, "u"),
            CopyStep::Write { replace: None }
        );
        let meta = ObjectMeta {
            uid: Some("c-uid".into()),
            annotations: Some(BTreeMap::from([(
                labels::CONTENT_HASH.into(),
                "old".into(),
            )])),
            owner_references: Some(vec![copy_owner("app", "u".into())]),
            ..Default::default()
        };
        assert_eq!(
            copy_step(&copy, Some(&meta), "u"),
            CopyStep::Write { replace: None }
        );
        let mut other_owner = meta.clone();
        other_owner.annotations =
            Some(BTreeMap::from([(labels::CONTENT_HASH.into(), "h1".into())]));
        assert_eq!(
            copy_step(&copy, Some(&other_owner), "v"),
            CopyStep::Write { replace: None }
        );
        let edited: ObjectMeta = serde_json::from_value(serde_json::json!({
            "uid": "c-uid",
            "annotations": {labels::CONTENT_HASH: "h1"},
            "ownerReferences": [serde_json::to_value(copy_owner("app", "u".into())).unwrap()],
            "managedFields": [{"manager": "kubectl-edit", "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:k": {}}}}],
        }))
        .unwrap();
        assert_eq!(
            copy_step(&copy, Some(&edited), "u"),
            CopyStep::Write {
                replace: Some("c-uid".into())
            }
        );
    }

    #[test]
    fn a_secret_copy_keeps_data_and_copied_metadata_only() {
        let source = Secret {
            metadata: ObjectMeta {
                name: Some("db".into()),
                labels: Some(BTreeMap::from([
                    ("app".into(), "db".into()),
                    (labels::MANAGED_BY.into(), "helm".into()),
                ])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/basic-auth".into()),
            data: Some(BTreeMap::from([(
                "password".into(),
                ByteString(b"p".to_vec()),
            )])),
            immutable: Some(true),
            ..Default::default()
        };
        let copy = copy_of("db");
        let owner = copy_owner("app", "bd-uid".into());
        let bd_labels = owned_labels("ws", "app", "east", "cns", None);
        let to = CopyTarget {
            bundle_ns: "ws",
            cluster_ns: "cns",
            owner: &owner,
            labels: &bd_labels,
        };
        let op = copy_op(
            &SourceObject::Secret(source.clone()),
            &copy,
            &to,
            Some("3".into()),
            None,
        );
        let Op::Apply(apply) = op else {
            panic!("expected an apply")
        };
        assert!(apply.replace_if_immutable);
        assert_eq!(apply.fingerprint.unwrap().desired, "h1/bd-uid");
        let body = apply.body;
        assert_eq!(body["kind"], "Secret");
        assert_eq!(body["type"], "kubernetes.io/basic-auth");
        assert_eq!(body["immutable"], true);
        assert_eq!(body["data"]["password"], "cA==");
        assert_eq!(body["metadata"]["labels"]["app"], "db");
        assert_eq!(
            body["metadata"]["labels"][labels::MANAGED_BY],
            labels::MANAGED_BY_VALUE
        );
        assert_eq!(
            body["metadata"]["annotations"][labels::CONTENT_HASH],
            hash::secret_hash(&source)
        );
        assert_eq!(body["metadata"]["annotations"][labels::COPY_OF], "ws/db");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "bd-uid");

        let recreate = copy_op(
            &SourceObject::Secret(source),
            &copy,
            &to,
            None,
            Some("c-uid".into()),
        );
        assert!(matches!(recreate, Op::Recreate { uid: Some(ref u), .. } if u == "c-uid"));
    }

    #[test]
    fn stale_copies_are_deleted_by_uid() {
        let live = [
            LiveCopy {
                kind: SourceKind::Secret,
                name: names::copy_name("app", "Secret", "db"),
                uid: Some("a".into()),
            },
            LiveCopy {
                kind: SourceKind::ConfigMap,
                name: names::copy_name("app", "ConfigMap", "old"),
                uid: Some("b".into()),
            },
        ];
        let ops = stale_copy_ops("cns", &live, &[copy_of("db")]);
        assert_eq!(
            ops,
            [Op::Delete {
                key: ObjectKey::of::<ConfigMap>(
                    Some("cns"),
                    &names::copy_name("app", "ConfigMap", "old")
                ),
                uid: Some("b".into()),
            }]
        );
    }

    #[test]
    fn another_kind_travels_in_a_carrier_secret_with_its_content_hash() {
        let policy = serde_json::json!({
            "apiVersion": "kyverno.io/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "p", "uid": "u1", "labels": {"team": "a"}},
            "spec": {"rules": [{"name": "r"}]},
            "status": {"ready": true},
        });
        let copy = DesiredCopy {
            kind: SourceKind::Secret,
            source_kind: tender_types::copy::CopyableKind::parse("kyverno.io/v1/ClusterPolicy")
                .unwrap(),
            source: "p".into(),
            copy_name: "app-clusterpolicy-p-1234".into(),
            hash: hash::carried_hash(&policy),
        };
        let owner = copy_owner("app", "bd-uid".into());
        let bd_labels = owned_labels("ws", "app", "east", "cluster-ns", None);
        let to = CopyTarget {
            bundle_ns: "ws",
            cluster_ns: "cluster-ns",
            owner: &owner,
            labels: &bd_labels,
        };
        let Op::Apply(apply) = copy_op(
            &SourceObject::Carried(policy.clone()),
            &copy,
            &to,
            None,
            None,
        ) else {
            panic!("an apply");
        };
        assert_eq!(
            apply.key,
            ObjectKey::of::<Secret>(Some("cluster-ns"), &copy.copy_name)
        );
        let carrier: Secret = serde_json::from_value(apply.body).unwrap();
        assert_eq!(carrier.type_.as_deref(), Some(labels::CARRIER_TYPE));
        assert_eq!(
            carrier.labels().get(labels::CARRIER).map(String::as_str),
            Some("true")
        );
        assert_eq!(
            carrier.labels().get("team"),
            None,
            "the object's labels stay inside"
        );
        assert_eq!(
            carrier.annotations().get(labels::CONTENT_HASH),
            Some(&copy.hash)
        );
        let data = carrier.data.unwrap();
        let carried: Value = serde_json::from_slice(&data[labels::CARRIER_KEY].0).unwrap();
        assert_eq!(
            hash::value_hash(&carried),
            copy.hash,
            "the agent can verify it"
        );
        assert_eq!(carried["kind"], "ClusterPolicy");
        assert!(carried.get("status").is_none());
        assert!(carried["metadata"].get("uid").is_none());
    }
}
