//! From a Bundle's plan and what the caches hold to the operations the executor carries out.
//! Pure: tests compare operation lists, including "nothing changed → no operations".

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use serde_json::Value;
use tender_runtime::executor::{Apply, Fingerprint, ObjectKey, Op, body_of};
use tender_types::{
    API_GROUP_VERSION, BundleDeployment, BundleDeploymentSpec, SourceKind, copy, hash, labels,
    names,
};

use super::plan::{DesiredCopy, DesiredDeployment};
use crate::signing::HubKeys;
use crate::slim::edited_by_others;
use tender_types::signing::CopyClaim;

/// A source read in full for this reconcile (only when a copy must be written).
#[derive(Clone)]
pub(crate) enum SourceObject {
    /// A Secret source.
    Secret(Secret),
    /// A ConfigMap source.
    ConfigMap(ConfigMap),
    /// A source of any other allowed kind, as JSON; it travels in a carrier Secret.
    Carried(Value),
}

/// One copy that exists in a cluster namespace (from the metadata cache).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LiveCopy {
    pub kind: SourceKind,
    pub name: String,
    pub uid: Option<String>,
}

/// Labels of everything the hub writes for Bundle `ns/name` in `cluster`'s namespace.
pub(crate) fn owned_labels(
    ns: &str,
    name: &str,
    cluster: &str,
    cluster_ns: &str,
    shard: Option<&str>,
) -> BTreeMap<String, String> {
    let mut owned = BTreeMap::from([
        (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
        (labels::BUNDLE_NAMESPACE.into(), ns.into()),
        (labels::BUNDLE_NAME.into(), labels::safe_label_value(name)),
        (labels::CLUSTER.into(), labels::safe_label_value(cluster)),
        (labels::CLUSTER_NAMESPACE.into(), cluster_ns.into()),
        (labels::WORKSPACE.into(), ns.into()),
    ]);
    if let Some(id) = shard {
        owned.insert(labels::SHARD.into(), id.into());
    }
    owned
}

/// What to do with one cluster's BundleDeployment.
#[derive(Debug, PartialEq)]
pub(crate) enum DeploymentStep {
    /// Leave everything as it is: a source is missing (the agent must never deploy manifests
    /// before their copies exist) or the old BundleDeployment is still being deleted.
    Hold,
    /// The live BundleDeployment is current; its uid owns the copies.
    Current { uid: String },
    /// Write it (an [`Op::Apply`]); the outcome's uid owns the copies.
    Write(Box<Op>),
}

/// The step for one cluster's BundleDeployment of Bundle `bundle_ns/bundle_name`, whose whole
/// spec is `spec` ([`super::plan::Plan::spec`] of `desired`), given the cached one.
pub(crate) fn deployment_step(
    bundle_ns: &str,
    bundle_name: &str,
    desired: &DesiredDeployment,
    spec: Option<&BundleDeploymentSpec>,
    live: Option<&BundleDeployment>,
    shard: Option<&str>,
) -> DeploymentStep {
    let Some(spec) = spec else {
        return DeploymentStep::Hold;
    };
    if live.is_some_and(|bd| bd.metadata.deletion_timestamp.is_some()) {
        // Recreated once the agent has finished cleaning up (its deletion event brings us back).
        return DeploymentStep::Hold;
    }
    let bd_labels = owned_labels(
        bundle_ns,
        bundle_name,
        &desired.cluster,
        &desired.namespace,
        shard,
    );
    // The cache keeps a hash of each BundleDeployment's spec, not the spec
    // (decision 0060-slim-caches).
    let desired_hash = hash::spec_hash(spec);
    let current = live.filter(|bd| {
        crate::slim::spec_hash(bd) == Some(desired_hash.as_str())
            && bd
                .finalizers()
                .iter()
                .any(|f| f == labels::AGENT_CLEANUP_FINALIZER)
            && bd_labels.iter().all(|(k, v)| bd.labels().get(k) == Some(v))
    });
    if let Some(bd) = current {
        return DeploymentStep::Current {
            uid: bd.uid().unwrap_or_default(),
        };
    }
    let name = names::bundle_deployment_name(bundle_name);
    DeploymentStep::Write(Box::new(Op::Apply(Apply {
        key: ObjectKey::of::<BundleDeployment>(Some(&desired.namespace), &name),
        body: deployment_body(&name, &desired.namespace, spec, bd_labels),
        replace_if_immutable: false,
        fingerprint: Some(Fingerprint {
            live_version: live.and_then(|bd| bd.resource_version()),
            desired: desired_hash,
        }),
    })))
}

fn deployment_body(
    name: &str,
    namespace: &str,
    spec: &BundleDeploymentSpec,
    bd_labels: BTreeMap<String, String>,
) -> Value {
    let mut bd = BundleDeployment::new(name, spec.clone());
    bd.metadata.namespace = Some(namespace.to_string());
    bd.metadata.labels = Some(bd_labels);
    bd.metadata.finalizers = Some(vec![labels::AGENT_CLEANUP_FINALIZER.to_string()]);
    body_of(&bd)
}

/// The ownerReference that makes the garbage collector remove a copy with its BundleDeployment.
pub(crate) fn copy_owner(bundle_name: &str, uid: String) -> OwnerReference {
    OwnerReference {
        api_version: API_GROUP_VERSION.into(),
        kind: "BundleDeployment".into(),
        name: names::bundle_deployment_name(bundle_name),
        uid,
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// What to do with one copy.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CopyStep {
    /// The cached copy has this content hash and owner.
    Current,
    /// Write it; `replace` holds the uid of a copy someone else edited, which is recreated
    /// (its hash annotation can no longer be trusted, and fields another manager owns would
    /// survive an apply).
    Write { replace: Option<String> },
}

/// The step for `copy`, given its cached metadata and the owning BundleDeployment's uid.
pub(crate) fn copy_step(
    copy: &DesiredCopy,
    live: Option<&ObjectMeta>,
    owner_uid: &str,
    keys: &HubKeys,
) -> CopyStep {
    let Some(meta) = live else {
        return CopyStep::Write { replace: None };
    };
    if edited_by_others(meta) {
        return CopyStep::Write {
            replace: Some(meta.uid.clone().unwrap_or_default()),
        };
    }
    let hash_current = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::CONTENT_HASH))
        == Some(&copy.hash);
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == owner_uid);
    // Signed with a key that is not retired (decision 0089-signed-copies).
    let signed = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::HUB_SIGNATURE))
        .is_some_and(|s| keys.is_current(s));
    if hash_current && owned && signed {
        CopyStep::Current
    } else {
        CopyStep::Write { replace: None }
    }
}

