//! Which clusters a Bundle goes to, and with which per-target overrides.
//!
//! Semantics:
//! - Targets are tried in order; a cluster is deployed once, with the first target that
//!   selects it, even if several targets or several of its groups select it.
//! - `clusterName` selects the Cluster with that name.
//! - `clusterSelector` selects Clusters whose labels match; `{}` selects every Cluster.
//! - `clusterGroup` selects the Clusters of the named group; a missing group selects nothing.
//! - `clusterGroupSelector` selects the Clusters of every group whose labels match; `{}`
//!   selects the Clusters of every group (and those in no group, see below).
//! - A group's `selector` matches Cluster labels; `{}` matches every Cluster.
//! - A target may set several of these (as in Fleet): all must hold, and `clusterGroup` with
//!   `clusterGroupSelector` must hold for the same group. A target that sets none selects
//!   nothing. A cluster in no group is judged as in one group with no name and no labels
//!   (Fleet's rule), so `clusterGroupSelector: {}` selects it too. See [`criteria_select`].
//! - Paused clusters are matched like any other: pausing is the hub's concern.
//! - A cluster whose first matching target has `doNotDeploy` is not matched at all (Fleet's
//!   rule): no later target selects it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::bundle::{BundleSpec, BundleTarget, DownstreamResource};

/// A label selector that cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The operator is not In, NotIn, Exists or DoesNotExist.
    #[error(
        "label selector requirement on {key:?} has invalid operator {operator:?} (use In, NotIn, Exists or DoesNotExist)"
    )]
    InvalidOperator {
        /// The requirement's key.
        key: String,
        /// The invalid operator.
        operator: String,
    },
    /// In/NotIn without values.
    #[error(
        "label selector requirement on {key:?} with operator {operator} needs at least one value"
    )]
    MissingValues {
        /// The requirement's key.
        key: String,
        /// The operator.
        operator: String,
    },
    /// Exists/DoesNotExist with values.
    #[error("label selector requirement on {key:?} with operator {operator} must not have values")]
    UnexpectedValues {
        /// The requirement's key.
        key: String,
        /// The operator.
        operator: String,
    },
}

/// A target whose selector is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetingError {
    /// A target's own selector is invalid.
    #[error("targets[{index}]: {source}")]
    Target {
        /// Index of the target in `spec.targets`.
        index: usize,
        /// What is wrong.
        source: SelectorError,
    },
    /// A rollout partition's own selector is invalid.
    #[error("rolloutStrategy.partitions[{index}]: {source}")]
    Partition {
        /// Index of the partition in `spec.rolloutStrategy.partitions`.
        index: usize,
        /// What is wrong.
        source: SelectorError,
    },
    /// A ClusterGroup's selector is invalid.
    #[error("ClusterGroup {group}: {source}")]
    Group {
        /// Name of the group.
        group: String,
        /// What is wrong.
        source: SelectorError,
    },
}

/// A Cluster as targeting sees it.
#[derive(Debug, Clone, Copy)]
pub struct ClusterInfo<'a> {
    /// Name of the Cluster.
    pub name: &'a str,
    /// Labels of the Cluster.
    pub labels: &'a BTreeMap<String, String>,
}

/// A ClusterGroup as targeting sees it.
#[derive(Debug, Clone, Copy)]
pub struct GroupInfo<'a> {
    /// Name of the group.
    pub name: &'a str,
    /// Labels of the group (what `clusterGroupSelector` matches).
    pub labels: &'a BTreeMap<String, String>,
    /// The group's selector over Cluster labels.
    pub selector: &'a LabelSelector,
}

/// A Bundle's options resolved for one target: target overrides replace Bundle values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResolvedTarget {
    /// Effective `targetNamespace`.
    pub target_namespace: Option<String>,
    /// Effective `defaultNamespace` (not yet defaulted to `default`).
    pub default_namespace: Option<String>,
    /// Effective `targetNamespaces`.
    pub target_namespaces: Vec<String>,
    /// Effective `targetNamespaceSelector`.
    pub target_namespace_selector: Option<LabelSelector>,
    /// Effective `downstreamResources` (a target's list replaces the Bundle's).
    pub downstream_resources: Vec<DownstreamResource>,
    /// Effective `keepResources`.
    pub keep_resources: bool,
    /// The target's `helm`, to merge over the Bundle's ([`crate::customize::merge_helm`]).
    pub helm: Option<crate::customize::HelmOverride>,
    /// Effective `namespaceLabels` (the target's set over the Bundle's).
    pub namespace_labels: BTreeMap<String, String>,
    /// Effective `namespaceAnnotations` (the target's set over the Bundle's).
    pub namespace_annotations: BTreeMap<String, String>,
}

