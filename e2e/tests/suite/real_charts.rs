//! Issue 23 item 3: real charts end to end. ingress-nginx and Kyverno, packaged with the
//! pinned Helm from their Go module archives, served by the loopback chart repository and
//! deployed by a Bundle and by a HelmOp on a real downstream apiserver, with their Helm hooks.
//!
//! The test clusters run no kubelet and no job controller, so the test plays them
//! ([`Player`]): Deployments become available, hook Jobs complete (or fail, by rule) after
//! their effect ran (ingress-nginx's certgen Jobs make the webhook Secret and patch the
//! webhook's CA; Kyverno's scale its Deployments down, delete its webhooks, remove its kept
//! ConfigMap). A [`Recorder`] watches every kind the chart renders and orders what happened
//! by resourceVersion; the test compares that with the phases it computes itself from
//! `helm template` (hooks grouped by annotation, weight, name, kind).

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tender_e2e::fixture::{Workspace, stays};
use tender_e2e::kubelet_player::{Player, Recorded, Recorder, What};
use tender_e2e::real_charts::{
    self, ROLLOUT, RealCharts, Rendered, Step, check_no_overlap, check_order, cluster_names,
    hook_phase, ordinary,
};
use tender_e2e::{downstream_name, eventually, shared_env_of, unique_name};
use tender_types::conditions::reason::HOOK_FAILED;
use tender_types::conditions::{TYPE_READY, is_true};
use tender_types::{Bundle, HelmOp, labels};

const USER: &str = "chart-reader";
const PASSWORD: &str = "repo-pass-123";

/// Both charts packaged and served for one test (a test's runtime ends with it, and so does
/// the repository's server task: it is not shared between tests).
async fn charts() -> RealCharts {
    RealCharts::start(USER, PASSWORD)
        .await
        .expect("packaging and serving ingress-nginx and Kyverno")
}

/// Starts recording the kinds `objs` render (and `extra`) in `ns` before anything is deployed.
async fn recorder(
    down: &kube::Client,
    ns: &str,
    objs: &[Rendered],
    extra: &[(&str, &str)],
    extra_names: &[&str],
) -> Recorder {
    let mut kinds = real_charts::kinds(objs);
    kinds.extend(extra.iter().map(|(a, k)| (a.to_string(), k.to_string())));
    let mut names = cluster_names(objs);
    names.extend(extra_names.iter().map(|n| n.to_string()));
    Recorder::start(down.clone(), &kinds, ns, names)
        .await
        .expect("recording the chart's kinds")
}

fn show(events: &[Recorded]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{:>8} {:?} {} {}/{}",
                e.rv,
                e.what,
                e.kind,
                e.namespace.as_deref().unwrap_or("-"),
                e.name
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn first<'a>(events: &'a [Recorded], kind: &str, name: &str, what: What) -> Option<&'a Recorded> {
    events
        .iter()
        .find(|e| e.kind == kind && e.name == name && e.what == what)
}

fn ingress_bundle(
    charts: &RealCharts,
    cluster: &str,
    ns: &str,
    release: &str,
    values: &Value,
) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "defaultNamespace": ns,
        "downstreamResources": [{"kind": "Secret", "name": "repo-auth"}],
        "helm": {
            "chart": "ingress-nginx", "repo": charts.repo.url,
            "version": charts.version("ingress-nginx"), "releaseName": release,
            "values": values, "helmSecretName": "repo-auth"
        }
    })
}

/// ingress-nginx values: `revision` lands in the controller's ConfigMap (an upgrade changes
/// it); the IngressClass is named after the release so two releases do not collide.
fn ingress_values(release: &str, revision: &str) -> Value {
    json!({"controller": {
        "config": {"e2e-revision": revision},
        "ingressClassResource": {"name": format!("{release}-nginx"),
                                 "controllerValue": format!("k8s.io/{release}-nginx")}
    }})
}

async fn config_revision(down: &kube::Client, ns: &str, name: &str) -> Option<String> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(down.clone(), ns);
    cms.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data?.get("e2e-revision").cloned())
}

fn assert_order(what: &str, recorder: &Recorder, start: u64, steps: &[Step]) -> u64 {
    let events = recorder.events();
    match check_order(&events, start, steps) {
        Ok(end) => end,
        Err(e) => panic!("{what}: {e}\nrecorded:\n{}", show(&events)),
    }
}

