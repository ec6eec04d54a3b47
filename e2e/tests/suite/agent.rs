//! The agent end to end: a real hub (in-process tender-hub) and two real downstream clusters,
//! agents running in-process with their narrow hub identities.
//!
//! Every test has its own workspace namespace, its own hub instance scoped to it and its own
//! Cluster registrations, so tests run in parallel on one shared environment.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tender_e2e::fixture::{
    self, WAIT, Workspace, bytes, create_namespace, secret_value, settled, stays, wait_secret,
};
use tender_e2e::hub_harness::{hub_config, spawn_hub};
use tender_e2e::proxy::WriteGate;
use tender_e2e::{ADMIN_USER, HUB, downstream_name, eventually, shared_env, unique_name};
use tender_hub::HubConfig;
use tender_types::ObjectState;
use tender_types::conditions::{TYPE_READY, find_condition, is_true};
use tender_types::{Cluster, labels, names};

// ---------------------------------------------------------------------------------------------
// Small helpers.

async fn wait_gone<K>(api: &Api<K>, name: &str, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(what, WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

fn rv(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()
        .unwrap()
}

fn has_tender_metadata(meta: &ObjectMeta) -> bool {
    let tender = |m: &Option<BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .any(|(k, _)| labels::is_tender_key(k) || k == labels::MANAGED_BY)
    };
    tender(&meta.labels) || tender(&meta.annotations)
}

/// The mission's bundle ([`fixture::app_bundle`]) with `keepResources` set to `keep`.
fn app_bundle(clusters: &[&str], target_ns: &str, keep: bool) -> Value {
    let mut spec = fixture::app_bundle(clusters, target_ns);
    spec["keepResources"] = json!(keep);
    spec
}

// ---------------------------------------------------------------------------------------------
// The scenarios.

#[tokio::test]
async fn copies_land_before_manifests_rotate_by_watch_and_go_with_the_bundle() {
    let ws = Workspace::new(shared_env(2).await, "agent-flow").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("apps");
    ws.bundle("app", app_bundle(&["east", "west"], &target, false))
        .await;

    for (cluster, agent) in [("east", &east), ("west", &west)] {
        ws.ready(cluster, "app").await;
        let down = ws.downstream(&agent.downstream).await;
        let secret = Api::<Secret>::namespaced(down.clone(), &target)
            .get("db-creds")
            .await
            .unwrap();
        let config = Api::<ConfigMap>::namespaced(down.clone(), &target)
            .get("app-config")
            .await
            .unwrap();
        let manifest = Api::<ConfigMap>::namespaced(down.clone(), &target)
            .get("app-settings")
            .await
            .unwrap();
        assert_eq!(secret_value(&secret, "password").as_deref(), Some("one"));
        assert_eq!(secret.type_.as_deref(), Some("Opaque"));
        assert_eq!(
            secret.metadata.labels.as_ref().unwrap()["team"],
            "payments",
            "source labels travel"
        );
        assert_eq!(
            secret.metadata.annotations.as_ref().unwrap()["owner"],
            "dba"
        );
        assert_eq!(
            secret.metadata.annotations.as_ref().unwrap()[labels::OWNER_ANNOTATION],
            labels::bundle_deployment_owner(&names::cluster_namespace(&ws.ns, cluster), "app")
        );
        assert_eq!(config.data.as_ref().unwrap()["mode"], "blue");
        // Copy before deploy: both copies were created (etcd revision) before the manifest.
        assert!(
            rv(&secret.metadata) < rv(&manifest.metadata)
                && rv(&config.metadata) < rv(&manifest.metadata),
            "{cluster}: copies (rv {} / {}) must predate the manifest (rv {})",
            rv(&secret.metadata),
            rv(&config.metadata),
            rv(&manifest.metadata)
        );
        assert!(secret.metadata.creation_timestamp <= manifest.metadata.creation_timestamp);
    }

    // What the agent reads downstream per reconcile: with the deployment in place, whether
    // its namespace exists and what its inventory lists come from the agent's caches.
    let reads = || {
        let m = east.handle().metrics.shared();
        m.kube_requests("get", "namespaces", "") + m.kube_requests("get", "configmaps", "")
    };
    let reads_before = settled(
        "the agent's namespace and ConfigMap reads after the first deployment",
        Duration::from_secs(3),
        || async { reads() },
    )
    .await;

    // Rotation: only the source changes; both clusters get it by watch.
    let started = Instant::now();
    ws.source_secret("db-creds", &[("password", "two")]).await;
    for agent in [&east, &west] {
        let down = ws.downstream(&agent.downstream).await;
        wait_secret(
            &down,
            &target,
            "db-creds",
            "rotated secret downstream",
            |s| secret_value(s, "password").as_deref() == Some("two"),
        )
        .await;
    }
    eprintln!(
        "rotation reached both downstream clusters in {:?}",
        started.elapsed()
    );

    // Heartbeat: Lease in the cluster namespace, agent fields on the Cluster.
    let lease: Api<Lease> =
        Api::namespaced(ws.hub.clone(), &names::cluster_namespace(&ws.ns, "east"));
    assert!(
        lease
            .get(names::AGENT_LEASE)
            .await
            .unwrap()
            .spec
            .unwrap()
            .renew_time
            .is_some()
    );
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let agent_status = eventually("Cluster status.agent", WAIT, || async {
        Ok::<_, kube::Error>(clusters.get("east").await?.status.and_then(|s| s.agent))
    })
    .await;
    assert_eq!(agent_status.version.as_deref(), Some(tender_agent::VERSION));

    // Idle means idle: apart from the heartbeat, no writes at all.
    ws.ready("east", "app").await;
    let before = settled(
        "the agent's writes after the rotation",
        Duration::from_secs(3),
        || async { east.handle().non_heartbeat_writes() },
    )
    .await;
    let heartbeats_before = east.handle().write_requests() - before;
    stays(
        "the agent's non-heartbeat writes while idle",
        Duration::from_secs(10),
        &before,
        || async { east.handle().non_heartbeat_writes() },
    )
    .await;
    let heartbeats = east.handle().write_requests() - before - heartbeats_before;
    assert!(
        heartbeats >= 2,
        "the agent kept running (heartbeat writes went on: {heartbeats} in 10 s)"
    );
    eprintln!(
        "idle 10s: 0 non-heartbeat writes, {heartbeats} heartbeat writes, {} total writes so far",
        east.handle().write_requests()
    );
    // The rotation's reconciles asked the apiserver for no namespace and no inventory.
    assert_eq!(
        reads(),
        reads_before,
        "namespace and ConfigMap reads downstream during the rotation"
    );

    // Deleting the Bundle removes everything downstream (keepResources false).
    ws.delete_bundle("app").await;
    for agent in [&east, &west] {
        let down = ws.downstream(&agent.downstream).await;
        for name in ["app-config", "app-settings"] {
            wait_gone(
                &Api::<ConfigMap>::namespaced(down.clone(), &target),
                name,
                name,
            )
            .await;
        }
        wait_gone(
            &Api::<Secret>::namespaced(down.clone(), &target),
            "db-creds",
            "secret copy",
        )
        .await;
    }
    wait_gone(
        &ws.bds("east"),
        "app",
        "BundleDeployment gone after the finalizer",
    )
    .await;
}

#[tokio::test]
async fn keep_resources_leaves_objects_without_tender_metadata() {
    let ws = Workspace::new(shared_env(2).await, "agent-keep").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("kept");
    ws.bundle("app", app_bundle(&["east"], &target, true)).await;
    ws.ready("east", "app").await;
    ws.delete_bundle("app").await;
    wait_gone(&ws.bds("east"), "app", "BundleDeployment gone").await;
    let down = ws.downstream(&east.downstream).await;
    let secret = Api::<Secret>::namespaced(down.clone(), &target)
        .get("db-creds")
        .await
        .unwrap();
    assert!(
        !has_tender_metadata(&secret.metadata),
        "{:?}",
        secret.metadata
    );
    assert_eq!(
        secret.metadata.labels.as_ref().unwrap()["team"],
        "payments",
        "own labels stay"
    );
    assert_eq!(secret_value(&secret, "password").as_deref(), Some("one"));
    for name in ["app-config", "app-settings"] {
        let cm = Api::<ConfigMap>::namespaced(down.clone(), &target)
            .get(name)
            .await
            .unwrap();
        assert!(
            !has_tender_metadata(&cm.metadata),
            "{name}: {:?}",
            cm.metadata
        );
    }
}

#[tokio::test]
async fn unmanaged_secret_is_never_touched_and_reported_as_conflict() {
    let ws = Workspace::new(shared_env(2).await, "agent-conflict").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let target = unique_name("theirs");
    let down = ws.downstream(&east.downstream).await;
    create_namespace(&down, &target).await;
    let theirs: Api<Secret> = Api::namespaced(down.clone(), &target);
    let original = theirs
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("db-creds".into()),
                    labels: Some(BTreeMap::from([("owner".into(), "someone-else".into())])),
                    ..Default::default()
                },
                data: Some(bytes(&[("password", "theirs")])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    ws.source_secret("db-creds", &[("password", "ours")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    ws.bundle("app", app_bundle(&["east"], &target, false))
        .await;

    let bd = eventually("a Conflict reported for db-creds", WAIT, || async {
        let bd = ws.bds("east").get_opt("app").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| {
            bd.status.as_ref().is_some_and(|s| {
                s.resources
                    .iter()
                    .any(|r| r.name == "db-creds" && r.state == ObjectState::Conflict)
            })
        }))
    })
    .await;
    let status = bd.status.unwrap();
    assert!(!is_true(&status.conditions, TYPE_READY));
    assert_eq!(
        find_condition(
            &status.conditions,
            tender_types::conditions::TYPE_RESOURCES_COPIED
        )
        .unwrap()
        .reason,
        tender_types::conditions::reason::CONFLICT
    );
    // Copy before deploy: the manifest is held back while a copy is not in place.
    assert!(
        Api::<ConfigMap>::namespaced(down.clone(), &target)
            .get_opt("app-settings")
            .await
            .unwrap()
            .is_none()
    );
    // Byte for byte unchanged across a conflict re-check, the manifest still held back (the
    // re-checks recurring on their timer: in-process on virtual time, crates/agent/src/testing).
    let settings: Api<ConfigMap> = Api::namespaced(down.clone(), &target);
    stays(
        "their Secret's resourceVersion and the held-back manifest",
        fixture::CONFLICT_RECHECKS,
        &(original.metadata.resource_version.clone(), false),
        || async {
            (
                theirs
                    .get("db-creds")
                    .await
                    .unwrap()
                    .metadata
                    .resource_version,
                settings.get_opt("app-settings").await.unwrap().is_some(),
            )
        },
    )
    .await;
    let now = theirs.get("db-creds").await.unwrap();
    assert_eq!(now.data, original.data);
    assert_eq!(now.metadata.labels, original.metadata.labels);
    assert_eq!(now.metadata.annotations, original.metadata.annotations);

    // Deleting the Bundle does not delete their Secret either.
    ws.delete_bundle("app").await;
    wait_gone(&ws.bds("east"), "app", "BundleDeployment gone").await;
    let after = theirs.get("db-creds").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        original.metadata.resource_version
    );
}

