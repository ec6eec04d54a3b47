//! Attacks from the hub side, on one hub serving two workspaces (as the hub chart does by
//! default): an agent's own hub credential, a hub tenant who may create namespaces, and a
//! Bundle writer naming credentials the workspace holds. The hub decides where it writes from
//! what only the hub decides (decision 0073-hub-writes-where-it-derives), writes only into
//! namespaces it provably created (decision 0074-cluster-namespaces-provably-the-hubs), never
//! copies a push kubeconfig or a ServiceAccount token (decision 0075-credentials-never-copied),
//! and bounds what one Bundle's copies hold on the hub (decision 0080-copied-bytes-per-bundle).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tender_e2e::fixture::{WAIT, Workspace, config_map, stays};
use tender_e2e::hub_harness::{HubHandle, agent_kubeconfig, hub_config, start_hub};
use tender_e2e::{TestEnv, client_from_yaml, eventually, shared_env};
use tender_types::conditions::{TYPE_READY, find_condition, reason};
use tender_types::{Bundle, BundleDeployment, Cluster, labels, names};

/// Two workspaces served by one hub instance.
async fn two_workspaces(env: &'static TestEnv, prefix: &str) -> (Workspace, Workspace, HubHandle) {
    two_workspaces_with(env, prefix, |_| {}).await
}

/// Like [`two_workspaces`], the hub's configuration changed by `configure`.
async fn two_workspaces_with(
    env: &'static TestEnv,
    prefix: &str,
    configure: impl FnOnce(&mut tender_hub::HubConfig),
) -> (Workspace, Workspace, HubHandle) {
    let a = Workspace::without_hub(env, &format!("{prefix}-a")).await;
    let b = Workspace::without_hub(env, &format!("{prefix}-b")).await;
    let mut config = hub_config(&a.ns);
    config.workspace_namespaces = vec![a.ns.clone(), b.ns.clone()];
    configure(&mut config);
    let hub = start_hub(env, config).await.unwrap();
    (a, b, hub)
}

fn copying_bundle(cluster: &str, source: &str) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "defaultNamespace": "app",
        "downstreamResources": [{"kind": "Secret", "name": source}],
    })
}

/// Names of the BundleDeployments and of the copies (Secrets labelled with a Bundle) in `ns`.
async fn written_into(hub: &kube::Client, ns: &str) -> (Vec<String>, Vec<String>) {
    let bds: Api<BundleDeployment> = Api::namespaced(hub.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), ns);
    let bd_names = bds
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|b| b.metadata.name.unwrap_or_default())
        .collect();
    let copies = secrets
        .list(&ListParams::default().labels(labels::BUNDLE_NAME))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.metadata.name.unwrap_or_default())
        .collect();
    (bd_names, copies)
}