/// The conditions of the BundleDeployment of `bundle` on `cluster` (or that it is gone).
async fn bd_conditions(ws: &Workspace, cluster: &str, bundle: &str) -> String {
    match ws.bds(cluster).get_opt(bundle).await {
        Ok(Some(bd)) => bd
            .status
            .unwrap_or_default()
            .conditions
            .iter()
            .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect::<Vec<_>>()
            .join(" | "),
        Ok(None) => "the BundleDeployment is gone".into(),
        Err(e) => e.to_string(),
    }
}

/// Waits until no object of `objs` exists downstream; on a timeout says which is left and
/// what the BundleDeployment of `bundle` reports.
async fn all_gone(
    down: &kube::Client,
    objs: &[&Rendered],
    why: &str,
    (ws, cluster, bundle): (&Workspace, &str, &str),
) {
    for o in objs {
        eventually(
            &format!("{why}: {} gone", o.describe()),
            ROLLOUT,
            || async {
                let Some(live) = real_charts::get(down, o).await.unwrap() else {
                    return Ok(Some(()));
                };
                Err(format!(
                    "still there with labels {:?} annotations {:?}; {}",
                    live.metadata.labels,
                    live.metadata.annotations,
                    bd_conditions(ws, cluster, bundle).await
                ))
            },
        )
        .await;
    }
}

/// Each of `objs` was deleted after `start` (the recorder saw it go) and no object of its name
/// is tender's any more. Kubernetes' ClusterRole aggregation controller writes aggregated
/// ClusterRoles with server-side apply, so one it still had cached can come back right after
/// the removal — without tender's metadata: that one is the controller's, not tender's.
async fn deleted_by_tender(
    down: &kube::Client,
    recorder: &Recorder,
    start: u64,
    objs: &[&Rendered],
) {
    for o in objs {
        eventually(
            &format!("removal: {} deleted", o.describe()),
            ROLLOUT,
            || async {
                let deleted = recorder.events().iter().any(|e| {
                    e.rv > start && e.kind == o.kind && e.name == o.name && e.what == What::Deleted
                });
                let live = real_charts::get(down, o).await.unwrap();
                let tenders = live.as_ref().is_some_and(|l| {
                    l.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(labels::OWNER_ANNOTATION))
                });
                Ok::<_, kube::Error>((deleted && !tenders).then_some(()))
            },
        )
        .await;
    }
}

