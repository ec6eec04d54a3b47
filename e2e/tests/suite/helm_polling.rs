//! Chart versions that move (`pollingInterval`): a HelmOp with a version range on two real
//! clusters follows a version published to its chart repository (loopback, basic auth), the
//! hub recording it in `status.version` and the `Polled` condition; looks that find nothing new
//! write nothing; a repository that goes away leaves the version deployed and says so.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tender_e2e::charts::{ChartRepo, package_app_chart, run_helm};
use tender_e2e::fixture::{Workspace, settled, stays};
use tender_e2e::oci_registry::{OciRegistry, RegistryAuth};
use tender_e2e::{downstream_name, ensure_helm, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_POLLED, find_condition, reason};
use tender_types::{Bundle, BundleDeployment, HelmOp};

const USER: &str = "chart-reader";
const PASSWORD: &str = "poll-pass-456";
/// The CRD's floor, so the test waits as a user would.
const INTERVAL: &str = "15s";
/// One interval, its jitter and a reconcile.
const LOOK: Duration = Duration::from_secs(45);

async fn config_version(api: &Api<ConfigMap>) -> Option<String> {
    api.get_opt("web-config")
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data.and_then(|d| d.get("version").cloned()))
}

async fn rendered_everywhere(apis: &[Api<ConfigMap>], version: &str) {
    for api in apis {
        eventually(
            &format!("web-config rendered from {version}"),
            LOOK,
            || async {
                Ok::<_, kube::Error>(
                    (config_version(api).await.as_deref() == Some(version)).then_some(()),
                )
            },
        )
        .await;
    }
}

/// The HelmOp once its status says `version` with `Polled` = `ok`.
async fn polled(ws: &Workspace, version: &str, ok: bool) -> HelmOp {
    let api: Api<HelmOp> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually(
        &format!("HelmOp status.version {version}, Polled {ok}"),
        LOOK,
        || async {
            let h = api.get("web").await?;
            let done = h.status.as_ref().is_some_and(|s| {
                s.version.as_deref() == Some(version)
                    && find_condition(&s.conditions, TYPE_POLLED)
                        .is_some_and(|c| (c.status == "True") == ok)
            });
            Ok::<_, kube::Error>(done.then_some(h))
        },
    )
    .await
}

