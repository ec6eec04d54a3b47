//! `tender status`: HelmOps, Bundles and Clusters of a workspace at a glance, or one Bundle cluster by
//! cluster, as a table, JSON or YAML.
//!
//! Reading the hub is kept apart from rendering: [`workspace_report`] and [`bundle_report`]
//! turn listed objects into plain rows, and the renderers only format rows, so both are unit
//! tested without a cluster.

use anyhow::{Context, Result};
use kube::api::{Api, ListParams};
use serde::Serialize;
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterGroup, HelmOp, labels};

mod render;
mod report;

pub(crate) use render::table;
pub use render::{render_bundle_table, render_workspace_table};
pub(crate) use report::ready_in;
pub use report::{
    BundleReport, BundleRow, ClusterRow, HelmOpRow, TargetRow, UpstreamRow, WorkspaceReport,
    bundle_report, bundle_row, cluster_waves, helm_op_rows, workspace_report,
};

/// Arguments of `tender status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show this Bundle only: every cluster it targets with its BundleDeployment's state,
    /// reason and message.
    pub bundle: Option<String>,
    /// The hub and the workspace.
    #[command(flatten)]
    pub hub: crate::hub::HubArgs,
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
    let hub = args.hub.client().await?;
    let ws = &args.hub.workspace;
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
            let helm_ops = match Api::<HelmOp>::namespaced(hub.clone(), ws)
                .list(&ListParams::default())
                .await
            {
                Ok(list) => list.items,
                Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
                Err(e) => return Err(e).with_context(|| format!("listing HelmOps in {ws}")),
            };
            let deployments = Api::<BundleDeployment>::all(hub.clone())
                .list(&ListParams::default().labels(&workspace_selector(ws)))
                .await
                .with_context(|| format!("listing the BundleDeployments of workspace {ws}"))?;
            let mut report =
                workspace_report(ws, &bundles.items, &clusters.items, &deployments.items);
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
            let deployments = Api::<BundleDeployment>::all(hub.clone())
                .list(&ListParams::default().labels(&selector))
                .await
                .with_context(|| format!("listing the BundleDeployments of Bundle {ws}/{name}"))?;
            let mut report = bundle_report(ws, &bundle, &deployments.items);
            if bundle.spec.rollout_strategy.is_some() {
                let clusters = Api::<Cluster>::namespaced(hub.clone(), ws)
                    .list(&ListParams::default())
                    .await
                    .with_context(|| format!("listing Clusters in {ws}"))?;
                let groups = Api::<ClusterGroup>::namespaced(hub.clone(), ws)
                    .list(&ListParams::default())
                    .await
                    .with_context(|| format!("listing ClusterGroups in {ws}"))?;
                let waves = cluster_waves(&bundle, &clusters.items, &groups.items);
                for row in &mut report.clusters {
                    row.wave = waves.get(&row.cluster).cloned().unwrap_or_default();
                }
            }
            render(&report, args.output, render_bundle_table)?
        }
    };
    print!("{text}");
    Ok(())
}

/// The label selector of every BundleDeployment of workspace `ws`'s Bundles.
pub fn workspace_selector(ws: &str) -> String {
    format!(
        "{}={}",
        labels::BUNDLE_NAMESPACE,
        labels::safe_label_value(ws)
    )
}

