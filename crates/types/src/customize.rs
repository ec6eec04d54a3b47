//! Per-cluster Helm options, as Fleet makes them: the first matching target's `helm` merged
//! over the Bundle's ([`merge_helm`], Fleet's `options.Merge`), then the values pre-processed
//! for that cluster ([`preprocess`]: `global.fleet.clusterLabels.<label>` strings replaced
//! and `${ }` templates rendered with the cluster's context). Pure: the hub calls it per
//! cluster while planning (decision 0100-fleet-values-templating).

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::helm::{HelmOptions, Values, ValuesFrom, merge_values};
use crate::schema::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN};
use crate::template::{self, TemplateError};

/// Fleet's `targets[].helm`: what a target changes in the chart for the clusters it selects.
/// Set fields replace the Bundle's (`values` deep-merge, `valuesFrom` merge by identity).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = fleet_only_target_helm_fields)]
pub struct HelmOverride {
    /// Replaces the chart name (or oci:// reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub chart: Option<String>,
    /// Replaces the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^(https?|oci)://"))]
    pub repo: Option<String>,
    /// Replaces the chart version (exact or a range).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub version: Option<String>,
    /// Replaces the release name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 53), regex(pattern = DNS_LABEL_PATTERN))]
    pub release_name: Option<String>,
    /// Deep-merged over the Bundle's values (maps key by key, anything else replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Values>,
    /// Merged with the Bundle's by identity (kind, namespace, name, key): an entry naming the same key replaces it in place, others are appended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub values_from: Vec<ValuesFrom>,
    /// Adopt existing objects for these clusters (or-ed with the Bundle's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub take_ownership: bool,
    /// Replaces the timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,
    /// Turns values templating off for these clusters (or-ed with the Bundle's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disable_pre_process: bool,
    /// Set over the Bundle's templateValues key by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 64))]
    pub template_values: BTreeMap<String, String>,
    /// Not per target: the credentials Secret is the Bundle's (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub helm_secret_name: Option<String>,
}

fn fleet_only_target_helm_fields(schema: &mut Schema) {
    crate::helm::refuse_release_fields(schema, "spec.targets[].helm");
    let rules = schema
        .ensure_object()
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Some(a) = rules.as_array_mut() {
        a.push(serde_json::json!({
            "rule": "!has(self.helmSecretName)",
            "message": "spec.targets[].helm.helmSecretName is not supported by tender: the chart's credentials are the Bundle's (spec.helm.helmSecretName or the HelmOp's helmSecretName)"
        }));
    }
}

/// The Bundle's chart with a target's `helm` merged over it, as Fleet's `options.Merge` does.
pub fn merge_helm(base: &HelmOptions, over: &HelmOverride) -> HelmOptions {
    let mut h = base.clone();
    if let Some(c) = over.chart.as_ref().filter(|c| !c.is_empty()) {
        h.chart = c.clone();
    }
    if let Some(r) = over.repo.as_ref().filter(|r| !r.is_empty()) {
        h.repo = Some(r.clone());
    }
    if let Some(v) = over.version.as_ref().filter(|v| !v.is_empty()) {
        h.version = Some(v.clone());
    }
    if let Some(r) = &over.release_name {
        h.release_name = Some(r.clone());
    }
    if let Some(t) = over.timeout_seconds {
        h.timeout_seconds = Some(t);
    }
    match (&mut h.values, &over.values) {
        (Some(b), Some(o)) => merge_values(&mut b.0, o.0.clone()),
        (b @ None, Some(o)) => *b = Some(o.clone()),
        _ => {}
    }
    h.template_values.extend(
        over.template_values
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    h.values_from = merge_by_key(&h.values_from, &over.values_from, values_from_key);
    h.take_ownership |= over.take_ownership;
    h.disable_pre_process |= over.disable_pre_process;
    h
}

/// Fleet's `merge.ByKey`: `custom` entries replace `base` entries with the same key in place,
/// the rest are appended; an entry without a key is always appended.
pub fn merge_by_key<T: Clone>(base: &[T], custom: &[T], key: impl Fn(&T) -> String) -> Vec<T> {
    let mut out = base.to_vec();
    let mut seen = std::collections::BTreeSet::new();
    for c in custom {
        let k = key(c);
        if !k.is_empty() {
            if !seen.insert(k.clone()) {
                continue;
            }
            if let Some(slot) = out.iter_mut().position(|b| key(b) == k) {
                out[slot] = c.clone();
                continue;
            }
        }
        out.push(c.clone());
    }
    out
}

fn values_from_key(v: &ValuesFrom) -> String {
    let (kind, r) = match (&v.config_map_key_ref, &v.secret_key_ref) {
        (Some(r), _) => ("configmap", r),
        (None, Some(r)) => ("secret", r),
        _ => return String::new(),
    };
    format!(
        "{kind}|{}|{}|{}",
        r.namespace.as_deref().unwrap_or_default(),
        r.name,
        r.key()
    )
}

/// What Fleet replaces a value string starting with this by: that cluster label's value (an
/// empty string when the cluster lacks it).
pub const CLUSTER_LABEL_PREFIX: &str = "global.fleet.clusterLabels.";

/// A values template that failed for one cluster: where, and why (never a value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {error}")]
pub struct ValuesError {
    /// Path of the failing value, e.g. `helm.values.image.tag`.
    pub path: String,
    /// What failed.
    pub error: TemplateError,
}

/// Pre-processes `helm`'s values for one cluster (Fleet's `preprocessHelmValues`):
/// `global.fleet.clusterLabels.<label>` strings become the label's value, then, unless
/// `disablePreProcess`, every `${ }` in keys and string values is rendered against `ctx`
/// ([`template::context`]) and the result read as a YAML scalar (so `${ .ClusterValues.n }`
/// can make a number), and each `templateValues` entry is rendered, read as YAML and set as
/// that top-level key. All of them share one [`template::Budget`]: a cluster's values take at
/// most [`template::MAX_STEPS`] steps and [`template::MAX_RENDER_TIME`], however many strings
/// are templated.
pub fn preprocess(
    helm: &mut HelmOptions,
    labels: &BTreeMap<String, String>,
    ctx: &Value,
) -> Result<(), ValuesError> {
    if let Some(values) = helm.values.as_mut() {
        label_values(&mut values.0, labels, 0);
    }
    if helm.disable_pre_process {
        return Ok(());
    }
    let mut r = Renderer {
        ctx,
        budget: template::Budget::default(),
    };
    if let Some(values) = helm.values.as_mut() {
        let mut path = String::from("helm.values");
        values.0 = r.map(std::mem::take(&mut values.0), &mut path, 0)?;
    }
    for (k, t) in std::mem::take(&mut helm.template_values) {
        let path = format!("helm.templateValues.{k}");
        let text =
            template::render_within(&t, ctx, &mut r.budget).map_err(|error| ValuesError {
                path: path.clone(),
                error,
            })?;
        let v: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_saphyr::from_str(&text).map_err(|_| ValuesError {
                path,
                error: TemplateError("the rendered template is not YAML".into()),
            })?
        };
        helm.values
            .get_or_insert_with(Values::default)
            .0
            .insert(k, v);
    }
    Ok(())
}

