//! The bad-input catalogue of docs/reliability.md (issue 14), case by case on a real hub and two
//! real downstream clusters, agents in-process. Each test asserts the promised outcome — an
//! admission error naming the field, or a condition with a specific reason — and that nothing
//! else changed: the other objects of the same BundleDeployment are deployed, other clusters
//! and Bundles are unaffected, and objects that existed before keep their uid.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tender_e2e::crds::apply_crd;
use tender_e2e::fixture::{WAIT, Workspace, create_namespace, secret_value, stays, wait_secret};
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{
    TYPE_DEPLOYED, TYPE_READY, TYPE_RESOURCES_COPIED, find_condition, is_true, reason,
};
use tender_types::copy::CopyableKind;
use tender_types::{Bundle, BundleDeployment, Cluster, ObjectState, labels};

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Waits until the BundleDeployment of `bundle` on `cluster` has condition `type_` with
/// `reason`, and returns it; on timeout the failure shows its last status.
async fn bd_reason(
    ws: &Workspace,
    cluster: &str,
    bundle: &str,
    type_: &str,
    why: &str,
) -> BundleDeployment {
    let api = ws.bds(cluster);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let bd = api.get_opt(bundle).await.unwrap();
        let found = bd.as_ref().is_some_and(|bd| {
            bd.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, type_).is_some_and(|c| c.reason == why)
            })
        });
        if found {
            return bd.unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "BundleDeployment {bundle} of {cluster}: no {type_}={why} within {WAIT:?}; last status: {:#?}",
            bd.and_then(|bd| bd.status)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until Bundle `name` has `Ready` with `why`, and returns it.
async fn bundle_reason(ws: &Workspace, name: &str, why: &str) -> Bundle {
    let api: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually(&format!("Bundle {name}: Ready={why}"), WAIT, || async {
        let b = api.get_opt(name).await?;
        Ok::<_, kube::Error>(b.filter(|b| {
            b.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, TYPE_READY).is_some_and(|c| c.reason == why)
            })
        }))
    })
    .await
}

/// The message of condition `type_` of `bd`.
fn message(bd: &BundleDeployment, type_: &str) -> String {
    let status = bd.status.as_ref().expect("status");
    find_condition(&status.conditions, type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// The state the agent reports for object `name` of `bd`.
fn state_of(bd: &BundleDeployment, name: &str) -> ObjectState {
    bd.status
        .as_ref()
        .and_then(|s| s.resources.iter().find(|r| r.name == name))
        .map(|r| r.state)
        .unwrap_or_else(|| panic!("{name} not in the status of {}", bd.name_any()))
}

/// A ConfigMap manifest `name` (in `namespace` when given) with `data`.
fn cm_manifest(name: &str, namespace: Option<&str>, data: Value) -> Value {
    let mut m = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": data});
    if let Some(ns) = namespace {
        m["metadata"]["namespace"] = json!(ns);
    }
    m
}

/// The uid of ConfigMap `ns/name` downstream, once it exists.
async fn cm_uid(down: &kube::Client, ns: &str, name: &str) -> String {
    let api: Api<ConfigMap> = Api::namespaced(down.clone(), ns);
    eventually(&format!("ConfigMap {ns}/{name}"), WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(name).await?.and_then(|c| c.metadata.uid))
    })
    .await
}

/// The ConfigMap `ns/name` downstream, if it exists.
async fn cm(down: &kube::Client, ns: &str, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(down.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

/// Creates namespace `ns` downstream with a ConfigMap `bystander` tender did not create;
/// returns the bystander's uid, which every test checks at its end.
async fn bystander(down: &kube::Client, ns: &str) -> String {
    create_namespace(down, ns).await;
    let api: Api<ConfigMap> = Api::namespaced(down.clone(), ns);
    let made = api
        .create(
            &PostParams::default(),
            &tender_e2e::fixture::config_map("bystander", &[("mine", "yes")]),
        )
        .await
        .unwrap();
    made.metadata.uid.unwrap()
}

/// Asserts the bystander of `ns` is the same object with the same data.
async fn bystander_untouched(down: &kube::Client, ns: &str, uid: &str) {
    let c = cm(down, ns, "bystander").await.expect("bystander exists");
    assert_eq!(c.metadata.uid.as_deref(), Some(uid), "bystander replaced");
    assert_eq!(
        c.data
            .as_ref()
            .and_then(|d| d.get("mine"))
            .map(String::as_str),
        Some("yes")
    );
    assert!(
        !c.labels().contains_key(labels::MANAGED_BY),
        "bystander adopted"
    );
}

/// A namespaced CRD `widgets.<group>` (kind `Widget`, any content).
fn widget_crd(group: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap()
}

fn widgets(down: &kube::Client, group: &str, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    Api::namespaced_with(down.clone(), ns, &ar)
}

// ---------------------------------------------------------------------------------------------
// Sizes.

#[tokio::test]
async fn a_secret_near_one_mib_is_copied_intact_and_rotates() {
    let ws = Workspace::new(shared_env(2).await, "bad-mib").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("mib");
    let by = bystander(&down, &target).await;

    // 1 MiB is the apiserver's limit for a Secret's data; 1 KiB below it, bytes of every value.
    let blob: Vec<u8> = (0..(1024 * 1024 - 1024)).map(|i| (i % 251) as u8).collect();
    let put = |blob: Vec<u8>| {
        let mut s = tender_e2e::fixture::secret("big", &[]);
        s.data = Some(BTreeMap::from([("blob".to_string(), ByteString(blob))]));
        let api: Api<Secret> = Api::namespaced(ws.hub.clone(), &ws.ns);
        async move {
            api.patch("big", &PatchParams::apply("e2e").force(), &Patch::Apply(&s))
                .await
                .unwrap();
        }
    };
    put(blob.clone()).await;
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": target,
            "downstreamResources": [{"kind": "Secret", "name": "big"}],
            "resources": [cm_manifest("settings", None, json!({"a": "b"}))],
        }),
    )
    .await;
    ws.ready("east", "app").await;
    let copied = wait_secret(&down, &target, "big", "the 1 MiB copy", |_| true).await;
    assert_eq!(copied.data.unwrap()["blob"].0, blob, "copied byte for byte");
    let settings = cm_uid(&down, &target, "settings").await;

    // A rotation of one byte of it arrives too.
    let mut rotated = blob.clone();
    rotated[512 * 1024] ^= 0xff;
    put(rotated.clone()).await;
    wait_secret(&down, &target, "big", "the rotated 1 MiB copy", |s| {
        s.data.as_ref().is_some_and(|d| d["blob"].0 == rotated)
    })
    .await;
    ws.ready("east", "app").await;
    assert_eq!(cm_uid(&down, &target, "settings").await, settings);
    bystander_untouched(&down, &target, &by).await;
}

