//! `dependsOn` and `rolloutOnCopyChange` end to end on real clusters (docs/dependencies.md).
//!
//! The test clusters run no Deployment controller: the test plays it by writing the
//! Deployments' status (as `kubelet_player` does), so it decides when a workload is available.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tender_e2e::fixture::{Workspace, create_namespace, stays};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_READY, find_condition, is_true, reason};
use tender_types::{Bundle, BundleDeployment, labels};

const WAIT: Duration = tender_e2e::fixture::WAIT;

/// A Deployment `name` in `ns` with one replica; `secret` mounted as a volume when given.
fn deployment(name: &str, secret: Option<&str>) -> Value {
    let mut pod = json!({"containers": [{"name": "app", "image": "registry.invalid/app:1"}]});
    if let Some(s) = secret {
        pod["volumes"] = json!([{"name": "creds", "secret": {"secretName": s}}]);
        pod["containers"][0]["volumeMounts"] = json!([{"name": "creds", "mountPath": "/creds"}]);
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod}
        }
    })
}

/// Plays the Deployment controller: writes `name`'s status for its current generation with
/// `replicas` pods of which `updated` run the latest template and `available` are available.
async fn play(
    down: &kube::Client,
    ns: &str,
    name: &str,
    replicas: i64,
    updated: i64,
    available: i64,
) {
    let api: Api<Deployment> = Api::namespaced(down.clone(), ns);
    let d = eventually(&format!("Deployment {ns}/{name}"), WAIT, || async {
        api.get_opt(name).await
    })
    .await;
    let generation = d.metadata.generation.unwrap_or(1);
    let status = json!({"status": {
        "observedGeneration": generation, "replicas": replicas, "updatedReplicas": updated,
        "readyReplicas": available, "availableReplicas": available,
        "unavailableReplicas": replicas - available,
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Whether a BundleDeployment is Ready at its current deploymentID.
fn bd_ready(bd: &BundleDeployment) -> bool {
    bd.status.as_ref().is_some_and(|s| {
        s.applied_deployment_id.as_deref() == Some(bd.spec.deployment_id.as_str())
            && is_true(&s.conditions, TYPE_READY)
            && s.modified.is_empty()
    })
}

/// One watch event of a BundleDeployment: name, spec deploymentID, Ready.
type Seen = (String, String, bool);

/// Records every BundleDeployment event of cluster namespace `ns`, in the apiserver's order.
fn record(hub: &kube::Client, ns: &str) -> (Arc<Mutex<Vec<Seen>>>, tokio::task::JoinHandle<()>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let api: Api<BundleDeployment> = Api::namespaced(hub.clone(), ns);
    let sink = log.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(bd) | watcher::Event::InitApply(bd)) = event {
                let seen = (
                    bd.metadata.name.clone().unwrap_or_default(),
                    bd.spec.deployment_id.clone(),
                    bd_ready(&bd),
                );
                sink.lock().unwrap().push(seen);
            }
        }
    });
    (log, task)
}

/// Every time `dependent`'s BundleDeployment got a new deploymentID (created or changed), the
/// last seen state of `dependency`'s was Ready. Returns how many such writes there were.
fn held_until_ready(log: &[Seen], dependency: &str, dependent: &str) -> usize {
    let (mut dep_ready, mut last_id, mut writes) = (false, None::<String>, 0);
    for (name, id, ready) in log {
        if name == dependency {
            dep_ready = *ready;
        } else if name == dependent && last_id.as_ref() != Some(id) {
            assert!(
                dep_ready,
                "{dependent} got deploymentID {id} while {dependency} was not Ready: {log:?}"
            );
            last_id = Some(id.clone());
            writes += 1;
        }
    }
    writes
}

async fn ready_reason(ws: &Workspace, bundle: &str) -> Option<(String, String)> {
    let b = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .get_opt(bundle)
        .await
        .ok()??;
    let c = find_condition(&b.status?.conditions, TYPE_READY)?.clone();
    Some((c.reason, c.message))
}

async fn bundle_reason(ws: &Workspace, bundle: &str, want: &str) -> String {
    eventually(
        &format!("Bundle {bundle} Ready=False with reason {want}"),
        WAIT,
        || async {
            Ok::<_, kube::Error>(
                ready_reason(ws, bundle)
                    .await
                    .filter(|(r, _)| r == want)
                    .map(|(_, m)| m),
            )
        },
    )
    .await
}

async fn bd_exists(ws: &Workspace, cluster: &str, bundle: &str) -> bool {
    ws.bds(cluster).get_opt(bundle).await.unwrap().is_some()
}

