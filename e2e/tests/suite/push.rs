//! Push mode end to end: Clusters with `spec.kubeconfigSecretRef` served by the hub itself —
//! no agent process — on real downstream apiservers, with restricted identities.
//!
//! Each test has its own workspace and its own hub (probing push clusters every second).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tender_e2e::fixture::{self, WAIT, Workspace, secret_value, stays, wait_secret};
use tender_e2e::hub_harness::{HubHandle, hub_config, start_hub};
use tender_e2e::proxy::TcpProxy;
use tender_e2e::{ADMIN_USER, TestEnv, downstream_name, eventually, shared_env_of, unique_name};
use tender_types::conditions::{TYPE_CLUSTER_CONNECTED, TYPE_READY, find_condition};
use tender_types::{Cluster, ClusterMode, labels, names};

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A workspace with its own hub, probing push clusters every second.
async fn push_workspace(prefix: &str) -> (Workspace, HubHandle) {
    let env = shared_env_of("push-rights", 2).await;
    let ws = Workspace::without_hub(env, prefix).await;
    let mut config = hub_config(&ws.ns);
    config.push.probe_interval = Duration::from_secs(1);
    config.push.probe_timeout = Duration::from_secs(2);
    config.push.heartbeat_interval = Duration::from_secs(2);
    let hub = start_hub(env, config).await.unwrap();
    (ws, hub)
}

/// Grants `user` on `cluster` exactly the rights docs/push-mode.md lists for this Bundle
/// (namespaces, Secrets and ConfigMaps); returns the ClusterRoleBinding's name.
async fn grant_push_rights(env: &TestEnv, cluster: &str, user: &str) -> String {
    let admin = env.client(cluster).await.unwrap();
    let name = unique_name(&format!("tender-push-{user}"));
    let rule = |resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(resources.iter().map(ToString::to_string).collect()),
        verbs: verbs.iter().map(ToString::to_string).collect(),
        ..Default::default()
    };
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(&["namespaces"], &["get", "list", "watch", "create"]),
            rule(
                &["secrets", "configmaps"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
        ]),
        ..Default::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    name
}

async fn revoke(env: &TestEnv, cluster: &str, binding: &str) {
    let admin = env.client(cluster).await.unwrap();
    Api::<ClusterRoleBinding>::all(admin)
        .delete(binding, &DeleteParams::default())
        .await
        .unwrap();
}

/// Creates or replaces kubeconfig Secret `name` in the workspace (key `value`).
async fn kubeconfig_secret(ws: &Workspace, name: &str, kubeconfig: &str) {
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            "value".to_string(),
            kubeconfig.to_string(),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&s))
        .await
        .unwrap();
}

/// Creates push Cluster `name` reading its kubeconfig from Secret `secret`, and waits for its
/// namespace.
async fn push_cluster(ws: &Workspace, name: &str, secret: &str) {
    ws.cluster_with_spec(name, json!({"kubeconfigSecretRef": {"name": secret}}))
        .await;
}

/// Waits until Cluster `name`'s `ClusterConnected` condition has `reason`; returns its message.
async fn connection(ws: &Workspace, name: &str, reason: &str) -> String {
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually(
        &format!("Cluster {name} ClusterConnected={reason}"),
        WAIT,
        || async {
            let c = clusters.get(name).await?;
            Ok::<_, kube::Error>(c.status.and_then(|s| {
                find_condition(&s.conditions, TYPE_CLUSTER_CONNECTED)
                    .filter(|c| c.reason == reason)
                    .map(|c| c.message.clone())
            }))
        },
    )
    .await
}

fn app_bundle(clusters: &[&str], target_ns: &str, keep: bool) -> serde_json::Value {
    let mut spec = fixture::app_bundle(clusters, target_ns);
    spec["keepResources"] = json!(keep);
    spec
}

