//! `HelmOp`: a Helm chart for many clusters in the shape of Fleet's `HelmOp`, for people who
//! come from Fleet. The hub turns each one into a Bundle it owns ([`HelmOpSpec::bundle_spec`])
//! and reports that Bundle's status back on the HelmOp.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::bundle::{BundleDisplay, BundleSpec, BundleSummary, BundleTarget, CorrectDrift};
use crate::customize::merge_by_key;
use crate::helm::HelmOptions;
use crate::schema::{
    DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, Unsupported, conditions_list_map, kind_name_list_map,
};
use crate::{DownstreamResource, SourceKind};

/// A Helm chart deployed to every targeted cluster, written like Fleet's HelmOp.
// Printer columns repeat `type_ = ...` by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tender.dev",
    version = "v1alpha1",
    kind = "HelmOp",
    namespaced,
    status = "HelmOpStatus",
    shortname = "thelmop",
    category = "tender",
    doc = "HelmOp deploys a Helm chart to the clusters it targets, with Fleet's HelmOp field names. The hub writes a Bundle of the same name, owned by the HelmOp, and reports its status here.",
    printcolumn(
        name = "Chart",
        type_ = "string",
        json_path = ".spec.helm.chart",
        description = "Chart name or oci:// reference"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.helm.version",
        description = "Requested chart version or range"
    ),
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
        description = "Summary state of the HelmOp"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = fleet_only_spec_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(has(self.namespace) && has(self.targetNamespace))",
        "message": "spec.namespace (Fleet's name) and spec.targetNamespace mean the same thing: set one of them"
    },
    {
        "rule": "(has(self.helm.repo) && self.helm.repo != '') || (has(self.helm.chart) && (self.helm.chart.startsWith('oci://') || self.helm.chart.startsWith('https://') || self.helm.chart.startsWith('http://')))",
        "message": "a HelmOp's chart comes from a repository (chart and repo), an oci:// reference or an absolute https:// chart URL: a HelmOp carries no files (a chart directory is a Bundle's, see docs/helm.md)"
    },
    {
        "rule": "!(has(self.helmSecretName) && has(self.helm.helmSecretName))",
        "message": "set spec.helmSecretName (a Secret in this namespace, copied downstream for you) or spec.helm.helmSecretName (a Secret already downstream), not both"
    }
]))]
pub struct HelmOpSpec {
    /// The chart: name and repository (or oci:// reference), version, release name, values and valuesFrom. valuesFrom is read on the downstream cluster, so it normally names copies from downstreamResources. See docs/helm.md.
    pub helm: HelmOptions,

    /// A Secret in this HelmOp's namespace with `username` and `password` for the chart repository. tender copies it to every targeted cluster (it is added to downstreamResources) and the agent authenticates with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub helm_secret_name: Option<String>,

    /// Fleet's switch: skip verifying the chart repository's TLS certificate (carried into the Bundle's `helm.insecureSkipTLSVerify`; the BundleDeployments show `TLSVerified=False`). Prefer `cacerts` in the helmSecretName Secret. See docs/helm.md#private-cas-and-insecureskiptlsverify.
    #[serde(
        default,
        rename = "insecureSkipTLSVerify",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub insecure_skip_tls_verify: bool,

    /// Labels set on the Bundle the hub writes for this HelmOp.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "bundle_labels_schema")]
    pub labels: BTreeMap<String, String>,

    /// Which clusters receive the chart. Each cluster is matched by the first target that selects it. A target may set several of clusterName, clusterSelector, clusterGroup and clusterGroupSelector (all must hold, as in Fleet). No targets: Fleet's default target, the ClusterGroup `default` of this namespace (see docs/migrating-from-fleet.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub targets: Vec<BundleTarget>,

    /// Namespace for rendered objects that do not set one (the release namespace when namespace is unset). Defaults to `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub default_namespace: Option<String>,

    /// Fleet's name for the target namespace: every namespaced object and the copies go here, and it is the release namespace. Same as targetNamespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: Option<String>,

    /// tender's name for `namespace` (as on a Bundle); set one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub target_namespace: Option<String>,

    /// Secrets and ConfigMaps in this HelmOp's namespace copied to every targeted cluster before the chart is deployed there (values for valuesFrom, credentials). Needs the EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM feature gate on hub and agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), transform = kind_name_list_map)]
    pub downstream_resources: Vec<DownstreamResource>,

