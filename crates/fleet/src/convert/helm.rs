//! A fleet.yaml's `helm` options in tender's form, and the files they may read.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::resources::Refused;
use crate::schema::is_empty;

/// The directory being converted and the tree `tender apply` was given, which every file a
/// fleet.yaml names must resolve into: a fleet.yaml names files of its repository, never of
/// the machine running `tender apply` (a values file `/root/.kube/config` would otherwise be
/// read into the Bundle's values and written to the hub).
pub(crate) struct Dir<'a> {
    /// The fleet.yaml's directory.
    pub path: &'a Path,
    /// The tree given to `tender apply`, canonical.
    pub root: &'a Path,
}

impl Dir<'_> {
    /// `rel` below this directory, refused when it resolves (symlinks followed) outside the
    /// tree.
    fn inside(&self, rel: &str) -> Result<PathBuf, String> {
        let p = std::fs::canonicalize(self.path.join(rel)).map_err(|e| format!("{rel}: {e}"))?;
        if p.starts_with(self.root) {
            Ok(p)
        } else {
            Err(format!(
                "{rel} resolves outside the directory tender apply was given ({}): a fleet.yaml reads only files of its repository",
                self.root.display()
            ))
        }
    }
}

pub(super) fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Maps merged key by key, anything else replaced (wrangler's `data.MergeMaps`).
pub(super) fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// `helm.values` with the `valuesFiles` merged over it, in order (Fleet's `generateValues`).
pub(super) fn values_with_files(
    dir: &Dir<'_>,
    helm: &Value,
    path: &str,
) -> Result<Option<Value>, Refused> {
    let mut values = helm.get("values").cloned().unwrap_or(json!({}));
    if values.is_null() {
        values = json!({});
    }
    for (i, f) in helm
        .get("valuesFiles")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = f.as_str().unwrap_or_default();
        let p = format!("{path}.valuesFiles[{i}]");
        let file = dir.inside(name).map_err(|e| (p.clone(), e))?;
        let text =
            std::fs::read_to_string(file).map_err(|e| (p.clone(), format!("{name}: {e}")))?;
        let parsed: Option<Value> =
            serde_saphyr::from_str(&text).map_err(|e| (p, format!("{name}: {e}")))?;
        merge(&mut values, parsed.unwrap_or(json!({})));
    }
    Ok((!is_empty(&values)).then_some(values))
}

/// Fleet's helm options → tender's, the release-only defaults dropped.
pub(super) fn helm_options(dir: &Dir<'_>, helm: &Value, path: &str) -> Result<Value, Refused> {
    let mut out = Map::new();
    for key in [
        "chart",
        "repo",
        "version",
        "releaseName",
        "timeoutSeconds",
        "valuesFrom",
        "takeOwnership",
        "disablePreProcess",
        "templateValues",
    ] {
        if let Some(v) = helm.get(key).filter(|v| !is_empty(v)) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(Value::Array(list)) = out.get_mut("valuesFrom") {
        *list = split_values_from(list);
    }
    if let Some(values) = values_with_files(dir, helm, path)? {
        out.insert("values".into(), values);
    }
    Ok(Value::Object(out))
}

/// Fleet reads a `valuesFrom` entry naming both a ConfigMap and a Secret as two: the
/// ConfigMap's values merged first, then the Secret's (`helmdeployer.valuesFrom`); tender's
/// entries name one source each, so such an entry becomes those two, in that order.
pub(super) fn split_values_from(list: &[Value]) -> Vec<Value> {
    list.iter()
        .flat_map(
            |entry| match (entry.get("configMapKeyRef"), entry.get("secretKeyRef")) {
                (Some(cm), Some(secret)) => vec![
                    json!({"configMapKeyRef": cm}),
                    json!({"secretKeyRef": secret}),
                ],
                _ => vec![entry.clone()],
            },
        )
        .collect()
}
