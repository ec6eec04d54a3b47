//! Issue 36 part 4: a chart's `crds/` CRDs whose file starts with `---`. node-feature-discovery
//! (a real chart, from its Go module archive) keeps its three CRDs in one controller-gen file
//! that starts with `---`; `helm template` prints it whole under one `# Source:` header, so the
//! CRDs come without a Source line of their own. They must still be the chart's `crds/`: applied
//! before anything else of the chart, never deleted (on upgrade or removal: deleting a CRD
//! deletes every custom resource of its kind), and — when a pre-install/pre-upgrade hook makes
//! or replaces one (a CRD-upgrade Job) — adopted without a Conflict.
//!
//! The test clusters run no kubelet and no job controller: the test plays them ([`Player`]);
//! the hook Job's effect (what its container would do) replaces one CRD with the chart's own
//! file, as `kubectl replace` / `kubectl create` would, without tender's metadata.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tender_e2e::fixture::Workspace;
use tender_e2e::kubelet_player::{Effect, Player, Recorded, Recorder, What};
use tender_e2e::real_charts::{self, ROLLOUT, RealCharts, Rendered, cluster_names};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::labels;

const USER: &str = "chart-reader";
const PASSWORD: &str = "repo-pass-123";
/// The chart's name (its Chart.yaml) and its `crds/` file.
const CHART: &str = "node-feature-discovery";
const CRDS_FILE: &str = "crds/nfd-api-crds.yaml";
/// The CRD the hook Job replaces, and the kind of the custom resource the test creates.
const PROBE_CRD: &str = "nodefeatures.nfd.k8s-sigs.io";

/// The chart as its module archive has it; the file shape this test is about checked first.
fn nfd_dir() -> std::path::PathBuf {
    let dir = real_charts::nfd_chart_dir().expect("node-feature-discovery's module archive");
    let file = std::fs::read_to_string(dir.join(CRDS_FILE)).unwrap();
    assert!(
        file.starts_with("---\n") && file.matches("\n---\n").count() >= 2,
        "{CRDS_FILE} starts with --- and holds several CRDs"
    );
    dir
}

/// node-feature-discovery's values: `rev` lands in nfd-master's ConfigMap (an upgrade).
fn values(rev: &str) -> Value {
    json!({"master": {"config": {"extraLabelNs": [format!("rev-{rev}.e2e.tender.dev")]}}})
}

fn bundle(charts: &RealCharts, cluster: &str, ns: &str, release: &str, values: &Value) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "defaultNamespace": ns,
        "downstreamResources": [{"kind": "Secret", "name": "repo-auth"}],
        "helm": {
            "chart": CHART, "repo": charts.repo.url, "version": charts.version(CHART),
            "releaseName": release, "values": values, "helmSecretName": "repo-auth"
        }
    })
}

async fn bd_gone(ws: &Workspace, cluster: &str, bundle: &str) {
    eventually("the BundleDeployment gone", ROLLOUT, || async {
        Ok::<_, kube::Error>(
            ws.bds(cluster)
                .get_opt(bundle)
                .await?
                .is_none()
                .then_some(()),
        )
    })
    .await;
}

fn crds(objs: &[Rendered]) -> Vec<&Rendered> {
    objs.iter()
        .filter(|o| o.kind == "CustomResourceDefinition")
        .collect()
}

/// The chart's objects other than its CRDs and hooks.
fn others(objs: &[Rendered]) -> Vec<&Rendered> {
    objs.iter()
        .filter(|o| o.kind != "CustomResourceDefinition" && !o.is_hook())
        .collect()
}

