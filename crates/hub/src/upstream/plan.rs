//! Reverse sync, pure: the placeholders a Bundle needs in one cluster namespace, the agent's
//! access to exactly those names, what to publish from a placeholder, what to delete, and the
//! Bundle condition. Unit tests call these with plain values.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use tender_runtime::executor::{Apply, Fingerprint, ObjectKey, Op, body_of};
use tender_types::conditions::reason;
pub use tender_types::upstream::Observed;
use tender_types::upstream::{self, UpstreamPublication, UpstreamState};
use tender_types::{SourceKind, UpstreamResource, copy, hash, labels, names};

/// One upstream entry resolved for one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Kind of the downstream object (and of placeholder and publication).
    pub kind: SourceKind,
    /// Namespace downstream (defaulted to the deployment namespace).
    pub namespace: String,
    /// Name downstream.
    pub name: String,
    /// Placeholder name in the cluster namespace.
    pub placeholder: String,
    /// Published name in the Bundle's namespace.
    pub published: String,
}

/// Resolves the Bundle's entries for one cluster; `deploy_ns` is the BundleDeployment's
/// target namespace, else its default namespace. Unsupported kinds are skipped (the CRD
/// refuses them).
pub fn entries(
    bundle: &str,
    cluster: &str,
    deploy_ns: &str,
    spec: &[UpstreamResource],
) -> Vec<Entry> {
    spec.iter()
        .filter_map(|r| {
            let kind = SourceKind::parse(&r.kind)?;
            let namespace = r.namespace.clone().unwrap_or_else(|| deploy_ns.to_string());
            Some(Entry {
                kind,
                placeholder: names::upstream_placeholder(
                    bundle,
                    kind.as_str(),
                    &namespace,
                    &r.name,
                ),
                published: names::upstream_name(bundle, cluster, &r.name),
                namespace,
                name: r.name.clone(),
            })
        })
        .collect()
}

fn key(kind: SourceKind, ns: &str, name: &str) -> ObjectKey {
    match kind {
        SourceKind::Secret => ObjectKey::of::<Secret>(Some(ns), name),
        SourceKind::ConfigMap => ObjectKey::of::<ConfigMap>(Some(ns), name),
    }
}

/// The placeholder's metadata as the hub writes it (the agent owns data and its annotations),
/// or nothing when the cached one already carries the same content hash and owner.
pub fn placeholder_op(
    entry: &Entry,
    cluster_ns: &str,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
    live: Option<&ObjectMeta>,
) -> Option<Op> {
    let source = upstream::source_ref(entry.kind.as_str(), &entry.namespace, &entry.name);
    let desired = hash::value_hash(&serde_json::json!([labels, source, owner.uid]));
    if let Some(live) = live {
        let current = live
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::CONTENT_HASH));
        if current == Some(&desired) {
            return None;
        }
    }
    let meta = ObjectMeta {
        name: Some(entry.placeholder.clone()),
        namespace: Some(cluster_ns.to_string()),
        labels: Some(labels.clone()),
        annotations: Some(BTreeMap::from([
            (labels::UPSTREAM_SOURCE.to_string(), source),
            (labels::CONTENT_HASH.to_string(), desired.clone()),
        ])),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    let body = match entry.kind {
        SourceKind::Secret => body_of(&Secret {
            metadata: meta,
            type_: Some("Opaque".into()),
            ..Default::default()
        }),
        SourceKind::ConfigMap => body_of(&ConfigMap {
            metadata: meta,
            ..Default::default()
        }),
    };
    Some(Op::Apply(Apply {
        key: key(entry.kind, cluster_ns, &entry.placeholder),
        body,
        replace_if_immutable: false,
        fingerprint: Some(Fingerprint {
            live_version: live.and_then(|m| m.resource_version.clone()),
            desired,
        }),
    }))
}

/// What the agent wrote into a placeholder, read by the hub.
#[derive(Debug, Clone, PartialEq)]
pub struct PlaceholderContent {
    /// Secret or ConfigMap.
    pub kind: SourceKind,
    /// Labels of the placeholder (only non-tender keys are published).
    pub labels: BTreeMap<String, String>,
    /// Annotations of the placeholder (only non-tender keys are published).
    pub annotations: BTreeMap<String, String>,
    /// The downstream Secret's type (from [`labels::UPSTREAM_TYPE`]).
    pub secret_type: Option<String>,
    /// Secret data, or ConfigMap `binaryData`.
    pub bytes: BTreeMap<String, ByteString>,
    /// ConfigMap `data`.
    pub strings: BTreeMap<String, String>,
}

