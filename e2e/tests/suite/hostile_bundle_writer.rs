//! A hostile Bundle writer (issue 21): whoever may write Bundles on the hub tries to make a
//! downstream agent read or take what belongs to the cluster's owner or to tender itself — the
//! agent's own hub kubeconfig Secret (reverse sync, `valuesFrom`, `helmSecretName`), a
//! service-account token, tender's own objects through `takeOwnership`, an `APIService`, and
//! writes into `kube-system`. Every attempt is refused with a stable reason naming the object
//! (never its content), and nothing leaves or changes downstream
//! (decisions 0077-reads-for-a-bundle-obey-the-owner
//! and 0078-tenders-own-objects-and-protected-namespaces).
//!
//! Each agent runs in its own agent namespace (a fresh name), which holds a stand-in of the
//! hub kubeconfig Secret the chart mounts (`tender-agent-hub`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use tender_agent::policy::{Policy, SERVICE_ACCOUNT_TOKEN};
use tender_e2e::fixture::{Agent, WAIT, Workspace, create_namespace, secret, stays};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_DEPLOYED, TYPE_READY, find_condition, reason};
use tender_types::{BundleDeployment, ObjectState, UpstreamState, labels};

/// What the stand-in hub kubeconfig holds; it must never appear on the hub.
const HUB_TOKEN: &str = "hub-token-never-leaves-0123456789";
/// The service-account token's stand-in value.
const SA_TOKEN: &str = "sa-token-never-leaves-9876543210";

/// A registered cluster whose agent runs in a namespace of its own, with the agent's hub
/// kubeconfig Secret in it; `configure` adjusts the policy.
async fn agent_in_own_namespace(
    ws: &Workspace,
    cluster: &str,
    configure: impl FnOnce(&mut Policy, &str),
) -> (Agent, kube::Client, String) {
    let agent_ns = unique_name("tender-agent");
    let down = ws.downstream(&downstream_name(1)).await;
    create_namespace(&down, &agent_ns).await;
    Api::<Secret>::namespaced(down.clone(), &agent_ns)
        .create(
            &PostParams::default(),
            &secret("tender-agent-hub", &[("kubeconfig", HUB_TOKEN)]),
        )
        .await
        .unwrap();
    let ns = agent_ns.clone();
    let agent = ws
        .agent_configured(cluster, &downstream_name(1), move |c| {
            c.agent_namespace = ns.clone();
            configure(&mut c.policy, &ns);
        })
        .await;
    (agent, down, agent_ns)
}

/// A ServiceAccount of `ns` and a `kubernetes.io/service-account-token` Secret `name` for it.
async fn service_account_token(down: &kube::Client, ns: &str, name: &str) {
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some(format!("{name}-owner"));
    Api::<ServiceAccount>::namespaced(down.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let mut s = secret(name, &[("token", SA_TOKEN)]);
    s.type_ = Some(SERVICE_ACCOUNT_TOKEN.into());
    s.metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/service-account.name".to_string(),
        format!("{name}-owner"),
    )]));
    Api::<Secret>::namespaced(down.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

/// Waits until BundleDeployment `bundle` of `cluster` satisfies `check`; returns it.
async fn bd_where(
    ws: &Workspace,
    cluster: &str,
    bundle: &str,
    what: &str,
    check: impl Fn(&BundleDeployment) -> bool,
) -> BundleDeployment {
    let api = ws.bds(cluster);
    eventually(what, WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(bundle).await?.filter(|bd| check(bd)))
    })
    .await
}

/// The `Deployed` condition's message once its reason is `want` and the message holds
/// `fragment`.
async fn deployed_failure(ws: &Workspace, cluster: &str, want: &str, fragment: &str) -> String {
    let bd = bd_where(
        ws,
        cluster,
        "app",
        &format!("Deployed {want} naming {fragment}"),
        |bd| {
            bd.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, TYPE_DEPLOYED)
                    .is_some_and(|c| c.reason == want && c.message.contains(fragment))
            })
        },
    )
    .await;
    let text = serde_json::to_string(&bd.status).unwrap();
    assert!(
        !text.contains(HUB_TOKEN) && !text.contains(SA_TOKEN),
        "{text}"
    );
    find_condition(&bd.status.unwrap().conditions, TYPE_DEPLOYED)
        .unwrap()
        .message
        .clone()
}