    /// Leave the deployed objects and copies in place (without tender's labels) when a cluster is no longer targeted or the HelmOp is deleted.
    #[serde(default)]
    pub keep_resources: bool,

    /// Drift correction for deployed objects; absent means enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correct_drift: Option<CorrectDrift>,

    /// Stop rolling out changes; what is already deployed stays.
    #[serde(default)]
    pub paused: bool,

    /// Downstream ServiceAccount (`<namespace>/<name>`) the agent impersonates to deploy this chart: the Bundle's `serviceAccount` (decision 0079). The downstream owner must allow it (`--allow-bundle-service-accounts`), else `ServiceAccountNotAllowed`. Fleet's plain name is refused: it does not say which namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 317), extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",
        "message": "serviceAccount is <namespace>/<name> of a downstream ServiceAccount (tender's form; Fleet's plain name does not say which namespace)"
    }]))]
    pub service_account: Option<String>,

    /// How often the hub looks for a newer chart version matching `helm.version` (a range, or empty: the latest stable) and rolls it out: a Go duration as Fleet accepts it (`5s`, `1h30m`); `0` (or absent) means no polling, as in Fleet: a range is then resolved once per spec by the hub (Fleet's rule). The hub looks at most every 15s: a shorter interval is raised to that and reported (`PollingInterval=False`, reason PollingIntervalRaised). An exact version is never polled. The version found is in `status.version`. See docs/helm.md#polling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::bundle::polling_interval_schema")]
    pub polling_interval: Option<String>,

    /// Fleet's `diff`: `comparePatches` lists fields of deployed objects that another field manager owns (an HPA's `spec.replicas`); tender neither applies them nor corrects them as drift. See docs/helm.md#comparepatches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<crate::diff::DiffOptions>,
    /// Bundles (or HelmOps, by name) of this namespace that must be in an accepted state on a cluster before the chart is deployed or changed there; passed to this HelmOp's Bundle. See docs/dependencies.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub depends_on: Vec<crate::BundleRef>,
    /// Labels the agent sets on the namespaces it creates for this chart. A namespace tender did not create is never changed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::bundle::namespace_labels_schema")]
    pub namespace_labels: BTreeMap<String, String>,

    /// Annotations the agent sets on the namespaces it creates for this chart. A namespace tender did not create is never changed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::bundle::namespace_annotations_schema")]
    pub namespace_annotations: BTreeMap<String, String>,
    /// Roll chart, version and values changes out in waves, as a Bundle's rolloutStrategy (carried into the HelmOp's Bundle). See docs/rollouts.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<crate::rollout::RolloutStrategy>,
}

impl HelmOpSpec {
    /// The spec of the Bundle the hub writes for this HelmOp: the same targets, namespaces,
    /// copies and options, the chart, and `helmSecretName` added to the copies (Fleet reads it
    /// on the hub; tender's agent reads it downstream, from its copy).
    pub fn bundle_spec(&self) -> BundleSpec {
        let mut helm = self.helm.clone();
        helm.insecure_skip_tls_verify |= self.insecure_skip_tls_verify;
        let mut copies = self.downstream_resources.clone();
        let mut targets = self.targets.clone();
        // Fleet merges a target's downstreamResources with the HelmOp's by identity (kind,
        // name); a Bundle target's list replaces the Bundle's, so the merged list goes there.
        for t in &mut targets {
            if let Some(list) = t.downstream_resources.as_mut().filter(|l| !l.is_empty()) {
                *list = merge_by_key(
                    &self.downstream_resources,
                    list,
                    DownstreamResource::fleet_key,
                );
            } else {
                t.downstream_resources = None;
            }
        }
        if let Some(secret) = &self.helm_secret_name {
            helm.helm_secret_name = Some(secret.clone());
            add_secret(&mut copies, secret);
            // A per-target list replaces the HelmOp's, so it needs the credentials too.
            for t in &mut targets {
                if let Some(list) = &mut t.downstream_resources {
                    add_secret(list, secret);
                }
            }
        }
        if targets.is_empty() {
            targets.push(default_target());
        }
        BundleSpec {
            targets,
            default_namespace: self.default_namespace.clone(),
            target_namespace: self
                .namespace
                .clone()
                .or_else(|| self.target_namespace.clone()),
            downstream_resources: copies,
            helm: Some(helm),
            keep_resources: self.keep_resources,
            correct_drift: self.correct_drift.clone(),
            paused: self.paused,
            service_account: self.service_account.clone(),
            diff: self.diff.clone(),
            polling_interval: self.polling_interval.clone(),
            depends_on: self.depends_on.clone(),
            namespace_labels: self.namespace_labels.clone(),
            namespace_annotations: self.namespace_annotations.clone(),
            rollout_strategy: self.rollout_strategy.clone(),
            ..BundleSpec::default()
        }
    }
}

