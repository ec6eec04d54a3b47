//! `tender cluster list`: the Clusters of a workspace with how the hub reaches them, whether
//! their agent is connected, its last heartbeat and their Bundles ready — as a table, JSON or
//! YAML. Reading is kept apart from the rows ([`cluster_rows`] is pure).

use anyhow::{Context, Result};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use tender_types::{BundleDeployment, Cluster, conditions, names};

use crate::status::{Output, render, workspace_selector};

/// Arguments of `tender cluster list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// The hub and the workspace.
    #[command(flatten)]
    pub hub: crate::hub::HubArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// One Cluster as `tender cluster list` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterListRow {
    /// Cluster name.
    pub name: String,
    /// One-word state from the hub (WaitingForAgent, Ready, NotReady, Offline, Paused, …).
    pub state: String,
    /// `Pull` (an agent runs downstream) or `Push` (the hub deploys with a kubeconfig).
    pub mode: String,
    /// `True`, `False` or `Unknown`: the `AgentConnected` condition (in push mode,
    /// `ClusterConnected`: whether the hub reaches the cluster).
    pub connected: String,
    /// Reason of that condition (e.g. `AgentOffline`), empty when connected.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// When the agent last reported in (RFC 3339), empty if never.
    pub last_heartbeat: String,
    /// The agent's version as it reported it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub agent_version: String,
    /// Ready BundleDeployments out of all, counted from the BundleDeployments.
    pub bundles_ready: String,
    /// The cluster's namespace on the hub.
    pub namespace: String,
    /// The Cluster's labels (what targets select), `k=v` comma-separated.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub labels: String,
}

