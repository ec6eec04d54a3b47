//! One fleet.yaml directory → its Bundles (Fleet's `bundleFromDir` in `bundlereader/read.go`).

mod helm;
mod targets;
mod variants;

use std::path::Path;

use serde_json::{Map, Value, json};
use tender_types::Bundle;

use crate::files::{self, Files};
use crate::resources::{self, Refused};
use crate::schema::{self, is_empty};
use crate::{MAX_BUNDLE_BYTES, Options, names};

use helm::{Dir, helm_options, str_at};
pub(crate) use targets::{TargetsFile, read_targets_file};
use targets::{all_targets, target};
use variants::{Content, Source, content, variant_resources, variant_targets, variants};

/// The spec fields mapped one to one (or nearly).
fn spec_fields(fy: &Value, spec: &mut Map<String, Value>, refused: &mut Vec<Refused>) {
    for key in [
        "defaultNamespace",
        "keepResources",
        "paused",
        "namespaceLabels",
        "namespaceAnnotations",
        "diff",
        "dependsOn",
        "rolloutStrategy",
        "downstreamResources",
    ] {
        if let Some(v) = fy.get(key).filter(|v| !is_empty(v)) {
            spec.insert(key.into(), v.clone());
        }
    }
    if let Some(ns) = fy.get("namespace").filter(|v| !is_empty(v)) {
        spec.insert("targetNamespace".into(), ns.clone());
    }
    // Fleet corrects drift only when asked; tender's default is on.
    let enabled = fy
        .get("correctDrift")
        .and_then(|c| c.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    spec.insert("correctDrift".into(), json!({"enabled": enabled}));
    if let Some(sa) = fy
        .get("serviceAccount")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        if sa.contains('/') {
            spec.insert("serviceAccount".into(), sa.into());
        } else {
            refused.push(("serviceAccount".into(), "Fleet names a ServiceAccount in the target namespace; tender's serviceAccount is `<namespace>/<name>` of a downstream ServiceAccount the cluster's owner allows (--allow-bundle-service-accounts): write it so".into()));
        }
    }
    if fy.get("createNamespace") == Some(&Value::Bool(false)) {
        refused.push((
            "createNamespace".into(),
            "tender always creates the target namespace".into(),
        ));
    }
    if str_at(fy, &["targetCustomizationMode"]) == "AllMatches" {
        refused.push(("targetCustomizationMode".into(), "tender's targets are first-match only: each cluster gets the first target that selects it".into()));
    }
    for (i, cp) in fy
        .pointer("/diff/comparePatches")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (j, op) in cp
            .get("operations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if str_at(op, &["path"]).is_empty() {
                refused.push((format!("diff.comparePatches[{i}].operations[{j}]"), format!("op {:?} without a path (Fleet's `ignore` ignores the whole object): tender's comparePatches name the fields another manager owns, by path or jsonPointers", str_at(op, &["op"]))));
            }
        }
    }
    depends_on(fy, refused);
    if fy.pointer("/helm/disableDNS") == Some(&Value::Bool(false)) {
        refused.push((
            "helm.disableDNS".into(),
            "tender's templates never resolve DNS (as if true)".into(),
        ));
    }
}

/// Fleet's `validateFleetYAML`: each `dependsOn` names a Bundle or selects some, with states
/// Fleet knows.
fn depends_on(fy: &Value, refused: &mut Vec<Refused>) {
    const STATES: [&str; 7] = [
        "Ready",
        "NotReady",
        "WaitApplied",
        "ErrApplied",
        "OutOfSync",
        "Pending",
        "Modified",
    ];
    for (i, dep) in fy
        .get("dependsOn")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if str_at(dep, &["name"]).is_empty() && dep.get("selector").is_none_or(Value::is_null) {
            refused.push((
                format!("dependsOn[{i}]"),
                "must specify either 'name' or 'selector'".into(),
            ));
        }
        for (j, state) in dep
            .get("acceptedStates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if !state.as_str().is_some_and(|s| STATES.contains(&s)) {
                refused.push((
                    format!("dependsOn[{i}].acceptedStates[{j}]"),
                    format!(
                        "invalid state {state}, valid values are: {}",
                        STATES.join(", ")
                    ),
                ));
            }
        }
    }
}