#[tokio::test]
async fn an_agent_credential_cannot_point_the_hub_at_another_workspace() {
    let env = shared_env(1).await;
    let (a, b, _hub) = two_workspaces(env, "forge").await;
    a.cluster("a1").await;
    b.cluster("b1").await;
    let b1_ns = b.cluster_ns("b1");
    a.source_secret("a-token", &[("token", "workspace-a-only")])
        .await;
    a.bundle("a-app", copying_bundle("a1", "a-token")).await;
    eventually("a-app's BundleDeployment for a1", WAIT, || async {
        Ok::<_, kube::Error>(a.bds("a1").get_opt("a-app").await?.map(|_| ()))
    })
    .await;

    // a1's agent credential: the identity `tender cluster add` hands to a1's agent.
    let agent = client_from_yaml(&agent_kubeconfig(env, &a.hub, &a.ns, "a1").await.unwrap())
        .await
        .unwrap();
    let own: Api<Cluster> = Api::namespaced(agent.clone(), &a.ns);
    // The forger rewrites every Cluster status field that credential can write, over and
    // over, while workspace A's source rotates and its Bundle changes (each wakes the hub).
    let forged = json!({"status": {
        "namespace": b1_ns,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "summary": {"desiredReady": 9, "ready": 9},
    }});
    // Its BundleDeployments' status and its heartbeat Lease too: all it may write on the hub.
    let a1_ns = a.cluster_ns("a1");
    let own_bds: Api<BundleDeployment> = Api::namespaced(agent.clone(), &a1_ns);
    let own_leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(agent.clone(), &a1_ns);
    let forged_bd = json!({"status": {"appliedDeploymentID": "forged",
        "display": {"state": "Ready"}}});
    let forged_lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": names::AGENT_LEASE, "namespace": a1_ns},
        "spec": {"holderIdentity": b1_ns, "leaseDurationSeconds": 90},
    });
    let forger = tokio::spawn({
        let own = own.clone();
        async move {
            loop {
                own.patch_status("a1", &PatchParams::default(), &Patch::Merge(&forged))
                    .await
                    .expect("the agent credential may write its Cluster's status");
                own_bds
                    .patch_status("a-app", &PatchParams::default(), &Patch::Merge(&forged_bd))
                    .await
                    .expect("the agent credential may write its BundleDeployment's status");
                // Its heartbeat Lease, naming the other workspace's namespace.
                own_leases
                    .patch(
                        names::AGENT_LEASE,
                        &PatchParams::apply("forger").force(),
                        &Patch::Apply(&forged_lease),
                    )
                    .await
                    .expect("the agent credential may write its Lease");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let rotations = tokio::spawn(async move {
        for i in 0..12 {
            a.source_secret("a-token", &[("token", &format!("rotated-{i}"))])
                .await;
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        a
    });
    stays(
        "what the hub wrote into workspace B's cluster namespace",
        Duration::from_secs(8),
        &(Vec::<String>::new(), Vec::<String>::new()),
        || written_into(&b.hub, &b1_ns),
    )
    .await;
    forger.abort();
    let a = rotations.await.unwrap();

    // The hub's own fields come back, and workspace A's copies stayed in a1's namespace.
    eventually(
        "a1's status names its own namespace again",
        WAIT,
        || async {
            let c = Api::<Cluster>::namespaced(a.hub.clone(), &a.ns)
                .get("a1")
                .await?;
            Ok::<_, kube::Error>(
                (c.status.and_then(|s| s.namespace).as_deref() == Some(a1_ns.as_str()))
                    .then_some(()),
            )
        },
    )
    .await;
    let (bds, copies) = written_into(&a.hub, &a1_ns).await;
    assert_eq!(bds, vec!["a-app".to_string()]);
    assert_eq!(copies.len(), 1, "{copies:?}");
}

#[tokio::test]
async fn an_agent_relabelling_its_bundle_deployment_reaches_no_other_workspace() {
    let env = shared_env(1).await;
    let (a, b, _hub) = two_workspaces(env, "relabel").await;
    a.cluster("a1").await;
    b.cluster("b1").await;
    a.source_secret("a-token", &[("token", "a")]).await;
    b.source_secret("b-token", &[("token", "b")]).await;
    a.bundle("app", copying_bundle("a1", "a-token")).await;
    b.bundle("app", copying_bundle("b1", "b-token")).await;
    let a_bd = eventually("A's BundleDeployment", WAIT, || async {
        a.bds("a1").get_opt("app").await
    })
    .await;
    eventually("B's BundleDeployment", WAIT, || async {
        Ok::<_, kube::Error>(b.bds("b1").get_opt("app").await?.map(|_| ()))
    })
    .await;

    // a1's agent may patch its BundleDeployments (it removes their finalizer): it relabels
    // its own as workspace B's Bundle `app`.
    let agent = client_from_yaml(&agent_kubeconfig(env, &a.hub, &a.ns, "a1").await.unwrap())
        .await
        .unwrap();
    Api::<BundleDeployment>::namespaced(agent, &a.cluster_ns("a1"))
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {
                labels::WORKSPACE: b.ns,
                labels::BUNDLE_NAMESPACE: b.ns,
            }}})),
        )
        .await
        .unwrap();

    // B's Bundle keeps counting only its own cluster; A's BundleDeployment is not deleted
    // (same uid), and the hub restores its labels.
    let b_bundles: Api<Bundle> = Api::namespaced(b.hub.clone(), &b.ns);
    stays(
        "B's Bundle's desired count and A's BundleDeployment's uid",
        Duration::from_secs(6),
        &(Some(1), a_bd.metadata.uid.clone()),
        || async {
            let desired = b_bundles
                .get("app")
                .await
                .unwrap()
                .status
                .and_then(|s| s.summary)
                .map(|s| s.desired_ready);
            let uid = a
                .bds("a1")
                .get_opt("app")
                .await
                .unwrap()
                .and_then(|bd| bd.metadata.uid);
            (desired, uid)
        },
    )
    .await;
    eventually(
        "A's BundleDeployment labelled as A's again",
        WAIT,
        || async {
            let bd = a.bds("a1").get("app").await?;
            let l = bd.metadata.labels.unwrap_or_default();
            Ok::<_, kube::Error>((l.get(labels::BUNDLE_NAMESPACE) == Some(&a.ns)).then_some(()))
        },
    )
    .await;
}

