//! The downstream owner's policy (issue 14): an agent allowed to write to one namespace, with
//! the default refused kinds, gets a Bundle holding a ClusterRole (refused kind) and a
//! ConfigMap in another namespace (refused namespace) next to ordinary copies and manifests.
//! Both refused objects are named in the BundleDeployment (`RefusedByPolicy`) and never
//! appear downstream; everything else is deployed, marked applied, and keeps receiving
//! rotations.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::Api;
use serde_json::json;
use tender_agent::policy::Policy;
use tender_e2e::agent_harness::start_agent_with;
use tender_e2e::fixture::{WAIT, Workspace, secret_value, wait_secret};
use tender_e2e::{ADMIN_USER, downstream_name, eventually, shared_env, unique_name};
use tender_types::ObjectState;
use tender_types::conditions::{TYPE_DEPLOYED, TYPE_READY, find_condition, is_true, reason};

#[tokio::test]
async fn refused_objects_are_named_and_everything_else_is_deployed() {
    let env = shared_env(1).await;
    let ws = Workspace::new(env, "policy").await;
    let app_ns = unique_name("policy-app");
    let other_ns = unique_name("policy-other");
    let role = unique_name("policy-role");

    let (kubeconfig, mut config) = ws.register("east").await;
    config.policy = Policy {
        allowed_namespaces: vec![app_ns.clone()],
        ..Policy::default()
    };
    let down_name = downstream_name(1);
    let _agent = start_agent_with(
        &kubeconfig,
        &env.kubeconfig_as(&down_name, ADMIN_USER),
        config,
    )
    .await
    .unwrap();

    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "downstreamResources": [
                {"kind": "Secret", "name": "db-creds"},
                {"kind": "ConfigMap", "name": "app-config"}
            ],
            "resources": [
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "app-settings"}, "data": {"a": "b"}},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": role},
                 "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "elsewhere", "namespace": other_ns}, "data": {"a": "b"}}
            ],
        }),
    )
    .await;

    // The BundleDeployment: applied, not Ready, naming exactly the two refused objects.
    let bds = ws.bds("east");
    let bd = eventually("the refusal reported", WAIT, || async {
        let bd = bds.get_opt("app").await?;
        Ok::<_, kube::Error>(bd.filter(|bd| {
            bd.status.as_ref().is_some_and(|s| {
                s.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                    && find_condition(&s.conditions, TYPE_READY)
                        .is_some_and(|c| c.reason == reason::REFUSED_BY_POLICY)
            })
        }))
    })
    .await;
    let status = bd.status.unwrap();
    assert!(
        is_true(&status.conditions, TYPE_DEPLOYED),
        "the rest is deployed"
    );
    let ready = find_condition(&status.conditions, TYPE_READY).unwrap();
    assert!(ready.message.contains(&role), "{}", ready.message);
    assert!(ready.message.contains(&other_ns), "{}", ready.message);
    let refused: Vec<_> = status
        .resources
        .iter()
        .filter(|s| s.state == ObjectState::Error)
        .map(|s| {
            (
                s.kind.as_str(),
                s.name.as_str(),
                s.message.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused
            .iter()
            .all(|(_, _, m)| m.starts_with("RefusedByPolicy")),
        "{refused:?}"
    );
    let settings = status
        .resources
        .iter()
        .find(|s| s.name == "app-settings")
        .expect("app-settings in status");
    assert_eq!(settings.state, ObjectState::Ready);

    // Downstream: the allowed objects exist, the refused ones never did.
    let down = ws.downstream(&down_name).await;
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &app_ns);
    assert!(cms.get_opt("app-settings").await.unwrap().is_some());
    assert!(cms.get_opt("app-config").await.unwrap().is_some());
    wait_secret(&down, &app_ns, "db-creds", "the copy downstream", |s| {
        secret_value(s, "password").as_deref() == Some("v1")
    })
    .await;
    assert!(
        Api::<ClusterRole>::all(down.clone())
            .get_opt(&role)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Namespace>::all(down.clone())
            .get_opt(&other_ns)
            .await
            .unwrap()
            .is_none(),
        "the agent did not create a namespace it may not write to"
    );

    // Nothing else is held back: a rotation still arrives.
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    wait_secret(&down, &app_ns, "db-creds", "the rotation downstream", |s| {
        secret_value(s, "password").as_deref() == Some("v2")
    })
    .await;
    assert!(
        Api::<ClusterRole>::all(down)
            .get_opt(&role)
            .await
            .unwrap()
            .is_none()
    );
}
