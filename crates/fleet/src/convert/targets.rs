//! A fleet.yaml's targets in Fleet's order (`targets`, `targetCustomizations`, `overrideTargets`
//! or the targets file) and in tender's form.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::resources::Refused;
use crate::schema::is_empty;

use super::helm::{Dir, helm_options, str_at};

/// `--targets-file`: Fleet's BundleSpec holding `targets` and `targetRestrictions`.
#[derive(Clone, Debug, Default)]
pub(crate) struct TargetsFile {
    targets: Vec<Value>,
    restrictions: Vec<Value>,
}

pub(crate) fn read_targets_file(path: &Path) -> Result<TargetsFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let v: Value = serde_saphyr::from_str(&text).map_err(|e| e.to_string())?;
    let list = |k: &str| {
        v.get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    Ok(TargetsFile {
        targets: list("targets"),
        restrictions: list("targetRestrictions"),
    })
}

pub(super) const SELECTORS: [&str; 4] = [
    "clusterName",
    "clusterSelector",
    "clusterGroup",
    "clusterGroupSelector",
];

pub(super) fn selectors(t: &Value) -> Map<String, Value> {
    SELECTORS
        .iter()
        .filter_map(|k| {
            t.get(*k)
                .filter(|v| !is_empty(v) || v.is_object())
                .map(|v| (k.to_string(), v.clone()))
        })
        .collect()
}

/// A target in tender's form (selectors, namespaces, per-target helm and namespace metadata).
pub(super) fn target(
    dir: &Dir<'_>,
    t: &Value,
    path: &str,
    spec_chart: &str,
    refused: &mut Vec<Refused>,
) -> Value {
    let chart = str_at(t, &["helm", "chart"]);
    let remote = !str_at(t, &["helm", "repo"]).is_empty()
        || ["oci://", "http://", "https://"]
            .iter()
            .any(|p| chart.starts_with(p));
    if !chart.is_empty() && !remote && chart != spec_chart {
        refused.push((
            format!("{path}.helm.chart"),
            "a local chart of its own for this target: a Bundle carries one chart's files; make it a fleet.yaml directory of its own".into(),
        ));
    }
    if t.get("serviceAccount").is_some_and(|v| !is_empty(v)) {
        refused.push((
            format!("{path}.serviceAccount"),
            "tender's targets carry no serviceAccount: set it for the whole fleet.yaml".into(),
        ));
    }
    if t.get("createNamespace") == Some(&Value::Bool(false)) {
        refused.push((
            format!("{path}.createNamespace"),
            "tender always creates the target namespace".into(),
        ));
    }
    let mut out = selectors(t);
    for key in [
        "name",
        "doNotDeploy",
        "namespaceLabels",
        "namespaceAnnotations",
        "keepResources",
        "downstreamResources",
        "defaultNamespace",
    ] {
        if let Some(v) = t.get(key).filter(|v| !is_empty(v)) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(ns) = t.get("namespace").filter(|v| !is_empty(v)) {
        out.insert("targetNamespace".into(), ns.clone());
    }
    if let Some(helm) = t.get("helm").filter(|h| h.is_object()) {
        match helm_options(dir, helm, &format!("{path}.helm")) {
            Ok(h) if !is_empty(&h) => {
                out.insert("helm".into(), h);
            }
            Ok(_) => {}
            Err(r) => refused.push(r),
        }
    }
    Value::Object(out)
}

/// The targets in Fleet's order: `targets`, then `targetCustomizations` (each named
/// `target%03d` when unnamed), then `overrideTargets` or the targets file; `clusterGroup:
/// default` when there are none.
pub(super) fn all_targets(
    fy: &Value,
    tf: Option<&crate::convert::TargetsFile>,
    refused: &mut Vec<Refused>,
) -> Vec<(String, Value)> {
    let mut targets: Vec<(String, Value)> = Vec::new();
    for key in ["targets", "targetCustomizations"] {
        for (i, t) in fy
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            targets.push((format!("{key}[{i}]"), t.clone()));
        }
    }
    for (i, (_, t)) in targets.iter_mut().enumerate() {
        if str_at(t, &["name"]).is_empty() {
            t["name"] = format!("target{i:03}").into();
        }
    }
    let (extra, restrictions, source): (Vec<Value>, Vec<Value>, &str) =
        match fy.get("overrideTargets").and_then(Value::as_array) {
            Some(o) => (o.clone(), o.clone(), "overrideTargets"),
            None => match tf {
                Some(tf) => (
                    tf.targets.clone(),
                    tf.restrictions.clone(),
                    "--targets-file",
                ),
                None => (Vec::new(), Vec::new(), ""),
            },
        };
    for (i, t) in extra.into_iter().enumerate() {
        targets.push((format!("{source}[{i}]"), t));
    }
    // Fleet deploys to a cluster only when a restriction also selects it; tender has no
    // restrictions, so they must not narrow anything: one selects every cluster (`{}`, or
    // Fleet's `default` group, which selects every cluster — a GitRepo without targets), or
    // every target is itself one of them.
    let open = restrictions.iter().any(|r| {
        r.get("clusterSelector")
            .is_some_and(|s| s.as_object().is_some_and(|o| o.values().all(is_empty)))
            || str_at(r, &["clusterGroup"]) == "default"
    });
    if !restrictions.is_empty() && !open {
        let allowed: Vec<_> = restrictions.iter().map(selectors).collect();
        for (path, t) in &targets {
            if !allowed.contains(&selectors(t)) {
                refused.push((
                    path.clone(),
                    format!("Fleet deploys this target only to clusters {source} also selects; tender's Bundles have no targetRestrictions, so this target would reach clusters Fleet leaves out: list it in {source} too or drop it"),
                ));
            }
        }
    }
    if targets.is_empty() {
        targets.push((
            "(default)".into(),
            json!({"name": "default", "clusterGroup": "default"}),
        ));
    }
    targets
}