#[tokio::test]
async fn a_namespace_created_before_its_cluster_is_never_adopted_nor_deleted() {
    let env = shared_env(1).await;
    let (a, _b, _hub) = two_workspaces(env, "squat").await;
    let ns = a.cluster_ns("late");
    // A hub tenant who may create namespaces creates the one Cluster `late` will need, dressed
    // as the hub's own, with data of its own inside.
    let namespaces: Api<Namespace> = Api::all(a.hub.clone());
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.clone()),
                    labels: Some(BTreeMap::from([
                        (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
                        (labels::WORKSPACE.into(), a.ns.clone()),
                        (labels::CLUSTER.into(), "late".into()),
                    ])),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(a.hub.clone(), &ns)
        .create(
            &PostParams::default(),
            &config_map("tenant-data", &[("k", "v")]),
        )
        .await
        .unwrap();

    let clusters: Api<Cluster> = Api::namespaced(a.hub.clone(), &a.ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
                "metadata": {"name": "late", "labels": {"env": "test"}}, "spec": {}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    a.source_secret("a-token", &[("token", "a")]).await;
    a.bundle("app", copying_bundle("late", "a-token")).await;
    let ready = eventually(
        "Cluster late says its namespace is not tender's",
        WAIT,
        || async {
            let c = clusters.get("late").await?;
            Ok::<_, kube::Error>(c.status.and_then(|s| {
                find_condition(&s.conditions, TYPE_READY)
                    .filter(|c| c.reason == reason::NAMESPACE_NOT_OWNED)
                    .cloned()
            }))
        },
    )
    .await;
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains(&ns), "{}", ready.message);

    // Nothing provisioned or written there: no agent identity, no BundleDeployment, no copy.
    let accounts: Api<ServiceAccount> = Api::namespaced(a.hub.clone(), &ns);
    stays(
        "what the hub wrote into the tenant's namespace",
        Duration::from_secs(4),
        &(false, (Vec::<String>::new(), Vec::<String>::new())),
        || async {
            (
                accounts
                    .get_opt(names::AGENT_SERVICE_ACCOUNT)
                    .await
                    .unwrap()
                    .is_some(),
                written_into(&a.hub, &ns).await,
            )
        },
    )
    .await;

    // Deleting the Cluster completes and leaves the tenant's namespace and data alone.
    clusters
        .delete("late", &DeleteParams::default())
        .await
        .unwrap();
    eventually("Cluster late gone", WAIT, || async {
        Ok::<_, kube::Error>(clusters.get_opt("late").await?.is_none().then_some(()))
    })
    .await;
    stays(
        "the tenant's namespace and ConfigMap",
        Duration::from_secs(3),
        &(true, true),
        || async {
            let live = namespaces.get_opt(&ns).await.unwrap();
            (
                live.is_some_and(|n| n.metadata.deletion_timestamp.is_none()),
                Api::<ConfigMap>::namespaced(a.hub.clone(), &ns)
                    .get_opt("tenant-data")
                    .await
                    .unwrap()
                    .is_some(),
            )
        },
    )
    .await;
}