#[tokio::test]
async fn a_bundle_deployment_too_large_to_store_is_too_large_and_the_last_one_stays() {
    let ws = Workspace::new(shared_env(2).await, "bad-large").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("large");

    // A BundleDeployment carries the Bundle's manifests plus, per copy, a content hash and a
    // copy name: with 64 copies it is kilobytes larger than its Bundle.
    let sources: Vec<String> = (0..64).map(|i| format!("source-{i:02}")).collect();
    for s in &sources {
        ws.source_config_map(s, &[("k", s)]).await;
    }
    let spec = |pad: usize| {
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": target,
            "downstreamResources": sources.iter()
                .map(|s| json!({"kind": "ConfigMap", "name": s})).collect::<Vec<_>>(),
            "resources": [
                cm_manifest("big", None, json!({"pad": "x".repeat(pad)})),
                cm_manifest("small", None, json!({"v": "1"})),
            ],
        })
    };
    ws.bundle("app", spec(10)).await;
    ws.bundle(
        "other",
        json!({"targets": [{"clusterName": "east"}], "defaultNamespace": target,
            "resources": [cm_manifest("other", None, json!({"v": "1"}))]}),
    )
    .await;
    let before = ws.ready("east", "app").await;
    ws.ready("east", "other").await;
    let big_uid = cm_uid(&down, &target, "big").await;
    let other_uid = cm_uid(&down, &target, "other").await;

    // Sizes as the apiserver stores them: the Bundle (with its status) and its deployment.
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let json_len = |v: &Value| serde_json::to_vec(v).unwrap().len();
    let bundle_now = serde_json::to_value(bundles.get("app").await.unwrap()).unwrap();
    let mut bare = bundle_now.clone();
    bare.as_object_mut().unwrap().remove("status");
    let status_len = json_len(&bundle_now) - json_len(&bare);
    let mut bd_bare = serde_json::to_value(&before).unwrap();
    bd_bare.as_object_mut().unwrap().remove("status");
    let extra = json_len(&bd_bare) as i64 - json_len(&bare) as i64;
    assert!(
        extra > 2 * status_len as i64 + 1024,
        "the deployment must outgrow its Bundle by more than twice the Bundle status: {extra} vs {status_len}"
    );

    // The largest such Bundle the hub's apiserver stores, probed where no hub looks.
    let scratch = unique_name("bad-large-probe");
    create_namespace(&ws.hub, &scratch).await;
    let probes: Api<Bundle> = Api::namespaced(ws.hub.clone(), &scratch);
    let (mut fits, mut too_big) = (10usize, 4 * 1024 * 1024usize);
    while too_big - fits > 256 {
        let pad = (fits + too_big) / 2;
        let body = json!({"apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "app"}, "spec": spec(pad)});
        match probes
            .patch(
                "app",
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(body),
            )
            .await
        {
            Ok(_) => {
                fits = pad;
                probes
                    .delete("app", &DeleteParams::default())
                    .await
                    .unwrap();
            }
            Err(_) => too_big = pad,
        }
    }
    // The Bundle (and its status) still fits; its deployment does not.
    let pad = fits - (extra as usize) / 2;
    ws.bundle("app", spec(pad)).await;
    let b = bundle_reason(&ws, "app", reason::TOO_LARGE).await;
    let ready = find_condition(&b.status.unwrap().conditions, TYPE_READY)
        .unwrap()
        .clone();
    assert!(ready.message.contains("east"), "{}", ready.message);

    // The last deployment stays as it was, on the hub and downstream; the other Bundle too.
    let after = ws.bds("east").get("app").await.unwrap();
    assert_eq!(after.uid(), before.uid());
    assert_eq!(after.spec.deployment_id, before.spec.deployment_id);
    stays(
        "the deployed objects",
        Duration::from_secs(3),
        &(Some(big_uid.clone()), Some(10)),
        || async {
            let c = cm(&down, &target, "big").await;
            (
                c.as_ref().and_then(|c| c.metadata.uid.clone()),
                c.and_then(|c| c.data).map(|d| d["pad"].len()),
            )
        },
    )
    .await;
    ws.ready("east", "other").await;
    assert_eq!(cm_uid(&down, &target, "other").await, other_uid);

    // Smaller again: written, deployed, and the reason clears.
    ws.bundle("app", spec(20)).await;
    bundle_reason(&ws, "app", reason::READY).await;
    ws.ready("east", "app").await;
    let big = cm(&down, &target, "big").await.unwrap();
    assert_eq!(big.metadata.uid.as_deref(), Some(big_uid.as_str()));
    assert_eq!(big.data.unwrap()["pad"].len(), 20);
}

// ---------------------------------------------------------------------------------------------
// Kinds.

#[tokio::test]
async fn a_manifest_of_a_kind_not_installed_is_kind_not_installed_and_the_rest_deploys() {
    let ws = Workspace::new(shared_env(2).await, "bad-kind").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("kind");
    let by = bystander(&down, &target).await;
    // Installed on west only.
    let group = format!("{}.e2e.tender.dev", unique_name("k"));
    let west_down = ws.downstream(&west.downstream).await;
    apply_crd(&west_down, &widget_crd(&group)).await.unwrap();

    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}, {"clusterName": "west"}],
            "defaultNamespace": target,
            "resources": [
                cm_manifest("settings", None, json!({"a": "b"})),
                {"apiVersion": format!("{group}/v1"), "kind": "Widget",
                 "metadata": {"name": "w"}, "spec": {"size": 1}},
            ],
        }),
    )
    .await;
    let bd = bd_reason(
        &ws,
        "east",
        "app",
        TYPE_DEPLOYED,
        reason::KIND_NOT_INSTALLED,
    )
    .await;
    assert_eq!(
        find_condition(&bd.status.as_ref().unwrap().conditions, TYPE_READY)
            .unwrap()
            .reason,
        reason::KIND_NOT_INSTALLED
    );
    let msg = message(&bd, TYPE_DEPLOYED);
    assert!(msg.contains("Widget w: KindNotInstalled"), "{msg}");
    assert_eq!(state_of(&bd, "w"), ObjectState::Error);
    assert_eq!(state_of(&bd, "settings"), ObjectState::Ready);
    let settings = cm_uid(&down, &target, "settings").await;
    // The other cluster serves the kind and is Ready; the Bundle counts east as failed.
    ws.ready("west", "app").await;
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let b = eventually(
        "the Bundle counts east failed, west ready",
        WAIT,
        || async {
            let b = bundles.get("app").await?;
            let counted = b
                .status
                .as_ref()
                .and_then(|s| s.summary.as_ref())
                .is_some_and(|s| (s.ready, s.err_applied) == (1, 1));
            Ok::<_, kube::Error>(counted.then_some(b))
        },
    )
    .await;
    let ready = find_condition(&b.status.unwrap().conditions, TYPE_READY)
        .unwrap()
        .clone();
    assert_eq!(ready.reason, reason::APPLY_FAILED);

    // Installing the CRD on east is all it takes.
    apply_crd(&down, &widget_crd(&group)).await.unwrap();
    ws.ready("east", "app").await;
    assert!(
        widgets(&down, &group, &target)
            .get_opt("w")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(cm_uid(&down, &target, "settings").await, settings);
    bystander_untouched(&down, &target, &by).await;
}

