//! The hub against a real hub apiserver (no agents): targeting, BundleDeployments, copies,
//! rotation, retargeting, clear conditions, cluster cleanup, agent RBAC and idleness.
//!
//! Every test has its own workspace namespace and its own hub instance scoped to it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tender_e2e::fixture::{Workspace, config_map, secret, settled, stays};
use tender_e2e::hub_harness::{HubHandle, agent_kubeconfig, hub_config, start_hub};
use tender_e2e::{TestEnv, client_from_yaml, eventually, shared_env};
use tender_types::conditions::{TYPE_READY, TYPE_RESOURCES_COPIED, find_condition, reason};
use tender_types::{
    Bundle, BundleDeployment, BundleSpec, BundleTarget, Cluster, ClusterGroup, ClusterGroupSpec,
    ClusterSpec, DownstreamResource, Manifest, labels, names,
};

const WAIT: Duration = Duration::from_secs(90);
const CLUSTERS: usize = 20;

struct World {
    env: &'static TestEnv,
    admin: kube::Client,
    ws: String,
    hub: HubHandle,
    clusters: Vec<String>,
}

fn cluster_name(i: usize) -> String {
    format!("c-{i}")
}

/// Labels of cluster `i`: even ones are prod, odd ones dev; the first half is in eu.
fn cluster_labels(i: usize) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "env".to_string(),
            if i.is_multiple_of(2) { "prod" } else { "dev" }.to_string(),
        ),
        (
            "region".to_string(),
            if i < CLUSTERS / 2 { "eu" } else { "us" }.to_string(),
        ),
    ])
}

impl World {
    /// A workspace with `n` registered Clusters and a hub scoped to it, every cluster
    /// namespace provisioned.
    async fn new(prefix: &str, n: usize, copy: bool) -> World {
        // No hub yet: it starts below, once the Clusters exist.
        let Workspace {
            env,
            hub: admin,
            ns: ws,
            ..
        } = Workspace::without_hub(shared_env(0).await, prefix).await;
        let api: Api<Cluster> = Api::namespaced(admin.clone(), &ws);
        let mut clusters = Vec::new();
        for i in 0..n {
            let name = cluster_name(i);
            let mut c = Cluster::new(&name, ClusterSpec::default());
            c.metadata.labels = Some(cluster_labels(i));
            api.create(&PostParams::default(), &c).await.unwrap();
            clusters.push(name);
        }
        let mut config = hub_config(&ws);
        config.copy_resources_downstream = copy;
        let hub = start_hub(env, config).await.unwrap();
        let world = World {
            env,
            admin,
            ws,
            hub,
            clusters,
        };
        let started = Instant::now();
        eventually(
            &format!("{n} cluster namespaces provisioned"),
            WAIT,
            || async {
                let list = api.list(&ListParams::default()).await?;
                let ready = list
                    .items
                    .iter()
                    .filter(|c| {
                        c.status
                            .as_ref()
                            .and_then(|s| s.namespace.as_ref())
                            .is_some()
                    })
                    .count();
                Ok::<_, kube::Error>((ready == n).then_some(()))
            },
        )
        .await;
        eprintln!(
            "[{}] {n} clusters provisioned in {:?}",
            world.ws,
            started.elapsed()
        );
        world
    }

