//! Least privilege downstream (issue 21,
//! decision 0079-bundles-applied-as-an-impersonated-service-account): the agent installed from its
//! chart, run as the chart's ServiceAccount, applies Bundles as the Bundle ServiceAccount it
//! impersonates. With the chart's defaults (the refused-kinds blocklist emptied, so RBAC alone
//! decides) a Bundle that tries to become cluster-admin — a RoleBinding to cluster-admin in
//! kube-system, a ClusterRoleBinding, a root Deployment in kube-system mounting the node's
//! filesystem and running as a controller's ServiceAccount — is refused by RBAC, each object
//! naming the 403, while an ordinary Bundle (a Secret copy, a ConfigMap, a Deployment in the
//! owner's application namespace) deploys; a Bundle naming a ServiceAccount the owner did not
//! allow is refused as a whole (`ServiceAccountNotAllowed`), one the owner allowed deploys where
//! only it may write. With the documented opt-in (`bundleServiceAccount.clusterAdmin=true`) the
//! same privileged Bundle deploys.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::Api;
use serde_json::{Value, json};
use tender_e2e::fixture::{WAIT, Workspace, create_namespace, stays};
use tender_e2e::running::{AgentOpts, start_agent};
use tender_e2e::{downstream_name, eventually, shared_env_of, unique_name};
use tender_types::conditions::{TYPE_DEPLOYED, TYPE_READY, find_condition, reason};
use tender_types::{BundleDeployment, ObjectState};

/// A Bundle that would make its author cluster-admin downstream, three ways.
fn escalation(cluster: &str, name: &str) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "resources": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": name, "namespace": "kube-system"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
             "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
             "subjects": [{"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}]},
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": name, "namespace": "kube-system"},
             "spec": {
               "replicas": 1,
               "selector": {"matchLabels": {"app": name}},
               "template": {
                 "metadata": {"labels": {"app": name}},
                 "spec": {
                   // A controller's powerful ServiceAccount, root, the node's filesystem
                   // (the test apiservers run with --allow-privileged=false, which refuses
                   // `privileged` and host namespaces for everyone, admin included).
                   "serviceAccountName": "replicaset-controller",
                   "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                   "containers": [{"name": "root", "image": "example.test/shell:1",
                                   "securityContext": {"runAsUser": 0},
                                   "volumeMounts": [{"name": "host", "mountPath": "/host"}]}]
                 }
               }
             }}
        ],
    })
}

/// The agent chart with the refused-kinds blocklist emptied: only RBAC stands in the way.
const NO_BLOCKLIST: &str = "policy.refusedKinds=null";

async fn bd_where(
    ws: &Workspace,
    cluster: &str,
    bundle: &str,
    what: &str,
    pred: impl Fn(&BundleDeployment) -> bool,
) -> BundleDeployment {
    let api = ws.bds(cluster);
    eventually(what, WAIT, || async {
        // The status seen last goes into the failure message.
        match api.get_opt(bundle).await.map_err(|e| e.to_string())? {
            Some(bd) if pred(&bd) => Ok(Some(bd)),
            Some(bd) => Err(serde_json::to_string(&bd.status).unwrap_or_default()),
            None => Ok(None),
        }
    })
    .await
}

async fn present(down: &kube::Client, name: &str) -> [bool; 3] {
    [
        Api::<RoleBinding>::namespaced(down.clone(), "kube-system")
            .get_opt(name)
            .await
            .unwrap()
            .is_some(),
        Api::<ClusterRoleBinding>::all(down.clone())
            .get_opt(name)
            .await
            .unwrap()
            .is_some(),
        Api::<Deployment>::namespaced(down.clone(), "kube-system")
            .get_opt(name)
            .await
            .unwrap()
            .is_some(),
    ]
}

/// RoleBinding of the built-in ClusterRole `edit` in `ns` to ServiceAccount `sa_ns`/`sa`.
async fn edit_binding(down: &kube::Client, ns: &str, sa_ns: &str, sa: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{sa}-edit"), "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(down.clone(), ns)
        .create(&Default::default(), &binding)
        .await
        .unwrap();
}

