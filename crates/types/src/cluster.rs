//! `Cluster`: one downstream cluster registered on the hub.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bundle::BundleSummary;
use crate::namespaces::DEFAULT_AGENT_NAMESPACE;
use crate::schema::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, conditions_list_map};

/// Pattern of a key in a Secret's `data` (the apiserver's own rule).
const SECRET_KEY_PATTERN: &str = "^[-._a-zA-Z0-9]+$";
/// The key of the kubeconfig in its Secret when `kubeconfigSecretRef.key` is not set.
pub const DEFAULT_KUBECONFIG_KEY: &str = "value";

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
        name = "Mode",
        type_ = "string",
        json_path = ".status.mode",
        description = "Pull (an agent runs downstream) or Push (the hub reaches the cluster with a kubeconfig)"
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

    /// Push mode: the hub itself deploys to this cluster with the kubeconfig in this Secret
    /// (in the Cluster's namespace); no agent runs downstream. Unset: pull mode (an agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<KubeconfigSecretRef>,

    /// Fleet's `templateValues`: values Bundles and HelmOps read as `.ClusterValues` when their Helm values are templated for this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_values: Option<crate::helm::Values>,
}

/// A kubeconfig in a Secret of the Cluster's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigSecretRef {
    /// Name of the Secret (in the Cluster's namespace).
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// Key of the kubeconfig in the Secret's data. Defaults to `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = SECRET_KEY_PATTERN))]
    pub key: Option<String>,
}

impl KubeconfigSecretRef {
    /// The key, with the default applied.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_KUBECONFIG_KEY)
    }
}

/// How the hub reaches a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ClusterMode {
    /// An agent runs on the cluster and pulls from its cluster namespace on the hub.
    #[default]
    Pull,
    /// The hub runs the agent library itself, reaching the cluster with a kubeconfig.
    Push,
}

impl std::fmt::Display for ClusterMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pull => "Pull",
            Self::Push => "Push",
        })
    }
}

impl ClusterSpec {
    /// The agent namespace, with the default applied.
    pub fn agent_namespace(&self) -> &str {
        self.agent_namespace
            .as_deref()
            .unwrap_or(DEFAULT_AGENT_NAMESPACE)
    }

    /// Push when a kubeconfig Secret is named, else pull.
    pub fn mode(&self) -> ClusterMode {
        if self.kubeconfig_secret_ref.is_some() {
            ClusterMode::Push
        } else {
            ClusterMode::Pull
        }
    }
}

/// Observed state of a Cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// metadata.generation of the Cluster this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Pull` (an agent runs downstream) or `Push` (the hub deploys with a kubeconfig).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ClusterMode>,

    /// The cluster's own namespace on the hub, holding its BundleDeployments and copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// What the agent last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,

    /// Conditions: `Ready`, `AgentConnected`, and `ClusterConnected` in push mode.
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
