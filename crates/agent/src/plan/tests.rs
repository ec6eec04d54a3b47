use super::fixtures::*;
use super::*;

#[test]
fn secret_copy_keeps_source_name_type_data_and_own_metadata() {
    let d = db_copy(&hub_secret());
    assert_eq!(d.key, key("v1", "Secret", Some("apps"), "db"));
    assert!(d.copy);
    let b = &d.body;
    assert_eq!(b["metadata"]["name"], "db");
    assert_eq!(b["metadata"]["namespace"], "apps");
    assert_eq!(b["type"], "kubernetes.io/basic-auth");
    assert_eq!(b["immutable"], true);
    assert_eq!(b["data"]["password"], "czNjcmV0"); // base64 of s3cret
    let labels = b["metadata"]["labels"].as_object().unwrap();
    assert_eq!(labels["team"], "a");
    assert!(!labels.contains_key(labels::BUNDLE_NAME));
    assert_eq!(labels[labels::MANAGED_BY], "tender");
    assert_eq!(labels[labels::BUNDLE_DEPLOYMENT], owner().label());
    assert_eq!(labels[labels::CLUSTER_NAMESPACE], "cluster-ws-c1-12345678");
    let ann = b["metadata"]["annotations"].as_object().unwrap();
    assert_eq!(ann["note"], "keep me");
    assert_eq!(ann[labels::COPY_OF], "ws/db");
    assert_eq!(ann[labels::OWNER_ANNOTATION], "cluster-ws-c1-12345678/app");
    assert_eq!(ann[labels::CONTENT_HASH], d.hash.as_str());
    assert!(!ann.contains_key(labels::KEEP_RESOURCES));
    assert!(!ann.contains_key("kubectl.kubernetes.io/last-applied-configuration"));

    let kept = secret_copy(
        &hub_secret(),
        &entry("Secret", "db"),
        "apps",
        &owner(),
        true,
        0,
    );
    assert_eq!(
        kept.body["metadata"]["annotations"][labels::KEEP_RESOURCES],
        "true"
    );
    assert_ne!(kept.hash, d.hash, "keep marker is part of the content");
}
#[test]
fn copy_hash_follows_data_but_never_contains_it() {
    let a = db_copy(&hub_secret());
    let mut rotated = hub_secret();
    rotated.data = Some(BTreeMap::from([(
        "password".into(),
        ByteString(b"n3w".to_vec()),
    )]));
    let b = secret_copy(&rotated, &entry("Secret", "db"), "apps", &owner(), false, 0);
    assert_ne!(a.hash, b.hash);
    assert!(!a.hash.contains("czNjcmV0"));
}
#[test]
fn config_map_copy_keeps_data_and_binary_data_apart() {
    let cm = ConfigMap {
        data: Some(BTreeMap::from([("k".into(), "v".into())])),
        binary_data: Some(BTreeMap::from([("b".into(), ByteString(vec![0, 1]))])),
        ..Default::default()
    };
    let d = config_map_copy(&cm, &entry("ConfigMap", "cfg"), "apps", &owner(), false, 0);
    assert_eq!(d.body["data"]["k"], "v");
    assert_eq!(d.body["binaryData"]["b"], "AAE=");
    assert!(d.body.get("immutable").is_none());
    assert!(d.body.get("type").is_none());
}
#[test]
fn manifests_get_namespace_and_ownership() {
    let m = Manifest(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}, "resourceVersion": "5"},
        "spec": {"replicas": 1}, "status": {"x": 1}
    }));
    let d = manifest(&m, true, &opts(None), &owner()).unwrap();
    assert_eq!(d.key, key("apps/v1", "Deployment", Some("def"), "web"));
    assert_eq!(d.body["metadata"]["namespace"], "def");
    assert_eq!(d.body["metadata"]["labels"]["app"], "web");
    assert_eq!(d.body["metadata"]["labels"][labels::MANAGED_BY], "tender");
    assert!(d.body["metadata"].get("resourceVersion").is_none());
    assert!(d.body.get("status").is_none());
    assert!(!d.copy);

    let forced = manifest(&m, true, &opts(Some("t")), &owner()).unwrap();
    assert_eq!(forced.key.namespace.as_deref(), Some("t"));

    let ns = Manifest(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "namespace": "y"}}),
    );
    let d = manifest(&ns, false, &opts(Some("t")), &owner()).unwrap();
    assert_eq!(d.key.namespace, None);
    assert!(d.body["metadata"].get("namespace").is_none());

    let bad = Manifest(json!({"kind": "ConfigMap", "metadata": {"name": "x"}}));
    assert!(manifest(&bad, true, &opts(None), &owner()).is_err());
}
#[test]
fn ownership_decisions() {
    let o = owner();
    let ann = |v: &str| BTreeMap::from([(labels::OWNER_ANNOTATION.to_string(), v.to_string())]);
    assert_eq!(ownership(None, &o), Ownership::Unowned);
    assert_eq!(ownership(Some(&BTreeMap::new()), &o), Ownership::Unowned);
    assert_eq!(ownership(Some(&ann(&o.annotation())), &o), Ownership::Ours);
    // Same BundleDeployment name, other cluster namespace (two agents, one downstream).
    let other = Owner::new("cluster-ws-c2-87654321", "app").annotation();
    assert_eq!(
        ownership(Some(&ann(&other)), &o),
        Ownership::Other(other.clone())
    );

    assert_eq!(may_write(&Ownership::Ours, false), Ok(false));
    assert_eq!(may_write(&Ownership::Unowned, true), Ok(true));
    assert!(
        may_write(&Ownership::Unowned, false)
            .unwrap_err()
            .contains("takeOwnership")
    );
    let err = may_write(&Ownership::Other(other.clone()), true).unwrap_err();
    assert!(err.contains(&other), "{err}");
}
#[test]
fn owner_annotation_round_trips() {
    let o = owner();
    assert_eq!(Owner::parse(&o.annotation()), Some(o));
    assert_eq!(Owner::parse("nope"), None);
    assert_eq!(Owner::parse("/x"), None);
    assert_eq!(Owner::parse("a/b/c"), None);
}
#[test]
fn prune_set_is_previous_minus_desired() {
    let a = key("v1", "Secret", Some("n"), "a");
    let b = key("v1", "ConfigMap", Some("n"), "b");
    let dep_v1 = key("apps/v1", "Deployment", Some("n"), "d");
    let dep_v2 = key("apps/v2", "Deployment", Some("n"), "d");
    let ns = key("v1", "Namespace", None, "n");
    let prev = vec![a.clone(), b.clone(), dep_v1.clone(), ns.clone(), a.clone()];
    let desired = vec![b.clone(), dep_v2.clone()];
    assert_eq!(prune_set(&prev, &desired), vec![a.clone(), ns.clone()]);
    assert!(prune_set(&[], &desired).is_empty());
    assert_eq!(union(&desired, &prev), vec![b, dep_v2, a, ns]);
}
#[test]
fn strip_patch_removes_only_tender_keys() {
    let d = secret_copy(
        &hub_secret(),
        &entry("Secret", "db"),
        "apps",
        &owner(),
        true,
        0,
    );
    let labels: BTreeMap<String, String> =
        serde_json::from_value(d.body["metadata"]["labels"].clone()).unwrap();
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(d.body["metadata"]["annotations"].clone()).unwrap();
    let patch = strip_patch(Some(&labels), Some(&annotations));
    let l = patch["metadata"]["labels"].as_object().unwrap();
    let a = patch["metadata"]["annotations"].as_object().unwrap();
    assert!(l.contains_key(labels::MANAGED_BY));
    assert!(l.contains_key(labels::BUNDLE_DEPLOYMENT));
    assert!(!l.contains_key("team"));
    assert!(a.contains_key(labels::OWNER_ANNOTATION));
    assert!(a.contains_key(labels::KEEP_RESOURCES));
    assert!(!a.contains_key("note"));
    assert!(l.values().chain(a.values()).all(Value::is_null));
}
#[test]
fn cluster_selector_scopes_to_one_cluster_namespace() {
    assert_eq!(
        cluster_selector("cluster-a-b-1234"),
        "app.kubernetes.io/managed-by=tender,tender.dev/cluster-namespace=cluster-a-b-1234"
    );
}