/// Every Secret in `cluster`'s namespace and the workspace on the hub, as text (keys and
/// values): none may hold a stolen value or key.
async fn hub_secrets_text(ws: &Workspace, cluster: &str) -> String {
    let mut out = String::new();
    for ns in [ws.cluster_ns(cluster), ws.ns.clone()] {
        for s in Api::<Secret>::namespaced(ws.hub.clone(), &ns)
            .list(&Default::default())
            .await
            .unwrap()
        {
            for (k, v) in s.data.unwrap_or_default() {
                out.push_str(&format!("{k}="));
                out.push_str(&String::from_utf8_lossy(&v.0));
                out.push('\n');
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reverse_sync_never_publishes_the_agents_hub_kubeconfig_or_a_token() {
    let ws = Workspace::new(shared_env(1).await, "hostile-up").await;
    let (_agent, down, agent_ns) = agent_in_own_namespace(&ws, "east", |_, _| {}).await;
    let app_ns = unique_name("hostile-up-app");
    create_namespace(&down, &app_ns).await;
    service_account_token(&down, &app_ns, "sa-token").await;
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "upstreamResources": [
                {"kind": "Secret", "namespace": agent_ns, "name": "tender-agent-hub"},
                {"kind": "Secret", "name": "sa-token"}
            ],
        }),
    )
    .await;
    let refused = |bd: &BundleDeployment| -> Vec<(String, UpstreamState, String)> {
        bd.status
            .iter()
            .flat_map(|s| s.upstream.iter())
            .map(|l| {
                (
                    format!("{}/{}", l.namespace, l.name),
                    l.state,
                    l.message.clone().unwrap_or_default(),
                )
            })
            .collect()
    };
    let bd = bd_where(&ws, "east", "app", "both upstream lines refused", |bd| {
        let lines = refused(bd);
        lines.len() == 2
            && lines.iter().all(|(_, state, m)| {
                *state == UpstreamState::Error && m.starts_with(reason::READ_REFUSED_BY_POLICY)
            })
    })
    .await;
    let lines = refused(&bd);
    let hub_line = lines
        .iter()
        .find(|(what, _, _)| *what == format!("{agent_ns}/tender-agent-hub"))
        .expect("the hub kubeconfig's line");
    assert!(hub_line.2.contains("agent's own namespace"), "{lines:?}");
    let token_line = lines
        .iter()
        .find(|(what, _, _)| *what == format!("{app_ns}/sa-token"))
        .expect("the token's line");
    assert!(token_line.2.contains(SERVICE_ACCOUNT_TOKEN), "{lines:?}");

    // Nothing of either ever reaches the hub: not the placeholders, not the workspace.
    stays(
        "stolen values on the hub",
        Duration::from_secs(5),
        &(false, false, false),
        || async {
            let text = hub_secrets_text(&ws, "east").await;
            // The token controller may fill in a real token: its key tells it too.
            (
                text.contains(HUB_TOKEN),
                text.contains(SA_TOKEN),
                text.contains("token="),
            )
        },
    )
    .await;
}

/// A Helm Bundle reading `helm` (its chart never fetched: the refusal comes first).
fn helm_bundle(ns: &str, helm: Value) -> Value {
    let mut h = json!({"chart": "app", "repo": "http://127.0.0.1:9/charts", "version": "0.1.0"});
    for (k, v) in helm.as_object().unwrap() {
        h[k] = v.clone();
    }
    json!({"targets": [{"clusterName": "east"}], "defaultNamespace": ns, "helm": h})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn values_from_never_reads_the_agent_namespace_or_a_token() {
    let ws = Workspace::new(shared_env(1).await, "hostile-vf").await;
    // Whatever the flags: even a policy that names the agent namespace for writes and reads.
    let (_agent, down, agent_ns) = agent_in_own_namespace(&ws, "east", |p, agent_ns| {
        p.allowed_namespaces = vec![agent_ns.to_string(), "hostile-vf-app*".into()];
        p.readable_namespaces = Some(vec![agent_ns.to_string(), "*".into()]);
    })
    .await;
    let app_ns = unique_name("hostile-vf-app");
    create_namespace(&down, &app_ns).await;
    service_account_token(&down, &app_ns, "sa-token").await;

    let from = |ns: &str, name: &str, key: &str| json!({"valuesFrom": [{"secretKeyRef": {"namespace": ns, "name": name, "key": key}}]});
    ws.bundle(
        "app",
        helm_bundle(&app_ns, from(&agent_ns, "tender-agent-hub", "kubeconfig")),
    )
    .await;
    let msg = deployed_failure(
        &ws,
        "east",
        reason::READ_REFUSED_BY_POLICY,
        &format!("{agent_ns}/tender-agent-hub"),
    )
    .await;
    assert!(msg.contains("agent's own namespace"), "{msg}");

    ws.bundle(
        "app",
        helm_bundle(&app_ns, from(&app_ns, "sa-token", "token")),
    )
    .await;
    let msg = deployed_failure(
        &ws,
        "east",
        reason::READ_REFUSED_BY_POLICY,
        &format!("{app_ns}/sa-token"),
    )
    .await;
    assert!(msg.contains(SERVICE_ACCOUNT_TOKEN), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_secret_name_never_reads_the_agent_namespace_or_a_token() {
    let ws = Workspace::new(shared_env(1).await, "hostile-hs").await;
    let (_agent, down, agent_ns) = agent_in_own_namespace(&ws, "east", |p, agent_ns| {
        p.allowed_namespaces = vec![agent_ns.to_string(), "hostile-hs-app*".into()];
    })
    .await;
    // The chart credentials would go to a repository of the Bundle writer's choosing.
    Api::<Secret>::namespaced(down.clone(), &agent_ns)
        .create(
            &PostParams::default(),
            &secret(
                "registry-login",
                &[("username", "owner"), ("password", HUB_TOKEN)],
            ),
        )
        .await
        .unwrap();
    let app_ns = unique_name("hostile-hs-app");
    create_namespace(&down, &app_ns).await;
    service_account_token(&down, &app_ns, "sa-token").await;

    // helmSecretName is read where the copies land: the Bundle points that at the agent's.
    ws.bundle(
        "app",
        helm_bundle(&agent_ns, json!({"helmSecretName": "registry-login"})),
    )
    .await;
    let msg = deployed_failure(
        &ws,
        "east",
        reason::READ_REFUSED_BY_POLICY,
        &format!("{agent_ns}/registry-login"),
    )
    .await;
    assert!(msg.contains("agent's own namespace"), "{msg}");

    ws.bundle(
        "app",
        helm_bundle(&app_ns, json!({"helmSecretName": "sa-token"})),
    )
    .await;
    let msg = deployed_failure(
        &ws,
        "east",
        reason::READ_REFUSED_BY_POLICY,
        &format!("{app_ns}/sa-token"),
    )
    .await;
    assert!(msg.contains(SERVICE_ACCOUNT_TOKEN), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn take_ownership_never_adopts_tenders_own_objects() {
    let ws = Workspace::new(shared_env(1).await, "hostile-own").await;
    let app_ns = unique_name("hostile-own-app");
    // Whatever the flags: the agent may write to its own namespace here.
    let allowed = app_ns.clone();
    let (_agent, down, agent_ns) = agent_in_own_namespace(&ws, "east", move |p, agent_ns| {
        p.allowed_namespaces = vec![agent_ns.to_string(), allowed];
    })
    .await;
    create_namespace(&down, &app_ns).await;
    // An object of tender's install outside the agent namespace (as `tender cluster add` and
    // the chart label them).
    let mut install = ConfigMap {
        data: Some(BTreeMap::from([("role".into(), "agent".into())])),
        ..Default::default()
    };
    install.metadata.name = Some("tender-agent-settings".into());
    install.metadata.labels = Some(BTreeMap::from([(
        labels::APP_NAME.to_string(),
        labels::AGENT_APP_NAME.to_string(),
    )]));
    Api::<ConfigMap>::namespaced(down.clone(), &app_ns)
        .create(&PostParams::default(), &install)
        .await
        .unwrap();

    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "takeOwnership": true,
            "resources": [
                {"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "tender-agent-hub", "namespace": agent_ns},
                 "stringData": {"kubeconfig": "attacker-hub"}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "tender-agent-settings"}, "data": {"role": "attacker"}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "plain"}, "data": {"a": "b"}}
            ],
        }),
    )
    .await;
    let bd = bd_where(&ws, "east", "app", "both adoptions refused", |bd| {
        bd.status.as_ref().is_some_and(|s| {
            s.resources
                .iter()
                .filter(|r| {
                    r.state == ObjectState::Error
                        && r.message
                            .as_deref()
                            .is_some_and(|m| m.starts_with(reason::REFUSED_BY_POLICY))
                })
                .count()
                == 2
        })
    })
    .await;
    let status = bd.status.unwrap();
    let text = serde_json::to_string(&status.resources).unwrap();
    assert!(text.contains("agent's own namespace"), "{text}");
    assert!(text.contains("part of tender's install"), "{text}");
    let plain = status.resources.iter().find(|r| r.name == "plain").unwrap();
    assert_eq!(plain.state, ObjectState::Ready, "the rest is deployed");

    // Untouched, across more than two of the agent's 30 s re-checks.
    let secrets: Api<Secret> = Api::namespaced(down.clone(), &agent_ns);
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &app_ns);
    let sample = || async {
        let s = secrets.get("tender-agent-hub").await.unwrap();
        let c = cms.get("tender-agent-settings").await.unwrap();
        (
            s.data.unwrap_or_default().get("kubeconfig").cloned(),
            s.metadata.resource_version,
            c.data.unwrap_or_default().get("role").cloned(),
            c.metadata.resource_version,
        )
    };
    let before = sample().await;
    assert_eq!(
        before.0,
        Some(ByteString(HUB_TOKEN.as_bytes().to_vec())),
        "the hub kubeconfig as it was"
    );
    assert_eq!(before.2.as_deref(), Some("agent"));
    stays(
        "tender's own objects",
        tender_e2e::fixture::CONFLICT_RECHECKS,
        &before,
        sample,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_services_and_writes_into_kube_system_are_refused_by_default() {
    let ws = Workspace::new(shared_env(1).await, "hostile-sys").await;
    let (_agent, down, _agent_ns) = agent_in_own_namespace(&ws, "east", |_, _| {}).await;
    let app_ns = unique_name("hostile-sys-app");
    let group = format!("{}.example.com", unique_name("hostile"));
    let api_service = format!("v1.{group}");
    let binding = unique_name("hostile-admin");
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "resources": [
                {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                 "metadata": {"name": api_service},
                 "spec": {"group": group, "version": "v1", "groupPriorityMinimum": 1000,
                          "versionPriority": 15}},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": binding, "namespace": "kube-system"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "cluster-admin"},
                 "subjects": [{"kind": "Group", "name": "system:authenticated",
                               "apiGroup": "rbac.authorization.k8s.io"}]},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "plain"}, "data": {"a": "b"}}
            ],
        }),
    )
    .await;
    let bd = bd_where(&ws, "east", "app", "Ready RefusedByPolicy", |bd| {
        bd.status.as_ref().is_some_and(|s| {
            s.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                && find_condition(&s.conditions, TYPE_READY)
                    .is_some_and(|c| c.reason == reason::REFUSED_BY_POLICY)
        })
    })
    .await;
    let ready = find_condition(&bd.status.as_ref().unwrap().conditions, TYPE_READY)
        .unwrap()
        .message
        .clone();
    assert!(ready.contains(&api_service), "{ready}");
    assert!(ready.contains(&binding), "{ready}");

    let apiservice = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apiregistration.k8s.io",
        "v1",
        "APIService",
    ));
    let services: Api<DynamicObject> = Api::all_with(down.clone(), &apiservice);
    let bindings: Api<RoleBinding> = Api::namespaced(down.clone(), "kube-system");
    let found = (
        services.get_opt(&api_service).await.unwrap().is_some(),
        bindings.get_opt(&binding).await.unwrap().is_some(),
    );
    // Without the fix they exist: remove them so the shared cluster stays sound.
    if found.0 {
        let _ = services
            .delete(&api_service, &DeleteParams::default())
            .await;
    }
    if found.1 {
        let _ = bindings.delete(&binding, &DeleteParams::default()).await;
    }
    assert_eq!(
        found,
        (false, false),
        "(APIService, RoleBinding) downstream"
    );
    assert!(
        Api::<ConfigMap>::namespaced(down, &app_ns)
            .get_opt("plain")
            .await
            .unwrap()
            .is_some(),
        "the rest is deployed"
    );
}
