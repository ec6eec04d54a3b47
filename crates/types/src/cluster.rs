//! `Cluster`: one downstream cluster registered on the hub.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bundle::BundleSummary;
use crate::namespaces::DEFAULT_AGENT_NAMESPACE;
use crate::schema::{DNS_LABEL_PATTERN, conditions_list_map};

/// A downstream cluster; its labels are what Bundle targets and ClusterGroups select.
// Printer columns repeat `type_ = ...` by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tender.dev",
    version = "v1alpha1",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    shortname = "tcluster",
    category = "tender",
    doc = "Cluster is one downstream cluster. Its labels are what Bundle targets and ClusterGroups select; its agent reads its own namespace on the hub (status.namespace).",
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".status.namespace",
        description = "The cluster's own namespace on the hub"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.display.state",
        description = "Agent and deployment state"
    ),
    printcolumn(
        name = "Bundles-Ready",
        type_ = "string",
        json_path = ".status.display.readyBundles",
        description = "Ready BundleDeployments out of all"
    ),
    printcolumn(
        name = "Last-Seen",
        type_ = "date",
        json_path = ".status.agent.lastSeen",
        description = "Last agent heartbeat"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Namespace the agent runs in on the downstream cluster. Defaults to `tender-system`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub agent_namespace: Option<String>,

    /// Stop deploying new or changed BundleDeployments to this cluster; what is deployed stays.
    #[serde(default)]
    pub paused: bool,
}

impl ClusterSpec {
    /// The agent namespace, with the default applied.
    pub fn agent_namespace(&self) -> &str {
        self.agent_namespace
            .as_deref()
            .unwrap_or(DEFAULT_AGENT_NAMESPACE)
    }
}

/// Observed state of a Cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// metadata.generation of the Cluster this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The cluster's own namespace on the hub, holding its BundleDeployments and copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// What the agent last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,

    /// Conditions: `Ready`, `AgentConnected`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list_map)]
    pub conditions: Vec<Condition>,

    /// Counts of this cluster's BundleDeployments by state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<BundleSummary>,

    /// Short strings for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<ClusterDisplay>,
}

/// The agent's heartbeat and identity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// When the agent last reported in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Time>,
    /// Version of the agent binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Namespace the agent runs in downstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Short status strings of a Cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDisplay {
    /// Ready BundleDeployments out of all, e.g. `3/4`.
    #[serde(default)]
    pub ready_bundles: String,
    /// One word summary such as WaitingForAgent, Ready, NotReady, Offline or Paused.
    #[serde(default)]
    pub state: String,
}
