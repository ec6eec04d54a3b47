//! `Bundle`: what to deploy (inline manifests and copied Secrets/ConfigMaps) and where.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub use crate::manifest::{FileEntry, Manifest, Resource};
use crate::schema::{
    API_VERSION_PATTERN, DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, KIND_PATTERN,
    conditions_list_map, forbid_namespace_property, kind_name_list_map,
};

/// A set of manifests and Secret/ConfigMap copies deployed to every targeted cluster.
// Printer columns repeat `type_ = ...` by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tender.dev",
    version = "v1alpha1",
    kind = "Bundle",
    namespaced,
    status = "BundleStatus",
    shortname = "tbundle",
    category = "tender",
    doc = "Bundle deploys inline manifests, and copies of Secrets and ConfigMaps from its own namespace, to the clusters it targets.",
    printcolumn(
        name = "Clusters-Ready",
        type_ = "string",
        json_path = ".status.display.readyClusters",
        description = "Ready clusters out of targeted clusters"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.display.state",
        description = "Summary state of the Bundle"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::fleet_only::bundle_spec)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.namespace) && has(self.targetNamespace))",
    "message": "spec.namespace (Fleet's name) and spec.targetNamespace mean the same thing: set one of them"
}]))]
pub struct BundleSpec {
    /// Which clusters receive this Bundle. Each cluster is matched by the first target that selects it; a cluster no target selects gets nothing. A target may set several of clusterName, clusterSelector, clusterGroup and clusterGroupSelector: all must hold (clusterGroup and clusterGroupSelector for the same group), as in Fleet; a target that sets none selects nothing. No targets: no cluster (Fleet's Bundle; a HelmOp without targets gets Fleet's default target).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub targets: Vec<BundleTarget>,

    /// Namespace for manifests that do not set one, and for copies when targetNamespace is unset. Defaults to `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub default_namespace: Option<String>,

    /// Namespace forced on every namespaced manifest and on the copies, overriding namespaces set in the manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub target_namespace: Option<String>,

    /// Fleet's name for targetNamespace (Fleet's Bundle has no other): the same meaning; set one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: Option<String>,

    /// Fan-out: copies and namespaced manifests go to every namespace listed here (created if missing), in addition to those targetNamespaceSelector matches. Overrides targetNamespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN)))]
    pub target_namespaces: Vec<String>,

    /// Fan-out: copies and namespaced manifests go to every existing downstream namespace whose labels match, followed as namespaces are created, relabelled or deleted. `{}` matches every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_namespace_selector: Option<LabelSelector>,

    /// Objects in this Bundle's namespace to copy to every targeted cluster before any manifest is applied there: Secrets and ConfigMaps, and any other kind the hub operator allows (`--copyable-kinds`). Needs the EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM feature gate on hub and agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), transform = kind_name_list_map)]
    pub downstream_resources: Vec<DownstreamResource>,

    /// Downstream Secrets and ConfigMaps read on every targeted cluster and published in this Bundle's namespace as `<bundle>-<cluster>-<name>` (reverse sync; see docs/reverse-sync.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), transform = kind_name_list_map)]
    pub upstream_resources: Vec<crate::upstream::UpstreamResource>,

    /// Inline manifests applied downstream with server-side apply, in order (each needs apiVersion, kind and metadata.name), and Fleet's files (`{name, content, encoding}`): a chart directory that `helm.chart` names as a relative path, and `*.yaml`/`*.yml`/`*.json` manifest files. See docs/helm.md#charts-carried-in-the-bundle.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2000))]
    pub resources: Vec<Manifest>,

    /// A Helm chart rendered on every targeted cluster (values may come from copies) and deployed like `resources`; a Bundle may have both. See docs/helm.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<crate::helm::HelmOptions>,

    /// Leave deployed objects and copies in place (without tender's labels) when they are no longer targeted or the Bundle is deleted.
    #[serde(default)]
    pub keep_resources: bool,

    /// Adopt existing downstream objects that tender did not create, instead of reporting a conflict.
    #[serde(default)]
    pub take_ownership: bool,

    /// Drift correction for deployed objects; absent means enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correct_drift: Option<CorrectDrift>,

    /// Stop rolling out changes of this Bundle; what is already deployed stays.
    #[serde(default)]
    pub paused: bool,

    /// Labels the agent sets on the namespaces it creates for this Bundle (Fleet's namespaceLabels). A namespace tender did not create is never changed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "namespace_labels_schema")]
    pub namespace_labels: BTreeMap<String, String>,