    fn cluster_ns(&self, cluster: &str) -> String {
        names::cluster_namespace(&self.ws, cluster)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.admin.clone(), &self.ws)
    }

    async fn create_secret(&self, name: &str, data: &[(&str, &str)]) -> Secret {
        let mut s = secret(name, data);
        s.metadata.labels = Some(BTreeMap::from([("team".into(), "payments".into())]));
        self.api::<Secret>()
            .create(&PostParams::default(), &s)
            .await
            .unwrap()
    }

    async fn create_config_map(&self, name: &str, data: &[(&str, &str)]) -> ConfigMap {
        self.api::<ConfigMap>()
            .create(&PostParams::default(), &config_map(name, data))
            .await
            .unwrap()
    }

    async fn create_bundle(&self, name: &str, spec: BundleSpec) {
        self.api::<Bundle>()
            .create(&PostParams::default(), &Bundle::new(name, spec))
            .await
            .unwrap();
    }

    /// Every BundleDeployment of Bundle `bundle` on the hub, by cluster namespace.
    async fn deployments(&self, bundle: &str) -> kube::Result<BTreeMap<String, BundleDeployment>> {
        let lp = ListParams::default().labels(&format!(
            "{}={},{}={bundle}",
            labels::BUNDLE_NAMESPACE,
            self.ws,
            labels::BUNDLE_NAME
        ));
        Ok(Api::<BundleDeployment>::all(self.admin.clone())
            .list(&lp)
            .await?
            .items
            .into_iter()
            .map(|bd| (bd.namespace().unwrap_or_default(), bd))
            .collect())
    }

    /// Waits until Bundle `bundle` has (live, not terminating) BundleDeployments in exactly the
    /// namespaces of `clusters`.
    async fn expect_targets(
        &self,
        bundle: &str,
        clusters: &[String],
    ) -> BTreeMap<String, BundleDeployment> {
        let want: BTreeSet<String> = clusters.iter().map(|c| self.cluster_ns(c)).collect();
        eventually(
            &format!("Bundle {bundle} deployed to exactly {clusters:?}"),
            WAIT,
            || async {
                let bds = self.deployments(bundle).await?;
                let live: BTreeSet<String> = bds
                    .iter()
                    .filter(|(_, bd)| bd.metadata.deletion_timestamp.is_none())
                    .map(|(ns, _)| ns.clone())
                    .collect();
                Ok::<_, kube::Error>((live == want).then_some(bds))
            },
        )
        .await
    }

    async fn bundle_condition(&self, bundle: &str, type_: &str, want_reason: &str) -> String {
        let api = self.api::<Bundle>();
        eventually(
            &format!("Bundle {bundle} condition {type_} with reason {want_reason}"),
            WAIT,
            || async {
                let b = api.get(bundle).await?;
                Ok::<_, kube::Error>(
                    b.status
                        .as_ref()
                        .and_then(|s| find_condition(&s.conditions, type_))
                        .filter(|c| c.reason == want_reason)
                        .map(|c| c.message.clone()),
                )
            },
        )
        .await
    }
}

fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn entry(kind: &str, name: &str) -> DownstreamResource {
    DownstreamResource {
        api_version: None,
        kind: kind.into(),
        name: name.into(),
    }
}

fn bundle_spec(target: BundleTarget, copies: Vec<DownstreamResource>) -> BundleSpec {
    BundleSpec {
        targets: vec![target],
        downstream_resources: copies,
        resources: vec![Manifest(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-settings"},
            "data": {"mode": "fast"}
        }))],
        ..Default::default()
    }
}

fn everything() -> BundleTarget {
    BundleTarget {
        cluster_selector: Some(LabelSelector::default()),
        ..Default::default()
    }
}

fn expected(filter: impl Fn(usize) -> bool) -> Vec<String> {
    (0..CLUSTERS)
        .filter(|i| filter(*i))
        .map(cluster_name)
        .collect()
}

/// Checks every copy of `source` (a Secret) for `bundle` in `bds`: owned by its
/// BundleDeployment, hashed, labelled, with the source's data; `Some` when all match.
async fn secret_copies_match(
    w: &World,
    bundle: &str,
    source: &str,
    bds: &BTreeMap<String, BundleDeployment>,
) -> kube::Result<Option<()>> {
    let src = w.api::<Secret>().get(source).await?;
    let hash = tender_types::hash::secret_hash(&src);
    let copy_name = names::copy_name(bundle, "Secret", source);
    for (ns, bd) in bds {
        let Some(copy) = Api::<Secret>::namespaced(w.admin.clone(), ns)
            .get_opt(&copy_name)
            .await?
        else {
            return Ok(None);
        };
        let owner = copy.owner_references().first().cloned();
        if copy.data != src.data
            || copy.annotations().get(labels::CONTENT_HASH) != Some(&hash)
            || owner.as_ref().map(|o| (o.kind.as_str(), o.uid.as_str()))
                != Some(("BundleDeployment", bd.uid().unwrap_or_default().as_str()))
        {
            return Ok(None);
        }
        assert_eq!(copy.labels()[labels::BUNDLE_NAME], bundle);
        assert_eq!(
            copy.labels()["team"],
            "payments",
            "source labels are copied"
        );
        let listed = bd
            .spec
            .options
            .downstream_resources
            .iter()
            .any(|c| c.name == source && c.copy_name == copy_name && c.hash.is_empty());
        // The copy carries the hub's signature instead (decision 0089-signed-copies).
        if !copy.annotations().contains_key(labels::HUB_SIGNATURE) {
            return Ok(None);
        }
        if !listed {
            return Ok(None);
        }
    }
    Ok(Some(()))
}