#[tokio::test]
async fn a_version_range_follows_the_repository_and_survives_its_loss() {
    let repo = ChartRepo::start(&["0.1.0"], USER, PASSWORD)
        .await
        .expect("starting the chart repository");
    let ws = Workspace::new(shared_env(2).await, "helm-polling").await;
    let (_east, _west) = (
        ws.helm_agent("east", &downstream_name(1)).await,
        ws.helm_agent("west", &downstream_name(2)).await,
    );
    let ns = unique_name("polled-app");
    let mut cms = Vec::new();
    for n in [1, 2] {
        let down = ws.downstream(&downstream_name(n)).await;
        cms.push(Api::<ConfigMap>::namespaced(down, &ns));
    }
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    let body = json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
        "metadata": {"name": "web"},
        "spec": {
            "helm": {"releaseName": "web", "repo": repo.url, "chart": "app",
                     "version": ">=0.1.0 <1.0.0", "values": {"greeting": "hi"}},
            "helmSecretName": "repo-auth",
            "pollingInterval": INTERVAL,
            "namespace": ns,
            "targets": [{"clusterName": "east"}, {"clusterName": "west"}]
        }
    });
    Api::<HelmOp>::namespaced(ws.hub.clone(), &ws.ns)
        .patch("web", &PatchParams::apply("e2e"), &Patch::Apply(&body))
        .await
        .unwrap();

    rendered_everywhere(&cms, "0.1.0").await;
    let h = polled(&ws, "0.1.0", true).await;
    let c = find_condition(&h.status.as_ref().unwrap().conditions, TYPE_POLLED).unwrap();
    assert_eq!(c.reason, reason::VERSION_RESOLVED);
    assert!(c.message.contains("0.1.0"), "{}", c.message);
    // Every cluster was handed the exact version, not the range.
    for cluster in ["east", "west"] {
        let bd: BundleDeployment = ws.bds(cluster).get("web").await.unwrap();
        assert_eq!(
            bd.spec.helm.unwrap().version.as_deref(),
            Some("0.1.0"),
            "{cluster}"
        );
    }

    // Looks that find nothing new write nothing: across more than one interval.
    let hub = ws.hub_instance();
    let quiet = Duration::from_secs(2) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY;
    let writes = settled("hub writes", quiet, || async { hub.writes() }).await;
    stays(
        "hub writes while the repository has nothing new",
        Duration::from_secs(20),
        &writes,
        || async { hub.writes() },
    )
    .await;

    // A new version in the repository rolls out everywhere.
    let helm = ensure_helm().unwrap();
    let work = std::env::temp_dir().join(unique_name("tender-chart-work"));
    package_app_chart(&helm, &work, &repo.dir, "0.2.0").unwrap();
    run_helm(&helm, &["repo", "index", repo.dir.to_str().unwrap()]).unwrap();
    let h = polled(&ws, "0.2.0", true).await;
    let c = find_condition(&h.status.as_ref().unwrap().conditions, TYPE_POLLED).unwrap();
    assert!(c.message.contains("0.2.0"), "{}", c.message);
    rendered_everywhere(&cms, "0.2.0").await;

    // The repository goes away: 0.2.0 stays, and the HelmOp says why it cannot look.
    drop(repo);
    let h = polled(&ws, "0.2.0", false).await;
    let c = find_condition(&h.status.as_ref().unwrap().conditions, TYPE_POLLED).unwrap();
    assert_eq!(c.reason, reason::CHART_REPOSITORY_UNREACHABLE);
    assert!(c.message.contains("0.2.0 stays deployed"), "{}", c.message);
    assert!(!c.message.contains(PASSWORD));
    stays(
        "versions rendered while the repository is gone",
        Duration::from_secs(5),
        &vec![Some("0.2.0".to_string()); 2],
        || async {
            let mut v = Vec::new();
            for api in &cms {
                v.push(config_version(api).await);
            }
            v
        },
    )
    .await;
    let _ = std::fs::remove_dir_all(work);
}

/// The Bundle form against an OCI registry with token auth: the hub lists the tags (Bearer
/// token from the realm, with the copied credentials) and follows a pushed version.
#[tokio::test]
async fn a_bundle_polls_an_oci_registrys_tags() {
    const REG_USER: &str = "chart-puller";
    const REG_PASSWORD: &str = "reg-pass-789";
    let reg = OciRegistry::start(RegistryAuth::Token, REG_USER, REG_PASSWORD)
        .await
        .expect("starting the OCI registry");
    reg.push_app_chart("0.1.0").expect("pushing 0.1.0");
    let ws = Workspace::new(shared_env(2).await, "helm-polling-oci").await;
    let agent = ws.helm_agent("oci-east", &downstream_name(1)).await;
    let ns = unique_name("polled-oci");
    let cms = Api::<ConfigMap>::namespaced(ws.downstream(&agent.downstream).await, &ns);
    ws.source_secret(
        "repo-auth",
        &[("username", REG_USER), ("password", REG_PASSWORD)],
    )
    .await;
    ws.bundle(
        "web",
        json!({
            "targets": [{"clusterName": "oci-east"}],
            "targetNamespace": ns,
            "downstreamResources": [{"kind": "Secret", "name": "repo-auth"}],
            "pollingInterval": INTERVAL,
            "helm": {"chart": reg.chart(), "basicHTTP": true, "version": ">=0.1.0 <1.0.0",
                     "releaseName": "web", "values": {"greeting": "hi"},
                     "helmSecretName": "repo-auth"}
        }),
    )
    .await;
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let version_is = |want: &'static str| {
        let bundles = bundles.clone();
        async move {
            eventually(&format!("Bundle status.version {want}"), LOOK, || async {
                let b = bundles.get("web").await?;
                let s = b.status.unwrap_or_default();
                let ok = s.version.as_deref() == Some(want)
                    && find_condition(&s.conditions, TYPE_POLLED)
                        .is_some_and(|c| c.status == "True");
                Ok::<_, kube::Error>(ok.then_some(()))
            })
            .await;
        }
    };
    version_is("0.1.0").await;
    rendered_everywhere(std::slice::from_ref(&cms), "0.1.0").await;
    reg.push_app_chart("0.2.0").expect("pushing 0.2.0");
    version_is("0.2.0").await;
    rendered_everywhere(std::slice::from_ref(&cms), "0.2.0").await;
    let bd: BundleDeployment = ws.bds("oci-east").get("web").await.unwrap();
    assert_eq!(bd.spec.helm.unwrap().version.as_deref(), Some("0.2.0"));
}