#[tokio::test]
async fn ingress_nginx_by_a_bundle_runs_its_hooks_in_order_upgrades_and_goes_away() {
    let charts = &charts().await;
    let ws = Workspace::new(shared_env_of("real-charts", 1).await, "ingress").await;
    let agent = real_charts::infrastructure_agent(&ws, "east", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let (ns, release) = (unique_name("ingress"), "web");
    let v1 = ingress_values(release, "1");
    let install = charts
        .template("ingress-nginx", release, &ns, &v1, false)
        .unwrap();
    let webhook = format!("{release}-ingress-nginx-admission");
    let recorder = recorder(&down, &ns, &install, &[("v1", "Secret")], &[]).await;
    let player = Player::start(down.clone(), &ns);
    player.effect("-admission-create", real_charts::certgen_create());
    player.effect("-admission-patch", real_charts::certgen_patch());
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;

    // Install: pre-install hooks (ServiceAccount, RBAC, then the certgen Job) → the chart's
    // objects → post-install hooks (RBAC again, then the patch Job).
    let start = recorder.last_rv();
    ws.bundle("ingress", ingress_bundle(charts, "east", &ns, release, &v1))
        .await;
    real_charts::rolled_out(&ws, "east", "ingress", false).await;
    let pre = hook_phase(&install, "pre-install");
    let post = hook_phase(&install, "post-install");
    assert!(
        pre.last().is_some_and(|h| h.kind == "Job") && post.last().is_some_and(|h| h.kind == "Job"),
        "the chart's hooks as rendered: {pre:?} {post:?}"
    );
    assert_order(
        "install",
        &recorder,
        start,
        &[
            Step::Hooks("pre-install", pre.clone()),
            Step::Written("the chart's objects", ordinary(&install)),
            Step::Hooks("post-install", post.clone()),
        ],
    );
    let events = recorder.events();
    check_no_overlap(&events).unwrap_or_else(|e| panic!("{e}\n{}", show(&events)));
    // The webhook Secret the pre-install Job made existed before the Deployment that mounts it.
    let secret = first(&events, "Secret", &webhook, What::Created).expect("the certgen Secret");
    let deployment = first(
        &events,
        "Deployment",
        &format!("{release}-ingress-nginx-controller"),
        What::Created,
    )
    .expect("the controller Deployment");
    assert!(
        secret.rv < deployment.rv,
        "Secret before the Deployment:\n{}",
        show(&events)
    );
    // The post-install Job patched the webhook's CA with the Secret's.
    let vwc = install
        .iter()
        .find(|o| o.kind == "ValidatingWebhookConfiguration")
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(down.clone(), &ns);
    let secret_ca =
        serde_json::to_value(&secrets.get(&webhook).await.unwrap().data.unwrap()["ca"]).unwrap();
    let live = real_charts::get(&down, vwc).await.unwrap().unwrap();
    for w in live.data["webhooks"].as_array().unwrap() {
        assert_eq!(
            w["clientConfig"]["caBundle"], secret_ca,
            "the CA patched in: {w}"
        );
    }
    // hook-succeeded: no hook object is left once its phase succeeded.
    let hooks: Vec<&Rendered> = install.iter().filter(|o| o.is_hook()).collect();
    all_gone(&down, &hooks, "hook-succeeded", (&ws, "east", "ingress")).await;
    let created_job = |events: &[Recorded]| {
        events
            .iter()
            .filter(|e| e.name.ends_with("-admission-create") && e.what == What::Created)
            .map(|e| e.uid.clone())
            .collect::<Vec<_>>()
    };
    let install_jobs = created_job(&events);

    // Upgrade (a changed value): pre-upgrade hooks → the changed ConfigMap → post-upgrade.
    let v2 = ingress_values(release, "2");
    let upgrade = charts
        .template("ingress-nginx", release, &ns, &v2, true)
        .unwrap();
    let start = recorder.last_rv();
    ws.bundle("ingress", ingress_bundle(charts, "east", &ns, release, &v2))
        .await;
    let cm = format!("{release}-ingress-nginx-controller");
    eventually("the upgraded ConfigMap", ROLLOUT, || async {
        Ok::<_, kube::Error>(
            (config_revision(&down, &ns, &cm).await.as_deref() == Some("2")).then_some(()),
        )
    })
    .await;
    real_charts::rolled_out(&ws, "east", "ingress", false).await;
    let changed: Vec<&Rendered> = ordinary(&upgrade)
        .into_iter()
        .filter(|o| o.kind == "ConfigMap" && o.name == cm)
        .collect();
    assert_order(
        "upgrade",
        &recorder,
        start,
        &[
            Step::Hooks("pre-upgrade", hook_phase(&upgrade, "pre-upgrade")),
            Step::Written("the changed ConfigMap", changed),
            Step::Hooks("post-upgrade", hook_phase(&upgrade, "post-upgrade")),
        ],
    );
    let events = recorder.events();
    check_no_overlap(&events).unwrap_or_else(|e| panic!("{e}\n{}", show(&events)));
    let upgrade_jobs = created_job(&events);
    assert!(
        upgrade_jobs.len() > install_jobs.len()
            && upgrade_jobs[install_jobs.len()..]
                .iter()
                .all(|uid| !install_jobs.contains(uid)),
        "the upgrade re-created the certgen Job: {install_jobs:?} then {upgrade_jobs:?}"
    );
    let hooks: Vec<&Rendered> = upgrade.iter().filter(|o| o.is_hook()).collect();
    all_gone(
        &down,
        &hooks,
        "hook-succeeded after the upgrade",
        (&ws, "east", "ingress"),
    )
    .await;

    // Removal: everything tender made is deleted (ingress-nginx has no delete hooks, so none
    // runs); the Secret the certgen Job made is not tender's and stays.
    let start = recorder.last_rv();
    ws.delete_bundle("ingress").await;
    eventually("the BundleDeployment gone", ROLLOUT, || async {
        Ok::<_, kube::Error>(
            ws.bds("east")
                .get_opt("ingress")
                .await?
                .is_none()
                .then_some(()),
        )
    })
    .await;
    let all: Vec<&Rendered> = upgrade.iter().collect();
    all_gone(&down, &all, "removal", (&ws, "east", "ingress")).await;
    let events = recorder.events();
    assert!(
        !events
            .iter()
            .any(|e| e.rv > start && e.what == What::Created && e.kind != "Secret"),
        "no hook ran on removal:\n{}",
        show(&events)
    );
    assert!(
        secrets.get_opt(&webhook).await.unwrap().is_some(),
        "the Secret the hook made is not tender's and stays"
    );
    assert!(player.errors().is_empty(), "player: {:?}", player.errors());
}

fn kyverno_helmop(charts: &RealCharts, name: &str, ns: &str, release: &str) -> Value {
    json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
        "metadata": {"name": name},
        "spec": {
            "helm": {
                "releaseName": release, "repo": charts.repo.url, "chart": "kyverno",
                "version": charts.version("kyverno"), "values": {}
            },
            "helmSecretName": "repo-auth",
            "namespace": ns,
            "downstreamResources": [{"kind": "Secret", "name": "repo-auth"}],
            "targets": [{"name": "test", "clusterSelector": {"matchLabels": {"env": "test"}}}]
        }
    })
}

