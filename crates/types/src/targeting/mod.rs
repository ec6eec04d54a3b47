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
mod tests;