#[tokio::test]
async fn a_copied_kind_not_served_downstream_is_kind_not_installed_and_manifests_wait() {
    let env = shared_env(2).await;
    let ws = Workspace::without_hub(env, "bad-carried").await;
    let group = format!("{}.e2e.tender.dev", unique_name("w"));
    apply_crd(&ws.hub, &widget_crd(&group)).await.unwrap();
    let mut config = hub_config(&ws.ns);
    config.copyable_kinds =
        CopyableKind::parse_list(&format!("v1/Secret,v1/ConfigMap,{group}/v1/Widget")).unwrap();
    let _hub = start_hub(env, config).await.unwrap();
    let east = ws.agent("east", &downstream_name(1)).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    let down = ws.downstream(&east.downstream).await;
    let west_down = ws.downstream(&west.downstream).await;
    apply_crd(&west_down, &widget_crd(&group)).await.unwrap();
    let target = unique_name("carried");
    let by = bystander(&down, &target).await;

    widgets(&ws.hub, &group, &ws.ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": format!("{group}/v1"),
                "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}}))
            .unwrap(),
        )
        .await
        .unwrap();
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}, {"clusterName": "west"}],
            "defaultNamespace": target,
            "downstreamResources": [
                {"kind": "Secret", "name": "db-creds"},
                {"apiVersion": format!("{group}/v1"), "kind": "Widget", "name": "w"}
            ],
            "resources": [cm_manifest("settings", None, json!({"a": "b"}))],
        }),
    )
    .await;
    // East does not serve Widgets: the copy says so, the Secret is copied, manifests wait.
    bd_reason(
        &ws,
        "east",
        "app",
        TYPE_RESOURCES_COPIED,
        reason::KIND_NOT_INSTALLED,
    )
    .await;
    let bd = bd_reason(
        &ws,
        "east",
        "app",
        TYPE_DEPLOYED,
        reason::KIND_NOT_INSTALLED,
    )
    .await;
    assert!(
        message(&bd, TYPE_RESOURCES_COPIED).contains("Widget"),
        "{bd:?}"
    );
    wait_secret(&down, &target, "db-creds", "the Secret copy", |_| true).await;
    assert!(
        cm(&down, &target, "settings").await.is_none(),
        "manifests wait"
    );
    // West serves them and is Ready with the Widget.
    ws.ready("west", "app").await;
    assert!(
        widgets(&west_down, &group, &target)
            .get_opt("w")
            .await
            .unwrap()
            .is_some()
    );

    // Installed on east: the copy lands, then the manifests.
    apply_crd(&down, &widget_crd(&group)).await.unwrap();
    ws.ready("east", "app").await;
    assert!(
        widgets(&down, &group, &target)
            .get_opt("w")
            .await
            .unwrap()
            .is_some()
    );
    assert!(cm(&down, &target, "settings").await.is_some());
    bystander_untouched(&down, &target, &by).await;
}