/// The apiserver refuses an interval that is no Go duration, naming the field with Fleet's
/// message, and admits what Fleet admits: `5s` (raised by the hub, decision 0125), `0`, `0s`.
#[tokio::test]
async fn a_malformed_interval_is_refused_and_fleets_forms_admitted() {
    let ws = Workspace::new(shared_env(2).await, "helm-polling-bad").await;
    let body = |interval: &str| {
        json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
            "metadata": {"name": "web"},
            "spec": {"helm": {"repo": "https://charts.example.com", "chart": "app"},
                     "pollingInterval": interval}
        })
    };
    let api = Api::<HelmOp>::namespaced(ws.hub.clone(), &ws.ns);
    for interval in ["5 minutes", "1d", "-5s"] {
        let err = api
            .patch(
                "web",
                &PatchParams::apply("e2e"),
                &Patch::Apply(&body(interval)),
            )
            .await
            .expect_err(interval);
        assert!(
            err.to_string()
                .contains("pollingInterval must be 0 or a valid Go duration"),
            "{interval}: {err}"
        );
    }
    for interval in ["5s", "0", "0s", "1.5h"] {
        api.patch(
            "web",
            &PatchParams::apply("e2e"),
            &Patch::Apply(&body(interval)),
        )
        .await
        .unwrap_or_else(|e| panic!("{interval}: {e}"));
    }
}

