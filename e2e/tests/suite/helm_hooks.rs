//! Helm hooks on a real downstream cluster (decision 0088-phased-deploy-and-helm-hooks): a chart
//! with `pre-install`/ `pre-upgrade` and `post-install`/`post-upgrade` Jobs, a hook ServiceAccount
//! and a `pre-delete` Job, rendered by the pinned Helm and served by a loopback repository. The
//! downstream runs no job controller, so the test plays it: it marks hook Jobs complete or
//! failed, and each assertion holds while a hook is still running (nothing of the next phase
//! exists), so the order is proven, not sampled after the fact.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tender_e2e::charts::{Route, RouteRepo, index_yaml, package_chart};
use tender_e2e::fixture::{Workspace, stays};
use tender_e2e::{downstream_name, ensure_helm, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_DEPLOYED, find_condition, reason};

const WAIT: Duration = tender_e2e::fixture::WAIT;
const WINDOW: Duration = Duration::from_secs(6);

const JOB: &str = "  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      \
    - name: run\n        image: busybox\n";

fn job(name: &str, hook: &str, weight: i32, policy: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{{{ .Release.Name }}}}-{name}\n  \
         annotations:\n    helm.sh/hook: {hook}\n    helm.sh/hook-weight: \"{weight}\"\n{policy}\
         spec:\n  backoffLimit: 0\n{JOB}"
    )
}

/// The chart `hooked` at `version`: the hooks above and an ordinary ConfigMap `<rel>-app` that
/// records `.Values.v` and `.Release.IsInstall`.
fn chart(helm: &std::path::Path, work: &std::path::Path, version: &str) -> Vec<u8> {
    let migrate = job(
        "migrate",
        "pre-install,pre-upgrade",
        0,
        "    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded\n",
    );
    let notify = job("notify", "post-install,post-upgrade", 0, "");
    let cleanup = job("cleanup", "pre-delete", 0, "");
    let sa = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {{ .Release.Name }}-hooks\n  \
              annotations:\n    helm.sh/hook: pre-install,pre-upgrade\n    helm.sh/hook-weight: \"-5\"\n";
    let app = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-app\ndata:\n  \
               v: {{ .Values.v | quote }}\n  install: {{ .Release.IsInstall | quote }}\n  \
               revision: {{ $.Release.Revision | quote }}\n";
    package_chart(
        helm,
        work,
        &work.join("out"),
        "hooked",
        version,
        &[
            ("values.yaml", b"v: one\n"),
            ("templates/migrate.yaml", migrate.as_bytes()),
            ("templates/notify.yaml", notify.as_bytes()),
            ("templates/cleanup.yaml", cleanup.as_bytes()),
            ("templates/sa.yaml", sa.as_bytes()),
            ("templates/app.yaml", app.as_bytes()),
        ],
    )
    .expect("packaging the chart")
}

