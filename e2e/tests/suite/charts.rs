//! The Helm charts render, lint, and every object they produce is accepted by a real
//! apiserver (server-side dry run, so schemas, RBAC and admission all apply).

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use tender_e2e::{
    HUB, crds::install_crds, downstream_name, ensure_helm, shared_env_of, unique_name,
};

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
    let env = shared_env_of("charts", 1).await;
    let client = env.client(HUB).await.unwrap();
    // The chart's crds/ directory is what `helm install` applies first.
    install_crds(&client).await.unwrap();
    let ns = unique_name("tender-system");
    let objects = template(
        "tender-hub",
        &ns,
        &["workspaceNamespaces={tender-default}", "shards[0].id=eu"],
    );
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
    // `shards`: one more Deployment per shard id (decision 0062-hub-shards).
    let deployments: Vec<_> = objects
        .iter()
        .filter(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .map(|o| o.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(deployments, ["tender-hub", "tender-hub-shard-eu"]);
    dry_run_apply(&client, &ns, &objects).await;
}

#[tokio::test]
async fn agent_chart_objects_are_accepted_by_a_downstream_apiserver() {
    let env = shared_env_of("charts", 1).await;
    let client = env.client(&downstream_name(1)).await.unwrap();
    let ns = unique_name("tender-system");
    let objects = template(
        "tender-agent",
        &ns,
        &[
            "clusterName=east",
            "hubKubeconfig=apiVersion: v1",
            "chartCache.sizeLimit=64Mi",
        ],
    );
    let kinds: Vec<_> = objects
        .iter()
        .map(|o| o.types.as_ref().unwrap().kind.as_str())
        .collect();
    assert!(kinds.contains(&"Secret") && kinds.contains(&"Deployment"));
    // chartCache.sizeLimit: the chart cache's emptyDir (a kubelet limit, not a flag).
    let deployment = objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .unwrap();
    let volumes = deployment.data["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains(r#"{"emptyDir":{"sizeLimit":"64Mi"},"name":"chart-cache"}"#),
        "{volumes}"
    );
    dry_run_apply(&client, &ns, &objects).await;
}

/// Whether `rule` of a ClusterRole covers `(group, resource, verb, name)`, RBAC's way:
/// `resourceNames` empty means every name.
fn covers(
    rule: &serde_json::Value,
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let has = |field: &str, want: &str| {
        rule[field]
            .as_array()
            .is_some_and(|xs| xs.iter().any(|x| x == want || x == "*"))
    };
    let names_ok = match rule["resourceNames"].as_array() {
        None => true,
        Some(names) if names.is_empty() => true,
        Some(names) => name.is_some_and(|n| names.iter().any(|x| x == n)),
    };
    has("apiGroups", group) && has("resources", resource) && has("verbs", verb) && names_ok
}

/// The hub creates the agents' Roles without `escalate` or `bind`, so its ClusterRole must
/// hold every permission in them (the apiserver would refuse the Role otherwise), and nothing
/// lets it write arbitrary RBAC.
#[test]
fn hub_chart_rbac_has_no_escalate_or_bind_and_holds_every_agent_permission() {
    let objects = template("tender-hub", "tender-system", &[]);
    let role = objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "ClusterRole")
        .expect("a ClusterRole");
    let rules = role.data["rules"].as_array().unwrap();
    for rule in rules {
        for verb in rule["verbs"].as_array().unwrap() {
            assert!(
                !["escalate", "bind", "impersonate", "*"].contains(&verb.as_str().unwrap()),
                "the hub must not hold {verb}: {rule}"
            );
        }
    }
    let access = tender_hub::cluster::agent_access("ws", "east");
    let (upstream, _) = tender_hub::cluster::upstream_access(
        "ns",
        "app",
        &["s".into()],
        &["c".into()],
        &Default::default(),
    )
    .unwrap();
    for agent_rule in [access.role, access.workspace_role, upstream]
        .into_iter()
        .flat_map(|r| r.rules.unwrap_or_default())
    {
        let names: Vec<Option<&str>> = match agent_rule.resource_names.as_deref() {
            Some(ns) if !ns.is_empty() => ns.iter().map(|n| Some(n.as_str())).collect(),
            _ => vec![None],
        };
        for group in agent_rule.api_groups.iter().flatten() {
            for resource in agent_rule.resources.iter().flatten() {
                for verb in &agent_rule.verbs {
                    for name in &names {
                        assert!(
                            rules
                                .iter()
                                .any(|r| covers(r, group, resource, verb, *name)),
                            "the hub's ClusterRole lacks {verb} {group}/{resource} {name:?}, which it grants agents"
                        );
                    }
                }
            }
        }
    }
}

