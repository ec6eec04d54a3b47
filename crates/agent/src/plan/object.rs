//! What to do about one desired object given the live one: compare, then decide the
//! operations (or the state reached without writing).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use serde_json::{Map, Value, json};
use tender_runtime::executor::{Apply, Fingerprint};
use tender_runtime::{ObjectKey, Op};
use tender_types::ObjectState;
use tender_types::labels;

use super::{Desired, Owner, may_write, ownership};

fn or_empty(v: Option<&Value>) -> Value {
    match v {
        Some(Value::Null) | None => json!({}),
        Some(v) => v.clone(),
    }
}

/// Whether every field of `desired` is present in `existing` with the same value (objects may
/// have extra keys, arrays must match element by element). Server-side defaults therefore do
/// not count as drift.
pub fn is_subset(desired: &Value, existing: &Value) -> bool {
    match (desired, existing) {
        (Value::Object(d), Value::Object(e)) => d
            .iter()
            .all(|(k, dv)| e.get(k).is_some_and(|ev| is_subset(dv, ev)) || is_empty(dv)),
        (Value::Array(d), Value::Array(e)) => {
            d.len() == e.len() && d.iter().zip(e).all(|(dv, ev)| is_subset(dv, ev))
        }
        (d, e) => d == e,
    }
}

/// Empty maps, lists and nulls are dropped by the apiserver, so they never count as missing.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Whether the existing object is what `desired` describes (no write needed).
///
/// Copies compare data exactly (a key added downstream is drift); manifests compare as a subset.
pub fn in_sync(desired: &Desired, existing: &Value) -> bool {
    let hash_matches = existing["metadata"]["annotations"][labels::CONTENT_HASH].as_str()
        == Some(desired.hash.as_str());
    if !hash_matches || !is_subset(&desired.body, existing) {
        return false;
    }
    if desired.copy {
        ["data", "binaryData"]
            .iter()
            .all(|f| or_empty(desired.body.get(*f)) == or_empty(existing.get(*f)))
            && immutable(&desired.body) == immutable(existing)
    } else {
        true
    }
}

fn immutable(v: &Value) -> bool {
    v["immutable"].as_bool().unwrap_or(false)
}

/// Whether a copy must be deleted and recreated instead of updated: the existing object is
/// immutable, or a Secret's type changes (type is immutable too).
pub fn needs_recreate(desired: &Desired, existing: &Value) -> bool {
    if !desired.copy {
        return false;
    }
    let type_of = |v: &Value| v["type"].as_str().unwrap_or("Opaque").to_string();
    immutable(existing)
        || (desired.key.kind == "Secret" && type_of(&desired.body) != type_of(existing))
}

/// How one reconcile may treat existing objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// A new deploymentID is being rolled out (so writes are expected, not drift).
    pub pending: bool,
    /// `correctDrift`: restore objects changed or deleted downstream.
    pub correct_drift: bool,
    /// `takeOwnership`: adopt objects tender did not create.
    pub take_ownership: bool,
}

/// What to do about one desired object, decided from the live object alone.
#[derive(Clone, Debug, PartialEq)]
pub enum ObjectPlan {
    /// No write: the object's state is already known (in sync, a conflict, or drift left alone).
    Settled {
        /// The object's state.
        state: ObjectState,
        /// Why it is not Ready.
        message: Option<String>,
    },
    /// Carry out `ops` in order; the state follows from the object the apiserver returns.
    Write {
        /// Apply (plus a merge patch dropping a copy's extra keys), or Recreate.
        ops: Vec<Op>,
        /// The write restores an object changed or deleted downstream (not a rollout).
        corrects_drift: bool,
    },
}

impl ObjectPlan {
    fn settled(state: ObjectState, message: impl Into<String>) -> Self {
        Self::Settled {
            state,
            message: Some(message.into()),
        }
    }
}