/// Plays the job controller for Job `name`: `Complete` (or `Failed`) with what the apiserver
/// requires of each.
async fn finish(jobs: &Api<Job>, name: &str, succeed: bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": now, "lastTransitionTime": now});
    let status = if succeed {
        json!({"startTime": now, "completionTime": now, "succeeded": 1,
               "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]})
    } else {
        let mut failed = cond("Failed");
        failed["reason"] = json!("BackoffLimitExceeded");
        failed["message"] = json!("Job has reached the specified backoff limit");
        let mut target = cond("FailureTarget");
        target["reason"] = json!("BackoffLimitExceeded");
        json!({"startTime": now, "failed": 1, "conditions": [target, failed]})
    };
    jobs.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("marking Job {name} finished: {e}"));
}

/// Waits for Job `name` created by run `run` (`None`: any) and returns its run annotation.
async fn job_of_run(jobs: &Api<Job>, name: &str, not_run: Option<&str>) -> String {
    eventually(&format!("hook Job {name} (new run)"), WAIT, || async {
        let j = jobs.get_opt(name).await?;
        Ok::<_, kube::Error>(j.and_then(|j| {
            let run = j
                .metadata
                .annotations?
                .get("tender.dev/hook-run")
                .cloned()?;
            (Some(run.as_str()) != not_run && j.status.and_then(|s| s.conditions).is_none())
                .then_some(run)
        }))
    })
    .await
}

async fn revision(cms: &Api<ConfigMap>) -> Option<String> {
    let cm = cms.get_opt("rel-app").await.ok().flatten()?;
    cm.data?.get("revision").cloned()
}

async fn app_value(cms: &Api<ConfigMap>) -> Option<(String, String)> {
    let cm = cms.get_opt("rel-app").await.ok().flatten()?;
    let d = cm.data?;
    Some((d.get("v")?.clone(), d.get("install")?.clone()))
}

#[tokio::test]
async fn hooks_run_in_their_phases_on_install_upgrade_failure_and_removal() {
    let helm = ensure_helm().expect("building helm");
    let work = std::env::temp_dir().join(unique_name("tender-hooked"));
    let repo = RouteRepo::start().await.expect("starting the repository");
    repo.route(
        "hooked-0.1.0.tgz",
        Route::Body(chart(&helm, &work, "0.1.0")),
    );
    let url = format!("{}/hooked-0.1.0.tgz", repo.url);
    repo.route(
        "index.yaml",
        Route::Body(index_yaml("hooked", &[("0.1.0", &url)]).into_bytes()),
    );

    let ws = Workspace::new(shared_env(1).await, "hooks").await;
    let cache = std::env::temp_dir().join(unique_name("tender-chart-cache"));
    let agent = ws
        .agent_configured("east", &downstream_name(1), |c| {
            c.helm_path = helm.clone();
            c.chart_cache_dir = cache;
        })
        .await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("hooks");
    let jobs: Api<Job> = Api::namespaced(down.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    let sas: Api<ServiceAccount> = Api::namespaced(down.clone(), &ns);
    let spec = |v: &str| {
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": ns,
            "helm": {"chart": "hooked", "repo": repo.url, "version": "0.1.0",
                     "releaseName": "rel", "values": {"v": v}},
        })
    };

    // Install: the pre-install ServiceAccount (weight -5) and Job; nothing ordinary before the
    // Job completes.
    ws.bundle("app", spec("one")).await;
    let first = job_of_run(&jobs, "rel-migrate", None).await;
    assert!(
        sas.get_opt("rel-hooks").await.unwrap().is_some(),
        "weight -5 first"
    );
    stays(
        "no ordinary object before pre-install completes",
        WINDOW,
        &None,
        || app_value(&cms),
    )
    .await;
    assert!(jobs.get_opt("rel-notify").await.unwrap().is_none());
    let bd = ws.bds("east").get("app").await.unwrap();
    let waiting = bd.status.unwrap().resources;
    assert!(
        waiting.iter().any(|s| s.name == "rel-migrate"
            && s.message.as_deref().unwrap_or("").contains("pre-install")),
        "the status names the hook it waits for: {waiting:?}"
    );
    finish(&jobs, "rel-migrate", true).await;
    eventually("the ordinary objects after pre-install", WAIT, || async {
        Ok::<_, kube::Error>(app_value(&cms).await.filter(|v| v.0 == "one"))
    })
    .await;
    assert_eq!(
        app_value(&cms).await.unwrap().1,
        "true",
        ".Release.IsInstall"
    );
    // post-install after the objects; the deployment is not applied before it completes.
    job_of_run(&jobs, "rel-notify", None).await;
    stays(
        "not applied while post-install runs",
        WINDOW,
        &None,
        || async {
            ws.bds("east")
                .get("app")
                .await
                .unwrap()
                .status
                .and_then(|s| s.applied_deployment_id)
        },
    )
    .await;
    finish(&jobs, "rel-notify", true).await;
    ws.ready("east", "app").await;
    // hook-succeeded: the migrate Job goes once applied; notify (default policy) stays.
    eventually("the hook-succeeded Job deleted", WAIT, || async {
        Ok::<_, kube::Error>(jobs.get_opt("rel-migrate").await?.is_none().then_some(()))
    })
    .await;
    assert!(jobs.get_opt("rel-notify").await.unwrap().is_some());

    // Upgrade: pre-upgrade runs again (a new run), the object changes only after it.
    ws.bundle("app", spec("two")).await;
    let second = job_of_run(&jobs, "rel-migrate", Some(&first)).await;
    assert_ne!(first, second);
    stays(
        "the object waits for pre-upgrade",
        WINDOW,
        &Some(("one".to_string(), "true".to_string())),
        || app_value(&cms),
    )
    .await;
    finish(&jobs, "rel-migrate", true).await;
    eventually("upgraded after pre-upgrade", WAIT, || async {
        Ok::<_, kube::Error>(app_value(&cms).await.filter(|v| v.0 == "two"))
    })
    .await;
    assert_eq!(
        app_value(&cms).await.unwrap().1,
        "false",
        "an upgrade is not an install"
    );
    // post-upgrade: before-hook-creation replaced the previous run's notify Job.
    job_of_run(&jobs, "rel-notify", Some(&first)).await;
    finish(&jobs, "rel-notify", true).await;
    ws.ready("east", "app").await;

    // A failing pre-upgrade hook stops the rollout: reason HookFailed naming it; nothing of
    // the deployed objects changes or goes.
    ws.bundle("app", spec("three")).await;
    job_of_run(&jobs, "rel-migrate", Some(&second)).await;
    finish(&jobs, "rel-migrate", false).await;
    let message = eventually("HookFailed", WAIT, || async {
        let bd = ws.bds("east").get("app").await?;
        Ok::<_, kube::Error>(bd.status.and_then(|s| {
            find_condition(&s.conditions, TYPE_DEPLOYED)
                .filter(|c| c.reason == reason::HOOK_FAILED)
                .map(|c| c.message.clone())
        }))
    })
    .await;
    assert!(
        message.contains("rel-migrate") && message.contains("pre-upgrade"),
        "{message}"
    );
    stays(
        "a failed hook changes nothing",
        WINDOW,
        &Some(("two".to_string(), "false".to_string())),
        || app_value(&cms),
    )
    .await;

    // Back to the applied deployment: ready as it is, still revision 2 (a failed upgrade does
    // not advance the release).
    ws.bundle("app", spec("two")).await;
    ws.ready("east", "app").await;
    assert_eq!(revision(&cms).await.as_deref(), Some("2"));

    // Removal: pre-delete runs before anything is deleted.
    ws.delete_bundle("app").await;
    job_of_run(&jobs, "rel-cleanup", None).await;
    stays(
        "nothing deleted before pre-delete completes",
        WINDOW,
        &true,
        || async { app_value(&cms).await.is_some() },
    )
    .await;
    finish(&jobs, "rel-cleanup", true).await;
    // Longer than one 30 s retry of a removal step that met a transient error.
    eventually("everything removed after pre-delete", 2 * WAIT, || async {
        let left = (
            app_value(&cms).await.is_some(),
            jobs.get_opt("rel-notify").await?.is_some(),
            jobs.get_opt("rel-cleanup").await?.is_some(),
            sas.get_opt("rel-hooks").await?.is_some(),
        );
        Ok::<_, kube::Error>((left == (false, false, false, false)).then_some(()))
    })
    .await;
    let _ = std::fs::remove_dir_all(&work);
}
