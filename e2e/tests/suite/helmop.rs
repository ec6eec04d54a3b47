//! Issue 9, the `HelmOp` kind: a Fleet-shaped HelmOp with `downstreamResources` and
//! `valuesFrom`, applied on a real hub and deployed by two real agents from a loopback chart
//! repository with basic auth — values from the copied Secret, the Bundle's status on the
//! HelmOp, rotation, upgrade by editing the HelmOp, idle without writes, deletion (and
//! `keepResources` set in the same breath as the delete), and a same-named Bundle the HelmOp
//! does not own reported and left alone.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use tender_e2e::charts::ChartRepo;
use tender_e2e::fixture::{WAIT, Workspace, settled, stays};
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_READY, find_condition, is_true, reason};
use tender_types::{Bundle, HelmOp, labels};

const USER: &str = "chart-reader";
const PASSWORD: &str = "repo-pass-123";

async fn repo() -> ChartRepo {
    ChartRepo::start(&["0.1.0", "0.2.0"], USER, PASSWORD)
        .await
        .expect("starting the chart repository")
}

/// The HelmOp as a Fleet user writes it (Fleet's field names: `namespace`, `helmSecretName`,
/// `downstreamResources`, `valuesFrom` with a namespace), with tender's apiVersion.
fn fleet_helmop(name: &str, repo: &str, version: &str, ns: &str, keep: bool) -> Value {
    json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
        "metadata": {"name": name},
        "spec": {
            "helm": {
                "releaseName": "web",
                "repo": repo,
                "chart": "app",
                "version": version,
                "values": {"greeting": "inline"},
                "valuesFrom": [{"secretKeyRef": {"name": "app-values", "namespace": ns, "key": "values.yaml"}}]
            },
            "helmSecretName": "repo-auth",
            "insecureSkipTLSVerify": false,
            "namespace": ns,
            "downstreamResources": [
                {"kind": "Secret", "name": "app-values"},
                {"kind": "Secret", "name": "repo-auth"}
            ],
            "keepResources": keep,
            "targets": [{"name": "test", "clusterSelector": {"matchLabels": {"env": "test"}}}]
        }
    })
}

fn helmops(ws: &Workspace) -> Api<HelmOp> {
    Api::namespaced(ws.hub.clone(), &ws.ns)
}

async fn apply_helmop(ws: &Workspace, body: &Value) {
    let name = body["metadata"]["name"].as_str().unwrap();
    helmops(ws)
        .patch(name, &PatchParams::apply("e2e"), &Patch::Apply(body))
        .await
        .unwrap();
}

async fn config_value(api: &Api<ConfigMap>, name: &str, key: &str) -> Option<String> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data.and_then(|d| d.get(key).cloned()))
}

/// Waits until ConfigMap `name` has `key` = `want` on every cluster in `apis`.
async fn wait_everywhere(apis: &[Api<ConfigMap>], name: &str, key: &str, want: &str) {
    for api in apis {
        eventually(&format!("{name}.{key} = {want}"), WAIT, || async {
            Ok::<_, kube::Error>(
                (config_value(api, name, key).await.as_deref() == Some(want)).then_some(()),
            )
        })
        .await;
    }
}

async fn wait_gone(apis: &[Api<ConfigMap>], name: &str) {
    for api in apis {
        eventually(&format!("{name} gone downstream"), WAIT, || async {
            Ok::<_, kube::Error>(api.get_opt(name).await?.is_none().then_some(()))
        })
        .await;
    }
}

/// Waits until the HelmOp's status describes its current generation and is Ready.
async fn wait_helmop_ready(ws: &Workspace, name: &str) -> HelmOp {
    let api = helmops(ws);
    eventually(
        &format!("HelmOp {name} Ready at its generation"),
        WAIT,
        || async {
            let h = api.get(name).await?;
            let ok = h.status.as_ref().is_some_and(|s| {
                s.observed_generation == h.metadata.generation && is_true(&s.conditions, TYPE_READY)
            });
            Ok::<_, kube::Error>(ok.then_some(h))
        },
    )
    .await
}