#[tokio::test]
async fn targets_by_name_selector_and_groups_with_copies_in_every_cluster() {
    let w = World::new("hub-target", CLUSTERS, true).await;
    w.create_secret("db-creds", &[("user", "app"), ("password", "s3cret")])
        .await;
    w.create_config_map("settings", &[("level", "debug")]).await;
    let mut group = ClusterGroup::new(
        "eu",
        ClusterGroupSpec {
            selector: selector(&[("region", "eu")]),
        },
    );
    group.metadata.labels = Some(BTreeMap::from([("tier".into(), "gold".into())]));
    w.api::<ClusterGroup>()
        .create(&PostParams::default(), &group)
        .await
        .unwrap();
    let copies = vec![entry("Secret", "db-creds"), entry("ConfigMap", "settings")];
    let targets = [
        (
            "by-name",
            BundleTarget {
                cluster_name: Some("c-3".into()),
                ..Default::default()
            },
            expected(|i| i == 3),
        ),
        (
            "by-selector",
            BundleTarget {
                cluster_selector: Some(selector(&[("env", "prod")])),
                ..Default::default()
            },
            expected(|i| i.is_multiple_of(2)),
        ),
        (
            "by-group",
            BundleTarget {
                cluster_group: Some("eu".into()),
                ..Default::default()
            },
            expected(|i| i < CLUSTERS / 2),
        ),
        (
            "by-group-selector",
            BundleTarget {
                cluster_group_selector: Some(selector(&[("tier", "gold")])),
                ..Default::default()
            },
            expected(|i| i < CLUSTERS / 2),
        ),
    ];
    let started = Instant::now();
    for (name, target, _) in &targets {
        w.create_bundle(name, bundle_spec(target.clone(), copies.clone()))
            .await;
    }
    for (name, _, want) in &targets {
        let bds = w.expect_targets(name, want).await;
        for (ns, bd) in &bds {
            assert!(
                bd.finalizers()
                    .contains(&labels::AGENT_CLEANUP_FINALIZER.to_string()),
                "{ns}: agent finalizer"
            );
            assert_eq!(bd.labels()[labels::WORKSPACE], w.ws);
            assert_eq!(bd.spec.options.downstream_resources.len(), 2);
            let managers: Vec<_> = bd
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .filter_map(|m| m.manager.clone())
                .collect();
            assert!(
                managers.contains(&labels::HUB_FIELD_MANAGER.to_string()),
                "{managers:?}"
            );
        }
        eventually(
            &format!("copies of {name} match their source"),
            WAIT,
            || secret_copies_match(&w, name, "db-creds", &bds),
        )
        .await;
        let cm_copy = names::copy_name(name, "ConfigMap", "settings");
        for ns in bds.keys() {
            let cms = Api::<ConfigMap>::namespaced(w.admin.clone(), ns);
            let cm = eventually(&format!("{ns}: ConfigMap copy of {name}"), WAIT, || async {
                cms.get_opt(&cm_copy).await
            })
            .await;
            assert_eq!(cm.data.unwrap()["level"], "debug");
        }
    }
    eprintln!(
        "[{}] 4 bundles, 31 BundleDeployments, 62 copies in {:?}",
        w.ws,
        started.elapsed()
    );
    let groups = w.api::<ClusterGroup>();
    eventually("group eu to count its clusters", WAIT, || async {
        let g = groups.get("eu").await?;
        Ok::<_, kube::Error>(
            g.status
                .filter(|s| s.cluster_count == 10 && s.ready_cluster_count == 0)
                .map(|_| ()),
        )
    })
    .await;
    let msg = w
        .bundle_condition("by-selector", TYPE_READY, reason::WAIT_APPLIED)
        .await;
    assert!(msg.contains("0/10"), "{msg}");
    w.bundle_condition(
        "by-selector",
        TYPE_RESOURCES_COPIED,
        reason::RESOURCES_COPIED,
    )
    .await;
}

