//! `BundleDeployment`: one Bundle resolved for one cluster, written by the hub, read by the agent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bundle::Manifest;
use crate::schema::{conditions_list_map, kind_name_list_map};

/// What the agent found or did for one downstream object ([`ObjectStatus::state`]).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum ObjectState {
    /// The object is applied and ready.
    Ready,
    /// The object is applied but not ready yet.
    NotReady,
    /// The object should exist downstream but does not.
    #[default]
    Missing,
    /// The object was changed downstream (drift).
    Modified,
    /// The object exists and belongs to someone else (another BundleDeployment or no tender at all).
    Conflict,
    /// Applying the object failed; see the message.
    Error,
}

impl ObjectState {
    /// The state as written in status (`Ready`, `NotReady`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::NotReady => "NotReady",
            Self::Missing => "Missing",
            Self::Modified => "Modified",
            Self::Conflict => "Conflict",
            Self::Error => "Error",
        }
    }

    /// Applied downstream (ready or on its way): nothing blocks what depends on it.
    pub fn is_in_place(self) -> bool {
        matches!(self, Self::Ready | Self::NotReady)
    }
}

impl std::fmt::Display for ObjectState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Bundle resolved for one cluster. Written only by the hub, in the cluster's namespace.
// Printer columns repeat `type_ = ...` by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tender.dev",
    version = "v1alpha1",
    kind = "BundleDeployment",
    namespaced,
    status = "BundleDeploymentStatus",
    shortname = "tbd",
    category = "tender",
    doc = "BundleDeployment is one Bundle resolved for one cluster. The hub writes it into the cluster's namespace; the agent deploys it and reports status.",
    printcolumn(
        name = "Deployment-ID",
        type_ = "string",
        json_path = ".spec.deploymentID",
        priority = 1,
        description = "Content hash of what should be deployed"
    ),
    printcolumn(
        name = "Applied",
        type_ = "string",
        json_path = ".status.appliedDeploymentID",
        description = "Deployment ID the agent last applied"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.display.state",
        description = "Summary state"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BundleDeploymentSpec {
    /// Content hash of the manifests and the options; the agent deploys when this together with its verified copies' content hashes differs from status.appliedDeploymentID.
    #[serde(rename = "deploymentID")]
    pub deployment_id: String,

    /// Do not deploy changes; the agent keeps what is deployed.
    #[serde(default)]
    pub paused: bool,

    /// Resolved deployment options.
    #[serde(default)]
    pub options: BundleDeploymentOptions,

    /// Manifests to apply downstream, in order, after every copy is in place, and the Bundle's files (Fleet's `{name, content, encoding}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2000))]
    pub resources: Vec<Manifest>,

    /// The Bundle's Helm chart, rendered by the agent; its objects are deployed after the copies, like `resources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<crate::helm::HelmOptions>,
}

/// Options of a Bundle, resolved for one cluster (target overrides applied).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleDeploymentOptions {
    /// Namespace for manifests without one (and for copies when targetNamespace is unset); already defaulted to `default`.
    pub default_namespace: String,

    /// Namespace forced on every namespaced manifest and on the copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_namespace: Option<String>,

    /// Fan-out: every namespace copies and namespaced manifests go to (with those targetNamespaceSelector matches); replaces targetNamespace when set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_namespaces: Vec<String>,

    /// Fan-out: existing downstream namespaces whose labels match also receive copies and namespaced manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_namespace_selector: Option<LabelSelector>,

    /// Leave objects in place (without tender's labels) when they are removed from the deployment.
    #[serde(default)]
    pub keep_resources: bool,

    /// Adopt existing objects tender did not create instead of reporting a conflict.
    #[serde(default)]
    pub take_ownership: bool,

    /// Re-apply objects changed or deleted downstream.
    #[serde(default)]
    pub correct_drift: bool,

    /// Sources copied into the cluster namespace on the hub (Secrets and ConfigMaps as copies, other kinds inside carrier Secrets), to be copied downstream before any manifest is applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = kind_name_list_map)]
    pub downstream_resources: Vec<CopiedResource>,

    /// Labels set on each namespace the agent creates for this deployment (the Bundle's namespaceLabels with the target's over them).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub namespace_labels: std::collections::BTreeMap<String, String>,

    /// Annotations set on each namespace the agent creates for this deployment.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub namespace_annotations: std::collections::BTreeMap<String, String>,

    /// The Bundle's `serviceAccount` (`<namespace>/<name>`): the downstream ServiceAccount the agent impersonates to apply this deployment; unset means the agent's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,

    /// The Bundle's `diff`: fields of deployed objects the agent neither applies nor judges as drift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<crate::diff::DiffOptions>,
    /// The Bundle's `rolloutOnCopyChange`: workloads consuming a copied Secret or ConfigMap get the pod-template annotation `tender.dev/copies-hash` and must be rolled and available to be ready.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rollout_on_copy_change: bool,
}

