//! An agent that comes back (issue 22 items 2 and 9), the agent being the real `tender-agent`
//! binary, installed by its chart and stopped with SIGKILL:
//!
//! - its BundleDeployments were removed on the hub while it was away (Bundle deleted, Bundle
//!   retargeted, one force-removed without its finalizer): on return it removes exactly their
//!   objects — not an unmanaged object of the same name elsewhere, not another Bundle's, not
//!   what `keepResources` or an object's own keep marker keeps;
//! - its Cluster was deleted (and with it its identity) while it was away: on return it deletes
//!   nothing and says why (`HubAccessLost` in its log, `tender_agent_hub_access_lost 1`); an
//!   agent whose identity still authenticates (here: an in-process agent with an admin hub
//!   kubeconfig, as push mode's in-hub agent has the hub's own client) deletes nothing either
//!   (decision 0081-an-agent-sweeps-only-for-a-live-cluster);
//! - it is SIGKILLed in the middle of applying 200 objects: restarted, it converges to exactly
//!   the desired set, its inventory covers everything it wrote, and removing the Bundle
//!   afterwards leaves nothing behind.
//!
//! One real agent per downstream cluster at a time (the agent chart's ClusterRoleBinding has a
//! fixed name): each test has an environment of its own group, so they run side by side.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tender_e2e::agent_harness::start_agent_with;
use tender_e2e::fixture::{WAIT, Workspace, app_bundle, create_namespace, stays};
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::running::{AgentOpts, Running, start_agent, sum_of};
use tender_e2e::{ADMIN_USER, HUB, downstream_name, eventually, shared_env_of, unique_name};
use tender_types::conditions::{TYPE_AGENT_CONNECTED, is_true};
use tender_types::{Cluster, labels};

/// Bundle content is applied as the agent itself would: the faults tests' setting.
const NOT_RBAC: &[&str] = &["bundleServiceAccount.clusterAdmin=true"];

/// A downstream object as the tests compare it: its uid and whether it still carries tender's
/// owner annotation. `None`: absent.
type Seen = Option<(String, bool)>;

fn seen(meta: &ObjectMeta) -> Seen {
    let owned = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(labels::OWNER_ANNOTATION));
    Some((meta.uid.clone().unwrap_or_default(), owned))
}

async fn config_map(down: &kube::Client, ns: &str, name: &str) -> Seen {
    Api::<ConfigMap>::namespaced(down.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|c| seen(&c.metadata))
}

async fn secret(down: &kube::Client, ns: &str, name: &str) -> Seen {
    Api::<Secret>::namespaced(down.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|s| seen(&s.metadata))
}

/// The three objects of [`app_bundle`] in `ns`: copied Secret, copied ConfigMap, manifest.
async fn app_objects(down: &kube::Client, ns: &str) -> [Seen; 3] {
    [
        secret(down, ns, "db-creds").await,
        config_map(down, ns, "app-config").await,
        config_map(down, ns, "app-settings").await,
    ]
}

/// Downstream deletes and strips of managed objects the agent process made.
async fn removals(agent: &Running, action: &str) -> u64 {
    sum_of(
        &agent.scrape().await,
        "tender_agent_objects_written_total{",
        |l| l.contains(&format!("action=\"{action}\"")),
    )
}

fn keep_bundle(clusters: &[&str], ns: &str) -> serde_json::Value {
    let mut spec = app_bundle(clusters, ns);
    spec["keepResources"] = json!(true);
    spec
}

/// Waits until BundleDeployment `name` of `cluster` is being deleted or gone.
async fn deleting(ws: &Workspace, cluster: &str, name: &str) {
    let bds = ws.bds(cluster);
    eventually(
        &format!("BundleDeployment {name} deleting"),
        WAIT,
        || async {
            let bd = bds.get_opt(name).await?;
            Ok::<_, kube::Error>(
                bd.is_none_or(|b| b.metadata.deletion_timestamp.is_some())
                    .then_some(()),
            )
        },
    )
    .await;
}

async fn gone(ws: &Workspace, cluster: &str, name: &str) {
    let bds = ws.bds(cluster);
    eventually(&format!("BundleDeployment {name} gone"), WAIT, || async {
        Ok::<_, kube::Error>(bds.get_opt(name).await?.is_none().then_some(()))
    })
    .await;
}

