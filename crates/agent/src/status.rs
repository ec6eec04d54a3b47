//! Pure computation of a BundleDeployment's status from what one reconcile found and did.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tender_types::ObjectState;

use crate::policy::is_refused;
use tender_types::conditions::{
    TYPE_DEPLOYED, TYPE_READY, TYPE_RESOURCES_COPIED, TYPE_TLS_VERIFIED, find_condition, reason,
    set_condition,
};
use tender_types::{
    BundleDeployment, BundleDeploymentDisplay, BundleDeploymentStatus, ObjectRef, ObjectStatus,
};

/// What one reconcile of a BundleDeployment found and did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// `spec.deploymentID`.
    pub deployment_id: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The deploymentID now completely applied (the new one on success, else the previous);
    /// with copies, the effective id (`tender_types::hash::effective_deployment_id`).
    pub applied_id: Option<String>,
    /// The `spec.deploymentID` `applied_id` was applied from, when that differs (copies):
    /// written as `appliedDeploymentID`, `applied_id` as `appliedCopiesID`.
    pub applied_base_id: Option<String>,
    /// Per-copy state, in `downstreamResources` order.
    pub copies: Vec<ObjectStatus>,
    /// Per-manifest state, in `resources` order.
    pub manifests: Vec<ObjectStatus>,
    /// downstreamResources present but the copy feature is off on this agent.
    pub copy_feature_disabled: bool,
    /// `spec.paused` with a deployment waiting.
    pub paused: bool,
    /// Objects restored after downstream drift in this reconcile.
    pub corrected: Vec<ObjectRef>,
}

fn with_state<'a>(list: &'a [ObjectStatus], states: &[ObjectState]) -> Vec<&'a ObjectStatus> {
    list.iter().filter(|s| states.contains(&s.state)).collect()
}