#[tokio::test]
async fn by_default_a_bundle_cannot_escalate_and_an_ordinary_one_deploys() {
    let env = shared_env_of("agent-chart", 2).await;
    let ws = Workspace::new(env, "leastpriv").await;
    let down_name = downstream_name(1);
    let down = ws.downstream(&down_name).await;
    // The owner's application namespace, where the chart binds the Bundle ServiceAccount.
    let app_ns = unique_name("lp-app");
    create_namespace(&down, &app_ns).await;
    // A team's own ServiceAccount, allowed by the owner, with edit rights in its namespace only
    // (where the default Bundle ServiceAccount has none).
    let team_ns = unique_name("lp-team");
    create_namespace(&down, &team_ns).await;
    let deployer = format!("{app_ns}/deployer");
    edit_binding(&down, &team_ns, &app_ns, "deployer").await;
    ws.cluster("east").await;
    let bundle_ns = format!("bundleServiceAccount.namespaces={{{app_ns}}}");
    let allowed = format!("allowBundleServiceAccounts={{{deployer}}}");
    // The owner opens the protected kube-system to the agent's policy
    // (decision 0078-tenders-own-objects-and-protected-namespaces), so RBAC alone decides there:
    // the boundary under test.
    let writable = format!("policy.allowedNamespaces={{kube-system,{app_ns},{team_ns}}}");
    let _agent = start_agent(
        &ws,
        "east",
        &down_name,
        AgentOpts {
            sets: &[NO_BLOCKLIST, &bundle_ns, &allowed, &writable],
            ..Default::default()
        },
    )
    .await;

    // An ordinary Bundle: a Secret copy, a ConfigMap and a Deployment in the app namespace.
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "downstreamResources": [{"kind": "Secret", "name": "db-creds"}],
            "resources": [
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "settings"}, "data": {"mode": "fast"}},
                {"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "web"},
                 "spec": {"replicas": 0,
                          "selector": {"matchLabels": {"app": "web"}},
                          "template": {"metadata": {"labels": {"app": "web"}},
                                       "spec": {"containers": [{"name": "web", "image": "example.test/web:1"}]}}}}
            ],
        }),
    )
    .await;
    ws.ready("east", "app").await;

    // The escalation: every object refused by RBAC, naming the 403, none of them downstream.
    let evil = unique_name("lp-evil");
    ws.bundle("evil", escalation("east", &evil)).await;
    let bd = bd_where(
        &ws,
        "east",
        "evil",
        "every escalation refused by RBAC",
        |bd| {
            bd.status.as_ref().is_some_and(|s| {
                s.resources.len() == 3
                    && s.resources.iter().all(|r| {
                        r.state == ObjectState::Error
                            && r.message.as_deref().is_some_and(|m| m.contains("(403)"))
                    })
            })
        },
    )
    .await;
    let status = bd.status.unwrap();
    for r in &status.resources {
        let m = r.message.as_deref().unwrap();
        assert!(
            m.contains("Forbidden (403)")
                && m.contains("system:serviceaccount:tender-system:tender-bundles"),
            "{} {:?}/{}: {m}",
            r.kind,
            r.namespace,
            r.name
        );
    }
    let deployed = find_condition(&status.conditions, TYPE_DEPLOYED).unwrap();
    assert_eq!(deployed.reason, reason::APPLY_FAILED, "{deployed:?}");
    assert!(deployed.message.contains("403"), "{deployed:?}");
    stays(
        "nothing of the escalation downstream",
        std::time::Duration::from_secs(3),
        &[false, false, false],
        || present(&down, &evil),
    )
    .await;

    // A Bundle naming a ServiceAccount the owner did not allow: refused as a whole.
    let named = unique_name("lp-named");
    ws.bundle(
        "named",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "serviceAccount": "kube-system/replicaset-controller",
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": named}}],
        }),
    )
    .await;
    let bd = bd_where(
        &ws,
        "east",
        "named",
        "the named ServiceAccount refused",
        |bd| {
            bd.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, TYPE_READY)
                    .is_some_and(|c| c.reason == reason::SERVICE_ACCOUNT_NOT_ALLOWED)
            })
        },
    )
    .await;
    let text = serde_json::to_string(&bd.status).unwrap();
    assert!(text.contains("kube-system/replicaset-controller"), "{text}");

    // The allowed one: its Bundle deploys where only that ServiceAccount may write.
    ws.bundle(
        "team",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": team_ns,
            "serviceAccount": deployer,
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team"}}],
        }),
    )
    .await;
    ws.ready("east", "team").await;
    assert!(
        Api::<ConfigMap>::namespaced(down.clone(), &app_ns)
            .get_opt(&named)
            .await
            .unwrap()
            .is_none(),
        "nothing of a refused deployment is applied"
    );
}

#[tokio::test]
async fn with_the_cluster_admin_opt_in_the_same_bundle_deploys() {
    let env = shared_env_of("agent-chart", 2).await;
    let ws = Workspace::new(env, "leastpriv-admin").await;
    let down_name = downstream_name(2);
    let down = ws.downstream(&down_name).await;
    ws.cluster("west").await;
    let _agent = start_agent(
        &ws,
        "west",
        &down_name,
        AgentOpts {
            sets: &[
                NO_BLOCKLIST,
                "bundleServiceAccount.clusterAdmin=true",
                // kube-system is protected by the policy unless named
                // (decision 0078-tenders-own-objects-and-protected-namespaces).
                "policy.allowedNamespaces={kube-system}",
            ],
            ..Default::default()
        },
    )
    .await;
    let evil = unique_name("lp-admin");
    ws.bundle("evil", escalation("west", &evil)).await;
    // Applied (its Deployment never becomes available: the test clusters have no nodes).
    bd_where(&ws, "west", "evil", "the escalation applied", |bd| {
        bd.status.as_ref().is_some_and(|s| {
            s.applied_deployment_id.as_deref() == Some(bd.spec.deployment_id.as_str())
        })
    })
    .await;
    assert_eq!(present(&down, &evil).await, [true, true, true]);
}
