use super::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector;

fn config_map(ns: &str, name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data})
}

fn ssa() -> PatchParams {
    PatchParams::apply("tender-test").force()
}

fn rv(object: &impl Resource) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a resourceVersion")
}

#[tokio::test]
async fn apply_creates_then_merges_and_moves_versions_only_on_change() {
    let fake = FakeApiserver::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "c1");
    let created = api
        .patch(
            "cfg",
            &ssa(),
            &Patch::Apply(config_map("c1", "cfg", &[("a", "1"), ("b", "2")])),
        )
        .await
        .expect("create by apply");
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));

    // The same apply again: nothing changed, the resourceVersion stays.
    let same = api
        .patch(
            "cfg",
            &ssa(),
            &Patch::Apply(config_map("c1", "cfg", &[("a", "1"), ("b", "2")])),
        )
        .await
        .expect("no-op apply");
    assert_eq!(rv(&same), rv(&created));
    assert_eq!(same.metadata.uid, created.metadata.uid);

    // Someone else's field survives our apply; a field we stopped applying goes.
    fake.edit(
        &ApiResource::erase::<ConfigMap>(&()),
        Some("c1"),
        "cfg",
        |v| {
            v["data"]["theirs"] = "x".into();
        },
    );
    let changed = api
        .patch(
            "cfg",
            &ssa(),
            &Patch::Apply(config_map("c1", "cfg", &[("a", "9")])),
        )
        .await
        .expect("apply");
    let data = changed.data.clone().expect("data");
    assert_eq!(data.get("a").map(String::as_str), Some("9"));
    assert_eq!(data.get("theirs").map(String::as_str), Some("x"));
    assert!(!data.contains_key("b"), "{data:?}");
    assert!(rv(&changed) > rv(&created));
    assert_eq!(changed.metadata.generation, Some(3), "two content changes");

    let recorded = fake.writes();
    assert_eq!(recorded.len(), 3, "edits are not requests: {recorded:?}");
    assert!(recorded.iter().all(Recorded::is_apply));
    assert_eq!(recorded[0].path, "/api/v1/namespaces/c1/configmaps/cfg");
    assert_eq!(
        recorded[0].param("fieldManager").as_deref(),
        Some("tender-test")
    );
    assert_eq!(recorded[2].body["data"], json!({"a": "9"}));
}

#[tokio::test]
async fn two_managers_apply_their_own_conditions_and_other_lists_are_replaced() {
    let fake = FakeApiserver::new();
    let resource = ApiResource::erase::<Namespace>(&());
    fake.insert(&resource, json!({"metadata": {"name": "n"}}));
    let api: Api<Namespace> = Api::all(fake.client());
    let apply = |manager: &str, status: Value| {
        let api = api.clone();
        let params = PatchParams::apply(manager).force();
        async move {
            api.patch_status("n", &params, &Patch::Apply(json!({"status": status})))
                .await
                .expect("status apply")
        }
    };
    let cond = |t: &str, s: &str| json!({"type": t, "status": s});
    let types = |fake: &FakeApiserver| -> Vec<(String, String)> {
        let stored = fake.get(&resource, None, "n").expect("stored");
        stored["status"]["conditions"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|c| (c["type"].to_string(), c["status"].to_string()))
                    .collect()
            })
            .unwrap_or_default()
    };
    apply(
        "a",
        json!({"conditions": [cond("A", "True")], "phase": "x", "list": [1, 2]}),
    )
    .await;
    apply("b", json!({"conditions": [cond("B", "True")], "list": [3]})).await;
    let expect = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(t, s)| (format!("{t:?}"), format!("{s:?}")))
            .collect()
    };
    assert_eq!(types(&fake), expect(&[("A", "True"), ("B", "True")]));
    let stored = fake.get(&resource, None, "n").expect("stored");
    assert_eq!(
        stored["status"]["list"],
        json!([3]),
        "an atomic list is replaced"
    );
    // `a` changes its entry: `b`'s stays.
    apply(
        "a",
        json!({"conditions": [cond("A", "False")], "phase": "x"}),
    )
    .await;
    assert_eq!(types(&fake), expect(&[("A", "False"), ("B", "True")]));
    // `a` stops applying conditions: only its entry goes.
    apply("a", json!({"phase": "x"})).await;
    assert_eq!(types(&fake), expect(&[("B", "True")]));
    // `b` stops too: the list goes.
    apply("b", json!({})).await;
    let stored = fake.get(&resource, None, "n").expect("stored");
    assert!(stored["status"].get("conditions").is_none(), "{stored}");
    assert_eq!(stored["status"]["phase"], json!("x"));
}