fn summarize(list: &[&ObjectStatus]) -> String {
    const SHOWN: usize = 3;
    let mut parts: Vec<String> = list
        .iter()
        .take(SHOWN)
        .map(|s| {
            let what = s.object().to_string();
            match &s.message {
                Some(m) => format!("{what}: {m}"),
                None => what,
            }
        })
        .collect();
    if list.len() > SHOWN {
        parts.push(format!("and {} more", list.len() - SHOWN));
    }
    parts.join("; ")
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// Reasons an object's error message may start with (`Reason: ...`), which then become the
/// `Deployed` (or `ResourcesCopied`) reason instead of `ApplyFailed` (`CopyFailed`): a kind the
/// cluster does not serve, a namespace stuck terminating, a chart that cannot be rendered or
/// whose values the owner's policy does not let it read.
const SPECIFIC_ERRORS: [&str; 21] = [
    reason::COPY_SIGNATURE_INVALID,
    reason::HUB_KEY_UNKNOWN,
    reason::COPY_REPLAYED,
    reason::SERVICE_ACCOUNT_NOT_ALLOWED,
    reason::KIND_NOT_INSTALLED,
    reason::NAMESPACE_TERMINATING,
    reason::CHART_REPOSITORY_UNREACHABLE,
    reason::CHART_AUTH_FAILED,
    reason::CHART_VERSION_NOT_FOUND,
    reason::CHART_DIGEST_MISMATCH,
    reason::CHART_RENDER_FAILED,
    reason::HOOK_FAILED,
    reason::CHART_TOO_LARGE,
    reason::RENDERED_TOO_LARGE,
    reason::CHART_REDIRECT_REFUSED,
    reason::CHART_SCHEMA_REFUSED,
    reason::CHART_REPOSITORY_CA_INVALID,
    reason::VALUES_FROM_MISSING,
    reason::VALUES_INVALID,
    reason::READ_REFUSED_BY_POLICY,
    reason::FILES_INVALID,
];

/// The first specific reason among `errors`' messages, else `fallback`.
fn error_reason(errors: &[&ObjectStatus], fallback: &'static str) -> &'static str {
    errors
        .iter()
        .filter_map(|s| s.message.as_deref())
        .find_map(|m| {
            SPECIFIC_ERRORS.iter().find(|r| {
                m.strip_prefix(**r)
                    .is_some_and(|rest| rest.starts_with(':'))
            })
        })
        .copied()
        .unwrap_or(fallback)
}

/// The `ResourcesCopied` condition: whether, its reason and message.
fn copied(
    o: &Outcome,
    copy_conflicts: &[&ObjectStatus],
    copy_errors: &[&ObjectStatus],
    copy_refused: &[&ObjectStatus],
) -> (bool, &'static str, String) {
    if o.copy_feature_disabled {
        (
            false,
            reason::COPY_FEATURE_DISABLED,
            "downstreamResources are ignored: EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM is off on this agent".to_string(),
        )
    } else if o.copies.is_empty() {
        (true, reason::NO_RESOURCES_TO_COPY, String::new())
    } else if !copy_conflicts.is_empty() {
        (false, reason::CONFLICT, summarize(copy_conflicts))
    } else if !copy_errors.is_empty() {
        (
            false,
            error_reason(copy_errors, reason::COPY_FAILED),
            summarize(copy_errors),
        )
    } else if !copy_refused.is_empty() {
        (false, reason::REFUSED_BY_POLICY, summarize(copy_refused))
    } else {
        let missing = with_state(&o.copies, &[ObjectState::Missing]);
        if missing.is_empty() || o.applied_id.as_deref() == Some(&o.deployment_id) {
            (
                true,
                reason::RESOURCES_COPIED,
                format!("{} copies in place", o.copies.len()),
            )
        } else {
            (false, reason::COPY_FAILED, summarize(&missing))
        }
    }
}

/// The `Deployed` condition's reason and message (it is true when `applied`).
fn deployed(
    prev: Option<&BundleDeploymentStatus>,
    o: &Outcome,
    applied: bool,
    conflicts: &[&ObjectStatus],
    copy_errors: &[&ObjectStatus],
    errors: &[&ObjectStatus],
) -> (&'static str, String) {
    if applied {
        let mut message = format!("deployment {} applied", short(&o.deployment_id));
        if !o.corrected.is_empty() {
            let restored: Vec<String> = o.corrected.iter().map(ToString::to_string).collect();
            message.push_str(&format!(
                "; restored after downstream drift: {}",
                restored.join(", ")
            ));
        } else if let Some(c) = prev
            .filter(|p| {
                p.applied_copies_id
                    .as_ref()
                    .or(p.applied_deployment_id.as_ref())
                    == o.applied_id.as_ref()
            })
            .and_then(|p| find_condition(&p.conditions, TYPE_DEPLOYED))
            .filter(|c| c.reason == reason::DEPLOYED)
        {
            // Keep the last drift note until the next deployment, so it stays visible.
            message = c.message.clone();
        }
        (reason::DEPLOYED, message)
    } else if o.paused {
        (reason::PAUSED, "BundleDeployment is paused".to_string())
    } else if !conflicts.is_empty() {
        (reason::CONFLICT, summarize(conflicts))
    } else if !copy_errors.is_empty() || !with_state(&o.copies, &[ObjectState::Missing]).is_empty()
    {
        (
            error_reason(copy_errors, reason::COPY_FAILED),
            "waiting for every copy to be in place before applying manifests".to_string(),
        )
    } else if !errors.is_empty() {
        (
            error_reason(errors, reason::APPLY_FAILED),
            summarize(errors),
        )
    } else {
        (
            reason::WAIT_APPLIED,
            format!("deployment {} not applied yet", short(&o.deployment_id)),
        )
    }
}

/// The status to write, starting from `prev` (conditions keep their transition times).
pub fn compute(
    prev: Option<&BundleDeploymentStatus>,
    o: &Outcome,
    now: Time,
) -> BundleDeploymentStatus {
    let mut conditions = prev.map(|p| p.conditions.clone()).unwrap_or_default();
    let generation = o.generation;
    let mut set = |type_: &str, ok: bool, reason: &str, message: &str| {
        set_condition(
            &mut conditions,
            type_,
            ok,
            reason,
            message,
            generation,
            now.clone(),
        );
    };

    let conflict_states = [ObjectState::Conflict];
    let error_states = [ObjectState::Error, ObjectState::Missing];
    let copy_conflicts = with_state(&o.copies, &conflict_states);
    let refused: Vec<&ObjectStatus> = o
        .copies
        .iter()
        .chain(&o.manifests)
        .filter(|s| is_refused(s))
        .collect();
    let copy_refused: Vec<&ObjectStatus> = o.copies.iter().filter(|s| is_refused(s)).collect();
    let copy_errors: Vec<_> = o
        .copies
        .iter()
        .filter(|s| s.state == ObjectState::Error && !is_refused(s))
        .collect();

    // ResourcesCopied
    let (ok, copied_reason, message) = copied(o, &copy_conflicts, &copy_errors, &copy_refused);
    set(TYPE_RESOURCES_COPIED, ok, copied_reason, &message);

    let all: Vec<ObjectStatus> = o.copies.iter().chain(&o.manifests).cloned().collect();
    let conflicts = with_state(&all, &conflict_states);
    let errors: Vec<_> = with_state(&all, &error_states)
        .into_iter()
        .filter(|s| !is_refused(s))
        .collect();
    let applied = o.applied_id.as_deref() == Some(o.deployment_id.as_str());

    // Deployed
    let (deployed_reason, deployed_message) =
        deployed(prev, o, applied, &conflicts, &copy_errors, &errors);
    set(TYPE_DEPLOYED, applied, deployed_reason, &deployed_message);

    // Ready
    let modified = with_state(&all, &[ObjectState::Modified]);
    let missing_after_apply: Vec<_> = if applied {
        with_state(&all, &[ObjectState::Missing])
    } else {
        Vec::new()
    };
    let not_ready = with_state(&all, &[ObjectState::NotReady]);
    let failed_after_apply: Vec<&ObjectStatus> = if applied {
        errors
            .iter()
            .copied()
            .filter(|s| s.state == ObjectState::Error)
            .collect()
    } else {
        Vec::new()
    };
    let (ready, ready_reason, ready_message, display) = if !applied {
        let display = match deployed_reason {
            reason::PAUSED => "Paused",
            reason::WAIT_APPLIED => "WaitApplied",
            _ => "ErrApplied",
        };
        (false, deployed_reason, deployed_message.clone(), display)
    } else if !refused.is_empty() {
        (
            false,
            reason::REFUSED_BY_POLICY,
            summarize(&refused),
            "RefusedByPolicy",
        )
    } else if !failed_after_apply.is_empty() {
        // Applied once, failing now (e.g. its CRD removed downstream): not Ready, and why.
        (
            false,
            error_reason(&failed_after_apply, reason::APPLY_FAILED),
            summarize(&failed_after_apply),
            "ErrApplied",
        )
    } else if !modified.is_empty() || !missing_after_apply.is_empty() {
        let mut drifted = modified.clone();
        drifted.extend(missing_after_apply.iter().copied());
        (false, reason::MODIFIED, summarize(&drifted), "Modified")
    } else if !not_ready.is_empty() {
        (false, reason::NOT_READY, summarize(&not_ready), "NotReady")
    } else {
        (
            true,
            reason::READY,
            format!("{} objects ready", all.len()),
            "Ready",
        )
    };
    set(TYPE_READY, ready, ready_reason, &ready_message);

    let refs = |states: &[ObjectState]| -> Vec<ObjectRef> {
        all.iter()
            .filter(|s| states.contains(&s.state))
            .map(ObjectStatus::object)
            .collect()
    };
    let (applied_deployment_id, applied_copies_id) = match &o.applied_base_id {
        Some(base) if o.applied_id.as_ref().is_some_and(|a| a != base) => {
            (Some(base.clone()), o.applied_id.clone())
        }
        _ => (o.applied_id.clone(), None),
    };
    BundleDeploymentStatus {
        applied_deployment_id,
        applied_copies_id,
        observed_generation: generation,
        conditions,
        modified: if applied {
            refs(&[ObjectState::Modified, ObjectState::Missing])
        } else {
            refs(&[ObjectState::Modified])
        },
        non_ready: refs(&[ObjectState::NotReady]),
        resources: all,
        display: Some(BundleDeploymentDisplay {
            state: display.to_string(),
        }),
        // Owned by the upstream reporter (its own field manager), never written here.
        upstream: Vec::new(),
    }
}

/// `TLSVerified=False` (reason InsecureSkipTLSVerify) on a deployment whose chart is fetched
/// without verifying TLS, so users see it; removed otherwise. `Ready` is left as it is
/// (decision 0106-chart-repository-tls).
pub fn tls_verified(status: &mut BundleDeploymentStatus, bd: &BundleDeployment, now: Time) {
    let insecure = bd
        .spec
        .helm
        .as_ref()
        .is_some_and(|h| h.insecure_skip_tls_verify);
    if insecure {
        set_condition(
            &mut status.conditions,
            TYPE_TLS_VERIFIED,
            false,
            reason::INSECURE_SKIP_TLS_VERIFY,
            "helm.insecureSkipTLSVerify: the chart source's TLS certificate is not verified; \
             anyone on the network path can serve another chart (trust a private CA with \
             cacerts in helmSecretName instead)",
            bd.metadata.generation,
            now,
        );
    } else {
        status.conditions.retain(|c| c.type_ != TYPE_TLS_VERIFIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use tender_types::conditions::is_true;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn obj(kind: &str, name: &str, state: ObjectState) -> ObjectStatus {
        ObjectStatus {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: Some("apps".into()),
            name: name.into(),
            state,
            message: None,
        }
    }

    #[test]
    fn a_refused_object_is_named_and_the_rest_is_deployed() {
        let mut o = outcome(true);
        let mut refused = obj("ClusterRole", "admin", ObjectState::Error);
        refused.namespace = None;
        refused.message = Some(format!(
            "{}: kind rbac.authorization.k8s.io/v1/ClusterRole is refused",
            reason::REFUSED_BY_POLICY
        ));
        o.manifests.push(refused);
        let s = compute(None, &o, at(1));
        let c = |t: &str| find_condition(&s.conditions, t).unwrap().clone();
        assert!(
            is_true(&s.conditions, TYPE_DEPLOYED),
            "the rest is deployed"
        );
        assert_eq!(c(TYPE_DEPLOYED).reason, reason::DEPLOYED);
        assert!(is_true(&s.conditions, TYPE_RESOURCES_COPIED));
        assert!(!is_true(&s.conditions, TYPE_READY));
        assert_eq!(c(TYPE_READY).reason, reason::REFUSED_BY_POLICY);
        assert!(
            c(TYPE_READY).message.contains("ClusterRole admin"),
            "{:?}",
            c(TYPE_READY)
        );

        // A refused copy: ResourcesCopied names it, and it is not a copy failure.
        let mut o = outcome(true);
        o.copies[0].state = ObjectState::Error;
        o.copies[0].message = Some(format!("{}: namespace apps", reason::REFUSED_BY_POLICY));
        let s = compute(None, &o, at(1));
        let c = find_condition(&s.conditions, TYPE_RESOURCES_COPIED).unwrap();
        assert_eq!(c.reason, reason::REFUSED_BY_POLICY);
        assert!(is_true(&s.conditions, TYPE_DEPLOYED));
    }

    #[test]
    fn a_kind_not_installed_or_a_terminating_namespace_is_its_own_reason() {
        let msg = |why: &str| Some(format!("{why}: detail"));
        // A manifest: the Deployed and Ready reason; the other objects keep their state.
        for why in [
            reason::KIND_NOT_INSTALLED,
            reason::NAMESPACE_TERMINATING,
            reason::READ_REFUSED_BY_POLICY,
        ] {
            let mut o = outcome(false);
            o.manifests.push(obj("Widget", "w", ObjectState::Error));
            o.manifests[1].message = msg(why);
            let s = compute(None, &o, at(1));
            let c = |t: &str| find_condition(&s.conditions, t).unwrap().clone();
            assert_eq!(c(TYPE_DEPLOYED).reason, why);
            assert_eq!(c(TYPE_READY).reason, why);
            assert!(
                c(TYPE_READY).message.contains("Widget apps/w: "),
                "{:?}",
                c(TYPE_READY)
            );
            assert!(is_true(&s.conditions, TYPE_RESOURCES_COPIED));
            assert_eq!(s.resources[1].state, ObjectState::Ready, "app stays Ready");
        }
        // Applied before, failing now (its CRD removed): Ready says why, Deployed stays.
        let mut o = outcome(true);
        o.manifests.push(obj("Widget", "w", ObjectState::Error));
        o.manifests[1].message = msg(reason::KIND_NOT_INSTALLED);
        let s = compute(None, &o, at(1));
        let c = |t: &str| find_condition(&s.conditions, t).unwrap().clone();
        assert!(is_true(&s.conditions, TYPE_DEPLOYED));
        assert_eq!(c(TYPE_READY).reason, reason::KIND_NOT_INSTALLED);
        assert_eq!(s.display.as_ref().unwrap().state, "ErrApplied");
        // A copy: ResourcesCopied and Deployed say why the manifests wait.
        let mut o = outcome(false);
        o.copies[0].state = ObjectState::Error;
        o.copies[0].message = msg(reason::NAMESPACE_TERMINATING);
        let s = compute(None, &o, at(1));
        let c = |t: &str| find_condition(&s.conditions, t).unwrap().reason.clone();
        assert_eq!(c(TYPE_RESOURCES_COPIED), reason::NAMESPACE_TERMINATING);
        assert_eq!(c(TYPE_DEPLOYED), reason::NAMESPACE_TERMINATING);
        // Any other error stays ApplyFailed / CopyFailed.
        o.copies[0].message = Some("cannot apply: Invalid".into());
        let s = compute(None, &o, at(1));
        let c = |t: &str| find_condition(&s.conditions, t).unwrap().reason.clone();
        assert_eq!(c(TYPE_RESOURCES_COPIED), reason::COPY_FAILED);
        assert_eq!(c(TYPE_DEPLOYED), reason::COPY_FAILED);
    }

    fn outcome(applied: bool) -> Outcome {
        Outcome {
            deployment_id: "id-2".into(),
            generation: Some(3),
            applied_id: Some(if applied { "id-2" } else { "id-1" }.into()),
            copies: vec![obj("Secret", "db", ObjectState::Ready)],
            manifests: vec![obj("ConfigMap", "app", ObjectState::Ready)],
            ..Default::default()
        }
    }

    #[test]
    fn insecure_tls_is_a_condition_beside_ready() {
        let mut bd = BundleDeployment::new("b", tender_types::BundleDeploymentSpec::default());
        bd.spec.helm = Some(tender_types::HelmOptions {
            insecure_skip_tls_verify: true,
            ..Default::default()
        });
        let mut s = compute(None, &outcome(true), at(1));
        tls_verified(&mut s, &bd, at(1));
        let c = find_condition(&s.conditions, TYPE_TLS_VERIFIED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::INSECURE_SKIP_TLS_VERIFY)
        );
        assert!(is_true(&s.conditions, TYPE_READY), "Ready is unchanged");
        bd.spec.helm.as_mut().unwrap().insecure_skip_tls_verify = false;
        tls_verified(&mut s, &bd, at(2));
        assert!(find_condition(&s.conditions, TYPE_TLS_VERIFIED).is_none());
    }

    #[test]
    fn applied_and_ready() {
        let s = compute(None, &outcome(true), at(1));
        assert_eq!(s.applied_deployment_id.as_deref(), Some("id-2"));
        for t in [TYPE_READY, TYPE_DEPLOYED, TYPE_RESOURCES_COPIED] {
            assert!(is_true(&s.conditions, t), "{t}");
        }
        assert_eq!(s.resources.len(), 2);
        assert_eq!(s.resources[0].kind, "Secret", "copies first");
        assert_eq!(s.display.unwrap().state, "Ready");
        assert_eq!(s.observed_generation, Some(3));
        // Same outcome again: identical status, so no write.
        let again = compute(
            Some(&compute(None, &outcome(true), at(1))),
            &outcome(true),
            at(9),
        );
        assert_eq!(again, compute(None, &outcome(true), at(1)));
    }

    #[test]
    fn conflicting_copy_blocks_the_deployment() {
        let mut o = outcome(false);
        o.copies[0].state = ObjectState::Conflict;
        o.copies[0].message = Some("exists and was not created by tender".into());
        o.manifests[0].state = ObjectState::Missing;
        let s = compute(None, &o, at(1));
        let rc = find_condition(&s.conditions, TYPE_RESOURCES_COPIED).unwrap();
        assert_eq!(
            (rc.status.as_str(), rc.reason.as_str()),
            ("False", reason::CONFLICT)
        );
        assert!(rc.message.contains("Secret apps/db"), "{}", rc.message);
        let d = find_condition(&s.conditions, TYPE_DEPLOYED).unwrap();
        assert_eq!(d.reason, reason::CONFLICT);
        assert!(!is_true(&s.conditions, TYPE_READY));
        assert_eq!(s.display.unwrap().state, "ErrApplied");
        assert_eq!(s.applied_deployment_id.as_deref(), Some("id-1"));
    }

    #[test]
    fn drift_is_reported_and_corrections_stay_visible() {
        let mut o = outcome(true);
        o.copies[0].state = ObjectState::Modified;
        let s = compute(None, &o, at(1));
        let ready = find_condition(&s.conditions, TYPE_READY).unwrap();
        assert_eq!(ready.reason, reason::MODIFIED);
        assert_eq!(s.modified.len(), 1);
        assert_eq!(s.display.as_ref().unwrap().state, "Modified");

        let mut fixed = outcome(true);
        fixed.corrected = vec![fixed.copies[0].object()];
        let s = compute(Some(&s), &fixed, at(2));
        assert!(is_true(&s.conditions, TYPE_READY));
        let d = find_condition(&s.conditions, TYPE_DEPLOYED).unwrap();
        assert!(
            d.message
                .contains("restored after downstream drift: Secret apps/db")
        );
        // A later quiet reconcile keeps the note (and so writes nothing).
        let quiet = compute(Some(&s), &outcome(true), at(3));
        assert_eq!(quiet, s);
    }

    #[test]
    fn waiting_paused_and_gate_off() {
        let s = compute(None, &outcome(false), at(1));
        assert_eq!(
            find_condition(&s.conditions, TYPE_DEPLOYED).unwrap().reason,
            reason::WAIT_APPLIED
        );
        assert_eq!(s.display.unwrap().state, "WaitApplied");

        let mut p = outcome(false);
        p.paused = true;
        let s = compute(None, &p, at(1));
        assert_eq!(
            find_condition(&s.conditions, TYPE_READY).unwrap().reason,
            reason::PAUSED
        );

        let mut g = outcome(true);
        g.copies.clear();
        g.copy_feature_disabled = true;
        let s = compute(None, &g, at(1));
        assert_eq!(
            find_condition(&s.conditions, TYPE_RESOURCES_COPIED)
                .unwrap()
                .reason,
            reason::COPY_FEATURE_DISABLED
        );
    }

    #[test]
    fn a_refused_service_account_is_the_reason_everywhere() {
        let mut o = outcome(false);
        let msg = format!("{}: kube-system/admin", reason::SERVICE_ACCOUNT_NOT_ALLOWED);
        for s in o.copies.iter_mut().chain(o.manifests.iter_mut()) {
            s.state = ObjectState::Error;
            s.message = Some(msg.clone());
        }
        let s = compute(None, &o, at(1));
        for t in [TYPE_READY, TYPE_DEPLOYED, TYPE_RESOURCES_COPIED] {
            let c = find_condition(&s.conditions, t).unwrap();
            assert_eq!(c.reason, reason::SERVICE_ACCOUNT_NOT_ALLOWED, "{t}");
        }
    }

    #[test]
    fn not_ready_objects_are_listed() {
        let mut o = outcome(true);
        o.manifests[0].state = ObjectState::NotReady;
        o.manifests[0].message = Some("0/1 replicas available".into());
        let s = compute(None, &o, at(1));
        assert_eq!(s.non_ready.len(), 1);
        let r = find_condition(&s.conditions, TYPE_READY).unwrap();
        assert_eq!(r.reason, reason::NOT_READY);
        assert!(r.message.contains("0/1 replicas"));
    }

    #[test]
    fn with_copies_the_effective_id_is_reported_apart_from_the_spec_id() {
        let o = Outcome {
            deployment_id: "eff-2".into(),
            applied_id: Some("eff-2".into()),
            applied_base_id: Some("id-1".into()),
            ..Default::default()
        };
        let s = compute(None, &o, Time(Timestamp::from_second(1).unwrap()));
        assert_eq!(s.applied_deployment_id.as_deref(), Some("id-1"));
        assert_eq!(s.applied_copies_id.as_deref(), Some("eff-2"));
        let plain = Outcome {
            applied_base_id: Some("eff-2".into()),
            ..o
        };
        let s = compute(None, &plain, Time(Timestamp::from_second(1).unwrap()));
        assert_eq!(s.applied_deployment_id.as_deref(), Some("eff-2"));
        assert_eq!(s.applied_copies_id, None);
    }
}
