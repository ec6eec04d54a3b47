//! Helm charts on a real downstream cluster: a tiny chart packaged with the pinned Helm CLI,
//! served by a loopback chart repository with basic auth and by a real OCI registry
//! (distribution, htpasswd or token auth); values from a copied Secret, rotation, drift,
//! upgrade by version with pruning, removal (and `keepResources`), and every failure reason
//! with what is deployed kept in place.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tender_e2e::charts::ChartRepo;
use tender_e2e::fixture::{Workspace, stays};
use tender_e2e::oci_registry::{OciRegistry, RegistryAuth};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_DEPLOYED, find_condition, reason};
use tender_types::labels;

const WAIT: std::time::Duration = tender_e2e::fixture::WAIT;
const USER: &str = "chart-reader";
const PASSWORD: &str = "repo-pass-123";

async fn repo() -> ChartRepo {
    ChartRepo::start(&["0.1.0", "0.2.0"], USER, PASSWORD)
        .await
        .expect("starting the chart repository")
}

fn bundle(cluster: &str, ns: &str, helm: Value) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "defaultNamespace": ns,
        "downstreamResources": [
            {"kind": "Secret", "name": "app-values"},
            {"kind": "Secret", "name": "repo-auth"}
        ],
        "helm": helm,
    })
}

async fn config_value(api: &Api<ConfigMap>, name: &str, key: &str) -> Option<String> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data.and_then(|d| d.get(key).cloned()))
}

async fn wait_value(api: &Api<ConfigMap>, name: &str, key: &str, want: Option<&str>) {
    eventually(
        &format!("ConfigMap {name} {key} = {want:?}"),
        WAIT,
        || async {
            let got = if want.is_none() {
                api.get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .map(|_| String::new())
            } else {
                config_value(api, name, key).await
            };
            Ok::<_, kube::Error>((got.as_deref() == want).then_some(()))
        },
    )
    .await;
}

/// Waits for the `Deployed` condition's reason to be `want`; returns its message.
/// Longer than one retry of a failed deployment: the agent re-plans it every
/// `AgentConfig::conflict_recheck` (30 s by default, 3 s for the fixtures' agents); that it
/// keeps what is deployed on every retry is proven in-process on virtual time
/// (`a_chart_that_cannot_be_fetched_keeps_what_is_deployed_and_is_retried_on_the_timer`).
const RETRIES: Duration = tender_e2e::fixture::CONFLICT_RECHECKS;

/// The chart's deployed objects stay as they were (greeting `greeting`, `web-extra` there)
/// across `window`: a failure never removes or changes what is deployed.
async fn deployed_stays(api: &Api<ConfigMap>, greeting: &str, why: &str, window: Duration) {
    stays(
        &format!("{why}: the deployed chart objects"),
        window,
        &(Some(greeting.to_string()), true),
        || async {
            (
                config_value(api, "web-config", "greeting").await,
                api.get_opt("web-extra").await.unwrap().is_some(),
            )
        },
    )
    .await;
}

async fn deployed_reason(ws: &Workspace, cluster: &str, bundle: &str, want: &str) -> String {
    deployed_failure(ws, cluster, bundle, want, "").await
}

/// Waits for the `Deployed` reason `want` with a message containing `fragment` (which tells
/// two failures with the same reason apart); returns the message.
async fn deployed_failure(
    ws: &Workspace,
    cluster: &str,
    bundle: &str,
    want: &str,
    fragment: &str,
) -> String {
    let api = ws.bds(cluster);
    eventually(
        &format!("Deployed reason {want} ({fragment:?})"),
        WAIT,
        || async {
            let bd = api.get_opt(bundle).await?;
            Ok::<_, kube::Error>(bd.and_then(|bd| {
                let s = bd.status?;
                find_condition(&s.conditions, TYPE_DEPLOYED)
                    .filter(|c| c.reason == want && c.message.contains(fragment))
                    .map(|c| c.message.clone())
            }))
        },
    )
    .await
}

/// Whether a downstream object still carries any tender label or annotation.
fn managed(meta: &ObjectMeta) -> bool {
    let tender = |m: &Option<BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .any(|(k, _)| labels::is_tender_key(k) || k == labels::MANAGED_BY)
    };
    tender(&meta.labels) || tender(&meta.annotations)
}

