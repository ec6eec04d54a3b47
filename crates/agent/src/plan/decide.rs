//! The per-object decisions of a deployment, made in the plan from the live objects the
//! observe step read (decision 0118-agent-decides-in-the-plan): for every object the phases
//! apply, create, update, adopt, refuse or report a conflict — pure, so the executor only
//! carries out the operations and judges what the apiserver returned.

use std::collections::BTreeMap;

use serde_json::Value;
use tender_runtime::{ObjectKey, Op};
use tender_types::{ObjectRef, ObjectState, ObjectStatus};

use super::{
    DeployPlan, Desired, Entry, Mode, ObjectPlan, Owner, Ownership, object_plan, ownership,
};
use crate::policy::Policy;

/// One desired object as observed downstream.
#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    /// Where the object is written (its kind from discovery).
    pub key: ObjectKey,
    /// The object downstream (`None`: absent).
    pub object: Option<Value>,
}

/// The live state of every object a plan applies: read, or why it could not be (the message
/// to report, e.g. `KindNotInstalled`).
pub type LiveState = BTreeMap<ObjectRef, Result<Live, String>>;

/// A decided write: the operations for one object, and what is known to judge the result.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// The object.
    pub desired: Desired,
    /// The object downstream before the write (`None`: absent).
    pub live: Option<Value>,
    /// The operations, in order.
    pub ops: Vec<Op>,
    /// The write restores an object changed or deleted downstream (not a rollout).
    pub corrects_drift: bool,
}

/// How the objects of a plan may be treated: `manifests` for inline manifests and copies,
/// `chart` for the chart's objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modes {
    /// Inline manifests and copies.
    pub manifests: Mode,
    /// The chart's objects.
    pub chart: Mode,
}

/// The plan with every `Apply` entry decided from `live`: [`Entry::Write`] with its
/// operations, or [`Entry::Settled`] with the object's state (in sync, a conflict, drift
/// left alone, adoption refused, unreadable).
pub fn decide(
    mut plan: DeployPlan,
    live: &LiveState,
    modes: Modes,
    owner: &Owner,
    agent_namespace: &str,
) -> DeployPlan {
    for phase in &mut plan.phases {
        for entry in &mut phase.entries {
            let mode = entry.mode(modes.manifests, modes.chart);
            let Entry::Apply { desired, .. } = &*entry else {
                continue;
            };
            *entry = match live.get(&desired.key) {
                Some(Ok(found)) => decide_object(desired, found, owner, mode, agent_namespace),
                Some(Err(msg)) => Entry::Settled(error(&desired.key, msg.clone())),
                None => Entry::Settled(error(&desired.key, "not observed".into())),
            };
        }
    }
    plan
}

fn error(key: &ObjectRef, msg: String) -> ObjectStatus {
    ObjectStatus::new(key, ObjectState::Error, Some(msg))
}

/// The one decision for one object. `takeOwnership` never adopts tender's own objects,
/// whatever the policy flags (decision 0078-tenders-own-objects-and-protected-namespaces).
pub fn decide_object(
    desired: &Desired,
    live: &Live,
    owner: &Owner,
    mode: Mode,
    agent_namespace: &str,
) -> Entry {
    if mode.take_ownership
        && let Some(object) = &live.object
        && let Some(why) = adoption_refusal(desired, owner, object, agent_namespace)
    {
        return Entry::Settled(error(&desired.key, why));
    }
    match object_plan(desired, &live.key, live.object.as_ref(), owner, mode) {
        ObjectPlan::Settled { state, message } => {
            Entry::Settled(ObjectStatus::new(&desired.key, state, message))
        }
        ObjectPlan::Write {
            ops,
            corrects_drift,
        } => Entry::Write(Write {
            desired: desired.clone(),
            live: live.object.clone(),
            ops,
            corrects_drift,
        }),
    }
}