#[tokio::test]
async fn a_crd_removed_downstream_is_kind_not_installed_and_nothing_else_changes() {
    let ws = Workspace::new(shared_env(2).await, "bad-crd").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("crd");
    let by = bystander(&down, &target).await;
    let group = format!("{}.e2e.tender.dev", unique_name("c"));
    apply_crd(&down, &widget_crd(&group)).await.unwrap();

    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": target,
            "resources": [
                cm_manifest("settings", None, json!({"a": "b"})),
                {"apiVersion": format!("{group}/v1"), "kind": "Widget",
                 "metadata": {"name": "w"}, "spec": {"size": 1}},
            ],
        }),
    )
    .await;
    ws.ready("east", "app").await;
    let settings = cm_uid(&down, &target, "settings").await;

    // The CRD goes (and its objects with it): the deployment says why, the rest stays.
    let crds: Api<CustomResourceDefinition> = Api::all(down.clone());
    let crd_name = format!("widgets.{group}");
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the CRD gone", WAIT, || async {
        Ok::<_, kube::Error>(crds.get_opt(&crd_name).await?.is_none().then_some(()))
    })
    .await;
    let bd = bd_reason(&ws, "east", "app", TYPE_READY, reason::KIND_NOT_INSTALLED).await;
    assert!(message(&bd, TYPE_READY).contains("Widget"), "{bd:?}");
    assert_eq!(state_of(&bd, "settings"), ObjectState::Ready);
    assert_eq!(cm_uid(&down, &target, "settings").await, settings);
    bystander_untouched(&down, &target, &by).await;

    // Reinstalled: the Widget is back.
    apply_crd(&down, &widget_crd(&group)).await.unwrap();
    ws.ready("east", "app").await;
    assert!(
        widgets(&down, &group, &target)
            .get_opt("w")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(cm_uid(&down, &target, "settings").await, settings);
}

#[tokio::test]
async fn a_cluster_scoped_manifest_ignores_target_namespace() {
    let ws = Workspace::new(shared_env(2).await, "bad-scope").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("scope");
    let ignored = unique_name("scope-ignored");
    let by = bystander(&down, &target).await;
    let class = unique_name("bad-scope-class");

    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "targetNamespace": target,
            "resources": [
                cm_manifest("settings", Some(&ignored), json!({"a": "b"})),
                {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                 "metadata": {"name": class, "namespace": ignored}, "value": 1000},
            ],
        }),
    )
    .await;
    ws.ready("east", "app").await;
    let pc = Api::<PriorityClass>::all(down.clone())
        .get(&class)
        .await
        .unwrap();
    assert_eq!(pc.metadata.namespace, None);
    assert_eq!(pc.value, Some(1000));
    assert!(cm(&down, &target, "settings").await.is_some());
    assert!(
        Api::<Namespace>::all(down.clone())
            .get_opt(&ignored)
            .await
            .unwrap()
            .is_none(),
        "no namespace made for a namespace targetNamespace overrides"
    );
    bystander_untouched(&down, &target, &by).await;
}

// ---------------------------------------------------------------------------------------------
// Namespaces and ownership.