/// Where one cluster's copies of a Bundle go, and what marks them as the hub's.
pub(crate) struct CopyTarget<'a> {
    /// The Bundle's (and the sources') namespace.
    pub bundle_ns: &'a str,
    /// The cluster namespace on the hub.
    pub cluster_ns: &'a str,
    /// The BundleDeployment that owns the copies.
    pub owner: &'a OwnerReference,
    /// [`owned_labels`] of that BundleDeployment.
    pub labels: &'a BTreeMap<String, String>,
    /// The hub's keys: each copy is signed ([`tender_types::signing`]).
    pub keys: &'a HubKeys,
    /// The copy's `signedAt` (later than the live copy's).
    pub signed_at: u64,
}

impl CopyTarget<'_> {
    /// The hub's signature over `copy` holding content `content_hash`.
    pub(crate) fn signature(&self, copy: &DesiredCopy, content_hash: &str) -> String {
        let api_version = if copy.source_kind.source_kind().is_some() {
            "v1"
        } else {
            copy.source_kind.api_version.as_str()
        };
        self.keys.sign(&CopyClaim {
            cluster_namespace: self.cluster_ns,
            bundle_deployment: &self.owner.name,
            api_version,
            kind: &copy.source_kind.kind,
            name: &copy.source,
            copy_name: &copy.copy_name,
            content_hash,
            signed_at: self.signed_at,
        })
    }
}

