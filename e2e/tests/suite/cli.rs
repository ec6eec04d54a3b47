//! The `tender` binary against a real hub: `cluster add` registers a Cluster and prints agent
//! install manifests that a real downstream apiserver accepts, with a hub kubeconfig that
//! carries exactly the agent's narrow identity; `status` shows the workspace; `cluster list`
//! shows the Cluster and `cluster remove` deletes it, revokes its agent and removes the agent's
//! objects downstream (not one that lost `cluster add`'s labels, never a namespace).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{HUB, client_from_yaml, downstream_name, eventually, shared_env, unique_name};
use tender_types::{BundleDeployment, Cluster, names};

/// The `tender` binary, built fresh once per test process (a binary left from an earlier
/// build would test old code).
fn tender_bin() -> PathBuf {
    tender_e2e::binaries::tender_binaries()
        .expect("building the tender binaries")
        .cli
        .clone()
}

async fn namespace(client: &kube::Client, name: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn cluster_add_registers_and_prints_working_agent_manifests() {
    let env = shared_env(1).await;
    let hub = env.client(HUB).await.unwrap();
    tender_e2e::crds::install_crds(&hub).await.unwrap();
    let ws = unique_name("cli");
    namespace(&hub, &ws).await;
    let _hub = start_hub(env, hub_config(&ws)).await.unwrap();
    let hub_kubeconfig = env.cluster(HUB).kubeconfig.clone();

    let out = tokio::task::spawn_blocking({
        let ws = ws.clone();
        let hub_kubeconfig = hub_kubeconfig.clone();
        move || {
            Command::new(tender_bin())
                .args(["cluster", "add", "east", "-n", &ws, "-l", "env=prod"])
                // This test's hub keeps its signing key Secret in the workspace.
                .args(["--hub-namespace", &ws])
                .arg("--hub-kubeconfig")
                .arg(&hub_kubeconfig)
                .args(["--image", "example.test/tender-agent:dev"])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "tender cluster add failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The Cluster exists with its labels, and the hub prepared its namespace.
    let cluster = Api::<Cluster>::namespaced(hub.clone(), &ws)
        .get("east")
        .await
        .unwrap();
    assert_eq!(cluster.metadata.labels.unwrap()["env"], "prod");
    let cluster_ns = names::cluster_namespace(&ws, "east");

    // The printed manifests: everything a downstream cluster needs, accepted by a real one.
    let manifests: Vec<DynamicObject> = serde_saphyr::from_multiple::<Option<DynamicObject>>(
        &String::from_utf8(out.stdout).unwrap(),
    )
    .unwrap()
    .into_iter()
    .flatten()
    .collect();
    let kinds: Vec<_> = manifests
        .iter()
        .map(|m| m.types.as_ref().unwrap().kind.clone())
        .collect();
    assert_eq!(kinds, tender_cli::cluster::AGENT_KINDS);
    let down = env.client(&downstream_name(1)).await.unwrap();
    let discovery = Discovery::new(down.clone()).run().await.unwrap();
    let pp = PatchParams::apply("tender-e2e").force();
    for m in &manifests {
        let gvk = kube::api::GroupVersionKind::try_from(m.types.as_ref().unwrap()).unwrap();
        let (ar, caps) = discovery.resolve_gvk(&gvk).unwrap();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                Api::namespaced_with(down.clone(), m.metadata.namespace.as_deref().unwrap(), &ar)
            }
            Scope::Cluster => Api::all_with(down.clone(), &ar),
        };
        let name = m.metadata.name.clone().unwrap();
        api.patch(&name, &pp, &Patch::Apply(m))
            .await
            .unwrap_or_else(|e| panic!("{gvk:?} {name} rejected downstream: {e}"));
    }

    // The hub kubeconfig in the agent's Secret is the agent's narrow identity: it reads its own
    // cluster namespace and nothing else.
    let secret: Secret = Api::namespaced(down.clone(), "tender-system")
        .get("tender-agent-hub")
        .await
        .unwrap();
    let kubeconfig = String::from_utf8(secret.data.unwrap()["kubeconfig"].0.clone()).unwrap();
    let agent = client_from_yaml(&kubeconfig).await.unwrap();
    Api::<BundleDeployment>::namespaced(agent.clone(), &cluster_ns)
        .list(&Default::default())
        .await
        .expect("the agent identity lists BundleDeployments in its cluster namespace");
    match Api::<Secret>::namespaced(agent.clone(), &ws)
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403),
        other => panic!("the agent identity must not read workspace Secrets: {other:?}"),
    }

    // `tender status` lists the Cluster with its hub namespace.
    let status = eventually(
        "`tender status` to show the cluster",
        Duration::from_secs(30),
        || {
            let ws = ws.clone();
            let hub_kubeconfig = hub_kubeconfig.clone();
            let cluster_ns = cluster_ns.clone();
            async move {
                let out = tokio::task::spawn_blocking(move || {
                    Command::new(tender_bin())
                        .args(["status", "-n", &ws])
                        .arg("--hub-kubeconfig")
                        .arg(&hub_kubeconfig)
                        .output()
                        .unwrap()
                })
                .await
                .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                Ok::<_, std::convert::Infallible>(
                    (out.status.success() && text.contains(&cluster_ns)).then_some(text),
                )
            }
        },
    )
    .await;
    assert!(status.contains("east"));

    // `tender cluster list`: the Cluster, pulled, its agent not connected (none runs here).
    let tender = |args: Vec<String>| async move {
        tokio::task::spawn_blocking(move || Command::new(tender_bin()).args(args).output().unwrap())
            .await
            .unwrap()
    };
    let hub_kc = hub_kubeconfig.display().to_string();
    let out = tender(
        [
            "cluster",
            "list",
            "-n",
            &ws,
            "-o",
            "json",
            "--hub-kubeconfig",
            &hub_kc,
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["name"], "east", "{rows}");
    assert_eq!(rows[0]["mode"], "Pull", "{rows}");
    assert_ne!(rows[0]["connected"], "True", "no agent runs: {rows}");
    assert_eq!(rows[0]["labels"], "env=prod", "{rows}");
    assert_eq!(rows[0]["namespace"], cluster_ns.as_str(), "{rows}");

    // `tender status BUNDLE` in waves: each cluster's wave, as the hub computes it.
    Api::<tender_types::Bundle>::namespaced(hub.clone(), &ws)
        .patch(
            "waved",
            &PatchParams::apply("e2e"),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
                "metadata": {"name": "waved"},
                "spec": {
                    "targets": [{"clusterName": "east"}],
                    "rolloutStrategy": {"partitions": [{"name": "canary", "clusterName": "east"}]},
                    "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "waved"}, "data": {"k": "v"}}],
                },
            })),
        )
        .await
        .unwrap();
    let report = eventually(
        "`tender status waved` to show east's wave",
        Duration::from_secs(30),
        || {
            let args = [
                "status",
                "waved",
                "-n",
                &ws,
                "-o",
                "json",
                "--hub-kubeconfig",
                &hub_kc,
            ]
            .map(String::from)
            .to_vec();
            async move {
                let out = tender(args).await;
                let report: serde_json::Value =
                    serde_json::from_slice(&out.stdout).unwrap_or_default();
                Ok::<_, std::convert::Infallible>(
                    (report["clusters"][0]["cluster"] == "east").then_some(report),
                )
            }
        },
    )
    .await;
    assert_eq!(report["clusters"][0]["wave"], "canary", "{report}");

    // `tender cluster remove`: gone from the hub, the agent's hub token revoked, the agent's
    // objects deleted downstream — except one that lost `cluster add`'s labels (someone else's
    // now) — and no namespace deleted.
    let crs = kube::discovery::pinned_kind(
        &down,
        &kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
    )
    .await
    .unwrap()
    .0;
    let cluster_roles = Api::<DynamicObject>::all_with(down.clone(), &crs);
    cluster_roles
        .patch(
            "tender-bundles-tender-system",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": null}})),
        )
        .await
        .unwrap();
    let down_kc = env
        .cluster(&downstream_name(1))
        .kubeconfig
        .display()
        .to_string();
    let out = tender(
        [
            "cluster",
            "remove",
            "east",
            "-n",
            &ws,
            "-o",
            "json",
            "--hub-kubeconfig",
            &hub_kc,
            "--downstream-kubeconfig",
            &down_kc,
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["removedFromHub"], true, "{report}");
    assert_eq!(report["agentRevoked"], true, "{report}");
    let deleted = report["deletedDownstream"].to_string();
    for d in [
        "Deployment tender-system/tender-agent",
        "Secret tender-system/tender-agent-hub",
        "ClusterRoleBinding tender-agent",
        "RoleBinding default/tender-bundles-tender-system",
    ] {
        assert!(deleted.contains(d), "{d} not deleted: {report}");
    }
    assert_eq!(
        report["leftDownstream"],
        serde_json::json!(["ClusterRole tender-bundles-tender-system"]),
        "{report}"
    );
    assert!(
        Api::<Cluster>::namespaced(hub.clone(), &ws)
            .get_opt("east")
            .await
            .unwrap()
            .is_none()
    );
    match Api::<BundleDeployment>::namespaced(agent.clone(), &cluster_ns)
        .list(&Default::default())
        .await
    {
        // 401 once the apiserver's ServiceAccount cache has seen the deletion, 403 before
        // (its namespace, with every binding, is gone).
        Err(kube::Error::Api(s)) => assert!([401, 403].contains(&s.code), "{s:?}"),
        other => panic!("the removed agent's token still works: {other:?}"),
    }
    let namespaces = Api::<Namespace>::all(down.clone());
    assert!(namespaces.get_opt("tender-system").await.unwrap().is_some());
    assert!(namespaces.get_opt("default").await.unwrap().is_some());
    assert!(
        cluster_roles
            .get_opt("tender-bundles-tender-system")
            .await
            .unwrap()
            .is_some(),
        "an object without cluster add's labels is left"
    );
    cluster_roles
        .delete("tender-bundles-tender-system", &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn cluster_add_rejects_a_bad_name_before_touching_the_hub() {
    let env = shared_env(1).await;
    // A hub nobody answers at: the message can only come from the CLI's own check (the
    // apiserver's CEL rule says the same words).
    let kc = env
        .state_dir()
        .join(format!("{}.kubeconfig", unique_name("unreachable")));
    let closed = tender_e2e::free_port().unwrap();
    std::fs::write(
        &kc,
        tender_e2e::kubeconfig_yaml(
            HUB,
            &format!("https://127.0.0.1:{closed}"),
            env.ca_pem(),
            "nobody",
            "no-token",
        ),
    )
    .unwrap();
    let out = tokio::task::spawn_blocking({
        move || {
            Command::new(tender_bin())
                .args(["cluster", "add", "Not_A_Label", "-n", "tender-default"])
                .arg("--hub-kubeconfig")
                .arg(kc)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("must be a DNS label"), "{stderr}");
    assert!(
        !stderr.contains("onnect"),
        "the CLI tried the hub first: {stderr}"
    );
}

/// `tender cluster add --local`: the hub as its own downstream in one command. The agent's
/// manifests are applied to the hub itself, and its kubeconfig reaches the hub in-cluster with
/// the agent's narrow identity.
#[tokio::test]
async fn cluster_add_local_installs_the_agent_on_the_hub_itself() {
    let env = shared_env(1).await;
    let hub = env.client(HUB).await.unwrap();
    tender_e2e::crds::install_crds(&hub).await.unwrap();
    let ws = unique_name("cli-local");
    namespace(&hub, &ws).await;
    let _hub = start_hub(env, hub_config(&ws)).await.unwrap();
    let hub_kubeconfig = env.cluster(HUB).kubeconfig.clone();
    let agent_ns = unique_name("tender-local");

    let out = tokio::task::spawn_blocking({
        let (ws, agent_ns) = (ws.clone(), agent_ns.clone());
        move || {
            Command::new(tender_bin())
                .args(["cluster", "add", "local", "-n", &ws, "--local"])
                .args(["--hub-namespace", &ws])
                .args(["--agent-namespace", &agent_ns])
                .arg("--hub-kubeconfig")
                .arg(&hub_kubeconfig)
                .args(["--image", "example.test/tender-agent:dev"])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tender cluster add --local failed:\n{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing to pipe anywhere: it was applied"
    );
    assert!(stderr.contains("applied Deployment"), "{stderr}");

    // Installed on the hub: the agent's Deployment and its hub kubeconfig.
    let deployments = kube::discovery::pinned_kind(
        &hub,
        &kube::api::GroupVersionKind::gvk("apps", "v1", "Deployment"),
    )
    .await
    .unwrap()
    .0;
    Api::<DynamicObject>::namespaced_with(hub.clone(), &agent_ns, &deployments)
        .get("tender-agent")
        .await
        .expect("the agent's Deployment on the hub");
    let secret: Secret = Api::namespaced(hub.clone(), &agent_ns)
        .get("tender-agent-hub")
        .await
        .unwrap();
    let kubeconfig = String::from_utf8(secret.data.unwrap()["kubeconfig"].0.clone()).unwrap();
    let parsed = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    assert_eq!(
        parsed.clusters[0]
            .cluster
            .as_ref()
            .unwrap()
            .server
            .as_deref(),
        Some(tender_cli::cluster::IN_CLUSTER_SERVER),
        "in-cluster address of the hub"
    );
    let cluster_ns = names::cluster_namespace(&ws, "local");
    assert_eq!(
        parsed.contexts[0]
            .context
            .as_ref()
            .unwrap()
            .namespace
            .as_deref(),
        Some(cluster_ns.as_str())
    );
    // The identity in it is the agent's: through the test's route to the same apiserver it
    // reads its cluster namespace and not the workspace.
    let reachable = kubeconfig.replace(
        tender_cli::cluster::IN_CLUSTER_SERVER,
        env.cluster(HUB).server.as_str(),
    );
    let agent = client_from_yaml(&reachable).await.unwrap();
    Api::<BundleDeployment>::namespaced(agent.clone(), &cluster_ns)
        .list(&Default::default())
        .await
        .expect("the agent reads its own cluster namespace");
    let denied = Api::<Secret>::namespaced(agent, &ws)
        .list(&Default::default())
        .await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(s)) if s.code == 403),
        "the agent's identity cannot read the workspace: {denied:?}"
    );
}
