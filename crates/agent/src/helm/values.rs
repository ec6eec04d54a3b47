//! Pure: which Secrets/ConfigMaps a chart reads, and the merged values (Fleet's order: inline
//! `values`, then each `valuesFrom` in list order, deep-merged).

use std::collections::{BTreeMap, HashMap};

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::{Map, Value};
use tender_types::conditions::reason;
use tender_types::copy::secret_data;
use tender_types::helm::merge_values;
use tender_types::{HelmOptions, KeyRef, ObjectState};

use super::ChartFailure;
use super::oci::{docker_config_credentials, parse_reference};
use crate::plan::Planned;

/// A Secret or ConfigMap a chart reads downstream.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueSource {
    /// A Secret (else a ConfigMap).
    pub secret: bool,
    /// Namespace downstream.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ValueSource {
    fn of(secret: bool, r: &KeyRef, namespace: &str) -> Self {
        Self {
            secret,
            namespace: r.namespace.clone().unwrap_or_else(|| namespace.to_string()),
            name: r.name.clone(),
        }
    }

    /// `Secret ns/name` for messages.
    pub fn describe(&self) -> String {
        let kind = if self.secret { "Secret" } else { "ConfigMap" };
        format!("{kind} {}/{}", self.namespace, self.name)
    }
}

/// The data of one object, key → bytes (never logged).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ObjectData(pub BTreeMap<String, Vec<u8>>);

impl std::fmt::Debug for ObjectData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys only: values may be Secret data.
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl ObjectData {
    /// A Secret's data (`stringData` folded in).
    pub fn from_secret(s: &Secret) -> Self {
        Self(secret_data(s).into_iter().map(|(k, v)| (k, v.0)).collect())
    }

    /// A ConfigMap's `data` and `binaryData`.
    pub fn from_config_map(c: &ConfigMap) -> Self {
        let mut out: BTreeMap<String, Vec<u8>> = c
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        out.extend(
            c.binary_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone())),
        );
        Self(out)
    }

    /// The data of a planned copy's body (`data` base64 for a Secret, plain for a ConfigMap).
    fn from_body(body: &Value, secret: bool) -> Self {
        let mut out = BTreeMap::new();
        let b64 = base64::engine::general_purpose::STANDARD;
        if let Some(data) = body.get("data").and_then(Value::as_object) {
            for (k, v) in data {
                let Some(s) = v.as_str() else { continue };
                let bytes = if secret {
                    b64.decode(s).unwrap_or_default()
                } else {
                    s.as_bytes().to_vec()
                };
                out.insert(k.clone(), bytes);
            }
        }
        if let Some(data) = body.get("binaryData").and_then(Value::as_object) {
            for (k, v) in data {
                if let Some(s) = v.as_str() {
                    out.insert(k.clone(), b64.decode(s).unwrap_or_default());
                }
            }
        }
        Self(out)
    }
}

/// Every object `helm` reads: each `valuesFrom` entry and the `helmSecretName` Secret;
/// without a namespace they are in `namespace` (where the copies land).
pub fn needed_sources(helm: &HelmOptions, namespace: &str) -> Vec<ValueSource> {
    let mut out: Vec<ValueSource> = helm
        .values_from
        .iter()
        .filter_map(|v| match (&v.secret_key_ref, &v.config_map_key_ref) {
            (Some(r), _) => Some(ValueSource::of(true, r, namespace)),
            (None, Some(r)) => Some(ValueSource::of(false, r, namespace)),
            (None, None) => None,
        })
        .collect();
    if let Some(name) = &helm.helm_secret_name {
        out.push(ValueSource {
            secret: true,
            namespace: namespace.to_string(),
            name: name.clone(),
        });
    }
    out.sort();
    out.dedup();
    out
}

/// The data of `source` if it is one of this deployment's planned copies (what is about to
/// be downstream, so a rotation renders with the new data in the same pass).
pub(crate) fn from_planned(copies: &[Planned], source: &ValueSource) -> Option<ObjectData> {
    let kind = if source.secret { "Secret" } else { "ConfigMap" };
    copies.iter().filter_map(|p| p.as_ref().ok()).find_map(|d| {
        (d.copy
            && d.key.kind == kind
            && d.key.name == source.name
            && d.key.namespace.as_deref() == Some(source.namespace.as_str()))
        .then(|| ObjectData::from_body(&d.body, source.secret))
    })
}

