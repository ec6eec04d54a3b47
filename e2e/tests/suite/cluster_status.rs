//! A Cluster's status while a new version rolls out (decision 0066-rollout-summary-delay): the hub
//! keeps the Cluster's written summary while its ready BundleDeployments wait for their agent to
//! apply a new version, so a rotation that completes within `cluster_rollout_summary_delay` writes
//! no Cluster status; a rollout still waiting after it is shown (never hidden), and the Cluster is
//! Ready again once the agent has applied it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use tender_e2e::fixture::{Workspace, settled, stays};
use tender_e2e::hub_harness::{HubHandle, hub_config, start_hub};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::Cluster;
use tender_types::conditions::{TYPE_READY, find_condition};

const ROLLOUT_DELAY: Duration = Duration::from_secs(12);

/// The Cluster's `(display state, ready bundles, Ready reason)`.
async fn shown(ws: &Workspace, name: &str) -> kube::Result<(String, String, String)> {
    let c = Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .get(name)
        .await?;
    let status = c.status.unwrap_or_default();
    let display = status.display.unwrap_or_default();
    let reason = find_condition(&status.conditions, TYPE_READY)
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    Ok((display.state, display.ready_bundles, reason))
}

/// The hub's Cluster status writes so far.
fn cluster_status_writes(hub: &HubHandle) -> u64 {
    hub.write_series()
        .iter()
        .filter(|(_, resource, sub, _)| resource == "clusters" && sub == "status")
        .map(|s| s.3)
        .sum()
}

fn ready_state() -> (String, String, String) {
    ("Ready".into(), "1/1".into(), "Ready".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_keeps_the_cluster_status_until_it_outlasts_the_rollout_delay() {
    let ws = Workspace::without_hub(shared_env(2).await, "rollout").await;
    let mut config = hub_config(&ws.ns);
    config.cluster_rollout_summary_delay = ROLLOUT_DELAY;
    let hub = start_hub(ws.env, config).await.unwrap();
    let mut east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("creds", &[("password", "v1")]).await;
    let target = unique_name("rollout");
    ws.bundle(
        "app",
        json!({"targets": [{"clusterName": "east"}],
               "defaultNamespace": target,
               "downstreamResources": [{"kind": "Secret", "name": "creds"}],
               "resources": []}),
    )
    .await;
    ws.ready("east", "app").await;
    eventually(
        "the Cluster shows 1/1 Ready",
        Duration::from_secs(30),
        || async {
            Ok::<_, kube::Error>((shown(&ws, "east").await? == ready_state()).then_some(()))
        },
    )
    .await;
    let quiet = Duration::from_secs(2) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY;
    settled("the hub's Cluster status writes", quiet, || async {
        cluster_status_writes(&hub)
    })
    .await;

    // A rotation the agent applies at once: no Cluster status write at all.
    let before = cluster_status_writes(&hub);
    // A rotation changes the copy, not the BundleDeployment: the agent reports the copies it
    // applied in `appliedCopiesID` (decision 0089-signed-copies).
    let applied_copies = |bd: &tender_types::BundleDeployment| {
        bd.status.as_ref().and_then(|s| s.applied_copies_id.clone())
    };
    let deployed = applied_copies(&ws.bds("east").get("app").await.unwrap());
    ws.source_secret("creds", &[("password", "v2")]).await;
    eventually("the rotation applied", Duration::from_secs(30), || async {
        let bd = ws.bds("east").get("app").await?;
        let now = applied_copies(&bd);
        Ok::<_, kube::Error>((now.is_some() && now != deployed).then_some(()))
    })
    .await;
    stays(
        "the Cluster status through an applied rotation",
        quiet,
        &(ready_state(), before),
        || async {
            (
                shown(&ws, "east").await.unwrap(),
                cluster_status_writes(&hub),
            )
        },
    )
    .await;

    // The agent is away: the rollout waits on it. Past the summary delay the Cluster still
    // shows what was written (the old code wrote WaitApplied after 5 s) ...
    east.kill().await;
    let bd = ws.bds("east").get("app").await.unwrap();
    let copy_name = bd.spec.options.downstream_resources[0].copy_name.clone();
    let copies: Api<Secret> = Api::namespaced(ws.hub.clone(), &bd.namespace().unwrap());
    ws.source_secret("creds", &[("password", "v3")]).await;
    eventually(
        "the hub to write the new version",
        Duration::from_secs(30),
        || async {
            let copy = copies.get(&copy_name).await?;
            let v3 = copy
                .data
                .and_then(|d| d.get("password").map(|p| p.0 == b"v3"))
                .unwrap_or(false);
            Ok::<_, kube::Error>(v3.then_some(()))
        },
    )
    .await;
    let rewritten = std::time::Instant::now();
    stays(
        "the Cluster status while the rollout is younger than the rollout delay",
        tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY + Duration::from_secs(3),
        &(ready_state(), before),
        || async {
            (
                shown(&ws, "east").await.unwrap(),
                cluster_status_writes(&hub),
            )
        },
    )
    .await;
    // ... and once the rollout outlasts the rollout delay, it is shown.
    eventually(
        "the Cluster to show the waiting rollout",
        ROLLOUT_DELAY + Duration::from_secs(20),
        || async {
            let (state, ready, reason) = shown(&ws, "east").await?;
            Ok::<_, kube::Error>(
                (state == "NotReady" && ready == "0/1" && reason == "WaitApplied").then_some(()),
            )
        },
    )
    .await;
    let after = rewritten.elapsed();
    assert!(
        after >= ROLLOUT_DELAY - Duration::from_secs(2),
        "shown {after:?} after the rewrite, before the rollout delay"
    );
    assert_eq!(
        cluster_status_writes(&hub),
        before + 1,
        "{:?}",
        hub.write_series()
    );

    // The agent returns and applies it: Ready again, one more write.
    east.restart().await;
    ws.ready("east", "app").await;
    eventually(
        "the Cluster Ready again",
        Duration::from_secs(30),
        || async {
            Ok::<_, kube::Error>((shown(&ws, "east").await? == ready_state()).then_some(()))
        },
    )
    .await;
    hub.stop().await.unwrap();
}
