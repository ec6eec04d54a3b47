//! Any kind by reference on real clusters, with Kyverno's real CRDs (from Kyverno's Go module
//! archive, see `tender_e2e::kyverno`) installed on the hub and both downstream clusters:
//! a ClusterPolicy and a Policy copied to two clusters through carrier Secrets, never
//! instantiated on the hub outside their sources; rotation by watch; removal; a kind the hub
//! operator does not allow is `KindNotAllowed`.

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use tender_e2e::fixture::{Workspace, create_namespace};
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{HUB, downstream_name, eventually, kyverno, shared_env, unique_name};
use tender_types::conditions::{TYPE_READY, find_condition, reason};
use tender_types::copy::CopyableKind;
use tender_types::{Bundle, labels};

const WAIT: std::time::Duration = tender_e2e::fixture::WAIT;

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "kyverno.io".into(),
        version: "v1".into(),
        api_version: "kyverno.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn policy_spec(message: &str) -> Value {
    json!({
        "background": false,
        "rules": [{
            "name": "require-team",
            "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
            "validate": {"message": message, "pattern": {"metadata": {"labels": {"team": "?*"}}}}
        }]
    })
}

async fn apply_dynamic(api: &Api<DynamicObject>, name: &str, body: Value) {
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(body),
    )
    .await
    .unwrap();
}

