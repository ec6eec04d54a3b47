//! Hub sharding by Cluster label (issue 13, decision 0062-hub-shards): three hubs in-process on
//! one workspace — the unsharded replica and shards `a` and `b` — each serving the Clusters of its
//! `tender.dev/shard` label. One Bundle reaches every shard's cluster, each replica writes only
//! its own clusters' objects, the unsharded replica folds every shard's counts into the Bundle
//! status, rotations reach all, idle means idle for every replica, a stopped replica leaves the
//! others' clusters served, and moving a Cluster between shards keeps its objects (same uid).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tender_e2e::fixture::{
    WAIT, Workspace, app_bundle, create_namespace, secret_value, settled, stays, wait_secret,
};
use tender_e2e::hub_harness::{HubHandle, hub_config, start_hub};
use tender_e2e::running::{Running, apply_hub_chart};
use tender_e2e::{HUB, downstream_name, eventually, shared_env, unique_name};
use tender_hub::HubConfig;
use tender_types::{Bundle, BundleSummary, Cluster, labels};

/// A hub serving the workspace as shard `shard` (`None`: the unsharded replica), competing
/// for its own Lease.
fn shard_config(ws: &str, shard: Option<&str>) -> HubConfig {
    let mut config = hub_config(ws);
    config.shard_id = shard.map(str::to_string);
    if let Some(leader) = config.leader_election.as_mut() {
        leader.lease_name = labels::hub_lease_name(shard);
    }
    config
}

/// The Bundle's folded summary and its shard entries' summaries, by id.
async fn bundle_counts(
    ws: &Workspace,
    name: &str,
) -> kube::Result<(Option<BundleSummary>, Vec<(String, BundleSummary)>)> {
    let b = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .get(name)
        .await?;
    let status = b.status.unwrap_or_default();
    let shards = status
        .shards
        .into_iter()
        .map(|e| (e.id, e.summary))
        .collect();
    Ok((status.summary, shards))
}

/// The copies in a cluster namespace.
fn copies() -> ListParams {
    ListParams::default().labels(labels::BUNDLE_NAME)
}

fn ready(desired: i32) -> BundleSummary {
    BundleSummary {
        desired_ready: desired,
        ready: desired,
        ..Default::default()
    }
}

/// The shard label of an object's labels (`None`: unsharded).
fn shard_of(labels: &std::collections::BTreeMap<String, String>) -> Option<&str> {
    labels.get(labels::SHARD).map(String::as_str)
}

/// Waits until the downstream copy `db-creds` of cluster `downstream` holds `password`.
async fn copy_reaches(ws: &Workspace, downstream: &str, target_ns: &str, password: &str) {
    let down = ws.downstream(downstream).await;
    wait_secret(
        &down,
        target_ns,
        "db-creds",
        &format!("db-creds = {password} on {downstream}"),
        |s: &Secret| secret_value(s, "password").as_deref() == Some(password),
    )
    .await;
}

