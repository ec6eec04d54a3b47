//! `diff.comparePatches` (Fleet's shape): fields of some deployed objects that belong to
//! somebody else (an HPA's `spec.replicas`). tender neither applies them nor judges them as
//! drift: the agent removes them from the body it applies and compares
//! ([`strip_compare_patches`]), so its field manager releases them under server-side apply
//! (decision 0105-compare-patches-strip-the-applied-body).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::schema::{API_VERSION_PATTERN, KIND_PATTERN};

/// Fleet's `diff` options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiffOptions {
    /// Fields of matching objects that tender neither sets nor corrects: another field manager (an HPA, an operator) owns them. See docs/helm.md#comparepatches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub compare_patches: Vec<ComparePatch>,
}

/// The objects one entry applies to (every field set must match; an absent one matches any), and the fields it releases.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.operations) && size(self.operations) > 0) || (has(self.jsonPointers) && size(self.jsonPointers) > 0)",
    "message": "diff.comparePatches[] needs operations or jsonPointers: the fields tender leaves alone"
}]))]
pub struct ComparePatch {
    /// apiVersion of the objects, e.g. `apps/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317), regex(pattern = API_VERSION_PATTERN))]
    pub api_version: Option<String>,

    /// Kind of the objects, e.g. `Deployment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: Option<String>,

    /// Name of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,

    /// Namespace of the object, as deployed (after targetNamespace/defaultNamespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,

    /// JSON Patch operations; only `remove` has a meaning (the field at `path` is released).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub operations: Vec<PatchOperation>,

    /// JSON Pointers (RFC 6901, e.g. `/spec/replicas`) of the fields released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 1024), regex(pattern = "^/"))
    )]
    pub json_pointers: Vec<String>,
}

/// One JSON Patch operation of a comparePatch entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.op == 'remove'",
    "message": "diff.comparePatches[].operations[].op must be remove: tender only leaves fields alone, it does not rewrite them"
}]))]
pub struct PatchOperation {
    /// `remove`.
    #[schemars(length(min = 1, max = 16))]
    pub op: String,

    /// JSON Pointer of the field, e.g. `/spec/replicas`.
    #[schemars(length(min = 1, max = 1024), regex(pattern = "^/"))]
    pub path: String,

    /// Fleet's value of an operation; unused by `remove`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub value: Option<String>,
}

impl ComparePatch {
    /// Whether this entry applies to the object `body` (its resolved namespace included).
    pub fn matches(&self, body: &Value) -> bool {
        let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let same = |want: &Option<String>, have: String| want.as_ref().is_none_or(|w| *w == have);
        same(&self.api_version, field(&body["apiVersion"]))
            && same(&self.kind, field(&body["kind"]))
            && same(&self.name, field(&body["metadata"]["name"]))
            && same(&self.namespace, field(&body["metadata"]["namespace"]))
    }

    /// The pointers this entry releases: `remove` operations, then `jsonPointers`.
    pub fn pointers(&self) -> impl Iterator<Item = &str> {
        self.operations
            .iter()
            .filter(|o| o.op == "remove")
            .map(|o| o.path.as_str())
            .chain(self.json_pointers.iter().map(String::as_str))
    }
}

/// `body` without the fields the matching entries of `patches` release. A pointer that names
/// nothing in `body` is skipped; `metadata` is never touched (tender's ownership lives there).
pub fn strip_compare_patches(body: &mut Value, patches: &[ComparePatch]) {
    let matching: Vec<&ComparePatch> = patches.iter().filter(|p| p.matches(body)).collect();
    for p in matching {
        for pointer in p.pointers() {
            if pointer == "/metadata" || pointer.starts_with("/metadata/") {
                continue;
            }
            remove_pointer(body, pointer);
        }
    }
}

/// Removes the value at the JSON Pointer `pointer` (`~1` is `/`, `~0` is `~`); `false` when
/// nothing is there.
pub fn remove_pointer(body: &mut Value, pointer: &str) -> bool {
    let Some(rest) = pointer.strip_prefix('/') else {
        return false;
    };
    let tokens: Vec<String> = rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, parents)) = tokens.split_last() else {
        return false;
    };
    let mut at = body;
    for t in parents {
        at = match at {
            Value::Object(m) => match m.get_mut(t) {
                Some(v) => v,
                None => return false,
            },
            Value::Array(a) => match t.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match at {
        Value::Object(m) => m.remove(last).is_some(),
        Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => {
                a.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "a", "resources": {"limits": {"cpu": "1"}}}
            ]}}, "a/b~c": 1}
        })
    }

    fn patch(v: Value) -> ComparePatch {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn fleets_shape_parses() {
        let p = patch(json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "namespace": "apps",
            "operations": [{"op": "remove", "path": "/spec/replicas"}],
            "jsonPointers": ["/spec/template/spec/containers/0/resources"]
        }));
        assert_eq!(
            p.pointers().collect::<Vec<_>>(),
            [
                "/spec/replicas",
                "/spec/template/spec/containers/0/resources"
            ]
        );
    }

    #[test]
    fn matching_entries_release_their_fields() {
        let mut body = deployment();
        strip_compare_patches(
            &mut body,
            &[patch(json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                "operations": [{"op": "remove", "path": "/spec/replicas"}],
                "jsonPointers": ["/spec/template/spec/containers/0/resources", "/spec/a~1b~0c",
                                 "/spec/absent/x", "/metadata/name"]
            }))],
        );
        assert_eq!(body["spec"].get("replicas"), None);
        assert_eq!(body["spec"].get("a/b~c"), None, "escaped pointer");
        assert_eq!(
            body["spec"]["template"]["spec"]["containers"][0],
            json!({"name": "a"})
        );
        assert_eq!(
            body["metadata"]["name"], "web",
            "metadata is never released"
        );
    }

    #[test]
    fn other_objects_keep_their_fields() {
        for other in [
            json!({"kind": "StatefulSet"}),
            json!({"name": "api"}),
            json!({"namespace": "other"}),
            json!({"apiVersion": "apps/v1beta1"}),
        ] {
            let mut p = other.clone();
            p["operations"] = json!([{"op": "remove", "path": "/spec/replicas"}]);
            let mut body = deployment();
            strip_compare_patches(&mut body, &[patch(p)]);
            assert_eq!(body, deployment(), "{other}");
        }
        let mut body = deployment();
        strip_compare_patches(
            &mut body,
            &[patch(
                json!({"operations": [{"op": "replace", "path": "/spec/replicas", "value": "3"}]}),
            )],
        );
        assert_eq!(body, deployment(), "only remove releases a field");
    }

    #[test]
    fn pointers_into_arrays_and_scalars() {
        let mut v = json!({"a": [1, 2, 3], "s": "x"});
        assert!(remove_pointer(&mut v, "/a/1"));
        assert!(!remove_pointer(&mut v, "/a/9"));
        assert!(!remove_pointer(&mut v, "/s/x"));
        assert!(!remove_pointer(&mut v, "a"));
        assert_eq!(v, json!({"a": [1, 3], "s": "x"}));
    }
}
