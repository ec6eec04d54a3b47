//! The copy rule, in one place: which of a source's labels and annotations travel with its
//! copies, and how a Secret's data is normalised (`stringData` folded into `data`). The hub's
//! copies, the agent's downstream copies and the content hash all read it from here.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use serde_json::{Map, Value, json};

use crate::labels::is_copied_metadata_key;

/// Kinds a hub copies when the operator allows nothing else (`--copyable-kinds`).
pub const DEFAULT_COPYABLE_KINDS: &str = "v1/Secret,v1/ConfigMap";

/// One kind the hub operator allows in `downstreamResources` (`<apiVersion>/<Kind>`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CopyableKind {
    /// `v1`, `kyverno.io/v1`, ...
    pub api_version: String,
    /// `Secret`, `ClusterPolicy`, ...
    pub kind: String,
}

impl CopyableKind {
    /// Parses `<apiVersion>/<Kind>` (`v1/Secret`, `kyverno.io/v1/ClusterPolicy`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (api_version, kind) = s
            .rsplit_once('/')
            .filter(|(v, k)| !v.is_empty() && !k.is_empty())
            .ok_or_else(|| format!("copyable kind {s:?} is not <apiVersion>/<Kind>, e.g. kyverno.io/v1/ClusterPolicy"))?;
        if !kind.starts_with(|c: char| c.is_ascii_uppercase()) {
            return Err(format!("copyable kind {s:?}: the kind must be CamelCase"));
        }
        Ok(Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
    }

    /// Parses a comma-separated list; empty items are skipped.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        s.split(',')
            .filter(|i| !i.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    /// The kind of a core Secret or ConfigMap.
    pub fn core(kind: crate::SourceKind) -> Self {
        Self {
            api_version: "v1".into(),
            kind: kind.as_str().into(),
        }
    }

    /// The core Secret/ConfigMap kind this is, if it is one.
    pub fn source_kind(&self) -> Option<crate::SourceKind> {
        if self.api_version == "v1" {
            crate::SourceKind::parse(&self.kind)
        } else {
            None
        }
    }

    /// Whether this is a core Secret or ConfigMap (copied as itself, not in a carrier).
    pub fn is_secret_or_config_map(&self) -> bool {
        self.api_version == "v1" && (self.kind == "Secret" || self.kind == "ConfigMap")
    }
}

impl std::fmt::Display for CopyableKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)
    }
}

/// Top-level fields of an object that are not its content: identity is re-set on the copy,
/// status belongs to whoever runs the object.
const NOT_CONTENT: [&str; 4] = ["apiVersion", "kind", "metadata", "status"];

/// What a copy of an object of any kind carries: `apiVersion`, `kind`, `metadata.name`, the
/// copied labels and annotations, and every other top-level field but `status` (`spec`, `data`,
/// `rules`, ...). The namespace is not carried: the agent sets it downstream.
pub fn carried_body(object: &Value) -> Value {
    let meta = object.get("metadata");
    let map_of = |field: &str| -> BTreeMap<String, String> {
        let m: Option<BTreeMap<String, String>> = meta
            .and_then(|m| m.get(field))
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        copied_metadata(m.as_ref())
    };
    let mut out = Map::new();
    out.insert(
        "apiVersion".into(),
        object.get("apiVersion").cloned().unwrap_or(Value::Null),
    );
    out.insert(
        "kind".into(),
        object.get("kind").cloned().unwrap_or(Value::Null),
    );
    out.insert(
        "metadata".into(),
        json!({
            "name": meta.and_then(|m| m.get("name")).cloned().unwrap_or(Value::Null),
            "labels": map_of("labels"),
            "annotations": map_of("annotations"),
        }),
    );
    if let Some(fields) = object.as_object() {
        for (k, v) in fields {
            if !NOT_CONTENT.contains(&k.as_str()) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The labels or annotations of a source that its copies carry.
pub fn copied_metadata(map: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| is_copied_metadata_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A Secret's data as the apiserver stores it: `data` with `stringData` folded in
/// (`stringData` wins, as on a write).
pub fn secret_data(secret: &Secret) -> BTreeMap<String, ByteString> {
    let mut data = secret.data.clone().unwrap_or_default();
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), ByteString(v.as_bytes().to_vec()));
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels;

    #[test]
    fn tender_and_kubectl_keys_stay_behind() {
        let source = BTreeMap::from([
            ("app".to_string(), "db".to_string()),
            (labels::MANAGED_BY.to_string(), "helm".to_string()),
            (labels::CONTENT_HASH.to_string(), "x".to_string()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                "{}".to_string(),
            ),
        ]);
        assert_eq!(
            copied_metadata(Some(&source)),
            BTreeMap::from([("app".to_string(), "db".to_string())])
        );
        assert!(copied_metadata(None).is_empty());
    }

    #[test]
    fn copyable_kinds_parse() {
        let kinds = CopyableKind::parse_list("v1/Secret, kyverno.io/v1/ClusterPolicy,").unwrap();
        assert_eq!(kinds.len(), 2);
        assert!(kinds[0].is_secret_or_config_map());
        assert_eq!(kinds[1].api_version, "kyverno.io/v1");
        assert_eq!(kinds[1].kind, "ClusterPolicy");
        assert_eq!(kinds[1].to_string(), "kyverno.io/v1/ClusterPolicy");
        assert!(CopyableKind::parse("Secret").is_err());
        assert!(CopyableKind::parse("v1/secret").is_err());
    }

    #[test]
    fn carried_body_keeps_content_and_drops_identity_and_status() {
        let object = json!({
            "apiVersion": "kyverno.io/v1",
            "kind": "Policy",
            "metadata": {
                "name": "p", "namespace": "src", "uid": "u", "resourceVersion": "7",
                "labels": {"team": "a", "tender.dev/bundle-name": "x"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            },
            "spec": {"rules": []},
            "status": {"ready": true},
        });
        assert_eq!(
            carried_body(&object),
            json!({
                "apiVersion": "kyverno.io/v1",
                "kind": "Policy",
                "metadata": {"name": "p", "labels": {"team": "a"}, "annotations": {}},
                "spec": {"rules": []},
            })
        );
    }

    #[test]
    fn string_data_wins_over_data() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("a".to_string(), ByteString(b"1".to_vec())),
                ("b".to_string(), ByteString(b"2".to_vec())),
            ])),
            string_data: Some(BTreeMap::from([("b".to_string(), "3".to_string())])),
            ..Default::default()
        };
        assert_eq!(
            secret_data(&secret),
            BTreeMap::from([
                ("a".to_string(), ByteString(b"1".to_vec())),
                ("b".to_string(), ByteString(b"3".to_vec())),
            ])
        );
    }
}