/// The target Fleet's HelmOp controller gives a HelmOp without targets: the ClusterGroup
/// `default` of its namespace (Fleet's `calculateBundle`). Neither Fleet's controller nor
/// tender creates that group; Fleet's bootstrap creates one in `fleet-local` only.
pub const DEFAULT_TARGET_GROUP: &str = "default";

fn default_target() -> BundleTarget {
    BundleTarget {
        name: Some(DEFAULT_TARGET_GROUP.to_string()),
        cluster_group: Some(DEFAULT_TARGET_GROUP.to_string()),
        ..BundleTarget::default()
    }
}

fn add_secret(list: &mut Vec<DownstreamResource>, name: &str) {
    if !list
        .iter()
        .any(|r| r.source_kind() == Some(SourceKind::Secret) && r.name == name)
    {
        list.push(DownstreamResource {
            api_version: None,
            kind: SourceKind::Secret.as_str().to_string(),
            name: name.to_string(),
        });
    }
}

/// Observed state of a HelmOp: its Bundle's status, for this HelmOp's generation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HelmOpStatus {
    /// metadata.generation of the HelmOp this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The Bundle's conditions (`Ready`, `ResourcesCopied`, …), or `Ready=False` with reason BundleConflict when a Bundle of the same name exists that this HelmOp does not own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list_map)]
    pub conditions: Vec<Condition>,

    /// Counts of the Bundle's BundleDeployments by state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<BundleSummary>,

    /// Short strings for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<BundleDisplay>,

    /// With `pollingInterval`: the chart version the hub resolved `helm.version` to and deploys (the Bundle's `status.version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Label keys and values as the apiserver accepts them on the Bundle (checked at admission,
/// so a bad label is refused on the HelmOp rather than failing every write of its Bundle).
fn bundle_labels_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {
            "type": "string",
            "maxLength": 63,
            "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
        },
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k.size() <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && !k.startsWith('tender.dev/'))",
            "message": "spec.labels keys must be label keys ([prefix/]name, name at most 63 characters) and not use tender.dev/"
        }]
    })
}

/// Fleet's HelmOp fields tender does not implement beyond the Bundle's
/// ([`crate::fleet_only`]), refused at admission with the reason.
const FLEET_ONLY_SPEC: &[Unsupported] = &[Unsupported::present(
    "resources",
    "array",
    "inline manifests go in a Bundle",
)];