/// The first source `helm` reads that is one of this deployment's copies still on its way
/// (its planned entry is `Missing`: the hub's copy is absent or behind). Rendering then waits
/// for the copy instead of failing with `ValuesFromMissing`, which would only be true for a
/// moment after a Bundle is created or a source renamed.
pub(crate) fn pending_copy<'a>(
    copies: &[Planned],
    sources: &'a [ValueSource],
) -> Option<&'a ValueSource> {
    sources.iter().find(|source| {
        let kind = if source.secret { "Secret" } else { "ConfigMap" };
        copies.iter().any(|p| {
            p.as_ref().err().is_some_and(|s| {
                s.state == ObjectState::Missing
                    && s.kind == kind
                    && s.name == source.name
                    && s.namespace.as_deref() == Some(source.namespace.as_str())
            })
        })
    })
}

/// The merged values: inline `values`, then each `valuesFrom` in order (deep merge).
/// `found` holds every [`needed_sources`] entry (`None`: it does not exist downstream).
pub fn merge_sources(
    helm: &HelmOptions,
    namespace: &str,
    found: &HashMap<ValueSource, Option<ObjectData>>,
) -> Result<Map<String, Value>, ChartFailure> {
    let mut merged = helm.values.clone().map(|v| v.0).unwrap_or_default();
    for (i, entry) in helm.values_from.iter().enumerate() {
        let (secret, r) = match (&entry.secret_key_ref, &entry.config_map_key_ref) {
            (Some(r), _) => (true, r),
            (None, Some(r)) => (false, r),
            (None, None) => continue,
        };
        let source = ValueSource::of(secret, r, namespace);
        let Some(Some(data)) = found.get(&source) else {
            return Err(ChartFailure::new(
                reason::VALUES_FROM_MISSING,
                format!(
                    "valuesFrom[{i}]: {} does not exist downstream (copy it with downstreamResources)",
                    source.describe()
                ),
            ));
        };
        let Some(bytes) = data.0.get(r.key()) else {
            return Err(ChartFailure::new(
                reason::VALUES_FROM_MISSING,
                format!(
                    "valuesFrom[{i}]: {} has no key {:?}",
                    source.describe(),
                    r.key()
                ),
            ));
        };
        let invalid = || {
            // Never the parser's message: it may quote the content.
            ChartFailure::new(
                reason::VALUES_INVALID,
                format!(
                    "valuesFrom[{i}]: key {:?} of {} is not a YAML map",
                    r.key(),
                    source.describe()
                ),
            )
        };
        let text = std::str::from_utf8(bytes).map_err(|_| invalid())?;
        if text.trim().is_empty() {
            continue;
        }
        let parsed: Value = serde_saphyr::from_str(text).map_err(|_| invalid())?;
        match parsed {
            Value::Object(m) => merge_values(&mut merged, m),
            Value::Null => {}
            _ => return Err(invalid()),
        }
    }
    Ok(merged)
}

/// The key of the `helmSecretName` Secret holding PEM CAs for the chart source (Fleet's name).
pub(crate) const CACERTS: &str = "cacerts";

/// `cacerts` of the `helmSecretName` Secret, if set and present (read after [`credentials`],
/// which reports a missing Secret).
pub(crate) fn cacerts<'a>(
    helm: &HelmOptions,
    namespace: &str,
    found: &'a HashMap<ValueSource, Option<ObjectData>>,
) -> Option<&'a [u8]> {
    let source = ValueSource {
        secret: true,
        namespace: namespace.to_string(),
        name: helm.helm_secret_name.clone()?,
    };
    found
        .get(&source)?
        .as_ref()?
        .0
        .get(CACERTS)
        .map(Vec::as_slice)
}

