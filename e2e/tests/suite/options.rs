//! Bundle options end to end on real clusters: `takeOwnership`, `paused`, `targetNamespace`
//! (including a per-target override) and `correctDrift` left at its default.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use serde_json::json;
use tender_e2e::fixture::{
    Workspace, app_bundle, create_namespace, secret, secret_value, stays, wait_secret,
};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_READY, find_condition, reason};
use tender_types::{Bundle, labels};

const WAIT: std::time::Duration = tender_e2e::fixture::WAIT;

#[tokio::test]
async fn take_ownership_adopts_an_unmanaged_object() {
    let ws = Workspace::new(shared_env(2).await, "opt-adopt").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let target = unique_name("apps");
    let down = ws.downstream(&east.downstream).await;
    create_namespace(&down, &target).await;
    let hand_made = Api::<Secret>::namespaced(down.clone(), &target)
        .create(
            &PostParams::default(),
            &secret("db-creds", &[("password", "hand-made")]),
        )
        .await
        .unwrap();
    assert!(hand_made.metadata.uid.is_some());
    ws.source_secret("db-creds", &[("password", "from-hub")])
        .await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let mut spec = app_bundle(&["east"], &target);
    spec["takeOwnership"] = json!(true);
    ws.bundle("app", spec).await;
    ws.ready("east", "app").await;
    let adopted = wait_secret(&down, &target, "db-creds", "the adopted Secret", |s| {
        secret_value(s, "password").as_deref() == Some("from-hub")
    })
    .await;
    let owner = adopted
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::OWNER_ANNOTATION).cloned());
    assert_eq!(
        owner,
        Some(labels::bundle_deployment_owner(
            &ws.cluster_ns("east"),
            "app"
        )),
        "the adopted Secret carries tender's ownership"
    );
    // Adopted in place: the same object (uid), not deleted and created anew.
    assert_eq!(
        adopted.metadata.uid, hand_made.metadata.uid,
        "the adopted Secret is the hand-made one, not a replacement"
    );
    let metrics = &east.handle().metrics;
    assert_eq!(
        (
            metrics.writes_of("recreate", "Secret"),
            metrics.writes_of("delete", "Secret")
        ),
        (0, 0),
        "the agent neither recreated nor deleted a Secret to adopt it"
    );
    assert!(metrics.writes_of("apply", "Secret") >= 1);
}

#[tokio::test]
async fn paused_bundle_holds_changes_until_unpaused() {
    let ws = Workspace::new(shared_env(2).await, "opt-pause").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let target = unique_name("apps");
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    ws.ready("east", "app").await;
    let down = ws.downstream(&east.downstream).await;

    let mut spec = app_bundle(&["east"], &target);
    spec["paused"] = json!(true);
    ws.bundle("app", spec).await;
    let bds = ws.bds("east");
    eventually(
        "the BundleDeployment to carry spec.paused",
        WAIT,
        || async { Ok::<_, kube::Error>(bds.get("app").await?.spec.paused.then_some(())) },
    )
    .await;
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually("the Bundle to say it is paused", WAIT, || async {
        let b = bundles.get("app").await?;
        let paused = b.status.as_ref().is_some_and(|s| {
            find_condition(&s.conditions, TYPE_READY).is_some_and(|c| c.reason == reason::PAUSED)
        });
        Ok::<_, kube::Error>(paused.then_some(()))
    })
    .await;

    // A rotation while paused: the hub records it, the downstream Secret stays as it was.
    let secrets: Api<Secret> = Api::namespaced(down.clone(), &target);
    let before = secrets.get("db-creds").await.unwrap();
    assert_eq!(secret_value(&before, "password").as_deref(), Some("one"));
    let metrics = east.handle().metrics.clone();
    let secret_writes = move || {
        (
            metrics.writes_of("apply", "Secret"),
            metrics.writes_of("recreate", "Secret"),
        )
    };
    let writes_before = secret_writes();
    ws.source_secret("db-creds", &[("password", "two")]).await;
    // The hub writes the rotated copy (a rotation changes the copy, not the
    // BundleDeployment: decision 0089-signed-copies).
    let bd = bds.get("app").await.unwrap();
    let copy_name = bd
        .spec
        .options
        .downstream_resources
        .iter()
        .find(|c| c.name == "db-creds")
        .map(|c| c.copy_name.clone())
        .unwrap();
    let copies: Api<Secret> = Api::namespaced(ws.hub.clone(), &ws.cluster_ns("east"));
    eventually("the rotated copy on the hub", WAIT, || async {
        let copy = copies.get(&copy_name).await?;
        Ok::<_, kube::Error>(
            (secret_value(&copy, "password").as_deref() == Some("two")).then_some(()),
        )
    })
    .await;
    // A window for a wrong apply: the downstream Secret keeps its value and version, and the
    // agent writes no Secret, from before the rotation to the end of the window.
    stays(
        "the paused Secret downstream and the agent's Secret writes",
        std::time::Duration::from_secs(3),
        &(
            Some("one".to_string()),
            before.metadata.resource_version.clone(),
            writes_before,
        ),
        || async {
            let during = secrets.get("db-creds").await.unwrap();
            (
                secret_value(&during, "password"),
                during.metadata.resource_version,
                secret_writes(),
            )
        },
    )
    .await;

    ws.bundle("app", app_bundle(&["east"], &target)).await;
    wait_secret(
        &down,
        &target,
        "db-creds",
        "the held rotation after unpausing",
        |s| secret_value(s, "password").as_deref() == Some("two"),
    )
    .await;
    ws.ready("east", "app").await;
}

#[tokio::test]
async fn target_namespace_overrides_and_per_target_overrides_apply() {
    let ws = Workspace::new(shared_env(2).await, "opt-ns").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let forced = unique_name("forced");
    let east_ns = unique_name("east-only");
    let spec = json!({
        // east gets its own targetNamespace; west falls through to the Bundle's.
        "targets": [
            {"clusterName": "east", "targetNamespace": east_ns},
            {"clusterName": "west"}
        ],
        "targetNamespace": forced,
        "downstreamResources": [{"kind": "Secret", "name": "db-creds"}],
        "resources": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            // An explicit namespace is overridden by targetNamespace.
            "metadata": {"name": "pinned", "namespace": "somewhere-else"},
            "data": {"k": "v"}
        }]
    });
    ws.bundle("app", spec).await;
    for (cluster, agent, ns) in [("east", &east, &east_ns), ("west", &west, &forced)] {
        ws.ready(cluster, "app").await;
        let down = ws.downstream(&agent.downstream).await;
        Api::<Secret>::namespaced(down.clone(), ns)
            .get("db-creds")
            .await
            .unwrap_or_else(|e| panic!("{cluster}: copy not in {ns}: {e}"));
        Api::<ConfigMap>::namespaced(down.clone(), ns)
            .get("pinned")
            .await
            .unwrap_or_else(|e| panic!("{cluster}: manifest not in {ns}: {e}"));
        assert!(
            Api::<ConfigMap>::namespaced(down, "somewhere-else")
                .get_opt("pinned")
                .await
                .unwrap()
                .is_none(),
            "{cluster}: targetNamespace must override the manifest's own namespace"
        );
    }
}