#[tokio::test]
async fn shards_serve_their_clusters_fold_status_and_adopt_a_moved_cluster() {
    let env = shared_env(3).await;
    let ws = Workspace::without_hub(env, "shards").await;
    let unsharded = start_hub(env, shard_config(&ws.ns, None)).await.unwrap();
    let hub_a = start_hub(env, shard_config(&ws.ns, Some("a")))
        .await
        .unwrap();
    let mut hub_b = Some(
        start_hub(env, shard_config(&ws.ns, Some("b")))
            .await
            .unwrap(),
    );

    // One cluster per replica, each on its own downstream apiserver; each is provisioned (its
    // namespace, labelled with its shard) by its own replica.
    let (d_u, d_a, d_b) = (downstream_name(1), downstream_name(2), downstream_name(3));
    let _u = ws.agent("u", &d_u).await;
    let _a1 = ws.agent_labelled("a1", &d_a, &[(labels::SHARD, "a")]).await;
    let _b1 = ws.agent_labelled("b1", &d_b, &[(labels::SHARD, "b")]).await;
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    for (cluster, shard) in [("u", None), ("a1", Some("a")), ("b1", Some("b"))] {
        let ns = namespaces.get(&ws.cluster_ns(cluster)).await.unwrap();
        assert_eq!(shard_of(ns.labels()), shard, "namespace of {cluster}");
    }

    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target_ns = "shards-app";
    ws.bundle("app", app_bundle(&["u", "a1", "b1"], target_ns))
        .await;
    for (cluster, down) in [("u", &d_u), ("a1", &d_a), ("b1", &d_b)] {
        ws.ready(cluster, "app").await;
        copy_reaches(&ws, down, target_ns, "v1").await;
    }

    // Each replica wrote only its own clusters' objects: its shard label on the
    // BundleDeployment and the copies, and one finalizer per replica on the Bundle.
    let owned = [("u", None), ("a1", Some("a")), ("b1", Some("b"))];
    for (cluster, shard) in owned {
        let bd = ws.bds(cluster).get("app").await.unwrap();
        assert_eq!(
            shard_of(bd.labels()),
            shard,
            "BundleDeployment of {cluster}"
        );
        let copy = Api::<Secret>::namespaced(ws.hub.clone(), &ws.cluster_ns(cluster))
            .list(&copies())
            .await
            .unwrap();
        assert!(!copy.items.is_empty(), "copies of {cluster}");
        for c in copy.items {
            assert_eq!(
                shard_of(c.labels()),
                shard,
                "copy {} of {cluster}",
                c.name_any()
            );
        }
    }
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let b = bundles.get("app").await.unwrap();
    for shard in [None, Some("a"), Some("b")] {
        let f = labels::bundle_cleanup_finalizer(shard);
        assert!(b.finalizers().contains(&f), "{f} in {:?}", b.finalizers());
    }

    // The status folds every shard: 3/3 ready, entries a and b with one cluster each.
    eventually("the Bundle status folds every shard", WAIT, || async {
        let (summary, shards) = bundle_counts(&ws, "app").await?;
        let want = vec![("a".to_string(), ready(1)), ("b".to_string(), ready(1))];
        let mut shards = shards;
        shards.sort_by(|x, y| x.0.cmp(&y.0));
        Ok::<_, kube::Error>((summary == Some(ready(3)) && shards == want).then_some(()))
    })
    .await;
    // Each entry belongs to its replica's field manager alone.
    let b = bundles.get("app").await.unwrap();
    for id in ["a", "b"] {
        let manager = labels::shard_field_manager(id);
        let entry = format!("\"k:{{\\\"id\\\":\\\"{id}\\\"}}\"");
        let owners: Vec<String> = b
            .managed_fields()
            .iter()
            .filter(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.to_string().contains(&entry))
            })
            .filter_map(|m| m.manager.clone())
            .collect();
        assert_eq!(owners, vec![manager], "owners of status.shards[{id}]");
    }

    // A rotation reaches every shard's cluster.
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    for down in [&d_u, &d_a, &d_b] {
        copy_reaches(&ws, down, target_ns, "v2").await;
    }

    // Idle: after the cluster summary delay, no replica writes anything over a window.
    let hubs: [(&str, &HubHandle); 3] = [
        ("unsharded", &unsharded),
        ("a", &hub_a),
        ("b", hub_b.as_ref().unwrap()),
    ];
    let quiet = Duration::from_secs(8);
    for (name, hub) in hubs {
        let settled_at = settled(&format!("replica {name}'s writes"), quiet, || async {
            hub.writes()
        })
        .await;
        stays(
            &format!("replica {name}'s writes while idle"),
            Duration::from_secs(5),
            &settled_at,
            || async { hub.writes() },
        )
        .await;
    }
    // …and no reconcile keeps waking another: the replicas' reconciles stop too.
    let reconciles = || async {
        let hubs = [&unsharded, &hub_a, hub_b.as_ref().unwrap()];
        hubs.map(|h| (h.reconciles("bundle"), h.reconciles("cluster")))
    };
    let quiet_reconciles = settled("the replicas' reconciles", quiet, reconciles).await;
    stays(
        "the replicas' reconciles while idle",
        Duration::from_secs(5),
        &quiet_reconciles,
        reconciles,
    )
    .await;

    // Shard b's replica stops: the unsharded and shard a clusters are still served.
    hub_b.take().unwrap().stop().await.unwrap();
    ws.source_secret("db-creds", &[("password", "v3")]).await;
    copy_reaches(&ws, &d_u, target_ns, "v3").await;
    copy_reaches(&ws, &d_a, target_ns, "v3").await;
    // …and b's cluster catches up once a replica of shard b runs again.
    let hub_b = start_hub(env, shard_config(&ws.ns, Some("b")))
        .await
        .unwrap();
    copy_reaches(&ws, &d_b, target_ns, "v3").await;

    // Moving a1 from shard a to b is a label change: nothing is deleted, shard b adopts
    // the BundleDeployment and its copies (same uids) and labels them as its own.
    let uids = |items: Vec<Secret>| -> Vec<(String, String)> {
        let mut v: Vec<_> = items
            .iter()
            .map(|s| (s.name_any(), s.uid().unwrap_or_default()))
            .collect();
        v.sort();
        v
    };
    let a1_copies = Api::<Secret>::namespaced(ws.hub.clone(), &ws.cluster_ns("a1"));
    let bd_before = ws.bds("a1").get("app").await.unwrap();
    let copies_before = uids(a1_copies.list(&copies()).await.unwrap().items);
    let ns_before = namespaces.get(&ws.cluster_ns("a1")).await.unwrap();
    Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .patch(
            "a1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {labels::SHARD: "b"}}})),
        )
        .await
        .unwrap();
    eventually("shard b owns a1's objects", WAIT, || async {
        let bd = ws.bds("a1").get("app").await?;
        let ns = namespaces.get(&ws.cluster_ns("a1")).await?;
        let copies = a1_copies.list(&copies()).await?.items;
        let all_b = shard_of(bd.labels()) == Some("b")
            && shard_of(ns.labels()) == Some("b")
            && copies.iter().all(|c| shard_of(c.labels()) == Some("b"));
        Ok::<_, kube::Error>(all_b.then_some(()))
    })
    .await;
    let bd_after = ws.ready("a1", "app").await;
    assert_eq!(bd_after.uid(), bd_before.uid(), "same BundleDeployment");
    assert!(bd_after.metadata.deletion_timestamp.is_none());
    let copies_after = uids(a1_copies.list(&copies()).await.unwrap().items);
    assert_eq!(copies_after, copies_before, "same copies");
    let ns_after = namespaces.get(&ws.cluster_ns("a1")).await.unwrap();
    assert_eq!(ns_after.uid(), ns_before.uid(), "same cluster namespace");
    // The folded status follows: a has no cluster left, b has two, still 3/3.
    eventually(
        "the Bundle status counts a1 under shard b",
        WAIT,
        || async {
            let (summary, shards) = bundle_counts(&ws, "app").await?;
            let b = shards
                .iter()
                .find(|(id, _)| id == "b")
                .map(|(_, s)| s.clone());
            Ok::<_, kube::Error>((summary == Some(ready(3)) && b == Some(ready(2))).then_some(()))
        },
    )
    .await;
    // The new owner serves it: a rotation reaches a1 through shard b (a stopped).
    hub_a.stop().await.unwrap();
    ws.source_secret("db-creds", &[("password", "v4")]).await;
    copy_reaches(&ws, &d_a, target_ns, "v4").await;
    copy_reaches(&ws, &d_b, target_ns, "v4").await;

    // Deleting the Bundle: each running replica removes its own BundleDeployments, and the
    // finalizer of shard a — which serves no Cluster any more and is stopped — is dropped by
    // the unsharded replica, so the deletion completes.
    ws.delete_bundle("app").await;
    eventually(
        "the Bundle and its BundleDeployments gone",
        WAIT,
        || async {
            let bundle = bundles.get_opt("app").await?;
            let mut left = Vec::new();
            for cluster in ["u", "a1", "b1"] {
                if ws.bds(cluster).get_opt("app").await?.is_some() {
                    left.push(cluster);
                }
            }
            Ok::<_, kube::Error>((bundle.is_none() && left.is_empty()).then_some(()))
        },
    )
    .await;
    hub_b.stop().await.unwrap();
    unsharded.stop().await.unwrap();
}

