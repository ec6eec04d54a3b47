//! The Bundle reconcile's execute step: the plan's writes, through the shared executor — each
//! released cluster's copies and BundleDeployment (at most [`FANOUT_CONCURRENCY`] clusters at
//! a time), the previous revision of each rolled-back cluster, then the deletions of
//! untargeted clusters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::stream::{FuturesUnordered, StreamExt};
use kube::ResourceExt;
use tender_runtime::Op;
use tender_types::{Bundle, BundleDeployment, labels, names};

use super::ops::{self, CopyStep, DeploymentStep, LiveCopy, SourceObject};
use super::plan::{self, DesiredCopy, SourceKey};
use super::read::Seen;
use super::{FANOUT_CONCURRENCY, observe, revisions, rollout, waves};
use crate::Error;
use crate::context::Ctx;

/// What the execute step wrote, for counts, events, logs and status.
#[derive(Default)]
pub(super) struct Writes {
    pub(super) created: usize,
    pub(super) updated: usize,
    pub(super) copies: usize,
    pub(super) deleted: usize,
    /// Clusters whose BundleDeployment the apiserver refused for its size, sorted.
    pub(super) too_large: Vec<String>,
}

/// What one cluster's writes came to.
#[derive(Default)]
struct ClusterWrites {
    created: bool,
    updated: bool,
    copies: usize,
    /// The cluster, when the apiserver refused its BundleDeployment for its size (nothing
    /// else was written for it).
    too_large: Option<String>,
}

/// Runs `plan` for the Bundle `seen` read: released clusters, rollbacks, then `deletions`.
pub(super) async fn run(
    ctx: &Ctx,
    seen: &mut Seen,
    plan: &plan::Plan,
    waves: Option<&waves::Waves>,
    deletions: Vec<Op>,
) -> Result<Writes, Error> {
    let bundle: &Bundle = &seen.bundle;
    if let Some(w) = waves {
        write_rollout_state(ctx, w).await?;
    }
    // A halted gate (invalid strategy or state) releases nothing already deployed.
    let invalid_strategy = bundle.spec.rollout_strategy.is_some() && waves.is_none();
    let fetched = Mutex::new(std::mem::take(&mut seen.fetched));
    // A cluster's future is made when it starts, never more than FANOUT_CONCURRENCY alive:
    // each holds a few KB, and collecting one per cluster first cost 8.5 MB per 1 000
    // clusters and Bundle reconcile (decision 0061-bundle-reconcile-holds-manifests-once). A
    // closure inside the stream type trips async Send checks, hence the explicit window.
    let mut pending = plan.deployments.iter();
    let mut rollbacks = Vec::new();
    let mut running = FuturesUnordered::new();
    let mut results: Vec<Result<ClusterWrites, Error>> = Vec::new();
    loop {
        while running.len() < FANOUT_CONCURRENCY
            && let Some(d) = pending.next()
        {
            let existing = seen.existing.contains_key(&d.namespace);
            match waves::decision(waves, &d.cluster) {
                // An invalid strategy releases nothing that is deployed already.
                _ if invalid_strategy && existing => continue,
                rollout::Decision::Hold => continue,
                rollout::Decision::Rollback => {
                    rollbacks.push(d);
                    continue;
                }
                rollout::Decision::Release => {}
            }
            let live = seen.copies_by_ns.get(&d.namespace).map(Vec::as_slice);
            running.push(write_cluster(
                ctx,
                bundle,
                d,
                plan.spec(d),
                seen.existing.get(&d.namespace),
                live,
                &fetched,
            ));
        }
        match running.next().await {
            Some(result) => results.push(result),
            None => break,
        }
    }
    let mut writes = Writes::default();
    if let Some(w) = waves {
        for d in rollbacks {
            writes.updated += write_rollback(ctx, bundle, d, &w.snapshot).await?;
        }
    }
    for result in results {
        let w = result?;
        writes.too_large.extend(w.too_large);
        writes.created += usize::from(w.created);
        writes.updated += usize::from(w.updated);
        writes.copies += w.copies;
    }
    writes.too_large.sort();
    for outcome in ctx.exec.execute_in_order(deletions).await? {
        writes.deleted += 1;
        if outcome.wrote {
            ctx.hub.bundle_deployments_deleted.inc();
        }
    }
    Ok(writes)
}

