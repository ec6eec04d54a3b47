//! Helm charts on a real downstream cluster: a tiny chart packaged with the pinned Helm CLI,
//! served by a loopback chart repository with basic auth; values from a copied Secret,
//! rotation, drift, upgrade by version with pruning, removal, and every failure reason with
//! what is deployed kept in place.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tender_e2e::charts::ChartRepo;
use tender_e2e::fixture::{Agent, Workspace};
use tender_e2e::{downstream_name, ensure_helm, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_DEPLOYED, find_condition, reason};

const WAIT: std::time::Duration = tender_e2e::fixture::WAIT;
const USER: &str = "chart-reader";
const PASSWORD: &str = "repo-pass-123";

async fn repo() -> ChartRepo {
    ChartRepo::start(&["0.1.0", "0.2.0"], USER, PASSWORD)
        .await
        .expect("starting the chart repository")
}

async fn helm_agent(ws: &Workspace, cluster: &str) -> Agent {
    let helm: PathBuf = ensure_helm().expect("building helm");
    let cache = std::env::temp_dir().join(unique_name("tender-chart-cache"));
    ws.agent_configured(cluster, &downstream_name(1), |c| {
        c.helm_path = helm;
        c.chart_cache_dir = cache;
    })
    .await
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
async fn deployed_reason(ws: &Workspace, cluster: &str, bundle: &str, want: &str) -> String {
    let api = ws.bds(cluster);
    eventually(&format!("Deployed reason {want}"), WAIT, || async {
        let bd = api.get_opt(bundle).await?;
        Ok::<_, kube::Error>(bd.and_then(|bd| {
            let s = bd.status?;
            find_condition(&s.conditions, TYPE_DEPLOYED)
                .filter(|c| c.reason == want)
                .map(|c| c.message.clone())
        }))
    })
    .await
}

#[tokio::test]
async fn chart_values_from_a_copied_secret_rotate_drift_upgrade_and_removal() {
    let repo = repo().await;
    let ws = Workspace::new(shared_env(1).await, "helm").await;
    let agent = helm_agent(&ws, "east").await;
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
    assert!(
        cms.get_opt("web-hook").await.unwrap().is_none(),
        "hooks are skipped"
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
    let agent = helm_agent(&ws, "west").await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("helm-fail");
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    ws.source_secret("app-values", &[("values.yaml", "greeting: hi\n")])
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
        assert_eq!(
            config_value(&cms, "web-config", "greeting")
                .await
                .as_deref(),
            Some("hi"),
            "{want}: the deployed chart objects stay"
        );
        assert!(cms.get_opt("web-extra").await.unwrap().is_some(), "{want}");
    }
    drop(agent);
}