/// The chart's `shards` value gives one Deployment per shard, and that Deployment, run as the
/// binary it describes, holds its own Lease and serves only the Clusters of its shard.
#[tokio::test]
async fn the_chart_runs_one_deployment_per_shard_serving_only_its_clusters() {
    let env = shared_env(3).await;
    let ws = Workspace::without_hub(env, "shards-chart").await;
    let release_ns = unique_name("tender-system");
    create_namespace(&ws.hub, &release_ns).await;
    apply_hub_chart(&ws.hub, &release_ns, &ws.ns, &["shards[0].id=c"]).await;
    let deployment =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(ws.hub.clone(), &release_ns)
            .get("tender-hub-shard-c")
            .await
            .unwrap();
    let mut shard_c = Running::start(env, HUB, &deployment, "tender-hub-shard-c-0", &[]).await;

    // Its own Lease, held by its pod.
    let leases: Api<Lease> = Api::namespaced(ws.hub.clone(), &release_ns);
    eventually(
        "Lease tender-hub-c held by the shard's pod",
        WAIT,
        || async {
            let holder = leases
                .get_opt("tender-hub-c")
                .await?
                .and_then(|l| l.spec?.holder_identity);
            Ok::<_, kube::Error>((holder.as_deref() == Some("tender-hub-shard-c-0")).then_some(()))
        },
    )
    .await;

    // A Cluster of shard c is provisioned, its namespace labelled c; one without the label
    // is not (no unsharded replica runs here).
    ws.cluster_labelled("in-c", &[(labels::SHARD, "c")], json!({}))
        .await;
    let ns = Api::<Namespace>::all(ws.hub.clone())
        .get(&ws.cluster_ns("in-c"))
        .await
        .unwrap();
    assert_eq!(shard_of(ns.labels()), Some("c"));
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let other: Cluster = serde_json::from_value(json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "unsharded"}, "spec": {}
    }))
    .unwrap();
    clusters.create(&Default::default(), &other).await.unwrap();
    stays(
        "an unlabelled Cluster left alone by shard c",
        Duration::from_secs(5),
        &None,
        || async {
            let c = clusters.get("unsharded").await.unwrap();
            c.status.and_then(|s| s.namespace)
        },
    )
    .await;
    shard_c.assert_running();
}

