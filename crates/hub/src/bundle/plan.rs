//! What a Bundle should have written for it: one BundleDeployment per targeted cluster and one
//! copy per downstream resource. Pure: unit tests call it with plain values.

use std::collections::{BTreeMap, BTreeSet};

use tender_types::copy::CopyableKind;
use tender_types::targeting::{self, ClusterInfo, GroupInfo, TargetingError};
use tender_types::{
    BundleDeploymentOptions, BundleDeploymentSpec, BundleSpec, CopiedResource, DownstreamResource,
    HelmOptions, Manifest, SourceKind, hash, names, namespaces,
};

/// A Cluster as planning sees it.
#[derive(Debug, Clone, Copy)]
pub struct ClusterView<'a> {
    /// Name of the Cluster.
    pub name: &'a str,
    /// Its labels (what targets select).
    pub labels: &'a BTreeMap<String, String>,
    /// Its namespace on the hub once the cluster controller has provisioned it.
    pub namespace: Option<&'a str>,
    /// `spec.paused` of the Cluster.
    pub paused: bool,
}

/// What the hub knows about one referenced source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceState {
    /// The source exists; its content hash.
    Found {
        /// [`tender_types::hash::secret_hash`] or [`tender_types::hash::config_map_hash`].
        hash: String,
    },
    /// No such object in the Bundle's namespace.
    Missing,
}

/// Key of a source in the Bundle's namespace (or of a cluster-scoped source): kind and name.
pub type SourceKey = (CopyableKind, String);

/// Whether copying is on, and which kinds the hub operator allows (`--copyable-kinds`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copying {
    /// The `EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM` gate.
    pub enabled: bool,
    /// Kinds `downstreamResources` may name.
    pub allowed: Vec<CopyableKind>,
}

impl Copying {
    /// Copying on or off, with the default kinds (Secret, ConfigMap).
    pub fn defaults(enabled: bool) -> Self {
        Self {
            enabled,
            allowed: CopyableKind::parse_list(tender_types::copy::DEFAULT_COPYABLE_KINDS)
                .expect("defaults parse"),
        }
    }
}

/// One copy of a source into a cluster namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredCopy {
    /// Kind of the object written on the hub: the source's own kind for Secrets and
    /// ConfigMaps, `Secret` for the carrier of any other kind.
    pub kind: SourceKind,
    /// Kind of the source.
    pub source_kind: CopyableKind,
    /// Name of the source in the Bundle's namespace.
    pub source: String,
    /// Name of the copy in the cluster namespace ([`names::copy_name`]).
    pub copy_name: String,
    /// Content hash of the source.
    pub hash: String,
}

/// The BundleDeployment for one targeted cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredDeployment {
    /// Name of the Cluster.
    pub cluster: String,
    /// The cluster namespace on the hub.
    pub namespace: String,
    /// This cluster's part of the spec to write ([`Plan::spec`] adds the manifests); `None`
    /// while a source it needs is missing (nothing is written for this cluster, and what is
    /// already there stays, so the agent never deploys manifests before their copies exist).
    pub spec: Option<DesiredSpec>,
    /// Copies this deployment needs (empty when blocked or the copy feature is off).
    pub copies: Vec<DesiredCopy>,
}

/// What a cluster's BundleDeployment spec holds of its own: all but the Bundle's manifests and
/// Helm options, which are the same for every cluster and held once, in the [`Plan`]
/// (decision 61: a clone per cluster was most of a Bundle reconcile's memory).
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredSpec {
    /// `deploymentID`: [`hash::deployment_id_with_helm`] of the manifests, options and chart.
    pub deployment_id: String,
    /// The Bundle or the Cluster is paused.
    pub paused: bool,
    /// Namespaces, flags and the copies with their content hashes.
    pub options: BundleDeploymentOptions,
}

