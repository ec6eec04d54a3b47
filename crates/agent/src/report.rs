//! What the agent reports on the hub about one BundleDeployment: its status (server-side
//! apply to the status subresource) and events for notable transitions (Deployed,
//! DriftCorrected, Conflict), each once per transition. [`report_ops`] is pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tender_runtime::executor::{Apply, EventOp, Fingerprint};
use tender_runtime::{ObjectKey, Op};
use tender_types::{BundleDeployment, BundleDeploymentStatus, ObjectState, hash};

use crate::Result;
use crate::context::Context;
use crate::status::{self, Outcome};

/// Writes the status computed from `outcome` and its events, if it differs from the current one.
pub(crate) async fn report(ctx: &Context, bd: &BundleDeployment, outcome: &Outcome) -> Result<()> {
    let now = Time(Timestamp::now());
    let mut new = status::compute(bd.status.as_ref(), outcome, now.clone());
    status::tls_verified(&mut new, bd, now);
    let mut ops = report_ops(bd, &new, outcome).into_iter();
    // The status write comes first; its events only with it (an idle 1000-agent run saw a
    // `Deployed` series patched by a reconcile whose status write the memo had skipped).
    if let Some(status) = ops.next() {
        ctx.hub_writer
            .execute_with_events(status, ops.collect())
            .await?;
    }
    Ok(())
}

