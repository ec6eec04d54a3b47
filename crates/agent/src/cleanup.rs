//! Removing what a BundleDeployment created downstream: on its deletion (finalizer), when
//! pruning, and at start-up for BundleDeployments that vanished while the agent was away.
//!
//! Every delete is preceded by a read of the object and a check of its owner annotation:
//! only objects owned by exactly this BundleDeployment of this cluster namespace are touched.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use tender_types::labels;
use tender_types::{BundleDeployment, Cluster, ObjectRef, ObjectState, ObjectStatus};

use crate::context::Context;
use crate::execute::Run;
use crate::hooks::HookEvent;
use crate::inventory::Recorded;
use crate::plan::{self, Owner, cluster_selector};
use crate::prune::remove_objects;
use crate::status::Outcome;
use crate::{Error, Result};
use crate::{observe, report};

/// Before the finalizer's cleanup of a BundleDeployment being deleted
/// (decision 0088-phased-deploy-and-helm-hooks): its chart's `pre-delete` hooks, then its objects
/// removed, then its `post-delete` hooks. `Some(action)` while a hook runs or failed (the
/// finalizer stays: nothing is removed before every `pre-delete` hook succeeded); `None` once
/// [`finalize`] may finish. The hooks' own objects (this removal's record of them) and the copies
/// go last, with the inventory.
pub(crate) async fn before_finalize(
    bd: &BundleDeployment,
    ctx: &Context,
) -> Result<Option<Action>> {
    if bd.spec.helm.is_none() {
        return Ok(None);
    }
    let owner = Owner::new(&ctx.config.cluster_namespace, &bd.name_any());
    // Only a release that was installed is uninstalled with its hooks. Without an inventory
    // recording one, there is none — or this removal is already done and this is a late
    // event of the BundleDeployment (its finalizer just removed): starting the hooks again
    // would leave them behind.
    if ctx
        .read_inventory(&owner)
        .await?
        .is_none_or(|r| r.chart_release.is_none())
    {
        return Ok(None);
    }
    let writer = ctx
        .identities
        .cleanup_writer(bd.spec.options.service_account.as_deref());
    let mut hooks = Vec::new();
    if let Some(wait) =
        removal_hooks(ctx, bd, &owner, &writer, HookEvent::PreDelete, &mut hooks).await?
    {
        return Ok(Some(wait));
    }
    // The copies go last (in `finalize`): the chart's values and repository credentials are
    // read from them, and the post-delete hooks render from the same chart.
    let copies = &bd.spec.options.downstream_resources;
    let is_copy = |k: &ObjectRef| {
        copies
            .iter()
            .any(|e| e.kind == k.kind && e.name == k.name && e.api_version() == k.api_version)
    };
    // Nor are the post-delete hooks' objects removed here: after a first pass they are
    // recorded too, and removing them would start them again (the render is remembered).
    if let Ok(post) = observe::removal_hooks(ctx, bd, &owner, HookEvent::PostDelete).await {
        hooks.extend(post.iter().map(plan::Entry::key));
    }
    let recorded = ctx.read_inventory(&owner).await?.unwrap_or_default();
    let objects: Vec<ObjectRef> = recorded
        .objects
        .into_iter()
        .filter(|k| !hooks.contains(k) && !is_copy(k))
        .collect();
    remove_objects(
        ctx,
        &writer,
        &owner,
        &objects,
        bd.spec.options.keep_resources,
    )
    .await?;
    removal_hooks(ctx, bd, &owner, &writer, HookEvent::PostDelete, &mut hooks).await
}

/// Finalizer cleanup of a BundleDeployment being deleted (after [`before_finalize`]): delete
/// its objects (or strip them with keepResources or `helm.sh/resource-policy: keep`), then its
/// inventory. An error keeps the finalizer (retried).
pub(crate) async fn finalize(bd: &BundleDeployment, ctx: &Context) -> Result<Action> {
    let owner = Owner::new(&ctx.config.cluster_namespace, &bd.name_any());
    // Without an inventory (never deployed by this agent version) fall back to the status.
    let recorded = match ctx.read_inventory(&owner).await? {
        Some(recorded) => recorded,
        None => Recorded {
            objects: bd
                .status
                .iter()
                .flat_map(|s| s.resources.iter().map(ObjectStatus::object))
                .collect(),
            ..Default::default()
        },
    };
    let writer = ctx
        .identities
        .cleanup_writer(bd.spec.options.service_account.as_deref());
    remove_objects(
        ctx,
        &writer,
        &owner,
        &recorded.objects,
        bd.spec.options.keep_resources,
    )
    .await?;
    ctx.inventory.delete(&owner, recorded.uid).await?;
    tracing::info!(bundle_deployment = %owner.annotation(), objects = recorded.objects.len(), keep = bd.spec.options.keep_resources, "cleaned up downstream");
    Ok(Action::await_change())
}

