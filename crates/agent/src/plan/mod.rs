//! Pure decisions of the agent, callable without a cluster: the desired downstream objects of a
//! BundleDeployment, who owns an existing object, what to prune and how to strip tender's
//! metadata; in [`object`], what to do about one object (the operations handed to the
//! executor, see [`object_plan`]); and [`decide`], every object of a deployment's phases
//! decided from its observed live object.

pub mod consumers;
mod decide;
mod hook_runs;
mod object;
mod phases;
mod workload;

pub use decide::{Live, LiveState, Modes, Write, decide, decide_object};
pub use hook_runs::{HookProgress, failed_hooks, finished, hook_progress, run_marker};
pub use object::{
    Mode, NamespaceMeta, ObjectPlan, applied_state, extra_data_patch, in_sync, is_subset, judge,
    namespace_op, needs_recreate, object_plan, readiness,
};
pub use phases::{
    DeployPlan, Entry, Found, FoundCopy, FoundHook, HOOK_RUN, HookStep, InventoryWrite, Observed,
    Phase, PlannedPhase, gate, hook_object, in_place, inventory_write, may_prune, not_started,
    plan as deployment_plan, removal_hooks as removal_hook_entries,
};

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};
use tender_runtime::{ObjectKey, Op};
use tender_types::copy::{copied_metadata, secret_data};
use tender_types::hash::value_hash;
use tender_types::labels;
use tender_types::{
    BundleDeploymentOptions, CopiedResource, Manifest, ObjectRef, ObjectStatus, namespaces,
};

/// One planned object: what to write, or why it cannot be (already its status).
pub type Planned = Result<Desired, ObjectStatus>;

/// The BundleDeployment that owns downstream objects: its cluster namespace on the hub and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// The cluster's own namespace on the hub.
    pub cluster_namespace: String,
    /// Name of the BundleDeployment.
    pub name: String,
}

impl Owner {
    /// Owner `name` in `cluster_namespace`.
    pub fn new(cluster_namespace: &str, name: &str) -> Self {
        Self {
            cluster_namespace: cluster_namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// Value of [`labels::OWNER_ANNOTATION`].
    pub fn annotation(&self) -> String {
        labels::bundle_deployment_owner(&self.cluster_namespace, &self.name)
    }

    /// Value of [`labels::BUNDLE_DEPLOYMENT`].
    pub fn label(&self) -> String {
        labels::bundle_deployment_owner_label(&self.cluster_namespace, &self.name)
    }

    /// Parses an [`labels::OWNER_ANNOTATION`] value (`<cluster namespace>/<name>`).
    pub fn parse(annotation: &str) -> Option<Self> {
        let (ns, name) = annotation.split_once('/')?;
        (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then(|| Self::new(ns, name))
    }
}

/// Label selector matching every downstream object (and inventory) of one cluster namespace.
pub fn cluster_selector(cluster_namespace: &str) -> String {
    format!(
        "{}={},{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::CLUSTER_NAMESPACE,
        labels::safe_label_value(cluster_namespace)
    )
}

/// One object the agent wants downstream.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// Which object.
    pub key: ObjectRef,
    /// The full body to apply (server-side apply), ownership metadata included.
    pub body: Value,
    /// Hash of `body` without the hash annotation itself; stored in [`labels::CONTENT_HASH`].
    pub hash: String,
    /// A Secret/ConfigMap copy (compared field by field, replaced when immutable).
    pub copy: bool,
}

impl Desired {
    /// Finishes a body: adds ownership labels/annotations and the content hash.
    fn seal(key: ObjectRef, mut body: Value, owner: &Owner, keep: bool, copy: bool) -> Self {
        let meta = body
            .as_object_mut()
            .expect("bodies are objects")
            .entry("metadata")
            .or_insert_with(|| json!({}));
        let meta = meta.as_object_mut().expect("metadata is an object");
        // A chart may render `labels:` or `annotations:` with no value (null): ownership
        // must still be written, or tender would take its own object for somebody else's.
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if !labels.is_object() {
            *labels = json!({});
        }
        if let Some(labels) = labels.as_object_mut() {
            for (k, v) in ownership_labels(owner) {
                labels.insert(k.to_string(), Value::String(v));
            }
        }
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if !annotations.is_object() {
            *annotations = json!({});
        }
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(
                labels::OWNER_ANNOTATION.to_string(),
                Value::String(owner.annotation()),
            );
            if keep {
                annotations.insert(labels::KEEP_RESOURCES.to_string(), json!("true"));
            }
        }
        let hash = value_hash(&body);
        body["metadata"]["annotations"][labels::CONTENT_HASH] = Value::String(hash.clone());
        Self {
            key,
            body,
            hash,
            copy,
        }
    }
}

/// Labels marking a downstream object as owned by `owner`.
pub fn ownership_labels(owner: &Owner) -> [(&'static str, String); 3] {
    [
        (labels::MANAGED_BY, labels::MANAGED_BY_VALUE.to_string()),
        (
            labels::CLUSTER_NAMESPACE,
            labels::safe_label_value(&owner.cluster_namespace),
        ),
        (labels::BUNDLE_DEPLOYMENT, owner.label()),
    ]
}

fn copy_meta(
    name: &str,
    namespace: &str,
    labels_in: Option<&BTreeMap<String, String>>,
    annotations_in: Option<&BTreeMap<String, String>>,
) -> Value {
    let mut annotations = copied_metadata(annotations_in);
    if let Some(source) = annotations_in.and_then(|a| a.get(labels::COPY_OF)) {
        annotations.insert(labels::COPY_OF.into(), source.clone());
    }
    json!({
        "name": name,
        "namespace": namespace,
        "labels": copied_metadata(labels_in),
        "annotations": annotations,
    })
}

fn bytes_map(map: Option<&BTreeMap<String, ByteString>>) -> Option<Value> {
    let map = map.filter(|m| !m.is_empty())?;
    Some(serde_json::to_value(map).expect("ByteString serializes"))
}

/// The downstream copy of a Secret copy on the hub: under the SOURCE name (`entry.name`) in
/// `namespace`, keeping type, data, immutability and the source's own labels/annotations.
pub fn secret_copy(
    copy: &Secret,
    entry: &CopiedResource,
    namespace: &str,
    owner: &Owner,
    keep: bool,
    signed_at: u64,
) -> Desired {
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": copy_meta(&entry.name, namespace, copy.metadata.labels.as_ref(), copy.metadata.annotations.as_ref()),
        "type": copy.type_.as_deref().unwrap_or("Opaque"),
    });
    // stringData is write-only on the apiserver; fold it in as the apiserver would.
    if let Some(data) = bytes_map(Some(&secret_data(copy))) {
        body["data"] = data;
    }
    seal_copy(
        body,
        copy.immutable,
        entry,
        namespace,
        owner,
        keep,
        signed_at,
    )
}