/// The shipped agent chart runs a Helm Bundle under its pod's securityContext: the real
/// `tender-agent` from the chart's rendered Deployment, under bubblewrap with a read-only root,
/// the non-root uid and only the chart's volumes ([`tender_e2e::local_pod`]), fetches, caches
/// and renders a chart from the loopback repository. The chart cache must be one of those
/// volumes (`/tmp` is read-only there).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_chart_renders_a_helm_bundle_under_its_pods_security_context() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;
    use tender_e2e::charts::ChartRepo;
    use tender_e2e::fixture::Workspace;
    use tender_e2e::running::{AgentOpts, start_agent};

    let env = shared_env_of("charts", 1).await;
    let repo = ChartRepo::start(&["0.1.0"], "reader", "repo-pass-456")
        .await
        .expect("starting the chart repository");
    let ws = Workspace::new(env, "chart-sandbox").await;
    ws.cluster("east").await;
    let helm = ensure_helm().expect("building helm");
    let release_ns = unique_name("tender-system");
    let _agent = start_agent(
        &ws,
        "east",
        &downstream_name(1),
        AgentOpts {
            release_ns: Some(&release_ns),
            flags: &[("--helm-path", helm.to_str().unwrap())],
            // The Bundle lands in a namespace of its own, which the chart's default Bundle
            // ServiceAccount may not create (least_privilege.rs): the pod's sandbox is the
            // subject here, not RBAC.
            sets: &["bundleServiceAccount.clusterAdmin=true"],
            ..Default::default()
        },
    )
    .await;
    ws.source_secret(
        "repo-auth",
        &[("username", "reader"), ("password", "repo-pass-456")],
    )
    .await;
    let app_ns = unique_name("chart-sandbox-app");
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "downstreamResources": [{"kind": "Secret", "name": "repo-auth"}],
            "helm": {"chart": "app", "repo": repo.url, "version": "0.1.0",
                     "releaseName": "web", "helmSecretName": "repo-auth",
                     "values": {"greeting": "sandboxed"}},
        }),
    )
    .await;
    // Ready, or the Deployed message that says why not.
    let bds = ws.bds("east");
    let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let ready = tender_e2e::within(tender_e2e::fixture::WAIT, || {
        let (bds, last) = (bds.clone(), last.clone());
        async move {
            let Ok(bd) = bds.get("app").await else {
                return false;
            };
            let status = bd.status.unwrap_or_default();
            *last.lock().unwrap() = serde_json::to_string(&status.conditions).unwrap_or_default();
            status.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                && tender_types::conditions::is_true(&status.conditions, "Ready")
        }
    })
    .await;
    assert!(
        ready,
        "the Helm Bundle is not Ready: {}",
        last.lock().unwrap()
    );
    let down = env.client(&downstream_name(1)).await.unwrap();
    let cm = Api::<ConfigMap>::namespaced(down, &app_ns)
        .get("web-config")
        .await
        .unwrap();
    assert_eq!(
        cm.data
            .unwrap_or_default()
            .get("greeting")
            .map(String::as_str),
        Some("sandboxed")
    );
}