#[tokio::test]
async fn kyverno_by_a_helmop_upgrades_with_its_post_upgrade_hooks_and_runs_its_pre_delete_hooks_before_anything_is_deleted()
 {
    let charts = &charts().await;
    let ws = Workspace::new(shared_env_of("real-charts", 1).await, "kyverno").await;
    let agent = real_charts::infrastructure_agent(&ws, "east", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let (ns, release) = (unique_name("kyverno"), "kyv");
    let objs = charts
        .template("kyverno", release, &ns, &json!({}), false)
        .unwrap();
    // What Kyverno's admission controller registers at run time, which its pre-delete Job
    // deletes.
    let runtime_webhook = "kyverno-resource-validating-webhook-cfg";
    let recorder = recorder(
        &down,
        &ns,
        &objs,
        &[(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
        )],
        &[runtime_webhook],
    )
    .await;
    let player = Player::start(down.clone(), &ns);
    player.effect(
        "-scale-to-zero",
        real_charts::kyverno_scale_to_zero(release),
    );
    player.effect(
        "-remove-configmap",
        real_charts::kyverno_remove_configmap(release),
    );
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;

    let start = recorder.last_rv();
    let helmops: Api<HelmOp> = Api::namespaced(ws.hub.clone(), &ws.ns);
    helmops
        .patch(
            "kyverno",
            &PatchParams::apply("e2e"),
            &Patch::Apply(kyverno_helmop(charts, "kyverno", &ns, release)),
        )
        .await
        .unwrap();
    real_charts::rolled_out(&ws, "east", "kyverno", false).await;
    assert_order(
        "install",
        &recorder,
        start,
        &[Step::Written("the chart's objects", ordinary(&objs))],
    );

    // Upgrade: a changed value; Kyverno's post-upgrade hooks (its resource migration and
    // report clean-up Jobs) run after the changed objects, as a new release revision.
    let values = json!({"admissionController": {"replicas": 2}});
    let upgrade = charts
        .template("kyverno", release, &ns, &values, true)
        .unwrap();
    let post_upgrade = hook_phase(&upgrade, "post-upgrade");
    assert!(
        !post_upgrade.is_empty(),
        "Kyverno renders post-upgrade hooks"
    );
    let ran = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    for job in post_upgrade.iter().filter(|h| h.kind == "Job") {
        let (ran, name) = (ran.clone(), job.name.clone());
        let suffix = name
            .trim_start_matches(&format!("{release}-kyverno"))
            .to_string();
        let effect: tender_e2e::kubelet_player::Effect = std::sync::Arc::new(move |_, _| {
            ran.lock().unwrap().push(name.clone());
            Box::pin(async { Ok(()) })
        });
        player.effect(&suffix, effect);
    }
    let before = ws
        .bds("east")
        .get("kyverno")
        .await
        .unwrap()
        .spec
        .deployment_id;
    let mut op = kyverno_helmop(charts, "kyverno", &ns, release);
    op["spec"]["helm"]["values"] = values;
    helmops
        .patch("kyverno", &PatchParams::apply("e2e"), &Patch::Apply(op))
        .await
        .unwrap();
    eventually("the upgrade's BundleDeployment", ROLLOUT, || async {
        let bd = ws.bds("east").get("kyverno").await?;
        Ok::<_, kube::Error>((bd.spec.deployment_id != before).then_some(()))
    })
    .await;
    real_charts::rolled_out(&ws, "east", "kyverno", false).await;
    // The player saw (and completed) each post-upgrade Job of this run: the recorder's watch
    // can miss an object that lives a moment (created, completed and deleted by its policy),
    // the player cannot (the rollout waits for it).
    for job in post_upgrade.iter().filter(|h| h.kind == "Job") {
        assert!(
            ran.lock().unwrap().contains(&job.name),
            "post-upgrade Job {} ran; ran: {:?}",
            job.name,
            ran.lock().unwrap()
        );
    }

    let vwcs: Api<DynamicObject> = Api::all_with(
        down.clone(),
        &kube::api::ApiResource::erase::<
            k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
        >(&()),
    );
    vwcs.create(
        &Default::default(),
        &serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": runtime_webhook,
                         "labels": {"webhook.kyverno.io/managed-by": "kyverno"}},
            "webhooks": []
        }))
        .unwrap(),
    )
    .await
    .unwrap();

    // Removal: pre-delete (scale to zero, delete the webhooks) → the chart's objects deleted
    // (not the kept ConfigMap; Kyverno's CRDs are templates of its `crds` subchart, not `crds/`
    // files, so they go as in `helm uninstall`) → post-delete (remove the kept ConfigMap).
    let start = recorder.last_rv();
    helmops
        .delete("kyverno", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the HelmOp and its Bundle gone", ROLLOUT, || async {
        let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
        Ok::<_, kube::Error>(
            (helmops.get_opt("kyverno").await?.is_none()
                && bundles.get_opt("kyverno").await?.is_none())
            .then_some(()),
        )
    })
    .await;
    let kept = format!("{release}-kyverno");
    let deleted: Vec<&Rendered> = ordinary(&objs).into_iter().filter(|o| !o.keep).collect();
    assert!(
        objs.iter().any(|o| o.keep && o.name == kept),
        "the chart keeps {kept}"
    );
    deleted_by_tender(&down, &recorder, start, &deleted).await;
    eventually("the post-delete hook ran", ROLLOUT, || async {
        Ok::<_, kube::Error>(
            first(&recorder.events(), "ConfigMap", &kept, What::Deleted).map(|_| ()),
        )
    })
    .await;
    let end = assert_order(
        "removal",
        &recorder,
        start,
        &[
            Step::Hooks("pre-delete", hook_phase(&objs, "pre-delete")),
            Step::Deleted("the chart's objects", deleted.clone()),
            Step::Hooks("post-delete", hook_phase(&objs, "post-delete")),
        ],
    );
    let events = recorder.events();
    let webhook_gone = first(
        &events,
        "ValidatingWebhookConfiguration",
        runtime_webhook,
        What::Deleted,
    )
    .expect("the pre-delete Job deleted Kyverno's webhook");
    let first_delete = events
        .iter()
        .filter(|e| e.rv > start && matches!(e.what, What::Deleting | What::Deleted))
        .filter(|e| deleted.iter().any(|o| o.kind == e.kind && o.name == e.name))
        .map(|e| e.rv)
        .min()
        .unwrap();
    assert!(
        webhook_gone.rv < first_delete,
        "webhooks before anything:\n{}",
        show(&events)
    );
    // The kept ConfigMap was removed by the post-delete Job, not by tender.
    let cm_gone = first(&events, "ConfigMap", &kept, What::Deleted).unwrap();
    assert!(
        cm_gone.rv <= end,
        "kept ConfigMap deleted by the post-delete hook:\n{}",
        show(&events)
    );
    let post_job = hook_phase(&objs, "post-delete")
        .into_iter()
        .find(|h| h.kind == "Job")
        .unwrap();
    let post_created = events
        .iter()
        .find(|e| e.rv > start && e.name == post_job.name && e.what == What::Created)
        .unwrap();
    assert!(cm_gone.rv > post_created.rv, "{}", show(&events));
    // No hook object is left behind.
    let hooks: Vec<&Rendered> = objs
        .iter()
        .filter(|o| o.hooks.iter().any(|h| h.ends_with("-delete")))
        .collect();
    all_gone(&down, &hooks, "hook-succeeded", (&ws, "east", "kyverno")).await;
    check_no_overlap(&events).unwrap_or_else(|e| panic!("{e}\n{}", show(&events)));
    assert!(player.errors().is_empty(), "player: {:?}", player.errors());
}