/// The downstream copy of a ConfigMap copy on the hub (see [`secret_copy`]).
pub fn config_map_copy(
    copy: &ConfigMap,
    entry: &CopiedResource,
    namespace: &str,
    owner: &Owner,
    keep: bool,
    signed_at: u64,
) -> Desired {
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": copy_meta(&entry.name, namespace, copy.metadata.labels.as_ref(), copy.metadata.annotations.as_ref()),
    });
    if let Some(data) = copy.data.as_ref().filter(|d| !d.is_empty()) {
        body["data"] = serde_json::to_value(data).expect("strings serialize");
    }
    if let Some(binary) = bytes_map(copy.binary_data.as_ref()) {
        body["binaryData"] = binary;
    }
    seal_copy(
        body,
        copy.immutable,
        entry,
        namespace,
        owner,
        keep,
        signed_at,
    )
}

/// Records on a downstream copy the `signedAt` of the hub copy it comes from (0: none), so
/// an older signed copy replayed later is refused, after a restart too.
fn record_signed_at(body: &mut Value, signed_at: u64) {
    if signed_at > 0 {
        body["metadata"]["annotations"][labels::SIGNED_AT] = Value::String(signed_at.to_string());
    }
}

/// Finishes a copy's `body` (its `kind` set): the hub copy's immutability, then ownership.
fn seal_copy(
    mut body: Value,
    immutable: Option<bool>,
    entry: &CopiedResource,
    namespace: &str,
    owner: &Owner,
    keep: bool,
    signed_at: u64,
) -> Desired {
    record_signed_at(&mut body, signed_at);
    if let Some(immutable) = immutable {
        body["immutable"] = Value::Bool(immutable);
    }
    let kind = body["kind"].as_str().unwrap_or_default().to_string();
    let key = key("v1", &kind, Some(namespace), &entry.name);
    Desired::seal(key, body, owner, keep, true)
}

