//! From listed hub objects to the plain rows `tender status` shows (pure: no client).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use serde::Serialize;
use tender_types::{Bundle, BundleDeployment, Cluster, HelmOp, conditions, labels, names};

/// A workspace: its HelmOps, Bundles and Clusters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceReport {
    /// The workspace namespace.
    pub workspace: String,
    /// One row per HelmOp, by name (each has a Bundle of the same name among `bundles`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub helm_ops: Vec<HelmOpRow>,
    /// One row per Bundle, by name.
    pub bundles: Vec<BundleRow>,
    /// One row per Cluster, by name.
    pub clusters: Vec<ClusterRow>,
}

/// One Bundle's summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleRow {
    /// Bundle name.
    pub name: String,
    /// One-word state (Ready, NotReady, Pending, …), empty before the hub has reported.
    pub state: String,
    /// Ready clusters out of targeted ones, e.g. `2/3`.
    pub clusters_ready: String,
    /// Status of the Ready condition: True, False or Unknown.
    pub ready: String,
    /// Reason of the Ready condition.
    pub reason: String,
    /// Message of the Ready condition.
    pub message: String,
}

/// One HelmOp's summary: its chart and its Bundle's state as the hub reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HelmOpRow {
    /// HelmOp name (also the name of its Bundle).
    pub name: String,
    /// `spec.helm.chart`.
    pub chart: String,
    /// `spec.helm.version` (empty: latest stable).
    pub version: String,
    /// Ready clusters out of targeted ones, e.g. `2/3`.
    pub clusters_ready: String,
    /// Status of the Ready condition: True, False or Unknown.
    pub ready: String,
    /// Reason of the Ready condition (e.g. BundleConflict).
    pub reason: String,
    /// Message of the Ready condition.
    pub message: String,
}

/// The rows of `helm_ops`, sorted by name.
pub fn helm_op_rows(helm_ops: &[HelmOp]) -> Vec<HelmOpRow> {
    let mut rows: Vec<HelmOpRow> = helm_ops
        .iter()
        .map(|h| {
            let status = h.status.clone().unwrap_or_default();
            let (ready, reason, message) = ready_parts(&status.conditions);
            HelmOpRow {
                name: h.name_any(),
                chart: h.spec.helm.chart.clone(),
                version: h.spec.helm.version.clone().unwrap_or_default(),
                clusters_ready: status.display.unwrap_or_default().ready_clusters,
                ready,
                reason,
                message,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// One Cluster's summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRow {
    /// Cluster name.
    pub name: String,
    /// `Pull` (an agent) or `Push` (the hub reaches the cluster by kubeconfig).
    pub mode: String,
    /// One-word state (WaitingForAgent, Ready, Offline, …).
    pub state: String,
    /// Ready BundleDeployments out of all, e.g. `3/4`.
    pub bundles_ready: String,
    /// The cluster's namespace on the hub.
    pub namespace: String,
}

/// One Bundle, cluster by cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleReport {
    /// The workspace namespace.
    pub workspace: String,
    /// The Bundle's summary.
    pub bundle: BundleRow,
    /// One row per targeted cluster (per BundleDeployment), by cluster name.
    pub clusters: Vec<TargetRow>,
    /// With a rolloutStrategy: the waves and the rollout's conditions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutReport>,
    /// Reverse sync: which cluster published which `upstreamResources` entry (from the
    /// Bundle's status), by cluster and object.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<UpstreamRow>,
}

/// One cluster's publication of one `upstreamResources` entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamRow {
    /// Cluster name.
    pub cluster: String,
    /// The downstream object, `Kind namespace/name`.
    pub object: String,
    /// Name of the published object in the Bundle's namespace.
    pub published: String,
    /// Published, Pending, Missing, Rejected, Stale or Conflict.
    pub state: String,
    /// Why it is not Published (never Secret data); for Stale, since when.
    pub message: String,
}

/// One targeted cluster of a Bundle: its BundleDeployment's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetRow {
    /// Cluster name.
    pub cluster: String,
    /// The cluster's namespace on the hub, where the BundleDeployment lives.
    pub namespace: String,
    /// One-word state of the BundleDeployment (Ready, WaitApplied, ErrApplied, …).
    pub state: String,
    /// Status of its Ready condition: True, False or Unknown.
    pub ready: String,
    /// Reason of its Ready condition.
    pub reason: String,
    /// Message of its Ready condition.
    pub message: String,
    /// The revision it runs, by hash: the first 12 hex of the deploymentID its agent applied
    /// (`-` before the first apply), and `→ <wanted>` while a newer one is on its way.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// With a rolloutStrategy: the wave the cluster is in (as the hub computes it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub wave: String,
}

