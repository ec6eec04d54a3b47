//! Fleet's fleet.yaml schema (`FleetYAML` in Fleet's `fleetyaml.go` and `bundle_types.go`) as a
//! list of keys: every key is either implemented by `tender apply` or refused with its reason.
//! A key Fleet does not know is refused too, by path.

use serde_json::Value;

/// The shape of a value.
#[derive(Clone, Copy)]
pub(crate) enum Shape {
    /// Taken as written (scalars, label selectors, values maps, string maps).
    Any,
    /// A map with exactly these keys.
    Map(&'static [Field]),
    /// A list of the shape.
    List(&'static Shape),
    /// A map of strings (labels, annotations, templateValues).
    Strings,
}

/// When a key is refused.
#[derive(Clone, Copy)]
pub(crate) enum Refuse {
    /// Implemented.
    Never,
    /// Refused whenever present.
    Always(&'static str),
    /// Refused unless empty, false, zero or null (Fleet's `omitempty` default).
    WhenSet(&'static str),
}

/// One key of a map.
#[derive(Clone, Copy)]
pub(crate) struct Field {
    pub key: &'static str,
    pub shape: Shape,
    pub refuse: Refuse,
}

const fn ok(key: &'static str, shape: Shape) -> Field {
    Field {
        key,
        shape,
        refuse: Refuse::Never,
    }
}

const fn when_set(key: &'static str, reason: &'static str) -> Field {
    Field {
        key,
        shape: Shape::Any,
        refuse: Refuse::WhenSet(reason),
    }
}

const fn always(key: &'static str, reason: &'static str) -> Field {
    Field {
        key,
        shape: Shape::Any,
        refuse: Refuse::Always(reason),
    }
}

const RELEASE: &str =
    "tender renders with helm template and applies the objects itself; there is no Helm release";
const SET_BY_FLEET: &str =
    "set by Fleet's controllers on the Bundles they create, never written in a fleet.yaml";

const LOCAL_REF: &[Field] = &[
    ok("name", Shape::Any),
    ok("namespace", Shape::Any),
    ok("key", Shape::Any),
];
const VALUES_FROM: &[Field] = &[
    ok("configMapKeyRef", Shape::Map(LOCAL_REF)),
    ok("secretKeyRef", Shape::Map(LOCAL_REF)),
];

/// `helm` (HelmOptions, with GitOpsHelmOptions).
pub(crate) const HELM: &[Field] = &[
    ok("chart", Shape::Any),
    ok("repo", Shape::Any),
    ok("releaseName", Shape::Any),
    ok("version", Shape::Any),
    ok("timeoutSeconds", Shape::Any),
    ok("values", Shape::Any),
    ok("valuesFiles", Shape::List(&Shape::Any)),
    ok("templateValues", Shape::Strings),
    ok("valuesFrom", Shape::List(&Shape::Map(VALUES_FROM))),
    when_set("force", RELEASE),
    ok("takeOwnership", Shape::Any),
    when_set("maxHistory", RELEASE),
    when_set("waitForJobs", RELEASE),
    when_set("atomic", RELEASE),
    ok("disablePreProcess", Shape::Any),
    // false (DNS lookups allowed) is Fleet's default and what omitting it means; tender's
    // templates never resolve DNS, so true changes nothing and false is refused by the CRD.
    ok("disableDNS", Shape::Any),
    when_set(
        "skipSchemaValidation",
        "values are always checked against the chart's values.schema.json",
    ),
    ok("disableDependencyUpdate", Shape::Any),
];

const OPERATION: &[Field] = &[
    ok("op", Shape::Any),
    ok("path", Shape::Any),
    ok("value", Shape::Any),
];
const COMPARE_PATCH: &[Field] = &[
    ok("apiVersion", Shape::Any),
    ok("kind", Shape::Any),
    ok("name", Shape::Any),
    ok("namespace", Shape::Any),
    ok("jsonPointers", Shape::Any),
    ok("operations", Shape::List(&Shape::Map(OPERATION))),
];
const DIFF: &[Field] = &[ok(
    "comparePatches",
    Shape::List(&Shape::Map(COMPARE_PATCH)),
)];
const CORRECT_DRIFT: &[Field] = &[
    ok("enabled", Shape::Any),
    when_set(
        "force",
        "tender re-applies drifted objects by server-side apply; it never deletes and recreates them",
    ),
    when_set(
        "keepFailHistory",
        "tender keeps no history of failed corrections (see the BundleDeployment's conditions and events)",
    ),
];
const DOWNSTREAM_RESOURCE: &[Field] = &[ok("kind", Shape::Any), ok("name", Shape::Any)];

/// `kustomize` and `yaml`: implemented by rendering at apply time (variants per target).
const KUSTOMIZE: &[Field] = &[ok("dir", Shape::Any)];
const YAML: &[Field] = &[ok("overlays", Shape::List(&Shape::Any))];

/// `BundleDeploymentOptions` keys shared by the spec and a target (`spec` true: the spec's).
macro_rules! deployment_options {
    ($($extra:expr),* $(,)?) => {
        &[
            ok("yaml", Shape::Map(YAML)),
            ok("kustomize", Shape::Map(KUSTOMIZE)),
            ok("defaultNamespace", Shape::Any),
            ok("namespace", Shape::Any),
            ok("helm", Shape::Map(HELM)),
            ok("serviceAccount", Shape::Any),
            // Fleet's default (absent) creates the namespace, as tender always does.
            ok("createNamespace", Shape::Any),
            when_set(
                "forceSyncGeneration",
                "tender re-applies when the Bundle's content changes; to force a redeploy change the Bundle (e.g. an annotation)",
            ),
            when_set(
                "deleteNamespace",
                "tender never deletes a namespace when a Bundle is removed (docs/security.md)",
            ),
            when_set(
                "ignore",
                "tender judges readiness from workload status (decision 0099); there is no list of conditions to ignore",
            ),
            when_set(
                "deleteCRDResources",
                "tender decides CRD deletion itself: a chart's crds/ are never deleted (decision 0111), other CRDs like any object unless keepResources",
            ),
            when_set("overwrites", SET_BY_FLEET),
            when_set("allowedTargetNamespaceSelector", SET_BY_FLEET),
            $($extra,)*
        ]
    };
}

/// A `targetCustomizations[]` (or `targets[]`) entry.
pub(crate) const TARGET: &[Field] = deployment_options!(
    ok("name", Shape::Any),
    ok("clusterName", Shape::Any),
    ok("clusterSelector", Shape::Any),
    ok("clusterGroup", Shape::Any),
    ok("clusterGroupSelector", Shape::Any),
    ok("doNotDeploy", Shape::Any),
    ok("namespaceLabels", Shape::Strings),
    ok("namespaceAnnotations", Shape::Strings),
    ok("keepResources", Shape::Any),
    ok(
        "downstreamResources",
        Shape::List(&Shape::Map(DOWNSTREAM_RESOURCE))
    ),
    when_set(
        "correctDrift",
        "tender's targets carry no correctDrift: set it for the whole fleet.yaml",
    ),
    when_set(
        "diff",
        "tender's targets carry no diff: set diff.comparePatches for the whole fleet.yaml",
    ),
);

const GIT_TARGET: &[Field] = &[
    ok("name", Shape::Any),
    ok("clusterName", Shape::Any),
    ok("clusterSelector", Shape::Any),
    ok("clusterGroup", Shape::Any),
    ok("clusterGroupSelector", Shape::Any),
];

const PARTITION: &[Field] = &[
    ok("name", Shape::Any),
    ok("maxUnavailable", Shape::Any),
    ok("clusterName", Shape::Any),
    ok("clusterSelector", Shape::Any),
    ok("clusterGroup", Shape::Any),
    ok("clusterGroupSelector", Shape::Any),
];
const ROLLOUT: &[Field] = &[
    ok("maxUnavailable", Shape::Any),
    ok("maxUnavailablePartitions", Shape::Any),
    ok("autoPartitionSize", Shape::Any),
    when_set(
        "autoPartitionThreshold",
        "tender partitions automatically by autoPartitionSize alone (docs/rollouts.md)",
    ),
    when_set(
        "maxNew",
        "tender does not limit how many new BundleDeployments are created per pass",
    ),
    ok("partitions", Shape::List(&Shape::Map(PARTITION))),
];
const BUNDLE_REF: &[Field] = &[
    ok("name", Shape::Any),
    ok("selector", Shape::Any),
    ok("acceptedStates", Shape::Any),
];

/// The whole fleet.yaml.
pub(crate) const FLEET_YAML: &[Field] = deployment_options!(
    ok("name", Shape::Any),
    ok("labels", Shape::Strings),
    ok("paused", Shape::Any),
    ok("rolloutStrategy", Shape::Map(ROLLOUT)),
    ok("targetCustomizationMode", Shape::Any),
    ok("targets", Shape::List(&Shape::Map(TARGET))),
    ok("dependsOn", Shape::List(&Shape::Map(BUNDLE_REF))),
    ok("targetCustomizations", Shape::List(&Shape::Map(TARGET))),
    ok("overrideTargets", Shape::List(&Shape::Map(GIT_TARGET))),
    ok("keepResources", Shape::Any),
    ok("correctDrift", Shape::Map(CORRECT_DRIFT)),
    ok("diff", Shape::Map(DIFF)),
    ok("namespaceLabels", Shape::Strings),
    ok("namespaceAnnotations", Shape::Strings),
    ok(
        "downstreamResources",
        Shape::List(&Shape::Map(DOWNSTREAM_RESOURCE))
    ),
    always(
        "imageScans",
        "tender has no image scanning: Fleet's ImageScans write image tags back to the Git repository",
    ),
    always("resources", SET_BY_FLEET),
    always("targetRestrictions", SET_BY_FLEET),
    always("contentsId", SET_BY_FLEET),
    always("helmOpOptions", SET_BY_FLEET),
    always("valuesHash", SET_BY_FLEET),
);

/// Whether a value is Fleet's `omitempty` default.
pub(crate) fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Every refused or unknown key under `value`, as `(path, reason)`.
pub(crate) fn check(
    value: &Value,
    fields: &'static [Field],
    path: &str,
    out: &mut Vec<(String, String)>,
) {
    check_shape(value, Shape::Map(fields), path, out);
}

fn check_shape(value: &Value, shape: Shape, path: &str, out: &mut Vec<(String, String)>) {
    match (shape, value) {
        (Shape::Any, _) | (_, Value::Null) => {}
        (Shape::Strings, Value::Object(map)) => {
            for (key, v) in map {
                if !v.is_string() {
                    out.push((
                        join(path, key),
                        format!("must be a string, not {v} (YAML reads unquoted true/false/yes/no/on/off/y/n and numbers as such: quote it)"),
                    ));
                }
            }
        }
        (Shape::Map(fields), Value::Object(map)) => {
            for (key, v) in map {
                let p = join(path, key);
                match fields.iter().find(|f| f.key == key) {
                    None => out.push((p, "not a field of Fleet's fleet.yaml schema".into())),
                    Some(f) => match f.refuse {
                        Refuse::Always(reason) => out.push((p, reason.into())),
                        Refuse::WhenSet(reason) if !is_empty(v) => out.push((p, reason.into())),
                        _ => check_shape(v, f.shape, &p, out),
                    },
                }
            }
        }
        (Shape::List(inner), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                check_shape(item, *inner, &format!("{path}[{i}]"), out);
            }
        }
        (Shape::Map(_), _) => out.push((path.into(), "must be a map".into())),
        (Shape::List(_), _) => out.push((path.into(), "must be a list".into())),
        (Shape::Strings, _) => out.push((path.into(), "must be a map of strings".into())),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refusals(v: Value) -> Vec<String> {
        let mut out = Vec::new();
        check(&v, FLEET_YAML, "", &mut out);
        out.into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn unknown_and_refused_keys_are_named_by_path() {
        let v = json!({
            "namespace": "x",
            "helm": {"chart": "c", "atomic": true, "force": false, "bogus": 1},
            "targetCustomizations": [{"name": "a", "diff": {"comparePatches": []}},
                                     {"name": "b", "correctDrift": {"enabled": true}}],
            "imageScans": [],
            "rolloutStrategy": {"maxNew": 3},
            "labels": {"a": "b", "c": true},
        });
        assert_eq!(
            refusals(v),
            [
                "helm.atomic",
                "helm.bogus",
                "imageScans",
                "labels.c",
                "rolloutStrategy.maxNew",
                "targetCustomizations[0].diff",
                "targetCustomizations[1].correctDrift",
            ]
        );
    }
}
