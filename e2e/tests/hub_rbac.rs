//! The hub with exactly the chart's RBAC (issue 14): the real `tender-hub` binary started from
//! the chart's rendered Deployment, as the chart's ServiceAccount (token from the TokenRequest
//! API, never admin), runs the core scenarios — Cluster provisioning, targeting, copies,
//! rotation, untargeting, Cluster deletion and a push cluster — and its log holds no RBAC
//! refusal. The chart has no `escalate` and no `bind` (see `charts.rs`), so any permission the
//! hub grants agents without holding it shows up here as a 403.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tender_e2e::apply::apply_yaml;
use tender_e2e::binaries::tender_binaries;
use tender_e2e::fixture::{WAIT, Workspace, app_bundle, secret_value, wait_secret};
use tender_e2e::local_pod::local_pod;
use tender_e2e::{
    ADMIN_USER, HUB, Process, downstream_name, ensure_helm, eventually, shared_env, unique_name,
};
use tender_types::Cluster;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn the_hub_runs_its_core_scenarios_with_exactly_the_charts_rbac() {
    let env = shared_env(2).await;
    let ws = Workspace::without_hub(env, "rbac").await;
    let bins = tokio::task::spawn_blocking(tender_binaries)
        .await
        .unwrap()
        .expect("building the binaries");
    let helm = tokio::task::spawn_blocking(ensure_helm)
        .await
        .unwrap()
        .expect("building helm");

    // The chart, rendered by the real Helm and applied: ServiceAccount, ClusterRole(Binding),
    // Deployment — serving only this test's workspace.
    let release_ns = unique_name("tender-system");
    Api::<Namespace>::all(ws.hub.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(release_ns.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let chart =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/charts/tender-hub");
    let out = Command::new(&helm)
        .args([
            "template",
            "tender-hub",
            chart.to_str().unwrap(),
            "-n",
            &release_ns,
        ])
        .args(["--set", &format!("workspaceNamespaces={{{}}}", ws.ns)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    apply_yaml(&ws.hub, &String::from_utf8(out.stdout).unwrap())
        .await
        .unwrap();
    let deployment = Api::<Deployment>::namespaced(ws.hub.clone(), &release_ns)
        .get("tender-hub")
        .await
        .unwrap();
    let work = env.state_dir().join(unique_name("hub-rbac"));
    let mut pod = local_pod(
        &ws.hub,
        &env.cluster(HUB).server,
        env.ca_pem(),
        &deployment,
        "tender-hub-0",
        &work.join("pod"),
    )
    .await
    .unwrap();
    pod.set_flag("--metrics-addr", &format!("127.0.0.1:{}", free_port()));
    let kubeconfig = pod.kubeconfig.display().to_string();
    pod.set_flag("--kubeconfig", &kubeconfig);
    pod.set_flag("--push-probe-seconds", "1");
    let log = work.join("tender-hub.log");
    let mut hub =
        Process::start_with_env("tender-hub", &bins.hub, &pod.args, &pod.env, &log).unwrap();

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

    // The hub ran all of it with the chart's rights: no refusal in its log.
    assert!(hub.exited().is_none(), "tender-hub exited");
    hub.stop(Duration::from_secs(10));
    let text = std::fs::read_to_string(&log).unwrap();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("forbidden") || l.contains("403") || l.contains("unauthorized")
        })
        .collect();
    assert!(
        refused.is_empty(),
        "tender-hub was refused with the chart's RBAC:\n{}",
        refused.join("\n")
    );
    assert!(text.lines().count() > 5, "the hub logged its work:\n{text}");
}
