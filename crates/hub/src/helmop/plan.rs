//! Pure decisions of the HelmOp controller: whose the same-named Bundle is, the operation that
//! brings it to the HelmOp's spec, the HelmOp's status and the steps of its deletion.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::ResourceExt;
use tender_runtime::executor::{Apply, Fingerprint, ObjectKey, Op, body_of};
use tender_types::conditions::{self, TYPE_READY, reason};
use tender_types::{
    API_GROUP_VERSION, Bundle, BundleDisplay, BundleSpec, HelmOp, HelmOpStatus, hash, labels,
};

/// Whose the Bundle with the HelmOp's name is.
#[derive(Debug)]
pub enum Owner<'a> {
    /// There is none.
    Absent,
    /// The hub wrote it for a HelmOp of this name (its controller reference says so; an older
    /// incarnation's Bundle is adopted rather than deleted and rebuilt downstream).
    Ours(&'a Bundle),
    /// Someone else's: never touched.
    Foreign(&'a Bundle),
}

/// Classifies `bundle`, the Bundle of `helmop`'s name in its namespace, if any.
pub fn owner_of<'a>(helmop: &HelmOp, bundle: Option<&'a Bundle>) -> Owner<'a> {
    let Some(b) = bundle else {
        return Owner::Absent;
    };
    let ours = b.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && o.api_version == API_GROUP_VERSION
            && o.kind == "HelmOp"
            && o.name == helmop.name_any()
    });
    if ours {
        Owner::Ours(b)
    } else {
        Owner::Foreign(b)
    }
}

/// Labels of the Bundle: the HelmOp's `spec.labels` and which HelmOp it belongs to.
fn bundle_labels(helmop: &HelmOp) -> BTreeMap<String, String> {
    let mut l = helmop.spec.labels.clone();
    l.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    l.insert(
        labels::HELMOP.into(),
        labels::safe_label_value(&helmop.name_any()),
    );
    l
}

/// The hash of everything the hub sets on the Bundle, kept in its content-hash annotation so
/// a removed label is noticed (a subset check alone would keep it forever).
fn content_hash(helmop: &HelmOp, spec: &BundleSpec) -> String {
    let mut hashed = serde_json::json!({
        "labels": bundle_labels(helmop),
        "spec": spec,
        "owner": helmop.uid(),
    });
    // Only when set: a HelmOp without it keeps the hash older hubs wrote (no rewrite).
    if let Some(resume) = helmop.annotations().get(labels::ROLLOUT_RESUME) {
        hashed["resume"] = resume.clone().into();
    }
    hash::value_hash(&hashed)
}

