//! The Events a Bundle reconcile publishes: BundleDeployments created and deleted, and
//! conditions that move into a problem state (the status says the rest). Pure.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use tender_runtime::executor::{EventOp, Op};
use tender_types::BundleStatus;
use tender_types::conditions::{
    TYPE_READY, TYPE_RESOURCES_COPIED, TYPE_ROLLOUT_HALTED, find_condition, reason,
};

fn event(
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) -> Op {
    Op::Event(EventOp {
        regarding: regarding.clone(),
        type_,
        reason: reason.to_string(),
        action: action.to_string(),
        note,
    })
}

/// Events of a rollout pass (waves released, failed, rolled back, resumed).
pub(crate) fn rollout_events(
    regarding: &ObjectReference,
    events: &[super::rollout::RolloutEvent],
) -> Vec<Op> {
    events
        .iter()
        .map(|e| {
            let type_ = if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            event(regarding, type_, e.reason, "Rollout", e.message.clone())
        })
        .collect()
}

/// Events for BundleDeployments created and deleted by this reconcile.
pub(crate) fn fanout_events(
    regarding: &ObjectReference,
    created: usize,
    deleted: usize,
) -> Vec<Op> {
    let mut ops = Vec::new();
    if created > 0 {
        ops.push(event(
            regarding,
            EventType::Normal,
            "BundleDeploymentsCreated",
            "Target",
            format!("created BundleDeployments for {created} clusters"),
        ));
    }
    if deleted > 0 {
        ops.push(event(
            regarding,
            EventType::Normal,
            "BundleDeploymentsDeleted",
            "Untarget",
            format!("deleted BundleDeployments of {deleted} clusters no longer targeted"),
        ));
    }
    ops
}

/// Warning events for conditions that move into a problem state (the status says the rest).
pub(crate) fn transition_events(
    regarding: &ObjectReference,
    old: Option<&BundleStatus>,
    new: &BundleStatus,
) -> Vec<Op> {
    const PROBLEMS: [&str; 8] = [
        reason::SOURCE_NOT_FOUND,
        reason::COPY_FEATURE_DISABLED,
        reason::KIND_NOT_ALLOWED,
        reason::INVALID_SELECTOR,
        reason::NO_CLUSTERS_MATCHED,
        reason::DEPENDENCY_NOT_FOUND,
        reason::DEPENDENCY_CYCLE,
        reason::ROLLOUT_STATE_INVALID,
    ];
    let reason_of = |s: Option<&BundleStatus>, t: &str| {
        s.and_then(|s| find_condition(&s.conditions, t))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let mut ops = Vec::new();
    for t in [TYPE_RESOURCES_COPIED, TYPE_READY, TYPE_ROLLOUT_HALTED] {
        let before = reason_of(old, t).map(|(r, _)| r);
        let Some((after, message)) = reason_of(Some(new), t) else {
            continue;
        };
        // Source problems show on both conditions: report them once, from ResourcesCopied.
        let duplicate = t == TYPE_READY
            && (after == reason::SOURCE_NOT_FOUND || after == reason::KIND_NOT_ALLOWED);
        if before.as_deref() != Some(after.as_str())
            && PROBLEMS.contains(&after.as_str())
            && !duplicate
        {
            ops.push(event(
                regarding,
                EventType::Warning,
                &after,
                "Reconcile",
                message,
            ));
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn problem_transitions_raise_one_warning() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let cond = |t: &str, r: &str| Condition {
            type_: t.into(),
            status: "False".into(),
            reason: r.into(),
            message: "m".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        let new = BundleStatus {
            conditions: vec![
                cond(TYPE_RESOURCES_COPIED, reason::SOURCE_NOT_FOUND),
                cond(TYPE_READY, reason::SOURCE_NOT_FOUND),
            ],
            ..Default::default()
        };
        let ops = transition_events(&ObjectReference::default(), None, &new);
        assert_eq!(ops.len(), 1, "reported once, from ResourcesCopied");
        assert!(transition_events(&ObjectReference::default(), Some(&new), &new).is_empty());
    }
}
