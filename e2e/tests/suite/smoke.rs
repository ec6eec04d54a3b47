//! Proves the test environment's clusters are real Kubernetes control planes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use tender_e2e::{HUB, KUBERNETES_VERSION, RESTRICTED_USERS, eventually, shared_env, unique_name};

const WAIT: Duration = Duration::from_secs(60);

async fn create_namespace(client: &kube::Client, name: &str) -> Namespace {
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
        .expect("creating namespace")
}

fn config_map(name: &str, owner: Option<OwnerReference>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("greeting".into(), "hello".into())])),
        ..Default::default()
    }
}

#[tokio::test]
async fn every_cluster_is_a_real_apiserver_with_its_version() {
    let env = shared_env(2).await;
    assert_eq!(env.clusters().len(), 3);
    for c in env.clusters() {
        let client = env.client(&c.name).await.unwrap();
        let v = client.apiserver_version().await.unwrap();
        assert_eq!(v.git_version, KUBERNETES_VERSION, "{} /version", c.name);
        let ns = unique_name("smoke");
        create_namespace(&client, &ns).await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        cms.create(&PostParams::default(), &config_map("plain", None))
            .await
            .unwrap();
        let got = cms.get("plain").await.unwrap();
        assert_eq!(got.data.unwrap()["greeting"], "hello");
    }
    // The clusters are separate: a namespace made in one is absent from the others.
    let ns = unique_name("only-on-hub");
    create_namespace(&env.client(HUB).await.unwrap(), &ns).await;
    for c in env.clusters().iter().filter(|c| c.name != HUB) {
        let client = env.client(&c.name).await.unwrap();
        assert!(
            Api::<Namespace>::all(client)
                .get_opt(&ns)
                .await
                .unwrap()
                .is_none(),
            "{ns} leaked into {}",
            c.name
        );
    }
}

#[tokio::test]
async fn garbage_collector_deletes_dependents_of_a_deleted_owner() {
    let env = shared_env(2).await;
    for c in env.clusters() {
        let client = env.client(&c.name).await.unwrap();
        let ns = unique_name("gc");
        create_namespace(&client, &ns).await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let owner = cms
            .create(&PostParams::default(), &config_map("owner", None))
            .await
            .unwrap();
        let owner_ref = OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.metadata.uid.clone().unwrap(),
            ..Default::default()
        };
        cms.create(
            &PostParams::default(),
            &config_map("dependent", Some(owner_ref)),
        )
        .await
        .unwrap();
        cms.delete("owner", &DeleteParams::default()).await.unwrap();
        eventually(
            &format!("{}: the garbage collector to delete the dependent", c.name),
            WAIT,
            || async {
                Ok::<_, kube::Error>(cms.get_opt("dependent").await?.is_none().then_some(()))
            },
        )
        .await;
    }
}

#[tokio::test]
async fn rbac_is_enforced_for_restricted_identities() {
    let env = shared_env(2).await;
    let user = RESTRICTED_USERS[0];
    for c in env.clusters() {
        let admin = env.client(&c.name).await.unwrap();
        let denied_ns = unique_name("rbac-denied");
        let allowed_ns = unique_name("rbac-allowed");
        create_namespace(&admin, &denied_ns).await;
        create_namespace(&admin, &allowed_ns).await;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                ..Default::default()
            },
            string_data: Some(BTreeMap::from([("k".into(), "v".into())])),
            ..Default::default()
        };
        for ns in [&denied_ns, &allowed_ns] {
            Api::<Secret>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &secret)
                .await
                .unwrap();
        }
        Api::<Role>::namespaced(admin.clone(), &allowed_ns)
            .create(
                &PostParams::default(),
                &Role {
                    metadata: ObjectMeta {
                        name: Some("read-secrets".into()),
                        ..Default::default()
                    },
                    rules: Some(vec![PolicyRule {
                        api_groups: Some(vec!["".into()]),
                        resources: Some(vec!["secrets".into()]),
                        verbs: vec!["get".into()],
                        ..Default::default()
                    }]),
                },
            )
            .await
            .unwrap();
        Api::<RoleBinding>::namespaced(admin.clone(), &allowed_ns)
            .create(
                &PostParams::default(),
                &RoleBinding {
                    metadata: ObjectMeta {
                        name: Some("read-secrets".into()),
                        ..Default::default()
                    },
                    role_ref: RoleRef {
                        api_group: Some("rbac.authorization.k8s.io".into()),
                        kind: "Role".into(),
                        name: "read-secrets".into(),
                    },
                    subjects: Some(vec![Subject {
                        kind: "User".into(),
                        api_group: Some("rbac.authorization.k8s.io".into()),
                        name: user.into(),
                        ..Default::default()
                    }]),
                },
            )
            .await
            .unwrap();

        let restricted = env.client_as(&c.name, user).await.unwrap();
        match Api::<Secret>::namespaced(restricted.clone(), &denied_ns)
            .get("s")
            .await
        {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{}: {s:?}", c.name),
            other => panic!(
                "{}: expected 403 without a RoleBinding, got {other:?}",
                c.name
            ),
        }
        // RBAC bindings take effect through the authorizer's informer: allow a moment.
        let allowed: Api<Secret> = Api::namespaced(restricted, &allowed_ns);
        let s = eventually(
            &format!("{}: {user} to read the Secret it is bound to", c.name),
            WAIT,
            || async {
                match allowed.get("s").await {
                    Ok(s) => Ok(Some(s)),
                    Err(kube::Error::Api(e)) if e.code == 403 => Ok(None),
                    Err(e) => Err(e),
                }
            },
        )
        .await;
        assert_eq!(s.data.unwrap()["k"].0, b"v");
    }
}

#[tokio::test]
async fn deleted_namespace_finishes_deleting() {
    let env = shared_env(2).await;
    for c in env.clusters() {
        let client = env.client(&c.name).await.unwrap();
        let ns = unique_name("doomed");
        create_namespace(&client, &ns).await;
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &config_map("content", None))
            .await
            .unwrap();
        let namespaces = Api::<Namespace>::all(client.clone());
        namespaces
            .delete(&ns, &DeleteParams::default())
            .await
            .unwrap();
        eventually(
            &format!("{}: namespace {ns} to finish deleting", c.name),
            WAIT,
            || async {
                Ok::<_, kube::Error>(namespaces.get_opt(&ns).await?.is_none().then_some(()))
            },
        )
        .await;
    }
}

#[tokio::test]
async fn service_account_tokens_are_issued() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let env = shared_env(2).await;
    let hub = env.client(HUB).await.unwrap();
    let ns = unique_name("sa");
    create_namespace(&hub, &ns).await;
    // The serviceaccount controller creates `default` in every new namespace.
    let sas: Api<ServiceAccount> = Api::namespaced(hub.clone(), &ns);
    eventually("the default ServiceAccount", WAIT, || async {
        Ok::<_, kube::Error>(sas.get_opt("default").await?.map(|_| ()))
    })
    .await;
    let tr = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec::default()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!tr.status.unwrap().token.unwrap_or_default().is_empty());
}