/// Everything a Bundle should have, and why not, when it cannot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Names of every cluster a target selects (deleting clusters excluded by the caller).
    pub matched: Vec<String>,
    /// One entry per matched cluster whose namespace is provisioned.
    pub deployments: Vec<DesiredDeployment>,
    /// Missing sources that a matched cluster needs, as `Kind/name`.
    pub missing: BTreeSet<String>,
    /// Entries with a kind the hub operator does not allow, as `Kind/name`.
    pub unsupported: BTreeSet<String>,
    /// `downstreamResources` are set (for a matched cluster) but the copy feature is off.
    pub copy_disabled: bool,
    /// Number of copies across all deployments.
    pub copies: usize,
    /// The Bundle's manifests, the same in every BundleDeployment.
    pub resources: Vec<Manifest>,
    /// The Bundle's Helm options, the same in every BundleDeployment.
    pub helm: Option<HelmOptions>,
}

impl Plan {
    /// The whole spec to write for `d`, made when it is written (`None` while it is blocked).
    pub fn spec(&self, d: &DesiredDeployment) -> Option<BundleDeploymentSpec> {
        let s = d.spec.as_ref()?;
        Some(BundleDeploymentSpec {
            deployment_id: s.deployment_id.clone(),
            paused: s.paused,
            options: s.options.clone(),
            resources: self.resources.clone(),
            helm: self.helm.clone(),
        })
    }
}

/// Every source any target of `spec` may copy (all targets, matched or not), so a source
/// event reaches the Bundle whatever the current targeting.
pub fn referenced_sources(spec: &BundleSpec) -> BTreeSet<SourceKey> {
    spec.downstream_resources
        .iter()
        .chain(
            spec.targets
                .iter()
                .filter_map(|t| t.downstream_resources.as_ref())
                .flatten(),
        )
        .map(|r| (entry_kind(r), r.name.clone()))
        .collect()
}

/// The kind an entry names.
pub fn entry_kind(r: &DownstreamResource) -> CopyableKind {
    CopyableKind {
        api_version: r.api_version().to_string(),
        kind: r.kind.clone(),
    }
}

fn display(r: &DownstreamResource) -> String {
    format!("{}/{}", r.kind, r.name)
}