/// The rows of `clusters`, sorted by name; `deployments` are the workspace's BundleDeployments.
pub fn cluster_rows(
    workspace: &str,
    clusters: &[Cluster],
    deployments: &[BundleDeployment],
) -> Vec<ClusterListRow> {
    let mut rows: Vec<ClusterListRow> = clusters
        .iter()
        .map(|c| {
            let status = c.status.clone().unwrap_or_default();
            let mode = status.mode.unwrap_or_else(|| c.spec.mode());
            let connection = match mode {
                tender_types::ClusterMode::Pull => conditions::TYPE_AGENT_CONNECTED,
                tender_types::ClusterMode::Push => conditions::TYPE_CLUSTER_CONNECTED,
            };
            let (connected, reason) =
                match conditions::find_condition(&status.conditions, connection) {
                    Some(cond) if cond.status == "True" => ("True".to_string(), String::new()),
                    Some(cond) => (cond.status.clone(), cond.reason.clone()),
                    None => ("Unknown".to_string(), String::new()),
                };
            let agent = status.agent.clone().unwrap_or_default();
            let ws = c.namespace().unwrap_or_else(|| workspace.to_string());
            let ns = names::cluster_namespace(&ws, &c.name_any());
            let labels = c
                .labels()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            ClusterListRow {
                name: c.name_any(),
                state: status.display.unwrap_or_default().state,
                mode: mode.to_string(),
                connected,
                reason,
                last_heartbeat: agent.last_seen.map(|t| t.0.to_string()).unwrap_or_default(),
                agent_version: agent.version.unwrap_or_default(),
                bundles_ready: crate::status::ready_in(&ns, deployments),
                namespace: status.namespace.unwrap_or(ns),
                labels,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// The rows as aligned columns, `kubectl get`-style (a `&Vec` for [`render`]'s signature).
#[allow(clippy::ptr_arg)]
pub fn render_rows(rows: &Vec<ClusterListRow>) -> String {
    if rows.is_empty() {
        return "No Clusters in this workspace.\n".to_string();
    }
    let dash = |s: &str| if s.is_empty() { "-" } else { s }.to_string();
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let connected = if r.reason.is_empty() {
                r.connected.clone()
            } else {
                format!("{} ({})", r.connected, r.reason)
            };
            vec![
                r.name.clone(),
                dash(&r.state),
                r.mode.clone(),
                connected,
                dash(&r.last_heartbeat),
                r.bundles_ready.clone(),
                r.namespace.clone(),
            ]
        })
        .collect();
    crate::status::table(
        &[
            "NAME",
            "STATE",
            "MODE",
            "CONNECTED",
            "LAST-HEARTBEAT",
            "BUNDLES-READY",
            "NAMESPACE",
        ],
        &body,
    )
}

/// Runs `tender cluster list`.
pub async fn run(args: ListArgs) -> Result<()> {
    let hub = args.hub.client().await?;
    let ws = &args.hub.workspace;
    let clusters = Api::<Cluster>::namespaced(hub.clone(), ws)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing Clusters in {ws}"))?;
    let deployments = Api::<BundleDeployment>::all(hub)
        .list(&ListParams::default().labels(&workspace_selector(ws)))
        .await
        .with_context(|| format!("listing the BundleDeployments of workspace {ws}"))?;
    let rows = cluster_rows(ws, &clusters.items, &deployments.items);
    print!("{}", render(&rows, args.output, render_rows)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;
    use tender_types::ClusterSpec;
    use tender_types::bundle_deployment::{BundleDeploymentSpec, BundleDeploymentStatus};
    use tender_types::cluster::{AgentStatus, ClusterDisplay, ClusterStatus, KubeconfigSecretRef};

    fn cond(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn cluster(name: &str, push: bool, conds: Vec<Condition>, seen: Option<&str>) -> Cluster {
        let mut c = Cluster::new(
            name,
            ClusterSpec {
                kubeconfig_secret_ref: push.then(|| KubeconfigSecretRef {
                    name: "kc".into(),
                    key: None,
                }),
                ..Default::default()
            },
        );
        c.metadata.namespace = Some("ws".into());
        c.metadata.labels = Some(BTreeMap::from([("env".into(), "prod".into())]));
        c.status = Some(ClusterStatus {
            conditions: conds,
            agent: seen.map(|s| AgentStatus {
                last_seen: Some(Time(s.parse().unwrap())),
                version: Some("0.1.0".into()),
                namespace: None,
            }),
            display: Some(ClusterDisplay {
                state: "Ready".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    fn deployment(cluster: &str, ready: bool) -> BundleDeployment {
        let mut bd = BundleDeployment::new("b", BundleDeploymentSpec::default());
        bd.metadata.namespace = Some(names::cluster_namespace("ws", cluster));
        bd.status = Some(BundleDeploymentStatus {
            conditions: vec![cond("Ready", if ready { "True" } else { "False" }, "")],
            ..Default::default()
        });
        bd
    }

    #[test]
    fn rows_say_how_each_cluster_is_reached_and_whether_it_is_connected() {
        let clusters = [
            cluster(
                "west",
                true,
                vec![cond("ClusterConnected", "False", "Unreachable")],
                None,
            ),
            cluster(
                "east",
                false,
                vec![cond("AgentConnected", "True", "Heartbeat")],
                Some("2026-12-04T10:00:00Z"),
            ),
        ];
        let deployments = [deployment("east", true), deployment("east", false)];
        let rows = cluster_rows("ws", &clusters, &deployments);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].name, "east", "sorted by name");
        assert_eq!(rows[0].mode, "Pull");
        assert_eq!(rows[0].connected, "True");
        assert_eq!(rows[0].last_heartbeat, "2026-12-04T10:00:00Z");
        assert_eq!(rows[0].bundles_ready, "1/2");
        assert_eq!(rows[0].labels, "env=prod");
        assert_eq!(rows[0].namespace, names::cluster_namespace("ws", "east"));
        assert_eq!(rows[1].mode, "Push");
        assert_eq!(rows[1].connected, "False");
        assert_eq!(rows[1].reason, "Unreachable");
        assert_eq!(rows[1].bundles_ready, "0/0");
        let table = render_rows(&rows);
        assert!(table.starts_with("NAME"), "{table}");
        assert!(table.contains("False (Unreachable)"), "{table}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&rows, Output::Json, render_rows).unwrap()).unwrap();
        assert_eq!(json[0]["lastHeartbeat"], "2026-12-04T10:00:00Z");
        assert_eq!(json[1]["bundlesReady"], "0/0");
        let yaml = render(&rows, Output::Yaml, render_rows).unwrap();
        assert!(
            yaml.contains("connected: 'False'") || yaml.contains("connected: \"False\""),
            "{yaml}"
        );
    }

    #[test]
    fn an_empty_workspace_says_so() {
        assert_eq!(render_rows(&Vec::new()), "No Clusters in this workspace.\n");
    }
}