/// The rollout state and the previous revisions the gate kept, written before any cluster
/// (a failure then rolls back to what is kept), remembered until the cache shows it
/// (decision 0121), then the gate's Events.
async fn write_rollout_state(ctx: &Ctx, waves: &waves::Waves) -> Result<(), Error> {
    if let Some(op) = &waves.state_write {
        let outcome = ctx.exec.execute(op.clone()).await?;
        if let Some(secret) = outcome
            .object
            .and_then(|o| serde_json::to_value(o).ok())
            .and_then(|v| serde_json::from_value(v).ok())
        {
            ctx.rollout_writes.record(secret);
        }
    }
    ctx.exec.execute_in_order(waves.events.clone()).await?;
    Ok(())
}

/// Writes one cluster's BundleDeployment and copies where they differ from the desired ones,
/// and deletes copies no entry wants any more. `spec` is `desired`'s whole spec
/// ([`plan::Plan::spec`]), made as the cluster starts so only the clusters in flight hold one.
///
/// Copies go before the BundleDeployment that names their hashes whenever it already exists
/// (a rotation): the agent then finds each copy in place when the new BundleDeployment
/// arrives, and holds the old one while a copy is ahead of it. Written the other way round,
/// an agent reconciling between the two writes reported the copy `Missing` (CopyFailed,
/// Ready=False) and then Ready again: ~7% of cluster rotations at 200 agents, each two
/// extra status writes. A new BundleDeployment goes first: its copies are owned by its uid.
async fn write_cluster(
    ctx: &Ctx,
    bundle: &Bundle,
    desired: &plan::DesiredDeployment,
    spec: Option<tender_types::BundleDeploymentSpec>,
    snapshot: Option<&Arc<BundleDeployment>>,
    live_copies: Option<&[LiveCopy]>,
    fetched: &Mutex<HashMap<SourceKey, SourceObject>>,
) -> Result<ClusterWrites, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let bd_name = names::bundle_deployment_name(&name);
    let live = observe::live_deployment(ctx, &desired.namespace, &bd_name);
    let live = live.as_ref().or(snapshot);
    let mut writes = ClusterWrites::default();
    let shard = ctx.config.shard_id.as_deref();
    let step = ops::deployment_step(
        &ns,
        &name,
        desired,
        spec.as_ref(),
        live.map(AsRef::as_ref),
        shard,
    );
    drop(spec);
    if !matches!(step, DeploymentStep::Hold) && !desired.copies.is_empty() {
        publish_chain(ctx, &desired.namespace).await?;
    }
    // The uid the copies were written with before the BundleDeployment, if they were.
    let mut copies_for = None;
    let uid = match step {
        DeploymentStep::Hold => return Ok(writes),
        DeploymentStep::Current { uid } => {
            ctx.hub.bundle_deployments_skipped.inc();
            uid
        }
        DeploymentStep::Write(op) => {
            if let Some(uid) = live.and_then(|bd| bd.uid()) {
                writes.copies += write_copies(ctx, bundle, desired, &uid, fetched).await?;
                copies_for = Some(uid);
            }
            let outcome = match ctx.exec.execute(*op).await {
                // Reported on the Bundle (`TooLarge`); retrying cannot help until it changes.
                Err(e) if e.is_too_large() => {
                    tracing::warn!(bundle = %name, namespace = %desired.namespace, %e, "BundleDeployment too large to store");
                    writes.too_large = Some(desired.cluster.clone());
                    return Ok(writes);
                }
                other => other?,
            };
            if outcome.wrote {
                ctx.hub.bundle_deployments_written.inc();
                writes.created = live.is_none();
                writes.updated = live.is_some();
            } else {
                ctx.hub.bundle_deployments_skipped.inc();
            }
            outcome.uid.unwrap_or_default()
        }
    };
    // After a new BundleDeployment, or when the cached one was gone and a new uid came back.
    if copies_for.as_deref() != Some(uid.as_str()) {
        writes.copies += write_copies(ctx, bundle, desired, &uid, fetched).await?;
    }
    let stale = ops::stale_copy_ops(
        &desired.namespace,
        live_copies.unwrap_or_default(),
        &desired.copies,
    );
    for outcome in ctx.exec.execute_in_order(stale).await? {
        if outcome.wrote {
            ctx.hub.copies_deleted.inc();
        }
    }
    Ok(writes)
}