/// An object of any kind copied from the hub (verified carrier content, see
/// [`tender_types::copy::carried_body`]), in `namespace` (`None`: cluster-scoped), with
/// ownership added. Compared like a manifest (field subset + content hash).
pub fn carried_copy(
    object: &Value,
    entry: &CopiedResource,
    namespace: Option<&str>,
    owner: &Owner,
    keep: bool,
    signed_at: u64,
) -> Desired {
    let mut body = tender_types::copy::carried_body(object);
    record_signed_at(&mut body, signed_at);
    match namespace {
        Some(ns) => body["metadata"]["namespace"] = Value::String(ns.to_string()),
        None => {
            if let Some(meta) = body["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
        }
    }
    if let Some(source) = object["metadata"]["annotations"][labels::COPY_OF].as_str() {
        body["metadata"]["annotations"][labels::COPY_OF] = Value::String(source.to_string());
    }
    let key = key(entry.api_version(), &entry.kind, namespace, &entry.name);
    Desired::seal(key, body, owner, keep, false)
}

/// A manifest as applied downstream: namespace resolved (`namespaced` comes from discovery),
/// ownership added. `Err` says why the manifest cannot be applied.
pub fn manifest(
    manifest: &Manifest,
    namespaced: bool,
    options: &BundleDeploymentOptions,
    owner: &Owner,
) -> Result<Desired, String> {
    let (Some(api_version), Some(kind), Some(name)) =
        (manifest.api_version(), manifest.kind(), manifest.name())
    else {
        return Err("manifest needs apiVersion, kind and metadata.name".into());
    };
    let namespace = namespaces::manifest_namespace(
        manifest.namespace(),
        namespaced,
        options.target_namespace.as_deref(),
        Some(options.default_namespace.as_str()).filter(|d| !d.is_empty()),
    );
    let mut body = manifest.0.clone();
    if !body.is_object() {
        return Err("manifest is not an object".into());
    }
    let meta = body
        .as_object_mut()
        .expect("checked above")
        .entry("metadata")
        .or_insert_with(|| json!({}));
    // Server-populated fields in a manifest would fail the apply or fight the apiserver.
    if let Some(meta) = meta.as_object_mut() {
        for field in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "managedFields",
            "selfLink",
            "deletionTimestamp",
        ] {
            meta.remove(field);
        }
        match namespace {
            Some(ns) => {
                meta.insert("namespace".into(), Value::String(ns.to_string()));
            }
            None => {
                meta.remove("namespace");
            }
        }
    }
    body.as_object_mut().expect("object").remove("status");
    // Fields another manager owns (`diff.comparePatches`): neither applied nor compared.
    if let Some(diff) = &options.diff {
        tender_types::diff::strip_compare_patches(&mut body, &diff.compare_patches);
    }
    consumers::annotate(&mut body, namespace, options);
    // `helm.sh/resource-policy: keep` is never deleted (Helm's rule): kept like keepResources.
    let keep = options.keep_resources || crate::hooks::is_kept(&manifest.0);
    Ok(Desired::seal(
        key(api_version, kind, namespace, name),
        body,
        owner,
        keep,
        false,
    ))
}

/// An [`ObjectRef`] from its parts.
pub fn key(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> ObjectRef {
    ObjectRef::new(api_version, kind, namespace, name)
}

/// Who owns an existing downstream object, from its annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// This BundleDeployment.
    Ours,
    /// No tender ownership at all: somebody else's object.
    Unowned,
    /// Another BundleDeployment (`<cluster namespace>/<name>`), maybe of another cluster.
    Other(String),
}

/// Ownership of an object with `annotations`, as seen by `owner`.
pub fn ownership(annotations: Option<&BTreeMap<String, String>>, owner: &Owner) -> Ownership {
    match annotations.and_then(|a| a.get(labels::OWNER_ANNOTATION)) {
        None => Ownership::Unowned,
        Some(o) if *o == owner.annotation() => Ownership::Ours,
        Some(o) => Ownership::Other(o.clone()),
    }
}

/// Whether the agent may write an existing object: `Ok(adopting)` or `Err(conflict message)`.
///
/// Another BundleDeployment's object is always a conflict; an unmanaged one only without
/// `takeOwnership`.
pub fn may_write(ownership: &Ownership, take_ownership: bool) -> Result<bool, String> {
    match ownership {
        Ownership::Ours => Ok(false),
        Ownership::Unowned if take_ownership => Ok(true),
        Ownership::Unowned => Err(
            "exists and was not created by tender; left untouched (set takeOwnership to adopt it)"
                .into(),
        ),
        Ownership::Other(other) => Err(format!(
            "exists and belongs to BundleDeployment {other}; left untouched"
        )),
    }
}

/// API group of an `apiVersion` (`""` for the core group).
pub fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

/// Identity of an object regardless of API version: group, kind, namespace, name.
pub fn identity(r: &ObjectRef) -> (String, String, Option<String>, String) {
    (
        group_of(&r.api_version).to_string(),
        r.kind.clone(),
        r.namespace.clone(),
        r.name.clone(),
    )
}

