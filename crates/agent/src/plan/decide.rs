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
