use super::*;
use crate::slim::{edited_by_others, keep_content_managers};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tender_types::{BundleTarget, Manifest};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn entry(kind: &str, name: &str) -> DownstreamResource {
    DownstreamResource {
        api_version: None,
        kind: kind.into(),
        name: name.into(),
    }
}

fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(pairs)),
        ..Default::default()
    }
}

struct World {
    labels: Vec<BTreeMap<String, String>>,
    names: Vec<String>,
    annotations: BTreeMap<String, String>,
}

impl World {
    fn new(n: usize) -> Self {
        let names = (0..n).map(|i| format!("c{i}")).collect();
        let labels = (0..n)
            .map(|i| labels(&[("env", if i % 2 == 0 { "prod" } else { "dev" })]))
            .collect();
        Self {
            labels,
            names,
            annotations: BTreeMap::new(),
        }
    }
    fn views(&self) -> Vec<ClusterView<'_>> {
        self.names
            .iter()
            .zip(&self.labels)
            .map(|(name, labels)| ClusterView {
                name,
                labels,
                namespace: Some(name.as_str()),
                paused: false,
                workspace: "ws",
                annotations: &self.annotations,
                template_values: None,
            })
            .collect()
    }
}

fn spec_with_selector(sel: LabelSelector) -> BundleSpec {
    BundleSpec {
        targets: vec![BundleTarget {
            cluster_selector: Some(sel),
            ..Default::default()
        }],
        resources: vec![Manifest(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}
        }))],
        downstream_resources: vec![entry("Secret", "creds"), entry("ConfigMap", "conf")],
        ..Default::default()
    }
}

fn found(hash: &str) -> SourceState {
    SourceState::Found {
        hash: hash.into(),
        bytes: 10,
    }
}

fn all_sources() -> BTreeMap<SourceKey, SourceState> {
    BTreeMap::from([
        (
            (CopyableKind::core(SourceKind::Secret), "creds".into()),
            found("h1"),
        ),
        (
            (CopyableKind::core(SourceKind::ConfigMap), "conf".into()),
            found("h2"),
        ),
    ])
}

#[test]
fn selector_targets_matching_clusters_with_copies() {
    let world = World::new(6);
    let spec = spec_with_selector(selector(&[("env", "prod")]));
    let plan = plan(
        "app",
        &spec,
        &world.views(),
        &[],
        &all_sources(),
        &Copying::defaults(true),
    )
    .unwrap();
    assert_eq!(plan.matched, ["c0", "c2", "c4"]);
    assert_eq!(plan.deployments.len(), 3);
    assert_eq!(plan.copies, 6);
    assert!(plan.missing.is_empty() && !plan.copy_disabled);
    let d = &plan.deployments[0];
    assert_eq!(d.namespace, "c0");
    let spec0 = d.spec.as_ref().unwrap();
    assert_eq!(spec0.options.default_namespace, "default");
    assert!(spec0.options.correct_drift);
    let copied: Vec<_> = spec0
        .options
        .downstream_resources
        .iter()
        .map(|c| (c.kind.as_str(), c.name.as_str(), c.hash.as_str()))
        .collect();
    assert_eq!(
        copied,
        [("ConfigMap", "conf", ""), ("Secret", "creds", "")],
        "no copy hash in the spec (decision 0089-signed-copies)"
    );
    let hashes: Vec<_> = d.copies.iter().map(|c| c.hash.as_str()).collect();
    assert_eq!(hashes, ["h1", "h2"]);
    assert_eq!(
        d.copies[0].copy_name,
        names::copy_name("app", "Secret", "creds")
    );
    assert_eq!(
        spec0.deployment_id,
        hash::deployment_id(&spec.resources, &spec0.options)
    );
}

#[test]
fn rotation_changes_the_copy_not_the_deployment() {
    let world = World::new(2);
    let spec = spec_with_selector(LabelSelector::default());
    let before = plan(
        "app",
        &spec,
        &world.views(),
        &[],
        &all_sources(),
        &Copying::defaults(true),
    )
    .unwrap();
    let mut rotated = all_sources();
    rotated.insert(
        (CopyableKind::core(SourceKind::Secret), "creds".into()),
        found("h1-new"),
    );
    let after = plan(
        "app",
        &spec,
        &world.views(),
        &[],
        &rotated,
        &Copying::defaults(true),
    )
    .unwrap();
    let (b, a) = (
        before.deployments[0].spec.as_ref().unwrap(),
        after.deployments[0].spec.as_ref().unwrap(),
    );
    // A rotation changes the copy, not the BundleDeployment (decision 0089-signed-copies).
    assert_eq!(b, a);
    assert_ne!(before.deployments[0].copies, after.deployments[0].copies);
    assert_eq!(before.resources, after.resources);
    assert_eq!(
        before.spec(&before.deployments[0]).unwrap().resources,
        spec.resources,
        "the whole spec carries the Bundle's manifests"
    );
    assert_eq!(
        before.deployments[0].copies[1].copy_name,
        after.deployments[0].copies[1].copy_name
    );
}