/// The one decision per object: `live` is the object downstream (`None`: absent), `key` where
/// `desired` is written (from discovery).
///
/// In sync → nothing; somebody else's object → Conflict, nothing; changed or deleted with
/// correctDrift off (and no rollout) → Modified/Missing, nothing; an immutable copy or a
/// Secret type change → Recreate of that uid; else Apply (a copy also drops data keys other
/// managers added).
pub fn object_plan(
    desired: &Desired,
    key: &ObjectKey,
    live: Option<&Value>,
    owner: &Owner,
    mode: Mode,
) -> ObjectPlan {
    let may_change = mode.pending || mode.correct_drift;
    // Recreates are never skipped: only plain applies carry the fingerprint the executor's
    // memo knows a write by (the live resourceVersion and the desired content hash).
    let apply = Apply {
        key: key.clone(),
        body: desired.body.clone(),
        replace_if_immutable: false,
        fingerprint: None,
    };
    let fingerprinted = |apply: Apply| Apply {
        fingerprint: Some(Fingerprint {
            live_version: live
                .and_then(|l| l["metadata"]["resourceVersion"].as_str())
                .map(str::to_string),
            desired: desired.hash.clone(),
        }),
        ..apply
    };
    let corrects_drift = !mode.pending;
    let Some(live) = live else {
        return if may_change {
            ObjectPlan::Write {
                ops: vec![Op::Apply(fingerprinted(apply))],
                corrects_drift,
            }
        } else {
            ObjectPlan::settled(
                ObjectState::Missing,
                "deleted downstream; correctDrift is off",
            )
        };
    };
    let annotations: Option<BTreeMap<String, String>> =
        serde_json::from_value(live["metadata"]["annotations"].clone()).unwrap_or_default();
    let adopt = match may_write(&ownership(annotations.as_ref(), owner), mode.take_ownership) {
        Ok(adopt) => adopt,
        Err(msg) => return ObjectPlan::settled(ObjectState::Conflict, msg),
    };
    // A copy signed before the one deployed here is an old copy replayed on the hub
    // (decision 0089-signed-copies): refused, the deployed one stays.
    let signed_at = |v: &Value| {
        v["metadata"]["annotations"][labels::SIGNED_AT]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
    };
    if let Some(at) = signed_at(&desired.body)
        && let Err(refusal) =
            tender_types::signing::not_replayed(&desired.key.name, at, signed_at(live))
    {
        return ObjectPlan::settled(ObjectState::Error, refusal.to_string());
    }
    if !adopt && in_sync(desired, live) {
        let (state, message) = applied_state(Some(live));
        return ObjectPlan::Settled { state, message };
    }
    if !(may_change || adopt) {
        return ObjectPlan::settled(
            ObjectState::Modified,
            "changed downstream; correctDrift is off",
        );
    }
    let ops = if needs_recreate(desired, live) {
        let uid = live["metadata"]["uid"].as_str().map(str::to_string);
        vec![Op::Recreate { uid, apply }]
    } else {
        let extra = desired
            .copy
            .then(|| extra_data_patch(desired, live))
            .flatten();
        std::iter::once(Op::Apply(fingerprinted(apply)))
            .chain(extra.map(|patch| Op::MergePatch {
                key: key.clone(),
                patch,
            }))
            .collect()
    };
    ObjectPlan::Write {
        ops,
        corrects_drift,
    }
}

/// The state of an object as applied (`None`: the write was skipped, nothing to judge).
pub fn applied_state(object: Option<&Value>) -> (ObjectState, Option<String>) {
    match object.map(readiness) {
        Some(Err(msg)) => (ObjectState::NotReady, Some(msg)),
        _ => (ObjectState::Ready, None),
    }
}

/// The state of a written (or skipped) object: judged on `object` (what the apiserver returned,
/// else what the cache shows), else on the desired body, which has no status — a workload is
/// not ready until its controller says so, and the object's watch event brings the deployment
/// back. Always as `desired`'s kind: objects of a list (a cache's first one) carry no `kind`,
/// and a Deployment judged as a kind-less object counted as ready before any controller had
/// seen it.
pub fn judge(object: Option<Value>, desired: &Desired) -> (ObjectState, Option<String>) {
    let mut judged = object.unwrap_or_else(|| desired.body.clone());
    if judged.is_object() && !judged["kind"].is_string() {
        judged["kind"] = Value::String(desired.key.kind.clone());
    }
    applied_state(Some(&judged))
}

/// Merge patch removing data/binaryData keys a copy has downstream but not on the hub:
/// server-side apply keeps keys other field managers added.
pub fn extra_data_patch(desired: &Desired, live: &Value) -> Option<Value> {
    let mut patch = Map::new();
    for field in ["data", "binaryData"] {
        let wanted = desired.body.get(field).and_then(Value::as_object);
        let extra: Map<String, Value> = live
            .get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(k, _)| wanted.is_none_or(|w| !w.contains_key(*k)))
            .map(|(k, _)| (k.clone(), Value::Null))
            .collect();
        if !extra.is_empty() {
            patch.insert(field.into(), Value::Object(extra));
        }
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// A BundleDeployment's `namespaceLabels` and `namespaceAnnotations`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NamespaceMeta<'a> {
    /// Labels for a namespace the agent creates.
    pub labels: Option<&'a std::collections::BTreeMap<String, String>>,
    /// Annotations for a namespace the agent creates.
    pub annotations: Option<&'a std::collections::BTreeMap<String, String>>,
}