#[tokio::test]
async fn immutable_secret_rotates_by_recreate() {
    let ws = Workspace::new(shared_env(2).await, "agent-immutable").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret_immutable("db-creds", &[("password", "v1")])
        .await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("imm");
    ws.bundle("app", app_bundle(&["east"], &target, false))
        .await;
    ws.ready("east", "app").await;
    let down = ws.downstream(&east.downstream).await;
    let first = Api::<Secret>::namespaced(down.clone(), &target)
        .get("db-creds")
        .await
        .unwrap();
    assert_eq!(first.immutable, Some(true));

    // An immutable source rotates by being replaced.
    let sources: Api<Secret> = Api::namespaced(ws.hub.clone(), &ws.ns);
    sources
        .delete("db-creds", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&sources, "db-creds", "source deleted").await;
    ws.source_secret_immutable("db-creds", &[("password", "v2")])
        .await;
    let second = wait_secret(
        &down,
        &target,
        "db-creds",
        "immutable secret rotated downstream",
        |s| secret_value(s, "password").as_deref() == Some("v2"),
    )
    .await;
    assert_ne!(
        second.metadata.uid, first.metadata.uid,
        "recreated, not updated"
    );
    assert_eq!(second.immutable, Some(true));
    assert!(east.handle().metrics.writes_of("recreate", "Secret") >= 1);
}