#[tokio::test]
async fn chart_values_from_a_copied_secret_rotate_drift_upgrade_and_removal() {
    let repo = repo().await;
    let ws = Workspace::new(shared_env(1).await, "helm").await;
    let agent = ws.helm_agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("helm-app");
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    ws.source_secret("app-values", &[("values.yaml", "greeting: hello\n")])
        .await;
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    let helm = |version: &str| {
        json!({
            "chart": "app", "repo": repo.url, "version": version, "releaseName": "web",
            "values": {"greeting": "inline"},
            "valuesFrom": [{"secretKeyRef": {"name": "app-values", "key": "values.yaml"}}],
            "helmSecretName": "repo-auth"
        })
    };
    ws.bundle("app", bundle("east", &ns, helm("0.1.0"))).await;
    ws.ready("east", "app").await;
    assert_eq!(
        config_value(&cms, "web-config", "greeting")
            .await
            .as_deref(),
        Some("hello"),
        "valuesFrom is merged over the inline values"
    );
    assert!(cms.get_opt("web-extra").await.unwrap().is_some());
    // The pre-install hook ran (applied in its phase, marked with the run that made it).
    let hook = cms
        .get_opt("web-hook")
        .await
        .unwrap()
        .expect("the pre-install hook ran");
    assert!(
        hook.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("tender.dev/hook-run"),
        "a hook object names its run"
    );

    // Rotation of the copied values Secret re-renders.
    ws.source_secret("app-values", &[("values.yaml", "greeting: goodbye\n")])
        .await;
    wait_value(&cms, "web-config", "greeting", Some("goodbye")).await;

    // Drift on a chart object is corrected.
    cms.patch(
        "web-config",
        &PatchParams::apply("intruder").force(),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web-config"}, "data": {"greeting": "tampered"}})),
    )
    .await
    .unwrap();
    wait_value(&cms, "web-config", "greeting", Some("goodbye")).await;

    // Upgrade by a version range; the object the new version no longer renders is pruned.
    ws.bundle("app", bundle("east", &ns, helm("^0.2"))).await;
    wait_value(&cms, "web-config", "version", Some("0.2.0")).await;
    wait_value(&cms, "web-extra", "", None).await;
    ws.ready("east", "app").await;

    // Removal deletes what the chart rendered.
    ws.delete_bundle("app").await;
    wait_value(&cms, "web-config", "", None).await;
}

#[tokio::test]
async fn chart_failures_are_reported_and_keep_what_is_deployed() {
    let repo = repo().await;
    let ws = Workspace::new(shared_env(1).await, "helmfail").await;
    let agent = ws.helm_agent("west", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("helm-fail");
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    ws.source_secret(
        "app-values",
        &[
            ("values.yaml", "greeting: hi\n"),
            ("broken.yaml", "greeting: [s3cr3t-unclosed\n"),
        ],
    )
    .await;
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    let base = json!({
        "chart": "app", "repo": repo.url, "version": "0.1.0", "releaseName": "web",
        "valuesFrom": [{"secretKeyRef": {"name": "app-values", "key": "values.yaml"}}],
    });
    let with = |patch: Value| {
        let mut h = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                h.as_object_mut().unwrap().remove(k);
            } else {
                h[k] = v.clone();
            }
        }
        bundle("west", &ns, h)
    };

    // Credentials are required: without them the repository answers 401.
    ws.bundle("app", with(json!({}))).await;
    let msg = deployed_reason(&ws, "west", "app", reason::CHART_AUTH_FAILED).await;
    assert!(repo.refused() > 0);
    assert!(!msg.contains(PASSWORD));

    // With the copied credentials it deploys.
    ws.bundle("app", with(json!({"helmSecretName": "repo-auth"})))
        .await;
    ws.ready("west", "app").await;
    wait_value(&cms, "web-config", "greeting", Some("hi")).await;
    let auth = json!({"helmSecretName": "repo-auth"});

    // Each failure is its own reason, and what is deployed stays.
    let cases = [
        (json!({"version": "9.9.9"}), reason::CHART_VERSION_NOT_FOUND),
        (
            json!({"valuesFrom": [{"secretKeyRef": {"name": "app-values", "key": "nope"}}]}),
            reason::VALUES_FROM_MISSING,
        ),
        (
            json!({"valuesFrom": [{"secretKeyRef": {"name": "app-values", "key": "broken.yaml"}}]}),
            reason::VALUES_INVALID,
        ),
        (
            json!({"valuesFrom": null, "values": {"token": "s3cr3t-token-value"}}),
            reason::CHART_RENDER_FAILED,
        ),
        (
            json!({"repo": "http://127.0.0.1:9/charts"}),
            reason::CHART_REPOSITORY_UNREACHABLE,
        ),
    ];
    for (patch, want) in cases {
        let mut patch = patch;
        patch["helmSecretName"] = auth["helmSecretName"].clone();
        ws.bundle("app", with(patch)).await;
        let msg = deployed_reason(&ws, "west", "app", want).await;
        assert!(!msg.contains("s3cr3t"), "values in the message: {msg}");
        assert!(!msg.contains(PASSWORD), "credentials in the message: {msg}");
        deployed_stays(&cms, "hi", want, Duration::from_secs(2)).await;
    }
    // The last failure across more than one of the agent's retries (every 30 s).
    deployed_stays(&cms, "hi", "retried", RETRIES).await;
    drop(agent);
}

