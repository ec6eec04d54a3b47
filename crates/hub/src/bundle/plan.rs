//! What a Bundle should have written for it: one BundleDeployment per targeted cluster and one
//! copy per downstream resource. Pure: unit tests call it with plain values.

use std::collections::{BTreeMap, BTreeSet};

use tender_types::copy::CopyableKind;
use tender_types::targeting::{self, ClusterInfo, GroupInfo, TargetingError};
use tender_types::{
    BundleDeploymentOptions, BundleDeploymentSpec, BundleSpec, CopiedResource, DownstreamResource,
    HelmOptions, Manifest, SourceKind, hash, names, namespaces,
};
use tender_types::{customize, template};

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
    /// The Cluster's own namespace (the workspace): `.ClusterNamespace` in values templates.
    pub workspace: &'a str,
    /// Its annotations (`.ClusterAnnotations`).
    pub annotations: &'a BTreeMap<String, String>,
    /// Its `spec.templateValues` (`.ClusterValues`).
    pub template_values: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// What the hub knows about one referenced source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceState {
    /// The source exists; its content hash.
    Found {
        /// [`tender_types::hash::secret_hash`] or [`tender_types::hash::config_map_hash`].
        hash: String,
        /// Bytes of content one copy of it holds on the hub.
        bytes: usize,
    },
    /// No such object in the Bundle's namespace.
    Missing,
    /// It exists but is never copied: a Secret a Cluster names (a push kubeconfig) or a
    /// ServiceAccount token (decision 0075-credentials-never-copied).
    Refused,
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
    /// Bytes of content the copy holds.
    pub bytes: usize,
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
/// (decision 0061-bundle-reconcile-holds-manifests-once: a clone per cluster was most of a Bundle
/// reconcile's memory).
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredSpec {
    /// `deploymentID`: [`hash::deployment_id_with_helm`] of the manifests, options and chart.
    pub deployment_id: String,
    /// The Bundle or the Cluster is paused.
    pub paused: bool,
    /// Namespaces, flags and the copies with their content hashes.
    pub options: BundleDeploymentOptions,
    /// This cluster's chart when it differs from the Plan's (a target's `helm`, templated
    /// values); `None`: the Plan's.
    pub helm: Option<HelmOptions>,
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
    /// Sources that exist but are never copied (decision 0075-credentials-never-copied), as
    /// `Kind/name`.
    pub refused: BTreeSet<String>,
    /// Entries with a kind the hub operator does not allow, as `Kind/name`.
    pub unsupported: BTreeSet<String>,
    /// `downstreamResources` are set (for a matched cluster) but the copy feature is off.
    pub copy_disabled: bool,
    /// Number of copies across all deployments.
    pub copies: usize,
    /// Bytes of content those copies hold on the hub (each copy counted).
    pub copied_bytes: usize,
    /// The Bundle's manifests, the same in every BundleDeployment.
    pub resources: Vec<Manifest>,
    /// The Bundle's Helm options (in tender's chart form), what a BundleDeployment gets unless
    /// its cluster's differ ([`DesiredSpec::helm`]).
    pub helm: Option<HelmOptions>,
    /// Clusters whose values template failed (`cluster: path: why`), sorted: nothing new is
    /// written for them, what they have stays.
    pub template_failed: Vec<String>,
}

impl Plan {
    /// The cluster namespaces (in workspace `ns`) of every matched cluster.
    pub fn matched_namespaces(&self, ns: &str) -> BTreeSet<String> {
        self.matched
            .iter()
            .map(|c| tender_types::names::cluster_namespace(ns, c))
            .collect()
    }

    /// Holds every deployment back (nothing new written, what exists stays) when the copies
    /// would hold more than `limit` bytes on the hub (`--max-copied-bytes-per-bundle`):
    /// per-cluster copies live outside any quota of the hub's etcd. `true` when held.
    pub fn hold_copies_over(&mut self, limit: usize) -> bool {
        if self.copied_bytes <= limit {
            return false;
        }
        for d in &mut self.deployments {
            d.spec = None;
            d.copies.clear();
        }
        true
    }

    /// The whole spec to write for `d`, made when it is written (`None` while it is blocked).
    pub fn spec(&self, d: &DesiredDeployment) -> Option<BundleDeploymentSpec> {
        let s = d.spec.as_ref()?;
        Some(BundleDeploymentSpec {
            deployment_id: s.deployment_id.clone(),
            paused: s.paused,
            options: s.options.clone(),
            resources: self.resources.clone(),
            helm: s.helm.clone().or_else(|| self.helm.clone()),
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
        helm: spec.helm.clone().map(HelmOptions::normalized),
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
                    Some(SourceState::Found { hash, bytes }) => copies.push(DesiredCopy {
                        bytes: *bytes,
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
                    Some(SourceState::Refused) => {
                        plan.refused.insert(display(entry));
                        blocked = true;
                    }
                }
            }
        }
        let helm = match cluster_helm(plan.helm.as_ref(), &resolved, cluster) {
            Ok(h) => h,
            Err(e) => {
                plan.template_failed.push(format!("{}: {e}", m.cluster));
                blocked = true;
                None
            }
        };
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
                // Not in the spec: the copy's signature carries it, so a rotation leaves the
                // BundleDeployment alone (decision 0089-signed-copies).
                hash: String::new(),
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
            service_account: spec.service_account.clone(),
            diff: spec.diff.clone(),
            rollout_on_copy_change: spec.rollout_on_copy_change,
            namespace_labels: resolved.namespace_labels.clone(),
            namespace_annotations: resolved.namespace_annotations.clone(),
        };
        let bd_spec = DesiredSpec {
            deployment_id: hash::deployment_id_with_helm(
                &spec.resources,
                &options,
                helm.as_ref().or(plan.helm.as_ref()),
            ),
            paused: spec.paused || cluster.paused,
            options,
            helm,
        };
        plan.copies += copies.len();
        plan.copied_bytes += copies.iter().map(|c| c.bytes).sum::<usize>();
        plan.deployments.push(DesiredDeployment {
            cluster: m.cluster,
            namespace: namespace.to_string(),
            spec: Some(bd_spec),
            copies,
        });
    }
    plan.template_failed.sort();
    Ok(plan)
}

/// The chart for one cluster: the target's `helm` merged over the Bundle's and the values
/// pre-processed with the cluster's context (tender_types::customize). `Ok(None)` when it is
/// the Bundle's as it stands; `Err` names the failing value's path, never a value.
fn cluster_helm(
    base: Option<&HelmOptions>,
    resolved: &targeting::ResolvedTarget,
    cluster: &ClusterView<'_>,
) -> Result<Option<HelmOptions>, customize::ValuesError> {
    let Some(base) = base else {
        return Ok(None);
    };
    let mut helm = match &resolved.helm {
        Some(o) => customize::merge_helm(base, o).normalized(),
        None => base.clone(),
    };
    let has_values = helm.values.as_ref().is_some_and(|v| !v.0.is_empty());
    if has_values || !helm.template_values.is_empty() {
        let ctx = template::context(
            cluster.name,
            cluster.workspace,
            cluster.labels,
            cluster.annotations,
            cluster.template_values,
        );
        customize::preprocess(&mut helm, cluster.labels, &ctx)?;
    }
    Ok((&helm != base).then_some(helm))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fleet_tests;
