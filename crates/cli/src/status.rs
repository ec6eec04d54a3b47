//! `tender status`: HelmOps, Bundles and Clusters of a workspace at a glance, or one Bundle cluster by
//! cluster, as a table, JSON or YAML.
//!
//! Reading the hub is kept apart from rendering: [`workspace_report`] and [`bundle_report`]
//! turn listed objects into plain rows, and the renderers only format rows, so both are unit
//! tested without a cluster.

use std::path::PathBuf;

use anyhow::{Context, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use tender_types::{Bundle, BundleDeployment, Cluster, HelmOp, conditions, labels};

/// Arguments of `tender status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show this Bundle only: every cluster it targets with its BundleDeployment's state,
    /// reason and message.
    pub bundle: Option<String>,
    /// Workspace namespace on the hub.
    #[arg(
        long,
        short = 'n',
        default_value = "tender-default",
        env = "TENDER_WORKSPACE"
    )]
    pub workspace: String,
    /// Kubeconfig of the hub (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "TENDER_HUB_KUBECONFIG")]
    pub hub_kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// How `tender status` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns, `kubectl get`-style.
    #[default]
    Table,
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
}

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

/// The rows of a workspace, sorted by name.
pub fn workspace_report(
    workspace: &str,
    bundles: &[Bundle],
    clusters: &[Cluster],
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
            ClusterRow {
                name: c.name_any(),
                mode: mode.to_string(),
                state: display.state,
                bundles_ready: display.ready_bundles,
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
        upstream,
    }
}

/// Left-aligned columns separated by three spaces; the last column is not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A workspace as tables: HelmOps (when there are any), Bundles, then Clusters.
pub fn render_workspace_table(report: &WorkspaceReport) -> String {
    let helm_ops: Vec<Vec<String>> = report
        .helm_ops
        .iter()
        .map(|h| {
            vec![
                h.name.clone(),
                h.chart.clone(),
                h.version.clone(),
                h.clusters_ready.clone(),
                h.ready.clone(),
                h.reason.clone(),
                h.message.clone(),
            ]
        })
        .collect();
    let helm_ops = if helm_ops.is_empty() {
        String::new()
    } else {
        table(
            &[
                "HELMOP",
                "CHART",
                "VERSION",
                "CLUSTERS-READY",
                "READY",
                "REASON",
                "MESSAGE",
            ],
            &helm_ops,
        ) + "\n"
    };
    let bundles: Vec<Vec<String>> = report
        .bundles
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.clusters_ready.clone(),
                b.ready.clone(),
                b.reason.clone(),
                b.message.clone(),
            ]
        })
        .collect();
    let clusters: Vec<Vec<String>> = report
        .clusters
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.mode.clone(),
                c.state.clone(),
                c.bundles_ready.clone(),
                c.namespace.clone(),
            ]
        })
        .collect();
    format!(
        "{helm_ops}{}\n{}",
        table(
            &["BUNDLE", "CLUSTERS-READY", "READY", "REASON", "MESSAGE"],
            &bundles
        ),
        table(
            &["CLUSTER", "MODE", "STATE", "BUNDLES-READY", "NAMESPACE"],
            &clusters
        )
    )
}