#[tokio::test]
async fn removal_with_keep_resources_leaves_the_chart_objects_unmanaged() {
    let repo = repo().await;
    let ws = Workspace::new(shared_env(1).await, "helmkeep").await;
    let agent = ws.helm_agent("north", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("helm-keep");
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    ws.source_secret("app-values", &[("values.yaml", "greeting: kept\n")])
        .await;
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    let mut spec = bundle(
        "north",
        &ns,
        json!({
            "chart": "app", "repo": repo.url, "version": "0.1.0", "releaseName": "web",
            "valuesFrom": [{"secretKeyRef": {"name": "app-values"}}],
            "helmSecretName": "repo-auth"
        }),
    );
    spec["keepResources"] = json!(true);
    ws.bundle("app", spec).await;
    ws.ready("north", "app").await;
    let deployed = cms.get("web-config").await.unwrap();
    assert!(managed(&deployed.metadata));

    ws.delete_bundle("app").await;
    let bds = ws.bds("north");
    eventually("the BundleDeployment is gone", WAIT, || async {
        Ok::<_, kube::Error>(bds.get_opt("app").await?.is_none().then_some(()))
    })
    .await;
    for name in ["web-config", "web-extra"] {
        let cm = cms
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name} was removed: {e}"));
        assert!(
            !managed(&cm.metadata),
            "{name} still carries tender metadata"
        );
        if name == "web-config" {
            assert_eq!(
                cm.metadata.uid, deployed.metadata.uid,
                "the same object, not a new one"
            );
        }
    }
    assert_eq!(
        config_value(&cms, "web-config", "greeting")
            .await
            .as_deref(),
        Some("kept")
    );
    drop(agent);
}

// ---------------------------------------------------------------------------------------------
// OCI registries.

const REG_USER: &str = "chart-puller";
const REG_PASSWORD: &str = "reg-pass-456";

/// `app` 0.1.0 and 0.2.0+build.1 (tag `0.2.0_build.1`) in a registry with `auth`.
async fn registry(auth: RegistryAuth) -> OciRegistry {
    let reg = OciRegistry::start(auth, REG_USER, REG_PASSWORD)
        .await
        .expect("starting the OCI registry");
    for v in ["0.1.0", "0.2.0+build.1"] {
        reg.push_app_chart(v).expect("pushing the chart");
    }
    reg
}

fn oci_helm(reg: &OciRegistry, version: &str, auth: Option<&str>) -> Value {
    let mut h = json!({
        "chart": reg.chart(), "basicHTTP": true, "version": version, "releaseName": "web",
        "values": {"greeting": "inline"},
        "valuesFrom": [{"secretKeyRef": {"name": "app-values", "key": "values.yaml"}}],
    });
    if let Some(name) = auth {
        h["helmSecretName"] = json!(name);
    }
    h
}