#[tokio::test]
async fn an_agent_back_from_away_removes_exactly_the_objects_of_deployments_removed_meanwhile() {
    let ws = Workspace::new(shared_env_of("return-prune", 1).await, "return-prune").await;
    let downstream = downstream_name(1);
    let down = ws.downstream(&downstream).await;
    ws.cluster("east").await;
    let release_ns = unique_name("agents");
    let mut agent = start_agent(
        &ws,
        "east",
        &downstream,
        AgentOpts {
            release_ns: Some(&release_ns),
            sets: NOT_RBAC,
            ..Default::default()
        },
    )
    .await;
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    let ns: BTreeMap<&str, String> = ["gone", "moved", "vanished", "kept", "other"]
        .into_iter()
        .map(|b| (b, unique_name(&format!("return-{b}"))))
        .collect();
    for (bundle, target) in &ns {
        let spec = if *bundle == "kept" {
            keep_bundle(&["east"], target)
        } else {
            app_bundle(&["east"], target)
        };
        ws.bundle(bundle, spec).await;
    }
    for bundle in ns.keys() {
        ws.ready("east", bundle).await;
    }
    // Not tender's: a ConfigMap named like the manifest, in a namespace of its own.
    let bystander_ns = unique_name("return-bystander");
    create_namespace(&down, &bystander_ns).await;
    Api::<ConfigMap>::namespaced(down.clone(), &bystander_ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "app-settings"}, "data": {"a": "b"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let bystander = config_map(&down, &bystander_ns, "app-settings").await;

    agent.kill();
    // While it is away: `gone` is deleted, `moved` retargeted to no cluster (both wait on the
    // agent's finalizer), `vanished` deleted and its finalizer force-removed (only the start-up
    // sweep can find its objects), `kept` (keepResources) deleted; the downstream owner marks
    // one object of `gone` to be kept.
    ws.delete_bundle("gone").await;
    ws.bundle("moved", app_bundle(&["nobody"], &ns["moved"]))
        .await;
    ws.delete_bundle("vanished").await;
    ws.delete_bundle("kept").await;
    for bundle in ["gone", "moved", "vanished", "kept"] {
        deleting(&ws, "east", bundle).await;
    }
    ws.bds("east")
        .patch(
            "vanished",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    gone(&ws, "east", "vanished").await;
    Api::<ConfigMap>::namespaced(down.clone(), &ns["gone"])
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {labels::KEEP_RESOURCES: "true"}}})),
        )
        .await
        .unwrap();
    let other = app_objects(&down, &ns["other"]).await;
    let kept = app_objects(&down, &ns["kept"]).await;
    let marked = config_map(&down, &ns["gone"], "app-config").await;
    assert!(
        other
            .iter()
            .chain(&kept)
            .chain([&marked])
            .all(Option::is_some)
    );

    agent.restart().await;
    for bundle in ["gone", "moved", "kept"] {
        gone(&ws, "east", bundle).await;
    }
    for bundle in ["gone", "moved", "vanished"] {
        let target = ns[bundle].clone();
        let down = down.clone();
        eventually(&format!("{bundle}'s objects removed"), WAIT, || {
            let (down, target) = (down.clone(), target.clone());
            async move {
                let objects = app_objects(&down, &target).await;
                // `gone`'s marked ConfigMap stays (checked below).
                let left = if bundle == "gone" {
                    objects[0].is_some() || objects[2].is_some()
                } else {
                    objects.iter().any(Option::is_some)
                };
                Ok::<_, kube::Error>((!left).then_some(()))
            }
        })
        .await;
    }
    // Kept: the same objects, without tender's metadata.
    let released = |s: &Seen| s.as_ref().map(|(uid, _)| (uid.clone(), false));
    let kept_after: Vec<Seen> = kept.iter().map(released).collect();
    let marked_after = released(&marked);
    let everything_else = || async {
        (
            app_objects(&down, &ns["other"]).await.to_vec(),
            app_objects(&down, &ns["kept"]).await.to_vec(),
            config_map(&down, &ns["gone"], "app-config").await,
            config_map(&down, &bystander_ns, "app-settings").await,
        )
    };
    eventually("kept objects released", WAIT, || async {
        let now = everything_else().await;
        Ok::<_, kube::Error>((now.1 == kept_after && now.2 == marked_after).then_some(()))
    })
    .await;
    stays(
        "another Bundle's objects, kept objects, the marked object and the bystander",
        Duration::from_secs(4),
        &(
            other.to_vec(),
            kept_after.clone(),
            marked_after.clone(),
            bystander.clone(),
        ),
        everything_else,
    )
    .await;
    ws.ready("east", "other").await;
    // Exactly: 3 objects each of `moved` and `vanished` and 2 of `gone` deleted; the 3 of
    // `kept` and `gone`'s marked one stripped.
    assert_eq!(removals(&agent, "delete").await, 8, "deletes");
    assert_eq!(removals(&agent, "strip").await, 4, "strips");
    agent.assert_running();
}

/// A workspace with its own hub that takes an agent for offline after 4 s (so deleting a
/// Cluster whose agent is away does not wait for the grace).
async fn quick_offline_workspace(
    prefix: &'static str,
) -> (Workspace, tender_e2e::hub_harness::HubHandle) {
    let ws = Workspace::without_hub(shared_env_of(prefix, 1).await, prefix).await;
    let mut config = hub_config(&ws.ns);
    config.agent_offline_after = Duration::from_secs(4);
    let hub = start_hub(ws.env, config).await.unwrap();
    (ws, hub)
}