#[tokio::test]
async fn get_and_list_by_namespace_label_and_field() {
    let fake = FakeApiserver::new();
    let cm = ApiResource::erase::<ConfigMap>(&());
    for (ns, name, team) in [("a", "one", "x"), ("a", "two", "y"), ("b", "one", "x")] {
        let mut v = config_map(ns, name, &[]);
        v["metadata"]["labels"] = json!({"team": team});
        fake.insert(&cm, v);
    }
    let all: Api<ConfigMap> = Api::all(fake.client());
    assert_eq!(
        all.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        3
    );
    let in_a: Api<ConfigMap> = Api::namespaced(fake.client(), "a");
    assert_eq!(
        in_a.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        2
    );
    let x = all
        .list(&ListParams::default().labels("team=x"))
        .await
        .expect("list");
    assert_eq!(x.items.len(), 2);
    let not_x = all
        .list(&ListParams::default().labels("team!=x"))
        .await
        .expect("list");
    assert_eq!(not_x.items[0].metadata.name.as_deref(), Some("two"));
    let named = all
        .list(&ListParams::default().fields("metadata.name=one,metadata.namespace=b"))
        .await
        .expect("list");
    assert_eq!(named.items.len(), 1);
    assert!(in_a.get_opt("one").await.expect("get").is_some());
    assert!(in_a.get_opt("three").await.expect("get").is_none());
    assert_eq!(fake.all::<ConfigMap>().len(), 3);
    assert!(fake.writes().is_empty());
    assert_eq!(fake.requests().len(), 7);

    // Cluster-scoped objects.
    fake.put(&Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some("a".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let namespaces: Api<Namespace> = Api::all(fake.client());
    assert!(namespaces.get_opt("a").await.expect("get").is_some());
}

#[tokio::test]
async fn merge_patch_honours_a_resource_version_and_finalizers_hold_a_deletion() {
    let fake = FakeApiserver::new();
    let cm = ApiResource::erase::<ConfigMap>(&());
    let mut v = config_map("c1", "held", &[("a", "1")]);
    v["metadata"]["finalizers"] = json!(["tender.dev/x"]);
    let seeded = fake.insert(&cm, v);
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "c1");

    let stale = json!({"metadata": {"resourceVersion": "999", "labels": {"l": "v"}}});
    let err = api
        .patch("held", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .expect_err("stale resourceVersion");
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409));

    api.delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let held = api.get("held").await.expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());

    let current = held.metadata.resource_version.clone().expect("rv");
    let release = json!({"metadata": {"resourceVersion": current, "finalizers": null}});
    api.patch("held", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("remove the finalizer");
    assert!(
        api.get_opt("held").await.expect("get").is_none(),
        "gone with its last finalizer"
    );
    assert!(seeded["metadata"]["uid"].is_string());

    let missing = api
        .patch("held", &PatchParams::default(), &Patch::Merge(&json!({})))
        .await
        .expect_err("gone");
    assert!(matches!(missing, kube::Error::Api(s) if s.code == 404));
}

#[tokio::test]
async fn delete_preconditions_and_creates() {
    let fake = FakeApiserver::new();
    let api: Api<Secret> = Api::namespaced(fake.client(), "c1");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"k": "v"}
    }))
    .expect("secret");
    let made = api
        .create(&PostParams::default(), &secret)
        .await
        .expect("create");
    let again = api
        .create(&PostParams::default(), &secret)
        .await
        .expect_err("exists");
    assert!(matches!(again, kube::Error::Api(s) if s.code == 409));

    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("another".into()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let refused = api
        .delete("db", &wrong)
        .await
        .expect_err("uid precondition");
    assert!(matches!(refused, kube::Error::Api(s) if s.code == 409));
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: made.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    api.delete("db", &right).await.expect("delete");
    let gone = api.delete("db", &right).await.expect_err("already gone");
    assert!(matches!(gone, kube::Error::Api(s) if s.code == 404));

    let writes = fake.writes();
    let methods: Vec<_> = writes.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, ["POST", "POST", "DELETE", "DELETE", "DELETE"]);
    assert_eq!(writes[2].body["preconditions"]["uid"], "another");
}