#[tokio::test]
async fn rotation_reaches_every_copy_and_removed_entries_are_deleted() {
    let w = World::new("hub-rotate", CLUSTERS, true).await;
    w.create_secret("token", &[("value", "v1")]).await;
    w.create_config_map("conf", &[("k", "v")]).await;
    w.create_bundle(
        "app",
        bundle_spec(
            everything(),
            vec![entry("Secret", "token"), entry("ConfigMap", "conf")],
        ),
    )
    .await;
    let bds = w.expect_targets("app", &w.clusters).await;
    eventually("20 copies of the Secret", WAIT, || {
        secret_copies_match(&w, "app", "token", &bds)
    })
    .await;
    let before: BTreeMap<String, String> = w
        .deployments("app")
        .await
        .unwrap()
        .into_iter()
        .map(|(ns, bd)| (ns, bd.spec.deployment_id))
        .collect();
    assert_eq!(
        before.len(),
        CLUSTERS,
        "a deploymentID recorded for every cluster before the rotation"
    );

    // Rotate: only the Secret changes, nobody touches the Bundle.
    let started = Instant::now();
    w.api::<Secret>()
        .patch(
            "token",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"value": "v2"}})),
        )
        .await
        .unwrap();
    let rotated = eventually("the rotation to reach all 20 copies", WAIT, || async {
        let bds = w.deployments("app").await?;
        // Signed copies (decision 0089-signed-copies): the rotation rewrites the copies only;
        // every deploymentID stays as it was.
        let ids_kept = bds.len() == CLUSTERS
            && bds
                .iter()
                .all(|(ns, bd)| before.get(ns) == Some(&bd.spec.deployment_id));
        assert!(
            ids_kept || bds.len() != CLUSTERS,
            "a rotation must not rewrite a BundleDeployment"
        );
        Ok::<_, kube::Error>(
            secret_copies_match(&w, "app", "token", &bds)
                .await?
                .map(|()| bds),
        )
    })
    .await;
    eprintln!(
        "[{}] rotation reached {} copies (deploymentIDs unchanged) in {:?}",
        w.ws,
        rotated.len(),
        started.elapsed()
    );
    let copy = Api::<Secret>::namespaced(w.admin.clone(), &w.cluster_ns("c-7"))
        .get(&names::copy_name("app", "Secret", "token"))
        .await
        .unwrap();
    assert_eq!(copy.data.unwrap()["value"].0, b"v2");

    // Remove the Secret entry: its copies go, the ConfigMap copies stay.
    let started = Instant::now();
    w.api::<Bundle>()
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"downstreamResources": [{"kind": "ConfigMap", "name": "conf"}]}})),
        )
        .await
        .unwrap();
    let secret_copy = names::copy_name("app", "Secret", "token");
    let cm_copy = names::copy_name("app", "ConfigMap", "conf");
    for c in &w.clusters {
        let ns = w.cluster_ns(c);
        let secrets: Api<Secret> = Api::namespaced(w.admin.clone(), &ns);
        eventually(&format!("{ns}: Secret copy deleted"), WAIT, || async {
            Ok::<_, kube::Error>(secrets.get_opt(&secret_copy).await?.is_none().then_some(()))
        })
        .await;
        assert!(
            Api::<ConfigMap>::namespaced(w.admin.clone(), &ns)
                .get_opt(&cm_copy)
                .await
                .unwrap()
                .is_some()
        );
    }
    let bds = w.deployments("app").await.unwrap();
    assert_eq!(
        bds.len(),
        CLUSTERS,
        "every cluster keeps its BundleDeployment"
    );
    assert!(
        bds.values()
            .all(|bd| bd.spec.options.downstream_resources.len() == 1),
        "every BundleDeployment lists only the ConfigMap copy"
    );
    eprintln!(
        "[{}] removed entry's 20 copies deleted in {:?}",
        w.ws,
        started.elapsed()
    );
}