async fn password_is(down: &kube::Client, ns: &str, value: &str, what: &str) {
    wait_secret(down, ns, "db-creds", what, |s| {
        secret_value(s, "password").as_deref() == Some(value)
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The scenarios.

#[tokio::test]
async fn push_cluster_deploys_rotates_corrects_drift_and_cleans_up_with_a_restricted_identity() {
    let capture = fixture::capture_logs();
    let (ws, hub) = push_workspace("push-flow").await;
    let env = ws.env;
    let downstream = downstream_name(2);
    let down = ws.downstream(&downstream).await;

    // carol has no rights downstream: her identity is refused.
    kubeconfig_secret(
        &ws,
        "edge-kubeconfig",
        &env.kubeconfig_as(&downstream, "carol"),
    )
    .await;
    push_cluster(&ws, "edge", "edge-kubeconfig").await;
    connection(&ws, "edge", "KubeconfigRefused").await;

    // Rotated to alice, who has the documented rights: picked up without restart.
    let alice = grant_push_rights(env, &downstream, "alice").await;
    kubeconfig_secret(
        &ws,
        "edge-kubeconfig",
        &env.kubeconfig_as(&downstream, "alice"),
    )
    .await;
    connection(&ws, "edge", "ClusterConnected").await;

    let cluster = Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .get("edge")
        .await
        .unwrap();
    assert_eq!(
        cluster.status.as_ref().unwrap().mode,
        Some(ClusterMode::Push)
    );
    // No pull agent can act for a push cluster: its RoleBindings are not provisioned.
    let bindings = Api::<RoleBinding>::namespaced(ws.hub.clone(), &ws.cluster_ns("edge"));
    assert!(bindings.get_opt(names::AGENT_ROLE).await.unwrap().is_none());
    let ws_bindings = Api::<RoleBinding>::namespaced(ws.hub.clone(), &ws.ns);
    assert!(
        ws_bindings
            .get_opt(&names::agent_workspace_role("edge"))
            .await
            .unwrap()
            .is_none()
    );

    // Copies, then manifests.
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("apps");
    let kept_ns = unique_name("kept");
    ws.bundle("app", app_bundle(&["edge"], &target, false))
        .await;
    ws.bundle("kept", app_bundle(&["edge"], &kept_ns, true))
        .await;
    ws.ready("edge", "app").await;
    ws.ready("edge", "kept").await;
    password_is(&down, &target, "one", "the copy at edge").await;
    let settings = Api::<ConfigMap>::namespaced(down.clone(), &target);
    assert!(
        settings.get_opt("app-settings").await.unwrap().is_some(),
        "the manifest is applied"
    );

    // A rotated source arrives.
    ws.source_secret("db-creds", &[("password", "two")]).await;
    password_is(&down, &target, "two", "the rotation at edge").await;

    // Drift: a deleted copy comes back.
    Api::<Secret>::namespaced(down.clone(), &target)
        .delete("db-creds", &DeleteParams::default())
        .await
        .unwrap();
    password_is(&down, &target, "two", "the deleted copy restored").await;

    // The kubeconfig rotated from alice to bob, alice's rights revoked: the next source
    // rotation can only arrive with bob's identity.
    let bob = grant_push_rights(env, &downstream, "bob").await;
    kubeconfig_secret(
        &ws,
        "edge-kubeconfig",
        &env.kubeconfig_as(&downstream, "bob"),
    )
    .await;
    revoke(env, &downstream, &alice).await;
    ws.source_secret("db-creds", &[("password", "three")]).await;
    password_is(
        &down,
        &target,
        "three",
        "the rotation after the credential rotation",
    )
    .await;
    connection(&ws, "edge", "ClusterConnected").await;

    // Deleting the Bundles: `app`'s objects go, `kept`'s stay without tender's metadata.
    ws.delete_bundle("app").await;
    ws.delete_bundle("kept").await;
    let bds = ws.bds("edge");
    eventually("both BundleDeployments cleaned up", WAIT, || async {
        Ok::<_, kube::Error>(
            bds.list(&Default::default())
                .await?
                .items
                .is_empty()
                .then_some(()),
        )
    })
    .await;
    let copies = Api::<Secret>::namespaced(down.clone(), &target);
    eventually("app's copy removed downstream", WAIT, || async {
        Ok::<_, kube::Error>(copies.get_opt("db-creds").await?.is_none().then_some(()))
    })
    .await;
    let kept = Api::<Secret>::namespaced(down.clone(), &kept_ns)
        .get("db-creds")
        .await
        .unwrap();
    assert!(
        !kept
            .metadata
            .labels
            .iter()
            .flatten()
            .any(|(k, _)| labels::is_tender_key(k)),
        "a kept copy carries no tender labels: {:?}",
        kept.metadata.labels
    );

    // Nothing of the kubeconfigs' credentials is visible to operators.
    let mut seen = serde_json::to_string(
        &Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items,
    )
    .unwrap();
    for e in Api::<k8s_openapi::api::events::v1::Event>::namespaced(ws.hub.clone(), &ws.ns)
        .list(&Default::default())
        .await
        .unwrap()
    {
        seen += &serde_json::to_string(&e).unwrap();
    }
    seen += &hub.metrics.encode();
    let logs = capture.text();
    assert!(
        logs.contains("push task started"),
        "the log capture holds the hub's push log lines"
    );
    seen += &logs;
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(env.ca_pem());
    for user in ["alice", "bob", "carol"] {
        assert!(!seen.contains(env.token(user)), "{user}'s token leaked");
    }
    assert!(
        !seen.contains(&ca) && !seen.contains(env.ca_pem().trim()),
        "CA data leaked"
    );
    assert!(
        seen.contains("ClusterConnected"),
        "the search covers the Cluster status"
    );
    revoke(env, &downstream, &bob).await;
    drop(hub);
}

#[tokio::test]
async fn missing_invalid_and_exec_kubeconfigs_are_conditions_and_modes_switch() {
    let (ws, _hub) = push_workspace("push-modes").await;
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let bindings = Api::<RoleBinding>::namespaced(ws.hub.clone(), &ws.cluster_ns("flip"));

    // A pull cluster: its agent's RoleBinding is provisioned.
    ws.cluster("flip").await;
    eventually("the pull agent's RoleBinding", WAIT, || async {
        Ok::<_, kube::Error>(bindings.get_opt(names::AGENT_ROLE).await?.map(|_| ()))
    })
    .await;

    // Switched to push, its Secret missing.
    let to_push = json!({"spec": {"kubeconfigSecretRef": {"name": "flip-kubeconfig"}}});
    clusters
        .patch("flip", &PatchParams::default(), &Patch::Merge(&to_push))
        .await
        .unwrap();
    let message = connection(&ws, "flip", "KubeconfigMissing").await;
    assert!(message.contains("flip-kubeconfig"), "{message}");
    eventually("the pull agent's RoleBinding removed", WAIT, || async {
        Ok::<_, kube::Error>(
            bindings
                .get_opt(names::AGENT_ROLE)
                .await?
                .is_none()
                .then_some(()),
        )
    })
    .await;
    let c = clusters.get("flip").await.unwrap();
    assert_eq!(c.status.as_ref().unwrap().mode, Some(ClusterMode::Push));
    let ready = find_condition(&c.status.as_ref().unwrap().conditions, TYPE_READY).unwrap();
    assert_eq!(ready.reason, "KubeconfigMissing");

    // Not a kubeconfig.
    let secret_text = format!("token: {}\n  : [", unique_name("not-a-kubeconfig"));
    kubeconfig_secret(&ws, "flip-kubeconfig", &secret_text).await;
    let message = connection(&ws, "flip", "KubeconfigInvalid").await;
    assert!(
        !message.contains("not-a-kubeconfig"),
        "the content is never quoted: {message}"
    );

    // An exec plugin, refused by default.
    let exec = ws
        .env
        .kubeconfig_as(&downstream_name(1), ADMIN_USER)
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/true\n      interactiveMode: Never".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        exec.contains("command: /bin/true"),
        "the exec kubeconfig is built:\n{exec}"
    );
    kubeconfig_secret(&ws, "flip-kubeconfig", &exec).await;
    let message = connection(&ws, "flip", "KubeconfigExecNotAllowed").await;
    assert!(message.contains("--allow-kubeconfig-exec"), "{message}");

    // Back to pull: the binding returns, the push condition goes.
    let to_pull = json!({"spec": {"kubeconfigSecretRef": null}});
    clusters
        .patch("flip", &PatchParams::default(), &Patch::Merge(&to_pull))
        .await
        .unwrap();
    eventually("the pull agent's RoleBinding back", WAIT, || async {
        Ok::<_, kube::Error>(bindings.get_opt(names::AGENT_ROLE).await?.map(|_| ()))
    })
    .await;
    eventually("Cluster flip in pull mode", WAIT, || async {
        let c = clusters.get("flip").await?;
        Ok::<_, kube::Error>(c.status.filter(|s| {
            s.mode == Some(ClusterMode::Pull)
                && find_condition(&s.conditions, TYPE_CLUSTER_CONNECTED).is_none()
        }))
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_cluster_is_reported_keeps_everything_and_resumes() {
    let (ws, _hub) = push_workspace("push-outage").await;
    let downstream = downstream_name(1);
    let server = ws.env.cluster(&downstream).server.clone();
    let proxy = TcpProxy::for_server(&server).await.unwrap();
    let kubeconfig =
        proxy.rewrite_kubeconfig(&ws.env.kubeconfig_as(&downstream, ADMIN_USER), &server);
    kubeconfig_secret(&ws, "far-kubeconfig", &kubeconfig).await;
    push_cluster(&ws, "far", "far-kubeconfig").await;
    connection(&ws, "far", "ClusterConnected").await;

    ws.source_secret("db-creds", &[("password", "before")])
        .await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("apps");
    ws.bundle("app", app_bundle(&["far"], &target, false)).await;
    ws.ready("far", "app").await;
    let down = ws.downstream(&downstream).await;
    password_is(&down, &target, "before", "the copy at far").await;

    proxy.cut();
    let message = connection(&ws, "far", "ClusterUnreachable").await;
    assert!(!message.contains(ws.env.token(ADMIN_USER)), "{message}");
    // During the outage a rotation cannot arrive, and nothing is deleted anywhere.
    ws.source_secret("db-creds", &[("password", "during")])
        .await;
    let copies = Api::<Secret>::namespaced(down.clone(), &target);
    let settings = Api::<ConfigMap>::namespaced(down.clone(), &target);
    let bds = ws.bds("far");
    stays(
        "downstream objects and the BundleDeployment during the outage",
        Duration::from_secs(4),
        &(true, true, true, Some("before".to_string())),
        || async {
            let copy = copies.get_opt("db-creds").await.unwrap();
            (
                settings.get_opt("app-settings").await.unwrap().is_some(),
                bds.get_opt("app").await.unwrap().is_some(),
                copy.is_some(),
                copy.and_then(|s| secret_value(&s, "password")),
            )
        },
    )
    .await;

    proxy.restore();
    connection(&ws, "far", "ClusterConnected").await;
    password_is(&down, &target, "during", "the rotation after the outage").await;
    ws.ready("far", "app").await;
}

#[tokio::test]
async fn a_hung_cluster_does_not_slow_another() {
    let (ws, _hub) = push_workspace("push-hung").await;
    // A listener that accepts connections and never answers (not even the TLS handshake).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_addr = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let downstream = downstream_name(1);
    let server = ws.env.cluster(&downstream).server.clone();
    let admin = ws.env.kubeconfig_as(&downstream, ADMIN_USER);
    let hung = admin.replace(
        &format!("server: {server}"),
        &format!("server: https://{hung_addr}"),
    );
    assert_ne!(hung, admin, "the hung kubeconfig points elsewhere");
    kubeconfig_secret(&ws, "hung-kubeconfig", &hung).await;
    kubeconfig_secret(&ws, "quick-kubeconfig", &admin).await;
    push_cluster(&ws, "hung", "hung-kubeconfig").await;
    push_cluster(&ws, "quick", "quick-kubeconfig").await;
    connection(&ws, "hung", "ClusterUnreachable").await;
    connection(&ws, "quick", "ClusterConnected").await;

    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("apps");
    ws.bundle("app", app_bundle(&["hung", "quick"], &target, false))
        .await;
    ws.ready("quick", "app").await;
    let down = ws.downstream(&downstream).await;
    password_is(&down, &target, "one", "the copy at quick").await;

    let started = Instant::now();
    ws.source_secret("db-creds", &[("password", "two")]).await;
    password_is(&down, &target, "two", "the rotation at quick").await;
    let took = started.elapsed();
    println!("rotation reached the quick push cluster in {took:?} beside a hung one");
    assert!(
        took < Duration::from_secs(10),
        "a hung cluster slowed another push cluster's rotation: {took:?}"
    );
    connection(&ws, "hung", "ClusterUnreachable").await;
    holder.abort();
}

/// Resident memory of this process in bytes (Linux).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Rough scale figure for docs/benchmarks.md: N push Clusters (`TENDER_PUSH_SCALE`, default
/// 50), all reaching downstream-1, connected and idle; tasks and memory per push cluster.
/// Run alone: `cargo test -p tender-e2e --test push -- --ignored --nocapture push_scale`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check; run alone"]
async fn push_scale() {
    let n: usize = std::env::var("TENDER_PUSH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let env = shared_env_of("push-rights", 2).await;
    let ws = Workspace::without_hub(env, "push-scale").await;
    let mut config = hub_config(&ws.ns);
    config.push.heartbeat_interval = Duration::from_secs(30);
    let _hub = start_hub(env, config).await.unwrap();
    let downstream = downstream_name(1);
    kubeconfig_secret(
        &ws,
        "scale-kubeconfig",
        &env.kubeconfig_as(&downstream, ADMIN_USER),
    )
    .await;
    let runtime = tokio::runtime::Handle::current().metrics();
    // Measure from a hub at rest: its task count has stopped moving.
    let tasks0 = fixture::settled("the idle hub's tasks", Duration::from_secs(2), || async {
        runtime.num_alive_tasks()
    })
    .await;
    let rss0 = rss_bytes();

    let started = Instant::now();
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    for i in 0..n {
        let cluster: Cluster = serde_json::from_value(json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": format!("c{i:04}")},
            "spec": {"kubeconfigSecretRef": {"name": "scale-kubeconfig"}}
        }))
        .unwrap();
        clusters
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap();
    }
    eventually(
        &format!("{n} push clusters connected and heartbeating"),
        Duration::from_secs(600),
        || async {
            let list = clusters.list(&Default::default()).await?;
            let up = list
                .items
                .iter()
                .filter(|c| {
                    c.status.as_ref().is_some_and(|s| {
                        tender_types::conditions::is_true(&s.conditions, TYPE_CLUSTER_CONNECTED)
                            && tender_types::conditions::is_true(&s.conditions, "AgentConnected")
                    })
                })
                .count();
            Ok::<_, kube::Error>((up == n).then_some(()))
        },
    )
    .await;
    let connected = started.elapsed();
    // Every push task started and steady: the task count stops moving.
    let tasks1 = fixture::settled(
        "the push clusters' tasks",
        Duration::from_secs(5),
        || async { runtime.num_alive_tasks() },
    )
    .await;
    let rss1 = rss_bytes();
    println!(
        "PUSH-SCALE n={n} connected_in={connected:?} tasks {tasks0}->{tasks1} ({:.1}/cluster) rss {:.1}->{:.1} MiB ({:.2} MiB/cluster)",
        (tasks1 as f64 - tasks0 as f64) / n as f64,
        rss0 as f64 / 1048576.0,
        rss1 as f64 / 1048576.0,
        (rss1 as f64 - rss0 as f64) / 1048576.0 / n as f64,
    );
}

/// Reverse sync (issue 11) through a push cluster: the in-hub agent publishes a downstream
/// Secret on the hub, follows its changes and its deletion, like a pulled agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reverse_sync_works_for_a_push_cluster() {
    let (ws, _hub) = push_workspace("push-upstream").await;
    let env = ws.env;
    let downstream = downstream_name(2);
    let down = ws.downstream(&downstream).await;
    let ns = unique_name("vpc");
    fixture::create_namespace(&down, &ns).await;
    let requests = Api::<Secret>::namespaced(down.clone(), &ns);
    let put = |value: &'static str| {
        let requests = requests.clone();
        async move {
            let s = fixture::secret("peering-request", &[("vpcId", value)]);
            requests
                .patch(
                    "peering-request",
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(&s),
                )
                .await
                .unwrap();
        }
    };
    put("vpc-edge-1").await;
    kubeconfig_secret(
        &ws,
        "edge-kubeconfig",
        &env.kubeconfig_as(&downstream, ADMIN_USER),
    )
    .await;
    push_cluster(&ws, "edge", "edge-kubeconfig").await;
    ws.bundle(
        "vpc",
        json!({
            "targets": [{"clusterName": "edge"}],
            "defaultNamespace": ns,
            "upstreamResources": [{"kind": "Secret", "name": "peering-request"}],
        }),
    )
    .await;

    let published = names::upstream_name("vpc", "edge", "peering-request");
    let on_hub = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns);
    wait_secret(
        &ws.hub,
        &ws.ns,
        &published,
        "the push cluster's request published",
        |s| secret_value(s, "vpcId").as_deref() == Some("vpc-edge-1"),
    )
    .await;
    put("vpc-edge-2").await;
    wait_secret(&ws.hub, &ws.ns, &published, "its change published", |s| {
        secret_value(s, "vpcId").as_deref() == Some("vpc-edge-2")
    })
    .await;
    requests
        .delete("peering-request", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the publication removed after the downstream deletion",
        WAIT,
        || async {
            Ok::<_, kube::Error>(on_hub.get_opt(&published).await?.is_none().then_some(()))
        },
    )
    .await;
}

/// A push cluster applies as its kubeconfig's own identity (the owner chose it when minting
/// it), so a Bundle naming a ServiceAccount is refused there and nothing of it is deployed
/// (decision 0079-bundles-applied-as-an-impersonated-service-account).
#[tokio::test]
async fn a_push_cluster_refuses_a_bundle_naming_a_service_account() {
    let (ws, _hub) = push_workspace("push-sa").await;
    let downstream = downstream_name(2);
    let down = ws.downstream(&downstream).await;
    kubeconfig_secret(
        &ws,
        "sa-kubeconfig",
        &ws.env.kubeconfig_as(&downstream, ADMIN_USER),
    )
    .await;
    push_cluster(&ws, "sa-edge", "sa-kubeconfig").await;
    connection(&ws, "sa-edge", "ClusterConnected").await;
    let ns = unique_name("push-sa");
    ws.bundle(
        "named",
        json!({
            "targets": [{"clusterName": "sa-edge"}],
            "defaultNamespace": ns,
            "serviceAccount": "kube-system/replicaset-controller",
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "named"}, "data": {"a": "b"}}],
        }),
    )
    .await;
    let ready = eventually(
        "the push cluster refuses the ServiceAccount",
        WAIT,
        || async {
            let bd = ws.bds("sa-edge").get_opt("named").await?;
            Ok::<_, kube::Error>(bd.and_then(|bd| {
                find_condition(&bd.status?.conditions, TYPE_READY)
                    .filter(|c| {
                        c.reason == tender_types::conditions::reason::SERVICE_ACCOUNT_NOT_ALLOWED
                    })
                    .cloned()
            }))
        },
    )
    .await;
    assert_eq!(ready.status, "False");
    stays(
        "the refused Bundle's ConfigMap downstream",
        Duration::from_secs(3),
        &false,
        || async {
            Api::<ConfigMap>::namespaced(down.clone(), &ns)
                .get_opt("named")
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
}

/// Deleting push Clusters (issue 22 item 9): one the hub reaches has its objects removed
/// downstream by the in-hub agent — not what `keepResources` keeps, not an unmanaged object of
/// the same name — before its namespace goes; one the hub cannot reach at that moment has
/// nothing deleted, its deletion still completes, and nothing happens when it answers again.
#[tokio::test]
async fn a_deleted_push_cluster_is_cleaned_up_when_reachable_and_left_alone_when_not() {
    let env = shared_env_of("push-rights", 2).await;
    let ws = Workspace::without_hub(env, "push-delete").await;
    let mut config = hub_config(&ws.ns);
    config.push.probe_interval = Duration::from_secs(1);
    config.push.probe_timeout = Duration::from_secs(2);
    config.push.heartbeat_interval = Duration::from_secs(2);
    config.agent_offline_after = Duration::from_secs(6);
    let _hub = start_hub(env, config).await.unwrap();
    let (near_name, far_name) = (downstream_name(1), downstream_name(2));
    kubeconfig_secret(
        &ws,
        "near-kubeconfig",
        &env.kubeconfig_as(&near_name, ADMIN_USER),
    )
    .await;
    let far_server = env.cluster(&far_name).server.clone();
    let proxy = TcpProxy::for_server(&far_server).await.unwrap();
    let far_kubeconfig =
        proxy.rewrite_kubeconfig(&env.kubeconfig_as(&far_name, ADMIN_USER), &far_server);
    kubeconfig_secret(&ws, "far-kubeconfig", &far_kubeconfig).await;
    push_cluster(&ws, "near", "near-kubeconfig").await;
    push_cluster(&ws, "far", "far-kubeconfig").await;
    connection(&ws, "near", "ClusterConnected").await;
    connection(&ws, "far", "ClusterConnected").await;

    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("apps");
    let kept_ns = unique_name("kept");
    ws.bundle("app", app_bundle(&["near", "far"], &target, false))
        .await;
    ws.bundle("kept", app_bundle(&["near", "far"], &kept_ns, true))
        .await;
    for cluster in ["near", "far"] {
        ws.ready(cluster, "app").await;
        ws.ready(cluster, "kept").await;
    }
    let (near, far) = (
        ws.downstream(&near_name).await,
        ws.downstream(&far_name).await,
    );
    // Not tender's: a ConfigMap named like the manifest, in a namespace of its own.
    let bystander_ns = unique_name("bystander");
    fixture::create_namespace(&near, &bystander_ns).await;
    let bystander: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "app-settings"}, "data": {"a": "b"}}))
            .unwrap();
    let bystanders = Api::<ConfigMap>::namespaced(near.clone(), &bystander_ns);
    bystanders
        .create(&PostParams::default(), &bystander)
        .await
        .unwrap();
    let bystander_version = bystanders
        .get("app-settings")
        .await
        .unwrap()
        .metadata
        .resource_version;
    // (uid, still tender's) of the Bundle's three objects in `ns`.
    let objects = |down: kube::Client, ns: String| async move {
        let secret = Api::<Secret>::namespaced(down.clone(), &ns)
            .get_opt("db-creds")
            .await
            .unwrap()
            .map(|s| s.metadata);
        let cms = Api::<ConfigMap>::namespaced(down, &ns);
        let config = cms.get_opt("app-config").await.unwrap().map(|c| c.metadata);
        let settings = cms
            .get_opt("app-settings")
            .await
            .unwrap()
            .map(|c| c.metadata);
        [secret, config, settings].map(|m| {
            m.map(|m| {
                let owned = m
                    .annotations
                    .is_some_and(|a| a.contains_key(labels::OWNER_ANNOTATION));
                (m.uid.unwrap_or_default(), owned)
            })
        })
    };
    let near_kept = objects(near.clone(), kept_ns.clone()).await;
    let far_before = (
        objects(far.clone(), target.clone()).await,
        objects(far.clone(), kept_ns.clone()).await,
    );
    assert!(
        near_kept
            .iter()
            .all(|o| o.as_ref().is_some_and(|(_, owned)| *owned))
    );

    proxy.cut();
    connection(&ws, "far", "ClusterUnreachable").await;
    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    for name in ["near", "far"] {
        clusters
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ws.hub.clone());
    for name in ["near", "far"] {
        let ns = ws.cluster_ns(name);
        eventually(
            &format!("Cluster {name} and its namespace gone"),
            WAIT,
            || async {
                let cluster = clusters.get_opt(name).await?;
                let namespace = namespaces.get_opt(&ns).await?;
                Ok::<_, kube::Error>((cluster.is_none() && namespace.is_none()).then_some(()))
            },
        )
        .await;
    }
    // Near: the app's objects went before the Cluster did; kept ones stay, released.
    assert_eq!(
        objects(near.clone(), target.clone()).await,
        [None, None, None],
        "the deleted push cluster's objects"
    );
    let released = near_kept.clone().map(|o| o.map(|(uid, _)| (uid, false)));
    assert_eq!(objects(near.clone(), kept_ns.clone()).await, released);
    assert_eq!(
        bystanders
            .get("app-settings")
            .await
            .unwrap()
            .metadata
            .resource_version,
        bystander_version,
        "the unmanaged object of the same name"
    );
    // Far: nothing deleted, also once it answers again (its task is gone with the Cluster).
    proxy.restore();
    stays(
        "the unreachable push cluster's objects after its deletion",
        Duration::from_secs(4),
        &far_before,
        || async {
            (
                objects(far.clone(), target.clone()).await,
                objects(far.clone(), kept_ns.clone()).await,
            )
        },
    )
    .await;
}