/// A source copied to the cluster namespace on the hub, and where it goes downstream.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct CopiedResource {
    /// API version of the source; unset means `v1` (a Secret or ConfigMap copied as itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `Secret`, `ConfigMap`, or the kind of an object travelling in a carrier Secret.
    pub kind: String,
    /// Name of the source in the Bundle's namespace, which is also the name downstream.
    pub name: String,
    /// Name of the copy (or of the carrier Secret) in this BundleDeployment's namespace on the hub.
    pub copy_name: String,
    /// Unused since decision 0089-signed-copies (the copy's hub signature carries its content hash, so a rotation does not rewrite the BundleDeployment); an agent still accepts a copy whose content hashes to a value set here.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash: String,
}

impl CopiedResource {
    /// `apiVersion`, defaulted to `v1`.
    pub fn api_version(&self) -> &str {
        self.api_version.as_deref().unwrap_or("v1")
    }

    /// Whether this source travels inside a carrier Secret (any kind but a v1 Secret/ConfigMap).
    pub fn is_carried(&self) -> bool {
        !(self.api_version() == "v1" && (self.kind == "Secret" || self.kind == "ConfigMap"))
    }
}

/// Observed state of a BundleDeployment, written by the agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleDeploymentStatus {
    /// The spec.deploymentID the agent last deployed successfully (with the copies in appliedCopiesID).
    #[serde(
        default,
        rename = "appliedDeploymentID",
        skip_serializing_if = "Option::is_none"
    )]
    pub applied_deployment_id: Option<String>,

    /// With copies: the deployment the agent last applied including the content hashes of the copies it verified (tender_types::hash::effective_deployment_id); a rotation changes it without a new deploymentID. The hub computes the same from the copies it wrote.
    #[serde(
        default,
        rename = "appliedCopiesID",
        skip_serializing_if = "Option::is_none"
    )]
    pub applied_copies_id: Option<String>,

    /// metadata.generation of the BundleDeployment this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions: `Ready`, `Deployed`, `ResourcesCopied`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list_map)]
    pub conditions: Vec<Condition>,

    /// State of every deployed object, copies first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ObjectStatus>,

    /// Objects changed or deleted downstream since they were applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modified: Vec<ObjectRef>,

    /// Objects applied but not ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_ready: Vec<ObjectRef>,

    /// Short strings for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<BundleDeploymentDisplay>,

    /// Reverse sync: each upstream entry as the agent copied it into its placeholder (written with field manager `tender-agent-upstream`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<crate::upstream::UpstreamObjectStatus>,
}

/// State of one downstream object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    /// API version of the object.
    pub api_version: String,
    /// Kind of the object.
    pub kind: String,
    /// Namespace of the object; empty for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the object.
    pub name: String,
    /// Ready, NotReady, Missing, Modified, Conflict or Error.
    pub state: ObjectState,
    /// Why the object is not Ready; never contains Secret data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A reference to one downstream object.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// API version of the object.
    pub api_version: String,
    /// Kind of the object.
    pub kind: String,
    /// Namespace of the object; empty for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the object.
    pub name: String,
}

impl ObjectStatus {
    /// The status `state` (with `message`) of object `key`.
    pub fn new(key: &ObjectRef, state: ObjectState, message: Option<String>) -> Self {
        Self {
            api_version: key.api_version.clone(),
            kind: key.kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            state,
            message,
        }
    }

    /// Which object this status is about.
    pub fn object(&self) -> ObjectRef {
        ObjectRef {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

impl ObjectRef {
    /// An object reference from its parts.
    pub fn new(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }
}

/// `Kind ns/name` (or `Kind name` when cluster-scoped), as messages name an object.
impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Short status strings of a BundleDeployment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleDeploymentDisplay {
    /// One word summary such as Ready, NotReady, WaitApplied, ErrApplied, Modified or Paused.
    #[serde(default)]
    pub state: String,
}
