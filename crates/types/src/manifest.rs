//! One item of a Bundle's (and BundleDeployment's) `spec.resources`: an inline manifest, or
//! one of Fleet's files (`{name, content, encoding}`, decision 0123), with its schema.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// One item of `spec.resources`: an inline Kubernetes manifest, or (any item with a `content`
/// key) one of Fleet's files (`{name, content, encoding}`), kept as untyped JSON. See
/// [`Manifest::file`] for the typed view of a file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Manifest(pub serde_json::Value);

/// Fleet's BundleResource: a file of the directory the Bundle was made from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The path relative to the fleet.yaml directory (`chart/templates/a.yaml`).
    pub name: String,
    /// The content, as written or encoded.
    pub content: String,
    /// `""` (as written), `base64` or `base64+gz`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub encoding: String,
}

/// What one item of `spec.resources` is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Resource<'a> {
    /// An inline manifest applied as written.
    Manifest(&'a Manifest),
    /// A file (part of a chart, or YAML documents).
    File(&'a Manifest),
}

impl Manifest {
    fn str_at(&self, path: &[&str]) -> Option<&str> {
        path.iter()
            .try_fold(&self.0, |v, key| v.get(key))
            .and_then(|v| v.as_str())
    }

    /// Whether this item is a file (it has a `content` key), never an object to apply.
    pub fn is_file(&self) -> bool {
        self.0.get("content").is_some()
    }

    /// The item as a manifest or a file.
    pub fn resource(&self) -> Resource<'_> {
        if self.is_file() {
            Resource::File(self)
        } else {
            Resource::Manifest(self)
        }
    }

    /// The typed view of a file item (`None` for a manifest).
    pub fn file(&self) -> Option<FileEntry> {
        if !self.is_file() {
            return None;
        }
        Some(FileEntry {
            name: self.str_at(&["name"]).unwrap_or_default().to_string(),
            content: self.str_at(&["content"]).unwrap_or_default().to_string(),
            encoding: self.str_at(&["encoding"]).unwrap_or_default().to_string(),
        })
    }

    /// The manifests of `resources`, files left out.
    pub fn manifests(resources: &[Manifest]) -> impl Iterator<Item = &Manifest> {
        resources.iter().filter(|m| !m.is_file())
    }

    /// The files of `resources`, manifests left out. A file without a name is Fleet's
    /// `manifests/fileNNN.yaml`, NNN its index in `resources` (as Fleet names it).
    pub fn files(resources: &[Manifest]) -> impl Iterator<Item = FileEntry> + '_ {
        resources.iter().enumerate().filter_map(|(i, m)| {
            let mut f = m.file()?;
            if f.name.is_empty() {
                f.name = format!("manifests/file{i:03}.yaml");
            }
            Some(f)
        })
    }

    /// `apiVersion` of the manifest.
    pub fn api_version(&self) -> Option<&str> {
        self.str_at(&["apiVersion"])
    }

    /// `kind` of the manifest.
    pub fn kind(&self) -> Option<&str> {
        self.str_at(&["kind"])
    }

    /// `metadata.name` of the manifest.
    pub fn name(&self) -> Option<&str> {
        self.str_at(&["metadata", "name"])
    }

    /// `metadata.namespace` of the manifest, if it sets one.
    pub fn namespace(&self) -> Option<&str> {
        self.str_at(&["metadata", "namespace"])
    }
}

/// Longest file name in `resources` (a path).
const FILE_NAME_MAX: usize = 512;
/// Longest file content as written in the object (3 MiB: more than the apiserver's request
/// limit, so the request limit is the real bound; the agent bounds what it decodes).
const FILE_CONTENT_MAX: usize = 3 * 1024 * 1024;

impl JsonSchema for Manifest {
    fn schema_name() -> Cow<'static, str> {
        "Manifest".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // A union: a file (`content` present) or a manifest. Not an embedded resource, which
        // would require apiVersion and kind of a file too; the rules below require them of a
        // manifest. The declared properties are what the rules read (CEL sees only those).
        json_schema!({
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
            "properties": {
                "apiVersion": {"type": "string", "maxLength": 317},
                "kind": {"type": "string", "maxLength": 63},
                "metadata": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"name": {"type": "string", "maxLength": 253}}
                },
                "name": {"type": "string", "maxLength": FILE_NAME_MAX},
                "content": {"type": "string", "maxLength": FILE_CONTENT_MAX},
                "encoding": {"type": "string", "enum": ["", "base64", "base64+gz"]}
            },
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.content) || (has(self.apiVersion) && self.apiVersion != '' && has(self.kind) && self.kind != '')",
                    "message": "resources[] must be a manifest with apiVersion and kind, or a file with content (Fleet's {name, content, encoding})"
                },
                {
                    "rule": "has(self.content) || (has(self.metadata) && has(self.metadata.name) && self.metadata.name != '')",
                    "message": "resources[].metadata.name is required: every inline manifest needs a name"
                },
                {
                    "rule": "!has(self.content) || !has(self.name) || (!self.name.startsWith('/') && self.name != '..' && !self.name.startsWith('../') && !self.name.endsWith('/..') && !self.name.contains('/../'))",
                    "message": "resources[].name of a file must be a relative path without '..' segments (absent: Fleet's manifests/fileNNN.yaml)"
                },
                {
                    "rule": "has(self.content) || !has(self.encoding)",
                    "message": "resources[].encoding applies to a file (an item with content)"
                }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_file_is_an_item_with_content_and_never_a_manifest() {
        let resources: Vec<Manifest> = serde_json::from_value(json!([
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}},
            {"name": "chart/Chart.yaml", "content": "bmFtZTogeA==", "encoding": "base64"},
            {"name": "README.md", "content": ""},
            {"content": "kind: ConfigMap"},
        ]))
        .unwrap();
        assert_eq!(
            Manifest::manifests(&resources)
                .map(|m| m.name().unwrap())
                .collect::<Vec<_>>(),
            ["a"]
        );
        let files: Vec<FileEntry> = Manifest::files(&resources).collect();
        assert_eq!(files.len(), 3);
        assert_eq!(files[2].name, "manifests/file003.yaml", "Fleet's name");
        assert_eq!(files[0].name, "chart/Chart.yaml");
        assert_eq!(files[0].encoding, "base64");
        assert_eq!(files[1].encoding, "");
        assert!(matches!(resources[0].resource(), Resource::Manifest(_)));
        assert!(matches!(resources[2].resource(), Resource::File(_)));
        assert_eq!(resources[0].file(), None);
    }
}
