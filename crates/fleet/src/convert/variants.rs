//! What each target deploys: the directory's content (a local or remote chart, plain
//! manifests, a kustomization) and its variants (per-target kustomize dirs and yaml overlays).

use std::path::Path;

use serde_json::Value;

use crate::Options;
use crate::files::{self, Files};
use crate::resources::{self, Refused};

use super::helm::{Dir, str_at};
use super::targets::selectors;

/// How the directory's content is deployed.
pub(super) enum Content {
    /// A chart from a repository, OCI registry or URL: `spec.helm` only.
    Remote,
    /// A chart directory beside the fleet.yaml: its files.
    Local(String),
    /// Plain manifests or kustomize.
    Manifests,
    /// Plain manifests beside a `templates/` directory, which Fleet renders as a chart it
    /// generates (`render.HelmChart`): the templates as a chart's files, the rest inline.
    Templates,
}

/// Plain manifests, or [`Content::Templates`] when `templates/` holds YAML.
pub(super) fn plain(files: &Files) -> Content {
    let templated = files.keys().any(|k| {
        k.strip_prefix("templates/")
            .is_some_and(|t| [".yaml", ".yml", ".json"].iter().any(|e| t.ends_with(e)))
    });
    if templated {
        Content::Templates
    } else {
        Content::Manifests
    }
}

pub(super) fn content(dir: &Path, helm: Option<&Value>, files: &Files) -> Result<Content, Refused> {
    let Some(helm) = helm else {
        // Fleet's style: a Chart.yaml at the root is a chart even without `helm`.
        return Ok(if dir.join("Chart.yaml").is_file() {
            Content::Local(String::new())
        } else {
            plain(files)
        });
    };
    let chart = str_at(helm, &["chart"]);
    let repo = str_at(helm, &["repo"]);
    let remote = ["oci://", "http://", "https://"]
        .iter()
        .any(|p| chart.starts_with(p));
    if !repo.is_empty() || remote {
        return Ok(Content::Remote);
    }
    if chart.is_empty() {
        return Ok(if dir.join("Chart.yaml").is_file() {
            Content::Local(String::new())
        } else {
            plain(files)
        });
    }
    if dir.join(chart).is_dir() {
        return Ok(Content::Local(chart.to_string()));
    }
    Err((
        "helm.chart".into(),
        format!(
            "{chart:?} is neither a directory beside the fleet.yaml nor a chart URL, and helm.repo is empty"
        ),
    ))
}

/// A variant: the manifests one set of targets gets (kustomize dir and yaml overlays).
#[derive(Clone, Debug)]
pub(super) struct Variant {
    kustomize: Option<String>,
    overlays: Vec<String>,
    /// Where its kustomize dir is written (for refusals): `kustomize.dir` or
    /// `targetCustomizations[i].kustomize.dir`.
    source: String,
}

impl PartialEq for Variant {
    fn eq(&self, other: &Self) -> bool {
        self.kustomize == other.kustomize && self.overlays == other.overlays
    }
}

pub(super) fn variant_of(options: &Value, base: &Variant, path: &str) -> Variant {
    Variant {
        source: if options.get("kustomize").is_some() {
            format!("{path}kustomize.dir")
        } else {
            base.source.clone()
        },
        kustomize: options
            .get("kustomize")
            .map(|k| str_at(k, &["dir"]).to_string())
            .or_else(|| base.kustomize.clone()),
        overlays: match options.get("yaml") {
            Some(y) => y
                .get("overlays")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str().map(String::from))
                .collect(),
            None => base.overlays.clone(),
        },
    }
}

/// What every variant of a directory is made from.
pub(super) struct Source<'a> {
    pub(super) dir: &'a Dir<'a>,
    pub(super) files: &'a Files,
    pub(super) content: &'a Content,
    pub(super) opts: &'a Options,
    pub(super) disable_deps: bool,
    /// The name of the chart Fleet generates for `templates/` (the Bundle's).
    pub(super) chart_name: &'a str,
}

