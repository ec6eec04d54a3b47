//! What the caches keep of a BundleDeployment and of a copy: the fields some reader reads,
//! nothing else (decision 0060-slim-caches). Applied on the watch stream, before the store, so the
//! full object never stays in memory.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use tender_types::{BundleDeployment, hash, labels};

/// Cache-only annotation: the hash of the spec the apiserver sent, computed by the hub as the
/// object arrived ([`deployment`]). Never written to the apiserver; a value the object itself
/// carries under this key is replaced, never trusted.
const SPEC_HASH: &str = "tender.dev/cached-spec-hash";

/// Keeps of a BundleDeployment what the hub reads: metadata (name, namespace, uid,
/// resourceVersion, labels, finalizers, deletion), the spec's `deploymentID`, `paused` and
/// target namespaces, the status fields `status::classify` reads, and a hash of the whole
/// spec as received, which `ops::deployment_step` compares with the desired one. The manifests,
/// Helm options and the agent's per-object report are dropped.
pub(crate) fn deployment(bd: &mut BundleDeployment) {
    let spec_hash = hash::spec_hash(&bd.spec);
    bd.metadata.managed_fields = None;
    bd.metadata.annotations = Some(BTreeMap::from([(SPEC_HASH.to_string(), spec_hash)]));
    bd.spec.resources = Vec::new();
    bd.spec.helm = None;
    // The copy list stays (without hashes it is small): the expected appliedCopiesID is
    // computed from it and the cached copies (decision 0089-signed-copies).
    if let Some(status) = bd.status.as_mut() {
        for c in &mut status.conditions {
            c.message = String::new();
        }
        // `classify` only asks whether anything is modified.
        status.modified.truncate(1);
        status.resources = Vec::new();
        status.non_ready = Vec::new();
        status.display = None;
        status.upstream = Vec::new();
    }
}

/// The hash of the spec the cached BundleDeployment had when it arrived (see [`deployment`]).
pub(crate) fn spec_hash(bd: &BundleDeployment) -> Option<&str> {
    bd.metadata
        .annotations
        .as_ref()?
        .get(SPEC_HASH)
        .map(String::as_str)
}

/// Keeps of a copy's metadata what the copy step, the stale-copy deletes and the triggers
/// read: name, namespace, uid, resourceVersion, deletion, the owner's uid, the content hash,
/// the Bundle labels and the `managedFields` of other writers (cut to the content keys they
/// own). The source's labels and annotations that travel with the copy, the owner's name and
/// the creation time are dropped. Other objects in these caches (reverse-sync placeholders,
/// whose labels and annotations are read) keep everything but other `managedFields`.
pub(crate) fn copy(meta: &mut ObjectMeta) {
    keep_content_managers(meta);
    let Some(l) = meta.labels.as_mut() else {
        return;
    };
    if !l.contains_key(labels::BUNDLE_NAME) || l.contains_key(labels::UPSTREAM) {
        return;
    }
    l.retain(|k, _| k == labels::BUNDLE_NAME || k == labels::BUNDLE_NAMESPACE);
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| k == labels::CONTENT_HASH || k == labels::HUB_SIGNATURE);
    }
    meta.creation_timestamp = None;
    for o in meta.owner_references.iter_mut().flatten() {
        // Owners are compared by uid only.
        o.api_version = String::new();
        o.kind = String::new();
        o.name = String::new();
    }
}

/// A copy's content fields, as top-level keys of a `managedFields` entry.
const CONTENT: [&str; 5] = [
    "f:data",
    "f:binaryData",
    "f:stringData",
    "f:type",
    "f:immutable",
];

/// Whether a copy's content fields were written by someone other than the hub (read from
/// `managedFields`, which the metadata-only cache has): such a copy no longer matches its
/// content-hash annotation and is recreated rather than trusted.
pub fn edited_by_others(meta: &kube::api::ObjectMeta) -> bool {
    meta.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() != Some(tender_types::labels::HUB_FIELD_MANAGER)
            && m.fields_v1
                .as_ref()
                .and_then(|f| f.0.as_object())
                .is_some_and(|fields| CONTENT.iter().any(|k| fields.contains_key(*k)))
    })
}