    /// Annotations the agent sets on the namespaces it creates for this Bundle (Fleet's namespaceAnnotations). A namespace tender did not create is never changed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "namespace_annotations_schema")]
    pub namespace_annotations: BTreeMap<String, String>,

    /// Downstream ServiceAccount (`<namespace>/<name>`) the agent impersonates to apply this Bundle, instead of the agent's default one. The downstream owner must allow it (`--allow-bundle-service-accounts`); otherwise the Bundle is refused there with `ServiceAccountNotAllowed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 317), regex(pattern = SERVICE_ACCOUNT_PATTERN))]
    pub service_account: Option<String>,

    /// With a `helm` chart whose version is a range (or empty: the latest stable), how often the hub looks for a newer matching version in the repository's index or the registry's tags: a Go duration as Fleet accepts it (`5s`, `1h30m`); `0` (or absent) means no polling. The hub looks at most every 15s: a shorter interval is raised to that and reported (`PollingInterval=False`, reason PollingIntervalRaised). The hub records the version in `status.version` and deploys that exact version to every cluster. An exact version is never polled. See docs/helm.md#polling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::bundle::polling_interval_schema")]
    pub polling_interval: Option<String>,

    /// Fleet's `diff`: `comparePatches` lists fields of deployed objects that another field manager owns (an HPA's `spec.replicas`); tender neither applies them nor corrects them as drift. See docs/helm.md#comparepatches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<crate::diff::DiffOptions>,
    /// Bundles of this namespace that must be in an accepted state on a cluster before this Bundle's BundleDeployment is created or changed there (Fleet's dependsOn). Until then the cluster keeps what it has. A missing dependency or a cycle is reported as a condition. See docs/dependencies.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub depends_on: Vec<BundleRef>,

    /// Roll the workloads of this Bundle (Deployments, StatefulSets, DaemonSets, ReplicaSets, CronJobs) that consume a copied Secret or ConfigMap when its content changes: the agent sets the pod-template annotation `tender.dev/copies-hash`, and the deployment is ready only once they are rolled and available again. See docs/dependencies.md.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rollout_on_copy_change: bool,
    /// Roll changes out in waves (Fleet's rolloutStrategy, with a progress deadline, soak time, failure budget and rollback): every change — manifests, chart, copied sources — reaches a cluster only once its wave is released. See docs/rollouts.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<crate::rollout::RolloutStrategy>,
}

/// A dependency on other Bundles of the same namespace: by name, by label selector, or both
/// (both must match), with the BundleDeployment states that count as satisfied.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.name) || has(self.selector)",
    "message": "dependsOn[] must set name or selector"
}]))]
pub struct BundleRef {
    /// Name of a Bundle in this namespace (for a HelmOp: the HelmOp's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: Option<String>,

    /// Selects the Bundles of this namespace whose labels match (this Bundle itself excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// States of the dependency's BundleDeployment on a cluster that let this Bundle proceed there; default `[Ready]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub accepted_states: Vec<BundleState>,
}

/// The state of one BundleDeployment, in Fleet's words.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum BundleState {
    /// Applied at its current deploymentID with every object ready.
    Ready,
    /// Applied, with objects not ready yet.
    NotReady,
    /// Not yet applied at its current deploymentID.
    WaitApplied,
    /// The last apply failed.
    ErrApplied,
    /// Fleet's staged-but-not-deployed state; tender never reports it (accepted for Fleet compatibility).
    OutOfSync,
    /// Written, but no agent has reported on it yet.
    Pending,
    /// Deployed objects were changed downstream.
    Modified,
}

impl BundleRef {
    /// Whether `state` satisfies this dependency (`acceptedStates`, default `[Ready]`).
    pub fn accepts(&self, state: BundleState) -> bool {
        if self.accepted_states.is_empty() {
            state == BundleState::Ready
        } else {
            self.accepted_states.contains(&state)
        }
    }
}

/// `pollingInterval` as Fleet's HelmOp CRD declares it: `0`, or a Go duration of at most
/// 2562047h (Fleet's rule and message, verbatim).
pub(crate) fn polling_interval_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "minLength": 1,
        "maxLength": 32,
        "x-kubernetes-validations": [{
            "rule": "self == '0' || (self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) <= duration('2562047h'))",
            "message": "pollingInterval must be 0 or a valid Go duration using units ns, us, µs, ms, s, m, h (e.g. 15s, 5m, 2h, 1h30m); units like d (days) or w (weeks) are not supported"
        }]
    })
}

/// `<namespace>/<name>`: a DNS label, a slash and a DNS subdomain.
const SERVICE_ACCOUNT_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