#[test]
fn only_our_objects_are_removed_and_by_uid() {
    let key = ObjectKey::of::<Secret>(Some("apps"), "db");
    let d = db_copy(&hub_secret());
    let mut live: ObjectMeta = serde_json::from_value(d.body["metadata"].clone()).unwrap();
    live.uid = Some("u".into());
    assert_eq!(
        removal_op(key.clone(), &live, &owner(), false),
        Some((
            Op::Delete {
                key: key.clone(),
                uid: Some("u".into())
            },
            "delete"
        ))
    );
    let strip = Op::MergePatch {
        key: key.clone(),
        patch: strip_patch(live.labels.as_ref(), live.annotations.as_ref()),
    };
    assert_eq!(
        removal_op(key.clone(), &live, &owner(), true),
        Some((strip.clone(), "strip"))
    );
    let marked = db_copy_kept();
    assert!(matches!(
        removal_op(key.clone(), &marked, &owner(), false),
        Some((Op::MergePatch { .. }, "strip"))
    ));
    let other = Owner::new("cluster-ws-c2-87654321", "app");
    assert_eq!(removal_op(key.clone(), &live, &other, false), None);
    assert_eq!(
        removal_op(key, &ObjectMeta::default(), &owner(), false),
        None
    );
}

fn db_copy_kept() -> ObjectMeta {
    let d = secret_copy(
        &hub_secret(),
        &entry("Secret", "db"),
        "apps",
        &owner(),
        true,
        0,
    );
    serde_json::from_value(d.body["metadata"].clone()).unwrap()
}

