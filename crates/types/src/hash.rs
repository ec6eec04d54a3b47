//! Stable content hashes: equal content, equal hash, whatever the key order or encoding.
//!
//! The hub compares hashes before writing so that unchanged objects cost no request, and
//! `deploymentID` changes exactly when something the agent deploys changes.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::{Value, json};

use crate::bundle::Manifest;
use crate::bundle_deployment::{BundleDeploymentOptions, BundleDeploymentSpec};
use crate::copy::{copied_metadata, secret_data};

pub use crate::digest::{sha256_hex, short_hash};

/// Canonical JSON text of `value`: object keys sorted at every level, no whitespace.
///
/// Does not rely on `serde_json::Map` ordering, which changes with the `preserve_order` feature
/// that any crate in the build may enable.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(val, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// SHA-256 hex of the canonical JSON of `value`.
pub fn value_hash(value: &Value) -> String {
    sha256_hex(canonical_json(value).as_bytes())
}

/// Content hash of a Secret: data (with `stringData` folded in as the apiserver would), type
/// (unset means `Opaque`), immutable, and the labels and annotations copied with it.
pub fn secret_hash(secret: &Secret) -> String {
    let data: BTreeMap<String, String> = secret_data(secret)
        .into_iter()
        .map(|(k, v)| (k, hex::encode(v.0)))
        .collect();
    value_hash(&json!({
        "kind": "Secret",
        "type": secret.type_.as_deref().unwrap_or("Opaque"),
        "immutable": secret.immutable.unwrap_or(false),
        "data": data,
        "labels": copied_metadata(secret.metadata.labels.as_ref()),
        "annotations": copied_metadata(secret.metadata.annotations.as_ref()),
    }))
}

/// Content hash of a ConfigMap: data and binaryData (kept apart: they are different fields
/// downstream), immutable, and the labels and annotations copied with it.
pub fn config_map_hash(config_map: &ConfigMap) -> String {
    let binary: BTreeMap<&str, String> = config_map
        .binary_data
        .iter()
        .flatten()
        .map(|(k, ByteString(v))| (k.as_str(), hex::encode(v)))
        .collect();
    value_hash(&json!({
        "kind": "ConfigMap",
        "immutable": config_map.immutable.unwrap_or(false),
        "data": config_map.data.clone().unwrap_or_default(),
        "binaryData": binary,
        "labels": copied_metadata(config_map.metadata.labels.as_ref()),
        "annotations": copied_metadata(config_map.metadata.annotations.as_ref()),
    }))
}

/// Content hash of an object carried in a carrier Secret: the hash of its
/// [`crate::copy::carried_body`]. The hub records it in the BundleDeployment; the agent hashes
/// the carrier's content and deploys only on equality.
pub fn carried_hash(object: &Value) -> String {
    value_hash(&crate::copy::carried_body(object))
}

/// The object a carrier Secret carries (its JSON under [`crate::labels::CARRIER_KEY`]).
pub fn carried_object(carrier: &Secret) -> Option<Value> {
    let data = carrier.data.as_ref()?.get(crate::labels::CARRIER_KEY)?;
    serde_json::from_slice(&data.0).ok()
}

/// Content hash of a carrier Secret: the [`carried_hash`] of what it carries (`None` when it
/// carries nothing readable). What the hub signs for a carried copy, and the agent checks.
pub fn carrier_hash(carrier: &Secret) -> Option<String> {
    carried_object(carrier).map(|o| carried_hash(&o))
}

/// Content hash of a list of manifests; order matters (it is the apply order), key order does not.
pub fn manifests_hash(resources: &[Manifest]) -> String {
    value_hash(&Value::Array(
        resources.iter().map(|m| m.0.clone()).collect(),
    ))
}

/// The `deploymentID` of a BundleDeployment: a hash of its manifests and resolved options.
///
/// The options carry each copied source's content hash ([`secret_hash`] / [`config_map_hash`]
/// in [`crate::CopiedResource::hash`]), so rotating a source changes the ID. The order of
/// `downstreamResources` does not matter.
pub fn deployment_id(resources: &[Manifest], options: &BundleDeploymentOptions) -> String {
    let mut options = options.clone();
    options.downstream_resources.sort();
    let options = serde_json::to_value(&options).expect("options serialize to JSON");
    let manifests = Value::Array(resources.iter().map(|m| m.0.clone()).collect());
    value_hash(&json!({ "resources": manifests, "options": options }))
}