/// Objects of the previous deployment that are no longer desired (same object under another
/// API version is still desired).
pub fn prune_set(previous: &[ObjectRef], desired: &[ObjectRef]) -> Vec<ObjectRef> {
    let wanted: BTreeSet<_> = desired.iter().map(identity).collect();
    let mut seen = BTreeSet::new();
    previous
        .iter()
        .filter(|r| !wanted.contains(&identity(r)) && seen.insert(identity(r)))
        .cloned()
        .collect()
}

/// Union of two object lists without duplicates (by [`identity`]), `first` winning, order kept.
pub fn union(first: &[ObjectRef], second: &[ObjectRef]) -> Vec<ObjectRef> {
    let mut seen = BTreeSet::new();
    first
        .iter()
        .chain(second)
        .filter(|r| seen.insert(identity(r)))
        .cloned()
        .collect()
}

/// JSON merge patch removing tender's labels and annotations (what `keepResources` leaves).
pub fn strip_patch(
    labels_in: Option<&BTreeMap<String, String>>,
    annotations_in: Option<&BTreeMap<String, String>>,
) -> Value {
    let ours = |k: &str| labels::is_tender_key(k) || k == labels::MANAGED_BY;
    let nulls = |m: Option<&BTreeMap<String, String>>| -> Map<String, Value> {
        m.into_iter()
            .flatten()
            .filter(|(k, _)| ours(k))
            .map(|(k, _)| (k.clone(), Value::Null))
            .collect()
    };
    json!({"metadata": {"labels": nulls(labels_in), "annotations": nulls(annotations_in)}})
}

/// How an object of `owner` leaves: deleted (that incarnation only), or with `keep` or its
/// own keep-resources marker stripped of tender's metadata; with the action word counted in
/// `tender_agent_objects_written_total`. `None`: not this owner's object, left alone.
pub fn removal_op(
    key: ObjectKey,
    live: &ObjectMeta,
    owner: &Owner,
    keep: bool,
) -> Option<(Op, &'static str)> {
    let annotations = live.annotations.as_ref();
    if ownership(annotations, owner) != Ownership::Ours {
        return None;
    }
    let marked = annotations
        .and_then(|a| a.get(labels::KEEP_RESOURCES))
        .is_some_and(|v| v == "true");
    Some(if keep || marked {
        let patch = strip_patch(live.labels.as_ref(), annotations);
        (Op::MergePatch { key, patch }, "strip")
    } else {
        let uid = live.uid.clone();
        (Op::Delete { key, uid }, "delete")
    })
}

#[cfg(test)]
mod fixtures {
    use super::*;

    pub(super) fn owner() -> Owner {
        Owner::new("cluster-ws-c1-12345678", "app")
    }

    pub(super) fn entry(kind: &str, name: &str) -> CopiedResource {
        CopiedResource {
            api_version: None,
            kind: kind.into(),
            name: name.into(),
            copy_name: format!("app-{}-{name}-abcdef12", kind.to_lowercase()),
            hash: "h".into(),
        }
    }

    pub(super) fn hub_secret() -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("app-secret-db-abcdef12".into()),
                namespace: Some("cluster-ws-c1-12345678".into()),
                labels: Some(BTreeMap::from([
                    ("team".into(), "a".into()),
                    (labels::BUNDLE_NAME.into(), "app".into()),
                    (labels::MANAGED_BY.into(), "tender".into()),
                ])),
                annotations: Some(BTreeMap::from([
                    ("note".into(), "keep me".into()),
                    (labels::CONTENT_HASH.into(), "h".into()),
                    (labels::COPY_OF.into(), "ws/db".into()),
                    (
                        "kubectl.kubernetes.io/last-applied-configuration".into(),
                        "{}".into(),
                    ),
                ])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/basic-auth".into()),
            data: Some(BTreeMap::from([(
                "password".into(),
                ByteString(b"s3cret".to_vec()),
            )])),
            immutable: Some(true),
            ..Default::default()
        }
    }

    pub(super) fn opts(target: Option<&str>) -> BundleDeploymentOptions {
        BundleDeploymentOptions {
            default_namespace: "def".into(),
            target_namespace: target.map(str::to_string),
            ..Default::default()
        }
    }

    pub(super) fn as_existing(d: &Desired) -> Value {
        let mut v = d.body.clone();
        v["metadata"]["uid"] = json!("u");
        v["metadata"]["resourceVersion"] = json!("7");
        v["metadata"]["labels"]["extra"] = json!("added-by-someone");
        v
    }

    pub(super) fn db_copy(secret: &Secret) -> Desired {
        secret_copy(secret, &entry("Secret", "db"), "apps", &owner(), false, 0)
    }
}

#[cfg(test)]
mod tests;
