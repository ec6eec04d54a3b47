//! `ClusterGroup`: a named label selector over Clusters.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::conditions_list_map;

/// At most this many names are listed in `status.nonReadyClusters`.
pub const MAX_NON_READY_CLUSTERS: usize = 10;

/// A named set of Clusters in the same namespace, selected by label.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tender.dev",
    version = "v1alpha1",
    kind = "ClusterGroup",
    namespaced,
    status = "ClusterGroupStatus",
    shortname = "tcg",
    category = "tender",
    doc = "ClusterGroup is a named label selector over the Clusters in its namespace; Bundle targets can select groups by name or by label.",
    printcolumn(
        name = "Clusters",
        type_ = "integer",
        json_path = ".status.clusterCount",
        description = "Clusters in the group"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.display.readyClusters",
        description = "Ready clusters out of all"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGroupSpec {
    /// Selects the Clusters of this group by label. An empty selector `{}` selects every Cluster in the namespace.
    pub selector: LabelSelector,
}

/// Observed state of a ClusterGroup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGroupStatus {
    /// metadata.generation of the ClusterGroup this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Number of Clusters the selector matches.
    #[serde(default)]
    pub cluster_count: i32,

    /// Number of matched Clusters that are Ready.
    #[serde(default)]
    pub ready_cluster_count: i32,

    /// Names of matched Clusters that are not Ready, sorted, at most 10.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub non_ready_clusters: Vec<String>,

    /// Conditions: `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list_map)]
    pub conditions: Vec<Condition>,

    /// Short strings for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<ClusterGroupDisplay>,
}

/// Short status strings of a ClusterGroup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGroupDisplay {
    /// Ready clusters out of all, e.g. `2/3`.
    #[serde(default)]
    pub ready_clusters: String,
    /// One word summary such as Ready, NotReady or Empty.
    #[serde(default)]
    pub state: String,
}