/// One line per HelmOp, Bundle and Cluster, `kubectl get`-style (the table of
/// [`workspace_report`] with [`helm_op_rows`]).
pub fn render_table(
    helm_ops: &[HelmOp],
    bundles: &[Bundle],
    clusters: &[Cluster],
    deployments: &[BundleDeployment],
) -> String {
    let mut report = workspace_report("", bundles, clusters, deployments);
    report.helm_ops = helm_op_rows(helm_ops);
    render_workspace_table(&report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;
    use tender_types::bundle::{BundleDisplay, BundleStatus};
    use tender_types::bundle_deployment::{BundleDeploymentDisplay, BundleDeploymentStatus};
    use tender_types::cluster::{ClusterDisplay, ClusterStatus};
    use tender_types::{conditions, names};

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

    /// A Cluster of workspace `ws` whose status summary is stale (`0/0`, as the hub leaves it
    /// until its summary delay passes).
    fn cluster(name: &str, state: &str) -> Cluster {
        let mut c = Cluster::new(name, Default::default());
        c.metadata.namespace = Some("ws".into());
        c.status = Some(ClusterStatus {
            namespace: Some(names::cluster_namespace("ws", name)),
            display: Some(ClusterDisplay {
                ready_bundles: "0/0".into(),
                state: state.into(),
            }),
            ..Default::default()
        });
        c
    }

    fn deployment(cluster: &str, state: Option<&str>, c: Option<Condition>) -> BundleDeployment {
        let mut bd = BundleDeployment::new("web", Default::default());
        bd.metadata.namespace = Some(names::cluster_namespace("ws", cluster));
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
    fn a_clusters_count_comes_from_its_bundle_deployments_not_its_stale_summary() {
        let mut deleting = deployment("east", Some("Ready"), Some(cond("True", "Ready", "")));
        deleting.metadata.name = Some("old".into());
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let mut other = deployment("east", None, None);
        other.metadata.name = Some("other".into());
        let report = workspace_report(
            "ws",
            &[],
            &[cluster("east", "Ready"), cluster("west", "Ready")],
            &[
                deployment("east", Some("Ready"), Some(cond("True", "Ready", ""))),
                other,
                deleting,
                deployment("west", Some("Ready"), Some(cond("True", "Ready", ""))),
            ],
        );
        let counts: Vec<&str> = report
            .clusters
            .iter()
            .map(|c| c.bundles_ready.as_str())
            .collect();
        // The status summaries say 0/0; the BundleDeployments say otherwise.
        assert_eq!(counts, ["1/2", "1/1"]);
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
            &[deployment(
                "east",
                Some("Ready"),
                Some(cond("True", "Ready", "")),
            )],
        );
        let text = render_workspace_table(&report);
        let east_ns = names::cluster_namespace("ws", "east");
        let lines: Vec<&str> = text.lines().collect();
        let east_line = format!("east      Pull   Ready   1/1             {east_ns}");
        assert_eq!(
            lines,
            [
                "BUNDLE   CLUSTERS-READY   READY     REASON   MESSAGE",
                "alpha    2/2              True      Ready",
                "zeta     0/1              Unknown",
                "",
                "CLUSTER   MODE   STATE   BUNDLES-READY   NAMESPACE",
                east_line.as_str(),
            ]
        );
        // The compatibility entry point renders the same table.
        assert_eq!(
            render_table(&[], &[bundle("zeta", "0/1", None)], &[], &[]),
            render_workspace_table(&workspace_report(
                "",
                &[bundle("zeta", "0/1", None)],
                &[],
                &[]
            ))
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
        let text = render_table(&[web, site], &[bundle("web", "2/2", None)], &[], &[]);
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
            !render_table(&[], &[], &[], &[]).contains("HELMOP"),
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
        assert_eq!(
            v["clusters"][2]["namespace"],
            names::cluster_namespace("ws", "west")
        );
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
            &[deployment(
                "east",
                Some("Ready"),
                Some(cond("True", "Ready", "")),
            )],
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(&ws, Output::Json, render_workspace_table).unwrap())
                .unwrap();
        assert_eq!(v["workspace"], "ws");
        assert_eq!(v["bundles"][0]["ready"], "Unknown");
        assert_eq!(v["clusters"][0]["bundlesReady"], "1/1");
        assert_eq!(
            v["clusters"][0]["namespace"],
            names::cluster_namespace("ws", "east")
        );
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
        let report = workspace_report("ws", &[], &[pull, push, unreported], &[]);
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

    #[test]
    fn a_bundle_in_waves_shows_its_waves_and_each_clusters_revision_by_hash() {
        let mut b = bundle("web", "1/2", Some(cond("True", "Ready", "")));
        b.spec.rollout_strategy = Some(Default::default());
        let status = b.status.get_or_insert_with(Default::default);
        status.partitions = vec![
            tender_types::rollout::PartitionStatus {
                name: "canary".into(),
                count: 1,
                max_unavailable: 0,
                unavailable: 0,
                phase: "RolledBack".into(),
            },
            tender_types::rollout::PartitionStatus {
                name: "rest".into(),
                count: 1,
                max_unavailable: 0,
                unavailable: 1,
                phase: "Waiting".into(),
            },
        ];
        status
            .conditions
            .push(cond("True", "RolledBack", "wave 1 (canary) is back"));
        status.conditions.last_mut().unwrap().type_ = "RolledBack".into();
        let mut east = deployment("east", Some("Ready"), Some(cond("True", "Ready", "")));
        east.spec.deployment_id = "0123456789abcdef".into();
        east.status.as_mut().unwrap().applied_deployment_id = Some("0123456789abcdef".into());
        let mut west = deployment("west", Some("WaitApplied"), None);
        west.spec.deployment_id = "fedcba9876543210".into();
        west.status.as_mut().unwrap().applied_deployment_id = Some("0123456789abcdef".into());
        let text = render_bundle_table(&bundle_report("ws", &b, &[east, west]));
        assert!(text.contains("0123456789ab → fedcba987654"), "{text}");
        assert!(
            text.contains("canary") && text.contains("RolledBack"),
            "{text}"
        );
        assert!(
            text.contains("RolledBack=True (RolledBack): wave 1 (canary) is back"),
            "{text}"
        );
        let plain = render_bundle_table(&web_report());
        assert!(!plain.contains("Rollout waves"), "no strategy, no waves");
    }

    #[test]
    fn each_targeted_cluster_shows_the_wave_the_hub_puts_it_in() {
        let mut b = bundle("web", "", None);
        b.spec.targets = vec![tender_types::bundle::BundleTarget {
            cluster_selector: Some(Default::default()),
            ..Default::default()
        }];
        b.spec.rollout_strategy = Some(tender_types::rollout::RolloutStrategy {
            partitions: vec![tender_types::rollout::Partition {
                name: Some("canary".into()),
                cluster_selector: Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                        match_labels: Some(BTreeMap::from([("tier".into(), "canary".into())])),
                        ..Default::default()
                    },
                ),
                ..Default::default()
            }],
            ..Default::default()
        });
        let labelled = |name: &str, labels: &[(&str, &str)]| {
            let mut c = cluster(name, "Ready");
            c.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            c
        };
        let clusters = [
            labelled("east", &[("tier", "canary")]),
            labelled("west", &[]),
            // Served by shard eu, which rolls out its own clusters: its canary is its own.
            labelled("north", &[("tier", "canary"), ("tender.dev/shard", "eu")]),
        ];
        let waves = cluster_waves(&b, &clusters, &[]);
        assert_eq!(waves["east"], "canary");
        assert_eq!(waves["west"], "unpartitioned");
        assert_eq!(waves["north"], "canary");
        let mut report = bundle_report("ws", &b, &[deployment("west", Some("Ready"), None)]);
        report.clusters[0].wave = waves["west"].clone();
        let text = render_bundle_table(&report);
        assert!(
            text.contains("WAVE") && text.contains("unpartitioned"),
            "{text}"
        );
        b.spec.rollout_strategy = None;
        assert!(cluster_waves(&b, &clusters, &[]).is_empty());
    }

    #[test]
    fn rollout_resume_sets_the_annotation_the_hub_reads() {
        let patch = crate::rollout::resume_patch("t1");
        assert_eq!(
            patch["metadata"]["annotations"][labels::ROLLOUT_RESUME],
            "t1"
        );
    }
}