/// Deletes Cluster `name` once its agent counts as offline; waits until it and its namespace
/// are gone.
async fn delete_offline_cluster(ws: &Workspace, name: &str) {
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually(&format!("{name} AgentOffline"), WAIT, || async {
        let c = clusters.get(name).await?;
        let offline = c
            .status
            .is_some_and(|s| !is_true(&s.conditions, TYPE_AGENT_CONNECTED));
        Ok::<_, kube::Error>(offline.then_some(()))
    })
    .await;
    clusters
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(&format!("Cluster {name} gone"), WAIT, || async {
        Ok::<_, kube::Error>(clusters.get_opt(name).await?.is_none().then_some(()))
    })
    .await;
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    let ns = ws.cluster_ns(name);
    eventually("its namespace gone", WAIT, || async {
        Ok::<_, kube::Error>(namespaces.get_opt(&ns).await?.is_none().then_some(()))
    })
    .await;
}

#[tokio::test]
async fn an_agent_back_after_its_cluster_was_deleted_deletes_nothing_and_says_why() {
    let (ws, hub) = quick_offline_workspace("return-revoked").await;
    let downstream = downstream_name(1);
    let down = ws.downstream(&downstream).await;
    ws.cluster("east").await;
    let release_ns = unique_name("agents");
    let mut agent = start_agent(
        &ws,
        "east",
        &downstream,
        AgentOpts {
            release_ns: Some(&release_ns),
            sets: NOT_RBAC,
            ..Default::default()
        },
    )
    .await;
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    let target = unique_name("return-revoked");
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    ws.ready("east", "app").await;
    let before = app_objects(&down, &target).await;
    assert!(before.iter().all(Option::is_some));

    agent.kill();
    // The Cluster goes while its agent is away, and with its namespace the agent's
    // ServiceAccount: every token of it stops authenticating.
    delete_offline_cluster(&ws, "east").await;
    agent.respawn();
    eventually("the agent reports its lost access", WAIT, || async {
        let lost = agent
            .scrape()
            .await
            .lines()
            .any(|l| l == "tender_agent_hub_access_lost 1");
        let logged = agent.log().contains("HubAccessLost");
        Ok::<_, std::convert::Infallible>((lost && logged).then_some(()))
    })
    .await;
    stays(
        "the deleted Cluster's objects downstream while its agent runs again",
        Duration::from_secs(4),
        &before,
        || app_objects(&down, &target),
    )
    .await;
    assert_eq!(removals(&agent, "delete").await, 0);
    assert_eq!(removals(&agent, "strip").await, 0);
    agent.assert_running();
    hub.stop().await.unwrap();
}

#[tokio::test]
async fn an_agent_whose_identity_outlives_its_deleted_cluster_deletes_nothing() {
    let (ws, hub) = quick_offline_workspace("return-broad").await;
    let env = ws.env;
    let downstream = downstream_name(1);
    let down = ws.downstream(&downstream).await;
    let (_, mut config) = ws.register("east").await;
    // A release namespace of its own, so its inventories are its alone.
    config.agent_namespace = unique_name("agents");
    // An identity the Cluster's deletion does not revoke (push mode's in-hub agent uses the
    // hub's own client; a pull agent may be given a client certificate).
    let admin_hub = env.kubeconfig_as(HUB, ADMIN_USER);
    let admin_down = env.kubeconfig_as(&downstream, ADMIN_USER);
    let agent = start_agent_with(&admin_hub, &admin_down, config.clone())
        .await
        .unwrap();
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    let target = unique_name("return-broad");
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    ws.ready("east", "app").await;
    let before = app_objects(&down, &target).await;
    assert!(before.iter().all(Option::is_some));

    agent.kill().await;
    delete_offline_cluster(&ws, "east").await;
    // Back, it lists the BundleDeployments of a namespace that no longer exists: an empty
    // list, which must not read as "every deployment was removed".
    let agent = start_agent_with(&admin_hub, &admin_down, config)
        .await
        .unwrap();
    stays(
        "the deleted Cluster's objects downstream",
        Duration::from_secs(4),
        &before,
        || app_objects(&down, &target),
    )
    .await;
    eventually("the agent reports its Cluster gone", WAIT, || {
        let lost = agent.metrics.hub_access_lost();
        async move { Ok::<_, std::convert::Infallible>(lost.then_some(())) }
    })
    .await;
    assert_eq!(agent.metrics.writes("delete"), 0);
    assert!(
        !agent.health.is_ready(),
        "an agent without a Cluster is not ready"
    );
    agent.kill().await;
    hub.stop().await.unwrap();
}