/// The `validate.message` of the first rule of a policy, if it exists.
async fn message_of(api: &Api<DynamicObject>, name: &str) -> Option<String> {
    let o = api.get_opt(name).await.ok()??;
    o.data["spec"]["rules"][0]["validate"]["message"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test]
async fn kyverno_policies_are_copied_to_two_clusters_and_never_live_on_the_hub() {
    let env = shared_env(2).await;
    let mut ws = Workspace::without_hub(env, "anykind").await;
    let hub = ws.hub.clone();
    let d1 = ws.downstream(&downstream_name(1)).await;
    let d2 = ws.downstream(&downstream_name(2)).await;
    for c in [&hub, &d1, &d2] {
        kyverno::install_policy_crds(c).await.unwrap();
    }
    let mut config = hub_config(&ws.ns);
    config.copyable_kinds = CopyableKind::parse_list(
        "v1/Secret,v1/ConfigMap,kyverno.io/v1/ClusterPolicy,kyverno.io/v1/Policy",
    )
    .unwrap();
    let _hub = start_hub(env, config).await.unwrap();
    let _ = &mut ws;

    let cpol = resource("ClusterPolicy", "clusterpolicies");
    let pol = resource("Policy", "policies");
    let cluster_name = unique_name("require-team");
    let hub_cpols: Api<DynamicObject> = Api::all_with(hub.clone(), &cpol);
    let hub_pols: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ws.ns, &pol);
    apply_dynamic(
        &hub_cpols,
        &cluster_name,
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
               "metadata": {"name": cluster_name, "labels": {"team": "platform"}},
               "spec": policy_spec("v1")}),
    )
    .await;
    apply_dynamic(
        &hub_pols,
        "team-policy",
        json!({"apiVersion": "kyverno.io/v1", "kind": "Policy",
               "metadata": {"name": "team-policy"}, "spec": policy_spec("v1")}),
    )
    .await;

    let _east = ws.agent("east", &downstream_name(1)).await;
    let _west = ws.agent("west", &downstream_name(2)).await;
    let target = unique_name("policies");
    ws.bundle(
        "policies",
        json!({
            "targets": [{"clusterName": "east"}, {"clusterName": "west"}],
            "defaultNamespace": target,
            "downstreamResources": [
                {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "name": cluster_name},
                {"apiVersion": "kyverno.io/v1", "kind": "Policy", "name": "team-policy"}
            ]
        }),
    )
    .await;
    ws.ready("east", "policies").await;
    ws.ready("west", "policies").await;

    // The sources as the hub stores them (the CRD's schema defaults included).
    let cpol_spec = hub_cpols.get(&cluster_name).await.unwrap().data["spec"].clone();
    let pol_spec = hub_pols.get("team-policy").await.unwrap().data["spec"].clone();
    assert_eq!(cpol_spec["rules"][0]["validate"]["message"], "v1");
    for down in [&d1, &d2] {
        let cpols: Api<DynamicObject> = Api::all_with(down.clone(), &cpol);
        let pols: Api<DynamicObject> = Api::namespaced_with(down.clone(), &target, &pol);
        let c = cpols.get(&cluster_name).await.unwrap();
        assert_eq!(c.data["spec"], cpol_spec, "ClusterPolicy spec copied");
        assert_eq!(c.labels().get("team").map(String::as_str), Some("platform"));
        assert_eq!(
            c.labels().get(labels::MANAGED_BY).map(String::as_str),
            Some(labels::MANAGED_BY_VALUE)
        );
        let p = pols.get("team-policy").await.unwrap();
        assert_eq!(p.data["spec"], pol_spec, "Policy spec copied");
    }

    // On the hub: only the sources; the copies are carrier Secrets in the cluster namespaces.
    let all_pols: Api<DynamicObject> = Api::all_with(hub.clone(), &pol);
    let named: Vec<_> = all_pols
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.name.as_deref() == Some("team-policy"))
        .filter_map(|p| p.metadata.namespace)
        .filter(|ns| *ns == ws.ns || ns.starts_with("cluster-"))
        .collect();
    assert_eq!(
        named,
        [ws.ns.clone()],
        "no Policy instantiated on the hub but the source"
    );
    let managed_cpols = hub_cpols
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE
        )))
        .await
        .unwrap();
    assert!(
        managed_cpols.items.is_empty(),
        "no ClusterPolicy written on the hub"
    );
    let carriers =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(hub.clone(), &ws.cluster_ns("east"))
            .list(&ListParams::default().labels(&format!("{}=true", labels::CARRIER)))
            .await
            .unwrap();
    assert_eq!(carriers.items.len(), 2, "one carrier per copied object");

    // Rotation by watch: edit the sources, both clusters follow.
    apply_dynamic(
        &hub_cpols,
        &cluster_name,
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
               "metadata": {"name": cluster_name, "labels": {"team": "platform"}},
               "spec": policy_spec("v2")}),
    )
    .await;
    apply_dynamic(
        &hub_pols,
        "team-policy",
        json!({"apiVersion": "kyverno.io/v1", "kind": "Policy",
               "metadata": {"name": "team-policy"}, "spec": policy_spec("v2")}),
    )
    .await;
    for down in [&d1, &d2] {
        let cpols: Api<DynamicObject> = Api::all_with(down.clone(), &cpol);
        let pols: Api<DynamicObject> = Api::namespaced_with(down.clone(), &target, &pol);
        eventually("ClusterPolicy rotated downstream", WAIT, || async {
            Ok::<_, kube::Error>(
                (message_of(&cpols, &cluster_name).await.as_deref() == Some("v2")).then_some(()),
            )
        })
        .await;
        eventually("Policy rotated downstream", WAIT, || async {
            Ok::<_, kube::Error>(
                (message_of(&pols, "team-policy").await.as_deref() == Some("v2")).then_some(()),
            )
        })
        .await;
    }

    // Removal: drop the ClusterPolicy from the Bundle; it goes downstream, the Policy stays.
    ws.bundle(
        "policies",
        json!({
            "targets": [{"clusterName": "east"}, {"clusterName": "west"}],
            "defaultNamespace": target,
            "downstreamResources": [
                {"apiVersion": "kyverno.io/v1", "kind": "Policy", "name": "team-policy"}
            ]
        }),
    )
    .await;
    for down in [&d1, &d2] {
        let cpols: Api<DynamicObject> = Api::all_with(down.clone(), &cpol);
        eventually("ClusterPolicy removed downstream", WAIT, || async {
            Ok::<_, kube::Error>(cpols.get_opt(&cluster_name).await?.is_none().then_some(()))
        })
        .await;
        let pols: Api<DynamicObject> = Api::namespaced_with(down.clone(), &target, &pol);
        assert!(pols.get_opt("team-policy").await.unwrap().is_some());
    }
    // The source itself is untouched.
    assert_eq!(
        message_of(&hub_cpols, &cluster_name).await.as_deref(),
        Some("v2")
    );
    hub_cpols
        .delete(&cluster_name, &Default::default())
        .await
        .ok();
}

#[tokio::test]
async fn a_kind_the_operator_does_not_allow_is_kind_not_allowed() {
    let env = shared_env(2).await;
    let ws = Workspace::new(env, "anykind-refused").await;
    let _east = ws.agent("east", &downstream_name(1)).await;
    ws.bundle(
        "refused",
        json!({
            "targets": [{"clusterName": "east"}],
            "downstreamResources": [{"apiVersion": "v1", "kind": "ServiceAccount", "name": "robot"}]
        }),
    )
    .await;
    let bundles: Api<Bundle> = Api::namespaced(ws.hub.clone(), &ws.ns);
    eventually("Bundle Ready=False/KindNotAllowed", WAIT, || async {
        let b = bundles.get("refused").await?;
        Ok::<_, kube::Error>(
            b.status
                .and_then(|s| find_condition(&s.conditions, TYPE_READY).cloned())
                .filter(|c| c.reason == reason::KIND_NOT_ALLOWED),
        )
    })
    .await;
    assert!(
        ws.bds("east").get_opt("refused").await.unwrap().is_none(),
        "nothing written for the cluster"
    );
    let _ = HUB;
    let _ = create_namespace;
}