#[tokio::test]
async fn status_is_written_only_through_its_subresource() {
    let fake = FakeApiserver::new();
    let api: Api<Namespace> = Api::all(fake.client());
    let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}, "status": {"phase": "Mine"}});
    let made = api
        .patch("apps", &ssa(), &Patch::Apply(&body))
        .await
        .expect("apply");
    assert!(made.status.is_none(), "status ignored on the object");
    let status = json!({"apiVersion": "v1", "kind": "Namespace", "status": {"phase": "Active"}});
    let after = api
        .patch_status("apps", &ssa(), &Patch::Apply(&status))
        .await
        .expect("status apply");
    assert_eq!(
        after.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );
    assert_eq!(
        after.metadata.generation,
        Some(1),
        "status does not move the generation"
    );
    assert!(
        rv(&made)
            < after
                .metadata
                .resource_version
                .as_deref()
                .unwrap()
                .parse()
                .unwrap()
    );
    assert_eq!(fake.writes()[1].path, "/api/v1/namespaces/apps/status");
}

#[tokio::test]
async fn an_injected_failure_answers_until_used_up_or_cleared() {
    let fake = FakeApiserver::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "c1");
    let path = "/api/v1/namespaces/c1/configmaps/big";
    fake.fail_times(Some(Method::PATCH), path, 413, Some(1));
    fake.fail(Some(Method::DELETE), path, 500);
    let body = config_map("c1", "big", &[("a", "1")]);
    let err = api
        .patch("big", &ssa(), &Patch::Apply(&body))
        .await
        .expect_err("413");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 413 && s.reason == "RequestEntityTooLarge"),
        "{err:?}"
    );
    api.patch("big", &ssa(), &Patch::Apply(&body))
        .await
        .expect("used up");
    for _ in 0..2 {
        let err = api
            .delete("big", &DeleteParams::default())
            .await
            .expect_err("500");
        assert!(matches!(err, kube::Error::Api(s) if s.code == 500));
    }
    fake.clear_failures();
    api.delete("big", &DeleteParams::default())
        .await
        .expect("cleared");
    assert_eq!(fake.take_requests().len(), 5);
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn objects_fill_a_reflector_store() {
    let fake = FakeApiserver::new();
    let cm = ApiResource::erase::<ConfigMap>(&());
    fake.insert(&cm, config_map("a", "one", &[]));
    fake.insert(&cm, config_map("b", "two", &[]));
    let (reader, mut writer) = reflector::store::<ConfigMap>();
    fake.refill(&mut writer);
    assert_eq!(reader.state().len(), 2);
    fake.remove(&cm, Some("a"), "one");
    fake.refill(&mut writer);
    assert_eq!(reader.state().len(), 1, "a refill replaces the contents");
    let metas = fake.all::<kube::api::PartialObjectMeta<ConfigMap>>();
    assert_eq!(metas[0].metadata.name.as_deref(), Some("two"));
}

#[tokio::test(start_paused = true)]
async fn the_executor_runs_against_it_events_and_recreate_included() {
    use crate::executor::{Apply, EventOp, Executor, ObjectKey, Op};
    use kube::runtime::events::{EventType, Recorder, Reporter};
    let fake = FakeApiserver::new();
    let client = fake.client();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test".into(),
            instance: None,
        },
    );
    let exec = Executor::new(
        client,
        "tender-test",
        recorder,
        Arc::new(crate::Metrics::new()),
    );
    let key = ObjectKey::of::<ConfigMap>(Some("c1"), "cfg");
    let apply = Apply {
        key: key.clone(),
        body: config_map("c1", "cfg", &[("a", "1")]),
        replace_if_immutable: true,
        fingerprint: None,
    };
    let first = exec.execute(Op::Apply(apply.clone())).await.expect("apply");
    let recreated = exec
        .execute(Op::Recreate {
            uid: first.uid.clone(),
            apply,
        })
        .await
        .expect("recreate");
    assert_ne!(recreated.uid, first.uid, "a new incarnation");
    exec.execute(Op::Event(EventOp {
        regarding: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("ConfigMap".into()),
            namespace: Some("c1".into()),
            name: Some("cfg".into()),
            ..Default::default()
        },
        type_: EventType::Normal,
        reason: "Written".into(),
        action: "Write".into(),
        note: "n".into(),
    }))
    .await
    .expect("event");
    let writes: Vec<String> = fake.writes().iter().map(ToString::to_string).collect();
    assert_eq!(
        writes,
        [
            "PATCH /api/v1/namespaces/c1/configmaps/cfg",
            "DELETE /api/v1/namespaces/c1/configmaps/cfg",
            "PATCH /api/v1/namespaces/c1/configmaps/cfg",
            "POST /apis/events.k8s.io/v1/namespaces/c1/events",
        ]
    );
}