#[tokio::test]
async fn a_fleet_helmop_deploys_to_every_cluster_rotates_upgrades_idles_and_goes_away() {
    let repo = repo().await;
    let ws = Workspace::new(shared_env(2).await, "helmop").await;
    let (_east, _west) = (
        ws.helm_agent("east", &downstream_name(1)).await,
        ws.helm_agent("west", &downstream_name(2)).await,
    );
    let ns = unique_name("helmop-app");
    let mut cms = Vec::new();
    for n in [1, 2] {
        let down = ws.downstream(&downstream_name(n)).await;
        cms.push(Api::<ConfigMap>::namespaced(down, &ns));
    }
    ws.source_secret("app-values", &[("values.yaml", "greeting: hello\n")])
        .await;
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;

    apply_helmop(&ws, &fleet_helmop("web", &repo.url, "0.1.0", &ns, false)).await;
    wait_everywhere(&cms, "web-config", "greeting", "hello").await;
    for api in &cms {
        assert!(
            api.get_opt("web-hook").await.unwrap().is_some(),
            "the pre-install hook ran"
        );
    }

    // The Bundle is the HelmOp's, derived from it; its status comes back on the HelmOp.
    let h = wait_helmop_ready(&ws, "web").await;
    let status = h.status.clone().unwrap();
    assert_eq!(status.display.as_ref().unwrap().ready_clusters, "2/2");
    assert_eq!(status.summary.as_ref().unwrap().ready, 2);
    let bundle = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .get("web")
        .await
        .unwrap();
    let owner = &bundle.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("HelmOp", Some(true))
    );
    assert_eq!(Some(&owner.uid), h.metadata.uid.as_ref());
    assert_eq!(bundle.spec, h.spec.bundle_spec());
    assert_eq!(bundle.labels()[labels::HELMOP], "web");
    assert_eq!(
        bundle
            .spec
            .helm
            .as_ref()
            .unwrap()
            .helm_secret_name
            .as_deref(),
        Some("repo-auth"),
        "Fleet's spec.helmSecretName reaches the agent through its copy"
    );
    assert!(
        repo.refused() == 0,
        "the agents always sent the copied credentials"
    );

    // Idle means no writes: neither the HelmOp's status nor anything else.
    let hub = ws.hub_instance();
    // Past a delayed Cluster summary write (decision 0053-cluster-summary-delay) too.
    let quiet = std::time::Duration::from_secs(2) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY;
    let writes = settled("hub writes", quiet, || async { hub.writes() }).await;
    let version = h.resource_version();
    stays(
        "idle hub",
        std::time::Duration::from_secs(3),
        &(writes, version),
        || async {
            (
                hub.writes(),
                helmops(&ws).get("web").await.unwrap().resource_version(),
            )
        },
    )
    .await;

    // A rotation of the copied values Secret reaches both clusters; nobody touches the HelmOp.
    ws.source_secret("app-values", &[("values.yaml", "greeting: goodbye\n")])
        .await;
    wait_everywhere(&cms, "web-config", "greeting", "goodbye").await;

    // Editing the HelmOp's chart version upgrades; what 0.2.0 no longer renders is pruned.
    apply_helmop(&ws, &fleet_helmop("web", &repo.url, "0.2.0", &ns, false)).await;
    wait_everywhere(&cms, "web-config", "version", "0.2.0").await;
    wait_gone(&cms, "web-extra").await;
    let h = wait_helmop_ready(&ws, "web").await;
    assert_eq!(h.status.unwrap().observed_generation, h.metadata.generation);

    // Deleting the HelmOp removes its Bundle and the chart's objects on every cluster.
    helmops(&ws)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&cms, "web-config").await;
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually("Bundle and HelmOp gone", WAIT, || async {
        let gone =
            bundles.get_opt("web").await?.is_none() && helmops(&ws).get_opt("web").await?.is_none();
        Ok::<_, kube::Error>(gone.then_some(()))
    })
    .await;
}