/// Writes the copies of `desired` that differ from the live ones, owned by BundleDeployment
/// `uid`, from the Bundle's sources; how many were written.
async fn write_copies(
    ctx: &Ctx,
    bundle: &Bundle,
    desired: &plan::DesiredDeployment,
    uid: &str,
    fetched: &Mutex<HashMap<SourceKey, SourceObject>>,
) -> Result<usize, Error> {
    let to = CopyOwner::of(ctx, bundle, desired, uid);
    let mut written = 0;
    for copy in &desired.copies {
        written += usize::from(write_copy(ctx, &to, copy, Content::Source(fetched)).await?);
    }
    Ok(written)
}

/// Where a copy's content comes from: the Bundle's source (a release or a rotation), or the
/// body kept with the previous revision (a rollback).
pub(super) enum Content<'a> {
    Source(&'a Mutex<HashMap<SourceKey, SourceObject>>),
    Kept(serde_json::Value),
}

/// Who a cluster's copies belong to: the Bundle, the cluster namespace and the
/// BundleDeployment owning them.
pub(super) struct CopyOwner {
    bundle_ns: String,
    cluster_ns: String,
    owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    labels: std::collections::BTreeMap<String, String>,
}

impl CopyOwner {
    pub(super) fn of(
        ctx: &Ctx,
        bundle: &Bundle,
        desired: &plan::DesiredDeployment,
        uid: &str,
    ) -> Self {
        let ns = bundle.namespace().unwrap_or_default();
        let name = bundle.name_any();
        let shard = ctx.config.shard_id.as_deref();
        Self {
            labels: ops::owned_labels(&ns, &name, &desired.cluster, &desired.namespace, shard),
            owner: ops::copy_owner(&name, uid.to_string()),
            cluster_ns: desired.namespace.clone(),
            bundle_ns: ns,
        }
    }
}

/// Writes one copy where the live one differs (signed anew, later than the live copy: an
/// agent takes a rollback as it takes a rotation); whether it was written. The one path by
/// which the hub signs and writes a copy.
pub(super) async fn write_copy(
    ctx: &Ctx,
    to: &CopyOwner,
    copy: &plan::DesiredCopy,
    content: Content<'_>,
) -> Result<bool, Error> {
    let keys = ctx.keys();
    let live = observe::live_copy(ctx, copy.kind, &to.cluster_ns, &copy.copy_name);
    let CopyStep::Write { replace } = ops::copy_step(copy, live.as_ref(), &to.owner.uid, &keys)
    else {
        ctx.hub.copies_skipped.inc();
        return Ok(false);
    };
    let signed_at = next_signed_at(ctx.clock.unix_millis(), live.as_ref());
    let live_version = live.and_then(|m| m.resource_version);
    let target = ops::CopyTarget {
        bundle_ns: &to.bundle_ns,
        cluster_ns: &to.cluster_ns,
        owner: &to.owner,
        labels: &to.labels,
        keys: &keys,
        signed_at,
    };
    let op = match content {
        Content::Source(fetched) => {
            // Written a moment ago and the cache has not caught up: no write, no source read.
            let copy_key = ops::copy_key(copy.kind, &to.cluster_ns, &copy.copy_name);
            let fingerprint = ops::copy_fingerprint(copy, &to.owner, live_version.clone());
            if replace.is_none() && ctx.exec.memo().written(&copy_key, &fingerprint).is_some() {
                ctx.hub.copies_skipped.inc();
                return Ok(false);
            }
            let key = (copy.source_kind.clone(), copy.source.clone());
            let Some(source) = observe::source_for_copy(ctx, &to.bundle_ns, &key, fetched).await?
            else {
                return Ok(false);
            };
            if replace.is_some() {
                tracing::info!(copy = %copy.copy_name, namespace = %to.cluster_ns, "copy edited by another field manager; recreating it");
            }
            ops::copy_op(&source, copy, &target, live_version, replace)
        }
        Content::Kept(body) => ops::kept_copy_op(body, copy, &target),
    };
    let wrote = ctx.exec.execute(op).await?.wrote;
    if wrote {
        ctx.hub.copies_written.inc();
    } else {
        ctx.hub.copies_skipped.inc();
    }
    Ok(wrote)
}