/// `username`/`password` of the `helmSecretName` Secret, if set; for an `oci://` chart a
/// `.dockerconfigjson` entry for the registry's host serves as well.
pub fn credentials(
    helm: &HelmOptions,
    namespace: &str,
    found: &HashMap<ValueSource, Option<ObjectData>>,
) -> Result<Option<(String, String)>, ChartFailure> {
    let Some(name) = &helm.helm_secret_name else {
        return Ok(None);
    };
    let source = ValueSource {
        secret: true,
        namespace: namespace.to_string(),
        name: name.clone(),
    };
    let missing = |what: &str| {
        ChartFailure::new(
            reason::VALUES_FROM_MISSING,
            format!(
                "helmSecretName: {} {what} (copy it with downstreamResources)",
                source.describe()
            ),
        )
    };
    let Some(Some(data)) = found.get(&source) else {
        return Err(missing("does not exist downstream"));
    };
    let text = |key: &str| {
        data.0
            .get(key)
            .and_then(|b| String::from_utf8(b.clone()).ok())
    };
    if let (Some(u), Some(p)) = (text("username"), text("password")) {
        return Ok(Some((u, p)));
    }
    let Some(config) = data.0.get(".dockerconfigjson") else {
        if data.0.contains_key(CACERTS) {
            // Only a private CA for the repository (decision 0106-chart-repository-tls).
            return Ok(None);
        }
        return Err(missing("needs the keys username and password"));
    };
    let host = parse_reference(&helm.chart).map(|r| r.host).map_err(|_| {
        missing(
            "needs the keys username and password (.dockerconfigjson serves oci:// charts only)",
        )
    })?;
    docker_config_credentials(config, &host)
        .map(Some)
        .ok_or_else(|| missing(&format!("has no .dockerconfigjson entry for {host}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tender_types::{Values, ValuesFrom};

    fn key_ref(name: &str, key: &str) -> KeyRef {
        KeyRef {
            name: name.into(),
            namespace: None,
            key: Some(key.into()),
        }
    }

    fn helm() -> HelmOptions {
        HelmOptions {
            chart: "app".into(),
            repo: Some("http://r".into()),
            values: Some(Values(
                json!({"image": {"tag": "1", "repo": "x"}, "replicas": 1})
                    .as_object()
                    .cloned()
                    .unwrap(),
            )),
            values_from: vec![
                ValuesFrom {
                    secret_key_ref: Some(key_ref("creds", "values.yaml")),
                    config_map_key_ref: None,
                },
                ValuesFrom {
                    secret_key_ref: None,
                    config_map_key_ref: Some(key_ref("conf", "v")),
                },
            ],
            ..Default::default()
        }
    }

    fn data(pairs: &[(&str, &str)]) -> Option<ObjectData> {
        Some(ObjectData(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        ))
    }

    fn src(secret: bool, name: &str) -> ValueSource {
        ValueSource {
            secret,
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    #[test]
    fn sources_default_to_the_copies_namespace() {
        let mut h = helm();
        h.helm_secret_name = Some("repo-auth".into());
        h.values_from[1]
            .config_map_key_ref
            .as_mut()
            .unwrap()
            .namespace = Some("other".into());
        let got = needed_sources(&h, "apps");
        assert_eq!(
            got,
            vec![
                ValueSource {
                    secret: false,
                    namespace: "other".into(),
                    name: "conf".into()
                },
                src(true, "creds"),
                src(true, "repo-auth"),
            ]
        );
    }

    #[test]
    fn values_merge_inline_then_each_source_in_order() {
        let found = HashMap::from([
            (
                src(true, "creds"),
                data(&[("values.yaml", "image:\n  tag: \"2\"\npassword: s3cret\n")]),
            ),
            (
                src(false, "conf"),
                data(&[("v", "image: {tag: \"3\"}\nreplicas: 2\n")]),
            ),
        ]);
        let merged = merge_sources(&helm(), "apps", &found).unwrap();
        assert_eq!(
            Value::Object(merged),
            json!({"image": {"tag": "3", "repo": "x"}, "replicas": 2, "password": "s3cret"})
        );
    }

    #[test]
    fn a_missing_object_or_key_is_values_from_missing() {
        let found = HashMap::from([(src(true, "creds"), data(&[("values.yaml", "a: 1")]))]);
        let err = merge_sources(&helm(), "apps", &found).unwrap_err();
        assert_eq!(err.reason, reason::VALUES_FROM_MISSING);
        assert!(err.message.contains("ConfigMap apps/conf"), "{err}");

        let found = HashMap::from([
            (src(true, "creds"), data(&[("other", "a: 1")])),
            (src(false, "conf"), data(&[("v", "a: 1")])),
        ]);
        let err = merge_sources(&helm(), "apps", &found).unwrap_err();
        assert_eq!(err.reason, reason::VALUES_FROM_MISSING);
        assert!(err.message.contains("no key \"values.yaml\""), "{err}");
    }

    #[test]
    fn a_value_that_is_not_a_map_is_invalid_and_not_quoted() {
        let found = HashMap::from([
            (
                src(true, "creds"),
                data(&[("values.yaml", "- topsecret\n")]),
            ),
            (src(false, "conf"), data(&[("v", "a: 1")])),
        ]);
        let err = merge_sources(&helm(), "apps", &found).unwrap_err();
        assert_eq!(err.reason, reason::VALUES_INVALID);
        assert!(!err.message.contains("topsecret"), "{err}");
        let found = HashMap::from([
            (src(true, "creds"), data(&[("values.yaml", "a: [unclosed")])),
            (src(false, "conf"), data(&[("v", "a: 1")])),
        ]);
        assert_eq!(
            merge_sources(&helm(), "apps", &found).unwrap_err().reason,
            reason::VALUES_INVALID
        );
    }

    #[test]
    fn credentials_need_username_and_password() {
        let mut h = helm();
        assert_eq!(credentials(&h, "apps", &HashMap::new()), Ok(None));
        h.helm_secret_name = Some("auth".into());
        let found = HashMap::from([(
            src(true, "auth"),
            data(&[("username", "u"), ("password", "p")]),
        )]);
        assert_eq!(
            credentials(&h, "apps", &found),
            Ok(Some(("u".into(), "p".into())))
        );
        let found = HashMap::from([(src(true, "auth"), data(&[("username", "u")]))]);
        let err = credentials(&h, "apps", &found).unwrap_err();
        assert_eq!(err.reason, reason::VALUES_FROM_MISSING);
        assert!(!format!("{err:?}").contains("\"u\""));
    }

    #[test]
    fn a_secret_with_only_cacerts_means_no_credentials() {
        let mut h = helm();
        assert_eq!(cacerts(&h, "apps", &HashMap::new()), None);
        h.helm_secret_name = Some("auth".into());
        let found = HashMap::from([(src(true, "auth"), data(&[("cacerts", "PEM")]))]);
        assert_eq!(credentials(&h, "apps", &found), Ok(None));
        assert_eq!(cacerts(&h, "apps", &found), Some(&b"PEM"[..]));
        let found = HashMap::from([(
            src(true, "auth"),
            data(&[("username", "u"), ("password", "p")]),
        )]);
        assert_eq!(cacerts(&h, "apps", &found), None);
    }

    #[test]
    fn a_docker_config_serves_an_oci_chart_by_host() {
        let mut h = helm();
        h.repo = None;
        h.chart = "oci://reg.example:5000/charts/app".into();
        h.helm_secret_name = Some("auth".into());
        let config = r#"{"auths":{"reg.example:5000":{"username":"u","password":"p"}}}"#;
        let found = HashMap::from([(src(true, "auth"), data(&[(".dockerconfigjson", config)]))]);
        assert_eq!(
            credentials(&h, "apps", &found),
            Ok(Some(("u".into(), "p".into())))
        );
        h.chart = "oci://elsewhere.example/charts/app".into();
        let err = credentials(&h, "apps", &found).unwrap_err();
        assert_eq!(err.reason, reason::VALUES_FROM_MISSING);
        assert!(
            err.message
                .contains("no .dockerconfigjson entry for elsewhere.example"),
            "{err}"
        );
        assert!(!err.message.contains("\"p\""), "{err}");
    }

    #[test]
    fn object_data_debug_shows_keys_only() {
        let d = data(&[("password", "hunter2")]).unwrap();
        assert_eq!(format!("{d:?}"), "[\"password\"]");
    }

    #[test]
    fn a_source_whose_copy_is_on_its_way_is_pending_not_missing() {
        let status = |kind: &str, name: &str, state| tender_types::ObjectStatus {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: Some("apps".into()),
            name: name.into(),
            state,
            message: None,
        };
        let sources = needed_sources(&helm(), "apps");
        let first = sources.first().expect("helm() reads sources").clone();
        let kind = if first.secret { "Secret" } else { "ConfigMap" };
        let copies: Vec<Planned> = vec![Err(status(kind, &first.name, ObjectState::Missing))];
        assert_eq!(pending_copy(&copies, &sources), Some(&first));
        // A copy that failed for good, or one of another name, is not waited for.
        let failed: Vec<Planned> = vec![Err(status(kind, &first.name, ObjectState::Error))];
        assert_eq!(pending_copy(&failed, &sources), None);
        let other: Vec<Planned> = vec![Err(status(kind, "unrelated", ObjectState::Missing))];
        assert_eq!(pending_copy(&other, &sources), None);
        assert_eq!(pending_copy(&[], &sources), None);
    }
}