async fn bd_id(ws: &Workspace, cluster: &str, bundle: &str) -> Option<String> {
    ws.bds(cluster)
        .get_opt(bundle)
        .await
        .unwrap()
        .map(|bd| bd.spec.deployment_id)
}

async fn config_value(down: &kube::Client, ns: &str, name: &str) -> Option<String> {
    Api::<ConfigMap>::namespaced(down.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|c| c.data?.get("v").cloned())
}

#[tokio::test]
async fn a_dependent_waits_per_cluster_for_its_dependency() {
    let ws = Workspace::new(shared_env(2).await, "deps-order").await;
    let _one = ws.agent("one", &downstream_name(1)).await;
    let _two = ws.agent("two", &downstream_name(2)).await;
    let target = unique_name("deps");
    let (down1, down2) = (
        ws.downstream(&downstream_name(1)).await,
        ws.downstream(&downstream_name(2)).await,
    );
    create_namespace(&down1, &target).await;
    create_namespace(&down2, &target).await;
    let (log1, watch1) = record(&ws.hub, &ws.cluster_ns("one"));
    let (log2, watch2) = record(&ws.hub, &ws.cluster_ns("two"));
    let both = json!([{"clusterName": "one"}, {"clusterName": "two"}]);

    // A: a Deployment nobody makes available yet. B depends on A.
    ws.bundle(
        "a",
        json!({"targets": both, "defaultNamespace": target, "resources": [deployment("db", None)]}),
    )
    .await;
    let b_spec = |v: &str| {
        json!({
            "targets": both, "defaultNamespace": target,
            "dependsOn": [{"name": "a"}],
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "b-settings"}, "data": {"v": v}}]
        })
    };
    ws.bundle("b", b_spec("1")).await;
    eventually("A deployed (not ready) on both", WAIT, || async {
        Ok::<_, kube::Error>(
            (bd_exists(&ws, "one", "a").await && bd_exists(&ws, "two", "a").await).then_some(()),
        )
    })
    .await;
    let message = bundle_reason(&ws, "b", reason::DEPENDENCY_NOT_READY).await;
    assert!(message.contains("one (a: "), "{message}");
    stays(
        "B's BundleDeployments while A is not ready anywhere",
        Duration::from_secs(4),
        &(false, false),
        || async {
            (
                bd_exists(&ws, "one", "b").await,
                bd_exists(&ws, "two", "b").await,
            )
        },
    )
    .await;

    // A ready on one: B comes to one only.
    play(&down1, &target, "db", 1, 1, 1).await;
    ws.ready("one", "a").await;
    ws.ready("one", "b").await;
    assert_eq!(
        config_value(&down1, &target, "b-settings").await.as_deref(),
        Some("1")
    );
    stays(
        "B's BundleDeployment on two while A is not ready there",
        Duration::from_secs(3),
        &false,
        || async { bd_exists(&ws, "two", "b").await },
    )
    .await;
    play(&down2, &target, "db", 1, 1, 1).await;
    ws.ready("two", "b").await;
    eventually("B Ready", WAIT, || async {
        Ok::<_, kube::Error>(
            ready_reason(&ws, "b")
                .await
                .filter(|(r, _)| r == reason::READY),
        )
    })
    .await;

    // A goes unavailable on one: a change of B reaches two, and one keeps what it has.
    play(&down1, &target, "db", 1, 1, 0).await;
    eventually("A not ready on one", WAIT, || async {
        let bd = ws.bds("one").get_opt("a").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| !bd_ready(bd)).map(|_| ()))
    })
    .await;
    // The hub has seen it: B says one waits.
    eventually("B waiting on one", WAIT, || async {
        Ok::<_, kube::Error>(
            ready_reason(&ws, "b").await.filter(|(r, m)| {
                r == reason::DEPENDENCY_NOT_READY && m.contains("one (a: NotReady)")
            }),
        )
    })
    .await;
    let held_id = bd_id(&ws, "one", "b").await;
    ws.bundle("b", b_spec("2")).await;
    eventually("B's change on two", WAIT, || async {
        Ok::<_, kube::Error>(
            (config_value(&down2, &target, "b-settings").await.as_deref() == Some("2"))
                .then_some(()),
        )
    })
    .await;
    ws.ready("two", "b").await;
    stays(
        "B on one while A is not ready there",
        Duration::from_secs(4),
        &(held_id.clone(), Some("1".to_string())),
        || async {
            (
                bd_id(&ws, "one", "b").await,
                config_value(&down1, &target, "b-settings").await,
            )
        },
    )
    .await;
    // A available again on one: the held change follows.
    play(&down1, &target, "db", 1, 1, 1).await;
    eventually("B's change on one", WAIT, || async {
        Ok::<_, kube::Error>(
            (config_value(&down1, &target, "b-settings").await.as_deref() == Some("2"))
                .then_some(()),
        )
    })
    .await;
    ws.ready("one", "b").await;

    // Watched throughout: B never got a new deploymentID on a cluster where A was not Ready.
    let writes1 = held_until_ready(&log1.lock().unwrap(), "a", "b");
    let writes2 = held_until_ready(&log2.lock().unwrap(), "a", "b");
    assert_eq!((writes1, writes2), (2, 2), "B written twice per cluster");
    watch1.abort();
    watch2.abort();

    // Idle stays idle: with dependencies in place and nothing changing, the hub neither writes
    // nor reconciles Bundles.
    let hub = ws.hub_instance();
    // Settled for longer than the hub's Cluster summary delay (5 s), which may still hold the
    // last BundleDeployment change's Cluster status write.
    let quiet = tender_e2e::fixture::settled(
        "the hub's writes and Bundle reconciles",
        tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY + Duration::from_secs(1),
        || async { (hub.writes(), hub.reconciles("bundle")) },
    )
    .await;
    stays(
        "the hub's writes and Bundle reconciles while idle",
        Duration::from_secs(6),
        &quiet,
        || async { (hub.writes(), hub.reconciles("bundle")) },
    )
    .await;
}