impl PlaceholderContent {
    /// From a Secret placeholder.
    pub fn from_secret(s: &Secret) -> Self {
        let annotations = s.metadata.annotations.clone().unwrap_or_default();
        Self {
            kind: SourceKind::Secret,
            secret_type: Some(
                upstream::placeholder_secret_type(&s.metadata)
                    .unwrap_or("Opaque")
                    .to_string(),
            ),
            labels: s.metadata.labels.clone().unwrap_or_default(),
            annotations,
            bytes: copy::secret_data(s),
            strings: BTreeMap::new(),
        }
    }

    /// From a ConfigMap placeholder.
    pub fn from_config_map(c: &ConfigMap) -> Self {
        Self {
            kind: SourceKind::ConfigMap,
            secret_type: None,
            labels: c.metadata.labels.clone().unwrap_or_default(),
            annotations: c.metadata.annotations.clone().unwrap_or_default(),
            bytes: c.binary_data.clone().unwrap_or_default(),
            strings: c.data.clone().unwrap_or_default(),
        }
    }
}

/// Labels and annotations the hub publishes from a placeholder: everything except tender's
/// own keys, `managed-by` and kubectl bookkeeping.
fn allowed(map: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    copy::copied_metadata(Some(map))
}

/// The published object and its content hash, or why the content is refused.
#[allow(clippy::too_many_arguments)] // every argument is one plain fact the body depends on
pub fn publication_body(
    c: &PlaceholderContent,
    entry: &Entry,
    bundle_ns: &str,
    bundle: &str,
    cluster: &str,
    owner: &OwnerReference,
    max_bytes: usize,
    now: &Time,
) -> Result<(Apply, String), String> {
    let size = upstream::content_size(Some(&c.bytes), Some(&c.strings));
    upstream::validate(size, c.secret_type.as_deref(), max_bytes)?;
    let mut labels = allowed(&c.labels);
    labels.extend([
        (
            labels::MANAGED_BY.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
        (labels::BUNDLE_NAMESPACE.to_string(), bundle_ns.to_string()),
        (
            labels::UPSTREAM_BUNDLE.to_string(),
            labels::safe_label_value(bundle),
        ),
        (
            labels::CLUSTER.to_string(),
            labels::safe_label_value(cluster),
        ),
        (
            labels::UPSTREAM.to_string(),
            labels::UPSTREAM_PUBLISHED.to_string(),
        ),
    ]);
    let mut annotations = allowed(&c.annotations);
    annotations.insert(
        labels::UPSTREAM_SOURCE.into(),
        upstream::source_ref(entry.kind.as_str(), &entry.namespace, &entry.name),
    );
    let content_hash = hash::value_hash(&serde_json::json!({
        "labels": labels, "annotations": annotations, "type": c.secret_type,
        "bytes": c.bytes, "strings": c.strings, "owner": owner.uid,
    }));
    annotations.insert(labels::CONTENT_HASH.into(), content_hash.clone());
    annotations.insert(labels::PUBLISHED_AT.into(), now.0.to_string());
    let meta = ObjectMeta {
        name: Some(entry.published.clone()),
        namespace: Some(bundle_ns.to_string()),
        labels: Some(labels),
        annotations: Some(annotations),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    let body = match c.kind {
        SourceKind::Secret => body_of(&Secret {
            metadata: meta,
            type_: c.secret_type.clone(),
            data: Some(c.bytes.clone()),
            ..Default::default()
        }),
        SourceKind::ConfigMap => body_of(&ConfigMap {
            metadata: meta,
            data: Some(c.strings.clone()),
            binary_data: Some(c.bytes.clone()).filter(|b| !b.is_empty()),
            ..Default::default()
        }),
    };
    Ok((
        Apply {
            key: key(c.kind, bundle_ns, &entry.published),
            body,
            // A changed Secret type cannot be applied in place.
            replace_if_immutable: true,
            fingerprint: None,
        },
        content_hash,
    ))
}

/// The published object as the hub's metadata cache sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePublished {
    /// Its uid (deletes are preconditioned on it).
    pub uid: Option<String>,
    /// Whether tender published it for this Bundle, cluster and source.
    pub ours: bool,
    /// Its [`labels::CONTENT_HASH`].
    pub hash: Option<String>,
    /// Its [`labels::PUBLISHED_AT`].
    pub published_at: Option<String>,
}

impl LivePublished {
    /// From cached metadata of the object at the published name.
    pub fn of(meta: &ObjectMeta, bundle: &str, cluster: &str, entry: &Entry) -> Self {
        let l = meta.labels.clone().unwrap_or_default();
        let a = meta.annotations.clone().unwrap_or_default();
        let source = upstream::source_ref(entry.kind.as_str(), &entry.namespace, &entry.name);
        let ours = l.get(labels::UPSTREAM).map(String::as_str) == Some(labels::UPSTREAM_PUBLISHED)
            && l.get(labels::UPSTREAM_BUNDLE) == Some(&labels::safe_label_value(bundle))
            && l.get(labels::CLUSTER) == Some(&labels::safe_label_value(cluster))
            && a.get(labels::UPSTREAM_SOURCE) == Some(&source);
        Self {
            uid: meta.uid.clone(),
            ours,
            hash: a.get(labels::CONTENT_HASH).cloned(),
            published_at: a.get(labels::PUBLISHED_AT).cloned(),
        }
    }
}

/// The hub's verdict on a placeholder's content at one resourceVersion.
pub type Verdict = Result<(Apply, String), String>;

/// Whether a cluster can be reached, and since when it cannot.
#[derive(Debug, Clone, PartialEq)]
pub struct Reach {
    /// Heartbeats arrive (and, for push, the hub reaches the cluster).
    pub online: bool,
    /// Offline: the last heartbeat (or when the cluster became unreachable).
    pub since: Option<Time>,
}

/// One entry of one cluster: its status line and the operations that publish or unpublish it.
///
/// `verdict` is the hub's reading of the placeholder (present only when [`Observed::Present`]
/// and the content was needed). A refused or unreadable content keeps the last publication.
pub fn publication(
    bundle_ns: &str,
    cluster: &str,
    entry: &Entry,
    observed: Observed,
    verdict: Option<&Verdict>,
    live: Option<&LivePublished>,
    reach: &Reach,
) -> (UpstreamPublication, Vec<Op>) {
    let mut line = UpstreamPublication {
        cluster: cluster.to_string(),
        kind: entry.kind.as_str().to_string(),
        namespace: entry.namespace.clone(),
        name: entry.name.clone(),
        published_name: entry.published.clone(),
        ..Default::default()
    };
    let mut ops = Vec::new();
    if live.is_some_and(|l| !l.ours) {
        line.state = UpstreamState::Conflict;
        line.message = Some(format!(
            "{} {} exists and was not published by tender for this cluster; left untouched",
            entry.kind, entry.published
        ));
        return (line, ops);
    }
    let live = live.filter(|l| l.ours);
    let published_at = |l: &LivePublished| {
        l.published_at
            .as_deref()
            .and_then(|t| t.parse().ok())
            .map(Time)
    };
    line.hash = live.and_then(|l| l.hash.clone());
    line.last_published = live.and_then(published_at);
    line.state = match (observed, verdict) {
        (Observed::Unknown, _) => {
            if live.is_some() {
                UpstreamState::Published
            } else {
                UpstreamState::Pending
            }
        }
        (Observed::Absent, _) => {
            if let Some(l) = live {
                ops.push(Op::Delete {
                    key: key(entry.kind, bundle_ns, &entry.published),
                    uid: l.uid.clone(),
                });
            }
            line.hash = None;
            line.last_published = None;
            line.message = Some(format!(
                "{} {}/{} not found on the cluster",
                entry.kind, entry.namespace, entry.name
            ));
            UpstreamState::Missing
        }
        (Observed::Present, Some(Err(why))) => {
            line.message = Some(why.clone());
            UpstreamState::Rejected
        }
        (Observed::Present, Some(Ok((apply, h)))) => {
            if live.and_then(|l| l.hash.as_ref()) != Some(h) {
                ops.push(Op::Apply(apply.clone()));
                line.hash = Some(h.clone());
                line.last_published = apply.body["metadata"]["annotations"][labels::PUBLISHED_AT]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .map(Time);
            }
            UpstreamState::Published
        }
        (Observed::Present, None) => {
            if live.is_some() {
                UpstreamState::Published
            } else {
                UpstreamState::Pending
            }
        }
    };
    if !reach.online && matches!(line.state, UpstreamState::Published) {
        line.state = UpstreamState::Stale;
        line.stale_since = reach.since.clone();
        line.message = Some("cluster unreachable: last published content kept".into());
    }
    (line, ops)
}

/// The Bundle's `UpstreamPublished` condition from its status lines: status, reason, message.
pub fn condition(lines: &[UpstreamPublication]) -> (bool, &'static str, String) {
    let worst = [
        (UpstreamState::Conflict, reason::UPSTREAM_CONFLICT),
        (UpstreamState::Rejected, reason::UPSTREAM_REJECTED),
        (UpstreamState::Stale, reason::UPSTREAM_STALE),
        (UpstreamState::Missing, reason::UPSTREAM_MISSING),
        (UpstreamState::Pending, reason::UPSTREAM_PENDING),
    ];
    for (state, why) in worst {
        let hit: Vec<String> = lines
            .iter()
            .filter(|l| l.state == state)
            .map(|l| format!("{}: {} {}/{}", l.cluster, l.kind, l.namespace, l.name))
            .collect();
        if !hit.is_empty() {
            return (false, why, format!("{state}: {}", hit.join(", ")));
        }
    }
    let n = lines.len();
    (true, reason::UPSTREAM_PUBLISHED, format!("{n} published"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tender_types::upstream::{DEFAULT_MAX_BYTES, placeholder_labels};

    fn entry() -> Entry {
        entries(
            "vpc",
            "east",
            "apps",
            &[UpstreamResource {
                kind: "Secret".into(),
                name: "peering".into(),
                namespace: None,
            }],
        )
        .remove(0)
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "tender.dev/v1alpha1".into(),
            kind: "Bundle".into(),
            name: "vpc".into(),
            uid: "u1".into(),
            ..Default::default()
        }
    }

    fn content(value: &[u8]) -> PlaceholderContent {
        PlaceholderContent {
            kind: SourceKind::Secret,
            labels: BTreeMap::from([
                ("team".into(), "net".into()),
                (labels::UPSTREAM.into(), "placeholder".into()),
            ]),
            annotations: BTreeMap::from([(labels::UPSTREAM_OBSERVED.into(), "Present".into())]),
            secret_type: Some("Opaque".into()),
            bytes: BTreeMap::from([("id".into(), ByteString(value.to_vec()))]),
            strings: BTreeMap::new(),
        }
    }

    fn verdict(value: &[u8]) -> Verdict {
        let now = Time("2026-01-01T00:00:00Z".parse().unwrap());
        publication_body(
            &content(value),
            &entry(),
            "ws",
            "vpc",
            "east",
            &owner(),
            DEFAULT_MAX_BYTES,
            &now,
        )
    }

    const ONLINE: Reach = Reach {
        online: true,
        since: None,
    };

    #[test]
    fn entries_default_to_the_deployment_namespace() {
        let e = entry();
        assert_eq!(e.namespace, "apps");
        assert_eq!(e.published, names::upstream_name("vpc", "east", "peering"));
        assert!(
            e.published.starts_with("vpc-east-peering-"),
            "{}",
            e.published
        );
        assert!(e.placeholder.starts_with("vpc-upstream-secret-peering-"));
    }

    #[test]
    fn placeholders_are_written_once_then_left_alone() {
        let e = entry();
        let l = placeholder_labels("ws", "vpc", "east");
        let op = placeholder_op(&e, "cns", &l, &owner(), None).expect("created");
        let Op::Apply(a) = &op else { panic!("{op:?}") };
        assert_eq!(a.body["type"], "Opaque");
        assert!(a.body.get("data").is_none(), "the hub never writes data");
        let written: ObjectMeta = serde_json::from_value(a.body["metadata"].clone()).unwrap();
        assert_eq!(
            placeholder_op(&e, "cns", &l, &owner(), Some(&written)),
            None
        );
    }

    #[test]
    fn present_content_is_published_with_allowed_metadata_only() {
        let v = verdict(b"pcx-1");
        let (line, ops) = publication(
            "ws",
            "east",
            &entry(),
            Observed::Present,
            Some(&v),
            None,
            &ONLINE,
        );
        assert_eq!(line.state, UpstreamState::Published);
        let [Op::Apply(a)] = ops.as_slice() else {
            panic!("{ops:?}")
        };
        assert_eq!(a.key.name, names::upstream_name("vpc", "east", "peering"));
        let labels = &a.body["metadata"]["labels"];
        assert_eq!(labels["team"], "net");
        assert_eq!(labels[labels::UPSTREAM], "published");
        assert!(
            a.body["metadata"]["annotations"]
                .get(labels::UPSTREAM_OBSERVED)
                .is_none()
        );
    }

    #[test]
    fn nothing_changed_means_no_operations() {
        let v = verdict(b"pcx-1");
        let h = v.as_ref().unwrap().1.clone();
        let live = LivePublished {
            uid: Some("p".into()),
            ours: true,
            hash: Some(h),
            published_at: Some("2026-01-01T00:00:00Z".into()),
        };
        let (line, ops) = publication(
            "ws",
            "east",
            &entry(),
            Observed::Present,
            Some(&v),
            Some(&live),
            &ONLINE,
        );
        assert_eq!(ops, Vec::new());
        assert_eq!(line.state, UpstreamState::Published);
        let (_, ops) = publication(
            "ws",
            "east",
            &entry(),
            Observed::Present,
            None,
            Some(&live),
            &ONLINE,
        );
        assert_eq!(ops, Vec::new());
    }

    #[test]
    fn absent_downstream_unpublishes_by_uid() {
        let live = LivePublished {
            uid: Some("p".into()),
            ours: true,
            hash: Some("h".into()),
            published_at: None,
        };
        let (line, ops) = publication(
            "ws",
            "east",
            &entry(),
            Observed::Absent,
            None,
            Some(&live),
            &ONLINE,
        );
        assert_eq!(line.state, UpstreamState::Missing);
        assert!(matches!(&ops[..], [Op::Delete { uid: Some(u), .. }] if u == "p"));
    }

    #[test]
    fn too_large_is_rejected_and_the_last_publication_stays() {
        let v = verdict(&vec![b'x'; DEFAULT_MAX_BYTES + 1]);
        let live = LivePublished {
            uid: Some("p".into()),
            ours: true,
            hash: Some("old".into()),
            published_at: None,
        };
        let (line, ops) = publication(
            "ws",
            "east",
            &entry(),
            Observed::Present,
            Some(&v),
            Some(&live),
            &ONLINE,
        );
        assert_eq!(line.state, UpstreamState::Rejected);
        assert!(ops.is_empty());
        assert!(line.message.unwrap().contains("bytes"));
    }

    #[test]
    fn offline_clusters_are_stale_with_their_content_kept() {
        let live = LivePublished {
            uid: Some("p".into()),
            ours: true,
            hash: Some("h".into()),
            published_at: None,
        };
        let since = Time("2026-01-01T00:00:00Z".parse().unwrap());
        let reach = Reach {
            online: false,
            since: Some(since.clone()),
        };
        let (line, ops) = publication(
            "ws",
            "east",
            &entry(),
            Observed::Present,
            None,
            Some(&live),
            &reach,
        );
        assert_eq!(line.state, UpstreamState::Stale);
        assert_eq!(line.stale_since, Some(since));
        assert!(ops.is_empty());
        let (ok, why, _) = condition(&[line]);
        assert!(!ok);
        assert_eq!(why, reason::UPSTREAM_STALE);
    }

    #[test]
    fn foreign_objects_are_conflicts() {
        let live = LivePublished {
            uid: Some("x".into()),
            ours: false,
            hash: None,
            published_at: None,
        };
        let v = verdict(b"a");
        let (line, ops) = publication(
            "ws",
            "east",
            &entry(),
            Observed::Present,
            Some(&v),
            Some(&live),
            &ONLINE,
        );
        assert_eq!(line.state, UpstreamState::Conflict);
        assert!(ops.is_empty());
    }
}