#[tokio::test]
async fn drift_is_corrected_or_reported() {
    let ws = Workspace::new(shared_env(2).await, "agent-drift").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("drift");
    ws.bundle("app", app_bundle(&["east"], &target, false))
        .await;
    ws.ready("east", "app").await;
    let down = ws.downstream(&east.downstream).await;
    let secrets: Api<Secret> = Api::namespaced(down.clone(), &target);
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &target);

    // A deleted copy comes back.
    let started = Instant::now();
    secrets
        .delete("db-creds", &DeleteParams::default())
        .await
        .unwrap();
    wait_secret(&down, &target, "db-creds", "deleted copy restored", |s| {
        secret_value(s, "password").as_deref() == Some("one")
    })
    .await;
    eprintln!("deleted copy restored in {:?}", started.elapsed());

    // An edited copy is put back, including a key someone added.
    secrets
        .patch(
            "db-creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"password": "aGFja2Vk", "extra": "eA=="}})),
        )
        .await
        .unwrap();
    wait_secret(&down, &target, "db-creds", "edited copy restored", |s| {
        secret_value(s, "password").as_deref() == Some("one")
            && !s.data.as_ref().unwrap().contains_key("extra")
    })
    .await;
    // An edited manifest object is put back, and the correction shows in status.
    cms.patch(
        "app-settings",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"secretRef": "changed"}})),
    )
    .await
    .unwrap();
    eventually("edited manifest restored", WAIT, || async {
        let cm = cms.get("app-settings").await?;
        Ok::<_, kube::Error>((cm.data.unwrap()["secretRef"] == "db-creds").then_some(()))
    })
    .await;
    eventually("drift correction visible in status", WAIT, || async {
        let bd = ws.bds("east").get("app").await?;
        let deployed = bd.status.and_then(|s| {
            find_condition(&s.conditions, tender_types::conditions::TYPE_DEPLOYED).cloned()
        });
        Ok::<_, kube::Error>(
            deployed.filter(|c| c.message.contains("restored after downstream drift")),
        )
    })
    .await;
    assert!(east.handle().metrics.drift_corrected() >= 3);

    // With correctDrift off the change is reported, not corrected.
    let mut spec = app_bundle(&["east"], &target, false);
    spec["correctDrift"] = json!({"enabled": false});
    ws.bundle("app", spec).await;
    eventually(
        "BundleDeployment with correctDrift off applied",
        WAIT,
        || async {
            let bd = ws.bds("east").get("app").await?;
            Ok::<_, kube::Error>(
                (!bd.spec.options.correct_drift
                    && bd.status.and_then(|s| s.applied_deployment_id)
                        == Some(bd.spec.deployment_id))
                .then_some(()),
            )
        },
    )
    .await;
    // What the agent has written to ConfigMaps downstream (apply or recreate) and corrected,
    // once the re-apply for the new deploymentID is over.
    let metrics = east.handle().metrics.clone();
    let cm_writes = || {
        (
            metrics.writes_of("apply", "ConfigMap"),
            metrics.writes_of("recreate", "ConfigMap"),
            metrics.drift_corrected(),
        )
    };
    let writes_before = settled(
        "the agent's ConfigMap writes after correctDrift was turned off",
        Duration::from_secs(2),
        || async { cm_writes() },
    )
    .await;
    let drifted = cms
        .patch(
            "app-settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"secretRef": "changed"}})),
        )
        .await
        .unwrap();
    eventually("drift reported as modified", WAIT, || async {
        let bd = ws.bds("east").get("app").await?;
        Ok::<_, kube::Error>(
            bd.status
                .filter(|s| s.modified.iter().any(|m| m.name == "app-settings"))
                .map(|_| ()),
        )
    })
    .await;
    // Not corrected: across a window the object keeps the drifted content and version, and
    // the agent writes no ConfigMap and corrects nothing.
    stays(
        "app-settings drifted, the agent's ConfigMap writes and corrections",
        Duration::from_secs(5),
        &(
            Some("changed".to_string()),
            drifted.metadata.resource_version.clone(),
            writes_before,
        ),
        || async {
            let cm = cms.get("app-settings").await.unwrap();
            (
                cm.data.and_then(|d| d.get("secretRef").cloned()),
                cm.metadata.resource_version,
                cm_writes(),
            )
        },
    )
    .await;
}