/// One wave of a rollout (from `status.partitions`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaveRow {
    /// Name of the wave.
    pub name: String,
    /// Clusters in it.
    pub count: i32,
    /// Clusters not ready at the wanted deployment / allowed.
    pub unavailable: String,
    /// Waiting, Progressing, Soaking, Done, Failed or RolledBack.
    pub phase: String,
}

/// A rollout's waves and its conditions, for a Bundle with a rolloutStrategy.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutReport {
    /// The waves, in order.
    pub waves: Vec<WaveRow>,
    /// `RolloutProgressing`, `RolloutHalted` and `RolledBack` as `Type=Status (Reason): message`.
    pub conditions: Vec<String>,
}

/// The rollout part of `bundle`'s status, if it has a strategy.
pub fn rollout_report(bundle: &Bundle) -> Option<RolloutReport> {
    bundle.spec.rollout_strategy.as_ref()?;
    let status = bundle.status.clone().unwrap_or_default();
    let waves = status
        .partitions
        .iter()
        .map(|p| WaveRow {
            name: p.name.clone(),
            count: p.count,
            unavailable: format!("{}/{}", p.unavailable, p.max_unavailable),
            phase: p.phase.clone(),
        })
        .collect();
    let conditions = [
        conditions::TYPE_ROLLOUT_PROGRESSING,
        conditions::TYPE_ROLLOUT_HALTED,
        conditions::TYPE_ROLLED_BACK,
    ]
    .iter()
    .filter_map(|t| conditions::find_condition(&status.conditions, t))
    .map(|c| format!("{}={} ({}): {}", c.type_, c.status, c.reason, c.message))
    .collect();
    Some(RolloutReport { waves, conditions })
}

/// The revision column: applied deploymentID, and the wanted one when it differs.
fn revision(bd: &BundleDeployment) -> String {
    let short = |id: &str| id.chars().take(12).collect::<String>();
    let wanted = short(&bd.spec.deployment_id);
    match bd
        .status
        .as_ref()
        .and_then(|s| s.applied_deployment_id.as_deref())
    {
        None => format!("- → {wanted}"),
        Some(applied) if applied == bd.spec.deployment_id => wanted,
        Some(applied) => format!("{} → {wanted}", short(applied)),
    }
}

/// The Ready condition as (status, reason, message); `Unknown` and empty when absent.
fn ready_parts(conds: &[Condition]) -> (String, String, String) {
    match conditions::find_condition(conds, conditions::TYPE_READY) {
        Some(c) => (c.status.clone(), c.reason.clone(), c.message.clone()),
        None => ("Unknown".into(), String::new(), String::new()),
    }
}

/// The summary row of a Bundle.
pub fn bundle_row(b: &Bundle) -> BundleRow {
    let status = b.status.clone().unwrap_or_default();
    let (ready, reason, message) = ready_parts(&status.conditions);
    let display = status.display.unwrap_or_default();
    BundleRow {
        name: b.name_any(),
        state: display.state,
        clusters_ready: display.ready_clusters,
        ready,
        reason,
        message,
    }
}

/// `ready/total` of the BundleDeployments (not being deleted) in cluster namespace `ns`.
pub(crate) fn ready_in(ns: &str, deployments: &[BundleDeployment]) -> String {
    let live: Vec<&BundleDeployment> = deployments
        .iter()
        .filter(|bd| bd.namespace().as_deref() == Some(ns))
        .filter(|bd| bd.metadata.deletion_timestamp.is_none())
        .collect();
    let ready = live
        .iter()
        .filter(|bd| {
            bd.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, conditions::TYPE_READY))
        })
        .count();
    format!("{ready}/{}", live.len())
}

/// The rows of a workspace, sorted by name. A Cluster's `BUNDLES-READY` is counted from
/// `deployments` (the workspace's BundleDeployments), not taken from its status: the hub
/// writes that summary after a delay (decision 0053-cluster-summary-delay), and a table must not
/// contradict the BundleDeployments it sits next to.
pub fn workspace_report(
    workspace: &str,
    bundles: &[Bundle],
    clusters: &[Cluster],
    deployments: &[BundleDeployment],
) -> WorkspaceReport {
    let mut bundles: Vec<BundleRow> = bundles.iter().map(bundle_row).collect();
    bundles.sort_by(|a, b| a.name.cmp(&b.name));
    let mut clusters: Vec<ClusterRow> = clusters
        .iter()
        .map(|c| {
            let status = c.status.clone().unwrap_or_default();
            let display = status.display.unwrap_or_default();
            // The spec decides the mode; the status says so once the hub has seen it.
            let mode = status.mode.unwrap_or_else(|| c.spec.mode());
            let ws = c.namespace().unwrap_or_else(|| workspace.to_string());
            let ns = names::cluster_namespace(&ws, &c.name_any());
            ClusterRow {
                name: c.name_any(),
                mode: mode.to_string(),
                state: display.state,
                bundles_ready: ready_in(&ns, deployments),
                namespace: status.namespace.unwrap_or_default(),
            }
        })
        .collect();
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    WorkspaceReport {
        workspace: workspace.to_string(),
        helm_ops: Vec::new(),
        bundles,
        clusters,
    }
}

