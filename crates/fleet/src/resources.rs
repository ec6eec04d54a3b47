//! What a Bundle carries: inline manifests from plain YAML files or from `kustomize build`, or
//! a local chart's files as Fleet's `{name, content, encoding}` entries.

use std::io::Write;
use std::path::Path;

use base64::Engine;
use serde_json::{Value, json};

use crate::files::{Files, glob};

/// A refusal of one path: `(path, reason)`.
pub(crate) type Refused = (String, String);

fn is_manifest_file(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    (name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json"))
        && base != "fleet.yaml"
        && base != "fleet.yml"
}

/// The subdirectories of `files` holding a `Chart.yaml`, a fleet.yaml or a fleet.yml: Fleet
/// leaves their files out of the plain manifests (`render.manifests`).
fn excluded_dirs(files: &Files) -> Vec<String> {
    files
        .keys()
        .filter_map(|k| match k.rsplit_once('/') {
            Some((d, "Chart.yaml" | "fleet.yaml" | "fleet.yml")) => Some(format!("{d}/")),
            _ => None,
        })
        .collect()
}

/// The YAML documents of `text` that are objects: empty documents skipped, and (`strict`
/// false, Fleet's raw YAML) documents without apiVersion and kind too.
pub(crate) fn documents(
    name: &str,
    text: &str,
    strict: bool,
    out: &mut Vec<Value>,
    refused: &mut Vec<Refused>,
) {
    let docs = match serde_saphyr::from_multiple::<Option<Value>>(text) {
        Ok(docs) => docs,
        Err(e) => return refused.push((name.into(), format!("not YAML: {e}"))),
    };
    for (i, doc) in docs.into_iter().flatten().enumerate() {
        if doc.is_null() || doc.as_object().is_some_and(|o| o.is_empty()) {
            continue;
        }
        let has = |k: &str| {
            doc.get(k)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        };
        if !has("apiVersion") || !has("kind") {
            if !strict {
                continue;
            }
            refused.push((
                format!("{name} (document {})", i + 1),
                "a document without apiVersion and kind: not a Kubernetes object (Fleet would fail to deploy it too)".into(),
            ));
            continue;
        }
        if let Some(Value::Array(items)) = doc.get("items")
            && doc["kind"].as_str().is_some_and(|k| k.ends_with("List"))
        {
            out.extend(items.iter().cloned());
            continue;
        }
        out.push(doc);
    }
}

/// Plain manifest files → inline manifests, as Fleet's raw YAML: not templated, documents
/// without apiVersion and kind skipped, `templates/` (a generated chart's) and subdirectories
/// holding a chart or a fleet.yaml of their own left out.
pub(crate) fn manifests(files: &Files) -> (Vec<Value>, Vec<Refused>) {
    let mut charts = excluded_dirs(files);
    charts.push("templates/".into());
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for (name, bytes) in files {
        if !is_manifest_file(name) || charts.iter().any(|d| name.starts_with(d.as_str())) {
            continue;
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            refused.push((name.clone(), "not UTF-8".into()));
            continue;
        };
        documents(name, text, false, &mut out, &mut refused);
    }
    (out, refused)
}

/// The chart Fleet generates for a directory without Chart.yaml whose `templates/` holds YAML
/// (`render.addChartYAML`): a Chart.yaml named after the Bundle, and the YAML of `templates/`.
pub(crate) fn generated_chart(files: &Files, name: &str) -> Vec<Value> {
    let chart_yaml = format!("apiVersion: v2\nname: {name}\nversion: v0.0.0\n");
    let mut out = vec![file_entry("Chart.yaml", chart_yaml.as_bytes())];
    out.extend(
        files
            .iter()
            .filter(|(k, _)| {
                k.strip_prefix("templates/")
                    .is_some_and(|t| [".yaml", ".yml", ".json"].iter().any(|e| t.ends_with(e)))
            })
            .map(|(k, v)| file_entry(k, v)),
    );
    out
}

/// `.helmignore` patterns of a chart: a pattern matches the path relative to the chart or its
/// base name; a trailing `/` matches directories only.
fn helm_ignored(patterns: &[String], rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    patterns.iter().any(|p| {
        let (p, negate) = match p.strip_prefix('!') {
            Some(p) => (p, true),
            None => (p.as_str(), false),
        };
        if negate {
            return false;
        }
        match p.strip_suffix('/') {
            Some(dir) => parts[..parts.len() - 1].iter().any(|d| glob(dir, d)),
            None => glob(p, rel) || glob(p, parts[parts.len() - 1]),
        }
    })
}

/// A local chart's files as file entries, named relative to the fleet.yaml directory.
pub(crate) fn chart_files(
    files: &Files,
    root: &Path,
    chart: &str,
    dependencies_vendored_or_skipped: bool,
) -> (Vec<Value>, Vec<Refused>) {
    let dir = chart.trim_start_matches("./").trim_end_matches('/');
    let prefix = if dir.is_empty() || dir == "." {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut refused = Vec::new();
    let chart_yaml = format!("{prefix}Chart.yaml");
    let Some(meta) = files.get(&chart_yaml) else {
        refused.push((
            chart_yaml,
            "missing: a local chart needs its Chart.yaml".into(),
        ));
        return (Vec::new(), refused);
    };
    let patterns: Vec<String> = std::fs::read_to_string(root.join(&prefix).join(".helmignore"))
        .map(|t| {
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let entries: Vec<Value> = files
        .iter()
        .filter_map(|(name, bytes)| {
            let rel = name.strip_prefix(prefix.as_str())?;
            (!helm_ignored(&patterns, rel)).then(|| file_entry(name, bytes))
        })
        .collect();
    if !dependencies_vendored_or_skipped {
        missing_dependencies(files, &prefix, meta, &mut refused);
    }
    (entries, refused)
}

/// Chart.yaml `dependencies` not vendored under `charts/` (as a directory or a `.tgz`).
fn missing_dependencies(files: &Files, prefix: &str, meta: &[u8], refused: &mut Vec<Refused>) {
    let meta: Value = std::str::from_utf8(meta)
        .ok()
        .and_then(|t| serde_saphyr::from_str(t).ok())
        .unwrap_or(Value::Null);
    let Some(deps) = meta.get("dependencies").and_then(Value::as_array) else {
        return;
    };
    let charts = format!("{prefix}charts/");
    for (i, dep) in deps.iter().enumerate() {
        let name = dep.get("name").and_then(Value::as_str).unwrap_or_default();
        let vendored = files.keys().any(|k| {
            k.strip_prefix(charts.as_str()).is_some_and(|r| {
                r.starts_with(&format!("{name}/"))
                    || (r.starts_with(&format!("{name}-")) && r.ends_with(".tgz"))
            })
        });
        if !vendored {
            refused.push((
                format!("{prefix}Chart.yaml dependencies[{i}] ({name})"),
                format!("not vendored under {charts}: tender apply does not download chart dependencies; run `helm dependency build` first (or set helm.disableDependencyUpdate to deploy without it)"),
            ));
        }
    }
}

/// One file entry: the text as written, or base64 when it is not UTF-8.
fn file_entry(name: &str, bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!({"name": name, "content": text}),
        Err(_) => json!({
            "name": name,
            "content": base64::engine::general_purpose::STANDARD.encode(bytes),
            "encoding": "base64",
        }),
    }
}

/// Every file entry of `resources` compressed (`base64+gz`), as Fleet does past its size.
pub(crate) fn compress(resources: &mut [Value]) {
    for r in resources.iter_mut() {
        let Some(content) = r.get("content").and_then(Value::as_str) else {
            continue;
        };
        let raw = if r.get("encoding").and_then(Value::as_str) == Some("base64") {
            base64::engine::general_purpose::STANDARD
                .decode(content)
                .unwrap_or_default()
        } else {
            content.as_bytes().to_vec()
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let _ = gz.write_all(&raw);
        let packed = gz.finish().unwrap_or_default();
        r["content"] = base64::engine::general_purpose::STANDARD
            .encode(packed)
            .into();
        r["encoding"] = "base64+gz".into();
    }
}

/// `kustomize build DIR` with the given binary; the objects it prints.
pub(crate) fn kustomize(binary: &Path, dir: &Path, path: &str) -> Result<Vec<Value>, Refused> {
    let out = std::process::Command::new(binary)
        .arg("build")
        .arg(dir)
        .output()
        .map_err(|e| {
            (
                path.to_string(),
                format!(
                    "running {} build: {e} (tender apply renders kustomize with an external binary: install kustomize or pass --kustomize PATH)",
                    binary.display()
                ),
            )
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err: String = err.trim().chars().take(2000).collect();
        return Err((path.to_string(), format!("kustomize build failed: {err}")));
    }
    let mut objects = Vec::new();
    let mut refused = Vec::new();
    documents(
        path,
        &String::from_utf8_lossy(&out.stdout),
        true,
        &mut objects,
        &mut refused,
    );
    match refused.into_iter().next() {
        Some(r) => Err(r),
        None => Ok(objects),
    }
}