#[tokio::test]
async fn agent_killed_mid_apply_converges_after_restart() {
    let ws = Workspace::new(shared_env(2).await, "agent-kill").await;
    let downstream = downstream_name(1);
    // The agent reaches its downstream cluster only through a gate that can hold its writes.
    let gate = WriteGate::start(ws.downstream(&downstream).await)
        .await
        .unwrap();
    let mut east = ws.agent_through("east", &downstream, &gate).await;
    eventually("the agent to finish its start-up", WAIT, || {
        let ready = east.handle().health.is_ready();
        async move { Ok::<_, std::convert::Infallible>(ready.then_some(())) }
    })
    .await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("kill");
    let mut spec = app_bundle(&["east"], &target, false);
    spec["resources"] = Value::Array(
        (0..40)
            .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("part-{i}")}, "data": {"i": i.to_string()}}))
            .collect(),
    );
    let down = ws.downstream(&downstream).await;
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &target);
    let parts_in_place = || async {
        let list = cms.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .filter(|c| c.name_any().starts_with("part-"))
            .count()
    };

    // Let the apply's first writes through (its namespace, the copies, the first parts), then
    // hold the next one, so the kill below lands while a write is in flight.
    let passed_before = gate.forwarded_writes();
    gate.hold_writes_after(6);
    ws.bundle("app", spec).await;
    let held =
        eventually(
            "a downstream write of the apply held at the gate",
            WAIT,
            || {
                let holding = gate.holding();
                async move {
                    Ok::<_, std::convert::Infallible>((!holding.is_empty()).then_some(holding))
                }
            },
        )
        .await;
    assert_eq!(
        gate.forwarded_writes() - passed_before,
        6,
        "the gate let exactly the allowance through before holding"
    );
    assert_eq!(
        east.handle().downstream_write_requests(),
        gate.forwarded_writes() + held.len() as u64,
        "every write the agent sent downstream either passed the gate or is held there: {held:?}"
    );
    let parts_at_kill = parts_in_place().await;
    east.kill().await;
    // A held write to one of the Bundle's objects has not landed.
    let prefix = format!("/api/v1/namespaces/{target}/configmaps/");
    for name in held
        .iter()
        .filter_map(|h| h.split_once(&prefix).map(|(_, n)| n))
    {
        assert!(
            cms.get_opt(name).await.unwrap().is_none(),
            "{name} is downstream although its write was held"
        );
    }
    // The kill landed mid-apply: part of the Bundle is downstream, the rest is not, and the
    // BundleDeployment does not say applied.
    assert!(
        parts_at_kill < 40,
        "the apply was still in progress at the kill, yet all 40 parts were in place"
    );
    assert!(
        cms.get_opt("app-config").await.unwrap().is_some(),
        "the apply had started: the ConfigMap copy is in place"
    );
    let bd = ws.bds("east").get("app").await.unwrap();
    assert_ne!(
        bd.status.and_then(|s| s.applied_deployment_id),
        Some(bd.spec.deployment_id),
        "the BundleDeployment was not applied at the kill"
    );
    // The held write dies with the agent, unsent.
    gate.discard_held();
    eventually("the held write dropped unsent", WAIT, || {
        let dropped = gate.discarded();
        async move { Ok::<_, std::convert::Infallible>((dropped >= 1).then_some(())) }
    })
    .await;
    assert!(gate.held_total() >= 1, "the gate held a write");
    eprintln!("killed while the gate held {held:?}, with {parts_at_kill} of 40 parts in place");

    east.restart().await;
    ws.ready("east", "app").await;
    assert_eq!(
        parts_in_place().await,
        40,
        "every part in place after the restart"
    );
    for i in [0, 20, 39] {
        let part = cms.get(&format!("part-{i}")).await.unwrap();
        assert_eq!(part.data.unwrap()["i"], i.to_string(), "part-{i}");
    }
    let all = cms.list(&Default::default()).await.unwrap().items.len();
    assert_eq!(all, 40 + 1 + 1, "40 parts, the copy and kube-root-ca.crt");

    // A change while the agent is down is picked up after restart, stale objects pruned.
    east.kill().await;
    let mut smaller = app_bundle(&["east"], &target, false);
    smaller["resources"] = json!([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "part-0"}, "data": {"i": "zero"}}]);
    ws.bundle("app", smaller).await;
    east.restart().await;
    ws.ready("east", "app").await;
    wait_gone(&cms, "part-39", "pruned manifest").await;
    assert_eq!(cms.get("part-0").await.unwrap().data.unwrap()["i"], "zero");
}