/// A cluster selected by a Bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    /// Name of the Cluster.
    pub cluster: String,
    /// Index in `spec.targets` of the first target that selected it.
    pub target_index: usize,
    /// Options with that target's overrides applied.
    pub resolved: ResolvedTarget,
}

/// Applies a target's overrides to the Bundle's options.
pub fn resolve_target(spec: &BundleSpec, target: &BundleTarget) -> ResolvedTarget {
    ResolvedTarget {
        // Fleet's `namespace` is the same field as tender's `targetNamespace` (one of each).
        target_namespace: target
            .target_namespace
            .clone()
            .or_else(|| target.namespace.clone())
            .or_else(|| spec.target_namespace.clone())
            .or_else(|| spec.namespace.clone()),
        default_namespace: target
            .default_namespace
            .clone()
            .or_else(|| spec.default_namespace.clone()),
        target_namespaces: target
            .target_namespaces
            .clone()
            .unwrap_or_else(|| spec.target_namespaces.clone()),
        target_namespace_selector: target
            .target_namespace_selector
            .clone()
            .or_else(|| spec.target_namespace_selector.clone()),
        downstream_resources: target
            .downstream_resources
            .clone()
            .unwrap_or_else(|| spec.downstream_resources.clone()),
        keep_resources: target.keep_resources.unwrap_or(spec.keep_resources),
        helm: target.helm.clone(),
        namespace_labels: over(&spec.namespace_labels, &target.namespace_labels),
        namespace_annotations: over(&spec.namespace_annotations, &target.namespace_annotations),
    }
}

fn over(
    base: &BTreeMap<String, String>,
    top: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut m = base.clone();
    m.extend(top.iter().map(|(k, v)| (k.clone(), v.clone())));
    m
}

/// The clusters a Bundle selects, each once, in the order of `clusters`.
///
/// Fails on the first invalid selector (of a target, or of a group a target refers to), since
/// silently skipping it could untarget clusters.
pub fn match_targets(
    spec: &BundleSpec,
    clusters: &[ClusterInfo<'_>],
    groups: &[GroupInfo<'_>],
) -> Result<Vec<Match>, TargetingError> {
    let mut matches = Vec::new();
    for cluster in clusters {
        for (index, target) in spec.targets.iter().enumerate() {
            if target_selects(index, target, cluster, groups)? {
                // First match wins: a doNotDeploy target keeps the cluster from later ones.
                if target.do_not_deploy {
                    break;
                }
                matches.push(Match {
                    cluster: cluster.name.to_string(),
                    target_index: index,
                    resolved: resolve_target(spec, target),
                });
                break;
            }
        }
    }
    Ok(matches)
}

fn target_selects(
    index: usize,
    target: &BundleTarget,
    cluster: &ClusterInfo<'_>,
    groups: &[GroupInfo<'_>],
) -> Result<bool, TargetingError> {
    criteria_select(&Criteria::of_target(target), cluster, groups)
        .map_err(|e| e.into_targeting(|source| TargetingError::Target { index, source }))
}

/// The selector fields of a target or of a rollout partition.
#[derive(Debug, Clone, Copy, Default)]
pub struct Criteria<'a> {
    /// `clusterName`.
    pub cluster_name: Option<&'a str>,
    /// `clusterSelector`.
    pub cluster_selector: Option<&'a LabelSelector>,
    /// `clusterGroup`.
    pub cluster_group: Option<&'a str>,
    /// `clusterGroupSelector`.
    pub cluster_group_selector: Option<&'a LabelSelector>,
}

impl<'a> Criteria<'a> {
    /// The selector fields of a Bundle target.
    pub fn of_target(t: &'a BundleTarget) -> Self {
        Self {
            cluster_name: t.cluster_name.as_deref(),
            cluster_selector: t.cluster_selector.as_ref(),
            cluster_group: t.cluster_group.as_deref(),
            cluster_group_selector: t.cluster_group_selector.as_ref(),
        }
    }

    /// The selector fields of a rollout partition.
    pub fn of_partition(p: &'a crate::rollout::Partition) -> Self {
        Self {
            cluster_name: p.cluster_name.as_deref(),
            cluster_selector: p.cluster_selector.as_ref(),
            cluster_group: p.cluster_group.as_deref(),
            cluster_group_selector: p.cluster_group_selector.as_ref(),
        }
    }

    /// Whether no field is set (such a target or partition selects nothing).
    pub fn is_empty(&self) -> bool {
        self.cluster_name.is_none()
            && self.cluster_selector.is_none()
            && self.cluster_group.is_none()
            && self.cluster_group_selector.is_none()
    }
}

/// Why [`criteria_select`] could not decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriteriaError {
    /// The target's (or partition's) own selector is invalid.
    Own(SelectorError),
    /// A ClusterGroup's selector is invalid.
    Group {
        /// Name of the group.
        group: String,
        /// What is wrong.
        source: SelectorError,
    },
}

impl CriteriaError {
    /// As a [`TargetingError`], the caller saying whose own selector it was.
    pub fn into_targeting(
        self,
        own: impl FnOnce(SelectorError) -> TargetingError,
    ) -> TargetingError {
        match self {
            Self::Own(source) => own(source),
            Self::Group { group, source } => TargetingError::Group { group, source },
        }
    }
}

impl std::fmt::Display for CriteriaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Own(source) => write!(f, "{source}"),
            Self::Group { group, source } => write!(f, "ClusterGroup {group}: {source}"),
        }
    }
}

