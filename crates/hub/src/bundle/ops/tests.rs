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
            helm: None,
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
        bytes: 10,
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
    let (keys, sig) = crate::signing::test_keys();
    let copy_meta = ObjectMeta {
        uid: Some("c-uid".into()),
        annotations: Some(BTreeMap::from([
            (labels::CONTENT_HASH.into(), "h1".into()),
            (labels::HUB_SIGNATURE.into(), sig.clone()),
        ])),
        owner_references: Some(vec![copy_owner("app", "bd-uid".into())]),
        ..Default::default()
    };
    assert_eq!(
        copy_step(&d.copies[0], Some(&copy_meta), "bd-uid", &keys),
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
    let (keys, _) = crate::signing::test_keys();
    assert_eq!(
        copy_step(&copy, None, "u", &keys),
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
        copy_step(&copy, Some(&meta), "u", &keys),
        CopyStep::Write { replace: None }
    );
    let mut other_owner = meta.clone();
    other_owner.annotations = Some(BTreeMap::from([(labels::CONTENT_HASH.into(), "h1".into())]));
    assert_eq!(
        copy_step(&copy, Some(&other_owner), "v", &keys),
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
        copy_step(&copy, Some(&edited), "u", &keys),
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
        keys: &crate::signing::test_keys().0,
        signed_at: 5,
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
    // The hub's signature verifies with its public key over exactly this entry and content,
    // as the agent checks it (decision 0089-signed-copies).
    let trusted = tender_types::signing::TrustedKeys::parse(&to.keys.public_keys).unwrap();
    let content_hash = hash::secret_hash(&source);
    let claim = tender_types::signing::CopyClaim {
        cluster_namespace: "cns",
        bundle_deployment: "app",
        api_version: "v1",
        kind: "Secret",
        name: "db",
        copy_name: &copy.copy_name,
        content_hash: &content_hash,
        signed_at: 0,
    };
    let signature = body["metadata"]["annotations"][labels::HUB_SIGNATURE].as_str();
    assert_eq!(trusted.verify(&claim, signature), Ok(5));
    let other = tender_types::signing::CopyClaim {
        cluster_namespace: "other",
        ..claim
    };
    assert!(trusted.verify(&other, signature).is_err());

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
        bytes: 10,
    };
    let owner = copy_owner("app", "bd-uid".into());
    let bd_labels = owned_labels("ws", "app", "east", "cluster-ns", None);
    let to = CopyTarget {
        bundle_ns: "ws",
        cluster_ns: "cluster-ns",
        owner: &owner,
        labels: &bd_labels,
        keys: &crate::signing::test_keys().0,
        signed_at: 5,
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

#[test]
fn a_kept_copy_is_signed_anew_for_the_hash_it_was_kept_under() {
    let mut copy = copy_of("db");
    copy.hash = "kept-hash".into();
    let owner = copy_owner("app", "bd-uid".into());
    let bd_labels = owned_labels("ws", "app", "east", "cns", None);
    let to = CopyTarget {
        bundle_ns: "ws",
        cluster_ns: "cns",
        owner: &owner,
        labels: &bd_labels,
        keys: &crate::signing::test_keys().0,
        signed_at: 9,
    };
    let kept = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": copy.copy_name, "namespace": "cns",
                     "annotations": {labels::HUB_SIGNATURE: "an old signature"}},
        "data": {"password": "b2xk"},
    });
    let Op::Apply(apply) = kept_copy_op(kept, &copy, &to) else {
        panic!("expected an apply")
    };
    assert!(
        apply.replace_if_immutable,
        "a kept immutable copy is recreated"
    );
    assert!(apply.fingerprint.is_none());
    assert_eq!(apply.key.namespace.as_deref(), Some("cns"));
    assert_eq!(apply.key.name, copy.copy_name);
    assert_eq!(apply.body["data"]["password"], "b2xk", "the kept content");
    let trusted = tender_types::signing::TrustedKeys::parse(&to.keys.public_keys).unwrap();
    let claim = tender_types::signing::CopyClaim {
        cluster_namespace: "cns",
        bundle_deployment: "app",
        api_version: "v1",
        kind: "Secret",
        name: "db",
        copy_name: &copy.copy_name,
        content_hash: "kept-hash",
        signed_at: 0,
    };
    let signature = apply.body["metadata"]["annotations"][labels::HUB_SIGNATURE].as_str();
    assert_eq!(
        trusted.verify(&claim, signature),
        Ok(9),
        "signed anew, later"
    );
}