/// Managed ConfigMaps of cluster namespace `cluster_ns` in `ns`: name → uid.
async fn managed(down: &kube::Client, ns: &str, cluster_ns: &str) -> BTreeMap<String, String> {
    let lp = ListParams::default().labels(&format!("{}={cluster_ns}", labels::CLUSTER_NAMESPACE));
    Api::<ConfigMap>::namespaced(down.clone(), ns)
        .list_metadata(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| (m.name_any(), m.uid().unwrap_or_default()))
        .collect()
}

/// Names in the inventories of `agent_ns` (every `tender-inventory-*` ConfigMap's text).
async fn inventory_text(down: &kube::Client, agent_ns: &str) -> String {
    let lp = ListParams::default().labels(&format!("{}=true", labels::INVENTORY));
    Api::<ConfigMap>::namespaced(down.clone(), agent_ns)
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| serde_json::to_string(&c.data).unwrap())
        .collect()
}

#[tokio::test]
async fn an_agent_sigkilled_mid_apply_converges_and_leaves_nothing_behind() {
    const N: usize = 200;
    let ws = Workspace::new(shared_env_of("return-crash", 1).await, "return-crash").await;
    let downstream = downstream_name(1);
    let down = ws.downstream(&downstream).await;
    ws.cluster("east").await;
    let release_ns = unique_name("agents");
    let mut agent = start_agent(
        &ws,
        "east",
        &downstream,
        AgentOpts {
            release_ns: Some(&release_ns),
            sets: NOT_RBAC,
            ..Default::default()
        },
    )
    .await;
    let target = unique_name("return-crash");
    create_namespace(&down, &target).await;
    // Not tender's, in the very namespace, named like no object of the Bundle.
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &target);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "bystander"}, "data": {"a": "b"}}))
            .unwrap(),
    )
    .await
    .unwrap();
    let bystander = cms.get("bystander").await.unwrap();
    let filler = "x".repeat(2048);
    let resources: Vec<serde_json::Value> = (0..N)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": format!("cm-{i:03}")}, "data": {"v": filler}})
        })
        .collect();
    let cluster_ns = ws.cluster_ns("east");
    ws.bundle(
        "many",
        json!({"targets": [{"clusterName": "east"}], "defaultNamespace": target,
               "resources": resources}),
    )
    .await;
    // Kill -9 as soon as some, not all, are written.
    let started = Instant::now();
    loop {
        let n = managed(&down, &target, &cluster_ns).await.len();
        if n >= 1 {
            agent.kill();
            break;
        }
        assert!(started.elapsed() < WAIT, "the agent wrote nothing");
    }
    let at_kill = managed(&down, &target, &cluster_ns).await;
    eprintln!("SIGKILL with {} of {N} ConfigMaps written", at_kill.len());
    assert!(
        (1..N).contains(&at_kill.len()),
        "the kill must land mid-apply: {} of {N} written",
        at_kill.len()
    );
    // Everything written is in the inventory, recorded before it was created.
    let inventory = inventory_text(&down, &release_ns).await;
    for name in at_kill.keys() {
        assert!(
            inventory.contains(name.as_str()),
            "{name} written but not in the inventory"
        );
    }

    agent.restart().await;
    ws.ready("east", "many").await;
    let after = managed(&down, &target, &cluster_ns).await;
    let want: Vec<String> = (0..N).map(|i| format!("cm-{i:03}")).collect();
    assert_eq!(
        after.keys().cloned().collect::<Vec<_>>(),
        want,
        "exactly the desired set"
    );
    for (name, uid) in &at_kill {
        assert_eq!(
            &after[name], uid,
            "{name} written before the kill is the same object"
        );
    }
    let unmanaged = cms.get("bystander").await.unwrap();
    assert_eq!(
        unmanaged.resource_version(),
        bystander.resource_version(),
        "the bystander untouched"
    );
    let strangers: Vec<String> = cms
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| m.name_any())
        .filter(|n| !after.contains_key(n) && n != "bystander" && n != "kube-root-ca.crt")
        .collect();
    assert!(
        strangers.is_empty(),
        "nothing else in the namespace: {strangers:?}"
    );

    // Removed afterwards: every one of them goes, the bystander stays, no inventory is left.
    ws.delete_bundle("many").await;
    gone(&ws, "east", "many").await;
    eventually("all of them removed", WAIT, || async {
        Ok::<_, kube::Error>(
            managed(&down, &target, &cluster_ns)
                .await
                .is_empty()
                .then_some(()),
        )
    })
    .await;
    assert_eq!(
        cms.get("bystander").await.unwrap().resource_version(),
        bystander.resource_version()
    );
    assert_eq!(
        inventory_text(&down, &release_ns).await,
        "",
        "no inventory left"
    );
    assert_eq!(removals(&agent, "delete").await, N as u64);
}