fn show(events: &[Recorded]) -> String {
    events
        .iter()
        .map(|e| format!("{:>8} {:?} {} {}", e.rv, e.what, e.kind, e.name))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every CRD was created after `start` before anything else of the chart (hooks included) was
/// written. Only the chart's objects count: the namespace's `default` ServiceAccount is the
/// controller-manager's.
fn crds_first(events: &[Recorded], start: u64, objs: &[Rendered]) {
    let since: Vec<&Recorded> = events.iter().filter(|e| e.rv > start).collect();
    let charts = |e: &&&Recorded| {
        objs.iter()
            .any(|o| o.kind == e.kind && o.name == e.name && o.namespace == e.namespace)
    };
    let last_crd = crds(objs)
        .iter()
        .map(|c| {
            since
                .iter()
                .find(|e| e.kind == c.kind && e.name == c.name && e.what == What::Created)
                .unwrap_or_else(|| panic!("CRD {} not created:\n{}", c.name, show(events)))
                .rv
        })
        .max()
        .expect("the chart has CRDs");
    let first_other = since
        .iter()
        .filter(|e| e.kind != "CustomResourceDefinition")
        .filter(charts)
        .filter(|e| matches!(e.what, What::Created | What::Modified))
        .min_by_key(|e| e.rv)
        .unwrap_or_else(|| panic!("nothing else written:\n{}", show(events)));
    assert!(
        last_crd < first_other.rv,
        "every CRD before {} {}:\n{}",
        first_other.kind,
        first_other.name,
        show(events)
    );
}

fn node_features(down: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nfd.k8s-sigs.io", "v1alpha1", "NodeFeature");
    Api::namespaced_with(
        down.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "nodefeatures"),
    )
}

fn crd_api(down: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    Api::all_with(
        down.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions"),
    )
}

