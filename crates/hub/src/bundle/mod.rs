//! Bundle controller: resolve targets, write one BundleDeployment per targeted cluster and the
//! copies it needs, remove what is no longer wanted, and fold it all into the Bundle's status.
//!
//! Observe ([`observe`]: caches, and the sources whose content a copy needs) → plan ([`plan`]
//! targeting, [`ops`] operations, [`events`], [`shards`] finalizers, [`status`]) → execute
//! (the shared executor, at most [`FANOUT_CONCURRENCY`] clusters at a time).

pub(crate) mod depends;
mod events;
mod observe;
mod ops;
pub mod plan;
mod planning;
mod poll;
mod revisions;
pub mod rollout;
mod shards;
pub mod status;
mod waves;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tender_runtime::Op;
use tender_runtime::retry;
use tender_types::{Bundle, BundleDeployment, BundleStatus, hash, labels, names};

use crate::Error;
use crate::context::{Ctx, status_op};
use crate::summary::summarize_with;
use ops::{CopyStep, DeploymentStep, LiveCopy, SourceObject};
use plan::SourceKey;
use status::{BundleFacts, bundle_status};

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

/// What one cluster's writes came to, for counts, events and logs.
#[derive(Default)]
struct ClusterWrites {
    created: bool,
    updated: bool,
    copies: usize,
    /// The cluster, when the apiserver refused its BundleDeployment for its size (nothing
    /// else was written for it).
    too_large: Option<String>,
}