#[tokio::test]
async fn two_registrations_on_one_downstream_stay_apart() {
    let ws = Workspace::new(shared_env(2).await, "agent-shared").await;
    let mut a = ws.agent("blue", &downstream_name(2)).await;
    let b = ws.agent("green", &downstream_name(2)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let ns_a = unique_name("blue");
    let ns_b = unique_name("green");
    ws.bundle("app-a", app_bundle(&["blue"], &ns_a, false))
        .await;
    ws.bundle("app-b", app_bundle(&["green"], &ns_b, false))
        .await;
    ws.ready("blue", "app-a").await;
    ws.ready("green", "app-b").await;
    let down = ws.downstream(&b.downstream).await;
    let theirs = Api::<Secret>::namespaced(down.clone(), &ns_b)
        .get("db-creds")
        .await
        .unwrap();

    // Restarting one agent (start-up sweep) leaves the other's objects alone.
    a.restart().await;
    ws.ready("blue", "app-a").await;
    let after_restart = Api::<Secret>::namespaced(down.clone(), &ns_b)
        .get("db-creds")
        .await
        .unwrap();
    assert_eq!(
        (
            &after_restart.metadata.uid,
            &after_restart.metadata.resource_version
        ),
        (&theirs.metadata.uid, &theirs.metadata.resource_version),
        "green's copy untouched by blue's restart"
    );

    // Deleting one cluster's bundle removes only its objects.
    ws.delete_bundle("app-a").await;
    wait_gone(
        &Api::<Secret>::namespaced(down.clone(), &ns_a),
        "db-creds",
        "blue's copy",
    )
    .await;
    let still = Api::<Secret>::namespaced(down.clone(), &ns_b)
        .get("db-creds")
        .await
        .unwrap();
    assert_eq!(still.metadata.uid, theirs.metadata.uid);
    assert!(has_tender_metadata(&still.metadata));
}

#[tokio::test]
async fn hub_as_its_own_downstream_copies_namespace_to_namespace() {
    let ws = Workspace::new(shared_env(2).await, "agent-self").await;
    let _local = ws.agent("local", HUB).await;
    ws.source_secret("db-creds", &[("password", "local")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("self-target");
    ws.bundle("app", app_bundle(&["local"], &target, false))
        .await;
    ws.ready("local", "app").await;
    // The hub's workspace namespace holds the source; the target namespace on the hub the copy.
    let copy = Api::<Secret>::namespaced(ws.hub.clone(), &target)
        .get("db-creds")
        .await
        .unwrap();
    assert_eq!(secret_value(&copy, "password").as_deref(), Some("local"));
    let source = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .get("db-creds")
        .await
        .unwrap();
    assert!(
        !source.annotations().contains_key(labels::OWNER_ANNOTATION),
        "the source itself is never claimed"
    );
    ws.source_secret("db-creds", &[("password", "local-2")])
        .await;
    wait_secret(
        &ws.hub,
        &target,
        "db-creds",
        "rotation namespace to namespace",
        |s| secret_value(s, "password").as_deref() == Some("local-2"),
    )
    .await;
}

/// Namespace to namespace on one cluster, at its most dangerous: the Bundle's target is the
/// workspace itself, so every copy would land on its own source. Sources are never claimed,
/// overwritten or deleted: the copies are Conflicts, and deleting the Bundle leaves them.
#[tokio::test]
async fn a_source_is_never_overwritten_or_deleted_namespace_to_namespace() {
    let ws = Workspace::new(shared_env(2).await, "agent-self-guard").await;
    let local = ws.agent("local", HUB).await;
    ws.source_secret("db-creds", &[("password", "source")])
        .await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let secrets = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns);
    let config_maps = Api::<ConfigMap>::namespaced(ws.hub.clone(), &ws.ns);
    let before = (
        secrets.get("db-creds").await.unwrap(),
        config_maps.get("app-config").await.unwrap(),
    );
    ws.bundle("app", app_bundle(&["local"], &ws.ns, false))
        .await;

    let bds = ws.bds("local");
    eventually("both copies reported as Conflicts", WAIT, || async {
        let bd = bds.get_opt("app").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| {
            let conflicts: Vec<&str> = bd
                .status
                .iter()
                .flat_map(|s| &s.resources)
                .filter(|r| r.state == ObjectState::Conflict)
                .map(|r| r.name.as_str())
                .collect();
            conflicts.contains(&"db-creds") && conflicts.contains(&"app-config")
        }))
    })
    .await;
    let unchanged = |what: &str| {
        format!("the source {what} is exactly as its owner left it (uid, resourceVersion, data)")
    };
    let same_secret = |s: &Secret| {
        s.metadata.uid == before.0.metadata.uid
            && s.metadata.resource_version == before.0.metadata.resource_version
            && secret_value(s, "password").as_deref() == Some("source")
            && !s.annotations().contains_key(labels::OWNER_ANNOTATION)
    };
    let same_config_map = |c: &ConfigMap| {
        c.metadata.uid == before.1.metadata.uid
            && c.metadata.resource_version == before.1.metadata.resource_version
    };
    assert!(
        same_secret(&secrets.get("db-creds").await.unwrap()),
        "{}",
        unchanged("Secret")
    );
    assert!(
        same_config_map(&config_maps.get("app-config").await.unwrap()),
        "{}",
        unchanged("ConfigMap")
    );
    assert_eq!(
        (
            local.handle().metrics.writes_of("apply", "Secret"),
            local.handle().metrics.writes_of("delete", "Secret"),
        ),
        (0, 0),
        "the agent wrote no Secret at all"
    );

    ws.delete_bundle("app").await;
    wait_gone(
        &bds,
        "app",
        "the BundleDeployment after the Bundle's deletion",
    )
    .await;
    assert!(
        same_secret(&secrets.get("db-creds").await.unwrap()),
        "{}",
        unchanged("Secret")
    );
    assert!(
        same_config_map(&config_maps.get("app-config").await.unwrap()),
        "{}",
        unchanged("ConfigMap")
    );
}