/// Creates namespace `name` downstream (marked managed by tender, with the Bundle's
/// `namespaceLabels`/`namespaceAnnotations`); only planned when absent.
pub fn namespace_op(name: &str, meta: NamespaceMeta<'_>) -> Op {
    // Created, never applied: the agent's identity needs only `create` on namespaces, and a
    // namespace somebody else made is not the agent's to change
    // (decision 0101-namespace-labels-at-creation).
    let mut labels_map = serde_json::Map::new();
    for (k, v) in meta.labels.into_iter().flatten() {
        labels_map.insert(k.clone(), Value::String(v.clone()));
    }
    // tender's own mark last: a Bundle's keys never replace it (the CRD refuses them too).
    labels_map.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    let mut metadata = json!({ "name": name, "labels": labels_map });
    if let Some(a) = meta.annotations.filter(|a| !a.is_empty()) {
        metadata["annotations"] = json!(a);
    }
    Op::Create {
        key: ObjectKey::of::<Namespace>(None, name),
        body: json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": metadata,
        }),
    }
}

/// Whether an applied object is ready: `Ok` or `Err(why not)`.
///
/// Deployments/StatefulSets need their replicas available; anything with a `Ready` or
/// `Available` condition follows it; everything else (ConfigMaps, Services, ...) is ready once
/// applied.
pub fn readiness(obj: &Value) -> Result<(), String> {
    let status = &obj["status"];
    if let (Some(generation), Some(observed)) = (
        obj["metadata"]["generation"].as_i64(),
        status["observedGeneration"].as_i64(),
    ) && observed < generation
    {
        return Err("the controller has not observed the latest generation yet".into());
    }
    let kind = obj["kind"].as_str().unwrap_or_default();
    if matches!(
        kind,
        "Deployment" | "StatefulSet" | "ReplicaSet" | "DaemonSet"
    ) {
        return super::workload::readiness(kind, obj);
    }
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    for type_ in ["Ready", "Available"] {
        if let Some(c) = conditions.iter().find(|c| c["type"] == type_) {
            return if c["status"] == "True" {
                Ok(())
            } else {
                Err(format!(
                    "condition {type_} is {}: {}",
                    c["status"].as_str().unwrap_or("Unknown"),
                    c["message"].as_str().unwrap_or_default()
                ))
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{key, manifest};
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use tender_types::Manifest;

    #[test]
    fn drift_detection() {
        let d = db_copy(&hub_secret());
        let existing = as_existing(&d);
        assert!(
            in_sync(&d, &existing),
            "server fields and extra labels are not drift"
        );

        let mut edited = existing.clone();
        edited["data"]["password"] = json!("eA==");
        assert!(!in_sync(&d, &edited));
        let mut added = existing.clone();
        added["data"]["more"] = json!("eA==");
        assert!(!in_sync(&d, &added), "a key added to a copy is drift");
        let mut stale = existing.clone();
        stale["metadata"]["annotations"][labels::CONTENT_HASH] = json!("old");
        assert!(!in_sync(&d, &stale));

        let m = Manifest(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c"}, "data": {"a": "1"}
        }));
        let d = manifest(&m, true, &opts(None), &owner()).unwrap();
        let mut existing = as_existing(&d);
        assert!(in_sync(&d, &existing));
        existing["data"]["a"] = json!("2");
        assert!(!in_sync(&d, &existing));
    }
    #[test]
    fn subset_ignores_defaults_but_not_changes() {
        let desired = json!({"spec": {"replicas": 1, "template": {"containers": [{"name": "a"}]}, "empty": {}}});
        let existing = json!({"spec": {"replicas": 1, "strategy": {}, "template": {"containers": [{"name": "a", "imagePullPolicy": "Always"}]}}});
        assert!(is_subset(&desired, &existing));
        let changed = json!({"spec": {"replicas": 2, "template": {"containers": [{"name": "a"}]}}});
        assert!(!is_subset(&desired, &changed));
        let more = json!({"spec": {"replicas": 1, "template": {"containers": [{"name": "a"}, {"name": "b"}]}}});
        assert!(!is_subset(&desired, &more));
    }
    #[test]
    fn recreate_for_immutable_and_type_changes() {
        let mut mutable = hub_secret();
        mutable.immutable = None;
        let d = db_copy(&mutable);
        let mut existing = as_existing(&d);
        existing["data"]["password"] = json!("eA==");
        assert!(!needs_recreate(&d, &existing));
        existing["immutable"] = json!(true);
        assert!(needs_recreate(&d, &existing));
        let mut other_type = as_existing(&d);
        other_type["type"] = json!("Opaque");
        assert!(needs_recreate(&d, &other_type));

        let m = Manifest(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "immutable": true}),
        );
        let d = manifest(&m, true, &opts(None), &owner()).unwrap();
        assert!(
            !needs_recreate(&d, &as_existing(&d)),
            "manifests are never replaced"
        );
    }
    /// The state an object plan settles on without writing (`None`: it writes).
    fn settled(plan: ObjectPlan) -> Option<ObjectState> {
        match plan {
            ObjectPlan::Settled { state, .. } => Some(state),
            ObjectPlan::Write { .. } => None,
        }
    }
    fn secret_plan(d: &Desired, live: Option<&Value>, mode: Mode) -> ObjectPlan {
        let key = ObjectKey::of::<Secret>(Some("apps"), "db");
        object_plan(d, &key, live, &owner(), mode)
    }
    const STEADY: Mode = Mode {
        pending: false,
        correct_drift: true,
        take_ownership: false,
    };
    /// The apply of `d` without a fingerprint (as inside a recreate).
    fn apply_op(d: &Desired) -> Op {
        Op::Apply(Apply {
            key: ObjectKey::of::<Secret>(Some("apps"), "db"),
            body: d.body.clone(),
            replace_if_immutable: false,
            fingerprint: None,
        })
    }
    /// The apply of `d` over the live version `live_version`, as the memo knows it.
    fn fingerprinted_apply(d: &Desired, live_version: Option<&str>) -> Op {
        let Op::Apply(apply) = apply_op(d) else {
            unreachable!()
        };
        Op::Apply(Apply {
            fingerprint: Some(Fingerprint {
                live_version: live_version.map(str::to_string),
                desired: d.hash.clone(),
            }),
            ..apply
        })
    }
    #[test]
    fn nothing_changed_means_no_operations() {
        let d = db_copy(&hub_secret());
        let live = as_existing(&d);
        for mode in [
            STEADY,
            Mode {
                pending: true,
                ..STEADY
            },
            Mode {
                correct_drift: false,
                ..STEADY
            },
        ] {
            assert_eq!(
                secret_plan(&d, Some(&live), mode),
                ObjectPlan::Settled {
                    state: ObjectState::Ready,
                    message: None
                },
                "{mode:?}"
            );
        }
    }
    #[test]
    fn absent_objects_are_applied_unless_drift_is_left_alone() {
        let d = db_copy(&hub_secret());
        let rollout = Mode {
            pending: true,
            correct_drift: false,
            ..STEADY
        };
        assert_eq!(
            secret_plan(&d, None, rollout),
            ObjectPlan::Write {
                ops: vec![fingerprinted_apply(&d, None)],
                corrects_drift: false
            }
        );
        assert_eq!(
            secret_plan(&d, None, STEADY),
            ObjectPlan::Write {
                ops: vec![fingerprinted_apply(&d, None)],
                corrects_drift: true
            }
        );
        let left_alone = Mode {
            correct_drift: false,
            ..STEADY
        };
        assert_eq!(
            settled(secret_plan(&d, None, left_alone)),
            Some(ObjectState::Missing)
        );
    }
    #[test]
    fn somebody_elses_object_is_a_conflict_without_operations() {
        let d = db_copy(&hub_secret());
        let mut theirs = as_existing(&d);
        theirs["metadata"]["annotations"] = json!({});
        let conflict = secret_plan(&d, Some(&theirs), STEADY);
        assert!(
            matches!(&conflict, ObjectPlan::Settled { state: ObjectState::Conflict, message: Some(m) } if m.contains("takeOwnership")),
            "{conflict:?}"
        );
        let take = Mode {
            take_ownership: true,
            ..STEADY
        };
        assert_eq!(settled(secret_plan(&d, Some(&theirs), take)), None);
        let mut other = as_existing(&d);
        other["metadata"]["annotations"][labels::OWNER_ANNOTATION] = json!("cluster-x/app");
        assert_eq!(
            settled(secret_plan(&d, Some(&other), take)),
            Some(ObjectState::Conflict)
        );
    }
    #[test]
    fn drift_is_corrected_or_reported() {
        let mut mutable = hub_secret();
        mutable.immutable = None;
        let d = db_copy(&mutable);
        let mut edited = as_existing(&d);
        edited["data"]["password"] = json!("eA==");
        edited["data"]["more"] = json!("eA==");
        assert_eq!(
            secret_plan(&d, Some(&edited), STEADY),
            ObjectPlan::Write {
                ops: vec![
                    fingerprinted_apply(&d, edited["metadata"]["resourceVersion"].as_str()),
                    Op::MergePatch {
                        key: ObjectKey::of::<Secret>(Some("apps"), "db"),
                        patch: json!({"data": {"more": null}}),
                    }
                ],
                corrects_drift: true
            }
        );
        let off = Mode {
            correct_drift: false,
            ..STEADY
        };
        assert_eq!(
            settled(secret_plan(&d, Some(&edited), off)),
            Some(ObjectState::Modified)
        );
    }
    #[test]
    fn immutable_copies_are_recreated_by_uid() {
        let d = db_copy(&hub_secret());
        let mut old = as_existing(&d);
        old["data"]["password"] = json!("eA==");
        let ObjectPlan::Write { ops, .. } = secret_plan(&d, Some(&old), STEADY) else {
            panic!("a changed immutable copy is written");
        };
        let Op::Apply(apply) = apply_op(&d) else {
            unreachable!()
        };
        assert_eq!(
            ops,
            vec![Op::Recreate {
                uid: Some("u".into()),
                apply
            }]
        );
    }
    #[test]
    fn applied_objects_report_readiness() {
        let dep = json!({"kind": "Deployment", "spec": {"replicas": 2}, "status": {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}});
        assert_eq!(
            applied_state(Some(&dep)),
            (ObjectState::NotReady, Some("1/2 replicas available".into()))
        );
        assert_eq!(applied_state(None), (ObjectState::Ready, None));
    }

    #[test]
    fn extra_copy_keys_are_removed() {
        let d = Desired {
            key: key("v1", "Secret", Some("a"), "s"),
            body: json!({"data": {"k": "dg=="}}),
            hash: "h".into(),
            copy: true,
        };
        assert_eq!(extra_data_patch(&d, &json!({"data": {"k": "dg=="}})), None);
        assert_eq!(
            extra_data_patch(
                &d,
                &json!({"data": {"k": "dg==", "x": "eA=="}, "binaryData": {"b": "AA=="}})
            ),
            Some(json!({"data": {"x": null}, "binaryData": {"b": null}}))
        );
    }
    #[test]
    fn readiness_rules() {
        assert!(readiness(&json!({"kind": "ConfigMap"})).is_ok());
        let dep = json!({"kind": "Deployment", "spec": {"replicas": 2}, "status": {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}});
        assert_eq!(readiness(&dep).unwrap_err(), "1/2 replicas available");
        let dep = json!({"kind": "Deployment", "spec": {"replicas": 1}, "status": {"replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}});
        assert!(readiness(&dep).is_ok());
        let stale = json!({"kind": "X", "metadata": {"generation": 3}, "status": {"observedGeneration": 2}});
        assert!(readiness(&stale).is_err());
        let cond = json!({"kind": "X", "status": {"conditions": [{"type": "Ready", "status": "False", "message": "m"}]}});
        assert!(readiness(&cond).unwrap_err().contains("Ready is False"));
    }

    #[test]
    fn a_listed_object_without_kind_is_judged_as_its_kind() {
        let d = manifest(
            &Manifest(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web"}, "spec": {"replicas": 1}})),
            true,
            &opts(Some("apps")),
            &owner(),
        )
        .unwrap();
        // As a list item: no kind, a status nobody wrote yet.
        let listed = json!({"metadata": {"name": "web", "generation": 1}, "spec": {"replicas": 1}, "status": {}});
        assert_eq!(judge(Some(listed), &d).0, ObjectState::NotReady);
        // Nothing to judge (a skipped write, not cached yet): not ready either.
        assert_eq!(judge(None, &d).0, ObjectState::NotReady);
    }
}
