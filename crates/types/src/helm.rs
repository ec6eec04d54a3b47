//! `Bundle.spec.helm`: a Helm chart rendered by the agent and deployed like inline manifests.
//!
//! The field names are Fleet's (`chart`, `repo`, `version`, `releaseName`, `values`,
//! `valuesFrom`, `takeOwnership`, `timeoutSeconds`, `helmSecretName`). Values are merged in
//! Fleet's order: the inline `values` first, then each `valuesFrom` entry in list order, each
//! deep-merged over the result so far (maps merge key by key, anything else is replaced).

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::schema::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, Unsupported, refuse_fields};

pub(crate) const RELEASE: &str =
    "tender renders with helm template and applies the objects itself; there is no Helm release";

/// Fleet's `helm` options that describe a Helm release, refused with the reason.
const FLEET_ONLY_HELM: &[Unsupported] = &[
    Unsupported::present(
        "valuesFiles",
        "string-array",
        "GitOps-only: use values or valuesFrom",
    ),
    Unsupported::when_true("force", RELEASE),
    Unsupported::when_true("atomic", RELEASE),
    Unsupported::when_true("waitForJobs", RELEASE),
    Unsupported::present("maxHistory", "integer", RELEASE),
    Unsupported::when_false("disableDNS", "templates never resolve DNS (as if true)"),
    Unsupported::when_true(
        "skipSchemaValidation",
        "values are always checked against the chart's values.schema.json",
    ),
    Unsupported::ignored(
        "disableDependencyUpdate",
        "boolean",
        "tender never runs helm dependency update: a chart's subcharts are the ones packed in it, as with true",
    ),
];

/// Declares Fleet's release-only `helm` options on a `helm` object schema (`spec.targets[].helm`)
/// with CEL rules refusing them.
pub(crate) fn refuse_release_fields(helm: &mut Schema, path: &str) {
    refuse_fields(helm, path, FLEET_ONLY_HELM);
}

/// Declares Fleet's release-only `helm` options on the `helm` property of a spec (`spec.helm`
/// of a Bundle or HelmOp) with CEL rules refusing them: structural pruning would otherwise drop
/// them silently and a Fleet user would believe `atomic: true` took effect.
pub(crate) fn fleet_only_helm_fields(spec: &mut Schema) {
    if let Some(helm) = spec.get_mut("properties").and_then(|p| p.get_mut("helm")) {
        let mut s = Schema::try_from(helm.take()).expect("helm is an object schema");
        refuse_fields(&mut s, "spec.helm", FLEET_ONLY_HELM);
        *helm = s.to_value();
    }
}