/// Runs the removal hooks of `event`, recording their objects in the inventory first (their
/// keys added to `objects`). `Some(action)`: not done (running, failed, or the chart not rendered — then the
/// status says so and the removal waits); `None`: every hook succeeded.
async fn removal_hooks(
    ctx: &Context,
    bd: &BundleDeployment,
    owner: &Owner,
    writer: &tender_runtime::Executor,
    event: HookEvent,
    objects: &mut Vec<ObjectRef>,
) -> Result<Option<Action>> {
    if bd.spec.helm.is_none() {
        return Ok(None);
    }
    let entries = match observe::removal_hooks(ctx, bd, owner, event).await {
        Ok(entries) => entries,
        Err(why) => {
            // The chart cannot be rendered: its hooks are unknown. The removal goes on without
            // them (an unreachable repository must not keep a deleted Bundle forever); said.
            tracing::warn!(bundle_deployment = %owner.annotation(), event = event.as_str(), reason = %why, "removal hooks not run: chart not rendered");
            return Ok(None);
        }
    };
    if entries.is_empty() {
        return Ok(None);
    }
    let keys: Vec<ObjectRef> = entries.iter().map(plan::Entry::key).collect();
    let before = ctx.read_inventory(owner).await?;
    let record = plan::union(
        before
            .as_ref()
            .map(|r| r.objects.as_slice())
            .unwrap_or_default(),
        &keys,
    );
    ctx.inventory
        .write(
            owner,
            before.as_ref(),
            &record,
            before.as_ref().and_then(|r| r.chart_release.as_deref()),
        )
        .await?;
    for k in keys {
        if !objects.contains(&k) {
            objects.push(k);
        }
    }
    let run = Run {
        ctx,
        writer,
        owner,
        mode: plan::Mode {
            pending: true,
            correct_drift: false,
            take_ownership: false,
        },
        run: &bd.spec.deployment_id,
        hook_timeout: observe::hook_timeout(bd),
        failed_hooks: &plan::failed_hooks(bd.status.as_ref(), &bd.spec.deployment_id),
        namespace_meta: plan::NamespaceMeta::default(),
    };
    let phase = plan::PlannedPhase {
        phase: plan::Phase::Hooks(event),
        entries,
    };
    let hooks = plan::DeployPlan {
        record: Vec::new(),
        desired: Vec::new(),
        namespaces: Vec::new(),
        phases: vec![phase],
        prune: Vec::new(),
        record_write: None,
        final_write: None,
        keep: bd.spec.options.keep_resources,
    };
    let executed = run.execute(&hooks).await;
    for resource in &executed.watch {
        ctx.drift.ensure(resource);
    }
    let statuses: Vec<ObjectStatus> = executed.phases.into_iter().flat_map(|(_, s)| s).collect();
    if statuses
        .iter()
        .all(|s| s.state == ObjectState::Ready || crate::policy::is_refused(s))
    {
        return Ok(None);
    }
    let failed = statuses.iter().any(|s| s.state == ObjectState::Error);
    let outcome = Outcome {
        deployment_id: bd.spec.deployment_id.clone(),
        generation: bd.metadata.generation,
        applied_id: bd
            .status
            .as_ref()
            .and_then(|s| s.applied_deployment_id.clone()),
        manifests: statuses
            .into_iter()
            .filter(|s| s.state != ObjectState::Ready)
            .collect(),
        ..Default::default()
    };
    report::report(ctx, bd, &outcome).await?;
    Ok(Some(if failed {
        Action::requeue(ctx.config.removal_hook_retry)
    } else {
        Action::requeue(ctx.config.hook_poll)
    }))
}

/// Whether the start-up sweep may run, from the agent's Cluster as the hub shows it right
/// after the list of BundleDeployments (decision 0081-an-agent-sweeps-only-for-a-live-cluster).
/// Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SweepGate {
    /// The Cluster exists and is not being deleted: the list is of a live cluster namespace.
    Sweep,
    /// The Cluster is being deleted: the hub removes its BundleDeployments (and, if this agent
    /// reports in, waits for their finalizers); leftovers of vanished ones are not swept.
    SkipDeleting,
    /// The Cluster does not exist: an empty list means nothing (the namespace may be gone), so
    /// nothing is swept and the agent does not start.
    ClusterGone,
}

/// See [`SweepGate`].
pub(crate) fn sweep_gate(cluster: Option<&Cluster>) -> SweepGate {
    match cluster {
        None => SweepGate::ClusterGone,
        Some(c) if c.metadata.deletion_timestamp.is_some() => SweepGate::SkipDeleting,
        Some(_) => SweepGate::Sweep,
    }
}