/// A custom resource of one of the chart's kinds, created by the test (the user's data).
async fn user_data(down: &kube::Client, ns: &str) -> String {
    let api = node_features(down, ns);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
        "metadata": {"name": "users-data", "namespace": ns},
        "spec": {"labels": {"e2e.tender.dev/kept": "yes"}}
    }))
    .unwrap();
    // The CRD is applied; its kind is served once the apiserver established it.
    eventually("the user's NodeFeature created", ROLLOUT, || async {
        match api.create(&PostParams::default(), &obj).await {
            Ok(created) => Ok(Some(created.metadata.uid.unwrap())),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// The uid and generation of each CRD (each must exist, not being deleted).
async fn crd_states(down: &kube::Client, objs: &[Rendered]) -> Vec<(String, String, i64)> {
    let mut out = Vec::new();
    for c in crds(objs) {
        let live = real_charts::get(down, c)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("CRD {} exists", c.name));
        assert!(
            live.metadata.deletion_timestamp.is_none(),
            "CRD {} not being deleted",
            c.name
        );
        out.push((
            c.name.clone(),
            live.metadata.uid.unwrap(),
            live.metadata.generation.unwrap_or_default(),
        ));
    }
    out
}

fn no_crd_deleted(events: &[Recorded]) {
    assert!(
        !events.iter().any(|e| e.kind == "CustomResourceDefinition"
            && matches!(e.what, What::Deleting | What::Deleted)),
        "no CRD deleted:\n{}",
        show(events)
    );
}

async fn recorder(down: &kube::Client, ns: &str, objs: &[Rendered]) -> Recorder {
    Recorder::start(
        down.clone(),
        &real_charts::kinds(objs),
        ns,
        cluster_names(objs),
    )
    .await
    .expect("recording the chart's kinds")
}

/// What the CRD-upgrade hook's container would do: `kubectl replace` (or `create`) of
/// [`PROBE_CRD`] from the chart's own file — the CRD ends up without tender's metadata.
fn replace_crd(body: Value, runs: Arc<AtomicUsize>) -> Effect {
    Arc::new(move |client, _job| {
        let (body, runs) = (body.clone(), runs.clone());
        Box::pin(async move {
            let api = crd_api(&client);
            let mut obj: DynamicObject = serde_json::from_value(body)?;
            match api.get_opt(PROBE_CRD).await? {
                Some(live) => {
                    obj.metadata.resource_version = live.metadata.resource_version;
                    api.replace(PROBE_CRD, &PostParams::default(), &obj).await?;
                }
                None => {
                    api.create(&PostParams::default(), &obj).await?;
                }
            }
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    })
}

/// A pre-install/pre-upgrade hook Job of the kind charts use to create or upgrade their CRDs.
const CRD_UPGRADE_HOOK: &str = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-crd-upgrade
  namespace: {{ .Release.Namespace }}
  annotations:
    "helm.sh/hook": pre-install,pre-upgrade
    "helm.sh/hook-weight": "-5"
    "helm.sh/hook-delete-policy": before-hook-creation,hook-succeeded
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: crd-upgrade
          image: registry.k8s.io/kubectl:v1.36.3
          args: ["replace", "--filename", "/crds/nfd-api-crds.yaml"]
"#;

/// Tender's owner annotation of the CRD [`PROBE_CRD`].
async fn probe_owner(down: &kube::Client) -> Option<String> {
    crd_api(down)
        .get(PROBE_CRD)
        .await
        .unwrap()
        .metadata
        .annotations
        .and_then(|a| a.get(labels::OWNER_ANNOTATION).cloned())
}

/// Waits until the hook ran `at_least` times and [`PROBE_CRD`] is `owner`'s again.
async fn adopted(
    down: &kube::Client,
    owner: &str,
    runs: &AtomicUsize,
    rollout: &str,
    at_least: usize,
) {
    eventually(
        &format!("{rollout}: {PROBE_CRD} adopted"),
        ROLLOUT,
        || async {
            let ran = runs.load(Ordering::SeqCst);
            let now = probe_owner(down).await;
            if ran >= at_least && now.as_deref() == Some(owner) {
                return Ok(Some(()));
            }
            Err(format!("hook runs {ran}, owner {now:?}"))
        },
    )
    .await;
}

#[tokio::test]
async fn crds_of_a_file_starting_with_a_separator_go_first_and_are_never_deleted() {
    let charts = RealCharts::serve(USER, PASSWORD, &[(CHART, nfd_dir())])
        .await
        .expect("packaging and serving node-feature-discovery");
    let ws = Workspace::new(shared_env(2).await, "chart-crds").await;
    let agent = real_charts::infrastructure_agent(&ws, "east", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let (ns, release) = (unique_name("nfd"), "nfd");
    let install = charts
        .template(CHART, release, &ns, &values("1"), false)
        .unwrap();
    assert_eq!(crds(&install).len(), 3, "the chart's three CRDs rendered");
    let recorder = recorder(&down, &ns, &install).await;
    let player = Player::start(down.clone(), &ns);
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;

    // Install: the CRDs before any other object of the chart.
    let start = recorder.last_rv();
    ws.bundle("nfd", bundle(&charts, "east", &ns, release, &values("1")))
        .await;
    real_charts::rolled_out(&ws, "east", "nfd", true).await;
    crds_first(&recorder.events(), start, &install);
    let installed = crd_states(&down, &install).await;
    let data = user_data(&down, &ns).await;

    // Upgrade (a changed value): the ConfigMap changes, the CRDs are neither deleted nor
    // changed.
    let upgrade = charts
        .template(CHART, release, &ns, &values("2"), true)
        .unwrap();
    let conf = others(&upgrade)
        .into_iter()
        .find(|o| o.kind == "ConfigMap" && o.name.ends_with("master-conf"))
        .expect("nfd-master's ConfigMap")
        .clone();
    ws.bundle("nfd", bundle(&charts, "east", &ns, release, &values("2")))
        .await;
    eventually("the upgraded ConfigMap", ROLLOUT, || async {
        let live = real_charts::get(&down, &conf).await.unwrap();
        Ok::<_, kube::Error>(
            live.is_some_and(|c| c.data.to_string().contains("rev-2"))
                .then_some(()),
        )
    })
    .await;
    real_charts::rolled_out(&ws, "east", "nfd", true).await;
    assert_eq!(
        crd_states(&down, &upgrade).await,
        installed,
        "CRDs untouched"
    );
    no_crd_deleted(&recorder.events());

    // Removal: the chart's objects go; its CRDs and the user's custom resource stay, tender's
    // metadata stripped from the CRDs.
    ws.delete_bundle("nfd").await;
    bd_gone(&ws, "east", "nfd").await;
    for o in others(&upgrade) {
        eventually(&format!("{} gone", o.describe()), ROLLOUT, || async {
            Ok::<_, kube::Error>(
                real_charts::get(&down, o)
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(()),
            )
        })
        .await;
    }
    assert_eq!(crd_states(&down, &upgrade).await, installed, "CRDs kept");
    for c in crds(&upgrade) {
        let live = real_charts::get(&down, c).await.unwrap().unwrap();
        let annotations = live.metadata.annotations.unwrap_or_default();
        assert!(
            !annotations.contains_key(labels::OWNER_ANNOTATION),
            "CRD {} let go: {annotations:?}",
            c.name
        );
    }
    let kept = node_features(&down, &ns).get("users-data").await.unwrap();
    assert_eq!(
        kept.metadata.uid.as_deref(),
        Some(data.as_str()),
        "the user's data stays"
    );
    no_crd_deleted(&recorder.events());
    assert!(player.errors().is_empty(), "player: {:?}", player.errors());
}

#[tokio::test]
async fn a_crd_a_pre_install_hook_replaced_is_adopted_without_a_conflict() {
    // The real chart with a CRD-upgrade hook added.
    let src = nfd_dir();
    let dir = std::env::temp_dir()
        .join(unique_name("tender-nfd-hook"))
        .join(CHART);
    real_charts::copy_chart(&src, &dir).unwrap();
    std::fs::write(dir.join("templates/e2e-crd-upgrade.yaml"), CRD_UPGRADE_HOOK).unwrap();
    let probe = serde_saphyr::from_multiple::<Option<Value>>(
        &std::fs::read_to_string(src.join(CRDS_FILE)).unwrap(),
    )
    .unwrap()
    .into_iter()
    .flatten()
    .find(|d| d["metadata"]["name"] == PROBE_CRD)
    .expect("the probe CRD in the chart's file");
    let charts = RealCharts::serve(USER, PASSWORD, &[(CHART, dir)])
        .await
        .expect("packaging and serving node-feature-discovery with a hook");
    let ws = Workspace::new(shared_env(2).await, "chart-crd-hook").await;
    let agent = real_charts::infrastructure_agent(&ws, "west", &downstream_name(2)).await;
    let down = ws.downstream(&agent.downstream).await;
    let (ns, release) = (unique_name("nfd"), "nfd");
    let install = charts
        .template(CHART, release, &ns, &values("1"), false)
        .unwrap();
    let hook = install
        .iter()
        .find(|o| o.kind == "Job" && o.hooks.iter().any(|h| h == "pre-install"))
        .expect("the CRD-upgrade hook rendered")
        .clone();
    let recorder = recorder(&down, &ns, &install).await;
    let player = Player::start(down.clone(), &ns);
    let runs = Arc::new(AtomicUsize::new(0));
    player.effect("-crd-upgrade", replace_crd(probe, runs.clone()));
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    let owner = labels::bundle_deployment_owner(&ws.cluster_ns("west"), "nfd");

    // Install: the CRDs before the hook; the hook replaces one; Ready with no Conflict and the
    // CRD tender's again.
    let start = recorder.last_rv();
    ws.bundle("nfd", bundle(&charts, "west", &ns, release, &values("1")))
        .await;
    real_charts::rolled_out(&ws, "west", "nfd", true).await;
    adopted(&down, &owner, &runs, "install", 1).await;
    real_charts::rolled_out(&ws, "west", "nfd", true).await;
    let events = recorder.events();
    crds_first(&events, start, &install);
    let job = events
        .iter()
        .find(|e| e.rv > start && e.name == hook.name && e.what == What::Created)
        .unwrap_or_else(|| panic!("the hook Job ran:\n{}", show(&events)));
    assert!(
        events
            .iter()
            .any(|e| e.rv < job.rv && e.name == PROBE_CRD && e.what == What::Created),
        "the CRD existed before the hook:\n{}",
        show(&events)
    );
    let installed = crd_states(&down, &install).await;
    let data = user_data(&down, &ns).await;

    // Upgrade: the hook replaces the CRD again; adopted again, never deleted.
    let upgrade = charts
        .template(CHART, release, &ns, &values("2"), true)
        .unwrap();
    ws.bundle("nfd", bundle(&charts, "west", &ns, release, &values("2")))
        .await;
    adopted(&down, &owner, &runs, "upgrade", 2).await;
    real_charts::rolled_out(&ws, "west", "nfd", true).await;
    let uids = |s: &[(String, String, i64)]| -> Vec<(String, String)> {
        s.iter().map(|(n, u, _)| (n.clone(), u.clone())).collect()
    };
    assert_eq!(
        uids(&crd_states(&down, &upgrade).await),
        uids(&installed),
        "the same CRDs"
    );
    no_crd_deleted(&recorder.events());

    // Removal: the CRDs and the user's custom resource stay.
    ws.delete_bundle("nfd").await;
    bd_gone(&ws, "west", "nfd").await;
    assert_eq!(
        uids(&crd_states(&down, &upgrade).await),
        uids(&installed),
        "CRDs kept"
    );
    let kept = node_features(&down, &ns).get("users-data").await.unwrap();
    assert_eq!(
        kept.metadata.uid.as_deref(),
        Some(data.as_str()),
        "the user's data stays"
    );
    no_crd_deleted(&recorder.events());
    assert!(player.errors().is_empty(), "player: {:?}", player.errors());
}