#[test]
fn paths_and_queries_parse() {
    let t = Target::parse("/apis/tender.dev/v1alpha1/namespaces/c1/bundledeployments/x/status")
        .expect("path");
    assert_eq!(
        (t.api_version.as_str(), t.plural.as_str()),
        ("tender.dev/v1alpha1", "bundledeployments")
    );
    assert_eq!(t.namespace.as_deref(), Some("c1"));
    assert!(t.is_status());
    let ns = Target::parse("/api/v1/namespaces/c1").expect("path");
    assert_eq!(
        (ns.plural.as_str(), ns.name.as_deref(), ns.namespace),
        ("namespaces", Some("c1"), None)
    );
    let q = query_params("labelSelector=a%3Db%2Cc&watch=true");
    assert_eq!(q["labelSelector"], "a=b,c");
    assert!(selects_labels(
        "a=b,c",
        &json!({"metadata": {"labels": {"a": "b", "c": ""}}})
    ));
    assert!(!selects_labels(
        "!c",
        &json!({"metadata": {"labels": {"c": ""}}})
    ));
}

#[tokio::test]
async fn kube_finalizer_helper_adds_and_removes_its_finalizer() {
    use kube::runtime::controller::Action;
    use kube::runtime::finalizer::{Event, finalizer};
    let fake = FakeApiserver::new();
    let cm = ApiResource::erase::<ConfigMap>(&());
    fake.insert(&cm, config_map("c1", "cfg", &[]));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "c1");
    let run = |obj: ConfigMap| {
        let api = api.clone();
        async move {
            finalizer(&api, "tender.dev/test", Arc::new(obj), |event| async move {
                Ok::<_, std::convert::Infallible>(match event {
                    Event::Apply(_) => Action::await_change(),
                    Event::Cleanup(_) => Action::await_change(),
                })
            })
            .await
            .expect("finalizer step")
        }
    };
    run(api.get("cfg").await.expect("get")).await;
    let held = api.get("cfg").await.expect("get");
    assert_eq!(
        held.metadata.finalizers,
        Some(vec!["tender.dev/test".to_string()])
    );
    // Held: the Apply runs, nothing is written.
    run(held.clone()).await;
    api.delete("cfg", &DeleteParams::default())
        .await
        .expect("delete");
    run(api.get("cfg").await.expect("being deleted")).await;
    assert!(
        api.get_opt("cfg").await.expect("get").is_none(),
        "gone with its finalizer"
    );
    let types: Vec<_> = fake
        .writes()
        .iter()
        .filter(|r| r.method == Method::PATCH)
        .filter_map(|r| r.content_type.clone())
        .collect();
    assert_eq!(types.len(), 2, "added once, removed once: {types:?}");
    assert!(
        types
            .iter()
            .all(|t| t.starts_with("application/json-patch")),
        "{types:?}"
    );

    // A failed test operation answers 422.
    fake.insert(&cm, config_map("c1", "cfg", &[]));
    let stale =
        json!([{"op": "test", "path": "/data/a", "value": "x"}, {"op": "remove", "path": "/data"}]);
    let err = api
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(stale).expect("patch")),
        )
        .await
        .expect_err("test fails");
    assert!(matches!(err, kube::Error::Api(s) if s.code == 422));
}

#[test]
fn json_patches_add_replace_and_remove() {
    let mut v = json!({"metadata": {"finalizers": ["a"]}, "data": {"k/x": "1"}});
    json::json_patch(
        &mut v,
        &json!([
            {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
            {"op": "add", "path": "/metadata/finalizers/0", "value": "z"},
            {"op": "replace", "path": "/data/k~1x", "value": "2"},
            {"op": "remove", "path": "/metadata/finalizers/1"},
            {"op": "test", "path": "/missing", "value": null},
        ]),
    )
    .expect("patch");
    assert_eq!(
        v,
        json!({"metadata": {"finalizers": ["z", "b"]}, "data": {"k/x": "2"}})
    );
    assert!(json::json_patch(&mut v, &json!([{"op": "remove", "path": "/nope"}])).is_err());
}