/// Packages chart `web` at `version` into `repo_dir` and re-indexes it: a Deployment whose
/// replicas come from the values, and a ConfigMap with the rendered greeting, zone and version.
fn publish_web_chart(repo_dir: &std::path::Path, version: &str) {
    let helm = ensure_helm().unwrap();
    let dir = std::env::temp_dir()
        .join(unique_name("tender-web-chart"))
        .join("web");
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::write(
        dir.join("Chart.yaml"),
        format!("apiVersion: v2\nname: web\nversion: {version}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("values.yaml"),
        "greeting: \"\"\nzone: \"\"\nreplicas: 1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("templates/config.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\ndata:\n  \
         greeting: {{ .Values.greeting | quote }}\n  zone: {{ .Values.zone | quote }}\n  \
         version: {{ .Chart.Version | quote }}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("templates/deployment.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n\
         spec:\n  replicas: {{ .Values.replicas }}\n  selector:\n    matchLabels: {app: web}\n  \
         template:\n    metadata:\n      labels: {app: web}\n      annotations: {chart: {{ .Chart.Version | quote }}}\n    \
         spec:\n      containers:\n      - {name: web, image: registry.example/web:1}\n",
    )
    .unwrap();
    run_helm(
        &helm,
        &[
            "package",
            dir.to_str().unwrap(),
            "-d",
            repo_dir.to_str().unwrap(),
        ],
    )
    .unwrap();
    run_helm(&helm, &["repo", "index", repo_dir.to_str().unwrap()]).unwrap();
}

/// Issue 24's "done when", as one Fleet HelmOp: per-target values, `${ .ClusterLabels.… }`
/// templating, a version range with `pollingInterval` and a `comparePatches` entry deploy on
/// two clusters with different values, follow a newly published chart version, and leave the
/// replicas an HPA set alone — across that upgrade too.
#[tokio::test]
async fn a_fleet_helmop_with_targets_templates_polling_and_compare_patches() {
    let repo = ChartRepo::start(&["0.1.0"], USER, PASSWORD)
        .await
        .expect("starting the chart repository");
    publish_web_chart(&repo.dir, "1.0.0");
    let ws = Workspace::new(shared_env(2).await, "fleet-done-when").await;
    let (_east, _west) = (
        ws.helm_agent("east", &downstream_name(1)).await,
        ws.helm_agent("west", &downstream_name(2)).await,
    );
    for (cluster, env) in [("east", "prod"), ("west", "dev")] {
        Api::<tender_types::Cluster>::namespaced(ws.hub.clone(), &ws.ns)
            .patch(
                cluster,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"env": env}}})),
            )
            .await
            .unwrap();
    }
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    let ns = unique_name("fleet-web");
    let body = json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
        "metadata": {"name": "web"},
        "spec": {
            "helm": {"releaseName": "web", "repo": repo.url, "chart": "web",
                     "version": ">=1.0.0 <2.0.0",
                     "values": {"greeting": "hello-${ .ClusterLabels.env }", "replicas": 2}},
            "helmSecretName": "repo-auth",
            "pollingInterval": INTERVAL,
            "namespace": ns,
            "diff": {"comparePatches": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                         "name": "web", "namespace": ns,
                                         "operations": [{"op": "remove", "path": "/spec/replicas"}]}]},
            "targets": [
                {"clusterName": "east", "helm": {"values": {"zone": "eu"}}},
                {"clusterName": "west", "helm": {"values": {"zone": "us"}}}
            ]
        }
    });
    Api::<HelmOp>::namespaced(ws.hub.clone(), &ws.ns)
        .patch("web", &PatchParams::apply("e2e"), &Patch::Apply(&body))
        .await
        .unwrap();

    let mut configs = Vec::new();
    let mut deployments = Vec::new();
    for n in [1, 2] {
        let down = ws.downstream(&downstream_name(n)).await;
        configs.push(Api::<ConfigMap>::namespaced(down.clone(), &ns));
        deployments.push(Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
            down, &ns,
        ));
    }
    let data = |api: Api<ConfigMap>| async move {
        api.get_opt("web-config")
            .await
            .ok()
            .flatten()
            .and_then(|c| c.data)
            .unwrap_or_default()
    };
    let expect = [("hello-prod", "eu"), ("hello-dev", "us")];
    for version in ["1.0.0", "1.1.0"] {
        if version == "1.1.0" {
            // An HPA (another field manager) scales east's Deployment, then a new version
            // of the chart is published.
            eventually("east's Deployment", LOOK, || async {
                Ok::<_, kube::Error>(deployments[0].get_opt("web").await?.map(|_| ()))
            })
            .await;
            deployments[0]
                .patch(
                    "web",
                    &PatchParams::apply("e2e-hpa").force(),
                    &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                                         "metadata": {"name": "web"}, "spec": {"replicas": 5}})),
                )
                .await
                .unwrap();
            publish_web_chart(&repo.dir, "1.1.0");
        }
        for (api, (greeting, zone)) in configs.iter().zip(expect) {
            eventually(&format!("{greeting}/{zone} at {version}"), LOOK, || async {
                let d = data(api.clone()).await;
                let ok = d.get("greeting").map(String::as_str) == Some(greeting)
                    && d.get("zone").map(String::as_str) == Some(zone)
                    && d.get("version").map(String::as_str) == Some(version);
                Ok::<_, kube::Error>(ok.then_some(()))
            })
            .await;
        }
        polled(&ws, version, true).await;
    }
    // The upgrade changed the pod template and left the replicas the HPA set.
    let replicas = |api: Api<k8s_openapi::api::apps::v1::Deployment>| async move {
        let d = api.get("web").await.unwrap();
        let chart = d.spec.as_ref().and_then(|s| {
            s.template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get("chart").cloned())
        });
        (d.spec.and_then(|s| s.replicas), chart)
    };
    stays(
        "east's replicas as the HPA set them, at chart 1.1.0",
        Duration::from_secs(10),
        &(Some(5), Some("1.1.0".to_string())),
        || replicas(deployments[0].clone()),
    )
    .await;
}