#[tokio::test]
async fn a_namespace_stuck_terminating_is_namespace_terminating_and_the_rest_deploys() {
    let ws = Workspace::new(shared_env(2).await, "bad-stuck").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let healthy = unique_name("healthy");
    let stuck = unique_name("stuck");
    let by = bystander(&down, &healthy).await;

    // A namespace held by a finalizer of somebody else's, then deleted: Terminating for good.
    create_namespace(&down, &stuck).await;
    let namespaces: Api<Namespace> = Api::all(down.clone());
    let hold = |finalizers: &[&str]| {
        let namespaces = namespaces.clone();
        let stuck = stuck.clone();
        let finalizers: Vec<String> = finalizers.iter().map(|f| f.to_string()).collect();
        async move {
            let mut ns = namespaces.get(&stuck).await.unwrap();
            ns.spec.get_or_insert_default().finalizers = Some(finalizers);
            namespaces
                .replace_subresource("finalize", &stuck, &PostParams::default(), &ns)
                .await
                .unwrap();
        }
    };
    hold(&["kubernetes", "e2e.tender.dev/hold"]).await;
    namespaces
        .delete(&stuck, &DeleteParams::default())
        .await
        .unwrap();

    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "resources": [
                cm_manifest("ok", Some(&healthy), json!({"a": "b"})),
                cm_manifest("blocked", Some(&stuck), json!({"a": "b"})),
            ],
        }),
    )
    .await;
    let bd = bd_reason(
        &ws,
        "east",
        "app",
        TYPE_DEPLOYED,
        reason::NAMESPACE_TERMINATING,
    )
    .await;
    let msg = message(&bd, TYPE_READY);
    assert!(msg.contains(&stuck), "{msg}");
    assert_eq!(state_of(&bd, "ok"), ObjectState::Ready);
    assert_eq!(state_of(&bd, "blocked"), ObjectState::Error);
    let ok = cm_uid(&down, &healthy, "ok").await;
    assert!(cm(&down, &stuck, "blocked").await.is_none());
    let ns = namespaces.get(&stuck).await.unwrap();
    assert!(
        ns.metadata.deletion_timestamp.is_some(),
        "still terminating: the agent forces nothing"
    );

    // Released by its owner: the namespace goes, the agent makes it again and deploys.
    hold(&[]).await;
    eventually("the stuck namespace gone or made again", WAIT, || async {
        let ns = namespaces.get_opt(&stuck).await?;
        Ok::<_, kube::Error>(
            ns.is_none_or(|n| n.metadata.deletion_timestamp.is_none())
                .then_some(()),
        )
    })
    .await;
    ws.ready("east", "app").await;
    assert!(cm(&down, &stuck, "blocked").await.is_some());
    assert_eq!(cm_uid(&down, &healthy, "ok").await, ok);
    bystander_untouched(&down, &healthy, &by).await;
}

#[tokio::test]
async fn two_bundles_claiming_one_object_conflict_and_the_first_keeps_it() {
    let ws = Workspace::new(shared_env(2).await, "bad-claim").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("claim");
    let by = bystander(&down, &target).await;

    ws.bundle(
        "first",
        json!({"targets": [{"clusterName": "east"}], "defaultNamespace": target,
            "resources": [cm_manifest("shared", None, json!({"from": "first"}))]}),
    )
    .await;
    ws.ready("east", "first").await;
    let shared = cm_uid(&down, &target, "shared").await;
    // The second claims it too, even with takeOwnership (which adopts only unmanaged objects).
    ws.bundle(
        "second",
        json!({"targets": [{"clusterName": "east"}], "defaultNamespace": target,
        "takeOwnership": true,
        "resources": [
            cm_manifest("shared", None, json!({"from": "second"})),
            cm_manifest("second-only", None, json!({"a": "b"})),
        ]}),
    )
    .await;
    let bd = bd_reason(&ws, "east", "second", TYPE_DEPLOYED, reason::CONFLICT).await;
    assert!(
        message(&bd, TYPE_DEPLOYED).contains(&format!("ConfigMap {target}/shared")),
        "{bd:?}"
    );
    assert_eq!(state_of(&bd, "shared"), ObjectState::Conflict);
    assert!(cm(&down, &target, "second-only").await.is_some());

    let version = cm(&down, &target, "shared")
        .await
        .and_then(|c| c.metadata.resource_version);
    stays(
        "the first Bundle's object, across a conflict re-check",
        tender_e2e::fixture::CONFLICT_RECHECKS,
        &(
            Some(shared.clone()),
            Some("first".to_string()),
            version.clone(),
        ),
        || async {
            let c = cm(&down, &target, "shared").await;
            (
                c.as_ref().and_then(|c| c.metadata.uid.clone()),
                c.as_ref()
                    .and_then(|c| c.data.as_ref())
                    .and_then(|d| d.get("from").cloned()),
                c.and_then(|c| c.metadata.resource_version),
            )
        },
    )
    .await;
    let owner = cm(&down, &target, "shared").await.unwrap();
    assert!(
        owner.annotations()[labels::OWNER_ANNOTATION].ends_with("/first"),
        "{:?}",
        owner.annotations()
    );
    assert!(is_true(
        &ws.bds("east")
            .get("first")
            .await
            .unwrap()
            .status
            .unwrap()
            .conditions,
        TYPE_READY
    ));
    bystander_untouched(&down, &target, &by).await;
}

// ---------------------------------------------------------------------------------------------
// Targeting and Clusters.