/// A Helm chart to render downstream; the rendered objects are deployed like `resources`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(has(self.repo) && self.repo != '') ? (self.repo.startsWith('oci://') ? (!has(self.chart) || self.chart == '') : (has(self.chart) && self.chart != '' && !self.chart.startsWith('oci://') && !self.chart.startsWith('https://') && !self.chart.startsWith('http://'))) : true",
        "message": "helm needs a chart name with an https:// repo, an oci:// reference or an absolute https:// chart URL without repo, a chart directory carried in resources (a relative path, \"\" for the root), or (Fleet's form) an oci:// repo with chart empty or absent"
    },
    {
        "rule": "(has(self.repo) && self.repo != '') || !has(self.chart) || self.chart.startsWith('oci://') || self.chart.startsWith('https://') || self.chart.startsWith('http://') || (!self.chart.startsWith('/') && self.chart != '..' && !self.chart.startsWith('../') && !self.chart.endsWith('/..') && !self.chart.contains('/../') && !self.chart.contains('://'))",
        "message": "helm.chart without repo names a chart directory carried in resources: a relative path without '..' segments"
    },
    {
        "rule": "!has(self.chart) || !self.chart.startsWith('oci://') || self.chart.matches('^oci://[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+$')",
        "message": "helm.chart must be oci://<host>[:port]/<path>/<name> (lowercase repository path, no tag: set helm.version)"
    },
    {
        "rule": "!has(self.repo) || !self.repo.startsWith('oci://') || self.repo.matches('^oci://[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+$')",
        "message": "helm.repo must be oci://<host>[:port]/<path>/<name> (lowercase repository path, no tag: set helm.version)"
    },
    {
        "rule": "!has(self.basicHTTP) || !self.basicHTTP || (has(self.chart) && self.chart.startsWith('oci://')) || (has(self.repo) && self.repo.startsWith('oci://'))",
        "message": "helm.basicHTTP applies to oci:// charts only (an HTTP repository's scheme is in helm.repo)"
    }
]))]
pub struct HelmOptions {
    /// Name of the chart in the HTTP chart repository `repo`; or an `oci://registry/path/chart` reference; or an absolute `https://…/chart-1.2.3.tgz` archive URL (repo unset); or, repo unset, the path of a chart directory carried in `resources` as files (`""` or `.` for the root of the files). Empty (or absent) when `repo` is an `oci://` reference (Fleet's form).
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_as_empty"
    )]
    #[schemars(length(max = 512), extend("nullable" = true))]
    pub chart: String,

    /// URL of the HTTP(S) chart repository (the directory holding `index.yaml`), or, as Fleet writes it, the chart's `oci://registry/path/chart` reference with `chart` left empty. Empty means unset, as in Fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^$|^(https?|oci)://"), extend("nullable" = true))]
    pub repo: Option<String>,

    /// Chart version: exact (`1.2.3`) or a semver range (`^1.2`, `>=1.0 <2.0`, `1.x`). Empty means the latest stable version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub version: Option<String>,

    /// Helm release name (`.Release.Name`); defaults to the Bundle's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 53), regex(pattern = DNS_LABEL_PATTERN))]
    pub release_name: Option<String>,

    /// Inline values, merged first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Values>,

    /// Values read on the DOWNSTREAM cluster (usually copies from downstreamResources), merged over the inline values in list order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub values_from: Vec<ValuesFrom>,

    /// Adopt existing downstream objects the chart renders, instead of reporting a conflict.
    #[serde(default)]
    pub take_ownership: bool,

    /// Upper bound in seconds for fetching and rendering the chart (default 120), and for each Helm hook Job or Pod to finish (default 300, as Helm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,

    /// Name of a Secret with `username` and `password` keys (or, for an `oci://` registry, a `.dockerconfigjson` naming its host) for the chart repository or registry, and optionally `cacerts` (PEM certificates the agent trusts for it besides the system roots), read downstream (copy it with downstreamResources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub helm_secret_name: Option<String>,

    /// Talk plain HTTP (no TLS) to the `oci://` registry, as Fleet's `basicHTTP`; for test and in-cluster registries only: credentials then travel unencrypted.
    #[serde(
        default,
        rename = "basicHTTP",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub basic_http: bool,

    /// Skip verifying the chart repository's (or OCI registry's) TLS certificate, as Fleet's `insecureSkipTLSVerify`: anyone on the path can then serve another chart. The BundleDeployment shows `TLSVerified=False` (reason InsecureSkipTLSVerify). Prefer a private CA in the `helmSecretName` Secret's `cacerts` key. See docs/helm.md#private-cas-and-insecureskiptlsverify.
    #[serde(
        default,
        rename = "insecureSkipTLSVerify",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub insecure_skip_tls_verify: bool,

    /// Fleet's switch for values templating: `true` leaves `${ }` in values as written; `false` (the default) renders them per cluster on the hub. See docs/helm.md#values-templated-per-cluster.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disable_pre_process: bool,

    /// Fleet's `templateValues`: each key's template is rendered per cluster, read as YAML and set as that top-level key of the values (after `values` are templated).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(length(max = 64))]
    pub template_values: std::collections::BTreeMap<String, String>,
}

impl HelmOptions {
    /// The release name: `releaseName`, else `bundle`.
    pub fn release_name_or<'a>(&'a self, bundle: &'a str) -> &'a str {
        self.release_name.as_deref().unwrap_or(bundle)
    }

    /// Whether the chart comes from an OCI registry.
    pub fn is_oci(&self) -> bool {
        self.chart.starts_with("oci://")
    }

    /// Whether `chart` is an absolute archive URL (`https://…/x.tgz`, repo unset).
    pub fn is_url(&self) -> bool {
        self.repo.as_deref().is_none_or(str::is_empty)
            && (self.chart.starts_with("https://") || self.chart.starts_with("http://"))
    }

    /// The chart directory inside the Bundle's files when the chart is carried in `resources`
    /// (no repository, not an `oci://` reference nor an absolute URL): `helm.chart` as a
    /// relative path, `""` for the root (`.` and `./x` read as `""` and `x`).
    pub fn files_dir(&self) -> Option<String> {
        if self.repo.as_deref().is_some_and(|r| !r.is_empty()) || self.is_oci() || self.is_url() {
            return None;
        }
        let parts: Vec<&str> = self
            .chart
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        Some(parts.join("/"))
    }