/// The apply of the Bundle for `helmop`, or none: it is current, someone else's, or being
/// deleted (its deletion event brings us back to write it again).
pub fn bundle_op(helmop: &HelmOp, live: Option<&Bundle>) -> Option<Op> {
    let spec = helmop.spec.bundle_spec();
    let desired = content_hash(helmop, &spec);
    match owner_of(helmop, live) {
        Owner::Foreign(_) => return None,
        Owner::Ours(b) if b.metadata.deletion_timestamp.is_some() => return None,
        Owner::Ours(b) if is_current(helmop, b, &spec, &desired) => return None,
        _ => {}
    }
    let name = helmop.name_any();
    let ns = helmop.namespace().unwrap_or_default();
    let mut bundle = Bundle::new(&name, spec);
    bundle.metadata.namespace = Some(ns.clone());
    bundle.metadata.labels = Some(bundle_labels(helmop));
    let mut annotations = BTreeMap::from([(labels::CONTENT_HASH.to_string(), desired.clone())]);
    // `tender rollout resume --helmop` reaches the HelmOp's Bundle (docs/rollouts.md).
    if let Some(resume) = helmop.annotations().get(labels::ROLLOUT_RESUME) {
        annotations.insert(labels::ROLLOUT_RESUME.to_string(), resume.clone());
    }
    bundle.metadata.annotations = Some(annotations);
    bundle.metadata.owner_references = Some(vec![OwnerReference {
        api_version: API_GROUP_VERSION.into(),
        kind: "HelmOp".into(),
        name: name.clone(),
        uid: helmop.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    Some(Op::Apply(Apply {
        key: ObjectKey::of::<Bundle>(Some(&ns), &name),
        body: body_of(&bundle),
        replace_if_immutable: false,
        fingerprint: Some(Fingerprint {
            live_version: live.and_then(ResourceExt::resource_version),
            desired,
        }),
    }))
}

fn is_current(helmop: &HelmOp, b: &Bundle, spec: &BundleSpec, desired: &str) -> bool {
    let uid = helmop.uid();
    b.annotations()
        .get(labels::CONTENT_HASH)
        .map(String::as_str)
        == Some(desired)
        && &b.spec == spec
        && bundle_labels(helmop)
            .iter()
            .all(|(k, v)| b.labels().get(k) == Some(v))
        && b.owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// Whether the Bundle controller has reported on the Bundle's current spec.
fn reported(b: &Bundle) -> bool {
    b.status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .is_some_and(|g| Some(g) == b.metadata.generation)
}

/// The HelmOp's status, or none to leave it as it is: the Bundle has not been written or has
/// not been reported on at the HelmOp's spec yet (the Bundle's status event brings us back).
pub fn helmop_status(helmop: &HelmOp, live: Option<&Bundle>, now: Time) -> Option<HelmOpStatus> {
    let generation = helmop.metadata.generation;
    match owner_of(helmop, live) {
        Owner::Foreign(_) => {
            let old = helmop.status.as_ref();
            let mut conds: Vec<_> = old
                .map(|s| s.conditions.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.type_ == TYPE_READY)
                .collect();
            let message = format!(
                "a Bundle named {} already exists in this namespace and this HelmOp does not \
                 own it; tender leaves it alone. Delete or rename that Bundle, or rename the HelmOp",
                helmop.name_any()
            );
            conditions::set_condition(
                &mut conds,
                TYPE_READY,
                false,
                reason::BUNDLE_CONFLICT,
                &message,
                generation,
                now,
            );
            Some(HelmOpStatus {
                observed_generation: generation,
                conditions: conds,
                summary: None,
                display: Some(BundleDisplay {
                    ready_clusters: String::new(),
                    state: reason::BUNDLE_CONFLICT.to_string(),
                }),
                version: None,
            })
        }
        Owner::Ours(b)
            if b.metadata.deletion_timestamp.is_none()
                && b.spec == helmop.spec.bundle_spec()
                && reported(b) =>
        {
            let s = b.status.clone().unwrap_or_default();
            Some(HelmOpStatus {
                observed_generation: generation,
                conditions: s
                    .conditions
                    .into_iter()
                    .map(|mut c| {
                        c.observed_generation = generation;
                        c
                    })
                    .collect(),
                summary: s.summary,
                display: s.display,
                version: s.version,
            })
        }
        _ => None,
    }
}

/// One step of a HelmOp's deletion.
#[derive(Debug, PartialEq)]
pub enum CleanupStep {
    /// Bring the HelmOp's last `keepResources` to its Bundle first.
    Write(Box<Op>),
    /// Wait until the Bundle controller has passed that spec on to the BundleDeployments.
    Wait,
    /// Delete the Bundle (this incarnation only), then let the HelmOp go.
    Delete(Box<Op>),
    /// Nothing of ours is left: let the HelmOp go.
    Release,
}

/// The next step of deleting `helmop`, whose Bundle is `live`.
///
/// The agents decide on `keepResources` from the BundleDeployment they see being deleted, so
/// the Bundle is deleted only once the HelmOp's last word on it has reached them.
pub fn cleanup_step(helmop: &HelmOp, live: Option<&Bundle>) -> CleanupStep {
    let b = match owner_of(helmop, live) {
        Owner::Ours(b) if b.metadata.deletion_timestamp.is_none() => b,
        _ => return CleanupStep::Release,
    };
    let spec = helmop.spec.bundle_spec();
    let keep = |s: &BundleSpec| {
        let per_target: Vec<_> = s.targets.iter().map(|t| t.keep_resources).collect();
        (s.keep_resources, per_target)
    };
    if keep(&b.spec) != keep(&spec) {
        return match bundle_op(helmop, live) {
            Some(op) => CleanupStep::Write(Box::new(op)),
            None => CleanupStep::Wait,
        };
    }
    if !reported(b) {
        return CleanupStep::Wait;
    }
    CleanupStep::Delete(Box::new(Op::Delete {
        key: ObjectKey::of::<Bundle>(b.namespace().as_deref(), &b.name_any()),
        uid: b.uid(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;
    use tender_types::BundleStatus;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn helmop(spec: serde_json::Value) -> HelmOp {
        serde_json::from_value(json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
            "metadata": {"name": "web", "namespace": "ws", "uid": "u-1", "generation": 3},
            "spec": spec
        }))
        .unwrap()
    }

    fn spec() -> serde_json::Value {
        json!({
            "helm": {"chart": "app", "repo": "http://charts", "version": "0.1.0",
                     "valuesFrom": [{"secretKeyRef": {"name": "vals"}}]},
            "helmSecretName": "auth",
            "targets": [{"clusterSelector": {}}],
            "downstreamResources": [{"kind": "Secret", "name": "vals"}],
            "labels": {"team": "web"}
        })
    }

    /// The Bundle as the apiserver would hold it after `op`, at `generation`.
    fn written(op: &Op, generation: i64) -> Bundle {
        let Op::Apply(a) = op else {
            panic!("not an apply: {op:?}")
        };
        let mut b: Bundle = serde_json::from_value(a.body.clone()).unwrap();
        b.metadata.uid = Some("b-1".into());
        b.metadata.resource_version = Some("10".into());
        b.metadata.generation = Some(generation);
        b
    }

    fn with_status(mut b: Bundle, observed: i64, ready: bool) -> Bundle {
        let mut conds = Vec::new();
        conditions::set_condition(
            &mut conds,
            TYPE_READY,
            ready,
            if ready {
                reason::READY
            } else {
                reason::WAIT_APPLIED
            },
            "",
            Some(observed),
            at(5),
        );
        b.status = Some(BundleStatus {
            observed_generation: Some(observed),
            conditions: conds,
            display: Some(BundleDisplay {
                ready_clusters: "2/2".into(),
                state: "Ready".into(),
            }),
            ..Default::default()
        });
        b
    }

    #[test]
    fn the_rollout_strategy_and_a_resume_reach_the_bundle() {
        let mut with = spec();
        with["rolloutStrategy"] =
            json!({"partitions": [{"clusterName": "a"}], "onFailure": "Rollback"});
        let mut h = helmop(with);
        let b = written(&bundle_op(&h, None).unwrap(), 1);
        let strategy = b.spec.rollout_strategy.as_ref().expect("carried");
        assert_eq!(strategy.partitions[0].cluster_name.as_deref(), Some("a"));
        assert!(bundle_op(&h, Some(&b)).is_none(), "current");
        // `tender rollout resume --helmop web`: a new annotation value is written to the Bundle.
        h.metadata.annotations = Some(BTreeMap::from([(
            labels::ROLLOUT_RESUME.to_string(),
            "t1".to_string(),
        )]));
        let resumed = written(&bundle_op(&h, Some(&b)).expect("resume passed on"), 2);
        assert_eq!(resumed.annotations()[labels::ROLLOUT_RESUME], "t1");
    }

    #[test]
    fn the_bundle_is_owned_labelled_and_derived_from_the_spec() {
        let h = helmop(spec());
        let op = bundle_op(&h, None).expect("absent: written");
        let b = written(&op, 1);
        assert_eq!(op.key().unwrap().to_string(), "Bundle ws/web");
        assert_eq!(b.spec, h.spec.bundle_spec());
        assert_eq!(b.labels()["team"], "web");
        assert_eq!(b.labels()[labels::HELMOP], "web");
        let owner = &b.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("HelmOp", "web", "u-1")
        );
        assert_eq!(owner.controller, Some(true));
        assert!(matches!(owner_of(&h, Some(&b)), Owner::Ours(_)));
    }

    #[test]
    fn nothing_changed_means_no_operations() {
        let h = helmop(spec());
        let b = with_status(written(&bundle_op(&h, None).unwrap(), 1), 1, true);
        assert_eq!(bundle_op(&h, Some(&b)), None);
        let mut h2 = h.clone();
        h2.status = helmop_status(&h, Some(&b), at(9));
        assert_eq!(helmop_status(&h2, Some(&b), at(20)), h2.status);
    }

    #[test]
    fn a_changed_spec_label_or_edited_bundle_is_written_again() {
        let h = helmop(spec());
        let b = written(&bundle_op(&h, None).unwrap(), 1);

        let mut upgraded = h.clone();
        upgraded.spec.helm.version = Some("0.2.0".into());
        let op = bundle_op(&upgraded, Some(&b)).expect("new version");
        assert_eq!(
            written(&op, 2).spec.helm.unwrap().version.as_deref(),
            Some("0.2.0")
        );

        let mut relabelled = h.clone();
        relabelled.spec.labels.clear();
        assert!(bundle_op(&relabelled, Some(&b)).is_some(), "label removed");

        let mut edited = b.clone();
        edited.spec.keep_resources = true;
        assert!(bundle_op(&h, Some(&edited)).is_some(), "edited by hand");
    }

    #[test]
    fn a_foreign_bundle_is_reported_and_never_touched() {
        let h = helmop(spec());
        let mut foreign = Bundle::new("web", BundleSpec::default());
        foreign.metadata.namespace = Some("ws".into());
        assert!(matches!(owner_of(&h, Some(&foreign)), Owner::Foreign(_)));
        assert_eq!(bundle_op(&h, Some(&foreign)), None);
        let s = helmop_status(&h, Some(&foreign), at(1)).unwrap();
        let ready = conditions::find_condition(&s.conditions, TYPE_READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reason::BUNDLE_CONFLICT)
        );
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(cleanup_step(&h, Some(&foreign)), CleanupStep::Release);

        // Somebody else's HelmOp of another name owning it is still foreign.
        foreign.metadata.owner_references = Some(vec![OwnerReference {
            api_version: API_GROUP_VERSION.into(),
            kind: "HelmOp".into(),
            name: "other".into(),
            uid: "u-9".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        assert_eq!(bundle_op(&h, Some(&foreign)), None);
    }

    #[test]
    fn an_older_incarnations_bundle_is_adopted() {
        let h = helmop(spec());
        let mut b = written(&bundle_op(&h, None).unwrap(), 1);
        b.metadata.owner_references.as_mut().unwrap()[0].uid = "u-old".into();
        let op = bundle_op(&h, Some(&b)).expect("adopted");
        assert_eq!(written(&op, 2).owner_references()[0].uid, "u-1");
    }

    #[test]
    fn status_is_the_bundles_once_it_reported_on_this_spec() {
        let h = helmop(spec());
        assert_eq!(helmop_status(&h, None, at(1)), None, "no Bundle yet");
        let b = written(&bundle_op(&h, None).unwrap(), 2);
        assert_eq!(helmop_status(&h, Some(&b), at(1)), None, "not reported");
        let stale = with_status(b.clone(), 1, true);
        assert_eq!(
            helmop_status(&h, Some(&stale), at(1)),
            None,
            "reported on an older spec"
        );
        let done = with_status(b, 2, true);
        let s = helmop_status(&h, Some(&done), at(1)).unwrap();
        assert_eq!(s.observed_generation, Some(3));
        assert!(conditions::is_true(&s.conditions, TYPE_READY));
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
        assert_eq!(s.display.unwrap().ready_clusters, "2/2");
    }

    #[test]
    fn deletion_waits_for_keep_resources_to_reach_the_bundle() {
        let h = helmop(spec());
        assert_eq!(cleanup_step(&h, None), CleanupStep::Release);
        let b = with_status(written(&bundle_op(&h, None).unwrap(), 1), 1, true);

        let mut keep = h.clone();
        keep.spec.keep_resources = true;
        let CleanupStep::Write(op) = cleanup_step(&keep, Some(&b)) else {
            panic!("keepResources first")
        };
        let b2 = written(&op, 2);
        assert!(b2.spec.keep_resources);
        assert_eq!(cleanup_step(&keep, Some(&b2)), CleanupStep::Wait);
        let b2 = with_status(b2, 2, false);
        let CleanupStep::Delete(op) = cleanup_step(&keep, Some(&b2)) else {
            panic!("then the delete")
        };
        assert_eq!(
            *op,
            Op::Delete {
                key: ObjectKey::of::<Bundle>(Some("ws"), "web"),
                uid: Some("b-1".into())
            }
        );

        let mut going = b2.clone();
        going.metadata.deletion_timestamp = Some(at(1));
        assert_eq!(cleanup_step(&keep, Some(&going)), CleanupStep::Release);
    }
}