#[tokio::test]
async fn keep_resources_set_with_the_delete_leaves_the_chart_objects() {
    let repo = repo().await;
    let ws = Workspace::without_hub(shared_env(2).await, "helmopkeep").await;
    let hub = start_hub(ws.env, hub_config(&ws.ns)).await.unwrap();
    let _agent = ws.helm_agent("east", &downstream_name(1)).await;
    let ns = unique_name("helmop-keep");
    let cms = Api::<ConfigMap>::namespaced(ws.downstream(&downstream_name(1)).await, &ns);
    ws.source_secret("app-values", &[("values.yaml", "greeting: kept\n")])
        .await;
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    apply_helmop(&ws, &fleet_helmop("keep", &repo.url, "0.1.0", &ns, false)).await;
    wait_everywhere(std::slice::from_ref(&cms), "web-config", "greeting", "kept").await;
    wait_helmop_ready(&ws, "keep").await;

    // keepResources and the delete in one breath, while no hub runs: the hub that starts
    // finds a deleted HelmOp whose Bundle still says keepResources=false. It must bring
    // keepResources to the Bundle (and so to the agent) before it deletes the Bundle.
    hub.stop().await.unwrap();
    apply_helmop(&ws, &fleet_helmop("keep", &repo.url, "0.1.0", &ns, true)).await;
    helmops(&ws)
        .delete("keep", &DeleteParams::default())
        .await
        .unwrap();
    let _hub = start_hub(ws.env, hub_config(&ws.ns)).await.unwrap();
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually("HelmOp, Bundle and BundleDeployment gone", WAIT, || async {
        let gone = helmops(&ws).get_opt("keep").await?.is_none()
            && bundles.get_opt("keep").await?.is_none()
            && ws.bds("east").get_opt("keep").await?.is_none();
        Ok::<_, kube::Error>(gone.then_some(()))
    })
    .await;
    let kept = cms
        .get("web-config")
        .await
        .expect("the chart's object stays");
    assert_eq!(kept.data.as_ref().unwrap()["greeting"], "kept");
    assert!(
        !kept.labels().contains_key(labels::BUNDLE_DEPLOYMENT),
        "left without tender's labels"
    );
}

#[tokio::test]
async fn a_same_named_bundle_it_does_not_own_is_reported_and_left_alone() {
    let ws = Workspace::new(shared_env(2).await, "helmopconflict").await;
    ws.bundle(
        "site",
        json!({"defaultNamespace": "mine", "keepResources": true}),
    )
    .await;
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    // Settled first: its own controller adds a finalizer and writes its status.
    settled("Bundle site", std::time::Duration::from_secs(1), || async {
        bundles.get("site").await.unwrap().resource_version()
    })
    .await;
    let before = bundles.get("site").await.unwrap();

    apply_helmop(
        &ws,
        &fleet_helmop(
            "site",
            "https://charts.example.com",
            "1.0.0",
            "theirs",
            false,
        ),
    )
    .await;
    let api = helmops(&ws);
    let h = eventually("HelmOp reports BundleConflict", WAIT, || async {
        let h = api.get("site").await?;
        let conflict = h.status.as_ref().and_then(|s| {
            find_condition(&s.conditions, TYPE_READY)
                .filter(|c| c.status == "False" && c.reason == reason::BUNDLE_CONFLICT)
        });
        Ok::<_, kube::Error>(conflict.is_some().then_some(h))
    })
    .await;
    let status = h.status.unwrap();
    assert_eq!(status.observed_generation, h.metadata.generation);
    assert_eq!(status.display.unwrap().state, reason::BUNDLE_CONFLICT);
    let rv = |b: &Bundle| b.resource_version();
    let after = bundles.get("site").await.unwrap();
    assert_eq!(rv(&after), rv(&before), "the Bundle was not written");
    assert!(after.owner_references().is_empty());

    // Deleting the HelmOp leaves the Bundle it never owned.
    api.delete("site", &DeleteParams::default()).await.unwrap();
    eventually("HelmOp gone", WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt("site").await?.is_none().then_some(()))
    })
    .await;
    let still = bundles.get("site").await.expect("the Bundle stays");
    assert_eq!(still.spec, before.spec);
    assert!(still.metadata.deletion_timestamp.is_none());
}