#[tokio::test]
async fn an_empty_selector_matches_every_cluster_of_its_workspace_only() {
    let env = shared_env(2).await;
    let ws = Workspace::new(env, "bad-all").await;
    let other = Workspace::new(env, "bad-all-other").await;
    other.cluster("elsewhere").await;
    for c in ["a", "b"] {
        ws.cluster(c).await;
    }
    ws.bundle(
        "everything",
        json!({"targets": [{"clusterSelector": {}}],
            "resources": [cm_manifest("x", Some("default"), json!({}))]}),
    )
    .await;
    // A Cluster with other labels, registered later, is matched too.
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "tender.dev/v1alpha1",
                "kind": "Cluster", "metadata": {"name": "c", "labels": {"env": "other"}},
                "spec": {}}))
            .unwrap(),
        )
        .await
        .unwrap();
    for c in ["a", "b", "c"] {
        eventually(&format!("a deployment for {c}"), WAIT, || async {
            Ok::<_, kube::Error>(ws.bds(c).get_opt("everything").await?.map(|_| ()))
        })
        .await;
    }
    let b = eventually("the Bundle counts three clusters", WAIT, || async {
        let b = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
            .get("everything")
            .await?;
        Ok::<_, kube::Error>(
            b.status
                .and_then(|s| s.summary)
                .filter(|s| s.desired_ready == 3),
        )
    })
    .await;
    assert_eq!(b.desired_ready, 3);
    let uids = || async {
        let mut uids = Vec::new();
        for c in ["a", "b", "c"] {
            uids.push(ws.bds(c).get("everything").await.unwrap().uid());
        }
        uids
    };
    let before = uids().await;

    // A selector that cannot be evaluated (the schema allows any operator) changes nothing.
    ws.bundle(
        "everything",
        json!({"targets": [{"clusterSelector": {"matchExpressions":
                [{"key": "env", "operator": "Bogus"}]}}],
            "resources": [cm_manifest("x", Some("default"), json!({}))]}),
    )
    .await;
    let b = bundle_reason(&ws, "everything", reason::INVALID_SELECTOR).await;
    let ready = find_condition(&b.status.unwrap().conditions, TYPE_READY)
        .unwrap()
        .clone();
    assert!(ready.message.contains("Bogus"), "{}", ready.message);
    stays("the deployments", Duration::from_secs(3), &before, uids).await;
    // Nothing reaches a Cluster of another workspace.
    let elsewhere: Api<BundleDeployment> =
        Api::namespaced(ws.hub.clone(), &other.cluster_ns("elsewhere"));
    assert!(
        elsewhere
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn a_cluster_deleted_with_deployments_and_keep_resources_deletes_nothing_downstream() {
    let ws = Workspace::new(shared_env(2).await, "bad-delcl").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    let target = unique_name("delcl");
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    // keepResources: whether or not the agent sees the deletion before its identity goes
    // (a race the hub does not wait for), nothing may disappear downstream.
    let mut spec = tender_e2e::fixture::app_bundle(&["east", "west"], &target);
    spec["keepResources"] = json!(true);
    ws.bundle("app", spec).await;
    let west_bd = ws.ready("west", "app").await;
    ws.ready("east", "app").await;
    let east_down = ws.downstream(&east.downstream).await;
    let west_down = ws.downstream(&west.downstream).await;
    let uids = |down: kube::Client| {
        let target = target.clone();
        async move {
            let s = Api::<Secret>::namespaced(down.clone(), &target)
                .get_opt("db-creds")
                .await
                .unwrap()
                .and_then(|s| s.metadata.uid);
            let c = cm(&down, &target, "app-settings")
                .await
                .and_then(|c| c.metadata.uid);
            (s, c)
        }
    };
    let east_before = uids(east_down.clone()).await;
    let west_before = uids(west_down.clone()).await;
    assert!(east_before.0.is_some() && east_before.1.is_some());

    let ns = ws.cluster_ns("east");
    Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    eventually("the cluster namespace gone", WAIT, || async {
        Ok::<_, kube::Error>(namespaces.get_opt(&ns).await?.is_none().then_some(()))
    })
    .await;
    // The Bundle now counts one cluster; west's deployment is the same object, still Ready.
    eventually("the Bundle counts one cluster", WAIT, || async {
        let b = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
            .get("app")
            .await?;
        Ok::<_, kube::Error>(
            b.status
                .and_then(|s| s.summary)
                .filter(|s| s.desired_ready == 1 && s.ready == 1),
        )
    })
    .await;
    assert_eq!(ws.ready("west", "app").await.uid(), west_bd.uid());
    // Downstream nothing is deleted: not on the deleted cluster (its agent lost its identity),
    // not on the other.
    stays(
        "the deleted cluster's objects downstream",
        Duration::from_secs(5),
        &east_before,
        || uids(east_down.clone()),
    )
    .await;
    assert_eq!(uids(west_down.clone()).await, west_before);
}

// ---------------------------------------------------------------------------------------------
// Data.

#[tokio::test]
async fn a_source_secret_whose_type_changes_is_recreated_with_the_new_type() {
    let ws = Workspace::new(shared_env(2).await, "bad-type").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("type");
    let by = bystander(&down, &target).await;
    let config = r#"{"auths":{"registry.example.com":{"auth":"dTpw"}}}"#;
    let source = |type_: &str| {
        let mut s = tender_e2e::fixture::secret("pull", &[(".dockerconfigjson", config)]);
        s.type_ = Some(type_.into());
        s
    };
    let secrets: Api<Secret> = Api::namespaced(ws.hub.clone(), &ws.ns);
    secrets
        .create(&PostParams::default(), &source("Opaque"))
        .await
        .unwrap();
    ws.bundle(
        "app",
        json!({"targets": [{"clusterName": "east"}], "defaultNamespace": target,
            "downstreamResources": [{"kind": "Secret", "name": "pull"}],
            "resources": [cm_manifest("settings", None, json!({"a": "b"}))]}),
    )
    .await;
    ws.ready("east", "app").await;
    let first = wait_secret(&down, &target, "pull", "the Opaque copy", |s| {
        s.type_.as_deref() == Some("Opaque")
    })
    .await;
    let settings = cm_uid(&down, &target, "settings").await;

    // A Secret's type is immutable: its owner deletes and recreates it with another type.
    secrets
        .delete("pull", &DeleteParams::default())
        .await
        .unwrap();
    bundle_reason(&ws, "app", reason::SOURCE_NOT_FOUND).await;
    assert_eq!(
        Api::<Secret>::namespaced(down.clone(), &target)
            .get("pull")
            .await
            .unwrap()
            .uid(),
        first.uid(),
        "a missing source deletes nothing downstream"
    );
    secrets
        .create(
            &PostParams::default(),
            &source("kubernetes.io/dockerconfigjson"),
        )
        .await
        .unwrap();
    let copied = wait_secret(&down, &target, "pull", "the copy with the new type", |s| {
        s.type_.as_deref() == Some("kubernetes.io/dockerconfigjson")
    })
    .await;
    assert_ne!(
        copied.uid(),
        first.uid(),
        "recreated: a type cannot change in place"
    );
    assert_eq!(
        secret_value(&copied, ".dockerconfigjson").as_deref(),
        Some(config)
    );
    let copy_on_hub = Api::<Secret>::namespaced(ws.hub.clone(), &ws.cluster_ns("east"))
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.labels().get(labels::BUNDLE_NAME).map(String::as_str) == Some("app"))
        .expect("the copy on the hub");
    assert_eq!(
        copy_on_hub.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );
    ws.ready("east", "app").await;
    assert_eq!(cm_uid(&down, &target, "settings").await, settings);
    bystander_untouched(&down, &target, &by).await;
}

