//! Reverse sync (`Bundle.spec.upstreamResources`): downstream Secrets/ConfigMaps published on
//! the hub. The types of the spec entry and of both status lists, and the hub's validation of
//! what an agent wrote into a placeholder. No I/O.
//!
//! The flow: the hub pre-creates one placeholder per entry in the cluster namespace and lets
//! that cluster's agent `get`/`patch`/`update` exactly those names; the agent copies the
//! downstream object's content into it; the hub validates it ([`validate`]) and publishes it in
//! the Bundle's namespace under [`crate::names::upstream_name`].
//!
//! The placeholder format both sides read and write lives here too: its labels
//! ([`placeholder_labels`], recognised by [`is_placeholder`]), the downstream object it names
//! ([`placeholder_source`], [`source_ref`]) and what the agent saw ([`Observed`], and the
//! Secret type in [`crate::labels::UPSTREAM_TYPE`], [`placeholder_secret_type`]).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::labels;
use crate::schema::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN};

/// Largest content (sum of keys and values of `data`/`binaryData`) the hub publishes by default.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024;

/// Secret types the hub publishes; anything else (notably service-account tokens) is rejected.
pub const ALLOWED_SECRET_TYPES: &[&str] = &[
    "Opaque",
    "kubernetes.io/tls",
    "kubernetes.io/basic-auth",
    "kubernetes.io/ssh-auth",
    "kubernetes.io/dockerconfigjson",
];

/// A downstream Secret or ConfigMap read on every targeted cluster and published on the hub.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamResource {
    /// Kind of the downstream object: `Secret` or `ConfigMap`.
    #[schemars(extend("enum" = ["Secret", "ConfigMap"]))]
    pub kind: String,

    /// Name of the downstream object.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,

    /// Namespace of the downstream object; defaults to the Bundle's deployment namespace (targetNamespace, else defaultNamespace, else `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: Option<String>,
}

/// Where one upstream entry stands (agent: on the way to its placeholder; hub: published).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum UpstreamState {
    /// Nothing reported yet (placeholder not written, or its watch not listed yet).
    #[default]
    Pending,
    /// The content is in the placeholder (agent) / published on the hub (hub).
    Published,
    /// The downstream object does not exist (deleted downstream: the publication is removed).
    Missing,
    /// The hub refused the content (size, type); the last valid publication stays.
    Rejected,
    /// The cluster is unreachable: the last published content stays, possibly outdated.
    Stale,
    /// The published name is taken by an object tender did not publish; it is left untouched.
    Conflict,
    /// Reading downstream or writing the placeholder failed; see the message.
    Error,
}

impl UpstreamState {
    /// The state as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Published => "Published",
            Self::Missing => "Missing",
            Self::Rejected => "Rejected",
            Self::Stale => "Stale",
            Self::Conflict => "Conflict",
            Self::Error => "Error",
        }
    }
}

impl std::fmt::Display for UpstreamState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One upstream entry as the agent of this cluster reports it (BundleDeployment status).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamObjectStatus {
    /// `Secret` or `ConfigMap`.
    pub kind: String,
    /// Namespace of the downstream object.
    pub namespace: String,
    /// Name of the downstream object.
    pub name: String,
    /// Name of the placeholder in the cluster namespace on the hub.
    pub placeholder: String,
    /// Published (in the placeholder), Missing (not found downstream), Pending or Error.
    pub state: UpstreamState,
    /// Content hash of the downstream object last written to the placeholder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// When the agent last wrote changed content to the placeholder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_published: Option<Time>,
    /// Why it is not Published; never contains Secret data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One cluster's publication of one upstream entry on the hub (Bundle status).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamPublication {
    /// Name of the Cluster.
    pub cluster: String,
    /// `Secret` or `ConfigMap`.
    pub kind: String,
    /// Namespace of the downstream object.
    pub namespace: String,
    /// Name of the downstream object.
    pub name: String,
    /// Name of the published object in the Bundle's namespace.
    pub published_name: String,
    /// Published, Pending, Missing, Rejected, Stale or Conflict.
    pub state: UpstreamState,
    /// Content hash of the published object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// When the published content last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_published: Option<Time>,
    /// Stale: the cluster's last heartbeat (or when it became unreachable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_since: Option<Time>,
    /// Why it is not Published; never contains Secret data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Content size as the hub counts it: every key plus every value of `data` and `binaryData`.
pub fn content_size(
    data: Option<&BTreeMap<String, ByteString>>,
    string_data: Option<&BTreeMap<String, String>>,
) -> usize {
    let bytes: usize = data
        .into_iter()
        .flatten()
        .map(|(k, v)| k.len() + v.0.len())
        .sum();
    let strings: usize = string_data
        .into_iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    bytes + strings
}

/// The hub's check of what arrived in a placeholder: `Err` says why it is not published
/// (never quoting content).
pub fn validate(size: usize, secret_type: Option<&str>, max_bytes: usize) -> Result<(), String> {
    if size > max_bytes {
        return Err(format!(
            "content is {size} bytes, more than the {max_bytes} bytes the hub publishes"
        ));
    }
    if let Some(t) = secret_type
        && !ALLOWED_SECRET_TYPES.contains(&t)
    {
        return Err(format!(
            "Secret type {t} is not published (allowed: {})",
            ALLOWED_SECRET_TYPES.join(", ")
        ));
    }
    Ok(())
}

/// `Kind/namespace/name`, the value of [`crate::labels::UPSTREAM_SOURCE`].
pub fn source_ref(kind: &str, namespace: &str, name: &str) -> String {
    format!("{kind}/{namespace}/{name}")
}

/// Parses [`source_ref`].
pub fn parse_source_ref(s: &str) -> Option<(&str, &str, &str)> {
    let mut parts = s.splitn(3, '/');
    let kind = parts.next()?;
    let ns = parts.next()?;
    let name = parts.next()?;
    (!kind.is_empty() && !ns.is_empty() && !name.is_empty()).then_some((kind, ns, name))
}

/// Labels of a placeholder (cluster namespace) for Bundle `bundle_ns/bundle` and `cluster`,
/// as the hub writes them.
pub fn placeholder_labels(
    bundle_ns: &str,
    bundle: &str,
    cluster: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
        (labels::WORKSPACE.into(), bundle_ns.into()),
        (labels::BUNDLE_NAMESPACE.into(), bundle_ns.into()),
        (
            labels::UPSTREAM_BUNDLE.into(),
            labels::safe_label_value(bundle),
        ),
        (labels::CLUSTER.into(), labels::safe_label_value(cluster)),
        (labels::UPSTREAM.into(), labels::UPSTREAM_PLACEHOLDER.into()),
    ])
}