/// The rows of one Bundle: one per BundleDeployment, named by the cluster label the hub sets.
pub fn bundle_report(
    workspace: &str,
    bundle: &Bundle,
    deployments: &[BundleDeployment],
) -> BundleReport {
    let mut clusters: Vec<TargetRow> = deployments
        .iter()
        .map(|bd| {
            let status = bd.status.clone().unwrap_or_default();
            let (ready, reason, message) = ready_parts(&status.conditions);
            let state = match status.display.map(|d| d.state) {
                Some(s) if !s.is_empty() => s,
                // The agent has not reported yet: say so rather than print nothing.
                _ => "WaitingForAgent".to_string(),
            };
            TargetRow {
                cluster: bd
                    .labels()
                    .get(labels::CLUSTER)
                    .cloned()
                    .unwrap_or_default(),
                namespace: bd.namespace().unwrap_or_default(),
                state,
                ready,
                reason,
                message,
                revision: revision(bd),
                wave: String::new(),
            }
        })
        .collect();
    clusters.sort_by(|a, b| (&a.cluster, &a.namespace).cmp(&(&b.cluster, &b.namespace)));
    let mut upstream: Vec<UpstreamRow> = bundle
        .status
        .iter()
        .flat_map(|s| s.upstream.iter())
        .map(|p| {
            let stale = p
                .stale_since
                .as_ref()
                .map(|t| format!("stale since {}", t.0));
            UpstreamRow {
                cluster: p.cluster.clone(),
                object: format!("{} {}/{}", p.kind, p.namespace, p.name),
                published: p.published_name.clone(),
                state: p.state.as_str().to_string(),
                message: p.message.clone().or(stale).unwrap_or_default(),
            }
        })
        .collect();
    upstream.sort_by(|a, b| (&a.cluster, &a.object).cmp(&(&b.cluster, &b.object)));
    BundleReport {
        workspace: workspace.to_string(),
        bundle: bundle_row(bundle),
        clusters,
        rollout: rollout_report(bundle),
        upstream,
    }
}

/// With a rolloutStrategy, the wave of each cluster `bundle` targets, by cluster name: the
/// hub's own computation ([`tender_types::waves`]) over the same inputs — the workspace's
/// Clusters not being deleted, per shard (each hub replica rolls out its own shard's), matched
/// by the Bundle's targets, and the workspace's ClusterGroups.
pub fn cluster_waves(
    bundle: &Bundle,
    clusters: &[Cluster],
    groups: &[tender_types::ClusterGroup],
) -> std::collections::BTreeMap<String, String> {
    use std::collections::BTreeMap;
    use tender_types::targeting::{ClusterInfo, GroupInfo, match_targets};
    let mut out = BTreeMap::new();
    let Some(strategy) = &bundle.spec.rollout_strategy else {
        return out;
    };
    let no_labels = BTreeMap::new();
    let infos: Vec<GroupInfo<'_>> = groups
        .iter()
        .map(|g| GroupInfo {
            name: g.metadata.name.as_deref().unwrap_or_default(),
            labels: g.metadata.labels.as_ref().unwrap_or(&no_labels),
            selector: &g.spec.selector,
        })
        .collect();
    let mut by_shard: BTreeMap<Option<&String>, Vec<ClusterInfo<'_>>> = BTreeMap::new();
    for c in clusters
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        by_shard
            .entry(c.labels().get(labels::SHARD))
            .or_default()
            .push(ClusterInfo {
                name: c.metadata.name.as_deref().unwrap_or_default(),
                labels: c.metadata.labels.as_ref().unwrap_or(&no_labels),
            });
    }
    for shard in by_shard.values() {
        let Ok(matches) = match_targets(&bundle.spec, shard, &infos) else {
            continue;
        };
        let targeted: Vec<ClusterInfo<'_>> = shard
            .iter()
            .filter(|c| matches.iter().any(|m| m.cluster == c.name))
            .copied()
            .collect();
        if let Some(waves) = tender_types::waves::wave_of_each(strategy, &targeted, &infos) {
            for (c, w) in targeted.iter().zip(waves) {
                out.insert(c.name.to_string(), w);
            }
        }
    }
    out
}