#[tokio::test]
async fn relabelling_a_cluster_moves_it_in_and_out() {
    let w = World::new("hub-relabel", CLUSTERS, true).await;
    w.create_bundle(
        "prod-only",
        bundle_spec(
            BundleTarget {
                cluster_selector: Some(selector(&[("env", "prod")])),
                ..Default::default()
            },
            vec![],
        ),
    )
    .await;
    let prod = expected(|i| i.is_multiple_of(2));
    w.expect_targets("prod-only", &prod).await;

    let clusters = w.api::<Cluster>();
    let relabel = |name: &'static str, env: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": {"env": env}}})),
                )
                .await
                .unwrap();
        }
    };
    relabel("c-1", "prod").await;
    relabel("c-0", "dev").await;
    let mut now: Vec<String> = prod.into_iter().filter(|c| c != "c-0").collect();
    now.push("c-1".into());
    let bds = w.expect_targets("prod-only", &now).await;
    // Untargeted: deleted, and held by the agent's finalizer since no agent runs here.
    let gone = bds.get(&w.cluster_ns("c-0"));
    assert!(
        gone.is_none_or(|bd| bd.metadata.deletion_timestamp.is_some()),
        "c-0's BundleDeployment is being deleted"
    );
    relabel("c-0", "prod").await;
    eventually(
        "c-0 targeted again once its old BundleDeployment is gone",
        WAIT,
        || async {
            // Play the agent: release the old BundleDeployment.
            let bds = w.deployments("prod-only").await?;
            if let Some(bd) = bds.get(&w.cluster_ns("c-0"))
                && bd.metadata.deletion_timestamp.is_some()
            {
                Api::<BundleDeployment>::namespaced(w.admin.clone(), &w.cluster_ns("c-0"))
                    .patch(
                        "prod-only",
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
                    )
                    .await?;
                return Ok(None);
            }
            Ok::<_, kube::Error>(
                bds.get(&w.cluster_ns("c-0"))
                    .filter(|bd| bd.metadata.deletion_timestamp.is_none())
                    .map(|_| ()),
            )
        },
    )
    .await;
}

#[tokio::test]
async fn missing_source_is_reported_and_recovers_when_created() {
    let w = World::new("hub-missing", 3, true).await;
    w.create_bundle(
        "late",
        bundle_spec(everything(), vec![entry("Secret", "not-yet")]),
    )
    .await;
    let msg = w
        .bundle_condition("late", TYPE_READY, reason::SOURCE_NOT_FOUND)
        .await;
    assert!(msg.contains("Secret/not-yet"), "{msg}");
    let copied = w
        .bundle_condition("late", TYPE_RESOURCES_COPIED, reason::SOURCE_NOT_FOUND)
        .await;
    assert!(copied.contains("Secret/not-yet"), "{copied}");
    assert!(
        w.deployments("late").await.unwrap().is_empty(),
        "nothing is deployed before its copies exist"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.admin.clone(), &w.ws);
    eventually("a SourceNotFound event on the Bundle", WAIT, || async {
        let list = events.list(&ListParams::default()).await?;
        Ok::<_, kube::Error>(
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some(reason::SOURCE_NOT_FOUND))
                .then_some(()),
        )
    })
    .await;

    w.create_secret("not-yet", &[("k", "v")]).await;
    let bds = w.expect_targets("late", &w.clusters).await;
    eventually("copies of the new source", WAIT, || {
        secret_copies_match(&w, "late", "not-yet", &bds)
    })
    .await;
    w.bundle_condition("late", TYPE_RESOURCES_COPIED, reason::RESOURCES_COPIED)
        .await;
}

#[tokio::test]
async fn gate_off_says_the_field_is_ignored_and_copies_nothing() {
    let w = World::new("hub-gateoff", 3, false).await;
    w.create_secret("creds", &[("k", "v")]).await;
    w.create_bundle(
        "app",
        bundle_spec(everything(), vec![entry("Secret", "creds")]),
    )
    .await;
    let msg = w
        .bundle_condition("app", TYPE_RESOURCES_COPIED, reason::COPY_FEATURE_DISABLED)
        .await;
    assert!(msg.contains("ignored"), "{msg}");
    let bds = w.expect_targets("app", &w.clusters).await;
    for (ns, bd) in &bds {
        assert!(bd.spec.options.downstream_resources.is_empty(), "{ns}");
        let copies = Api::<Secret>::namespaced(w.admin.clone(), ns)
            .list(&ListParams::default().labels(labels::BUNDLE_NAME))
            .await
            .unwrap();
        assert!(copies.items.is_empty(), "{ns}: no copies with the gate off");
    }
}

