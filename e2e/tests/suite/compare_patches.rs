//! `diff.comparePatches` end to end: a field another field manager owns (an HPA's
//! `spec.replicas`) is neither applied nor corrected as drift, while the rest of the object
//! still is; without the entry the same change is reverted (so the test can fail).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tender_e2e::fixture::{WAIT, Workspace, stays};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};

/// The field manager playing the HorizontalPodAutoscaler.
const HPA: &str = "horizontal-pod-autoscaler-player";
/// Longer than a drift correction takes (the agent watches its objects: a second or two).
const WINDOW: Duration = Duration::from_secs(12);

fn web_bundle(target: &str, compare_patches: bool) -> Value {
    let mut spec = json!({
        "targets": [{"clusterName": "east"}],
        "defaultNamespace": target,
        "resources": [{
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "minReadySeconds": 5,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}
                }
            }
        }]
    });
    if compare_patches {
        spec["diff"] = json!({"comparePatches": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "namespace": target,
            "operations": [{"op": "remove", "path": "/spec/replicas"}]
        }]});
    }
    spec
}

/// Waits until the BundleDeployment of `web` on east has its current deploymentID applied.
async fn applied(ws: &Workspace) {
    let api = ws.bds("east");
    eventually("web applied on east", WAIT, || async {
        let bd = api.get_opt("web").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| {
            bd.status
                .as_ref()
                .and_then(|s| s.applied_deployment_id.as_deref())
                == Some(bd.spec.deployment_id.as_str())
        }))
    })
    .await;
}

async fn scale(deployments: &Api<Deployment>, replicas: i32) {
    deployments
        .patch(
            "web",
            &PatchParams {
                field_manager: Some(HPA.into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

async fn fields(deployments: &Api<Deployment>) -> (Option<i32>, Option<i32>) {
    let d = deployments.get("web").await.unwrap();
    let spec = d.spec.unwrap_or_default();
    (spec.replicas, spec.min_ready_seconds)
}

#[tokio::test]
async fn replicas_owned_by_another_manager_are_left_alone() {
    let ws = Workspace::new(shared_env(1).await, "compare-patches").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let target = unique_name("cp");
    ws.bundle("web", web_bundle(&target, true)).await;
    applied(&ws).await;
    let down = ws.downstream(&east.downstream).await;
    let deployments: Api<Deployment> = Api::namespaced(down, &target);

    // tender never set replicas: the apiserver's default, until the "HPA" scales.
    let d = deployments.get("web").await.unwrap();
    let managers: Vec<String> = d
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:spec"].get("f:replicas").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.iter().any(|m| m.starts_with("tender")),
        "tender's field manager holds spec.replicas: {managers:?}"
    );

    scale(&deployments, 3).await;
    stays(
        "replicas the HPA set, with minReadySeconds as deployed",
        WINDOW,
        &(Some(3), Some(5)),
        || fields(&deployments),
    )
    .await;

    // Another field of the same object is still drift, and corrected.
    deployments
        .patch(
            "web",
            &PatchParams {
                field_manager: Some("someone".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"minReadySeconds": 9}})),
        )
        .await
        .unwrap();
    eventually("minReadySeconds restored", WAIT, || async {
        let f = fields(&deployments).await;
        Ok::<_, kube::Error>((f.1 == Some(5)).then_some(f))
    })
    .await;
    assert_eq!(fields(&deployments).await, (Some(3), Some(5)));

    // Without the entry tender applies replicas again, and reverts the HPA's change.
    ws.bundle("web", web_bundle(&target, false)).await;
    applied(&ws).await;
    eventually("replicas applied from the Bundle", WAIT, || async {
        Ok::<_, kube::Error>((fields(&deployments).await.0 == Some(2)).then_some(()))
    })
    .await;
    scale(&deployments, 3).await;
    eventually("the HPA's replicas reverted as drift", WAIT, || async {
        Ok::<_, kube::Error>((fields(&deployments).await.0 == Some(2)).then_some(()))
    })
    .await;
}

/// Only `remove` has a meaning: another operation is refused at admission, naming why.
#[tokio::test]
async fn an_operation_other_than_remove_is_refused() {
    let ws = Workspace::new(shared_env(1).await, "compare-patches-bad").await;
    let mut spec = web_bundle("apps", true);
    spec["diff"]["comparePatches"][0]["operations"][0]["op"] = json!("replace");
    let body = json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
        "metadata": {"name": "web"}, "spec": spec
    });
    let err = Api::<tender_types::Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .patch("web", &PatchParams::apply("e2e"), &Patch::Apply(&body))
        .await
        .expect_err("op replace");
    assert!(
        err.to_string().contains("operations[].op must be remove"),
        "{err}"
    );
}