#[test]
fn a_manifest_with_empty_labels_or_annotations_still_gets_ownership() {
    let m = Manifest(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "labels": null, "annotations": null}
    }));
    let d = manifest(&m, true, &opts(Some("apps")), &owner()).unwrap();
    let meta = &d.body["metadata"];
    assert_eq!(
        meta["annotations"][labels::OWNER_ANNOTATION],
        owner().annotation()
    );
    assert_eq!(meta["labels"][labels::MANAGED_BY], "tender");
    assert_eq!(meta["annotations"][labels::CONTENT_HASH], d.hash.as_str());
}

#[test]
fn compare_patches_are_neither_applied_nor_judged() {
    let m = Manifest(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "paused": false}
    }));
    let mut o = opts(Some("apps"));
    o.diff = Some(
        serde_json::from_value(json!({"comparePatches": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "namespace": "apps",
            "operations": [{"op": "remove", "path": "/spec/replicas"}]
        }]}))
        .unwrap(),
    );
    let d = manifest(&m, true, &o, &owner()).unwrap();
    assert!(d.body["spec"].get("replicas").is_none(), "not applied");
    assert_eq!(d.body["spec"]["paused"], false);
    let mut live = as_existing(&d);
    live["spec"]["replicas"] = json!(7);
    assert!(
        object::in_sync(&d, &live),
        "another manager's replicas are not drift"
    );
    live["spec"]["paused"] = json!(true);
    assert!(!object::in_sync(&d, &live), "the other fields still are");

    // The entry names the namespace the object is deployed to: elsewhere it is applied whole.
    let elsewhere = manifest(&m, true, &opts(Some("other")), &owner()).unwrap();
    assert_eq!(elsewhere.body["spec"]["replicas"], 2);
    let mut o2 = opts(Some("other"));
    o2.diff = o.diff.clone();
    assert_eq!(
        manifest(&m, true, &o2, &owner()).unwrap().body["spec"]["replicas"],
        2
    );
}

#[test]
fn a_created_namespace_carries_the_bundles_labels_but_keeps_tenders_mark() {
    let labels = BTreeMap::from([
        ("team".to_string(), "web".to_string()),
        (
            tender_types::labels::MANAGED_BY.to_string(),
            "someone-else".to_string(),
        ),
    ]);
    let annotations = BTreeMap::from([("owner".to_string(), "a".to_string())]);
    let op = namespace_op(
        "apps",
        NamespaceMeta {
            labels: Some(&labels),
            annotations: Some(&annotations),
        },
    );
    let tender_runtime::Op::Create { body, .. } = op else {
        panic!("a namespace is only ever created");
    };
    assert_eq!(body["metadata"]["labels"]["team"], "web");
    assert_eq!(
        body["metadata"]["labels"][tender_types::labels::MANAGED_BY],
        tender_types::labels::MANAGED_BY_VALUE
    );
    assert_eq!(body["metadata"]["annotations"]["owner"], "a");
    let tender_runtime::Op::Create { body, .. } = namespace_op("x", NamespaceMeta::default())
    else {
        panic!()
    };
    assert!(body["metadata"].get("annotations").is_none());
}