#[tokio::test]
async fn oci_chart_needs_the_copied_credentials_renders_values_rotates_and_upgrades() {
    let reg = registry(RegistryAuth::Basic).await;
    let ws = Workspace::new(shared_env(1).await, "helmoci").await;
    let agent = ws.helm_agent("oci-east", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("helm-oci");
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    ws.source_secret("app-values", &[("values.yaml", "greeting: hello-oci\n")])
        .await;
    ws.source_secret(
        "repo-auth",
        &[("username", REG_USER), ("password", REG_PASSWORD)],
    )
    .await;

    // Without credentials the registry refuses the agent, and nothing is served to it.
    ws.bundle(
        "app",
        bundle("oci-east", &ns, oci_helm(&reg, "0.1.0", None)),
    )
    .await;
    let msg = deployed_reason(&ws, "oci-east", "app", reason::CHART_AUTH_FAILED).await;
    assert!(
        msg.contains("helmSecretName") && !msg.contains(REG_PASSWORD),
        "{msg}"
    );
    assert!(
        reg.agent_refused() > 0,
        "no 401 in the registry log: {}",
        reg.log()
    );
    assert_eq!(reg.agent_served(), 0, "{}", reg.log());
    assert!(cms.get_opt("web-config").await.unwrap().is_none());

    // With the copied Secret it pulls, renders the copied values and deploys.
    ws.bundle(
        "app",
        bundle("oci-east", &ns, oci_helm(&reg, "0.1.0", Some("repo-auth"))),
    )
    .await;
    ws.ready("oci-east", "app").await;
    assert_eq!(
        config_value(&cms, "web-config", "greeting")
            .await
            .as_deref(),
        Some("hello-oci")
    );
    assert_eq!(
        config_value(&cms, "web-config", "version").await.as_deref(),
        Some("0.1.0")
    );
    assert!(cms.get_opt("web-extra").await.unwrap().is_some());
    assert!(reg.agent_served() > 0);

    // Rotating the copied values Secret changes the object downstream.
    ws.source_secret("app-values", &[("values.yaml", "greeting: rotated-oci\n")])
        .await;
    wait_value(&cms, "web-config", "greeting", Some("rotated-oci")).await;

    // A wrong password (rotated into the copied Secret) is refused; what is deployed stays.
    ws.source_secret(
        "repo-auth",
        &[("username", REG_USER), ("password", "wrong-pass-789")],
    )
    .await;
    let msg = deployed_failure(&ws, "oci-east", "app", reason::CHART_AUTH_FAILED, "401").await;
    assert!(
        !msg.contains("wrong-pass-789") && !msg.contains("rotated-oci"),
        "{msg}"
    );
    assert_eq!(
        config_value(&cms, "web-config", "greeting")
            .await
            .as_deref(),
        Some("rotated-oci")
    );
    ws.source_secret(
        "repo-auth",
        &[("username", REG_USER), ("password", REG_PASSWORD)],
    )
    .await;
    ws.ready("oci-east", "app").await;

    // Upgrade by a range: tags are listed, `0.2.0_build.1` read as 0.2.0+build.1, and the
    // object the new version no longer renders is pruned.
    ws.bundle(
        "app",
        bundle("oci-east", &ns, oci_helm(&reg, "^0.2", Some("repo-auth"))),
    )
    .await;
    wait_value(&cms, "web-config", "version", Some("0.2.0+build.1")).await;
    wait_value(&cms, "web-extra", "", None).await;
    ws.ready("oci-east", "app").await;
    assert_eq!(
        config_value(&cms, "web-config", "greeting")
            .await
            .as_deref(),
        Some("rotated-oci")
    );

    ws.delete_bundle("app").await;
    wait_value(&cms, "web-config", "", None).await;
    drop(agent);
}

#[tokio::test]
async fn oci_bearer_token_flow_and_failures_keep_what_is_deployed() {
    let reg = registry(RegistryAuth::Token).await;
    reg.push_app_chart("0.3.0").expect("pushing 0.3.0");
    reg.corrupt_chart("0.3.0").expect("corrupting 0.3.0");
    let ws = Workspace::new(shared_env(1).await, "helmocifail").await;
    let agent = ws.helm_agent("oci-west", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("helm-oci-fail");
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    ws.source_secret("app-values", &[("values.yaml", "greeting: via-token\n")])
        .await;
    // Credentials as a .dockerconfigjson entry for the registry's host.
    let docker_config = |password: &str| {
        json!({"auths": {reg.host.clone(): {"username": REG_USER, "password": password}}})
            .to_string()
    };
    ws.source_secret(
        "repo-auth",
        &[(".dockerconfigjson", &docker_config(REG_PASSWORD))],
    )
    .await;
    ws.bundle(
        "app",
        bundle("oci-west", &ns, oci_helm(&reg, "0.1.0", Some("repo-auth"))),
    )
    .await;
    ws.ready("oci-west", "app").await;
    assert_eq!(
        config_value(&cms, "web-config", "greeting")
            .await
            .as_deref(),
        Some("via-token")
    );
    let kept = |want: &'static str| {
        let cms = cms.clone();
        async move { deployed_stays(&cms, "via-token", want, Duration::from_secs(2)).await }
    };
    let clean = |msg: &str| {
        for secret in [REG_PASSWORD, "wrong-pass-789", "via-token", "Bearer "] {
            assert!(!msg.contains(secret), "{secret:?} in the message: {msg}");
        }
    };

    // A rotation to a wrong password: the token issuer refuses it.
    ws.source_secret(
        "repo-auth",
        &[(".dockerconfigjson", &docker_config("wrong-pass-789"))],
    )
    .await;
    let msg = deployed_reason(&ws, "oci-west", "app", reason::CHART_AUTH_FAILED).await;
    assert!(msg.contains("token service"), "{msg}");
    clean(&msg);
    kept(reason::CHART_AUTH_FAILED).await;
    ws.source_secret(
        "repo-auth",
        &[(".dockerconfigjson", &docker_config(REG_PASSWORD))],
    )
    .await;
    ws.ready("oci-west", "app").await;

    let cases = [
        ("9.9.9", reason::CHART_VERSION_NOT_FOUND, "no tag 9.9.9"),
        ("0.3.0", reason::CHART_DIGEST_MISMATCH, "sha256"),
        (
            "^5.0",
            reason::CHART_VERSION_NOT_FOUND,
            "no version matches",
        ),
    ];
    for (version, want, fragment) in cases {
        ws.bundle(
            "app",
            bundle("oci-west", &ns, oci_helm(&reg, version, Some("repo-auth"))),
        )
        .await;
        let msg = deployed_failure(&ws, "oci-west", "app", want, fragment).await;
        clean(&msg);
        kept(want).await;
    }

    // A registry that is not there.
    let mut gone = oci_helm(&reg, "0.1.0", Some("repo-auth"));
    gone["chart"] = json!("oci://127.0.0.1:9/charts/app");
    gone.as_object_mut().unwrap().remove("helmSecretName");
    ws.bundle("app", bundle("oci-west", &ns, gone)).await;
    let msg = deployed_reason(&ws, "oci-west", "app", reason::CHART_REPOSITORY_UNREACHABLE).await;
    clean(&msg);
    deployed_stays(&cms, "via-token", "retried", RETRIES).await;
    drop(agent);
}

/// An object the chart renders that somebody else already has is a conflict, and stays theirs
/// byte for byte across a conflict re-check (issue 22; two, on virtual time, in crates/agent/src/testing).
#[tokio::test]
async fn a_chart_object_somebody_else_has_is_never_clobbered() {
    let repo = repo().await;
    let ws = Workspace::new(shared_env(1).await, "helm-theirs").await;
    let agent = ws.helm_agent("theirs", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("helm-theirs");
    tender_e2e::fixture::create_namespace(&down, &ns).await;
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    let theirs = cms
        .create(
            &Default::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("web-extra".into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([("owner".into(), "someone-else".into())])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    ws.source_secret("app-values", &[("values.yaml", "greeting: hello\n")])
        .await;
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    ws.bundle(
        "app",
        bundle(
            "theirs",
            &ns,
            json!({"chart": "app", "repo": repo.url, "version": "0.1.0", "releaseName": "web",
                   "values": {"greeting": "hi"}, "helmSecretName": "repo-auth"}),
        ),
    )
    .await;
    eventually("web-extra reported as a conflict", WAIT, || async {
        let bd = ws.bds("theirs").get_opt("app").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| {
            bd.status.as_ref().is_some_and(|s| {
                s.resources.iter().any(|r| {
                    r.name == "web-extra" && r.state == tender_types::ObjectState::Conflict
                })
            })
        }))
    })
    .await;
    stays(
        "their web-extra",
        tender_e2e::fixture::CONFLICT_RECHECKS,
        &theirs.metadata.resource_version.clone(),
        || async {
            cms.get("web-extra")
                .await
                .unwrap()
                .metadata
                .resource_version
        },
    )
    .await;
    let now = cms.get("web-extra").await.unwrap();
    assert_eq!(now.data, theirs.data);
    assert_eq!(now.metadata.labels, theirs.metadata.labels);
    assert_eq!(now.metadata.annotations, theirs.metadata.annotations);
    drop(agent);
}