/// `spec.helm` (or, for plain manifests, Fleet's `helm.takeOwnership` as the Bundle's).
fn spec_helm(
    dir: &Dir<'_>,
    content: &Content,
    helm: Option<&Value>,
    spec: &mut Map<String, Value>,
    refused: &mut Vec<Refused>,
) {
    match (content, helm) {
        (Content::Manifests, Some(h)) if h.get("takeOwnership") == Some(&Value::Bool(true)) => {
            spec.insert("takeOwnership".into(), true.into());
        }
        (Content::Manifests, _) => {}
        (Content::Local(chart), None) => {
            spec.insert("helm".into(), json!({"chart": chart}));
        }
        (Content::Templates, None) => {
            spec.insert("helm".into(), json!({"chart": ""}));
        }
        (_, Some(h)) => match helm_options(dir, h, "helm") {
            Ok(mut h) => {
                if let Content::Local(chart) = content {
                    h["chart"] = chart.clone().into();
                }
                spec.insert("helm".into(), h);
            }
            Err(r) => refused.push(r),
        },
        (Content::Remote, None) => {}
    }
}

/// Converts the directory: its Bundles, or every refusal.
pub(crate) fn directory(
    dir: &Path,
    root: &Path,
    id: &str,
    opts: &Options,
    tf: Option<&TargetsFile>,
) -> Result<Vec<Bundle>, Vec<Refused>> {
    let mut refused = Vec::new();
    let (file, fy) = read_fleet_yaml(dir).map_err(|r| vec![r])?;
    schema::check(&fy, schema::FLEET_YAML, "", &mut refused);
    let name = match str_at(&fy, &["name"]) {
        "" => names::helm_release_name(id),
        n => n.to_string(),
    };
    let helm = fy.get("helm").filter(|h| h.is_object());
    let mut skip = vec![file];
    skip.extend(values_files(&fy));
    let files = files::read_dir(dir, &skip).unwrap_or_else(|r| {
        refused.push(r);
        Files::new()
    });
    let content = content(dir, helm, &files).unwrap_or_else(|r| {
        refused.push(r);
        Content::Remote
    });
    let targets = all_targets(&fy, tf, &mut refused);
    let mut spec = Map::new();
    spec_fields(&fy, &mut spec, &mut refused);
    let here = Dir { path: dir, root };
    spec_helm(&here, &content, helm, &mut spec, &mut refused);
    let converted: Vec<(String, Value)> = targets
        .iter()
        .map(|(p, t)| {
            let spec_chart = str_at(&fy, &["helm", "chart"]);
            (p.clone(), target(&here, t, p, spec_chart, &mut refused))
        })
        .collect();
    let (variants, distinct) = variants(&fy, &targets, &content);
    let disable_deps = fy.pointer("/helm/disableDependencyUpdate") == Some(&Value::Bool(true));
    let mut bundles = Vec::new();
    for (n, variant) in distinct.iter().enumerate() {
        let used = n == 0 || variants.contains(variant);
        if !used || (n == 0 && !variants.contains(variant) && distinct.len() > 1) {
            continue;
        }
        let src = Source {
            dir: &here,
            files: &files,
            content: &content,
            opts,
            disable_deps,
            chart_name: &name,
        };
        let resources = variant_resources(&src, variant, &mut refused);
        if resources.is_empty() && matches!(content, Content::Manifests) {
            continue;
        }
        let bundle_name = if n == 0 {
            name.clone()
        } else {
            let first = variants.iter().position(|v| v == variant).unwrap_or(0);
            let target_name = str_at(&converted[first].1, &["name"]);
            names::helm_release_name(&format!("{name}-{target_name}"))
        };
        let targets = variant_targets(&converted, &variants, variant);
        let mut spec = spec.clone();
        if n > 0
            && let Some(h) = spec.get_mut("helm")
            && h.get("releaseName").is_none()
        {
            h["releaseName"] = name.clone().into();
        }
        spec.insert("targets".into(), targets.into());
        spec.insert("resources".into(), resources.into());
        if !refused.is_empty() {
            continue;
        }
        match bundle(&bundle_name, &fy, opts, spec) {
            Ok(b) => bundles.push(b),
            Err(r) => refused.push(r),
        }
    }
    if refused.is_empty() {
        Ok(bundles)
    } else {
        Err(refused)
    }
}