#[tokio::test]
async fn a_failing_pre_upgrade_hook_halts_with_its_reason_and_nothing_is_removed() {
    let charts = &charts().await;
    let ws = Workspace::new(shared_env_of("real-charts", 1).await, "halt").await;
    let agent = real_charts::infrastructure_agent(&ws, "east", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let (ns, release) = (unique_name("halt"), "halt");
    let v1 = ingress_values(release, "1");
    let install = charts
        .template("ingress-nginx", release, &ns, &v1, false)
        .unwrap();
    let recorder = recorder(&down, &ns, &install, &[("v1", "Secret")], &[]).await;
    let player = Player::start(down.clone(), &ns);
    player.effect("-admission-create", real_charts::certgen_create());
    player.effect("-admission-patch", real_charts::certgen_patch());
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    ws.bundle("halt", ingress_bundle(charts, "east", &ns, release, &v1))
        .await;
    real_charts::rolled_out(&ws, "east", "halt", false).await;

    // The upgrade's pre-upgrade Job first runs (held), then fails.
    let job = format!("{release}-ingress-nginx-admission-create");
    player.hold(&job);
    let start = recorder.last_rv();
    ws.bundle(
        "halt",
        ingress_bundle(charts, "east", &ns, release, &ingress_values(release, "2")),
    )
    .await;
    let bds = ws.bds("east");
    let condition_with = |fragment: String, reason: Option<&'static str>| {
        let bds = bds.clone();
        async move {
            eventually(
                &format!("a condition naming {fragment}"),
                ROLLOUT,
                || async {
                    let bd = bds.get_opt("halt").await?;
                    Ok::<_, kube::Error>(bd.and_then(|bd| {
                        let s = bd.status?;
                        let ready = is_true(&s.conditions, TYPE_READY);
                        s.conditions
                            .iter()
                            .find(|c| {
                                c.message.contains(&fragment)
                                    && reason.is_none_or(|r| c.reason == r)
                                    && !ready
                            })
                            .map(|c| (c.reason.clone(), c.message.clone()))
                    }))
                },
            )
            .await
        }
    };
    let (_, waiting) = condition_with(job.clone(), None).await;
    assert!(
        waiting.contains(&ns),
        "the waiting message names the hook: {waiting}"
    );
    player.release(&job, true).await.unwrap();
    let (_, message) = condition_with(job.clone(), Some(HOOK_FAILED)).await;
    assert!(
        message.contains("Job") && message.contains(&ns) && message.contains("pre-upgrade"),
        "the message names the hook and its phase: {message}"
    );
    // The Bundle counts the cluster as failed (the hub folds every agent failure into
    // `ApplyFailed`; the hook's own reason and message are on the BundleDeployment).
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually("the Bundle counts the failed cluster", ROLLOUT, || async {
        let b = bundles.get("halt").await?;
        let failed = b.status.as_ref().is_some_and(|s| {
            tender_types::conditions::find_condition(&s.conditions, TYPE_READY).is_some_and(|c| {
                c.status == "False"
                    && c.reason == tender_types::conditions::reason::APPLY_FAILED
                    && c.message.contains("1 failed")
            })
        });
        Ok::<_, kube::Error>(failed.then_some(()))
    })
    .await;

    // The rollout stops there: the deployed objects stay as they were, nothing is removed,
    // no later phase runs; the failed Job stays (its delete policy has no hook-failed).
    let cm = format!("{release}-ingress-nginx-controller");
    let main = ordinary(&install);
    stays(
        "after the failed hook: the deployed chart",
        Duration::from_secs(20),
        &(Some("1".to_string()), true),
        || async {
            let mut all = true;
            for o in &main {
                all &= real_charts::get(&down, o).await.unwrap().is_some();
            }
            (config_revision(&down, &ns, &cm).await, all)
        },
    )
    .await;
    let events = recorder.events();
    let since: Vec<&Recorded> = events.iter().filter(|e| e.rv > start).collect();
    assert!(
        !since
            .iter()
            .any(|e| matches!(e.what, What::Deleting | What::Deleted)
                && main.iter().any(|o| o.kind == e.kind && o.name == e.name)),
        "nothing of the chart was removed:\n{}",
        show(&events)
    );
    let post = hook_phase(&install, "post-install");
    let patch_job = post.iter().find(|h| h.kind == "Job").unwrap();
    assert!(
        !since
            .iter()
            .any(|e| e.name == patch_job.name && e.what == What::Created),
        "the post-upgrade hook never ran:\n{}",
        show(&events)
    );
    let failed = hook_phase(&install, "pre-install")
        .into_iter()
        .find(|h| h.name == job)
        .unwrap();
    assert!(
        real_charts::get(&down, failed).await.unwrap().is_some(),
        "the failed Job is kept for inspection"
    );
    assert!(player.errors().is_empty(), "player: {:?}", player.errors());
}
