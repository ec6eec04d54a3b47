//! What one BundleDeployment's reported status counts as ([`classify`]) and the counts over
//! many ([`summarize`], [`summary_reason`]). Pure, and a leaf: the Bundle status, the Cluster
//! status and the cache trimming ([`crate::slim`]'s tests) all read it, none of them owns it.

use tender_types::conditions::{
    self, TYPE_DEPLOYED, TYPE_READY, TYPE_RESOURCES_COPIED, find_condition, reason,
};
use tender_types::{BundleDeployment, BundleSummary};

/// State of one BundleDeployment as the summaries count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentState {
    /// No agent has reported on it yet.
    Pending,
    /// The agent has not yet applied the current deploymentID.
    WaitApplied,
    /// The last apply (or copy) failed.
    ErrApplied,
    /// Deployed objects were changed downstream.
    Modified,
    /// Applied, but objects are not ready.
    NotReady,
    /// Applied at the current deploymentID and ready.
    Ready,
}

/// Classifies one BundleDeployment from its spec and the status its agent reported, for a
/// deployment without copies (its `appliedDeploymentID` is its `deploymentID`).
#[cfg(test)]
pub fn classify(bd: &BundleDeployment) -> DeploymentState {
    classify_with(bd, &bd.spec.deployment_id)
}

/// Classifies one BundleDeployment: applied means `appliedDeploymentID` equals `expected`, the
/// deploymentID together with the hashes of the copies the hub wrote for it
/// (`Ctx::expected_deployment_id`, decision 0089-signed-copies).
pub fn classify_with(bd: &BundleDeployment, expected: &str) -> DeploymentState {
    let Some(status) = &bd.status else {
        return DeploymentState::Pending;
    };
    if status.applied_deployment_id.is_none() && status.conditions.is_empty() {
        return DeploymentState::Pending;
    }
    // Any reason the agent gives for not deploying but waiting or pausing is a failure
    // (ApplyFailed, Conflict, KindNotInstalled, NamespaceTerminating, a chart's, ...).
    let not_deployed = find_condition(&status.conditions, TYPE_DEPLOYED).is_some_and(|c| {
        c.status == "False" && !matches!(c.reason.as_str(), reason::WAIT_APPLIED | reason::PAUSED)
    });
    let copy_failed = find_condition(&status.conditions, TYPE_RESOURCES_COPIED).is_some_and(|c| {
        c.status == "False"
            && matches!(
                c.reason.as_str(),
                reason::COPY_FAILED
                    | reason::COPY_SIGNATURE_INVALID
                    | reason::HUB_KEY_UNKNOWN
                    | reason::COPY_REPLAYED
                    | reason::CONFLICT
                    | reason::KIND_NOT_INSTALLED
                    | reason::NAMESPACE_TERMINATING
            )
    });
    // Applied once, an object failing since (its CRD removed downstream, ...).
    let failing = find_condition(&status.conditions, TYPE_READY).is_some_and(|c| {
        c.status == "False"
            && matches!(
                c.reason.as_str(),
                reason::APPLY_FAILED | reason::KIND_NOT_INSTALLED | reason::NAMESPACE_TERMINATING
            )
    });
    if not_deployed || copy_failed || failing {
        return DeploymentState::ErrApplied;
    }
    let applied = status
        .applied_copies_id
        .as_deref()
        .or(status.applied_deployment_id.as_deref());
    if applied != Some(expected) {
        return DeploymentState::WaitApplied;
    }
    if !status.modified.is_empty() {
        return DeploymentState::Modified;
    }
    if conditions::is_true(&status.conditions, TYPE_READY) {
        DeploymentState::Ready
    } else {
        DeploymentState::NotReady
    }
}

/// [`summarize_with`] for deployments without copies.
#[cfg(test)]
pub fn summarize<'a>(
    desired: usize,
    bds: impl IntoIterator<Item = &'a BundleDeployment>,
) -> BundleSummary {
    summarize_with(desired, bds, |bd| bd.spec.deployment_id.clone())
}

/// Counts BundleDeployments by state ([`classify_with`] against `expected` of each); `desired`
/// of them should exist, and those not present count as pending.
pub fn summarize_with<'a>(
    desired: usize,
    bds: impl IntoIterator<Item = &'a BundleDeployment>,
    expected: impl Fn(&BundleDeployment) -> String,
) -> BundleSummary {
    let mut s = BundleSummary {
        desired_ready: to_i32(desired),
        ..Default::default()
    };
    let mut seen = 0;
    for bd in bds {
        seen += 1;
        match classify_with(bd, &expected(bd)) {
            DeploymentState::Pending => s.pending += 1,
            DeploymentState::WaitApplied => s.wait_applied += 1,
            DeploymentState::ErrApplied => s.err_applied += 1,
            DeploymentState::Modified => s.modified += 1,
            DeploymentState::NotReady => s.not_ready += 1,
            DeploymentState::Ready => s.ready += 1,
        }
    }
    s.pending += to_i32(desired.saturating_sub(seen));
    s
}

fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The not-ready reason and one-word state a summary stands for, worst first; `None` when
/// every desired deployment is ready.
pub fn summary_reason(s: &BundleSummary) -> Option<(&'static str, &'static str)> {
    if s.err_applied > 0 {
        Some((reason::APPLY_FAILED, "ErrApplied"))
    } else if s.modified > 0 {
        Some((reason::MODIFIED, "Modified"))
    } else if s.wait_applied > 0 {
        Some((reason::WAIT_APPLIED, "WaitApplied"))
    } else if s.pending > 0 {
        Some((reason::WAIT_APPLIED, "Pending"))
    } else if s.not_ready > 0 {
        Some((reason::NOT_READY, "NotReady"))
    } else {
        None
    }
}
