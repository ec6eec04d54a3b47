//! Issue 24, items 1 and 2: a HelmOp as a Fleet user writes it — `targets[].helm` values,
//! `${ }` values templates over the Cluster's labels and `templateValues`, `doNotDeploy`,
//! `namespaceLabels`/`namespaceAnnotations` — on a real hub with two real agents. Each
//! cluster gets its own rendered values; a template that fails (a label the Cluster lacks)
//! blocks only that cluster, named with the value's path, until the label arrives.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tender_e2e::charts::ChartRepo;
use tender_e2e::fixture::{WAIT, Workspace, stays};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_READY, find_condition, reason};
use tender_types::{Cluster, HelmOp};

const USER: &str = "chart-reader";
const PASSWORD: &str = "repo-pass-123";

async fn patch_cluster(ws: &Workspace, name: &str, patch: Value) {
    Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Fleet's shape: the chart's values template the cluster's name and `env` label; the `prod`
/// target merges its own values (templating `.ClusterValues`); `broken` reads a label it
/// lacks; `tier=skip` clusters get nothing.
fn helmop(repo: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
        "metadata": {"name": "web"},
        "spec": {
            "helm": {
                "releaseName": "web", "repo": repo, "chart": "app", "version": "0.1.0",
                "values": {"greeting": "hello-${ .ClusterLabels.env }-${ .ClusterName }"}
            },
            "helmSecretName": "repo-auth",
            "namespace": ns,
            "namespaceLabels": {"team": "web"},
            "namespaceAnnotations": {"example.com/owner": "platform"},
            "targets": [
                {"name": "skip", "clusterSelector": {"matchLabels": {"tier": "skip"}}, "doNotDeploy": true},
                {"name": "prod", "clusterSelector": {"matchLabels": {"env": "prod"}},
                 "helm": {"values": {"greeting": "prod-${ .ClusterValues.region | upper }"}}},
                {"name": "broken", "clusterName": "broken",
                 "helm": {"values": {"greeting": "${ .ClusterLabels.zone }"}}},
                {"name": "rest", "clusterSelector": {}}
            ]
        }
    })
}

async fn greeting(api: &Api<ConfigMap>) -> Option<String> {
    api.get_opt("web-config")
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data.and_then(|d| d.get("greeting").cloned()))
}

async fn wait_greeting(api: &Api<ConfigMap>, want: &str) {
    eventually(&format!("greeting = {want}"), WAIT, || async {
        Ok::<_, kube::Error>((greeting(api).await.as_deref() == Some(want)).then_some(()))
    })
    .await;
}

#[tokio::test]
async fn target_values_and_templates_render_per_cluster_and_a_failing_template_blocks_only_its_cluster()
 {
    let repo = ChartRepo::start(&["0.1.0"], USER, PASSWORD)
        .await
        .expect("chart repository");
    let ws = Workspace::new(shared_env(2).await, "fleet-targets").await;
    let (_east, _west) = (
        ws.helm_agent("east", &downstream_name(1)).await,
        ws.helm_agent("west", &downstream_name(2)).await,
    );
    patch_cluster(
        &ws,
        "east",
        json!({"metadata": {"labels": {"env": "prod"}}, "spec": {"templateValues": {"region": "eu-1"}}}),
    )
    .await;
    patch_cluster(&ws, "west", json!({"metadata": {"labels": {"env": "dev"}}})).await;
    // Two Clusters without agents: what the hub writes for them is the proof.
    ws.cluster_labelled("broken", &[("env", "staging")], json!({}))
        .await;
    ws.cluster_labelled("skipped", &[("tier", "skip")], json!({}))
        .await;
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;

    let ns = unique_name("fleet-web");
    Api::<HelmOp>::namespaced(ws.hub.clone(), &ws.ns)
        .patch(
            "web",
            &PatchParams::apply("e2e"),
            &Patch::Apply(&helmop(&repo.url, &ns)),
        )
        .await
        .unwrap();

    let down: Vec<kube::Client> = vec![
        ws.downstream(&downstream_name(1)).await,
        ws.downstream(&downstream_name(2)).await,
    ];
    let east = Api::<ConfigMap>::namespaced(down[0].clone(), &ns);
    let west = Api::<ConfigMap>::namespaced(down[1].clone(), &ns);
    // The prod target's values, templated with east's templateValues; west the HelmOp's,
    // templated with its own label and name.
    wait_greeting(&east, "prod-EU-1").await;
    wait_greeting(&west, "hello-dev-west").await;

    // The namespace the agent created carries namespaceLabels and namespaceAnnotations.
    for d in &down {
        let n = Api::<Namespace>::all(d.clone()).get(&ns).await.unwrap();
        assert_eq!(n.metadata.labels.as_ref().unwrap()["team"], "web");
        assert_eq!(
            n.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
            "tender"
        );
        assert_eq!(
            n.metadata.annotations.as_ref().unwrap()["example.com/owner"],
            "platform"
        );
    }

    // `broken` fails alone, named with the path; the HelmOp says so; no value is quoted.
    let helmops = Api::<HelmOp>::namespaced(ws.hub.clone(), &ws.ns);
    let cond = eventually("HelmOp reports the failing template", WAIT, || async {
        let h = helmops.get("web").await?;
        let c = h
            .status
            .and_then(|s| find_condition(&s.conditions, TYPE_READY).cloned());
        Ok::<_, kube::Error>(c.filter(|c| c.reason == reason::VALUES_TEMPLATE_FAILED))
    })
    .await;
    assert!(
        cond.message.contains(
            "broken: helm.values.greeting: map has no entry for key \"zone\" at .ClusterLabels.zone"
        ),
        "{}",
        cond.message
    );
    assert!(!cond.message.contains("skipped") && !cond.message.contains("east"));
    assert!(!cond.message.contains("hello") && !cond.message.contains("prod-"));
    // Nothing is written for `broken` (its template failed) nor `skipped` (doNotDeploy).
    for c in ["broken", "skipped"] {
        stays(
            &format!("no BundleDeployment for {c}"),
            std::time::Duration::from_secs(3),
            &None::<String>,
            || async {
                ws.bds(c)
                    .get_opt("web")
                    .await
                    .unwrap()
                    .map(|b| b.spec.deployment_id)
            },
        )
        .await;
    }

    // The label arrives: `broken` gets its BundleDeployment, with the rendered value.
    patch_cluster(
        &ws,
        "broken",
        json!({"metadata": {"labels": {"zone": "z1"}}}),
    )
    .await;
    let bd = eventually("broken's BundleDeployment written", WAIT, || async {
        ws.bds("broken").get_opt("web").await
    })
    .await;
    let values = &bd.spec.helm.as_ref().unwrap().values.as_ref().unwrap().0;
    assert_eq!(values["greeting"], json!("z1"));
    assert!(
        ws.bds("skipped").get_opt("web").await.unwrap().is_none(),
        "doNotDeploy still holds"
    );
}