#[tokio::test]
async fn startup_sweep_removes_leftovers_of_vanished_deployments() {
    let ws = Workspace::new(shared_env(2).await, "agent-sweep").await;
    let mut east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let gone_ns = unique_name("sweep-gone");
    let kept_ns = unique_name("sweep-kept");
    ws.bundle("gone", app_bundle(&["east"], &gone_ns, false))
        .await;
    ws.bundle("kept", app_bundle(&["east"], &kept_ns, true))
        .await;
    ws.ready("east", "gone").await;
    ws.ready("east", "kept").await;

    // While the agent is away both BundleDeployments vanish without its cleanup (an operator
    // force-removes the finalizer).
    east.kill().await;
    for bundle in ["gone", "kept"] {
        ws.delete_bundle(bundle).await;
        let bds = ws.bds("east");
        eventually("BundleDeployment marked for deletion", WAIT, || async {
            let bd = bds.get_opt(bundle).await?;
            Ok::<_, kube::Error>(
                bd.is_none_or(|b| b.metadata.deletion_timestamp.is_some())
                    .then_some(()),
            )
        })
        .await;
        let _ = bds
            .patch(
                bundle,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        wait_gone(&bds, bundle, "BundleDeployment gone without the agent").await;
    }
    // (Nothing downstream can change while the agent is away; what it removes on its return,
    // and what it must not, is e2e/tests/agent_return.rs with the real binary.)
    let down = ws.downstream(&east.downstream).await;
    assert!(
        Api::<Secret>::namespaced(down.clone(), &gone_ns)
            .get_opt("db-creds")
            .await
            .unwrap()
            .is_some(),
        "deployed before the agent went away"
    );

    east.restart().await;
    wait_gone(
        &Api::<Secret>::namespaced(down.clone(), &gone_ns),
        "db-creds",
        "swept copy",
    )
    .await;
    wait_gone(
        &Api::<ConfigMap>::namespaced(down.clone(), &gone_ns),
        "app-settings",
        "swept manifest",
    )
    .await;
    let kept = Api::<Secret>::namespaced(down.clone(), &kept_ns);
    eventually("kept copy released", WAIT, || async {
        let s = kept.get("db-creds").await?;
        Ok::<_, kube::Error>((!has_tender_metadata(&s.metadata)).then_some(()))
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Secrecy: no Secret value in logs, events, status or metrics.

#[tokio::test]
async fn no_secret_value_in_logs_events_status_or_metrics() {
    let capture = fixture::capture_logs();
    let ws = Workspace::new(shared_env(2).await, "agent-secrecy").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let west = ws.agent("west", &downstream_name(2)).await;
    let target = unique_name("apps");
    let first = format!("first-{}", unique_name("s3cr3t"));
    let second = format!("second-{}", unique_name("s3cr3t"));

    // West already has an unmanaged Secret of that name: the conflict path reports too.
    let west_down = ws.downstream(&west.downstream).await;
    create_namespace(&west_down, &target).await;
    Api::<Secret>::namespaced(west_down.clone(), &target)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("db-creds".into()),
                    ..Default::default()
                },
                data: Some(bytes(&[("password", &first)])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    ws.source_secret("db-creds", &[("password", &first)]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    ws.bundle("app", app_bundle(&["east", "west"], &target, false))
        .await;
    ws.ready("east", "app").await;
    let west_bds = ws.bds("west");
    eventually("west reports the conflict", WAIT, || async {
        let bd = west_bds.get_opt("app").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| {
            bd.status
                .as_ref()
                .is_some_and(|s| s.resources.iter().any(|r| r.state == ObjectState::Conflict))
        }))
    })
    .await;
    // A rotation, so both values pass through hub and agent.
    ws.source_secret("db-creds", &[("password", &second)]).await;
    let east_down = ws.downstream(&east.downstream).await;
    wait_secret(
        &east_down,
        &target,
        "db-creds",
        "the rotation at east",
        |s| secret_value(s, "password").as_deref() == Some(second.as_str()),
    )
    .await;
    ws.ready("east", "app").await;

    // Gather what operators see: status of every tender object, Events on the hub and
    // downstream, both components' metrics, and the logs.
    let mut seen = String::new();
    let dump = |v: serde_json::Value| serde_json::to_string(&v).unwrap();
    for b in Api::<tender_types::Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .list(&Default::default())
        .await
        .unwrap()
    {
        seen += &dump(serde_json::to_value(&b).unwrap());
    }
    for c in Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .list(&Default::default())
        .await
        .unwrap()
    {
        seen += &dump(serde_json::to_value(&c).unwrap());
    }
    for cluster in ["east", "west"] {
        for bd in ws.bds(cluster).list(&Default::default()).await.unwrap() {
            seen += &dump(serde_json::to_value(&bd).unwrap());
        }
    }
    let mut event_count = 0;
    for client in [&ws.hub, &east_down, &west_down] {
        for api in [
            Api::<k8s_openapi::api::core::v1::Event>::all((*client).clone())
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|e| serde_json::to_value(e).unwrap())
                .collect::<Vec<_>>(),
            Api::<k8s_openapi::api::events::v1::Event>::all((*client).clone())
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|e| serde_json::to_value(e).unwrap())
                .collect(),
        ] {
            event_count += api.len();
            for e in api {
                seen += &dump(e);
            }
        }
    }
    seen += &ws.hub_instance().metrics.encode();
    for a in [&east, &west] {
        seen += &a.handle().metrics.shared().encode();
    }
    let logs = capture.text();
    assert!(
        logs.contains("tender"),
        "the log capture works (it holds tender's own log lines)"
    );
    assert!(event_count > 0, "there are Events to inspect");
    assert!(seen.contains("Conflict"), "the conflict is reported");
    seen += &logs;

    for value in [&first, &second] {
        if let Some(form) = leaked(&seen, value) {
            panic!("a Secret value leaked into logs, events, status or metrics as {form}");
        }
    }
}

/// The form in which Secret value `value` appears in `haystack`, if it does: as is, base64
/// (how the API carries it) or as the Debug output of its bytes (what `{:?}` of a `Vec<u8>`,
/// a `&[u8]` or a `ByteString` prints: `[112, 97, 115, 115]`, also pretty-printed or without
/// spaces).
fn leaked(haystack: &str, value: &str) -> Option<String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(value);
    let debug = format!("{:?}", value.as_bytes());
    if let Some(form) = [value, b64.as_str(), debug.as_str()]
        .into_iter()
        .find(|needle| haystack.contains(needle))
    {
        return Some(form.to_string());
    }
    // The decimal bytes comma-separated, matched with all whitespace removed from the haystack.
    let decimals = value
        .bytes()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let compact: String = haystack.chars().filter(|c| !c.is_whitespace()).collect();
    compact
        .contains(&decimals)
        .then(|| format!("Debug-formatted bytes [{decimals}]"))
}