async fn apply(shared: &Arc<Bundle>, ctx: &Ctx) -> Result<Action, Error> {
    let bundle: &Bundle = shared;
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let copying = plan::Copying {
        enabled: ctx.config.copy_resources_downstream,
        allowed: ctx.config.copyable_kinds.clone(),
    };
    let copy_enabled = copying.enabled;

    // Index first, then read: a source change after this point always reaches us again.
    let refs = if copy_enabled {
        plan::referenced_sources(&bundle.spec)
    } else {
        BTreeSet::new()
    };
    ctx.sources.set(
        &(ns.clone(), name.clone()),
        refs.iter()
            .map(|(kind, source)| {
                let source_ns = observe::source_namespace(ctx, &ns, kind);
                (source_ns, kind.clone(), source.clone())
            })
            .collect(),
    );
    let mut fetched = HashMap::new();
    let mut sources = BTreeMap::new();
    for key in &refs {
        let state = observe::source_state(ctx, &ns, key, &mut fetched).await?;
        sources.insert(key.clone(), state);
    }

    // `pollingInterval`: the chart version to deploy, looked up at most once per interval.
    let polled = poll::look(ctx, bundle, &sources).await;
    let spec = poll::resolved_spec(&bundle.spec, polled.as_ref().map(|p| &p.0));

    // Targeting is unchanged, over this replica's Clusters only (decision 0062-hub-shards).
    // Where a cluster's BundleDeployment goes is the namespace the hub created for it, never
    // what the Cluster's status (which its agent may write) says
    // (decision 0073-hub-writes-where-it-derives).
    let clusters = ctx.own_clusters_in(&ns);
    let owned: Vec<Option<String>> = clusters.iter().map(|c| ctx.owned_namespace(c)).collect();
    let groups = observe::groups_in(ctx, &ns);
    let input = planning::Planning {
        bundle: Arc::clone(shared),
        report: polled.as_ref().map(|p| p.0.clone()),
        clusters,
        owned,
        groups,
        sources,
        copying,
    };
    let Some((input, planned)) = planning::plan_blocking(input).await else {
        // The runtime is shutting down.
        return Ok(Action::await_change());
    };
    let planning::Planning {
        clusters,
        owned,
        groups,
        sources,
        ..
    } = input;
    let views = planning::cluster_views(&clusters, &owned, &ns);
    let group_infos = planning::group_infos(&groups);
    let existing = observe::deployments_of(ctx, bundle);

    let mut facts = BundleFacts {
        paused: bundle.spec.paused,
        polled: polled.as_ref().map(|p| p.0.clone()),
        ..Default::default()
    };
    let (mut created, mut updated, mut copies, mut deleted) = (0, 0, 0, 0);
    let started = Instant::now();
    let mut upstream = None;
    let mut requeue = None;
    match planned {
        // Never untarget on a selector we cannot evaluate: leave everything as it is.
        Err(error) => facts.targeting_error = Some(error.to_string()),
        Ok(mut plan) => {
            let limit = ctx.config.max_copied_bytes_per_bundle;
            if plan.hold_copies_over(limit) {
                facts.copy_limit = Some((plan.copied_bytes, limit));
            }
            // dependsOn: clusters whose dependencies are not in an accepted state there are
            // held (decision 0097-depends-on-per-cluster).
            if !bundle.spec.depends_on.is_empty() {
                let gate = observe::dependencies_gate(ctx, bundle, &mut plan);
                facts.dependency_error = gate.error;
                facts.held = gate.held;
            }
            let by_ns: HashMap<String, Arc<BundleDeployment>> = existing
                .iter()
                .map(|bd| (bd.namespace().unwrap_or_default(), bd.clone()))
                .collect();
            let copies_by_ns = observe::bundle_copies(ctx, &ns, &name);
            // Rollouts in waves (decision 0093-rollout-waves): which clusters are released.
            let waves = match &bundle.spec.rollout_strategy {
                None => None,
                Some(strategy) => {
                    let input = waves::GateInput {
                        strategy,
                        spec: &spec,
                        plan: &plan,
                        views: &views,
                        groups: &group_infos,
                        by_ns: &by_ns,
                        copies_by_ns: &copies_by_ns,
                        sources: &sources,
                    };
                    match waves::gate(ctx, bundle, &input).await? {
                        Ok(w) => Some(w),
                        // Its Event comes with the status write (events::transition_events).
                        Err(halt) => {
                            facts.rollout = Some(status::RolloutFacts::halted(&halt));
                            None
                        }
                    }
                }
            };
            // A halted gate (invalid strategy or state) releases nothing already deployed.
            let invalid_strategy = bundle.spec.rollout_strategy.is_some() && waves.is_none();
            if let Some(w) = &waves {
                requeue = w.gate.next;
                facts.rollout = Some(status::RolloutFacts::of(&w.gate));
                let reference = bundle.object_ref(&());
                ctx.exec
                    .execute_in_order(events::rollout_events(&reference, &w.gate.events))
                    .await?;
            }
            let fetched = Mutex::new(std::mem::take(&mut fetched));
            // A cluster's future is made when it starts, never more than FANOUT_CONCURRENCY
            // alive: each holds a few KB, and collecting one per cluster first cost 8.5 MB per
            // 1 000 clusters and Bundle reconcile
            // (decision 0061-bundle-reconcile-holds-manifests-once). A closure inside the stream
            // type trips async Send checks, hence the explicit window.
            let mut pending = plan.deployments.iter();
            let mut rollbacks = Vec::new();
            let mut running = FuturesUnordered::new();
            let mut results: Vec<Result<ClusterWrites, Error>> = Vec::new();
            loop {
                while running.len() < FANOUT_CONCURRENCY
                    && let Some(d) = pending.next()
                {
                    let existing = by_ns.contains_key(&d.namespace);
                    match waves::decision(waves.as_ref(), &d.cluster) {
                        // An invalid strategy releases nothing that is deployed already.
                        _ if invalid_strategy && existing => continue,
                        rollout::Decision::Hold => continue,
                        rollout::Decision::Rollback => {
                            rollbacks.push(d);
                            continue;
                        }
                        rollout::Decision::Release => {}
                    }
                    let live = copies_by_ns.get(&d.namespace).map(Vec::as_slice);
                    running.push(write_cluster(
                        ctx,
                        bundle,
                        d,
                        plan.spec(d),
                        by_ns.get(&d.namespace),
                        live,
                        &fetched,
                    ));
                }
                match running.next().await {
                    Some(result) => results.push(result),
                    None => break,
                }
            }
            if let Some(w) = &waves {
                for d in rollbacks {
                    updated += waves::write_rollback(ctx, bundle, d, &w.snapshot).await?;
                }
            }
            for result in results {
                let w = result?;
                facts.too_large.extend(w.too_large);
                created += usize::from(w.created);
                updated += usize::from(w.updated);
                copies += w.copies;
            }
            let matched_ns: BTreeSet<String> = plan
                .matched
                .iter()
                .map(|c| names::cluster_namespace(&ns, c))
                .collect();
            let untargeted: Vec<Op> = existing
                .iter()
                .filter(|bd| bd.metadata.deletion_timestamp.is_none())
                .filter(|bd| !matched_ns.contains(&bd.namespace().unwrap_or_default()))
                // Its Cluster moved to another shard: that replica adopts it.
                .filter(|bd| !ctx.served_elsewhere(bd.labels()))
                .map(|bd| ops::delete_deployment_op(bd))
                .collect();
            for outcome in ctx.exec.execute_in_order(untargeted).await? {
                deleted += 1;
                if outcome.wrote {
                    ctx.hub.bundle_deployments_deleted.inc();
                }
            }
            let current: Vec<&BundleDeployment> = existing
                .iter()
                .filter(|bd| matched_ns.contains(&bd.namespace().unwrap_or_default()))
                .filter(|bd| bd.metadata.deletion_timestamp.is_none())
                .map(AsRef::as_ref)
                .collect();
            // Reverse sync (`upstreamResources`) for the clusters this Bundle targets.
            let targeted: Vec<(String, String)> = plan
                .deployments
                .iter()
                .map(|d| (d.cluster.clone(), d.namespace.clone()))
                .collect();
            upstream = crate::upstream::reconcile(ctx, bundle, &targeted).await?;
            facts.matched = plan.matched.len();
            facts.summary = summarize_with(plan.matched.len(), current, |bd| {
                ctx.expected_deployment_id(bd)
            });
            facts.missing = plan.missing.into_iter().collect();
            facts.refused = plan.refused.into_iter().collect();
            facts.unsupported = plan.unsupported.into_iter().collect();
            facts.too_large.sort();
            facts.copy_disabled = plan.copy_disabled;
            facts.template_failed = plan.template_failed;
            facts.copies = plan.copies;
        }
    }
    if created + updated + copies + deleted > 0 {
        let elapsed = started.elapsed();
        ctx.hub.fanout_duration.observe(elapsed.as_secs_f64());
        tracing::info!(
            bundle = %name, namespace = %ns, created, updated, copies, deleted,
            elapsed_ms = elapsed.as_millis() as u64,
            "bundle fanned out"
        );
    }
    let reference = bundle.object_ref(&());
    ctx.exec
        .execute_in_order(events::fanout_events(&reference, created, deleted))
        .await?;
    write_status(bundle, ctx, &facts, upstream).await?;
    // A polling Bundle comes back for its next look (jittered), a rollout at its next
    // deadline or soak end; any other waits for a change.
    let after = [polled.map(|(_, after)| after), requeue]
        .into_iter()
        .flatten()
        .min();
    Ok(after.map_or_else(Action::await_change, Action::requeue))
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
    // The shard entries are never ours to write: left out of the apply (and the comparison),
    // server-side apply keeps them as their replicas wrote them.
    new.shards.clear();
    let old_ours = old.map(|o| BundleStatus {
        shards: Vec::new(),
        ..o.clone()
    });
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
    if exec.memo().written(&key, &fingerprint).is_some() {
        return Ok(());
    }
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
    if exec.execute(op).await?.wrote {
        ctx.hub
            .status_writes
            .get_or_create(&crate::KindLabels {
                kind: "Bundle".to_string(),
            })
            .inc();
    }
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
/// `uid`; how many were written.
async fn write_copies(
    ctx: &Ctx,
    bundle: &Bundle,
    desired: &plan::DesiredDeployment,
    uid: &str,
    fetched: &Mutex<HashMap<SourceKey, SourceObject>>,
) -> Result<usize, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let shard = ctx.config.shard_id.as_deref();
    let owner = ops::copy_owner(&name, uid.to_string());
    let bd_labels = ops::owned_labels(&ns, &name, &desired.cluster, &desired.namespace, shard);
    let mut written = 0;
    let keys = ctx.keys();
    for copy in &desired.copies {
        let live = observe::live_copy(ctx, copy.kind, &desired.namespace, &copy.copy_name);
        let CopyStep::Write { replace } = ops::copy_step(copy, live.as_ref(), &owner.uid, &keys)
        else {
            ctx.hub.copies_skipped.inc();
            continue;
        };
        let signed_at = next_signed_at(ctx.clock.unix_millis(), live.as_ref());
        let live_version = live.and_then(|m| m.resource_version);
        // Written a moment ago and the cache has not caught up: no write, and no source read.
        let copy_key = ops::copy_key(copy.kind, &desired.namespace, &copy.copy_name);
        let fingerprint = ops::copy_fingerprint(copy, &owner, live_version.clone());
        if replace.is_none() && ctx.exec.memo().written(&copy_key, &fingerprint).is_some() {
            ctx.hub.copies_skipped.inc();
            continue;
        }
        let key = (copy.source_kind.clone(), copy.source.clone());
        let Some(source) = observe::source_for_copy(ctx, &ns, &key, fetched).await? else {
            continue;
        };
        if replace.is_some() {
            tracing::info!(copy = %copy.copy_name, namespace = %desired.namespace, "copy edited by another field manager; recreating it");
        }
        let to = ops::CopyTarget {
            bundle_ns: &ns,
            cluster_ns: &desired.namespace,
            owner: &owner,
            labels: &bd_labels,
            keys: &keys,
            signed_at,
        };
        let op = ops::copy_op(&source, copy, &to, live_version, replace);
        if ctx.exec.execute(op).await?.wrote {
            ctx.hub.copies_written.inc();
            written += 1;
        } else {
            ctx.hub.copies_skipped.inc();
        }
    }
    Ok(written)
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
pub(crate) fn next_signed_at(now: u64, live: Option<&kube::api::ObjectMeta>) -> u64 {
    let live = live
        .and_then(|m| m.annotations.as_ref()?.get(labels::HUB_SIGNATURE).cloned())
        .and_then(|s| tender_types::signing::signed_at_of(&s));
    live.map_or(now, |l| now.max(l.saturating_add(1)))
}

/// Deletes every BundleDeployment of the Bundle; the agent's finalizer then cleans up
/// downstream, and the garbage collector removes the copies with their BundleDeployment.
async fn cleanup(bundle: &Bundle, ctx: &Ctx) -> Result<Action, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    ctx.sources.remove(&(ns.clone(), bundle.name_any()));
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