/// Trims a cached copy's `managedFields` to what [`edited_by_others`] reads: the entries of
/// other managers, each reduced to the content keys it owns (usually nothing is left).
pub fn keep_content_managers(meta: &mut kube::api::ObjectMeta) {
    let Some(entries) = meta.managed_fields.take() else {
        return;
    };
    let kept: Vec<_> = entries
        .into_iter()
        .filter(|m| m.manager.as_deref() != Some(tender_types::labels::HUB_FIELD_MANAGER))
        .filter_map(|mut m| {
            let fields = m.fields_v1.as_ref().and_then(|f| f.0.as_object())?;
            let content: serde_json::Map<String, serde_json::Value> = CONTENT
                .iter()
                .filter(|k| fields.contains_key(**k))
                .map(|k| (k.to_string(), serde_json::json!({})))
                .collect();
            if content.is_empty() {
                return None;
            }
            m.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                content.into(),
            ));
            Some(m)
        })
        .collect();
    meta.managed_fields = (!kept.is_empty()).then_some(kept);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{DeploymentState, classify};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;
    use tender_types::conditions::{TYPE_DEPLOYED, TYPE_READY, reason};
    use tender_types::{
        BundleDeploymentSpec, BundleDeploymentStatus, CopiedResource, Manifest, ObjectRef,
        ObjectState, ObjectStatus,
    };

    fn condition(type_: &str, ok: bool, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: "a long message from the agent".into(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    fn full(status: BundleDeploymentStatus) -> BundleDeployment {
        let mut spec = BundleDeploymentSpec {
            deployment_id: "id-1".into(),
            resources: vec![Manifest(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}
            }))],
            ..Default::default()
        };
        spec.options.default_namespace = "apps".into();
        spec.options.target_namespace = Some("team".into());
        spec.options.downstream_resources = vec![CopiedResource {
            api_version: None,
            kind: "Secret".into(),
            name: "db".into(),
            copy_name: "app-secret-db".into(),
            hash: "h1".into(),
        }];
        let mut bd = BundleDeployment::new("app", spec);
        bd.metadata.namespace = Some("cluster-ws-east-1a2b3c".into());
        bd.metadata.uid = Some("bd-uid".into());
        bd.metadata.labels = Some(BTreeMap::from([(labels::BUNDLE_NAME.into(), "app".into())]));
        bd.status = Some(status);
        bd
    }

    fn object(name: &str) -> ObjectRef {
        ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("apps".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_cached_deployment_keeps_what_the_hub_reads_and_its_spec_hash() {
        let states = [
            BundleDeploymentStatus::default(),
            BundleDeploymentStatus {
                applied_deployment_id: Some("id-0".into()),
                conditions: vec![condition(TYPE_DEPLOYED, true, "Deployed")],
                ..Default::default()
            },
            BundleDeploymentStatus {
                applied_deployment_id: Some("id-1".into()),
                conditions: vec![condition(TYPE_DEPLOYED, false, reason::APPLY_FAILED)],
                ..Default::default()
            },
            BundleDeploymentStatus {
                applied_deployment_id: Some("id-1".into()),
                conditions: vec![condition(TYPE_READY, true, "Ready")],
                modified: vec![object("a"), object("b")],
                ..Default::default()
            },
            BundleDeploymentStatus {
                applied_deployment_id: Some("id-1".into()),
                conditions: vec![condition(TYPE_READY, true, "Ready")],
                resources: vec![ObjectStatus {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    namespace: Some("apps".into()),
                    name: "app".into(),
                    state: ObjectState::Ready,
                    message: None,
                }],
                ..Default::default()
            },
        ];
        let expected = [
            DeploymentState::Pending,
            DeploymentState::WaitApplied,
            DeploymentState::ErrApplied,
            DeploymentState::Modified,
            DeploymentState::Ready,
        ];
        for (status, want) in states.into_iter().zip(expected) {
            let bd = full(status);
            let mut cached = bd.clone();
            deployment(&mut cached);
            assert_eq!(classify(&bd), want);
            assert_eq!(classify(&cached), want, "{:?}", bd.status);
            assert_eq!(spec_hash(&cached), Some(hash::spec_hash(&bd.spec).as_str()));
            assert_eq!(cached.spec.deployment_id, bd.spec.deployment_id);
            assert_eq!(
                cached.spec.options.target_namespace,
                bd.spec.options.target_namespace
            );
            assert_eq!(
                cached.spec.options.default_namespace,
                bd.spec.options.default_namespace
            );
            assert_eq!(cached.metadata.labels, bd.metadata.labels);
            assert_eq!(cached.metadata.uid, bd.metadata.uid);
            assert!(cached.spec.resources.is_empty());
            assert_eq!(
                cached.spec.options.downstream_resources.len(),
                1,
                "the copy list stays"
            );
            assert!(cached.status.iter().all(|s| s.resources.is_empty()));
        }
    }

    fn copy_meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("app-secret-db".into()),
            namespace: Some("cluster-ws-east-1a2b3c".into()),
            uid: Some("c-uid".into()),
            resource_version: Some("9".into()),
            labels: Some(BTreeMap::from([
                (labels::BUNDLE_NAME.into(), "app".into()),
                (labels::BUNDLE_NAMESPACE.into(), "ws".into()),
                (labels::WORKSPACE.into(), "ws".into()),
                ("team".into(), "payments".into()),
            ])),
            annotations: Some(BTreeMap::from([
                (labels::CONTENT_HASH.into(), "h1".into()),
                ("note".into(), "copied from the source".repeat(20)),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "tender.dev/v1alpha1".into(),
                kind: "BundleDeployment".into(),
                name: "app".into(),
                uid: "bd-uid".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn a_cached_copy_keeps_hash_owner_uid_and_bundle_labels() {
        let mut meta = copy_meta();
        copy(&mut meta);
        assert_eq!(
            meta.labels.unwrap().into_keys().collect::<Vec<_>>(),
            [labels::BUNDLE_NAME, labels::BUNDLE_NAMESPACE]
        );
        assert_eq!(
            meta.annotations,
            Some(BTreeMap::from([(labels::CONTENT_HASH.into(), "h1".into())]))
        );
        assert_eq!(meta.owner_references.unwrap()[0].uid, "bd-uid");
        assert_eq!(meta.uid.as_deref(), Some("c-uid"));
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
    }

    #[test]
    fn placeholders_in_the_copy_caches_keep_their_labels_and_annotations() {
        let mut meta = copy_meta();
        meta.labels
            .as_mut()
            .unwrap()
            .insert(labels::UPSTREAM.into(), labels::UPSTREAM_PLACEHOLDER.into());
        let before = meta.clone();
        copy(&mut meta);
        assert_eq!(meta, before);
    }
}