#[tokio::test]
async fn a_cycle_and_a_missing_dependency_are_named_and_nothing_is_written() {
    let ws = Workspace::new(shared_env(2).await, "deps-bad").await;
    let _one = ws.agent("one", &downstream_name(1)).await;
    let target = unique_name("deps");
    let spec = |name: &str, deps: Value| {
        json!({
            "targets": [{"clusterName": "one"}], "defaultNamespace": target,
            "dependsOn": deps,
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name}, "data": {"v": "1"}}]
        })
    };
    // c -> d -> c, and e -> (Bundles labelled tier=ghost: none).
    ws.bundle("c", spec("c", json!([{"name": "d"}]))).await;
    ws.bundle("d", spec("d", json!([{"name": "c"}]))).await;
    ws.bundle(
        "e",
        spec(
            "e",
            json!([{"selector": {"matchLabels": {"tier": "ghost"}}}]),
        ),
    )
    .await;
    let c = bundle_reason(&ws, "c", reason::DEPENDENCY_CYCLE).await;
    assert!(c.contains("c -> d -> c"), "{c}");
    let d = bundle_reason(&ws, "d", reason::DEPENDENCY_CYCLE).await;
    assert!(d.contains("d -> c -> d"), "{d}");
    let e = bundle_reason(&ws, "e", reason::DEPENDENCY_NOT_FOUND).await;
    assert!(e.contains("tier"), "{e}");
    stays(
        "BundleDeployments of a cycle and of a missing dependency",
        Duration::from_secs(3),
        &(false, false, false),
        || async {
            (
                bd_exists(&ws, "one", "c").await,
                bd_exists(&ws, "one", "d").await,
                bd_exists(&ws, "one", "e").await,
            )
        },
    )
    .await;
    // A cycle is no loop: the hub settles and stays quiet.
    let hub = ws.hub_instance();
    // Settled for longer than the hub's Cluster summary delay (5 s), which may still hold the
    // last BundleDeployment change's Cluster status write.
    let quiet = tender_e2e::fixture::settled(
        "the hub's writes and Bundle reconciles",
        tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY + Duration::from_secs(1),
        || async { (hub.writes(), hub.reconciles("bundle")) },
    )
    .await;
    stays(
        "the hub's writes and Bundle reconciles with a cycle in place",
        Duration::from_secs(5),
        &quiet,
        || async { (hub.writes(), hub.reconciles("bundle")) },
    )
    .await;
    // The dependency appears (a Bundle labelled tier=ghost, deployed and ready): e proceeds.
    Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .patch(
            "ghost",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(json!({
                "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
                "metadata": {"name": "ghost", "labels": {"tier": "ghost"}},
                "spec": spec("ghost", json!([]))
            })),
        )
        .await
        .unwrap();
    ws.ready("one", "e").await;
    // Breaking the cycle frees both, in order.
    ws.bundle("d", spec("d", json!([]))).await;
    ws.ready("one", "c").await;
}

async fn template_annotation(down: &kube::Client, ns: &str, name: &str) -> Option<String> {
    Api::<Deployment>::namespaced(down.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|d| d.spec?.template.metadata?.annotations)
        .and_then(|a| a.get(labels::COPIES_HASH).cloned())
}

async fn generation(down: &kube::Client, ns: &str, name: &str) -> Option<i64> {
    Api::<Deployment>::namespaced(down.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|d| d.metadata.generation)
}