#[test]
fn missing_source_blocks_only_clusters_that_need_it() {
    let world = World::new(2);
    let mut spec = spec_with_selector(LabelSelector::default());
    spec.targets = vec![
        BundleTarget {
            cluster_name: Some("c0".into()),
            downstream_resources: Some(vec![entry("ConfigMap", "conf")]),
            ..Default::default()
        },
        BundleTarget {
            cluster_name: Some("c1".into()),
            ..Default::default()
        },
    ];
    let sources = BTreeMap::from([
        (
            (CopyableKind::core(SourceKind::Secret), "creds".into()),
            SourceState::Missing,
        ),
        (
            (CopyableKind::core(SourceKind::ConfigMap), "conf".into()),
            found("h2"),
        ),
    ]);
    let plan = plan(
        "app",
        &spec,
        &world.views(),
        &[],
        &sources,
        &Copying::defaults(true),
    )
    .unwrap();
    assert_eq!(plan.missing, BTreeSet::from(["Secret/creds".to_string()]));
    assert!(plan.deployments[0].spec.is_some(), "c0 only needs conf");
    assert!(
        plan.deployments[1].spec.is_none(),
        "c1 needs the missing Secret"
    );
    assert!(plan.deployments[1].copies.is_empty());
}

#[test]
fn gate_off_writes_deployments_without_copies() {
    let world = World::new(2);
    let spec = spec_with_selector(LabelSelector::default());
    let plan = plan(
        "app",
        &spec,
        &world.views(),
        &[],
        &BTreeMap::new(),
        &Copying::defaults(false),
    )
    .unwrap();
    assert!(plan.copy_disabled);
    assert!(plan.missing.is_empty(), "sources are not even looked at");
    assert_eq!(plan.copies, 0);
    for d in &plan.deployments {
        assert!(
            d.spec
                .as_ref()
                .unwrap()
                .options
                .downstream_resources
                .is_empty()
        );
    }
}

#[test]
fn groups_names_pause_and_unprovisioned_namespaces() {
    let mut world = World::new(4);
    world.labels[3].insert("region".into(), "eu".into());
    let group_labels = labels(&[("tier", "gold")]);
    let group_selector = selector(&[("region", "eu")]);
    let groups = [GroupInfo {
        name: "eu",
        labels: &group_labels,
        selector: &group_selector,
    }];
    let mut spec = spec_with_selector(LabelSelector::default());
    spec.downstream_resources.clear();
    spec.paused = true;
    spec.targets = vec![
        BundleTarget {
            cluster_group: Some("eu".into()),
            ..Default::default()
        },
        BundleTarget {
            cluster_group_selector: Some(selector(&[("tier", "gold")])),
            ..Default::default()
        },
        BundleTarget {
            cluster_name: Some("c1".into()),
            target_namespace: Some("apps".into()),
            ..Default::default()
        },
    ];
    let mut views = world.views();
    views[1].namespace = None;
    let plan = plan(
        "app",
        &spec,
        &views,
        &groups,
        &BTreeMap::new(),
        &Copying::defaults(true),
    )
    .unwrap();
    assert_eq!(plan.matched, ["c1", "c3"]);
    assert_eq!(plan.deployments.len(), 1, "c1 waits for its namespace");
    assert_eq!(plan.deployments[0].cluster, "c3");
    let d = plan.deployments[0].spec.as_ref().unwrap();
    assert!(d.paused);
    assert!(!plan.copy_disabled);
}

#[test]
fn referenced_sources_cover_every_target() {
    let mut spec = spec_with_selector(LabelSelector::default());
    spec.targets.push(BundleTarget {
        cluster_name: Some("x".into()),
        downstream_resources: Some(vec![entry("Secret", "other"), entry("Pod", "p")]),
        ..Default::default()
    });
    let refs = referenced_sources(&spec);
    assert_eq!(
        refs,
        BTreeSet::from([
            (CopyableKind::core(SourceKind::Secret), "creds".to_string()),
            (
                CopyableKind::core(SourceKind::ConfigMap),
                "conf".to_string()
            ),
            (CopyableKind::core(SourceKind::Secret), "other".to_string()),
            (CopyableKind::parse("v1/Pod").unwrap(), "p".to_string()),
        ])
    );
}

#[test]
fn invalid_selector_is_an_error() {
    let world = World::new(1);
    let spec = spec_with_selector(LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "env".into(),
                operator: "Bogus".into(),
                values: None,
            },
        ]),
        ..Default::default()
    });
    assert!(
        plan(
            "app",
            &spec,
            &world.views(),
            &[],
            &BTreeMap::new(),
            &Copying::defaults(true)
        )
        .is_err()
    );
}