fn fleet_only_spec_fields(schema: &mut Schema) {
    crate::fleet_only::helmop_spec(schema, FLEET_ONLY_SPEC);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> HelmOpSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_bundle_carries_the_chart_targets_and_options() {
        let h = spec(json!({
            "helm": {"chart": "app", "repo": "https://charts.example.com", "version": "^1",
                     "valuesFrom": [{"secretKeyRef": {"name": "vals"}}]},
            "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
            "defaultNamespace": "apps",
            "namespace": "web",
            "downstreamResources": [{"kind": "Secret", "name": "vals"}],
            "keepResources": true,
            "correctDrift": {"enabled": false},
            "paused": true,
            "serviceAccount": "apps/deployer"
        }));
        let b = h.bundle_spec();
        assert_eq!(b.service_account.as_deref(), Some("apps/deployer"));
        assert_eq!(b.targets, h.targets);
        assert_eq!(b.default_namespace.as_deref(), Some("apps"));
        assert_eq!(
            b.target_namespace.as_deref(),
            Some("web"),
            "Fleet's namespace"
        );
        assert_eq!(b.downstream_resources, h.downstream_resources);
        assert_eq!(b.helm.as_ref(), Some(&h.helm));
        assert!(b.keep_resources && b.paused && !b.correct_drift_enabled());
        assert!(b.resources.is_empty() && !b.take_ownership);

        let t =
            spec(json!({"helm": {"chart": "app", "repo": "https://c"}, "targetNamespace": "x"}));
        assert_eq!(t.bundle_spec().target_namespace.as_deref(), Some("x"));
        assert!(!t.bundle_spec().helm.unwrap().insecure_skip_tls_verify);
    }

    #[test]
    fn without_targets_the_bundle_targets_the_default_group_as_in_fleet() {
        let h = spec(json!({"helm": {"chart": "app", "repo": "https://c"}}));
        let b = h.bundle_spec();
        assert_eq!(b.targets.len(), 1);
        assert_eq!(b.targets[0].name.as_deref(), Some("default"));
        assert_eq!(b.targets[0].cluster_group.as_deref(), Some("default"));
        assert!(b.targets[0].cluster_selector.is_none() && b.targets[0].cluster_name.is_none());
        let with = spec(json!({"helm": {"chart": "app", "repo": "https://c"},
                               "targets": [{"clusterName": "a"}]}));
        assert_eq!(
            with.bundle_spec().targets,
            with.targets,
            "targets given: no default"
        );
    }

    #[test]
    fn insecure_skip_tls_verify_is_carried_into_the_bundle_helm() {
        let h = spec(json!({
            "helm": {"chart": "app", "repo": "https://c"},
            "insecureSkipTLSVerify": true
        }));
        let helm = h.bundle_spec().helm.unwrap();
        assert!(helm.insecure_skip_tls_verify);
        assert_eq!(
            serde_json::to_value(&helm).unwrap()["insecureSkipTLSVerify"],
            json!(true)
        );
    }

    #[test]
    fn depends_on_is_passed_to_the_bundle() {
        let h = spec(json!({
            "helm": {"chart": "app"},
            "dependsOn": [{"name": "db", "acceptedStates": ["Ready", "Modified"]}]
        }));
        let b = h.bundle_spec();
        assert_eq!(b.depends_on, h.depends_on);
        assert_eq!(b.depends_on[0].name.as_deref(), Some("db"));
        assert!(b.depends_on[0].accepts(crate::BundleState::Modified));
        assert!(!b.depends_on[0].accepts(crate::BundleState::NotReady));
    }

    #[test]
    fn helm_secret_name_is_copied_for_the_agent() {
        let h = spec(json!({
            "helm": {"chart": "app", "repo": "https://c"},
            "helmSecretName": "repo-auth",
            "downstreamResources": [{"kind": "ConfigMap", "name": "repo-auth"}],
            "targets": [
                {"clusterName": "a", "downstreamResources": [{"kind": "Secret", "name": "repo-auth"}]},
                {"clusterName": "b", "downstreamResources": []},
                {"clusterName": "c"}
            ]
        }));
        let b = h.bundle_spec();
        let names = |l: &[DownstreamResource]| {
            l.iter()
                .map(|r| format!("{}/{}", r.kind, r.name))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            b.helm.unwrap().helm_secret_name.as_deref(),
            Some("repo-auth")
        );
        assert_eq!(
            names(&b.downstream_resources),
            ["ConfigMap/repo-auth", "Secret/repo-auth"]
        );
        assert_eq!(
            names(b.targets[0].downstream_resources.as_ref().unwrap()),
            ["ConfigMap/repo-auth", "Secret/repo-auth"],
            "merged with the HelmOp's by identity, listed once"
        );
        assert!(
            b.targets[1].downstream_resources.is_none(),
            "an empty list keeps the HelmOp's, as in Fleet"
        );
        assert!(b.targets[2].downstream_resources.is_none());
    }

    #[test]
    fn fleet_only_fields_are_declared_and_refused() {
        let crd = serde_json::to_value(HelmOp::crd_for_tests()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let text = spec.to_string();
        for needle in [
            "spec.helm.atomic: true is not supported by tender",
            "spec.targets[].helm.atomic: true is not supported by tender",
            "spec.correctDrift.force: true is not supported by tender",
            "pollingInterval must be 0 or a valid Go duration",
        ] {
            assert!(text.contains(needle), "{needle}");
        }
        assert_eq!(
            spec["properties"]["helm"]["properties"]["valuesFiles"]["type"],
            json!("array")
        );
    }

    impl HelmOp {
        fn crd_for_tests() -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition{
            <HelmOp as kube::CustomResourceExt>::crd()
        }
    }
}