fn values_files(fy: &Value) -> Vec<String> {
    let mut helms = vec![fy.get("helm")];
    for key in ["targets", "targetCustomizations"] {
        helms.extend(
            fy.get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|t| t.get("helm")),
        );
    }
    let mut out = Vec::new();
    for h in helms.into_iter().flatten() {
        for f in h
            .get("valuesFiles")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(f) = f.as_str() {
                out.push(f.trim_start_matches("./").to_string());
            }
        }
    }
    out
}

fn read_fleet_yaml(dir: &Path) -> Result<(String, Value), Refused> {
    for file in ["fleet.yaml", "fleet.yml"] {
        let path = dir.join(file);
        if path.is_file() {
            let text =
                std::fs::read_to_string(&path).map_err(|e| (file.to_string(), e.to_string()))?;
            let v: Option<Value> = serde_saphyr::from_str(&text)
                .map_err(|e| (file.to_string(), format!("not YAML: {e}")))?;
            let v = v.unwrap_or(json!({}));
            if !v.is_object() {
                return Err((file.into(), "must be a map".into()));
            }
            return Ok((file.to_string(), v));
        }
    }
    Ok(("fleet.yaml".into(), json!({})))
}

/// The Bundle object, checked against tender's types and compressed past Fleet's size.
fn bundle(
    name: &str,
    fy: &Value,
    opts: &Options,
    spec: Map<String, Value>,
) -> Result<Bundle, Refused> {
    let mut labels: Map<String, Value> = opts
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    if let Some(Value::Object(l)) = fy.get("labels") {
        labels.extend(l.clone());
    }
    let mut value = json!({
        "apiVersion": "tender.dev/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    });
    if labels.is_empty() {
        value["metadata"]
            .as_object_mut()
            .map(|m| m.remove("labels"));
    }
    let size = |v: &Value| serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX);
    if size(&value) >= MAX_BUNDLE_BYTES {
        if let Some(Value::Array(r)) = value.pointer_mut("/spec/resources") {
            resources::compress(r);
        }
        let s = size(&value);
        if s >= MAX_BUNDLE_BYTES {
            return Err((
                "(whole directory)".into(),
                format!(
                    "the Bundle is {s} bytes of JSON even compressed, over the {MAX_BUNDLE_BYTES} an apiserver object may hold: push the chart to a registry and reference it (helm.repo or oci://), or split the directory"
                ),
            ));
        }
    }
    serde_json::from_value(value.clone()).map_err(|e| {
        (
            culprit(&value["spec"]),
            format!("not a tender Bundle field: {e}"),
        )
    })
}

/// The spec field (or `targets[i]`) a Bundle fails to read at: each tried alone.
fn culprit(spec: &Value) -> String {
    let fails = |key: &str, v: &Value| {
        serde_json::from_value::<tender_types::BundleSpec>(json!({ key: v })).is_err()
    };
    for (key, v) in spec.as_object().into_iter().flatten() {
        if key == "targets" {
            for (i, t) in v.as_array().into_iter().flatten().enumerate() {
                if fails(key, &json!([t])) {
                    return format!("targets[{i}] (targetCustomizations, overrideTargets)");
                }
            }
        } else if fails(key, v) {
            return key.clone();
        }
    }
    "(whole directory)".into()
}