#[tokio::test]
async fn a_bundle_never_copies_a_push_kubeconfig_or_a_service_account_token() {
    let env = shared_env(1).await;
    let (a, _b, _hub) = two_workspaces(env, "steal").await;
    a.cluster("pulled").await;
    // A push Cluster's kubeconfig (cluster-admin on its cluster, by design) and a
    // ServiceAccount token Secret, both in the workspace a Bundle writer writes to.
    a.source_secret(
        "push-kubeconfig",
        &[("value", "apiVersion: v1\nkind: Config\n")],
    )
    .await;
    let clusters: Api<Cluster> = Api::namespaced(a.hub.clone(), &a.ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
                "metadata": {"name": "pushed"},
                "spec": {"kubeconfigSecretRef": {"name": "push-kubeconfig"}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(a.hub.clone(), &a.ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                "metadata": {"name": "default-token",
                             "annotations": {"kubernetes.io/service-account.name": "default"}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    eventually("the token controller fills the token", WAIT, || async {
        let s = secrets.get("default-token").await?;
        Ok::<_, kube::Error>(s.data.filter(|d| d.contains_key("token")).map(|_| ()))
    })
    .await;

    a.bundle("steal", copying_bundle("pulled", "push-kubeconfig"))
        .await;
    a.bundle("steal-token", copying_bundle("pulled", "default-token"))
        .await;
    let bundles: Api<Bundle> = Api::namespaced(a.hub.clone(), &a.ns);
    for (bundle, source) in [
        ("steal", "push-kubeconfig"),
        ("steal-token", "default-token"),
    ] {
        let copied = eventually(&format!("{bundle} refuses {source}"), WAIT, || async {
            let b = bundles.get(bundle).await?;
            Ok::<_, kube::Error>(b.status.and_then(|s| {
                find_condition(
                    &s.conditions,
                    tender_types::conditions::TYPE_RESOURCES_COPIED,
                )
                .filter(|c| c.reason == reason::SOURCE_REFUSED)
                .cloned()
            }))
        })
        .await;
        assert_eq!(copied.status, "False");
        assert!(
            copied.message.contains(&format!("Secret/{source}")),
            "{}",
            copied.message
        );
    }
    stays(
        "copies in the pulled cluster's namespace",
        Duration::from_secs(4),
        &Vec::<String>::new(),
        || async { written_into(&a.hub, &a.cluster_ns("pulled")).await.1 },
    )
    .await;
}

#[tokio::test]
async fn a_bundle_cannot_fill_the_hubs_etcd_with_copies() {
    let env = shared_env(1).await;
    let (a, _b, _hub) = two_workspaces_with(env, "fill", |c| {
        c.max_copied_bytes_per_bundle = 5_000;
    })
    .await;
    for c in ["c1", "c2", "c3"] {
        a.cluster(c).await;
    }
    // 2 000 bytes of content: one cluster's copy fits the limit, three do not.
    let big = "x".repeat(2_000 - "blob".len());
    a.source_secret("blob", &[("blob", &big)]).await;
    a.bundle("fill", copying_bundle("c1", "blob")).await;
    eventually("c1's copy", WAIT, || async {
        Ok::<_, kube::Error>(
            (written_into(&a.hub, &a.cluster_ns("c1")).await.1.len() == 1).then_some(()),
        )
    })
    .await;

    a.bundle(
        "fill",
        json!({
            "targets": [{"clusterName": "c1"}, {"clusterName": "c2"}, {"clusterName": "c3"}],
            "defaultNamespace": "app",
            "downstreamResources": [{"kind": "Secret", "name": "blob"}],
        }),
    )
    .await;
    let bundles: Api<Bundle> = Api::namespaced(a.hub.clone(), &a.ns);
    let copied = eventually("the Bundle names the limit", WAIT, || async {
        let b = bundles.get("fill").await?;
        Ok::<_, kube::Error>(b.status.and_then(|s| {
            find_condition(
                &s.conditions,
                tender_types::conditions::TYPE_RESOURCES_COPIED,
            )
            .filter(|c| c.reason == reason::COPY_LIMIT_EXCEEDED)
            .cloned()
        }))
    })
    .await;
    assert_eq!(copied.status, "False");
    assert!(
        copied.message.contains("6000 bytes") && copied.message.contains("5000"),
        "{}",
        copied.message
    );
    // Nothing new is written; what c1 had stays.
    stays(
        "copies in c1, c2 and c3's namespaces",
        Duration::from_secs(4),
        &(1, 0, 0),
        || async {
            (
                written_into(&a.hub, &a.cluster_ns("c1")).await.1.len(),
                written_into(&a.hub, &a.cluster_ns("c2")).await.1.len(),
                written_into(&a.hub, &a.cluster_ns("c3")).await.1.len(),
            )
        },
    )
    .await;
}