#[test]
fn copies_edited_by_other_managers_are_detected() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    let entry = |manager: &str, fields: serde_json::Value| ManagedFieldsEntry {
        manager: Some(manager.into()),
        fields_v1: Some(FieldsV1(fields)),
        ..Default::default()
    };
    let mut meta = kube::api::ObjectMeta::default();
    assert!(!edited_by_others(&meta));
    meta.managed_fields = Some(vec![entry(
        "tender-hub",
        serde_json::json!({"f:data": {"f:k": {}}, "f:metadata": {}}),
    )]);
    assert!(!edited_by_others(&meta));
    // The garbage collector touching metadata only is not an edit of the content.
    meta.managed_fields.as_mut().unwrap().push(entry(
        "kube-controller-manager",
        serde_json::json!({"f:metadata": {"f:ownerReferences": {}}}),
    ));
    assert!(!edited_by_others(&meta));
    // The cache keeps nothing of these entries: same verdict.
    let mut trimmed = meta.clone();
    keep_content_managers(&mut trimmed);
    assert_eq!(trimmed.managed_fields, None);
    assert!(!edited_by_others(&trimmed));
    meta.managed_fields.as_mut().unwrap().push(entry(
        "kubectl-edit",
        serde_json::json!({"f:data": {"f:k": {}}, "f:metadata": {"f:labels": {}}}),
    ));
    assert!(edited_by_others(&meta));
    // Trimmed to the other manager's content keys: still an edit.
    keep_content_managers(&mut meta);
    let kept = meta.managed_fields.clone().unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].manager.as_deref(), Some("kubectl-edit"));
    assert_eq!(
        kept[0].fields_v1.as_ref().unwrap().0,
        serde_json::json!({"f:data": {}})
    );
    assert!(edited_by_others(&meta));
}

#[test]
fn a_kind_not_allowed_blocks_its_clusters_and_an_allowed_one_is_carried() {
    let world = World::new(1);
    let policy = DownstreamResource {
        api_version: Some("kyverno.io/v1".into()),
        kind: "ClusterPolicy".into(),
        name: "require-labels".into(),
    };
    let mut spec = spec_with_selector(LabelSelector::default());
    spec.downstream_resources = vec![policy.clone()];
    let kind = CopyableKind::parse("kyverno.io/v1/ClusterPolicy").unwrap();
    let sources = BTreeMap::from([((kind.clone(), "require-labels".to_string()), found("hp"))]);

    let refused = plan(
        "app",
        &spec,
        &world.views(),
        &[],
        &sources,
        &Copying::defaults(true),
    )
    .unwrap();
    assert_eq!(
        refused.unsupported,
        BTreeSet::from(["ClusterPolicy/require-labels".to_string()])
    );
    assert_eq!(refused.deployments[0].spec, None, "nothing is written");

    let mut copying = Copying::defaults(true);
    copying.allowed.push(kind.clone());
    let allowed = plan("app", &spec, &world.views(), &[], &sources, &copying).unwrap();
    assert!(allowed.unsupported.is_empty());
    let d = &allowed.deployments[0];
    assert_eq!(d.copies.len(), 1);
    assert_eq!(d.copies[0].kind, SourceKind::Secret, "carried in a Secret");
    assert_eq!(d.copies[0].source_kind, kind);
    let entry = &d.spec.as_ref().unwrap().options.downstream_resources[0];
    assert_eq!(entry.api_version.as_deref(), Some("kyverno.io/v1"));
    assert_eq!(entry.kind, "ClusterPolicy");
    assert_eq!(entry.hash, "");
    assert_eq!(d.copies[0].hash, "hp");
    assert!(entry.is_carried());
}

#[test]
fn fan_out_options_follow_the_target_overrides() {
    let world = World::new(2);
    let mut spec = spec_with_selector(selector(&[("env", "prod")]));
    spec.target_namespaces = vec!["a".into(), "b".into()];
    spec.targets.push(BundleTarget {
        cluster_name: Some("c1".into()),
        target_namespace_selector: Some(selector(&[("team", "x")])),
        target_namespaces: Some(vec![]),
        ..Default::default()
    });
    let plan = plan(
        "app",
        &spec,
        &world.views(),
        &[],
        &all_sources(),
        &Copying::defaults(true),
    )
    .unwrap();
    let opts = |c: &str| {
        plan.deployments
            .iter()
            .find(|d| d.cluster == c)
            .and_then(|d| d.spec.clone())
            .unwrap()
            .options
    };
    assert_eq!(opts("c0").target_namespaces, ["a", "b"]);
    assert_eq!(opts("c0").target_namespace_selector, None);
    assert!(opts("c1").target_namespaces.is_empty());
    assert_eq!(
        opts("c1").target_namespace_selector,
        Some(selector(&[("team", "x")]))
    );
}

#[test]
fn copies_over_the_byte_limit_hold_every_deployment_back() {
    let mut plan = Plan {
        copied_bytes: 2_000,
        deployments: vec![DesiredDeployment {
            cluster: "east".into(),
            namespace: "ns".into(),
            spec: None,
            copies: Vec::new(),
        }],
        ..Default::default()
    };
    assert!(!plan.hold_copies_over(2_000), "at the limit is allowed");
    assert!(plan.hold_copies_over(1_999));
    assert!(
        plan.deployments
            .iter()
            .all(|d| d.spec.is_none() && d.copies.is_empty())
    );
}
