//! Bundle controller: resolve targets, write one BundleDeployment per targeted cluster and the
//! copies it needs, remove what is no longer wanted, and fold it all into the Bundle's status.
//!
//! One pipeline: read ([`read`]: caches, the sources whose content a copy needs, the chart
//! version the poll controller recorded, reverse sync's status lines) → pure plan
//! ([`planning`]: [`plan`] targeting, templates and copies, the copy limit, `dependsOn`, the
//! deletions) → the rollout gate ([`waves`]) → execute ([`execute`], the shared executor, at
//! most [`FANOUT_CONCURRENCY`] clusters at a time) → report ([`report`], status built by
//! [`status`]).

pub(crate) mod depends;
mod events;
mod execute;
pub(crate) mod observe;
mod ops;
pub mod plan;
mod planning;
mod poll;
mod read;
mod report;
mod revisions;
pub mod rollout;
mod shards;
pub mod status;
mod waves;

pub(crate) use observe::source_state;

use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use tender_runtime::Op;
use tender_runtime::retry;
use tender_types::{Bundle, labels};

use crate::Error;
use crate::context::Ctx;
use status::BundleFacts;

const CONTROLLER: &str = "bundle";
/// Clusters whose BundleDeployment and copies are written concurrently per Bundle.
pub const FANOUT_CONCURRENCY: usize = 16;

pub(crate) async fn reconcile(bundle: Arc<Bundle>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let ns = bundle.namespace().unwrap_or_default();
    let api: Api<Bundle> = Api::namespaced(ctx.client.clone(), &ns);
    // One finalizer per replica: each removes its own shard's BundleDeployments.
    let cleanup_finalizer = labels::bundle_cleanup_finalizer(ctx.config.shard_id.as_deref());
    retry::finalized(
        &api,
        &cleanup_finalizer,
        bundle,
        &ctx.retries,
        |event| async {
            match event {
                Finalizer::Apply(b) => apply(&b, &ctx).await,
                Finalizer::Cleanup(b) => cleanup(&b, &ctx).await,
            }
        },
    )
    .await
}

pub(crate) fn error_policy(bundle: Arc<Bundle>, error: &Error, ctx: Arc<Ctx>) -> Action {
    retry::error_policy(
        CONTROLLER,
        bundle.as_ref(),
        error,
        &ctx.retries,
        &ctx.metrics,
    )
}

/// One Bundle reconcile: read → pure plan → execute → report.
async fn apply(bundle: &Arc<Bundle>, ctx: &Ctx) -> Result<Action, Error> {
    // Read: caches, sources, the recorded chart version, reverse sync's lines.
    let Some(seen) = read::read(ctx, bundle).await? else {
        // The poll controller has not looked at this spec yet; its write wakes us.
        return Ok(Action::await_change());
    };
    // Plan: targeting, templates, copies, the copy limit and dependsOn.
    let Some((mut seen, planned)) = planning::plan_blocking(seen).await else {
        // The runtime is shutting down.
        return Ok(Action::await_change());
    };
    let started = Instant::now();
    let mut facts = BundleFacts {
        paused: seen.bundle.spec.paused,
        ..Default::default()
    };
    let (writes, requeue) = match planned {
        // Never untarget on a selector we cannot evaluate: leave everything as it is.
        Err(error) => {
            facts.targeting_error = Some(error.to_string());
            (execute::Writes::default(), None)
        }
        Ok(gated) => {
            // Rollouts in waves: which clusters are released, held or rolled back.
            let waves = waves::step(ctx, &seen, &gated.plan, &mut facts).await?;
            let deletions = planning::untargeted(&seen, &gated.plan);
            // Execute.
            let writes =
                execute::run(ctx, &mut seen, &gated.plan, waves.as_ref(), deletions).await?;
            report::planned(ctx, &seen, gated, &mut facts);
            (writes, waves.and_then(|w| w.gate.next))
        }
    };
    // Report.
    report::report(ctx, &seen, facts, writes, started).await?;
    // A rollout comes back at its next deadline or soak end; any other waits for a change.
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Deletes every BundleDeployment of the Bundle; the agent's finalizer then cleans up
/// downstream, and the garbage collector removes the copies with their BundleDeployment.
async fn cleanup(bundle: &Bundle, ctx: &Ctx) -> Result<Action, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    ctx.sources.remove(&(ns.clone(), bundle.name_any()));
    ctx.upstream
        .lines
        .lock()
        .expect("lines")
        .remove(&(ns.clone(), bundle.name_any()));
    if ctx.config.shard_id.is_none()
        && let Some(op) = shards::stale_shard_finalizers(bundle, &ctx.shards_serving(&ns))
    {
        ctx.exec.execute(op).await?;
    }
    let deletes: Vec<Op> = observe::deployments_of(ctx, bundle)
        .iter()
        .filter(|bd| bd.metadata.deletion_timestamp.is_none())
        .map(|bd| ops::delete_deployment_op(bd))
        .collect();
    for outcome in ctx.exec.execute_in_order(deletes).await? {
        if outcome.wrote {
            ctx.hub.bundle_deployments_deleted.inc();
        }
    }
    // The rollout state is in the hub's namespace, out of reach of the Bundle's owner
    // reference: it goes here, with the Bundle (a strategy now, or one in status before).
    let rolled_out = bundle.spec.rollout_strategy.is_some()
        || bundle
            .status
            .as_ref()
            .is_some_and(|s| s.unavailable.is_some());
    if rolled_out {
        let shard = ctx.config.shard_id.as_deref();
        ctx.rollout_writes
            .forget(&tender_types::names::rollout_secret(
                &ns,
                &bundle.name_any(),
                shard,
            ));
        ctx.exec
            .execute(revisions::delete_op(
                bundle,
                shard,
                ctx.config.own_namespace(),
            ))
            .await?;
    }
    Ok(Action::await_change())
}