#[tokio::test]
async fn deleted_cluster_namespace_disappears_even_with_agent_finalizers() {
    let w = World::new("hub-delcluster", 3, true).await;
    w.create_secret("creds", &[("k", "v")]).await;
    w.create_bundle(
        "app",
        bundle_spec(everything(), vec![entry("Secret", "creds")]),
    )
    .await;
    let bds = w.expect_targets("app", &w.clusters).await;
    let ns = w.cluster_ns("c-1");
    assert!(
        bds[&ns]
            .finalizers()
            .contains(&labels::AGENT_CLEANUP_FINALIZER.to_string())
    );
    let started = Instant::now();
    w.api::<Cluster>()
        .delete("c-1", &DeleteParams::default())
        .await
        .unwrap();
    let namespaces = Api::<Namespace>::all(w.admin.clone());
    eventually(&format!("namespace {ns} to disappear"), WAIT, || async {
        Ok::<_, kube::Error>(namespaces.get_opt(&ns).await?.is_none().then_some(()))
    })
    .await;
    let clusters = w.api::<Cluster>();
    eventually("the Cluster to be gone", WAIT, || async {
        Ok::<_, kube::Error>(clusters.get_opt("c-1").await?.is_none().then_some(()))
    })
    .await;
    assert!(
        w.api::<Role>()
            .get_opt(&names::agent_workspace_role("c-1"))
            .await
            .unwrap()
            .is_none(),
        "workspace Role removed"
    );
    eprintln!(
        "[{}] deleted cluster cleaned up in {:?}",
        w.ws,
        started.elapsed()
    );
    let remaining: Vec<String> = vec!["c-0".into(), "c-2".into()];
    w.expect_targets("app", &remaining).await;
}