#[tokio::test]
async fn a_rotation_rolls_the_consumers_and_readiness_waits_for_them() {
    let ws = Workspace::new(shared_env(2).await, "deps-roll").await;
    let _one = ws.agent("one", &downstream_name(1)).await;
    let down = ws.downstream(&downstream_name(1)).await;
    let (rolled_ns, plain_ns) = (unique_name("roll"), unique_name("plain"));
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    let app = |ns: &str, on: bool| {
        json!({
            "targets": [{"clusterName": "one"}], "defaultNamespace": ns,
            "rolloutOnCopyChange": on,
            "downstreamResources": [{"kind": "Secret", "name": "db-creds"}],
            "resources": [deployment("web", Some("db-creds"))]
        })
    };
    ws.bundle("rolled", app(&rolled_ns, true)).await;
    ws.bundle("plain", app(&plain_ns, false)).await;
    play(&down, &rolled_ns, "web", 1, 1, 1).await;
    play(&down, &plain_ns, "web", 1, 1, 1).await;
    ws.ready("one", "rolled").await;
    ws.ready("one", "plain").await;
    let first = template_annotation(&down, &rolled_ns, "web")
        .await
        .expect("the consumer of a copy is annotated");
    assert_eq!(template_annotation(&down, &plain_ns, "web").await, None);
    let plain_generation = generation(&down, &plain_ns, "web").await;

    // Rotate: the consumer's pod template changes downstream...
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    let second = eventually(
        "the consumer's annotation after the rotation",
        WAIT,
        || async {
            Ok::<_, kube::Error>(
                template_annotation(&down, &rolled_ns, "web")
                    .await
                    .filter(|a| *a != first),
            )
        },
    )
    .await;
    assert!(!second.contains("v2"));
    // ...and the deployment is applied but not ready while the rollout is under way: the
    // controller saw it, a new pod is up but the old one has not gone yet.
    let applied = eventually("the rotation applied", WAIT, || async {
        let bd = ws.bds("one").get_opt("rolled").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| {
            bd.status
                .as_ref()
                .and_then(|s| s.applied_deployment_id.as_deref())
                == Some(bd.spec.deployment_id.as_str())
        }))
    })
    .await;
    play(&down, &rolled_ns, "web", 2, 1, 1).await;
    let id = applied.spec.deployment_id.clone();
    stays(
        "the BundleDeployment while the consumer rolls",
        Duration::from_secs(4),
        &(id.clone(), false),
        || async {
            let bd = ws.bds("one").get_opt("rolled").await.unwrap().unwrap();
            (bd.spec.deployment_id.clone(), bd_ready(&bd))
        },
    )
    .await;
    play(&down, &rolled_ns, "web", 1, 1, 1).await;
    let ready = ws.ready("one", "rolled").await;
    assert_eq!(ready.spec.deployment_id, id);

    // Without the field the same consumer is never touched by the rotation.
    ws.ready("one", "plain").await;
    assert_eq!(template_annotation(&down, &plain_ns, "web").await, None);
    assert_eq!(generation(&down, &plain_ns, "web").await, plain_generation);
}

#[tokio::test]
async fn a_bad_depends_on_entry_is_refused_at_admission() {
    let ws = Workspace::without_hub(shared_env(2).await, "deps-admission").await;
    let bundles = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns);
    let refused = |deps: Value| {
        let bundles = bundles.clone();
        async move {
            let body = json!({"apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
                "metadata": {"name": "bad"}, "spec": {"dependsOn": deps}});
            bundles
                .patch(
                    "bad",
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(body),
                )
                .await
                .expect_err("refused")
                .to_string()
        }
    };
    let empty = refused(json!([{"acceptedStates": ["Ready"]}])).await;
    assert!(
        empty.contains("dependsOn[] must set name or selector"),
        "{empty}"
    );
    let state = refused(json!([{"name": "a", "acceptedStates": ["Healthy"]}])).await;
    assert!(
        state.contains("acceptedStates") && state.contains("Healthy"),
        "{state}"
    );
    // A HelmOp takes it too (no longer refused as Fleet-only).
    let helmop: Api<tender_types::HelmOp> = Api::namespaced(ws.hub.clone(), &ws.ns);
    helmop
        .patch(
            "web",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(
                json!({"apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
                "metadata": {"name": "web"},
                "spec": {"helm": {"chart": "web", "repo": "https://charts.invalid"},
                         "dependsOn": [{"name": "db", "acceptedStates": ["Ready", "Modified"]}]}}),
            ),
        )
        .await
        .unwrap();
}