/// A shard id that is not a lowercase DNS label of at most 48 characters is refused with the
/// same clear message by the binary, the library and the chart.
#[tokio::test]
async fn an_invalid_shard_id_is_refused_with_a_clear_error() {
    let env = shared_env(3).await;
    let hub_bin = &tender_e2e::binaries::tender_binaries().unwrap().hub;
    for bad in ["Shard_A", "-a", &"x".repeat(49)] {
        let out = std::process::Command::new(hub_bin)
            .arg(format!("--shard-id={bad}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--shard-id {bad} accepted");
        assert!(stderr.contains("invalid shard id"), "{stderr}");
        assert!(
            stderr.contains("lowercase letters, digits and '-'"),
            "{stderr}"
        );
    }

    // The library: `run` refuses before touching the apiserver.
    let mut config = shard_config("unused", Some("Shard_A"));
    config.leader_election = None;
    let result =
        tender_e2e::hub_harness::spawn_hub(&env.kubeconfig_as(HUB, tender_e2e::ADMIN_USER), config)
            .await
            .unwrap()
            .stop()
            .await;
    let error = format!("{:#}", result.unwrap_err());
    assert!(error.contains("invalid shard id"), "{error}");

    // A Cluster labelled with such an id (a valid label value) is served by no replica: the
    // unsharded one says so in a Warning Event on it, and provisions nothing.
    let ws = Workspace::without_hub(env, "shards-invalid").await;
    let hub = start_hub(env, shard_config(&ws.ns, None)).await.unwrap();
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let bad: Cluster = serde_json::from_value(json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "bad", "labels": {labels::SHARD: "Shard_A"}}, "spec": {}
    }))
    .unwrap();
    clusters.create(&Default::default(), &bad).await.unwrap();
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(ws.hub.clone(), &ws.ns);
    let note = eventually("an InvalidShard event on the Cluster", WAIT, || async {
        let list = events.list(&ListParams::default()).await?;
        Ok::<_, kube::Error>(list.items.into_iter().find_map(|e| {
            let on_bad = e.regarding.as_ref()?.name.as_deref() == Some("bad");
            (on_bad && e.reason.as_deref() == Some("InvalidShard")).then_some(e.note)
        }))
    })
    .await
    .unwrap_or_default();
    assert!(note.contains("invalid shard id \"Shard_A\""), "{note}");
    let c = clusters.get("bad").await.unwrap();
    assert!(
        c.status.and_then(|s| s.namespace).is_none(),
        "not provisioned"
    );
    hub.stop().await.unwrap();

    // The chart: `helm template` fails naming the value.
    let helm = tender_e2e::ensure_helm().unwrap();
    let out = std::process::Command::new(helm)
        .args(["template", "t"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/charts/tender-hub"))
        .args(["--set", "shards[0].id=Shard_A"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("shards[].id \"Shard_A\" is invalid"),
        "{stderr}"
    );
}