#[tokio::test]
async fn non_utf8_data_is_copied_byte_for_byte_and_stays_idle() {
    let ws = Workspace::new(shared_env(2).await, "bad-bytes").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("bytes");
    let by = bystander(&down, &target).await;
    let raw: Vec<u8> = vec![0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28, 0xed, 0xa0, 0x80, b'\n'];
    assert!(String::from_utf8(raw.clone()).is_err());

    let mut secret = tender_e2e::fixture::secret("raw", &[]);
    secret.data = Some(BTreeMap::from([("bin".into(), ByteString(raw.clone()))]));
    let mut config = tender_e2e::fixture::config_map("raw", &[("text", "héllo ✓ 日本")]);
    config.binary_data = Some(BTreeMap::from([("blob".into(), ByteString(raw.clone()))]));
    let apply = PatchParams::apply("e2e").force();
    Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .patch("raw", &apply, &Patch::Apply(&secret))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(ws.hub.clone(), &ws.ns)
        .patch("raw", &apply, &Patch::Apply(&config))
        .await
        .unwrap();
    ws.bundle(
        "app",
        json!({"targets": [{"clusterName": "east"}], "defaultNamespace": target,
            "downstreamResources": [{"kind": "Secret", "name": "raw"},
                                    {"kind": "ConfigMap", "name": "raw"}]}),
    )
    .await;
    ws.ready("east", "app").await;
    let s = wait_secret(&down, &target, "raw", "the copy", |_| true).await;
    assert_eq!(s.data.unwrap()["bin"].0, raw);
    let c = cm(&down, &target, "raw").await.unwrap();
    assert_eq!(c.binary_data.unwrap()["blob"].0, raw);
    assert_eq!(c.data.unwrap()["text"], "héllo ✓ 日本");

    // Hashes of such data are stable: once settled, the agent writes nothing.
    let writes = tender_e2e::fixture::settled("agent writes", Duration::from_secs(2), || async {
        east.handle().non_heartbeat_writes()
    })
    .await;
    stays("agent writes", Duration::from_secs(4), &writes, || async {
        east.handle().non_heartbeat_writes()
    })
    .await;
    bystander_untouched(&down, &target, &by).await;
}

// ---------------------------------------------------------------------------------------------
// Names and time.