/// Whether `meta` is a placeholder: [`labels::UPSTREAM`] = [`labels::UPSTREAM_PLACEHOLDER`].
pub fn is_placeholder(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(labels::UPSTREAM))
        .map(String::as_str)
        == Some(labels::UPSTREAM_PLACEHOLDER)
}

/// The downstream object a placeholder names, `(kind, namespace, name)`, from its
/// [`labels::UPSTREAM_SOURCE`] annotation.
pub fn placeholder_source(meta: &ObjectMeta) -> Option<(&str, &str, &str)> {
    meta.annotations
        .as_ref()?
        .get(labels::UPSTREAM_SOURCE)
        .and_then(|s| parse_source_ref(s))
}

/// The downstream Secret's `type` the agent recorded on a Secret placeholder
/// ([`labels::UPSTREAM_TYPE`]; placeholders themselves stay `Opaque`).
pub fn placeholder_secret_type(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(labels::UPSTREAM_TYPE)
        .map(String::as_str)
}

/// What the agent saw of the downstream object, in the placeholder's
/// [`labels::UPSTREAM_OBSERVED`] annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The agent has not written the placeholder yet.
    Unknown,
    /// The downstream object exists; its content is in the placeholder.
    Present,
    /// The downstream object does not exist.
    Absent,
}

impl Observed {
    /// From a placeholder's metadata.
    pub fn of(meta: Option<&ObjectMeta>) -> Self {
        match meta
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(labels::UPSTREAM_OBSERVED))
            .map(String::as_str)
        {
            Some("Present") => Self::Present,
            Some("Absent") => Self::Absent,
            _ => Self::Unknown,
        }
    }

    /// The annotation's value the agent writes (`None` for [`Observed::Unknown`]: it writes
    /// nothing until it knows).
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            Self::Unknown => None,
            Self::Present => Some("Present"),
            Self::Absent => Some("Absent"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_and_type_limits() {
        assert!(validate(10, None, 100).is_ok());
        assert!(validate(10, Some("Opaque"), 100).is_ok());
        let too_big = validate(101, None, 100).unwrap_err();
        assert!(too_big.contains("101 bytes"), "{too_big}");
        let token = validate(1, Some("kubernetes.io/service-account-token"), 100).unwrap_err();
        assert!(token.contains("service-account-token"), "{token}");
    }

    #[test]
    fn content_size_counts_keys_and_values() {
        let data = BTreeMap::from([("ab".to_string(), ByteString(vec![0; 10]))]);
        let strings = BTreeMap::from([("c".to_string(), "xyz".to_string())]);
        assert_eq!(content_size(Some(&data), Some(&strings)), 16);
        assert_eq!(content_size(None, None), 0);
    }

    #[test]
    fn source_refs_round_trip() {
        let s = source_ref("Secret", "ns", "a.b");
        assert_eq!(parse_source_ref(&s), Some(("Secret", "ns", "a.b")));
        assert_eq!(parse_source_ref("Secret/ns"), None);
    }

    #[test]
    fn placeholder_format_round_trips() {
        let mut meta = ObjectMeta {
            labels: Some(placeholder_labels("ws", "app", "east")),
            ..Default::default()
        };
        assert!(is_placeholder(&meta));
        assert_eq!(Observed::of(Some(&meta)), Observed::Unknown);
        assert_eq!(placeholder_source(&meta), None);
        for observed in [Observed::Present, Observed::Absent] {
            meta.annotations = Some(BTreeMap::from([
                (
                    labels::UPSTREAM_OBSERVED.to_string(),
                    observed.as_str().unwrap().to_string(),
                ),
                (
                    labels::UPSTREAM_SOURCE.to_string(),
                    source_ref("Secret", "apps", "db"),
                ),
                (labels::UPSTREAM_TYPE.to_string(), "Opaque".to_string()),
            ]));
            assert_eq!(Observed::of(Some(&meta)), observed);
        }
        assert_eq!(placeholder_source(&meta), Some(("Secret", "apps", "db")));
        assert_eq!(placeholder_secret_type(&meta), Some("Opaque"));
        assert_eq!(Observed::Unknown.as_str(), None);
        meta.labels.as_mut().unwrap().insert(
            labels::UPSTREAM.to_string(),
            labels::UPSTREAM_PUBLISHED.to_string(),
        );
        assert!(
            !is_placeholder(&meta),
            "a published object is not a placeholder"
        );
    }
}