    /// tender's form of the chart source: Fleet's `repo: oci://…` (with `chart` empty) becomes
    /// `chart: oci://…` without `repo`, and an `oci://` chart drops any `repo` (a target may
    /// set one while the Bundle set the other). The agent reads only this form.
    pub fn normalized(mut self) -> Self {
        self.repo = self.repo.filter(|r| !r.is_empty());
        if let Some(repo) = self.repo.take_if(|r| r.starts_with("oci://")) {
            self.chart = repo;
        }
        if self.is_oci() || self.chart.starts_with("https://") || self.chart.starts_with("http://")
        {
            self.repo = None;
        }
        self
    }
}

/// `chart: ` written with nothing after it (null, as Fleet's own e2e assets write an empty
/// chart) reads as empty.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// One source of values: a key of a Secret or of a ConfigMap holding a YAML map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.secretKeyRef) != has(self.configMapKeyRef)",
    "message": "valuesFrom[] must set exactly one of secretKeyRef or configMapKeyRef"
}]))]
pub struct ValuesFrom {
    /// A key of a Secret downstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    /// A key of a ConfigMap downstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// A key of a Secret or ConfigMap on the downstream cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// Name of the object.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// Namespace of the object downstream; defaults to where the copies land (targetNamespace, else defaultNamespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: Option<String>,
    /// Key whose content (a YAML map) is merged into the values; defaults to `values.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

impl KeyRef {
    /// The key, defaulted to `values.yaml` (Fleet's default).
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("values.yaml")
    }
}

/// Free-form Helm values (a JSON/YAML map).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Values(pub Map<String, Value>);

impl JsonSchema for Values {
    fn schema_name() -> Cow<'static, str> {
        "Values".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true
        })
    }
}

/// Deep-merges `over` into `base`: maps merge key by key, any other value replaces (Helm's rule).
pub fn merge_values(base: &mut Map<String, Value>, over: Map<String, Value>) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => merge_values(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn merge_is_deep_and_later_wins() {
        let mut base = map(json!({"a": {"x": 1, "y": 2}, "b": [1, 2], "c": "keep"}));
        merge_values(
            &mut base,
            map(json!({"a": {"y": 3, "z": 4}, "b": [9], "d": null})),
        );
        assert_eq!(
            Value::Object(base),
            json!({"a": {"x": 1, "y": 3, "z": 4}, "b": [9], "c": "keep", "d": null})
        );
    }

    #[test]
    fn a_scalar_replaces_a_map_and_back() {
        let mut base = map(json!({"a": {"x": 1}}));
        merge_values(&mut base, map(json!({"a": "s"})));
        assert_eq!(base["a"], json!("s"));
        merge_values(&mut base, map(json!({"a": {"x": 2}})));
        assert_eq!(base["a"], json!({"x": 2}));
    }

    #[test]
    fn basic_http_is_fleets_name_and_absent_when_off() {
        let mut h = HelmOptions {
            chart: "oci://r/x".into(),
            ..Default::default()
        };
        // Off: not serialised, so deploymentIDs of existing charts do not change.
        assert_eq!(
            serde_json::to_value(&h).unwrap(),
            json!({"chart": "oci://r/x", "takeOwnership": false})
        );
        h.basic_http = true;
        assert_eq!(serde_json::to_value(&h).unwrap()["basicHTTP"], json!(true));
    }

    #[test]
    fn where_the_chart_comes_from() {
        let h = |v: Value| serde_json::from_value::<HelmOptions>(v).unwrap();
        let url = h(json!({"chart": "https://c.example/app-1.0.0.tgz", "repo": ""}));
        assert!(url.is_url() && url.files_dir().is_none());
        let named = h(json!({"chart": "app", "repo": "https://c.example"}));
        assert!(!named.is_url() && named.files_dir().is_none());
        assert!(h(json!({"chart": "oci://r/x"})).files_dir().is_none());
        for (chart, dir) in [
            ("", ""),
            (".", ""),
            ("./", ""),
            ("./chart", "chart"),
            ("a//b/", "a/b"),
        ] {
            assert_eq!(
                h(json!({"chart": chart})).files_dir().as_deref(),
                Some(dir),
                "{chart:?}"
            );
        }
        assert_eq!(h(json!({})).files_dir().as_deref(), Some(""));
        // A target's absolute URL over a Bundle's repository chart drops the repository.
        let merged = HelmOptions {
            chart: "https://c.example/app-2.0.0.tgz".into(),
            ..named
        }
        .normalized();
        assert_eq!(merged.repo, None);
        assert!(merged.is_url());
    }

    #[test]
    fn release_name_defaults_to_the_bundle() {
        let h = HelmOptions {
            chart: "app".into(),
            ..Default::default()
        };
        assert_eq!(h.release_name_or("web"), "web");
        assert!(!h.is_oci());
        assert!(
            HelmOptions {
                chart: "oci://r/x".into(),
                ..Default::default()
            }
            .is_oci()
        );
    }
}