impl BundleSpec {
    /// Whether drift correction is on (absent `correctDrift` means on).
    pub fn correct_drift_enabled(&self) -> bool {
        self.correct_drift.as_ref().is_none_or(|c| c.enabled)
    }
}

/// One way of selecting clusters, with optional overrides for the clusters it selects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::fleet_only::target)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.namespace) && has(self.targetNamespace))",
    "message": "spec.targets[].namespace (Fleet's name) and spec.targets[].targetNamespace mean the same thing: set one of them"
}]))]
/// As in Fleet, a target may set several of clusterName, clusterSelector, clusterGroup and
/// clusterGroupSelector (all must hold) or none (it selects nothing): see
/// [`crate::targeting::criteria_select`].
pub struct BundleTarget {
    /// Optional name of this target, for status and messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: Option<String>,

    /// Selects the Cluster with this name in the Bundle's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub cluster_name: Option<String>,

    /// Selects Clusters by their labels. An empty selector `{}` selects every Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,

    /// Selects the Clusters of the ClusterGroup with this name. A missing group selects nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub cluster_group: Option<String>,

    /// Selects the Clusters of every ClusterGroup whose labels match. An empty selector `{}` selects every group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group_selector: Option<LabelSelector>,

    /// Overrides the Bundle's targetNamespace for the clusters of this target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub target_namespace: Option<String>,

    /// Fleet's name for this target's targetNamespace: the same meaning; set one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: Option<String>,

    /// Overrides the Bundle's defaultNamespace for the clusters of this target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub default_namespace: Option<String>,

    /// Overrides the Bundle's targetNamespaces for the clusters of this target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN)))]
    pub target_namespaces: Option<Vec<String>>,

    /// Overrides the Bundle's targetNamespaceSelector for the clusters of this target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_namespace_selector: Option<LabelSelector>,

    /// Replaces (does not merge with) the Bundle's downstreamResources for the clusters of this target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), transform = kind_name_list_map)]
    pub downstream_resources: Option<Vec<DownstreamResource>>,

    /// Overrides the Bundle's keepResources for the clusters of this target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_resources: Option<bool>,

    /// Fleet's per-target chart options, merged over the Bundle's `helm` for the clusters of this target: values deep-merged, valuesFrom by identity, version/chart/repo/releaseName/timeoutSeconds replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<crate::customize::HelmOverride>,

    /// The clusters this target selects get nothing (and lose what they had): the first matching target wins, so a later target does not select them either.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub do_not_deploy: bool,

    /// Set over the Bundle's namespaceLabels key by key for the clusters of this target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "namespace_labels_schema")]
    pub namespace_labels: BTreeMap<String, String>,

    /// Set over the Bundle's namespaceAnnotations key by key for the clusters of this target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "namespace_annotations_schema")]
    pub namespace_annotations: BTreeMap<String, String>,
}

/// Label keys and values the apiserver accepts on a Namespace, not tender's own keys.
pub(crate) fn namespace_labels_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {
            "type": "string",
            "maxLength": 63,
            "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
        },
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k.size() <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && !k.startsWith('tender.dev/') && k != 'app.kubernetes.io/managed-by')",
            "message": "namespaceLabels keys must be label keys ([prefix/]name) and not tender.dev/… or app.kubernetes.io/managed-by"
        }]
    })
}

/// Annotations on a Namespace, not tender's own keys.
pub(crate) fn namespace_annotations_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {"type": "string", "maxLength": 4096},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k.size() <= 317 && !k.startsWith('tender.dev/'))",
            "message": "namespaceAnnotations keys must not use tender.dev/"
        }]
    })
}

/// An object in the Bundle's namespace to copy downstream: a Secret, a ConfigMap, or an object of a kind the hub operator allows.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = forbid_namespace_property)]
pub struct DownstreamResource {
    /// API version of the source, e.g. `v1` (the default) or `kyverno.io/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317), regex(pattern = API_VERSION_PATTERN))]
    pub api_version: Option<String>,

    /// Kind of the source: `Secret`, `ConfigMap`, or any kind listed in the hub's `--copyable-kinds` (e.g. `ClusterPolicy`). Other kinds are reported as KindNotAllowed.
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,

    /// Name of the source in the Bundle's namespace; the copy downstream gets the same name.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
}

impl DownstreamResource {
    /// The Secret/ConfigMap kind this entry names, if it is one (`apiVersion` `v1` or unset).
    pub fn source_kind(&self) -> Option<SourceKind> {
        if self.api_version() != "v1" {
            return None;
        }
        SourceKind::parse(&self.kind)
    }

