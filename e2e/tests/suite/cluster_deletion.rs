//! Deleting a Cluster (decision 0068-deleted-cluster-waits-for-agent): while its agent reports in,
//! the hub deletes the cluster's BundleDeployments first and waits for the agent to remove what it
//! deployed before it strips the agent's finalizers and removes the cluster namespace (and with it
//! the agent's identity); an agent that does not report in is not waited for, and then nothing is
//! deleted downstream. Other clusters are untouched either way.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tender_e2e::fixture::{WAIT, Workspace, app_bundle, stays};
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::proxy::WriteGate;
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::Cluster;
use tender_types::conditions::{TYPE_AGENT_CONNECTED, is_true};

/// The uids of the Bundle's three objects in `target` on a downstream cluster (copied Secret,
/// copied ConfigMap, the ConfigMap manifest); `None` where one is missing.
async fn objects(down: &kube::Client, target: &str) -> [Option<String>; 3] {
    let secrets: Api<Secret> = Api::namespaced(down.clone(), target);
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), target);
    [
        secrets
            .get_opt("db-creds")
            .await
            .unwrap()
            .and_then(|s| s.uid()),
        cms.get_opt("app-config")
            .await
            .unwrap()
            .and_then(|c| c.uid()),
        cms.get_opt("app-settings")
            .await
            .unwrap()
            .and_then(|c| c.uid()),
    ]
}

/// Deletes Cluster `name` and waits until it and its namespace are gone.
async fn delete_cluster(ws: &Workspace, name: &str) {
    Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(ws, name).await;
}

/// Waits until Cluster `name` and its namespace are gone.
async fn wait_deleted(ws: &Workspace, name: &str) {
    let ns = ws.cluster_ns(name);
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually(&format!("Cluster {name} gone"), WAIT, || async {
        Ok::<_, kube::Error>(clusters.get_opt(name).await?.is_none().then_some(()))
    })
    .await;
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    eventually("its namespace gone", WAIT, || async {
        Ok::<_, kube::Error>(namespaces.get_opt(&ns).await?.is_none().then_some(()))
    })
    .await;
}

#[tokio::test]
async fn a_cluster_deleted_while_its_agent_runs_has_its_deployed_objects_removed() {
    let ws = Workspace::new(shared_env(2).await, "delete-live").await;
    // East's agent reaches its cluster through a gate that can hold its downstream writes, so
    // its cleanup can be made slow: the hub must wait for it, not race it.
    let gate = WriteGate::start(ws.downstream(&downstream_name(1)).await)
        .await
        .unwrap();
    let east = ws.agent_through("east", &downstream_name(1), &gate).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    let target = unique_name("delete-live");
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    ws.bundle("app", app_bundle(&["east", "west"], &target))
        .await;
    ws.ready("east", "app").await;
    let west_bd = ws.ready("west", "app").await;
    let east_down = ws.downstream(&east.downstream).await;
    let west_down = ws.downstream(&west.downstream).await;
    assert!(
        objects(&east_down, &target)
            .await
            .iter()
            .all(Option::is_some)
    );
    let west_before = objects(&west_down, &target).await;
    assert!(west_before.iter().all(Option::is_some));

    gate.hold_writes_after(0);
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    clusters
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the agent's downstream delete held at the gate",
        WAIT,
        || {
            let held = gate.holding();
            async move {
                Ok::<_, std::convert::Infallible>(
                    held.iter().any(|r| r.starts_with("DELETE ")).then_some(()),
                )
            }
        },
    )
    .await;
    // While the agent's cleanup is held, the Cluster and its namespace (the agent's identity)
    // stay: the hub waits for it.
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    let ns = ws.cluster_ns("east");
    stays(
        "the deleted Cluster and its namespace while the agent cleans up",
        Duration::from_secs(4),
        &(true, true),
        || async {
            (
                clusters.get_opt("east").await.unwrap().is_some(),
                namespaces.get_opt(&ns).await.unwrap().is_some(),
            )
        },
    )
    .await;
    gate.release();
    wait_deleted(&ws, "east").await;
    // Gone before the Cluster was: the hub waited for the agent's cleanup.
    assert_eq!(
        objects(&east_down, &target).await,
        [None, None, None],
        "the deleted cluster's objects downstream"
    );
    // The other cluster keeps everything, same objects.
    assert_eq!(ws.ready("west", "app").await.uid(), west_bd.uid());
    assert_eq!(objects(&west_down, &target).await, west_before);
}

#[tokio::test]
async fn a_cluster_deleted_while_its_agent_is_offline_deletes_nothing_downstream() {
    let ws = Workspace::without_hub(shared_env(2).await, "delete-offline").await;
    let mut config = hub_config(&ws.ns);
    config.agent_offline_after = Duration::from_secs(4);
    let hub = start_hub(ws.env, config).await.unwrap();
    let mut east = ws.agent("east", &downstream_name(1)).await;
    let target = unique_name("delete-offline");
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    ws.ready("east", "app").await;
    let east_down = ws.downstream(&east.downstream).await;
    let before = objects(&east_down, &target).await;
    assert!(before.iter().all(Option::is_some));

    east.kill().await;
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually("east AgentOffline", WAIT, || async {
        let c = clusters.get("east").await?;
        let offline = c
            .status
            .is_some_and(|s| !is_true(&s.conditions, TYPE_AGENT_CONNECTED));
        Ok::<_, kube::Error>(offline.then_some(()))
    })
    .await;
    let started = std::time::Instant::now();
    delete_cluster(&ws, "east").await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "an offline agent is not waited for: {:?}",
        started.elapsed()
    );
    // Unreachable is never a reason to delete: everything stays downstream — also once the
    // agent is back, its identity gone with the Cluster (e2e/tests/agent_return.rs: the real
    // binary, and an identity that outlives the Cluster).
    east.restart().await;
    stays(
        "the offline cluster's objects downstream",
        Duration::from_secs(3),
        &before,
        || objects(&east_down, &target),
    )
    .await;
    hub.stop().await.unwrap();
}
