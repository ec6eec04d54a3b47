//! HelmOp controller: each HelmOp becomes a Bundle of the same name that it owns, and the
//! Bundle's status comes back onto the HelmOp.
//!
//! Observe (the HelmOp and Bundle caches) → plan ([`plan`], pure) → execute (the shared
//! executor). Everything else — targeting, copies, BundleDeployments, the agents' rendering —
//! is the Bundle's business. A Bundle of the same name that the HelmOp does not own is
//! reported (`BundleConflict`) and never touched.

pub mod plan;

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use tender_runtime::retry;
use tender_types::{Bundle, HelmOp, hash, labels};

use crate::Error;
use crate::context::{Ctx, status_op};
use plan::CleanupStep;

const CONTROLLER: &str = "helmop";

pub(crate) async fn reconcile(helmop: Arc<HelmOp>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let ns = helmop.namespace().unwrap_or_default();
    // Deleting: the steps before the Bundle's delete happen outside kube's finalizer helper,
    // which would release the HelmOp as soon as the cleanup returned. Bundle events wake each.
    let deleting = helmop.metadata.deletion_timestamp.is_some()
        && helmop
            .finalizers()
            .iter()
            .any(|f| f == labels::HELMOP_CLEANUP_FINALIZER);
    let mut last = None;
    if deleting {
        let live = bundle_of(&ctx, &helmop);
        match plan::cleanup_step(&helmop, live.as_deref()) {
            CleanupStep::Write(op) => {
                ctx.exec.execute(*op).await?;
                return Ok(Action::await_change());
            }
            CleanupStep::Wait => return Ok(Action::await_change()),
            step => last = Some(step),
        }
    }
    let api: Api<HelmOp> = Api::namespaced(ctx.client.clone(), &ns);
    retry::finalized(
        &api,
        labels::HELMOP_CLEANUP_FINALIZER,
        helmop,
        &ctx.retries,
        |event| async {
            match event {
                Finalizer::Apply(h) => apply(&h, &ctx).await,
                Finalizer::Cleanup(h) => cleanup(&h, last, &ctx).await,
            }
        },
    )
    .await
}

pub(crate) fn error_policy(helmop: Arc<HelmOp>, error: &Error, ctx: Arc<Ctx>) -> Action {
    retry::error_policy(
        CONTROLLER,
        helmop.as_ref(),
        error,
        &ctx.retries,
        &ctx.metrics,
    )
}

/// The cached Bundle with the HelmOp's name, if any.
fn bundle_of(ctx: &Ctx, helmop: &HelmOp) -> Option<Arc<Bundle>> {
    let r = ObjectRef::new(&helmop.name_any()).within(&helmop.namespace().unwrap_or_default());
    ctx.stores.bundles.get(&r)
}

async fn apply(helmop: &HelmOp, ctx: &Ctx) -> Result<Action, Error> {
    let live = bundle_of(ctx, helmop);
    if let Some(op) = plan::bundle_op(helmop, live.as_deref()) {
        let outcome = ctx.exec.execute(op).await?;
        if outcome.wrote {
            tracing::info!(helmop = %helmop.name_any(), namespace = ?helmop.namespace(), "bundle written for helmop");
        }
    }
    write_status(helmop, ctx).await?;
    Ok(Action::await_change())
}

async fn write_status(helmop: &HelmOp, ctx: &Ctx) -> Result<(), Error> {
    // Decide on the caches as they are now (see the Bundle controller's status write).
    let latest = ctx.stores.helmops.get(&ObjectRef::from_obj(helmop));
    let helmop: &HelmOp = latest.as_deref().unwrap_or(helmop);
    let live = bundle_of(ctx, helmop);
    let Some(new) = plan::helmop_status(helmop, live.as_deref(), Time(ctx.clock.now())) else {
        return Ok(());
    };
    let desired = hash::value_hash(&serde_json::to_value(&new).unwrap_or_default());
    let op = status_op::<HelmOp, _>(
        &helmop.namespace().unwrap_or_default(),
        &helmop.name_any(),
        helmop.resource_version(),
        helmop.status.as_ref(),
        &new,
        desired,
    );
    let op = op.filter(|op| !ctx.status_just_written(op));
    ctx.write_status(op).await
}

/// The last step of a HelmOp's deletion, decided in [`reconcile`] once the Bundle carries its
/// last `keepResources` and the Bundle controller has passed it on: delete the Bundle (whose
/// own finalizer removes the BundleDeployments; the agents then clean up or keep), then let
/// the HelmOp go.
async fn cleanup(helmop: &HelmOp, step: Option<CleanupStep>, ctx: &Ctx) -> Result<Action, Error> {
    if let Some(CleanupStep::Delete(op)) = step {
        ctx.exec.execute(*op).await?;
        tracing::info!(helmop = %helmop.name_any(), namespace = ?helmop.namespace(), "helmop deleted: its bundle is being removed");
    }
    Ok(Action::await_change())
}
