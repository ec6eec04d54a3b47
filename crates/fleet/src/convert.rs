//! One fleet.yaml directory → its Bundles (Fleet's `bundleFromDir` in `bundlereader/read.go`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tender_types::Bundle;

use crate::files::{self, Files};
use crate::resources::{self, Refused};
use crate::schema::{self, is_empty};
use crate::{MAX_BUNDLE_BYTES, Options, names};

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

const SELECTORS: [&str; 4] = [
    "clusterName",
    "clusterSelector",
    "clusterGroup",
    "clusterGroupSelector",
];

fn selectors(t: &Value) -> Map<String, Value> {
    SELECTORS
        .iter()
        .filter_map(|k| {
            t.get(*k)
                .filter(|v| !is_empty(v) || v.is_object())
                .map(|v| (k.to_string(), v.clone()))
        })
        .collect()
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Maps merged key by key, anything else replaced (wrangler's `data.MergeMaps`).
fn merge(base: &mut Value, over: Value) {
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
fn values_with_files(dir: &Dir<'_>, helm: &Value, path: &str) -> Result<Option<Value>, Refused> {
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
fn helm_options(dir: &Dir<'_>, helm: &Value, path: &str) -> Result<Value, Refused> {
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
fn split_values_from(list: &[Value]) -> Vec<Value> {
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

/// How the directory's content is deployed.
enum Content {
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
fn plain(files: &Files) -> Content {
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

fn content(dir: &Path, helm: Option<&Value>, files: &Files) -> Result<Content, Refused> {
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
struct Variant {
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

fn variant_of(options: &Value, base: &Variant, path: &str) -> Variant {
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
struct Source<'a> {
    dir: &'a Dir<'a>,
    files: &'a Files,
    content: &'a Content,
    opts: &'a Options,
    disable_deps: bool,
    /// The name of the chart Fleet generates for `templates/` (the Bundle's).
    chart_name: &'a str,
}

/// The resources of one variant.
fn variant_resources(
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

/// A target in tender's form (selectors, namespaces, per-target helm and namespace metadata).
fn target(
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
fn all_targets(
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

/// Each target's variant, and the distinct variants (the fleet.yaml's own first).
fn variants(
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
fn variant_targets(
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