#[test]
fn the_leak_search_finds_every_form_of_a_value() {
    let value = "pass";
    let around = |s: String| format!("level=debug object={{\"data\": {s}}} done");
    for form in [
        "pass".to_string(),
        "cGFzcw==".to_string(),
        "[112, 97, 115, 115]".to_string(),
        "[112,97,115,115]".to_string(),
        format!("{:?}", value.as_bytes()),
        format!("{:?}", value.as_bytes().to_vec()),
        format!("{:#?}", value.as_bytes()),
        format!("{:?}", k8s_openapi::ByteString(value.as_bytes().to_vec())),
        format!("{:?}", bytes(&[("k", value)])),
    ] {
        assert!(
            leaked(&around(form.clone()), value).is_some(),
            "the leak search misses {form:?}"
        );
    }
    for clean in ["pas", "[112, 97, 115]", "[112, 97, 115, 116]", "cGFzc"] {
        assert_eq!(leaked(&around(clean.to_string()), value), None, "{clean}");
    }
}

#[tokio::test]
async fn notable_transitions_are_events_on_the_bundle_deployment() {
    use k8s_openapi::api::events::v1::Event;
    let ws = Workspace::new(shared_env(2).await, "agent-events").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("apps");
    ws.bundle("app", app_bundle(&["east"], &target, false))
        .await;
    ws.ready("east", "app").await;
    let events: Api<Event> = Api::namespaced(ws.hub.clone(), &ws.cluster_ns("east"));
    let reasons = || async {
        let list = events.list(&Default::default()).await?;
        Ok::<_, kube::Error>(
            list.items
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("BundleDeployment")
                            && r.name.as_deref() == Some("app")
                    })
                })
                .filter_map(|e| e.reason)
                .collect::<Vec<_>>(),
        )
    };
    eventually("a Deployed event", WAIT, || async {
        Ok::<_, kube::Error>(
            reasons()
                .await?
                .iter()
                .any(|r| r == "Deployed")
                .then_some(()),
        )
    })
    .await;
    // Drift corrected downstream is an event too.
    let down = ws.downstream(&east.downstream).await;
    Api::<Secret>::namespaced(down.clone(), &target)
        .delete("db-creds", &DeleteParams::default())
        .await
        .unwrap();
    eventually("a DriftCorrected event", WAIT, || async {
        Ok::<_, kube::Error>(
            reasons()
                .await?
                .iter()
                .any(|r| r == "DriftCorrected")
                .then_some(()),
        )
    })
    .await;
    // Steady state makes no more events: one per transition, not one per reconcile. Over the
    // window neither the Events on the BundleDeployment nor the agent's Event writes move.
    let metrics = east.handle().metrics.shared();
    let event_writes = move || {
        ["create", "patch", "update"]
            .iter()
            .map(|verb| metrics.kube_requests(verb, "events", ""))
            .sum::<u64>()
    };
    let writes = settled(
        "the agent's Event writes after the correction",
        Duration::from_secs(2),
        || async { event_writes() },
    )
    .await;
    let events_now = reasons().await.unwrap().len();
    stays(
        "Events on the BundleDeployment and the agent's Event writes",
        Duration::from_secs(5),
        &(events_now, writes),
        || async { (reasons().await.unwrap().len(), event_writes()) },
    )
    .await;
}