/// The deployment an agent applies: `spec.deploymentID` together with the content hash of each
/// copy it verified (decision 0089-signed-copies). The hub writes no copy hash into the spec,
/// so a rotation changes this and not the BundleDeployment; the agent reports it as
/// `status.appliedDeploymentID`, and the hub computes the same from the copies it wrote.
/// Without copies it is `deployment_id` itself.
pub fn effective_deployment_id<'a>(
    deployment_id: &str,
    copies: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let copies: BTreeMap<&str, &str> = copies.into_iter().collect();
    if copies.is_empty() {
        return deployment_id.to_string();
    }
    value_hash(&json!({ "deploymentID": deployment_id, "copies": copies }))
}

/// Hash of a whole BundleDeployment spec, as the hub writes it: equal specs, equal hash. The
/// hub's cache keeps this instead of the spec and the executor's memo knows a write by it.
pub fn spec_hash(spec: &BundleDeploymentSpec) -> String {
    value_hash(&serde_json::to_value(spec).expect("a spec serializes to JSON"))
}

/// [`deployment_id`] of a deployment that may carry a Helm chart: without one it is exactly
/// [`deployment_id`] (existing deployments keep their ID); with one, the chart options are
/// hashed too (the copies feeding `valuesFrom` already are, through `options`).
pub fn deployment_id_with_helm(
    resources: &[Manifest],
    options: &BundleDeploymentOptions,
    helm: Option<&crate::helm::HelmOptions>,
) -> String {
    let Some(helm) = helm else {
        return deployment_id(resources, options);
    };
    let base = deployment_id(resources, options);
    let helm = serde_json::to_value(helm).expect("helm options serialize to JSON");
    value_hash(&json!({ "base": base, "helm": helm }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle_deployment::CopiedResource;

    fn secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn canonical_json_ignores_key_order() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"q":1,"p":2}],"x":"s"}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":"s","y":[1,{"p":2,"q":1}]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":"s","y":[1,{"p":2,"q":1}]},"b":1}"#
        );
        assert_eq!(value_hash(&a), value_hash(&b));
        let c: Value =
            serde_json::from_str(r#"{"a":{"x":"s","y":[{"p":2,"q":1},1]},"b":1}"#).unwrap();
        assert_ne!(value_hash(&a), value_hash(&c), "array order matters");
    }

    #[test]
    fn secret_hash_follows_data() {
        let base = secret_hash(&secret(&[("user", b"admin"), ("pass", b"x")]));
        assert_eq!(
            base,
            secret_hash(&secret(&[("pass", b"x"), ("user", b"admin")]))
        );
        assert_ne!(
            base,
            secret_hash(&secret(&[("user", b"admin"), ("pass", b"y")]))
        );
        assert_ne!(base, secret_hash(&secret(&[("user", b"admin")])));
        assert_eq!(base.len(), 64);
    }

    #[test]
    fn secret_hash_folds_string_data_and_defaults() {
        let from_data = secret(&[("k", b"v")]);
        let from_string_data = Secret {
            string_data: Some([("k".to_string(), "v".to_string())].into()),
            ..Secret::default()
        };
        assert_eq!(secret_hash(&from_data), secret_hash(&from_string_data));

        let mut opaque = from_data.clone();
        opaque.type_ = Some("Opaque".into());
        assert_eq!(secret_hash(&from_data), secret_hash(&opaque));
        let mut tls = from_data.clone();
        tls.type_ = Some("kubernetes.io/tls".into());
        assert_ne!(secret_hash(&from_data), secret_hash(&tls));
        let mut immutable = from_data.clone();
        immutable.immutable = Some(true);
        assert_ne!(secret_hash(&from_data), secret_hash(&immutable));
    }

    #[test]
    fn secret_hash_covers_copied_metadata_only() {
        let plain = secret(&[("k", b"v")]);
        let mut labelled = plain.clone();
        labelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        assert_ne!(secret_hash(&plain), secret_hash(&labelled));
        let mut bookkeeping = plain.clone();
        bookkeeping.metadata.annotations = Some(
            [
                (
                    "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                    "{}".to_string(),
                ),
                (crate::labels::CONTENT_HASH.to_string(), "x".to_string()),
            ]
            .into(),
        );
        bookkeeping.metadata.resource_version = Some("42".into());
        assert_eq!(secret_hash(&plain), secret_hash(&bookkeeping));
    }

    #[test]
    fn config_map_data_and_binary_data_differ() {
        let text = ConfigMap {
            data: Some([("k".to_string(), "v".to_string())].into()),
            ..ConfigMap::default()
        };
        let binary = ConfigMap {
            binary_data: Some([("k".to_string(), ByteString(b"v".to_vec()))].into()),
            ..ConfigMap::default()
        };
        assert_ne!(config_map_hash(&text), config_map_hash(&binary));
        let mut changed = text.clone();
        changed.data = Some([("k".to_string(), "w".to_string())].into());
        assert_ne!(config_map_hash(&text), config_map_hash(&changed));
        assert_eq!(config_map_hash(&text), config_map_hash(&text.clone()));
    }

    #[test]
    fn secret_and_config_map_with_same_data_differ() {
        let s = Secret {
            string_data: Some([("k".to_string(), "v".to_string())].into()),
            ..Secret::default()
        };
        let c = ConfigMap {
            data: Some([("k".to_string(), "v".to_string())].into()),
            ..ConfigMap::default()
        };
        assert_ne!(secret_hash(&s), config_map_hash(&c));
    }

    #[test]
    fn deployment_id_tracks_manifests_options_and_sources() {
        let m = |s: &str| Manifest(serde_json::from_str(s).unwrap());
        let resources = vec![m(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#,
        )];
        let reordered = vec![m(
            r#"{"metadata":{"name":"a"},"kind":"ConfigMap","apiVersion":"v1"}"#,
        )];
        let copy = |name: &str, hash: &str| CopiedResource {
            api_version: None,
            kind: "Secret".into(),
            name: name.into(),
            copy_name: format!("b-secret-{name}"),
            hash: hash.into(),
        };
        let options = BundleDeploymentOptions {
            default_namespace: "default".into(),
            downstream_resources: vec![copy("a", "h1"), copy("b", "h2")],
            ..BundleDeploymentOptions::default()
        };
        let id = deployment_id(&resources, &options);
        assert_eq!(id, deployment_id(&reordered, &options));

        let mut swapped = options.clone();
        swapped.downstream_resources.reverse();
        assert_eq!(
            id,
            deployment_id(&resources, &swapped),
            "copy order is irrelevant"
        );

        let mut rotated = options.clone();
        rotated.downstream_resources[0].hash = "h1b".into();
        assert_ne!(id, deployment_id(&resources, &rotated), "source rotation");

        let mut keep = options.clone();
        keep.keep_resources = true;
        assert_ne!(id, deployment_id(&resources, &keep));
        assert_ne!(id, deployment_id(&[], &options));
        assert_ne!(manifests_hash(&resources), manifests_hash(&[]));
    }

    #[test]
    fn effective_id_follows_copy_hashes_not_their_order() {
        assert_eq!(effective_deployment_id("id", []), "id");
        let a = effective_deployment_id("id", [("c1", "h1"), ("c2", "h2")]);
        assert_eq!(
            a,
            effective_deployment_id("id", [("c2", "h2"), ("c1", "h1")])
        );
        assert_ne!(
            a,
            effective_deployment_id("id", [("c1", "h1b"), ("c2", "h2")])
        );
        assert_ne!(
            a,
            effective_deployment_id("id2", [("c1", "h1"), ("c2", "h2")])
        );
        assert_ne!(a, "id");
    }

    #[test]
    fn deployment_id_with_helm_tracks_the_chart() {
        let options = BundleDeploymentOptions::default();
        let plain = deployment_id(&[], &options);
        assert_eq!(plain, deployment_id_with_helm(&[], &options, None));
        let helm = crate::helm::HelmOptions {
            chart: "app".into(),
            repo: Some("http://r".into()),
            version: Some("1.0.0".into()),
            ..Default::default()
        };
        let with = deployment_id_with_helm(&[], &options, Some(&helm));
        assert_ne!(plain, with);
        let mut upgraded = helm.clone();
        upgraded.version = Some("1.1.0".into());
        assert_ne!(
            with,
            deployment_id_with_helm(&[], &options, Some(&upgraded))
        );
    }
}
