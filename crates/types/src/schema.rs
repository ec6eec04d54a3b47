//! Schema helpers: validation patterns, schema transforms and CRD post-processing.
//!
//! Everything the apiserver must enforce lives in the CRD schema (OpenAPI + CEL), so a bad
//! object is rejected at `kubectl apply` time with a message naming the field, instead of
//! being silently pruned or failing later in a controller.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, ValidationRule,
};
use kube::CustomResourceExt;
use schemars::Schema;
use serde_json::json;

use crate::{Bundle, BundleDeployment, Cluster, ClusterGroup, HelmOp};

/// RFC 1123 DNS label (namespace names, label-safe object names).
pub(crate) const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// RFC 1123 DNS subdomain (most object names).
pub(crate) const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// An `apiVersion`: `v1`, or `<group>/<version>`.
pub(crate) const API_VERSION_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?$";
/// A `kind`: CamelCase letters and digits.
pub(crate) const KIND_PATTERN: &str = "^[A-Z][A-Za-z0-9]*$";

/// Declares a `namespace` property on a `downstreamResources[]` entry only to reject it.
///
/// Structural pruning would silently drop an undeclared `namespace`, and a user who wrote one
/// would believe tender copies from another namespace. Declaring it lets a CEL rule refuse it.
pub(crate) fn forbid_namespace_property(schema: &mut Schema) {
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        props.insert(
            "namespace".into(),
            json!({
                "type": "string",
                "maxLength": 253,
                "description": "Not allowed: sources always live in the Bundle's own namespace."
            }),
        );
    }
    let rules = json!([{
        "rule": "!has(self.__namespace__)",
        "message": "downstreamResources[].namespace is not allowed: sources must live in the Bundle's namespace"
    }]);
    schema.insert("x-kubernetes-validations".into(), rules);
}

/// When a field tender does not implement is refused.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Refuse {
    /// Whenever it is set.
    Present,
    /// When it is `true` (`false` is what tender does anyway).
    True,
    /// When it is `false` (`true` is what tender does anyway).
    False,
    /// When it is a string other than this one (what tender does anyway).
    Unless(&'static str),
    /// Never: accepted, with no effect in tender (the field's `why` says what tender does).
    Never,
}

/// A field of another tool's API (Fleet's) that tender declares only to refuse it with a
/// message, instead of letting structural pruning drop it silently.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unsupported {
    pub name: &'static str,
    /// OpenAPI type: `string`, `integer`, `boolean`, `object`, `array` (of objects) or
    /// `string-array`.
    pub ty: &'static str,
    pub refuse: Refuse,
    /// Why tender does not need or offer it.
    pub why: &'static str,
}

impl Unsupported {
    /// Refused whenever set.
    pub(crate) const fn present(name: &'static str, ty: &'static str, why: &'static str) -> Self {
        Self {
            name,
            ty,
            refuse: Refuse::Present,
            why,
        }
    }

    /// A boolean refused when `true`.
    pub(crate) const fn when_true(name: &'static str, why: &'static str) -> Self {
        Self {
            name,
            ty: "boolean",
            refuse: Refuse::True,
            why,
        }
    }

    /// A string refused unless it is `value` (Fleet's default, what tender does).
    pub(crate) const fn unless(name: &'static str, value: &'static str, why: &'static str) -> Self {
        Self {
            name,
            ty: "string",
            refuse: Refuse::Unless(value),
            why,
        }
    }

    /// Accepted and declared, with no effect in tender (`why` says why that is the truth).
    pub(crate) const fn ignored(name: &'static str, ty: &'static str, why: &'static str) -> Self {
        Self {
            name,
            ty,
            refuse: Refuse::Never,
            why,
        }
    }

    /// A boolean refused when `false`.
    pub(crate) const fn when_false(name: &'static str, why: &'static str) -> Self {
        Self {
            name,
            ty: "boolean",
            refuse: Refuse::False,
            why,
        }
    }
}