/// One Bundle: its summary line, then one line per targeted cluster.
pub fn render_bundle_table(report: &BundleReport) -> String {
    let b = &report.bundle;
    let mut out = format!(
        "Bundle {}/{}: {} clusters ready, Ready={}",
        report.workspace,
        b.name,
        if b.clusters_ready.is_empty() {
            "?"
        } else {
            &b.clusters_ready
        },
        b.ready
    );
    if !b.reason.is_empty() {
        out.push_str(&format!(" ({})", b.reason));
    }
    if !b.message.is_empty() {
        out.push_str(&format!(": {}", b.message));
    }
    out.push_str("\n\n");
    if report.clusters.is_empty() {
        out.push_str("No cluster is targeted (no BundleDeployment exists for this Bundle).\n");
        return out;
    }
    let rows: Vec<Vec<String>> = report
        .clusters
        .iter()
        .map(|t| {
            vec![
                t.cluster.clone(),
                t.state.clone(),
                t.ready.clone(),
                t.reason.clone(),
                t.message.clone(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["CLUSTER", "STATE", "READY", "REASON", "MESSAGE"],
        &rows,
    ));
    if !report.upstream.is_empty() {
        let rows: Vec<Vec<String>> = report
            .upstream
            .iter()
            .map(|u| {
                vec![
                    u.cluster.clone(),
                    u.object.clone(),
                    u.published.clone(),
                    u.state.clone(),
                    u.message.clone(),
                ]
            })
            .collect();
        out.push_str("\nPublished upstream (reverse sync):\n");
        out.push_str(&table(
            &["CLUSTER", "OBJECT", "PUBLISHED-AS", "STATE", "MESSAGE"],
            &rows,
        ));
    }
    out
}

/// `report` as JSON or YAML (a trailing newline included), or as `table(report)`.
pub fn render<T: Serialize>(report: &T, output: Output, table: fn(&T) -> String) -> Result<String> {
    Ok(match output {
        Output::Table => table(report),
        Output::Json => serde_json::to_string_pretty(report)? + "\n",
        Output::Yaml => serde_saphyr::to_string(report)?,
    })
}

/// Runs `tender status`.
pub async fn run(args: Args) -> Result<()> {
    let hub = tender_runtime::client(args.hub_kubeconfig.as_deref(), None, "tender-cli")
        .await
        .context("connecting to the hub")?;
    let ws = &args.workspace;
    let text = match &args.bundle {
        None => {
            let bundles = Api::<Bundle>::namespaced(hub.clone(), ws)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing Bundles in {ws}"))?;
            let clusters = Api::<Cluster>::namespaced(hub.clone(), ws)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing Clusters in {ws}"))?;
            // A hub whose CRDs predate HelmOps simply has none.
            let helm_ops = match Api::<HelmOp>::namespaced(hub, ws)
                .list(&ListParams::default())
                .await
            {
                Ok(list) => list.items,
                Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
                Err(e) => return Err(e).with_context(|| format!("listing HelmOps in {ws}")),
            };
            let mut report = workspace_report(ws, &bundles.items, &clusters.items);
            report.helm_ops = helm_op_rows(&helm_ops);
            render(&report, args.output, render_workspace_table)?
        }
        Some(name) => {
            let bundle = Api::<Bundle>::namespaced(hub.clone(), ws)
                .get_opt(name)
                .await
                .with_context(|| format!("reading Bundle {ws}/{name}"))?
                .with_context(|| format!("Bundle {ws}/{name} not found"))?;
            // The hub writes a Bundle's BundleDeployments into each cluster's own namespace and
            // labels them with the Bundle; the labels find them across namespaces.
            let selector = format!(
                "{}={},{}={}",
                labels::BUNDLE_NAMESPACE,
                labels::safe_label_value(ws),
                labels::BUNDLE_NAME,
                labels::safe_label_value(name)
            );
            let deployments = Api::<BundleDeployment>::all(hub)
                .list(&ListParams::default().labels(&selector))
                .await
                .with_context(|| format!("listing the BundleDeployments of Bundle {ws}/{name}"))?;
            render(
                &bundle_report(ws, &bundle, &deployments.items),
                args.output,
                render_bundle_table,
            )?
        }
    };
    print!("{text}");
    Ok(())
}

/// One line per HelmOp, Bundle and Cluster, `kubectl get`-style (the table of
/// [`workspace_report`] with [`helm_op_rows`]).
pub fn render_table(helm_ops: &[HelmOp], bundles: &[Bundle], clusters: &[Cluster]) -> String {
    let mut report = workspace_report("", bundles, clusters);
    report.helm_ops = helm_op_rows(helm_ops);
    render_workspace_table(&report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;
    use tender_types::bundle::{BundleDisplay, BundleStatus};
    use tender_types::bundle_deployment::{BundleDeploymentDisplay, BundleDeploymentStatus};
    use tender_types::cluster::{ClusterDisplay, ClusterStatus};

    fn cond(status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: conditions::TYPE_READY.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn bundle(name: &str, ready_clusters: &str, c: Option<Condition>) -> Bundle {
        let mut b = Bundle::new(name, Default::default());
        b.metadata.namespace = Some("ws".into());
        b.status = Some(BundleStatus {
            conditions: c.into_iter().collect(),
            display: Some(BundleDisplay {
                ready_clusters: ready_clusters.into(),
                state: "Ready".into(),
            }),
            ..Default::default()
        });
        b
    }

    fn cluster(name: &str, state: &str) -> Cluster {
        let mut c = Cluster::new(name, Default::default());
        c.status = Some(ClusterStatus {
            namespace: Some(format!("ws-{name}")),
            display: Some(ClusterDisplay {
                ready_bundles: "1/1".into(),
                state: state.into(),
            }),
            ..Default::default()
        });
        c
    }

    fn deployment(cluster: &str, state: Option<&str>, c: Option<Condition>) -> BundleDeployment {
        let mut bd = BundleDeployment::new("web", Default::default());
        bd.metadata.namespace = Some(format!("ws-{cluster}"));
        bd.metadata.labels = Some(BTreeMap::from([(
            labels::CLUSTER.to_string(),
            cluster.to_string(),
        )]));
        bd.status = Some(BundleDeploymentStatus {
            conditions: c.into_iter().collect(),
            display: state.map(|s| BundleDeploymentDisplay { state: s.into() }),
            ..Default::default()
        });
        bd
    }

    fn web_report() -> BundleReport {
        bundle_report(
            "ws",
            &bundle(
                "web",
                "1/2",
                Some(cond("False", "NotReady", "1 of 2 clusters")),
            ),
            &[
                deployment(
                    "west",
                    Some("ErrApplied"),
                    Some(cond("False", "ApplyFailed", "ConfigMap apps/x: forbidden")),
                ),
                deployment("east", Some("Ready"), Some(cond("True", "Ready", ""))),
                deployment("north", None, None),
            ],
        )
    }

    #[test]
    fn workspace_table_lists_bundles_then_clusters_sorted() {
        let report = workspace_report(
            "ws",
            &[
                bundle("zeta", "0/1", None),
                bundle("alpha", "2/2", Some(cond("True", "Ready", ""))),
            ],
            &[cluster("east", "Ready")],
        );
        let text = render_workspace_table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "BUNDLE   CLUSTERS-READY   READY     REASON   MESSAGE",
                "alpha    2/2              True      Ready",
                "zeta     0/1              Unknown",
                "",
                "CLUSTER   MODE   STATE   BUNDLES-READY   NAMESPACE",
                "east      Pull   Ready   1/1             ws-east",
            ]
        );
        // The compatibility entry point renders the same table.
        assert_eq!(
            render_table(&[], &[bundle("zeta", "0/1", None)], &[]),
            render_workspace_table(&workspace_report("", &[bundle("zeta", "0/1", None)], &[]))
        );
    }

    #[test]
    fn helm_ops_come_first_with_their_chart_and_state() {
        let mut web: HelmOp = serde_json::from_value(serde_json::json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
            "metadata": {"name": "web", "namespace": "ws"},
            "spec": {"helm": {"chart": "app", "repo": "http://c", "version": "0.2.0"}}
        }))
        .unwrap();
        let mut site = web.clone();
        site.metadata.name = Some("site".into());
        site.spec.helm.version = None;
        site.status = Some(tender_types::HelmOpStatus {
            conditions: vec![cond(
                "False",
                "BundleConflict",
                "a Bundle named site exists",
            )],
            ..Default::default()
        });
        web.status = Some(tender_types::HelmOpStatus {
            conditions: vec![cond("True", "Ready", "")],
            display: Some(BundleDisplay {
                ready_clusters: "2/2".into(),
                state: "Ready".into(),
            }),
            ..Default::default()
        });
        let text = render_table(&[web, site], &[bundle("web", "2/2", None)], &[]);
        let lines: Vec<&str> = text.lines().take(4).collect();
        assert_eq!(
            lines,
            [
                "HELMOP   CHART   VERSION   CLUSTERS-READY   READY   REASON           MESSAGE",
                "site     app                                False   BundleConflict   a Bundle named site exists",
                "web      app     0.2.0     2/2              True    Ready",
                "",
            ]
        );
        assert!(text.contains("\nBUNDLE "), "{text}");
        assert!(
            !render_table(&[], &[], &[]).contains("HELMOP"),
            "no HelmOps, no table"
        );
    }

    #[test]
    fn bundle_table_has_one_line_per_cluster_with_reason_and_message() {
        let text = render_bundle_table(&web_report());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "Bundle ws/web: 1/2 clusters ready, Ready=False (NotReady): 1 of 2 clusters",
                "",
                "CLUSTER   STATE             READY     REASON        MESSAGE",
                "east      Ready             True      Ready",
                "north     WaitingForAgent   Unknown",
                "west      ErrApplied        False     ApplyFailed   ConfigMap apps/x: forbidden",
            ]
        );
    }

    #[test]
    fn a_bundle_without_deployments_says_so() {
        let report = bundle_report("ws", &bundle("web", "0/0", None), &[]);
        assert!(render_bundle_table(&report).contains("No cluster is targeted"));
    }

    #[test]
    fn json_and_yaml_carry_every_field_in_camel_case() {
        let report = web_report();
        let json = render(&report, Output::Json, render_bundle_table).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["bundle"]["name"], "web");
        assert_eq!(v["bundle"]["clustersReady"], "1/2");
        assert_eq!(v["clusters"][2]["cluster"], "west");
        assert_eq!(v["clusters"][2]["namespace"], "ws-west");
        assert_eq!(v["clusters"][2]["state"], "ErrApplied");
        assert_eq!(v["clusters"][2]["reason"], "ApplyFailed");
        assert_eq!(v["clusters"][2]["message"], "ConfigMap apps/x: forbidden");

        let yaml = render(&report, Output::Yaml, render_bundle_table).unwrap();
        let back: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, v, "YAML and JSON say the same thing");

        let ws = workspace_report(
            "ws",
            &[bundle("web", "1/1", None)],
            &[cluster("east", "Ready")],
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(&ws, Output::Json, render_workspace_table).unwrap())
                .unwrap();
        assert_eq!(v["workspace"], "ws");
        assert_eq!(v["bundles"][0]["ready"], "Unknown");
        assert_eq!(v["clusters"][0]["bundlesReady"], "1/1");
        assert_eq!(v["clusters"][0]["namespace"], "ws-east");
    }

    #[test]
    fn table_output_is_the_table() {
        let report = web_report();
        assert_eq!(
            render(&report, Output::Table, render_bundle_table).unwrap(),
            render_bundle_table(&report)
        );
    }

    #[test]
    fn clusters_show_their_mode_and_state() {
        use tender_types::{ClusterMode, ClusterSpec, KubeconfigSecretRef};
        let pull = cluster("east", "Ready");
        let mut push = Cluster::new(
            "edge",
            ClusterSpec {
                kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                    name: "edge-kubeconfig".into(),
                    key: None,
                }),
                ..Default::default()
            },
        );
        push.status = Some(ClusterStatus {
            mode: Some(ClusterMode::Push),
            display: Some(ClusterDisplay {
                ready_bundles: "0/1".into(),
                state: "KubeconfigExecNotAllowed".into(),
            }),
            ..Default::default()
        });
        // Not reported yet: the spec decides.
        let mut unreported = push.clone();
        unreported.metadata.name = Some("fresh".into());
        unreported.status = None;
        let report = workspace_report("ws", &[], &[pull, push, unreported]);
        let modes: Vec<(&str, &str)> = report
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), c.mode.as_str()))
            .collect();
        assert_eq!(
            modes,
            [("east", "Pull"), ("edge", "Push"), ("fresh", "Push")]
        );
        let text = render_workspace_table(&report);
        assert!(
            text.lines().any(|l| l.starts_with("edge")
                && l.contains(" Push ")
                && l.contains("KubeconfigExecNotAllowed")),
            "{text}"
        );
    }

    #[test]
    fn a_bundle_report_lists_what_clusters_published_upstream() {
        use tender_types::upstream::{UpstreamPublication, UpstreamState};
        let mut b = bundle("peering", "2/2", Some(cond("True", "Ready", "")));
        let status = b.status.as_mut().unwrap();
        status.upstream = vec![
            UpstreamPublication {
                cluster: "west".into(),
                kind: "Secret".into(),
                namespace: "net".into(),
                name: "peering-request".into(),
                published_name: "peering-west-peering-request".into(),
                state: UpstreamState::Stale,
                stale_since: Some(Time(Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            UpstreamPublication {
                cluster: "east".into(),
                kind: "Secret".into(),
                namespace: "net".into(),
                name: "peering-request".into(),
                published_name: "peering-east-peering-request".into(),
                state: UpstreamState::Published,
                ..Default::default()
            },
        ];
        let report = bundle_report("ws", &b, &[deployment("east", Some("Ready"), None)]);
        let text = render_bundle_table(&report);
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("Published upstream"))
            .expect(&text);
        assert!(lines[at + 1].starts_with("CLUSTER   OBJECT"), "{text}");
        assert!(
            lines[at + 2].starts_with("east") && lines[at + 2].contains("Published"),
            "{text}"
        );
        assert!(
            lines[at + 3].starts_with("west") && lines[at + 3].contains("stale since"),
            "{text}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(&report, Output::Json, render_bundle_table).unwrap())
                .unwrap();
        assert_eq!(
            v["upstream"][0]["published"],
            "peering-east-peering-request"
        );
        // Nothing published: no section and no empty list.
        let plain = bundle_report("ws", &bundle("web", "1/1", None), &[]);
        assert!(!render_bundle_table(&plain).contains("Published upstream"));
        let v: serde_json::Value =
            serde_json::from_str(&render(&plain, Output::Json, render_bundle_table).unwrap())
                .unwrap();
        assert!(v.get("upstream").is_none());
    }
}