/// Plans the BundleDeployments and copies of Bundle `bundle_name`.
///
/// `sources` holds the state of every source the matched clusters need (when `copy_enabled`);
/// a source absent from the map counts as missing.
pub fn plan(
    bundle_name: &str,
    spec: &BundleSpec,
    clusters: &[ClusterView<'_>],
    groups: &[GroupInfo<'_>],
    sources: &BTreeMap<SourceKey, SourceState>,
    copying: &Copying,
) -> Result<Plan, TargetingError> {
    let copy_enabled = copying.enabled;
    let infos: Vec<ClusterInfo<'_>> = clusters
        .iter()
        .map(|c| ClusterInfo {
            name: c.name,
            labels: c.labels,
        })
        .collect();
    let matches = targeting::match_targets(spec, &infos, groups)?;
    let by_name: BTreeMap<&str, &ClusterView<'_>> = clusters.iter().map(|c| (c.name, c)).collect();

    let mut plan = Plan {
        resources: spec.resources.clone(),
        helm: spec.helm.clone(),
        ..Plan::default()
    };
    for m in matches {
        let cluster = by_name[m.cluster.as_str()];
        plan.matched.push(m.cluster.clone());
        // Still waiting for its namespace: the Cluster's status event brings us back.
        let Some(namespace) = cluster.namespace else {
            continue;
        };
        let resolved = m.resolved;
        let mut copies = Vec::new();
        let mut blocked = false;
        if !resolved.downstream_resources.is_empty() && !copy_enabled {
            plan.copy_disabled = true;
        }
        if copy_enabled {
            for entry in &resolved.downstream_resources {
                let source_kind = entry_kind(entry);
                if !copying.allowed.contains(&source_kind) {
                    plan.unsupported.insert(display(entry));
                    blocked = true;
                    continue;
                }
                // Any kind but a Secret/ConfigMap travels in a carrier Secret.
                let kind = source_kind.source_kind().unwrap_or(SourceKind::Secret);
                match sources.get(&(source_kind.clone(), entry.name.clone())) {
                    Some(SourceState::Found { hash }) => copies.push(DesiredCopy {
                        kind,
                        source_kind: source_kind.clone(),
                        source: entry.name.clone(),
                        copy_name: names::copy_name(bundle_name, &entry.kind, &entry.name),
                        hash: hash.clone(),
                    }),
                    Some(SourceState::Missing) | None => {
                        plan.missing.insert(display(entry));
                        blocked = true;
                    }
                }
            }
        }
        if blocked {
            plan.deployments.push(DesiredDeployment {
                cluster: m.cluster,
                namespace: namespace.to_string(),
                spec: None,
                copies: Vec::new(),
            });
            continue;
        }
        let mut downstream: Vec<CopiedResource> = copies
            .iter()
            .map(|c| CopiedResource {
                api_version: (c.source_kind.source_kind().is_none())
                    .then(|| c.source_kind.api_version.clone()),
                kind: c.source_kind.kind.clone(),
                name: c.source.clone(),
                copy_name: c.copy_name.clone(),
                hash: c.hash.clone(),
            })
            .collect();
        downstream.sort();
        let options = BundleDeploymentOptions {
            default_namespace: namespaces::default_namespace(resolved.default_namespace.as_deref())
                .to_string(),
            target_namespace: resolved.target_namespace.clone(),
            target_namespaces: resolved.target_namespaces.clone(),
            target_namespace_selector: resolved.target_namespace_selector.clone(),
            keep_resources: resolved.keep_resources,
            take_ownership: spec.take_ownership,
            correct_drift: spec.correct_drift_enabled(),
            downstream_resources: downstream,
        };
        let bd_spec = DesiredSpec {
            deployment_id: hash::deployment_id_with_helm(
                &spec.resources,
                &options,
                spec.helm.as_ref(),
            ),
            paused: spec.paused || cluster.paused,
            options,
        };
        plan.copies += copies.len();
        plan.deployments.push(DesiredDeployment {
            cluster: m.cluster,
            namespace: namespace.to_string(),
            spec: Some(bd_spec),
            copies,
        });
    }
    Ok(plan)
}

/// A copy's content fields, as top-level keys of a `managedFields` entry.
const CONTENT: [&str; 5] = [
    "f:data",
    "f:binaryData",
    "f:stringData",
    "f:type",
    "f:immutable",
];

/// Whether a copy's content fields were written by someone other than the hub (read from
/// `managedFields`, which the metadata-only cache has): such a copy no longer matches its
/// content-hash annotation and is recreated rather than trusted.
pub fn edited_by_others(meta: &kube::api::ObjectMeta) -> bool {
    meta.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() != Some(tender_types::labels::HUB_FIELD_MANAGER)
            && m.fields_v1
                .as_ref()
                .and_then(|f| f.0.as_object())
                .is_some_and(|fields| CONTENT.iter().any(|k| fields.contains_key(*k)))
    })
}

/// Trims a cached copy's `managedFields` to what [`edited_by_others`] reads: the entries of
/// other managers, each reduced to the content keys it owns (usually nothing is left).
pub fn keep_content_managers(meta: &mut kube::api::ObjectMeta) {
    let Some(entries) = meta.managed_fields.take() else {
        return;
    };
    let kept: Vec<_> = entries
        .into_iter()
        .filter(|m| m.manager.as_deref() != Some(tender_types::labels::HUB_FIELD_MANAGER))
        .filter_map(|mut m| {
            let fields = m.fields_v1.as_ref().and_then(|f| f.0.as_object())?;
            let content: serde_json::Map<String, serde_json::Value> = CONTENT
                .iter()
                .filter(|k| fields.contains_key(**k))
                .map(|k| (k.to_string(), serde_json::json!({})))
                .collect();
            if content.is_empty() {
                return None;
            }
            m.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                content.into(),
            ));
            Some(m)
        })
        .collect();
    meta.managed_fields = (!kept.is_empty()).then_some(kept);
}

#[cfg(test)]
mod tests {
    use super::*;
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
    }

    impl World {
        fn new(n: usize) -> Self {
            let names = (0..n).map(|i| format!("c{i}")).collect();
            let labels = (0..n)
                .map(|i| labels(&[("env", if i % 2 == 0 { "prod" } else { "dev" })]))
                .collect();
            Self { labels, names }
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
        SourceState::Found { hash: hash.into() }
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
            [("ConfigMap", "conf", "h2"), ("Secret", "creds", "h1")]
        );
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
    fn rotation_changes_deployment_id_only() {
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
        assert_ne!(b.deployment_id, a.deployment_id);
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
        assert_eq!(entry.hash, "hp");
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
}