/// Declares each of `fields` on the object `schema` (at `path`, for messages) and adds a CEL
/// rule per field refusing it with a message that names the field and says why.
pub(crate) fn refuse_fields(schema: &mut Schema, path: &str, fields: &[Unsupported]) {
    let mut rules = Vec::new();
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for f in fields {
            let description = match f.refuse {
                Refuse::Never => format!(
                    "Fleet's field, accepted with no effect in tender: {}.",
                    f.why
                ),
                Refuse::Unless(v) => format!(
                    "Fleet's field; only `{v}` is supported by tender: {}.",
                    f.why
                ),
                _ => format!("Not supported by tender: {}.", f.why),
            };
            let decl = match f.ty {
                "object" => {
                    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "description": description})
                }
                "array" => json!({
                    "type": "array", "maxItems": 1000, "description": description,
                    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }),
                "string-array" => json!({
                    "type": "array", "maxItems": 1000, "description": description,
                    "items": {"type": "string", "maxLength": 4096}
                }),
                "string" => {
                    json!({"type": "string", "maxLength": 1024, "description": description})
                }
                ty => json!({"type": ty, "description": description}),
            };
            props.insert(f.name.to_string(), decl);
            let name = f.name;
            let (rule, value) = match f.refuse {
                Refuse::Never => continue,
                Refuse::Unless(v) => (
                    format!("!has(self.{name}) || self.{name} == '{v}'"),
                    format!(" other than {v}"),
                ),
                Refuse::Present => (format!("!has(self.{name})"), String::new()),
                Refuse::True => (
                    format!("!has(self.{name}) || !self.{name}"),
                    ": true".to_string(),
                ),
                Refuse::False => (
                    format!("!has(self.{name}) || self.{name}"),
                    ": false".to_string(),
                ),
            };
            rules.push(json!({
                "rule": rule,
                "message": format!("{path}.{name}{value} is not supported by tender: {} (see docs/migrating-from-fleet.md)", f.why)
            }));
        }
    }
    let existing = schema
        .get_mut("x-kubernetes-validations")
        .and_then(|v| v.as_array_mut());
    match existing {
        Some(list) => list.extend(rules),
        None => {
            schema.insert("x-kubernetes-validations".into(), json!(rules));
        }
    }
}

/// Marks a list as a map keyed on `type` (conditions), so server-side apply merges per type.
pub(crate) fn conditions_list_map(schema: &mut Schema) {
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
}

/// Marks a list as a map keyed on `id`: server-side apply merges entries by id, so each
/// writer (field manager) owns only its own entry.
pub(crate) fn id_list_map(schema: &mut Schema) {
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["id"]));
}

/// Marks a list as a map keyed on `(kind, name)`: the apiserver rejects duplicate entries.
pub(crate) fn kind_name_list_map(schema: &mut Schema) {
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["kind", "name"]));
}

/// CEL rule requiring `metadata.name` to be a DNS label, for objects whose name ends up in
/// label values or namespace names. The apiserver refuses a `fieldPath` into metadata, so the
/// error is reported at the root and the message names the field.
fn dns_label_name_rule(kind: &str) -> ValidationRule {
    ValidationRule {
        rule: format!(
            "self.metadata.name.size() <= 63 && self.metadata.name.matches('{DNS_LABEL_PATTERN}')"
        ),
        message: Some(format!(
            "metadata.name of a {kind} must be a DNS label (at most 63 characters: lowercase \
             letters, digits and '-'), because it is used in label values"
        )),
        ..ValidationRule::default()
    }
}

fn root_schema(crd: &mut CustomResourceDefinition) -> &mut JSONSchemaProps {
    crd.spec.versions[0]
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .expect("derived CRDs always carry a schema")
}

fn add_root_rule(crd: &mut CustomResourceDefinition, rule: ValidationRule) {
    root_schema(crd)
        .x_kubernetes_validations
        .get_or_insert_with(Vec::new)
        .push(rule);
}

pub(crate) fn crds() -> Vec<CustomResourceDefinition> {
    let mut cluster = Cluster::crd();
    add_root_rule(&mut cluster, dns_label_name_rule("Cluster"));
    let mut group = ClusterGroup::crd();
    add_root_rule(&mut group, dns_label_name_rule("ClusterGroup"));
    let mut bundle = Bundle::crd();
    add_root_rule(&mut bundle, dns_label_name_rule("Bundle"));
    let bundle_deployment = BundleDeployment::crd();
    // A HelmOp's Bundle has the HelmOp's name.
    let mut helmop = HelmOp::crd();
    add_root_rule(&mut helmop, dns_label_name_rule("HelmOp"));
    vec![cluster, group, bundle, bundle_deployment, helmop]
}
