//! The Bundle reconcile's report step: the facts status is made from (the plan's, the
//! rollout gate's and the execute step's), the fan-out log and events, and the one status
//! write — the whole status on the unsharded replica, its own `status.shards` entry on a shard
//! replica. The status itself is built by [`super::status`].

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tender_runtime::Op;
use tender_types::{Bundle, BundleDeployment, hash};

use super::events;
use super::execute::Writes;
use super::planning::Gated;
use super::read::Seen;
use super::status::{self, BundleFacts, bundle_status};
use crate::Error;
use crate::context::{Ctx, status_op};
use crate::summary::summarize_with;

/// The facts of a planned reconcile: the plan's and its gates', and the current summary.
pub(super) fn planned(ctx: &Ctx, seen: &Seen, gated: Gated, facts: &mut BundleFacts) {
    let Gated {
        plan,
        copy_limit,
        depends,
    } = gated;
    let ns = seen.bundle.namespace().unwrap_or_default();
    let matched = plan.matched_namespaces(&ns);
    let current: Vec<&BundleDeployment> = seen
        .existing
        .iter()
        .filter(|(cns, bd)| matched.contains(*cns) && bd.metadata.deletion_timestamp.is_none())
        .map(|(_, bd)| bd.as_ref())
        .collect();
    facts.copy_limit = copy_limit;
    facts.dependency_error = depends.error;
    facts.held = depends.held;
    facts.matched = plan.matched.len();
    facts.summary = summarize_with(plan.matched.len(), current, |bd| {
        ctx.expected_deployment_id(bd)
    });
    facts.missing = plan.missing.into_iter().collect();
    facts.refused = plan.refused.into_iter().collect();
    facts.unsupported = plan.unsupported.into_iter().collect();
    facts.copy_disabled = plan.copy_disabled;
    facts.template_failed = plan.template_failed;
    facts.copies = plan.copies;
}

/// Logs and counts the fan-out, records its events and writes the Bundle's status.
pub(super) async fn report(
    ctx: &Ctx,
    seen: &Seen,
    mut facts: BundleFacts,
    writes: Writes,
    started: Instant,
) -> Result<(), Error> {
    let bundle = seen.bundle.as_ref();
    let Writes {
        created,
        updated,
        copies,
        deleted,
        too_large,
    } = writes;
    facts.too_large = too_large;
    if created + updated + copies + deleted > 0 {
        let elapsed = started.elapsed();
        ctx.hub.fanout_duration.observe(elapsed.as_secs_f64());
        tracing::info!(
            bundle = %bundle.name_any(), namespace = %bundle.namespace().unwrap_or_default(),
            created, updated, copies, deleted,
            elapsed_ms = elapsed.as_millis() as u64,
            "bundle fanned out"
        );
    }
    let reference = bundle.object_ref(&());
    ctx.exec
        .execute_in_order(events::fanout_events(&reference, created, deleted))
        .await?;
    write_status(bundle, ctx, &facts, seen.upstream.clone()).await
}

async fn write_status(
    bundle: &Bundle,
    ctx: &Ctx,
    facts: &BundleFacts,
    upstream: Option<Vec<tender_types::UpstreamPublication>>,
) -> Result<(), Error> {
    // Decide on the cache as it is now: the reconcile's snapshot may predate our own last
    // status write, whose watch event has since retired its memo entry.
    let latest = ctx.stores.bundles.get(&ObjectRef::from_obj(bundle));
    let bundle: &Bundle = latest.as_deref().unwrap_or(bundle);
    if let (Some(id), Some(exec)) = (&ctx.config.shard_id, &ctx.shard_exec) {
        return write_shard_entry(bundle, ctx, exec, id, facts, upstream).await;
    }
    let old = bundle.status.as_ref();
    let ns = bundle.namespace().unwrap_or_default();
    // The other replicas' entries, for shards that still serve a Cluster here.
    let entries = old.map(|o| o.shards.as_slice()).unwrap_or_default();
    let serving = ctx.shards_serving(&ns);
    let mut facts = facts.clone();
    let mut own_lines =
        upstream.unwrap_or_else(|| old.map(|o| o.upstream.clone()).unwrap_or_default());
    let folded = status::fold_shards(&facts.summary, entries, &serving);
    facts.matched = usize::try_from(folded.summary.desired_ready).unwrap_or_default();
    facts.summary = folded.summary;
    own_lines.extend(folded.upstream);
    let now = Time(ctx.clock.now());
    let mut new = bundle_status(old, &facts, bundle.metadata.generation, now.clone());
    crate::upstream::set_status(&mut new, own_lines, bundle.metadata.generation, now);
    // The shard entries and the poller's fields are never ours to write: left out of the
    // apply (and the comparison), server-side apply keeps them as their writers wrote them.
    let new = status::ours(new);
    let old_ours = old.cloned().map(status::ours);
    let desired = hash::value_hash(&serde_json::to_value(&new).unwrap_or_default());
    let op = status_op::<Bundle, _>(
        &ns,
        &bundle.name_any(),
        bundle.resource_version(),
        old_ours.as_ref(),
        &new,
        desired,
    );
    // Unchanged, or written a moment ago: neither a write nor the transition events again.
    let Some(op) = op.filter(|op| !ctx.status_just_written(op)) else {
        return Ok(());
    };
    let warnings = events::transition_events(&bundle.object_ref(&()), old, &new);
    ctx.exec.execute_in_order(warnings).await?;
    ctx.write_status(Some(op)).await
}

/// A shard replica's status write: its own entry of `status.shards` (its Clusters' counts and
/// reverse-sync lines), applied with its own field manager; nothing else
/// (decision 0062-hub-shards).
async fn write_shard_entry(
    bundle: &Bundle,
    ctx: &Ctx,
    exec: &tender_runtime::Executor,
    id: &str,
    facts: &BundleFacts,
    upstream: Option<Vec<tender_types::UpstreamPublication>>,
) -> Result<(), Error> {
    let old = bundle
        .status
        .as_ref()
        .and_then(|s| s.shards.iter().find(|e| e.id == id));
    // Targeting error: keep the previous lines (as the unsharded replica does).
    let upstream = upstream.unwrap_or_else(|| old.map(|e| e.upstream.clone()).unwrap_or_default());
    let entry = status::shard_entry(id, bundle.metadata.generation, &facts.summary, upstream);
    if old == Some(&entry) {
        return Ok(());
    }
    let key = tender_runtime::executor::ObjectKey::of::<Bundle>(
        Some(&bundle.namespace().unwrap_or_default()),
        &bundle.name_any(),
    );
    let fingerprint = tender_runtime::executor::Fingerprint {
        live_version: bundle.resource_version(),
        desired: hash::value_hash(&serde_json::to_value(&entry).unwrap_or_default()),
    };
    let op = Op::ApplyStatus(tender_runtime::executor::Apply {
        key,
        body: serde_json::json!({
            "apiVersion": tender_types::API_GROUP_VERSION,
            "kind": "Bundle",
            "status": {"shards": [entry]},
        }),
        replace_if_immutable: false,
        fingerprint: Some(fingerprint),
    });
    ctx.write_status_with(exec, op).await
}