/// Whether a hub error means the hub no longer accepts this agent's identity (its Cluster
/// was deleted and with it the ServiceAccount, its access was revoked, or its token expired).
/// Pure.
pub(crate) fn access_lost(reason: &str) -> bool {
    matches!(reason, "Unauthorized" | "Forbidden")
}

/// Start-up sweep. `existing` is the result of a SUCCESSFUL list of BundleDeployments on the
/// hub; every candidate is also confirmed absent with a GET (404) before anything is removed,
/// and any hub error aborts the sweep (retried) instead of deleting.
pub(crate) async fn sweep(ctx: &Context, existing: &BTreeSet<String>) -> Result<()> {
    let ns = &ctx.config.cluster_namespace;
    let mut vanished: BTreeSet<Owner> = BTreeSet::new();
    let mut objects: Vec<(Owner, Recorded)> = ctx.inventory.list(ns).await?;
    // Copies whose inventory is lost: find them by label.
    let selector = format!("{},!{}", cluster_selector(ns), labels::INVENTORY);
    let lp = ListParams::default().labels(&selector);
    let secrets: Api<Secret> = Api::all(ctx.down.client.clone());
    let config_maps: Api<ConfigMap> = Api::all(ctx.down.client.clone());
    let mut strays: Vec<(Owner, ObjectRef)> = Vec::new();
    let secret_metas = secrets
        .list_metadata(&lp)
        .await
        .map_err(|e| Error::kube(format!("list Secrets of {ns} downstream"), true, e))?
        .items
        .into_iter()
        .map(|m| ("Secret", m.metadata));
    let config_map_metas = config_maps
        .list_metadata(&lp)
        .await
        .map_err(|e| Error::kube(format!("list ConfigMaps of {ns} downstream"), false, e))?
        .items
        .into_iter()
        .map(|m| ("ConfigMap", m.metadata));
    for (kind, m) in secret_metas.chain(config_map_metas) {
        if let Some(owner) = m
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::OWNER_ANNOTATION))
            .and_then(|a| Owner::parse(a))
        {
            let name = m.name.clone().unwrap_or_default();
            strays.push((
                owner,
                ObjectRef::new("v1", kind, m.namespace.as_deref(), &name),
            ));
        }
    }
    for (owner, key) in strays {
        match objects.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, recorded)) => recorded.objects.push(key),
            None => objects.push((
                owner,
                Recorded {
                    objects: vec![key],
                    ..Default::default()
                },
            )),
        }
    }
    for (
        owner,
        Recorded {
            uid, objects: list, ..
        },
    ) in objects
    {
        if owner.cluster_namespace != *ns || existing.contains(&owner.name) {
            continue;
        }
        // Confirm with the hub: only a 404 counts as gone.
        match ctx.bds.get_opt(&owner.name).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(e) => {
                return Err(Error::kube(
                    format!("confirm BundleDeployment {ns}/{} is gone", owner.name),
                    false,
                    e,
                ));
            }
        }
        let list = plan::union(&list, &[]);
        tracing::info!(bundle_deployment = %owner.annotation(), objects = list.len(), "sweeping leftovers of a BundleDeployment that no longer exists");
        // Honour each object's own keep-resources marker (keep = false here). The deployment is
        // gone, and with it the ServiceAccount it named: its leftovers are removed as the
        // default one. One this identity may not remove is left, with its inventory, for the
        // owner (a refusal must not stop the agent from starting).
        let writer = ctx.identities.cleanup_writer(None);
        if let Err(e) = remove_objects(ctx, &writer, &owner, &list, false).await {
            if e.reason() != "Forbidden" {
                return Err(e);
            }
            tracing::warn!(bundle_deployment = %owner.annotation(), error = %e, "leftovers not swept: forbidden for the Bundle ServiceAccount; remove them by hand");
            continue;
        }
        for _ in &list {
            ctx.metrics.swept();
        }
        ctx.inventory.delete(&owner, uid).await?;
        vanished.insert(owner);
    }
    if !vanished.is_empty() {
        tracing::info!(count = vanished.len(), "start-up sweep done");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn the_sweep_runs_only_for_a_cluster_that_exists_and_is_not_being_deleted() {
        let mut cluster = Cluster::new("east", Default::default());
        assert_eq!(sweep_gate(Some(&cluster)), SweepGate::Sweep);
        cluster.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(10).unwrap()));
        assert_eq!(sweep_gate(Some(&cluster)), SweepGate::SkipDeleting);
        assert_eq!(sweep_gate(None), SweepGate::ClusterGone);
    }

    #[test]
    fn only_refusals_of_the_identity_are_a_lost_access() {
        assert!(access_lost("Unauthorized"));
        assert!(access_lost("Forbidden"));
        for other in ["NotFound", "RequestFailed", "ApiError", "TooManyRequests"] {
            assert!(!access_lost(other), "{other}");
        }
    }
}