/// Why the existing object `live` may not be adopted: only an unmanaged one is ever adopted,
/// and never one of tender's own.
fn adoption_refusal(
    d: &Desired,
    owner: &Owner,
    live: &Value,
    agent_namespace: &str,
) -> Option<String> {
    let meta = |field: &str| -> Option<BTreeMap<String, String>> {
        serde_json::from_value(live["metadata"][field].clone()).unwrap_or_default()
    };
    (ownership(meta("annotations").as_ref(), owner) == Ownership::Unowned)
        .then(|| Policy::adoption_refusal(&d.key, meta("labels").as_ref(), agent_namespace))
        .flatten()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;
    use tender_types::{Manifest, labels};

    use super::super::fixtures::*;
    use super::super::{Desired, PlannedPhase, manifest};
    use super::*;
    use crate::plan::Phase;

    const AGENT_NS: &str = "tender-system";

    fn config_map(namespace: &str, name: &str) -> Desired {
        let m = Manifest(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": {"a": "1"}
        }));
        manifest(&m, true, &opts(None), &owner()).unwrap()
    }

    fn live(d: &Desired, object: Option<Value>) -> Live {
        let (ns, name) = (d.key.namespace.as_deref(), d.key.name.as_str());
        Live {
            key: ObjectKey::of::<ConfigMap>(ns, name),
            object,
        }
    }

    /// `d` as somebody else made it: no tender ownership, `labels` as given.
    fn unowned(d: &Desired, labels: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": d.key.name, "namespace": d.key.namespace, "uid": "u1",
                         "resourceVersion": "3", "labels": labels},
            "data": {"a": "0"}
        })
    }

    fn mode(pending: bool, correct_drift: bool, take_ownership: bool) -> Mode {
        Mode {
            pending,
            correct_drift,
            take_ownership,
        }
    }

    fn decided(d: &Desired, object: Option<Value>, m: Mode) -> Entry {
        decide_object(d, &live(d, object), &owner(), m, AGENT_NS)
    }

    fn state(e: &Entry) -> ObjectState {
        match e {
            Entry::Settled(s) => s.state,
            other => panic!("not settled: {other:?}"),
        }
    }

    fn ops(e: &Entry) -> Vec<&'static str> {
        match e {
            Entry::Write(w) => w.ops.iter().map(Op::verb).collect(),
            other => panic!("not a write: {other:?}"),
        }
    }

    #[test]
    fn an_absent_object_is_created_in_a_rollout_and_restored_only_with_correct_drift() {
        let d = config_map("apps", "web");
        let created = decided(&d, None, mode(true, false, false));
        assert_eq!(ops(&created), ["apply"]);
        let Entry::Write(w) = &created else {
            unreachable!()
        };
        assert!(!w.corrects_drift, "a rollout's create is not drift");
        assert_eq!(w.live, None);

        let left = decided(&d, None, mode(false, false, false));
        assert_eq!(state(&left), ObjectState::Missing, "correctDrift off");
        let restored = decided(&d, None, mode(false, true, false));
        assert_eq!(ops(&restored), ["apply"]);
        assert!(matches!(&restored, Entry::Write(w) if w.corrects_drift));
    }

    #[test]
    fn an_object_in_sync_is_settled_and_a_changed_one_updated() {
        let d = config_map("apps", "web");
        let same = as_existing(&d);
        assert_eq!(
            state(&decided(&d, Some(same.clone()), mode(true, false, false))),
            ObjectState::Ready
        );
        let mut changed = same;
        changed["data"]["a"] = json!("2");
        let updated = decided(&d, Some(changed.clone()), mode(true, false, false));
        assert_eq!(ops(&updated), ["apply"]);
        assert!(matches!(&updated, Entry::Write(w) if w.live == Some(changed.clone())));
        assert_eq!(
            state(&decided(&d, Some(changed), mode(false, false, false))),
            ObjectState::Modified,
            "changed downstream, correctDrift off, no rollout"
        );
    }

    #[test]
    fn somebody_elses_object_is_a_conflict_unless_adopted_and_tenders_own_never_is() {
        let d = config_map("apps", "web");
        let theirs = unowned(&d, json!({}));
        assert_eq!(
            state(&decided(&d, Some(theirs.clone()), mode(true, false, false))),
            ObjectState::Conflict
        );
        let mut other_bd = as_existing(&d);
        other_bd["metadata"]["annotations"][labels::OWNER_ANNOTATION] =
            json!("cluster-ws-c1-12345678/other");
        assert_eq!(
            state(&decided(&d, Some(other_bd), mode(true, false, true))),
            ObjectState::Conflict,
            "another BundleDeployment's object is never adopted"
        );
        let adopted = decided(&d, Some(theirs), mode(true, false, true));
        assert_eq!(ops(&adopted), ["apply"], "takeOwnership adopts it");

        let install = unowned(&d, json!({labels::APP_NAME: "tender-hub"}));
        let refused = decided(&d, Some(install), mode(true, false, true));
        assert_eq!(state(&refused), ObjectState::Error);
        let own_ns = config_map(AGENT_NS, "agent-config");
        let refused = decided(
            &own_ns,
            Some(unowned(&own_ns, json!({}))),
            mode(true, false, true),
        );
        assert_eq!(state(&refused), ObjectState::Error, "the agent's namespace");
    }

    /// A plan of one objects phase holding `entries`.
    fn objects_phase(entries: Vec<Entry>) -> DeployPlan {
        DeployPlan {
            record: Vec::new(),
            desired: Vec::new(),
            namespaces: Vec::new(),
            phases: vec![PlannedPhase {
                phase: Phase::Objects,
                entries,
            }],
            prune: Vec::new(),
            record_write: None,
            final_write: None,
            keep: false,
        }
    }

    #[test]
    fn every_apply_of_a_plan_is_decided_and_reports_stay() {
        let (a, b, c) = (
            config_map("apps", "a"),
            config_map("apps", "b"),
            config_map("apps", "c"),
        );
        let refused = ObjectStatus::new(&c.key, ObjectState::Error, Some("refused".into()));
        let apply = |d: &Desired| Entry::Apply {
            desired: d.clone(),
            chart: false,
            adopt: false,
        };
        let plan = objects_phase(vec![apply(&a), apply(&b), Entry::Report(refused.clone())]);
        let state_of = LiveState::from([
            (a.key.clone(), Ok(live(&a, None))),
            (b.key.clone(), Err("cannot read: forbidden".to_string())),
        ]);
        let modes = Modes {
            manifests: mode(true, false, false),
            chart: mode(true, false, false),
        };
        let decided = decide(plan, &state_of, modes, &owner(), AGENT_NS);
        let entries = &decided.phases[0].entries;
        assert_eq!(ops(&entries[0]), ["apply"]);
        assert!(matches!(&entries[1], Entry::Settled(s)
            if s.state == ObjectState::Error
                && s.message.as_deref() == Some("cannot read: forbidden")));
        assert_eq!(entries[2], Entry::Report(refused));
    }

    #[test]
    fn a_chart_object_is_decided_with_the_charts_take_ownership() {
        let d = config_map("apps", "web");
        let plan = objects_phase(vec![Entry::Apply {
            desired: d.clone(),
            chart: true,
            adopt: false,
        }]);
        let state_of =
            LiveState::from([(d.key.clone(), Ok(live(&d, Some(unowned(&d, json!({}))))))]);
        let modes = Modes {
            manifests: mode(true, false, false),
            chart: mode(true, false, true),
        };
        let decided = decide(plan, &state_of, modes, &owner(), AGENT_NS);
        assert_eq!(ops(&decided.phases[0].entries[0]), ["apply"]);
    }
}