const MAX_DEPTH: usize = 50;

fn label_values(map: &mut Map<String, Value>, labels: &BTreeMap<String, String>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for v in map.values_mut() {
        match v {
            Value::String(s) if s.starts_with(CLUSTER_LABEL_PREFIX) => {
                let label = &s[CLUSTER_LABEL_PREFIX.len()..];
                *s = labels.get(label).cloned().unwrap_or_default();
            }
            Value::Object(m) => label_values(m, labels, depth + 1),
            // As Fleet: maps inside lists, not strings inside lists.
            Value::Array(a) => {
                for item in a {
                    if let Value::Object(m) = item {
                        label_values(m, labels, depth + 1);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The values of one cluster being rendered, with the budget they share.
struct Renderer<'a> {
    ctx: &'a Value,
    budget: template::Budget,
}

impl Renderer<'_> {
    fn render(&mut self, text: &str, path: &str) -> Result<String, ValuesError> {
        template::render_within(text, self.ctx, &mut self.budget).map_err(|error| ValuesError {
            path: path.to_string(),
            error,
        })
    }

    fn map(
        &mut self,
        map: Map<String, Value>,
        path: &mut String,
        depth: usize,
    ) -> Result<Map<String, Value>, ValuesError> {
        let mut out = Map::new();
        for (k, v) in map {
            let len = path.len();
            path.push('.');
            path.push_str(&k);
            let key = if template::has_actions(&k) {
                self.render(&k, path)?
            } else {
                k
            };
            let v = self.value(v, path, depth + 1)?;
            path.truncate(len);
            out.insert(key, v);
        }
        Ok(out)
    }

    fn value(&mut self, v: Value, path: &mut String, depth: usize) -> Result<Value, ValuesError> {
        if depth > MAX_DEPTH {
            return Err(ValuesError {
                path: path.clone(),
                error: TemplateError("values nested too deeply".into()),
            });
        }
        Ok(match v {
            Value::String(s) if template::has_actions(&s) => {
                let text = self.render(&s, path)?;
                scalar(text, s.contains('\n'))
            }
            Value::Object(m) => Value::Object(self.map(m, path, depth)?),
            Value::Array(a) => {
                let mut out = Vec::with_capacity(a.len());
                for (i, item) in a.into_iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    out.push(self.value(item, path, depth + 1)?);
                    path.truncate(len);
                }
                Value::Array(out)
            }
            v => v,
        })
    }
}

/// A rendered single-line string read as Fleet reads it back, as YAML: `3` a number, `"x"`
/// the string x, nothing a null, `{"a":1}` (what `toJson` makes) a map; text that is not YAML
/// stays the string it is.
fn scalar(text: String, multiline: bool) -> Value {
    if multiline {
        return Value::String(text);
    }
    if text.trim().is_empty() {
        return Value::Null;
    }
    serde_saphyr::from_str::<Value>(&text).unwrap_or(Value::String(text))
}

#[cfg(test)]
mod tests;