/// The status write and events taking `bd` to status `new`: none when the status is unchanged.
pub(crate) fn report_ops(
    bd: &BundleDeployment,
    new: &BundleDeploymentStatus,
    outcome: &Outcome,
) -> Vec<Op> {
    let prev = bd.status.as_ref();
    // `status.upstream` belongs to the upstream reporter's field manager: not ours to compare.
    let unchanged = prev.is_some_and(|p| {
        p.upstream.is_empty() && p == new
            || BundleDeploymentStatus {
                upstream: Vec::new(),
                ..p.clone()
            } == *new
    });
    if unchanged {
        return Vec::new();
    }
    let name = bd.name_any();
    let status = Op::ApplyStatus(Apply {
        key: ObjectKey::of::<BundleDeployment>(bd.namespace().as_deref(), &name),
        body: json!({
            "apiVersion": tender_types::API_GROUP_VERSION,
            "kind": "BundleDeployment",
            "metadata": { "name": name },
            "status": new,
        }),
        replace_if_immutable: false,
        // A reconcile that runs before our last status write reached the cache (a drift event
        // during the deploy) sees the old status and would write the same one again.
        fingerprint: Some(Fingerprint {
            live_version: bd.resource_version(),
            desired: hash::value_hash(&serde_json::to_value(new).unwrap_or_default()),
        }),
    });
    let mut events = Vec::new();
    // The first deployment only: a redeploy (a rotation) shows in `appliedDeploymentID`, and an
    // Event per cluster per rotation would double the hub writes of a rotation
    // (decision 0055-copy-ahead-grace).
    let first_applied = prev
        .and_then(|p| p.applied_deployment_id.as_ref())
        .is_none();
    if first_applied && new.applied_deployment_id.is_some() {
        events.push((
            EventType::Normal,
            "Deployed",
            format!("deployment {} applied downstream", outcome.deployment_id),
        ));
    }
    if !outcome.corrected.is_empty() {
        let what: Vec<String> = outcome.corrected.iter().map(ToString::to_string).collect();
        events.push((
            EventType::Normal,
            "DriftCorrected",
            format!("restored after downstream drift: {}", what.join(", ")),
        ));
    }
    let conflicts = |s: &BundleDeploymentStatus| {
        s.resources
            .iter()
            .filter(|r| r.state == ObjectState::Conflict)
            .count()
    };
    if conflicts(new) > prev.map_or(0, conflicts) {
        let what: Vec<String> = new
            .resources
            .iter()
            .filter(|r| r.state == ObjectState::Conflict)
            .map(|r| r.object().to_string())
            .collect();
        events.push((
            EventType::Warning,
            "Conflict",
            format!("left untouched, owned by someone else: {}", what.join(", ")),
        ));
    }
    let regarding = bd.object_ref(&());
    std::iter::once(status)
        .chain(events.into_iter().map(|(type_, reason, note)| {
            Op::Event(EventOp {
                regarding: regarding.clone(),
                type_,
                reason: reason.into(),
                action: "Deploy".into(),
                note,
            })
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tender_types::{BundleDeploymentSpec, ObjectStatus};

    fn bd(status: Option<BundleDeploymentStatus>) -> BundleDeployment {
        let mut bd = BundleDeployment::new("app", BundleDeploymentSpec::default());
        bd.metadata.namespace = Some("cluster-ws-c1-12345678".into());
        bd.status = status;
        bd
    }

    fn outcome(state: ObjectState) -> Outcome {
        Outcome {
            deployment_id: "id-1".into(),
            applied_id: Some("id-1".into()),
            manifests: vec![ObjectStatus {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: Some("apps".into()),
                name: "c".into(),
                state,
                message: None,
            }],
            ..Default::default()
        }
    }

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn reasons(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Event(e) => e.reason.clone(),
                other => other.verb().to_string(),
            })
            .collect()
    }

    #[test]
    fn nothing_changed_means_no_operations() {
        let o = outcome(ObjectState::Ready);
        let current = status::compute(None, &o, at(1));
        let again = status::compute(Some(&current), &o, at(9));
        assert_eq!(report_ops(&bd(Some(current)), &again, &o), Vec::new());
    }

    #[test]
    fn a_first_deployment_writes_status_and_one_deployed_event() {
        let o = outcome(ObjectState::Ready);
        let new = status::compute(None, &o, at(1));
        let ops = report_ops(&bd(None), &new, &o);
        assert_eq!(reasons(&ops), ["status", "Deployed"]);
        let Op::ApplyStatus(apply) = &ops[0] else {
            panic!("status first");
        };
        assert_eq!(
            apply.key,
            ObjectKey::of::<BundleDeployment>(Some("cluster-ws-c1-12345678"), "app")
        );
        assert_eq!(apply.body["status"], serde_json::to_value(&new).unwrap());
        // Keyed in the memo by the cached version it was decided on and the status written.
        let mut cached = bd(None);
        cached.metadata.resource_version = Some("7".into());
        let again = report_ops(&cached, &new, &o);
        let Op::ApplyStatus(apply) = &again[0] else {
            panic!("status first");
        };
        let fp = apply.fingerprint.as_ref().expect("a memo fingerprint");
        assert_eq!(fp.live_version.as_deref(), Some("7"));
    }

    #[test]
    fn a_redeploy_writes_status_without_an_event() {
        let settled = status::compute(None, &outcome(ObjectState::Ready), at(1));
        let mut rotated = outcome(ObjectState::Ready);
        rotated.deployment_id = "id-2".into();
        rotated.applied_id = Some("id-2".into());
        let new = status::compute(Some(&settled), &rotated, at(2));
        let ops = report_ops(&bd(Some(settled)), &new, &rotated);
        assert_eq!(reasons(&ops), ["status"]);
    }

    #[test]
    fn conflicts_and_corrections_are_announced_once() {
        let settled = status::compute(None, &outcome(ObjectState::Ready), at(1));
        let conflict = outcome(ObjectState::Conflict);
        let new = status::compute(Some(&settled), &conflict, at(2));
        let ops = report_ops(&bd(Some(settled.clone())), &new, &conflict);
        assert_eq!(reasons(&ops), ["status", "Conflict"]);
        // Still in conflict: the status is the same, nothing is written or announced again.
        let again = status::compute(Some(&new), &conflict, at(3));
        assert!(report_ops(&bd(Some(new)), &again, &conflict).is_empty());

        let mut fixed = outcome(ObjectState::Ready);
        fixed.corrected = vec![fixed.manifests[0].object()];
        let new = status::compute(Some(&settled), &fixed, at(4));
        let ops = report_ops(&bd(Some(settled)), &new, &fixed);
        assert_eq!(reasons(&ops), ["status", "DriftCorrected"]);
    }
}
