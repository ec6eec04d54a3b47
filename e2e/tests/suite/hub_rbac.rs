//! The hub with exactly the chart's RBAC (issue 14): the real `tender-hub` binary started from
//! the chart's rendered Deployment, as the chart's ServiceAccount (token from the TokenRequest
//! API, never admin), runs the core scenarios — Cluster provisioning, targeting, copies,
//! rotation, untargeting, Cluster deletion and a push cluster — and its log holds no RBAC
//! refusal. The chart has no `escalate` and no `bind` (see `charts.rs`), so any permission the
//! hub grants agents without holding it shows up here as a 403.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tender_e2e::fixture::{WAIT, Workspace, app_bundle, secret_value, wait_secret};
use tender_e2e::running::{Running, install_hub_chart};
use tender_e2e::{ADMIN_USER, HUB, downstream_name, eventually, shared_env, unique_name};
use tender_types::Cluster;

#[tokio::test]
async fn the_hub_runs_its_core_scenarios_with_exactly_the_charts_rbac() {
    let env = shared_env(2).await;
    let ws = Workspace::without_hub(env, "rbac").await;
    // The chart, rendered by the real Helm and applied: ServiceAccount, ClusterRole(Binding),
    // Deployment — serving only this test's workspace; its container run as a process.
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let mut hub = Running::start(
        env,
        HUB,
        &deployment,
        "tender-hub-0",
        &[("--push-probe-seconds", "1")],
    )
    .await;

    // Sources, a pull cluster with its agent, a push cluster and a cluster without agent.
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    ws.cluster("idle").await;
    let _agent = ws.agent("pulled", &downstream_name(1)).await;
    let push_kubeconfig = env.kubeconfig_as(&downstream_name(2), ADMIN_USER);
    Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .patch(
            "push-kubeconfig",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&Secret {
                metadata: ObjectMeta {
                    name: Some("push-kubeconfig".into()),
                    ..Default::default()
                },
                string_data: Some(BTreeMap::from([("value".to_string(), push_kubeconfig)])),
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
                "metadata": {"name": "pushed", "labels": {"env": "test"}},
                "spec": {"kubeconfigSecretRef": {"name": "push-kubeconfig"}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    // Targeting and copies: every cluster gets its BundleDeployment; pull and push deploy.
    let target_ns = unique_name("rbac-app");
    ws.bundle("app", app_bundle(&["pulled", "pushed", "idle"], &target_ns))
        .await;
    ws.ready("pulled", "app").await;
    ws.ready("pushed", "app").await;
    eventually("the idle cluster's BundleDeployment", WAIT, || async {
        Ok::<_, kube::Error>(ws.bds("idle").get_opt("app").await?.map(|_| ()))
    })
    .await;

    // Rotation reaches both deploying clusters.
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    for n in [1, 2] {
        let down = ws.downstream(&downstream_name(n)).await;
        wait_secret(
            &down,
            &target_ns,
            "db-creds",
            "rotated copy downstream",
            |s| secret_value(s, "password").as_deref() == Some("v2"),
        )
        .await;
    }

    // Untargeting deletes the BundleDeployment (held by the agent's finalizer: no agent runs
    // for this cluster; the Cluster deletion below releases it).
    ws.bundle("app", app_bundle(&["pulled", "pushed"], &target_ns))
        .await;
    eventually("the untargeted BundleDeployment deleted", WAIT, || async {
        let bd = ws.bds("idle").get_opt("app").await?;
        let deleted = bd.is_none_or(|bd| bd.metadata.deletion_timestamp.is_some());
        Ok::<_, kube::Error>(deleted.then_some(()))
    })
    .await;

    // Cluster deletion: the hub removes its finalizer and the cluster namespace.
    clusters
        .delete("idle", &DeleteParams::default())
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    let idle_ns = ws.cluster_ns("idle");
    eventually(
        "the deleted Cluster and its namespace gone",
        WAIT,
        || async {
            let cluster = clusters.get_opt("idle").await?;
            let ns = namespaces.get_opt(&idle_ns).await?;
            let terminating = ns
                .as_ref()
                .and_then(|n| n.metadata.deletion_timestamp.as_ref())
                .is_some();
            Ok::<_, kube::Error>((cluster.is_none() && (ns.is_none() || terminating)).then_some(()))
        },
    )
    .await;

    // The hub ran all of it with the chart's rights.
    hub.assert_running();
    // Counted where refusals happen: the hub apiserver's audit log holds requests of the
    // chart's ServiceAccount and no 401/403 answer to it.
    let service_account = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .unwrap();
    env.audit(HUB).assert_never_refused(
        &tender_e2e::audit::service_account_user(
            &deployment.metadata.namespace.clone().unwrap(),
            &service_account,
        ),
        "tender-hub with the chart's RBAC",
    );
    // No refusal in its log either.
    let refused = hub.refusals();
    assert!(
        refused.is_empty(),
        "tender-hub was refused with the chart's RBAC:\n{}",
        refused.join("\n")
    );
    assert!(
        hub.log().lines().count() > 5,
        "the hub logged its work:\n{}",
        hub.log()
    );
}