fn forbidden<T: std::fmt::Debug>(result: kube::Result<T>, what: &str) {
    match result {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{what}: {s:?}"),
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

#[tokio::test]
async fn agent_identity_is_confined_to_its_own_cluster() {
    let w = World::new("hub-rbac", 2, true).await;
    w.create_secret("creds", &[("k", "v")]).await;
    w.create_bundle(
        "app",
        bundle_spec(everything(), vec![entry("Secret", "creds")]),
    )
    .await;
    w.expect_targets("app", &w.clusters).await;
    let yaml = agent_kubeconfig(w.env, &w.admin, &w.ws, "c-0")
        .await
        .unwrap();
    let agent = client_from_yaml(&yaml).await.unwrap();
    let (own, other) = (w.cluster_ns("c-0"), w.cluster_ns("c-1"));

    let own_bds: Api<BundleDeployment> = Api::namespaced(agent.clone(), &own);
    let listed = eventually("the agent to list its BundleDeployments", WAIT, || async {
        match own_bds.list(&ListParams::default()).await {
            Ok(l) => Ok(Some(l.items.len())),
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await;
    assert_eq!(listed, 1);
    Api::<Secret>::namespaced(agent.clone(), &own)
        .get(&names::copy_name("app", "Secret", "creds"))
        .await
        .expect("the agent reads its copies");
    let clusters: Api<Cluster> = Api::namespaced(agent.clone(), &w.ws);
    eventually("the agent to read its own Cluster", WAIT, || async {
        match clusters.get("c-0").await {
            Ok(_) => Ok(Some(())),
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await;
    let status_patch = serde_json::json!({
        "apiVersion": tender_types::API_GROUP_VERSION, "kind": "Cluster",
        "status": {"agent": {"version": "test"}}
    });
    let pp = PatchParams::apply(labels::AGENT_FIELD_MANAGER);
    clusters
        .patch_status("c-0", &pp, &Patch::Apply(&status_patch))
        .await
        .expect("the agent writes its own Cluster status");

    forbidden(
        Api::<BundleDeployment>::namespaced(agent.clone(), &other)
            .list(&ListParams::default())
            .await,
        "list BundleDeployments of another cluster",
    );
    forbidden(
        Api::<Secret>::namespaced(agent.clone(), &other)
            .list(&ListParams::default())
            .await,
        "list Secrets of another cluster",
    );
    forbidden(
        clusters
            .patch_status("c-1", &pp, &Patch::Apply(&status_patch))
            .await,
        "patch another Cluster's status",
    );
    forbidden(clusters.get("c-1").await, "read another Cluster");
    forbidden(
        Api::<Secret>::namespaced(agent.clone(), &w.ws)
            .list(&ListParams::default())
            .await,
        "list the workspace's source Secrets",
    );
    forbidden(
        own_bds.delete("app", &DeleteParams::default()).await,
        "delete its own BundleDeployment",
    );
    // The hub never overwrites what the agent reports.
    let c = w.api::<Cluster>().get("c-0").await.unwrap();
    assert_eq!(
        c.status.unwrap().agent.unwrap().version.as_deref(),
        Some("test")
    );
}

#[tokio::test]
async fn restarted_hub_writes_nothing_for_settled_objects_and_idle_means_idle() {
    let w = World::new("hub-idle", CLUSTERS, true).await;
    w.create_secret("creds", &[("k", "v")]).await;
    w.create_config_map("conf", &[("k", "v")]).await;
    let group = ClusterGroup::new(
        "prod",
        ClusterGroupSpec {
            selector: selector(&[("env", "prod")]),
        },
    );
    w.api::<ClusterGroup>()
        .create(&PostParams::default(), &group)
        .await
        .unwrap();
    w.create_bundle(
        "app",
        bundle_spec(
            everything(),
            vec![entry("Secret", "creds"), entry("ConfigMap", "conf")],
        ),
    )
    .await;
    let bds = w.expect_targets("app", &w.clusters).await;
    eventually("copies in place", WAIT, || {
        secret_copies_match(&w, "app", "creds", &bds)
    })
    .await;
    w.bundle_condition("app", TYPE_RESOURCES_COPIED, reason::RESOURCES_COPIED)
        .await;
    // Settled: the first hub's write count stops moving for longer than a Cluster summary
    // waits (decision 0053-cluster-summary-delay), so no summary write is still pending when it
    // stops.
    let first = &w.hub;
    let quiet = Duration::from_secs(2) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY;
    settled("the first hub's writes", quiet, || async { first.writes() }).await;
    eprintln!(
        "[{}] first hub settled after {} writes",
        w.ws,
        first.writes()
    );

    let World {
        env,
        hub,
        ws,
        admin,
        ..
    } = w;
    hub.stop().await.unwrap();
    let restarted = start_hub(env, hub_config(&ws)).await.unwrap();
    eventually("the restarted hub to reconcile everything", WAIT, || {
        let done = restarted.reconciles("cluster") >= CLUSTERS as u64
            && restarted.reconciles("bundle") >= 1
            && restarted.reconciles("clustergroup") >= 1;
        async move { Ok::<_, std::convert::Infallible>(done.then_some(())) }
    })
    .await;
    assert_eq!(
        restarted.writes(),
        0,
        "restarted hub wrote to settled objects: {:?}",
        restarted.write_series()
    );
    // The deliberate idle window: no write series appears at any point of it.
    stays(
        "the restarted hub's writes while idle",
        Duration::from_secs(30),
        &Vec::new(),
        || async { restarted.write_series() },
    )
    .await;
    eprintln!(
        "[{ws}] restarted hub: {} reconciles, {} copies skipped, 0 writes over 30 s idle",
        restarted.reconciles("bundle")
            + restarted.reconciles("cluster")
            + restarted.reconciles("clustergroup"),
        restarted.hub_metrics.copies_skipped.get()
    );
    // Still alive and responsive after idling: a change is picked up.
    Api::<Secret>::namespaced(admin.clone(), &ws)
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"k": "v2"}})),
        )
        .await
        .unwrap();
    eventually("the restarted hub to rotate", WAIT, || {
        let written = restarted.hub_metrics.copies_written.get();
        async move { Ok::<_, std::convert::Infallible>((written >= CLUSTERS as u64).then_some(())) }
    })
    .await;
    eprintln!(
        "[{ws}] rotation after idling: {} copies written, {} writes in total",
        restarted.hub_metrics.copies_written.get(),
        restarted.writes()
    );
}

#[tokio::test]
async fn deleting_a_bundle_removes_its_deployments_and_copies() {
    let w = World::new("hub-delbundle", CLUSTERS, true).await;
    w.create_secret("creds", &[("k", "v")]).await;
    w.create_bundle(
        "app",
        bundle_spec(everything(), vec![entry("Secret", "creds")]),
    )
    .await;
    let bds = w.expect_targets("app", &w.clusters).await;
    eventually("copies in place", WAIT, || {
        secret_copies_match(&w, "app", "creds", &bds)
    })
    .await;
    w.api::<Bundle>()
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    // The hub deletes every BundleDeployment; the agent's finalizer holds them (no agent here).
    eventually("every BundleDeployment to be deleting", WAIT, || async {
        // All of them still there (held by the finalizer) and every one deleting.
        let bds = w.deployments("app").await?;
        Ok::<_, kube::Error>(
            (bds.len() == CLUSTERS
                && bds
                    .values()
                    .all(|bd| bd.metadata.deletion_timestamp.is_some()))
            .then_some(()),
        )
    })
    .await;
    let bundles = w.api::<Bundle>();
    eventually("the Bundle itself to be gone", WAIT, || async {
        Ok::<_, kube::Error>(bundles.get_opt("app").await?.is_none().then_some(()))
    })
    .await;
    // Play the agent: finish downstream cleanup by releasing the finalizers.
    for ns in bds.keys() {
        Api::<BundleDeployment>::namespaced(w.admin.clone(), ns)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
    }
    let copy = names::copy_name("app", "Secret", "creds");
    eventually("BundleDeployments and their copies gone", WAIT, || async {
        if !w.deployments("app").await?.is_empty() {
            return Ok(None);
        }
        for ns in bds.keys() {
            if Api::<Secret>::namespaced(w.admin.clone(), ns)
                .get_opt(&copy)
                .await?
                .is_some()
            {
                return Ok(None);
            }
        }
        Ok::<_, kube::Error>(Some(()))
    })
    .await;
}

/// Issue 23 item 4 / decision 0086-one-retry-and-finalizer-helper: a Bundle whose BundleDeployment
/// the apiserver keeps refusing is retried with a growing per-object delay (1, 2, 4, 8, 16, 30 s),
/// not every few seconds for ever, and is deployed once the cause goes away.
#[tokio::test]
async fn a_bundle_whose_writes_keep_failing_backs_off_and_deploys_once_fixed() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let w = World::new("hub-backoff", 1, false).await;
    let cns = w.cluster_ns(&w.clusters[0]);
    // An in-apiserver policy refusing exactly this workspace's BundleDeployment "doomed".
    let name = format!("tender-e2e-{}", w.ws);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["tender.dev"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["bundledeployments"],
            }]},
            "validations": [{
                "expression": format!(
                    "object.metadata.name != 'doomed' || object.metadata.namespace != '{cns}'"
                ),
                "message": "refused by the e2e policy",
            }],
        },
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }))
    .unwrap();
    let policies = Api::<ValidatingAdmissionPolicy>::all(w.admin.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(w.admin.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // The policy is in force once a dry-run create of the refused object fails.
    let probe = BundleDeployment::new("doomed", Default::default());
    let bds = Api::<BundleDeployment>::namespaced(w.admin.clone(), &cns);
    eventually("the admission policy to be in force", WAIT, || async {
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        Ok::<_, kube::Error>(bds.create(&dry, &probe).await.is_err().then_some(()))
    })
    .await;

    w.create_bundle("doomed", bundle_spec(everything(), vec![]))
        .await;
    let first = eventually("the Bundle's first failed reconcile", WAIT, || async {
        let n = w.hub.reconcile_errors("bundle");
        Ok::<_, kube::Error>((n > 0).then_some(n))
    })
    .await;
    // Over 40 s a fixed 3 s retry fails ~13 more times; the backoff at most 5 (1+2+4+8+16 s).
    let window = Duration::from_secs(40);
    stays(
        "at most 6 more failed reconciles of the refused Bundle (backoff)",
        window,
        &true,
        || async { w.hub.reconcile_errors("bundle") - first <= 6 },
    )
    .await;
    let failed = w.hub.reconcile_errors("bundle") - first;
    assert!(
        failed >= 3,
        "still retried within {window:?} ({failed} more)"
    );
    assert!(
        w.deployments("doomed").await.unwrap().is_empty(),
        "the refused BundleDeployment does not exist"
    );

    // The cause goes away: the next retry (at most 30 s later) deploys it.
    bindings
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    w.expect_targets("doomed", &w.clusters).await;
}