/// Publishes the hub's key chain in `cluster_ns` (ConfigMap `tender-hub-keys`) before any copy
/// there is signed with a key it endorses; once per chain and namespace, and not at all
/// before the first roll (an empty chain).
async fn publish_chain(ctx: &Ctx, cluster_ns: &str) -> Result<(), Error> {
    let keys = ctx.keys();
    if keys.chain.links.is_empty() {
        return Ok(());
    }
    let chain = serde_json::to_string(&keys.chain).expect("chain serializes");
    let hash = tender_types::hash::sha256_hex(chain.as_bytes());
    if ctx.published_chains.lock().expect("chains").get(cluster_ns) == Some(&hash) {
        return Ok(());
    }
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names::HUB_KEYS_CONFIG_MAP,
            "namespace": cluster_ns,
            "labels": { labels::MANAGED_BY: labels::MANAGED_BY_VALUE },
        },
        "data": { names::HUB_KEYS_KEY: chain },
    });
    let op = tender_runtime::executor::Op::Apply(tender_runtime::executor::Apply {
        key: tender_runtime::executor::ObjectKey::of::<k8s_openapi::api::core::v1::ConfigMap>(
            Some(cluster_ns),
            names::HUB_KEYS_CONFIG_MAP,
        ),
        body,
        replace_if_immutable: false,
        fingerprint: None,
    });
    ctx.exec.execute(op).await?;
    ctx.published_chains
        .lock()
        .expect("chains")
        .insert(cluster_ns.to_string(), hash);
    Ok(())
}

/// The `signedAt` of a copy written at `now` (milliseconds since the epoch, from the hub's
/// clock), always after the live copy's, so an agent can refuse an older signed copy replayed
/// (decision 0089-signed-copies).
fn next_signed_at(now: u64, live: Option<&kube::api::ObjectMeta>) -> u64 {
    let live = live
        .and_then(|m| m.annotations.as_ref()?.get(labels::HUB_SIGNATURE).cloned())
        .and_then(|s| tender_types::signing::signed_at_of(&s));
    live.map_or(now, |l| now.max(l.saturating_add(1)))
}

/// Writes `cluster`'s previous revision (copies first, then its BundleDeployment), each only
/// where the live one differs; nothing when no previous revision was kept.
pub(super) async fn write_rollback(
    ctx: &Ctx,
    bundle: &Bundle,
    desired: &plan::DesiredDeployment,
    snapshot: &revisions::Snapshot,
) -> Result<usize, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let Some(spec) = revisions::previous_spec(snapshot, &desired.cluster) else {
        return Ok(0);
    };
    let bd_name = tender_types::names::bundle_deployment_name(&name);
    let Some(live) = observe::live_deployment(ctx, &desired.namespace, &bd_name) else {
        return Ok(0);
    };
    let Some(uid) = live.metadata.uid.clone() else {
        return Ok(0);
    };
    let shard = ctx.config.shard_id.as_deref();
    let to = CopyOwner::of(ctx, bundle, desired, &uid);
    let kept = revisions::previous_copies(
        snapshot,
        &desired.cluster,
        &desired.namespace,
        &to.owner,
        &to.labels,
    );
    // What is signed is hashed here, from the body written, never taken from the snapshot's
    // key: a copy that does not hash to what was kept rolls nothing back on this cluster
    // (decision 0112-rollout-state-in-the-hubs-namespace).
    let mut checked = Vec::new();
    for (kind, copy_name, content_hash, body) in kept {
        // The source this copy was made from, as the previous BundleDeployment lists it: the
        // signature covers its identity (decision 0089-signed-copies).
        let Some(entry) = spec
            .options
            .downstream_resources
            .iter()
            .find(|e| e.copy_name == copy_name)
        else {
            continue;
        };
        if revisions::content_hash_of(&body, entry.is_carried()).as_deref()
            != Some(content_hash.as_str())
        {
            tracing::warn!(
                cluster = %desired.cluster,
                copy = %copy_name,
                "a kept copy does not hash to what was kept: nothing rolled back there"
            );
            return Ok(0);
        }
        checked.push((kind, copy_name, content_hash, body, entry));
    }
    let mut written = 0;
    for (kind, copy_name, content_hash, body, entry) in checked {
        let want = DesiredCopy {
            kind,
            source_kind: tender_types::copy::CopyableKind {
                api_version: entry.api_version().to_string(),
                kind: entry.kind.clone(),
            },
            source: entry.name.clone(),
            copy_name,
            bytes: 0,
            hash: content_hash,
        };
        // Through the path a release's copies take: signed anew, later than the live copy.
        written += usize::from(write_copy(ctx, &to, &want, Content::Kept(body)).await?);
    }
    if let DeploymentStep::Write(op) =
        ops::deployment_step(&ns, &name, desired, Some(&spec), Some(&live), shard)
        && ctx.exec.execute(*op).await?.wrote
    {
        written += 1;
    }
    Ok(written)
}