/// Whether `criteria` select `cluster`: Fleet's matcher (`ClusterMatcher`). Every field that
/// is set must hold (an AND); with none set nothing is selected. `clusterName` and
/// `clusterSelector` look at the cluster; `clusterGroup` and `clusterGroupSelector` must both
/// hold for one and the same group the cluster is in (a group whose selector matches its
/// labels). A cluster in no group is judged as in one group with no name and no labels, as
/// Fleet does: `clusterGroupSelector: {}` (or one only of `DoesNotExist`/`NotIn`) selects it,
/// `clusterGroup` never does.
pub fn criteria_select(
    criteria: &Criteria<'_>,
    cluster: &ClusterInfo<'_>,
    groups: &[GroupInfo<'_>],
) -> Result<bool, CriteriaError> {
    if criteria.is_empty() {
        return Ok(false);
    }
    if criteria.cluster_name.is_some_and(|n| n != cluster.name) {
        return Ok(false);
    }
    if let Some(s) = criteria.cluster_selector
        && !selector_matches(s, cluster.labels).map_err(CriteriaError::Own)?
    {
        return Ok(false);
    }
    if criteria.cluster_group.is_none() && criteria.cluster_group_selector.is_none() {
        return Ok(true);
    }
    let member = |g: &GroupInfo<'_>| {
        selector_matches(g.selector, cluster.labels).map_err(|source| CriteriaError::Group {
            group: g.name.to_string(),
            source,
        })
    };
    let group_fields_hold = |name: &str, labels: &BTreeMap<String, String>| {
        if criteria.cluster_group.is_some_and(|g| g != name) {
            return Ok(false);
        }
        match criteria.cluster_group_selector {
            Some(s) => selector_matches(s, labels).map_err(CriteriaError::Own),
            None => Ok(true),
        }
    };
    // Only the groups the fields accept are asked whether the cluster is a member, so an
    // invalid selector of an unrelated group does not fail this target.
    for g in groups {
        if group_fields_hold(g.name, g.labels)? && member(g)? {
            return Ok(true);
        }
    }
    if !group_fields_hold("", &BTreeMap::new())? {
        return Ok(false);
    }
    // The fields would accept "no group": they hold when the cluster is in none.
    for g in groups {
        if member(g)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `labels` satisfy `selector` (all matchLabels and all matchExpressions).
///
/// An empty selector matches everything. Errors on an unknown operator, on In/NotIn without
/// values and on Exists/DoesNotExist with values, like the apiserver's own validation.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    // Validate every requirement first, so an invalid selector is reported whatever the labels.
    for req in selector.match_expressions.iter().flatten() {
        validate_requirement(req)?;
    }
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector
        .match_expressions
        .iter()
        .flatten()
        .all(|req| requirement_matches(req, labels));
    Ok(labels_ok && exprs_ok)
}

fn validate_requirement(req: &LabelSelectorRequirement) -> Result<(), SelectorError> {
    let has_values = req.values.as_ref().is_some_and(|v| !v.is_empty());
    let (key, operator) = (req.key.clone(), req.operator.clone());
    match req.operator.as_str() {
        "In" | "NotIn" if !has_values => Err(SelectorError::MissingValues { key, operator }),
        "Exists" | "DoesNotExist" if has_values => {
            Err(SelectorError::UnexpectedValues { key, operator })
        }
        "In" | "NotIn" | "Exists" | "DoesNotExist" => Ok(()),
        _ => Err(SelectorError::InvalidOperator { key, operator }),
    }
}

fn requirement_matches(req: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&req.key);
    let in_values = |v: &String| req.values.iter().flatten().any(|x| x == v);
    match req.operator.as_str() {
        "In" => value.is_some_and(in_values),
        "NotIn" => !value.is_some_and(in_values),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(pairs)),
            ..LabelSelector::default()
        }
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn exprs(reqs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(reqs),
            ..LabelSelector::default()
        }
    }

    struct World {
        clusters: Vec<(String, BTreeMap<String, String>)>,
        groups: Vec<(String, BTreeMap<String, String>, LabelSelector)>,
    }

    impl World {
        fn new() -> Self {
            Self {
                clusters: vec![
                    (
                        "east".into(),
                        labels(&[("env", "prod"), ("region", "east")]),
                    ),
                    (
                        "west".into(),
                        labels(&[("env", "prod"), ("region", "west")]),
                    ),
                    ("dev".into(), labels(&[("env", "dev")])),
                ],
                groups: vec![
                    (
                        "prod".into(),
                        labels(&[("tier", "gold")]),
                        match_labels(&[("env", "prod")]),
                    ),
                    (
                        "east".into(),
                        labels(&[("tier", "gold")]),
                        match_labels(&[("region", "east")]),
                    ),
                    ("all".into(), labels(&[]), LabelSelector::default()),
                ],
            }
        }

        fn run(&self, targets: Vec<BundleTarget>) -> Result<Vec<(String, usize)>, TargetingError> {
            let clusters: Vec<_> = self
                .clusters
                .iter()
                .map(|(name, labels)| ClusterInfo { name, labels })
                .collect();
            let groups: Vec<_> = self
                .groups
                .iter()
                .map(|(name, labels, selector)| GroupInfo {
                    name,
                    labels,
                    selector,
                })
                .collect();
            let spec = BundleSpec {
                targets,
                ..BundleSpec::default()
            };
            Ok(match_targets(&spec, &clusters, &groups)?
                .into_iter()
                .map(|m| (m.cluster, m.target_index))
                .collect())
        }
    }

    fn names(result: &[(String, usize)]) -> Vec<&str> {
        result.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn by_selector(selector: LabelSelector) -> BundleTarget {
        BundleTarget {
            cluster_selector: Some(selector),
            ..BundleTarget::default()
        }
    }

    fn by_group(group: &str) -> BundleTarget {
        BundleTarget {
            cluster_group: Some(group.into()),
            ..BundleTarget::default()
        }
    }

    #[test]
    fn empty_selector_matches_every_cluster() {
        let got = World::new()
            .run(vec![by_selector(LabelSelector::default())])
            .unwrap();
        assert_eq!(names(&got), ["east", "west", "dev"]);
        assert!(selector_matches(&LabelSelector::default(), &labels(&[])).unwrap());
    }

    #[test]
    fn target_without_criteria_matches_nothing() {
        assert!(
            World::new()
                .run(vec![BundleTarget::default()])
                .unwrap()
                .is_empty()
        );
        assert!(World::new().run(vec![]).unwrap().is_empty());
    }

    #[test]
    fn cluster_name_selects_one() {
        let target = BundleTarget {
            cluster_name: Some("west".into()),
            ..BundleTarget::default()
        };
        assert_eq!(names(&World::new().run(vec![target]).unwrap()), ["west"]);
    }

    #[test]
    fn match_labels_select_subset() {
        let got = World::new()
            .run(vec![by_selector(match_labels(&[("env", "prod")]))])
            .unwrap();
        assert_eq!(names(&got), ["east", "west"]);
    }

    #[test]
    fn overlapping_targets_first_wins() {
        let got = World::new()
            .run(vec![
                by_selector(match_labels(&[("region", "east")])),
                by_selector(match_labels(&[("env", "prod")])),
                by_selector(LabelSelector::default()),
            ])
            .unwrap();
        assert_eq!(
            got,
            [
                ("east".to_string(), 0),
                ("west".to_string(), 1),
                ("dev".to_string(), 2)
            ]
        );
    }

    #[test]
    fn cluster_in_several_groups_matched_once() {
        // east is in groups prod, east and all.
        let gold = BundleTarget {
            cluster_group_selector: Some(match_labels(&[("tier", "gold")])),
            ..BundleTarget::default()
        };
        let got = World::new().run(vec![gold, by_group("all")]).unwrap();
        assert_eq!(
            got,
            [
                ("east".to_string(), 0),
                ("west".to_string(), 0),
                ("dev".to_string(), 1)
            ]
        );
    }

    #[test]
    fn empty_group_selector_selects_every_group() {
        let any_group = BundleTarget {
            cluster_group_selector: Some(LabelSelector::default()),
            ..BundleTarget::default()
        };
        assert_eq!(
            names(&World::new().run(vec![any_group]).unwrap()),
            ["east", "west", "dev"]
        );
    }

    fn target(v: serde_json::Value) -> BundleTarget {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn several_fields_must_all_hold() {
        let w = World::new();
        let got = w
            .run(vec![target(serde_json::json!({
                "clusterSelector": {"matchLabels": {"env": "prod"}},
                "clusterGroup": "east"
            }))])
            .unwrap();
        assert_eq!(names(&got), ["east"]);
        let got = w
            .run(vec![target(serde_json::json!({
                "clusterName": "west", "clusterSelector": {"matchLabels": {"env": "dev"}}
            }))])
            .unwrap();
        assert!(got.is_empty(), "name and selector disagree: nothing");
        let got = w
            .run(vec![target(serde_json::json!({
                "clusterName": "dev", "clusterGroupSelector": {}
            }))])
            .unwrap();
        assert_eq!(names(&got), ["dev"]);
    }

    #[test]
    fn group_name_and_group_selector_hold_for_the_same_group() {
        // east is in prod (tier gold), east (tier gold) and all (no labels).
        let w = World::new();
        let same = w
            .run(vec![target(serde_json::json!({
                "clusterGroup": "east", "clusterGroupSelector": {"matchLabels": {"tier": "gold"}}
            }))])
            .unwrap();
        assert_eq!(names(&same), ["east"]);
        let different = w
            .run(vec![target(serde_json::json!({
                "clusterGroup": "all", "clusterGroupSelector": {"matchLabels": {"tier": "gold"}}
            }))])
            .unwrap();
        assert!(
            different.is_empty(),
            "group all has no tier label: Fleet matches per group, not per field"
        );
    }

    #[test]
    fn a_cluster_in_no_group_is_judged_as_in_an_unnamed_unlabelled_one() {
        let w = World {
            groups: vec![(
                "prod".into(),
                labels(&[("tier", "gold")]),
                match_labels(&[("env", "prod")]),
            )],
            ..World::new()
        };
        let any = w
            .run(vec![target(
                serde_json::json!({"clusterGroupSelector": {}}),
            )])
            .unwrap();
        assert_eq!(names(&any), ["east", "west", "dev"], "Fleet's rule");
        let not_gold = w
            .run(vec![target(serde_json::json!({"clusterGroupSelector": {
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]
            }}))])
            .unwrap();
        assert_eq!(names(&not_gold), ["dev"]);
        let gold = w
            .run(vec![target(
                serde_json::json!({"clusterGroupSelector": {"matchLabels": {"tier": "gold"}}}),
            )])
            .unwrap();
        assert_eq!(names(&gold), ["east", "west"]);
        assert_eq!(
            names(&w.run(vec![by_group("prod")]).unwrap()),
            ["east", "west"],
            "clusterGroup never selects a cluster in no group"
        );
    }

    #[test]
    fn named_group_and_missing_group() {
        assert_eq!(
            names(&World::new().run(vec![by_group("prod")]).unwrap()),
            ["east", "west"]
        );
        assert!(
            World::new()
                .run(vec![by_group("missing")])
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn match_expressions() {
        let l = labels(&[("env", "prod"), ("region", "east")]);
        let check = |reqs| selector_matches(&exprs(reqs), &l).unwrap();
        assert!(check(vec![expr("env", "In", &["prod", "dev"])]));
        assert!(!check(vec![expr("env", "In", &["dev"])]));
        assert!(!check(vec![expr("missing", "In", &["x"])]));
        assert!(check(vec![expr("env", "NotIn", &["dev"])]));
        assert!(!check(vec![expr("env", "NotIn", &["prod"])]));
        assert!(check(vec![expr("missing", "NotIn", &["x"])]));
        assert!(check(vec![expr("region", "Exists", &[])]));
        assert!(!check(vec![expr("missing", "Exists", &[])]));
        assert!(check(vec![expr("missing", "DoesNotExist", &[])]));
        assert!(!check(vec![expr("env", "DoesNotExist", &[])]));
        // All requirements and matchLabels must hold.
        assert!(!check(vec![
            expr("env", "In", &["prod"]),
            expr("region", "In", &["west"])
        ]));
        let mut both = match_labels(&[("env", "prod")]);
        both.match_expressions = Some(vec![expr("region", "NotIn", &["east"])]);
        assert!(!selector_matches(&both, &l).unwrap());
    }

    #[test]
    fn invalid_selectors_are_errors() {
        let l = labels(&[]);
        assert!(matches!(
            selector_matches(&exprs(vec![expr("a", "Equals", &["x"])]), &l),
            Err(SelectorError::InvalidOperator { .. })
        ));
        assert!(matches!(
            selector_matches(&exprs(vec![expr("a", "In", &[])]), &l),
            Err(SelectorError::MissingValues { .. })
        ));
        assert!(matches!(
            selector_matches(&exprs(vec![expr("a", "Exists", &["x"])]), &l),
            Err(SelectorError::UnexpectedValues { .. })
        ));
        let err = World::new()
            .run(vec![by_selector(exprs(vec![expr("a", "Bogus", &[])]))])
            .unwrap_err();
        assert!(err.to_string().starts_with("targets[0]: "), "{err}");
        assert!(err.to_string().contains("Bogus"), "{err}");
    }

    #[test]
    fn invalid_group_selector_is_reported_with_group() {
        let mut world = World::new();
        world.groups.push((
            "broken".into(),
            labels(&[]),
            exprs(vec![expr("a", "Nope", &[])]),
        ));
        let err = world.run(vec![by_group("broken")]).unwrap_err();
        assert!(
            matches!(err, TargetingError::Group { ref group, .. } if group == "broken"),
            "{err}"
        );
    }

    #[test]
    fn target_overrides_replace_bundle_options() {
        let spec = BundleSpec {
            default_namespace: Some("d".into()),
            target_namespace: Some("t".into()),
            keep_resources: false,
            downstream_resources: vec![DownstreamResource {
                api_version: None,
                kind: "Secret".into(),
                name: "a".into(),
            }],
            ..BundleSpec::default()
        };
        let plain = resolve_target(&spec, &BundleTarget::default());
        assert_eq!(plain.target_namespace.as_deref(), Some("t"));
        assert_eq!(plain.default_namespace.as_deref(), Some("d"));
        assert_eq!(plain.downstream_resources.len(), 1);
        assert!(!plain.keep_resources);

        let overriding = BundleTarget {
            target_namespace: Some("t2".into()),
            default_namespace: Some("d2".into()),
            downstream_resources: Some(vec![]),
            keep_resources: Some(true),
            ..BundleTarget::default()
        };
        let resolved = resolve_target(&spec, &overriding);
        assert_eq!(resolved.target_namespace.as_deref(), Some("t2"));
        assert_eq!(resolved.default_namespace.as_deref(), Some("d2"));
        assert!(resolved.downstream_resources.is_empty());
        assert!(resolved.keep_resources);
    }

    #[test]
    fn fleets_namespace_is_target_namespace() {
        let fleet = |v: serde_json::Value| -> BundleSpec { serde_json::from_value(v).unwrap() };
        let spec = fleet(serde_json::json!({"namespace": "app", "targets": [
            {"clusterName": "a"},
            {"clusterName": "b", "namespace": "b-app"},
            {"clusterName": "c", "targetNamespace": "c-app"}
        ]}));
        let ns = |i: usize| resolve_target(&spec, &spec.targets[i]).target_namespace;
        assert_eq!(ns(0).as_deref(), Some("app"));
        assert_eq!(ns(1).as_deref(), Some("b-app"));
        assert_eq!(ns(2).as_deref(), Some("c-app"));
        let tender =
            fleet(serde_json::json!({"targetNamespace": "t", "targets": [{"clusterName": "a"}]}));
        assert_eq!(
            resolve_target(&tender, &tender.targets[0])
                .target_namespace
                .as_deref(),
            Some("t")
        );
    }
}