    /// `apiVersion`, defaulted to `v1`.
    pub fn api_version(&self) -> &str {
        self.api_version.as_deref().unwrap_or("v1")
    }

    /// Fleet's identity of an entry when target lists merge (kind case-insensitive, name).
    pub fn fleet_key(&self) -> String {
        format!("{}|{}", self.kind.to_lowercase(), self.name)
    }
}

/// Kinds tender can copy downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceKind {
    /// A core/v1 Secret.
    Secret,
    /// A core/v1 ConfigMap.
    ConfigMap,
}

impl SourceKind {
    /// Parses a `kind` string (exact, case-sensitive, like the apiserver).
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "Secret" => Some(Self::Secret),
            "ConfigMap" => Some(Self::ConfigMap),
            _ => None,
        }
    }

    /// The `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Secret => "Secret",
            Self::ConfigMap => "ConfigMap",
        }
    }
}

impl std::fmt::Display for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Drift correction settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::fleet_only::correct_drift)]
pub struct CorrectDrift {
    /// Re-apply deployed objects that were changed or deleted downstream. Defaults to true.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

impl Default for CorrectDrift {
    fn default() -> Self {
        Self { enabled: true }
    }
}

fn default_true() -> bool {
    true
}

/// Observed state of a Bundle.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleStatus {
    /// metadata.generation of the Bundle this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions: `Ready` with a reason such as NoClustersMatched, SourceNotFound, KindNotAllowed or CopyFeatureDisabled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list_map)]
    pub conditions: Vec<Condition>,

    /// Counts of this Bundle's BundleDeployments by state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<BundleSummary>,

    /// Short strings for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<BundleDisplay>,

    /// Reverse sync: which cluster published which upstreamResources entry, and how fresh it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<crate::upstream::UpstreamPublication>,

    /// With `pollingInterval`: the chart version the hub last resolved `helm.version` to, and deploys everywhere (kept while a poll fails). The `Polled` condition says from where and when it last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// Sharded hubs: one entry per shard replica (`--shard-id`), each written by that replica
    /// alone; the unsharded replica folds them into `summary` and the conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = crate::schema::id_list_map)]
    pub shards: Vec<BundleShardStatus>,

    /// With a rolloutStrategy: clusters not ready at the deployment the Bundle wants (Fleet's `unavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<i32>,

    /// With a rolloutStrategy: released waves that may be not done at once (Fleet's `maxUnavailablePartitions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable_partitions: Option<i32>,

    /// With a rolloutStrategy: waves not done (Fleet's `unavailablePartitions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_partitions: Option<i32>,

    /// With a rolloutStrategy: one entry per wave, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<crate::rollout::PartitionStatus>,
}

/// What one shard replica of the hub reports on a Bundle: its own Clusters only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleShardStatus {
    /// The shard id (`tender.dev/shard` label value of the Clusters it serves).
    pub id: String,
    /// metadata.generation of the Bundle this entry describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Counts of the shard's BundleDeployments of this Bundle by state.
    #[serde(default)]
    pub summary: BundleSummary,
    /// Reverse sync lines of the shard's Clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<crate::upstream::UpstreamPublication>,
}

/// Counts of BundleDeployments by state (for a Bundle) or of a cluster's BundleDeployments (for a Cluster).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleSummary {
    /// Number of BundleDeployments that should exist.
    #[serde(default)]
    pub desired_ready: i32,
    /// BundleDeployments applied at their current deploymentID with every object ready.
    #[serde(default)]
    pub ready: i32,
    /// BundleDeployments the agent has not yet applied at their current deploymentID.
    #[serde(default)]
    pub wait_applied: i32,
    /// BundleDeployments whose last apply failed.
    #[serde(default)]
    pub err_applied: i32,
    /// BundleDeployments with objects changed or deleted downstream (drift).
    #[serde(default)]
    pub modified: i32,
    /// BundleDeployments applied but with objects not ready yet.
    #[serde(default)]
    pub not_ready: i32,
    /// BundleDeployments not yet written or not yet reported on by an agent.
    #[serde(default)]
    pub pending: i32,
}

/// Short status strings of a Bundle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleDisplay {
    /// Ready clusters out of targeted clusters, e.g. `2/3`.
    #[serde(default)]
    pub ready_clusters: String,
    /// One word summary such as Ready, NotReady, Pending, ErrApplied, Modified or Paused.
    #[serde(default)]
    pub state: String,
}