#[tokio::test]
async fn names_at_their_length_limits_deploy_and_one_more_is_rejected_naming_the_field() {
    let ws = Workspace::new(shared_env(2).await, "bad-len").await;
    let cluster = "c".repeat(63);
    let bundle = "b".repeat(63);
    let source = format!("s{}", ".s".repeat(126)); // 253 characters, a DNS subdomain
    let manifest = "m".repeat(253);
    assert_eq!((source.len(), manifest.len()), (253, 253));
    let agent = ws.agent(&cluster, &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let target = "t".repeat(63);
    let by = bystander(&down, &target).await;

    ws.source_secret(&source, &[("k", "v1")]).await;
    ws.bundle(
        &bundle,
        json!({"targets": [{"clusterName": cluster}], "defaultNamespace": target,
            "downstreamResources": [{"kind": "Secret", "name": source}],
            "resources": [cm_manifest(&manifest, None, json!({"a": "b"}))]}),
    )
    .await;
    ws.ready(&cluster, &bundle).await;
    wait_secret(&down, &target, &source, "the copy", |s| {
        secret_value(s, "k").as_deref() == Some("v1")
    })
    .await;
    assert!(cm(&down, &target, &manifest).await.is_some());
    ws.source_secret(&source, &[("k", "v2")]).await;
    wait_secret(&down, &target, &source, "the rotation", |s| {
        secret_value(s, "k").as_deref() == Some("v2")
    })
    .await;
    bystander_untouched(&down, &target, &by).await;

    // One character more: refused at admission, naming the field.
    let refused = |result: kube::Result<Value>, field: &str| match result {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains(field), "{field}: {}", s.message);
        }
        other => panic!("{field}: accepted: {other:?}"),
    };
    let create = |body: Value| {
        let hub = ws.hub.clone();
        let ns = ws.ns.clone();
        async move {
            let kind = body["kind"].as_str().unwrap().to_lowercase();
            let ar = ApiResource {
                group: "tender.dev".into(),
                version: "v1alpha1".into(),
                api_version: "tender.dev/v1alpha1".into(),
                kind: body["kind"].as_str().unwrap().into(),
                plural: format!("{kind}s"),
            };
            let obj: DynamicObject = serde_json::from_value(body).unwrap();
            Api::<DynamicObject>::namespaced_with(hub, &ns, &ar)
                .create(&PostParams::default(), &obj)
                .await
                .map(|o| serde_json::to_value(o).unwrap())
        }
    };
    refused(
        create(
            json!({"apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "c".repeat(64)}, "spec": {}}),
        )
        .await,
        "metadata.name of a Cluster must be a DNS label",
    );
    refused(
        create(
            json!({"apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "b".repeat(64)},
            "spec": {"targets": [{"clusterName": cluster}]}}),
        )
        .await,
        "metadata.name of a Bundle must be a DNS label",
    );
    refused(
        create(
            json!({"apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "long-source"},
            "spec": {"targets": [{"clusterName": cluster}],
                "downstreamResources": [{"kind": "Secret", "name": format!("{source}s")}]}}),
        )
        .await,
        "spec.downstreamResources[0].name",
    );
}

#[tokio::test]
async fn a_bundle_edited_while_its_agent_is_down_converges_when_it_returns() {
    let ws = Workspace::new(shared_env(2).await, "bad-down").await;
    let mut east = ws.agent("east", &downstream_name(1)).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    let down = ws.downstream(&east.downstream).await;
    let target = unique_name("down");
    let by = bystander(&down, &target).await;
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    let spec = |keep: &str, with_drop: bool| {
        let mut resources = vec![cm_manifest("keep", None, json!({"v": keep}))];
        if with_drop {
            resources.push(cm_manifest("drop", None, json!({"v": "1"})));
        }
        json!({"targets": [{"clusterName": "east"}, {"clusterName": "west"}],
            "defaultNamespace": target,
            "downstreamResources": [{"kind": "Secret", "name": "db-creds"}],
            "resources": resources})
    };
    ws.bundle("app", spec("1", true)).await;
    ws.ready("east", "app").await;
    ws.ready("west", "app").await;
    let keep = cm_uid(&down, &target, "keep").await;

    let old_id = ws.bds("west").get("app").await.unwrap().spec.deployment_id;
    east.kill().await;
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    ws.bundle("app", spec("2", false)).await;
    // West follows; east's cluster keeps exactly what it had while its agent is away.
    let west_bds = ws.bds("west");
    eventually("west's deployment of the edit", WAIT, || async {
        let bd = west_bds.get("app").await?;
        Ok::<_, kube::Error>((bd.spec.deployment_id != old_id).then_some(()))
    })
    .await;
    ws.ready("west", "app").await;
    let west_down = ws.downstream(&west.downstream).await;
    assert!(cm(&west_down, &target, "drop").await.is_none());
    let snapshot = || async {
        let keep = cm(&down, &target, "keep")
            .await
            .and_then(|c| c.data)
            .map(|d| d["v"].clone());
        let drop = cm(&down, &target, "drop").await.is_some();
        let password = Api::<Secret>::namespaced(down.clone(), &target)
            .get_opt("db-creds")
            .await
            .unwrap()
            .and_then(|s| secret_value(&s, "password"));
        (keep, drop, password)
    };
    // Nothing downstream can change while the agent is down (only it writes there in pull
    // mode); what an agent does on its return is e2e/tests/agent_return.rs. Here: as before.
    assert_eq!(
        snapshot().await,
        (Some("1".to_string()), true, Some("v1".to_string()))
    );
    let bd = ws.bds("east").get("app").await.unwrap();
    assert_ne!(
        bd.status.as_ref().unwrap().applied_deployment_id.as_deref(),
        Some(bd.spec.deployment_id.as_str()),
        "east has not applied the edit"
    );

    east.restart().await;
    ws.ready("east", "app").await;
    assert_eq!(
        snapshot().await,
        (Some("2".to_string()), false, Some("v2".to_string()))
    );
    assert_eq!(
        cm_uid(&down, &target, "keep").await,
        keep,
        "updated in place"
    );
    bystander_untouched(&down, &target, &by).await;
}
