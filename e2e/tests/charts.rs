//! The Helm charts render, lint, and every object they produce is accepted by a real
//! apiserver (server-side dry run, so schemas, RBAC and admission all apply).

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use tender_e2e::{HUB, crds::install_crds, downstream_name, ensure_helm, shared_env, unique_name};

fn chart(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/charts")
        .join(name)
}

fn helm(args: &[&str]) -> std::process::Output {
    let helm = ensure_helm().expect("building helm");
    Command::new(helm)
        .args(args)
        .output()
        .expect("running helm")
}

fn template(chart_name: &str, namespace: &str, set: &[&str]) -> Vec<DynamicObject> {
    let path = chart(chart_name);
    let mut args = vec!["template", "t", path.to_str().unwrap(), "-n", namespace];
    for s in set {
        args.extend(["--set", s]);
    }
    let out = helm(&args);
    assert!(
        out.status.success(),
        "helm template {chart_name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_multiple::<Option<DynamicObject>>(&text)
        .expect("helm output parses")
        .into_iter()
        .flatten()
        .collect()
}

async fn dry_run_apply(client: &kube::Client, namespace: &str, objects: &[DynamicObject]) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut pp = PatchParams::apply("tender-e2e").force();
    pp.dry_run = true;
    for obj in objects {
        let types = obj.types.as_ref().unwrap();
        let gvk = kube::api::GroupVersionKind::try_from(types).unwrap();
        let (ar, caps): (ApiResource, _) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("{} {} is not served", types.api_version, types.kind));
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or(namespace),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let name = obj.metadata.name.clone().unwrap();
        if let Err(e) = api.patch(&name, &pp, &Patch::Apply(obj)).await {
            panic!("{} {name} rejected by the apiserver: {e}", types.kind);
        }
    }
}

#[test]
fn charts_lint_clean() {
    for (name, set) in [
        ("tender-hub", vec![]),
        (
            "tender-agent",
            vec!["--set", "clusterName=east", "--set", "hubKubeconfig=x"],
        ),
    ] {
        let path = chart(name);
        let mut args = vec!["lint", "--strict", path.to_str().unwrap()];
        args.extend(set);
        let out = helm(&args);
        assert!(
            out.status.success(),
            "helm lint {name}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn agent_chart_refuses_missing_values_with_a_clear_message() {
    let path = chart("tender-agent");
    let out = helm(&["template", "t", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("clusterName is required"));
    let out = helm(&[
        "template",
        "t",
        path.to_str().unwrap(),
        "--set",
        "clusterName=east",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("hubKubeconfig"));
}

#[tokio::test]
async fn hub_chart_objects_are_accepted_by_the_hub_apiserver() {
    let env = shared_env(1).await;
    let client = env.client(HUB).await.unwrap();
    // The chart's crds/ directory is what `helm install` applies first.
    install_crds(&client).await.unwrap();
    let ns = unique_name("tender-system");
    let objects = template("tender-hub", &ns, &["workspaceNamespaces={tender-default}"]);
    let kinds: Vec<_> = objects
        .iter()
        .map(|o| o.types.as_ref().unwrap().kind.as_str())
        .collect();
    for want in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
    ] {
        assert!(kinds.contains(&want), "hub chart lacks a {want}: {kinds:?}");
    }
    let deployment = objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .unwrap();
    let env_vars = deployment.data["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env_vars.contains("EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM"));
    dry_run_apply(&client, &ns, &objects).await;
}

#[tokio::test]
async fn agent_chart_objects_are_accepted_by_a_downstream_apiserver() {
    let env = shared_env(1).await;
    let client = env.client(&downstream_name(1)).await.unwrap();
    let ns = unique_name("tender-system");
    let objects = template(
        "tender-agent",
        &ns,
        &["clusterName=east", "hubKubeconfig=apiVersion: v1"],
    );
    let kinds: Vec<_> = objects
        .iter()
        .map(|o| o.types.as_ref().unwrap().kind.as_str())
        .collect();
    assert!(kinds.contains(&"Secret") && kinds.contains(&"Deployment"));
    dry_run_apply(&client, &ns, &objects).await;
}