/// A rotation writes each copy before the BundleDeployment that names its new hash, so an
/// agent reconciling between the two writes finds the copy ahead of its deployment and waits
/// for the BundleDeployment; it never reports the copy `Missing` (CopyFailed, Ready=False) on
/// the way. The hub's writes pass a gate that holds them from the rotation on: the first held
/// write must be the copy, and while it is held nothing else of the cluster is written.
#[tokio::test]
async fn a_rotation_writes_the_copy_before_the_bundle_deployment_naming_it() {
    let env = shared_env(2).await;
    let ws = Workspace::without_hub(env, "agent-order").await;
    let gate = WriteGate::start(env.client(HUB).await.unwrap())
        .await
        .unwrap();
    let server = env.cluster(HUB).server.clone();
    let through = gate.rewrite_kubeconfig(&env.kubeconfig_as(HUB, ADMIN_USER), &server);
    let config = HubConfig {
        leader_election: None,
        ..hub_config(&ws.ns)
    };
    let hub = spawn_hub(&through, config).await.unwrap();
    hub.wait_ready(WAIT).await;
    let _east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("order");
    ws.bundle("app", fixture::app_bundle(&["east"], &target))
        .await;
    let before = ws.ready("east", "app").await;
    // The hub's writes after the first deployment (summaries) pass before the gate is armed.
    settled(
        "the hub's writes through the gate",
        Duration::from_secs(6),
        || {
            let n = gate.forwarded_writes();
            async move { n }
        },
    )
    .await;

    gate.hold_writes_after(0);
    ws.source_secret("db-creds", &[("password", "two")]).await;
    let cluster_ns = ws.cluster_ns("east");
    let held = eventually("the rotation's first hub write held", WAIT, || {
        let holding = gate.holding();
        let ns = cluster_ns.clone();
        async move {
            let ours: Vec<String> = holding.into_iter().filter(|w| w.contains(&ns)).collect();
            Ok::<_, std::convert::Infallible>((!ours.is_empty()).then_some(ours))
        }
    })
    .await;
    // While the copy is held, the hub writes nothing else for the cluster: the
    // BundleDeployment naming the new hash waits for its copy.
    stays(
        "no BundleDeployment write while its copy is held",
        Duration::from_secs(3),
        &false,
        || async {
            gate.holding()
                .iter()
                .any(|w| w.contains(&cluster_ns) && w.contains("bundledeployments"))
        },
    )
    .await;
    let holding: Vec<String> = gate
        .holding()
        .into_iter()
        .filter(|w| w.contains(&cluster_ns))
        .collect();
    assert!(
        held[0].contains("/secrets/") && holding.iter().all(|w| !w.contains("bundledeployments")),
        "the rotation's first write is the copy and its BundleDeployment waits for it; held: {holding:?}"
    );
    let bd = ws.bds("east").get("app").await.unwrap();
    assert_eq!(
        bd.spec.deployment_id, before.spec.deployment_id,
        "the BundleDeployment is not rewritten before its copy"
    );

    // Released: the rotation completes, and the agent never reported the copy missing.
    gate.release();
    let bds = ws.bds("east");
    // Every condition not True seen on the way, at each poll until the rotation is applied.
    let seen = std::sync::Mutex::new(Vec::new());
    let after = eventually("the rotation applied", WAIT, || async {
        let bd = bds.get("app").await?;
        let status = bd.status.as_ref();
        for c in status.map(|s| s.conditions.as_slice()).unwrap_or_default() {
            if c.status != "True" {
                let what = format!("{} {} {}", c.type_, c.reason, c.message);
                seen.lock().unwrap().push(what);
            }
        }
        // Signed copies (decision 0089-signed-copies): the BundleDeployment stays as it is and
        // the agent reports the new copy in appliedCopiesID.
        let applied = status.and_then(|s| s.applied_copies_id.as_deref());
        let before_applied = before
            .status
            .as_ref()
            .and_then(|s| s.applied_copies_id.as_deref());
        let done = bd.spec == before.spec && applied.is_some() && applied != before_applied;
        Ok::<_, kube::Error>(done.then_some(bd))
    })
    .await;
    let seen = seen.into_inner().unwrap();
    assert!(
        seen.is_empty(),
        "a condition went False during the rotation: {seen:?}"
    );
    let down = ws.downstream(&downstream_name(1)).await;
    wait_secret(
        &down,
        &target,
        "db-creds",
        "the rotated copy downstream",
        |s| secret_value(s, "password").as_deref() == Some("two"),
    )
    .await;
    eprintln!(
        "[{}] rotation: first hub write held {:?}; deployment {:?} applied, no condition False",
        ws.ns,
        held[0],
        after.status.and_then(|s| s.applied_copies_id)
    );
}

/// Removing one `downstreamResources` entry removes that copy downstream and nothing else
/// (issue 22: proven for a Secret and a ConfigMap, not only on the hub).
#[tokio::test]
async fn removing_an_entry_removes_exactly_that_copy_downstream() {
    let ws = Workspace::new(shared_env(2).await, "agent-entry").await;
    let target_ns = unique_name("entry");
    ws.source_secret("db-creds", &[("password", "p1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    let _agent = ws.agent("east", &downstream_name(1)).await;
    ws.bundle("app", fixture::app_bundle(&["east"], &target_ns))
        .await;
    ws.ready("east", "app").await;
    let down = ws.downstream(&downstream_name(1)).await;
    let secrets: Api<Secret> = Api::namespaced(down.clone(), &target_ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(down, &target_ns);
    assert!(secrets.get_opt("db-creds").await.unwrap().is_some());
    assert!(config_maps.get_opt("app-config").await.unwrap().is_some());

    let with_entries = |entries: Value| {
        let mut spec = fixture::app_bundle(&["east"], &target_ns);
        spec["downstreamResources"] = entries;
        spec
    };
    // The Secret entry goes: the Secret copy goes downstream, the ConfigMap stays.
    ws.bundle(
        "app",
        with_entries(json!([{"kind": "ConfigMap", "name": "app-config"}])),
    )
    .await;
    wait_gone(&secrets, "db-creds", "the Secret copy removed downstream").await;
    ws.ready("east", "app").await;
    stays(
        "the ConfigMap copy and the manifest",
        Duration::from_secs(3),
        &(true, true),
        || async {
            (
                config_maps.get_opt("app-config").await.unwrap().is_some(),
                config_maps.get_opt("app-settings").await.unwrap().is_some(),
            )
        },
    )
    .await;
    // The ConfigMap entry goes too: its copy goes, the manifest stays.
    ws.bundle("app", with_entries(json!([]))).await;
    wait_gone(
        &config_maps,
        "app-config",
        "the ConfigMap copy removed downstream",
    )
    .await;
    assert!(config_maps.get_opt("app-settings").await.unwrap().is_some());
}
