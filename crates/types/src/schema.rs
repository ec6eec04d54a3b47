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

use crate::{Bundle, BundleDeployment, Cluster, ClusterGroup};

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

/// Marks a list as a map keyed on `type` (conditions), so server-side apply merges per type.
pub(crate) fn conditions_list_map(schema: &mut Schema) {
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
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
    vec![cluster, group, bundle, bundle_deployment]
}