/// The operation writing `copy` of `source` to `to`; `live_version` is the cached copy's
/// resourceVersion, `replace` the uid of an edited copy to recreate.
pub(crate) fn copy_op(
    source: &SourceObject,
    copy: &DesiredCopy,
    to: &CopyTarget<'_>,
    live_version: Option<String>,
    replace: Option<String>,
) -> Op {
    let (bundle_ns, cluster_ns, owner, bd_labels) =
        (to.bundle_ns, to.cluster_ns, to.owner, to.labels);
    let meta = |src: &ObjectMeta, content_hash: String| {
        let mut labels = copy::copied_metadata(src.labels.as_ref());
        labels.extend(bd_labels.clone());
        let mut annotations = copy::copied_metadata(src.annotations.as_ref());
        annotations.insert(
            labels::HUB_SIGNATURE.into(),
            to.signature(copy, &content_hash),
        );
        annotations.insert(labels::CONTENT_HASH.into(), content_hash);
        annotations.insert(
            labels::COPY_OF.into(),
            format!("{bundle_ns}/{}", copy.source),
        );
        ObjectMeta {
            name: Some(copy.copy_name.clone()),
            namespace: Some(cluster_ns.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        }
    };
    let (key, body) = match source {
        SourceObject::Secret(s) => {
            let obj = Secret {
                metadata: meta(&s.metadata, hash::secret_hash(s)),
                type_: s.type_.clone(),
                data: Some(copy::secret_data(s)).filter(|d| !d.is_empty()),
                immutable: s.immutable,
                string_data: None,
            };
            (
                ObjectKey::of::<Secret>(Some(cluster_ns), &copy.copy_name),
                body_of(&obj),
            )
        }
        SourceObject::Carried(object) => {
            let carried = copy::carried_body(object);
            let content_hash = hash::value_hash(&carried);
            let mut labels = bd_labels.clone();
            labels.insert(labels::CARRIER.into(), "true".into());
            let annotations = BTreeMap::from([
                (
                    labels::HUB_SIGNATURE.to_string(),
                    to.signature(copy, &content_hash),
                ),
                (labels::CONTENT_HASH.to_string(), content_hash),
                (
                    labels::COPY_OF.to_string(),
                    format!("{bundle_ns}/{}", copy.source),
                ),
                (
                    labels::CARRIED_KIND.to_string(),
                    copy.source_kind.to_string(),
                ),
            ]);
            // The object's own labels stay inside the carried JSON: on the carrier they could
            // make a selector on the hub match what must never live there.
            let obj = Secret {
                metadata: ObjectMeta {
                    name: Some(copy.copy_name.clone()),
                    namespace: Some(cluster_ns.to_string()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    owner_references: Some(vec![owner.clone()]),
                    ..Default::default()
                },
                type_: Some(labels::CARRIER_TYPE.to_string()),
                data: Some(BTreeMap::from([(
                    labels::CARRIER_KEY.to_string(),
                    k8s_openapi::ByteString(hash::canonical_json(&carried).into_bytes()),
                )])),
                immutable: None,
                string_data: None,
            };
            (
                ObjectKey::of::<Secret>(Some(cluster_ns), &copy.copy_name),
                body_of(&obj),
            )
        }
        SourceObject::ConfigMap(c) => {
            let obj = ConfigMap {
                metadata: meta(&c.metadata, hash::config_map_hash(c)),
                data: c.data.clone(),
                binary_data: c.binary_data.clone(),
                immutable: c.immutable,
            };
            (
                ObjectKey::of::<ConfigMap>(Some(cluster_ns), &copy.copy_name),
                body_of(&obj),
            )
        }
    };
    let apply = Apply {
        key,
        body,
        replace_if_immutable: true,
        fingerprint: None,
    };
    match replace {
        Some(uid) => Op::Recreate {
            uid: Some(uid),
            apply,
        },
        None => Op::Apply(Apply {
            fingerprint: Some(copy_fingerprint(copy, owner, live_version)),
            ..apply
        }),
    }
}

/// What the executor's memo knows a copy write by: content hash and owner, over the cached
/// copy's resourceVersion.
pub(crate) fn copy_fingerprint(
    copy: &DesiredCopy,
    owner: &OwnerReference,
    live_version: Option<String>,
) -> Fingerprint {
    Fingerprint {
        live_version,
        desired: format!("{}/{}", copy.hash, owner.uid),
    }
}

/// Deletes of this Bundle's copies in `cluster_ns` that no entry wants any more.
pub(crate) fn stale_copy_ops(
    cluster_ns: &str,
    live: &[LiveCopy],
    desired: &[DesiredCopy],
) -> Vec<Op> {
    let wanted: BTreeSet<(SourceKind, &str)> = desired
        .iter()
        .map(|c| (c.kind, c.copy_name.as_str()))
        .collect();
    live.iter()
        .filter(|c| !wanted.contains(&(c.kind, c.name.as_str())))
        .map(|c| Op::Delete {
            key: copy_key(c.kind, cluster_ns, &c.name),
            uid: c.uid.clone(),
        })
        .collect()
}

/// The key of a copy of `kind`.
pub(crate) fn copy_key(kind: SourceKind, namespace: &str, name: &str) -> ObjectKey {
    match kind {
        SourceKind::Secret => ObjectKey::of::<Secret>(Some(namespace), name),
        SourceKind::ConfigMap => ObjectKey::of::<ConfigMap>(Some(namespace), name),
    }
}

/// The apply of a copy kept with a previous revision (a rollback): its kept body, signed for
/// `to` over the content hash it was kept under — which the caller checked is what the body
/// hashes to (decision 0112-rollout-state-in-the-hubs-namespace).
pub(crate) fn kept_copy_op(
    mut body: serde_json::Value,
    copy: &DesiredCopy,
    to: &CopyTarget<'_>,
) -> Op {
    body["metadata"]["annotations"][labels::HUB_SIGNATURE] =
        serde_json::Value::String(to.signature(copy, &copy.hash));
    Op::Apply(Apply {
        key: copy_key(copy.kind, to.cluster_ns, &copy.copy_name),
        body,
        replace_if_immutable: true,
        fingerprint: None,
    })
}

/// Delete of one BundleDeployment (that incarnation only); the agent's finalizer then cleans
/// up downstream and the garbage collector removes its copies.
pub(crate) fn delete_deployment_op(bd: &BundleDeployment) -> Op {
    Op::Delete {
        key: ObjectKey::of::<BundleDeployment>(bd.namespace().as_deref(), &bd.name_any()),
        uid: bd.uid(),
    }
}

#[cfg(test)]
mod tests;
