//! The controller's two callbacks: `reconcile` wraps deploy and cleanup in the agent's
//! finalizer; `error_policy` counts the failure and retries with the runtime's per-object backoff.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use tender_types::BundleDeployment;
use tender_types::labels::AGENT_CLEANUP_FINALIZER;

use crate::context::Context;
use crate::{Error, Result, cleanup, deploy};

const CONTROLLER: &str = "bundledeployment";

/// Deploys `bd`, or cleans up after it once it is being deleted.
pub(crate) async fn reconcile(bd: Arc<BundleDeployment>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.base().reconcile(CONTROLLER);
    let name = bd.name_any();
    let object = format!("BundleDeployment {}/{name}", ctx.config.cluster_namespace);
    // A chart's removal hooks run before the finalizer helper's cleanup, which drops the
    // finalizer as soon as it returns: waiting for a hook must keep it.
    if bd.metadata.deletion_timestamp.is_some()
        && bd.finalizers().iter().any(|f| f == AGENT_CLEANUP_FINALIZER)
        && let Some(wait) = cleanup::before_finalize(&bd, &ctx).await?
    {
        ctx.retries.succeeded(bd.as_ref());
        return Ok(wait);
    }
    let kept = Arc::clone(&bd);
    let action = finalizer(&ctx.bds, AGENT_CLEANUP_FINALIZER, bd, |event| async {
        match event {
            Event::Apply(bd) => deploy::deploy(&bd, &ctx).await,
            Event::Cleanup(bd) => {
                ctx.charts.forget(&bd.name_any());
                cleanup::finalize(&bd, &ctx).await
            }
        }
    })
    .await
    .map_err(|source| Error::Finalizer {
        object,
        source: Box::new(source),
    })?;
    ctx.retries.succeeded(kept.as_ref());
    Ok(action)
}

/// Logs and counts a failed reconcile (by the shared `reason()` vocabulary) and retries it
/// after the next delay of that BundleDeployment's backoff (reset by a success).
pub(crate) fn error_policy(bd: Arc<BundleDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = bd.name_any();
    let delay = ctx.retries.failed(bd.as_ref());
    ctx.metrics
        .base()
        .reconcile_error(CONTROLLER, error.reason());
    tracing::warn!(bundle_deployment = %name, %error, reason = error.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