/// The resources of one variant.
pub(super) fn variant_resources(
    src: &Source<'_>,
    variant: &Variant,
    refused: &mut Vec<Refused>,
) -> Vec<Value> {
    let (dir, files, content, opts) = (src.dir, src.files, src.content, src.opts);
    let original = files;
    // Fleet applies overlays (and drops `overlays/`) to raw YAML only, never to a chart.
    let raw = matches!(content, Content::Manifests | Content::Templates);
    let files = match raw.then(|| files::apply_overlays(files, &variant.overlays)) {
        None => files.clone(),
        Some(Ok(f)) => f,
        Some(Err(r)) => {
            refused.push(r);
            return Vec::new();
        }
    };
    let kdir = variant.kustomize.clone().unwrap_or_default();
    let kdir = kdir.trim_start_matches("./").trim_end_matches('/');
    let kfile = if kdir.is_empty() || kdir == "." {
        "kustomization.yaml".to_string()
    } else {
        format!("{kdir}/kustomization.yaml")
    };
    let kustomized = original.contains_key(&kfile)
        || original.contains_key(&kfile.replace(".yaml", ".yml"))
        || original.contains_key(&kfile.replace("kustomization.yaml", "Kustomization"));
    if kustomized && !matches!(content, Content::Manifests) {
        refused.push((
            variant.source.clone(),
            "kustomize over a chart's rendered output: the chart is rendered per cluster by the agent, so tender apply cannot run kustomize over it".into(),
        ));
        return Vec::new();
    }
    match content {
        Content::Remote => Vec::new(),
        Content::Local(chart) => {
            let (entries, r) = resources::chart_files(&files, dir.path, chart, src.disable_deps);
            refused.extend(r);
            entries
        }
        Content::Manifests if kustomized => {
            match resources::kustomize(&opts.kustomize, &dir.path.join(kdir), &variant.source) {
                Ok(objects) => objects,
                Err(r) => {
                    refused.push(r);
                    Vec::new()
                }
            }
        }
        Content::Manifests => {
            let (m, r) = resources::manifests(&files);
            refused.extend(r);
            m
        }
        Content::Templates => {
            let (mut out, r) = resources::manifests(&files);
            refused.extend(r);
            out.extend(resources::generated_chart(&files, src.chart_name));
            out
        }
    }
}

/// Each target's variant, and the distinct variants (the fleet.yaml's own first).
pub(super) fn variants(
    fy: &Value,
    targets: &[(String, Value)],
    content: &Content,
) -> (Vec<Variant>, Vec<Variant>) {
    let mut base = variant_of(
        fy,
        &Variant {
            kustomize: None,
            overlays: Vec::new(),
            source: "kustomization.yaml".into(),
        },
        "",
    );
    let mut variants: Vec<Variant> = targets
        .iter()
        .map(|(p, t)| variant_of(t, &base, &format!("{p}.")))
        .collect();
    if !matches!(content, Content::Manifests | Content::Templates) {
        // A chart: Fleet ignores `yaml.overlays` (kustomize over it is refused).
        for v in variants.iter_mut().chain([&mut base]) {
            v.overlays.clear();
        }
    }
    let mut distinct = vec![base];
    for v in &variants {
        if !distinct.contains(v) {
            distinct.push(v.clone());
        }
    }
    (variants, distinct)
}

/// The targets of `variant`'s Bundle: every target in order, those of other variants with
/// their selectors only and `doNotDeploy: true` (the first match wins, so each cluster gets
/// exactly one variant).
pub(super) fn variant_targets(
    converted: &[(String, Value)],
    variants: &[Variant],
    variant: &Variant,
) -> Vec<Value> {
    converted
        .iter()
        .zip(variants)
        .map(|((_, t), v)| {
            if v == variant {
                t.clone()
            } else {
                let mut only = selectors(t);
                if let Some(name) = t.get("name") {
                    only.insert("name".into(), name.clone());
                }
                only.insert("doNotDeploy".into(), true.into());
                Value::Object(only)
            }
        })
        .collect()
}
