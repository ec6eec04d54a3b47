//! The Bundle reconcile's one call into rollouts: read the kept state, ask the pure gate
//! ([`super::rollout`]) which clusters are released, keep the previous revisions it needs
//! ([`super::revisions`]) before any write, and write a rolled-back cluster's previous revision.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kube::ResourceExt;
use tender_runtime::executor::{Apply, Op};
use tender_types::rollout::RolloutStrategy;
use tender_types::targeting::GroupInfo;
use tender_types::{Bundle, BundleDeployment, labels};

use super::ops::{self, CopyStep, DeploymentStep, LiveCopy};
use super::plan::{ClusterView, DesiredCopy, Plan, SourceKey, SourceState};
use super::revisions;
use super::rollout::{self, ClusterRollout, Decision, Gate};
use crate::Error;
use crate::context::Ctx;
use crate::summary::classify_with;

/// What the reconcile needs of the gate.
pub(crate) struct Waves {
    /// The gate's answer.
    pub gate: Gate,
    /// The previous revisions kept.
    pub snapshot: revisions::Snapshot,
}

/// Everything the gate reads besides the kept state.
pub(crate) struct GateInput<'a> {
    pub strategy: &'a RolloutStrategy,
    /// The Bundle's spec with a polled chart version resolved: a new version is a new revision.
    pub spec: &'a tender_types::BundleSpec,
    pub plan: &'a Plan,
    pub views: &'a [ClusterView<'a>],
    pub groups: &'a [GroupInfo<'a>],
    pub by_ns: &'a HashMap<String, Arc<BundleDeployment>>,
    pub copies_by_ns: &'a HashMap<String, Vec<LiveCopy>>,
    pub sources: &'a BTreeMap<SourceKey, SourceState>,
}

/// Why the gate answered nothing: nothing is released then but clusters without a
/// BundleDeployment, and nothing is rolled back.
pub(crate) enum Halt {
    /// The strategy has an invalid value (the message says which).
    InvalidStrategy(String),
    /// The kept state does not parse or verify (decision 0112).
    InvalidState(String),
}

/// Runs the gate for `bundle`, or says why it halts.
pub(crate) async fn gate(
    ctx: &Ctx,
    bundle: &Bundle,
    input: &GateInput<'_>,
) -> Result<Result<Waves, Halt>, Error> {
    let name = bundle.name_any();
    let shard = ctx.config.shard_id.as_deref();
    let own_ns = ctx.config.own_namespace();
    let kept = match revisions::read(&ctx.client, bundle, shard, own_ns)
        .await
        .map_err(crate::kube_err("read the rollout state"))?
    {
        Ok(kept) => kept,
        Err(revisions::Unreadable(why)) => return Ok(Err(Halt::InvalidState(why))),
    };
    let labels_of: BTreeMap<&str, &BTreeMap<String, String>> =
        input.views.iter().map(|v| (v.name, v.labels)).collect();
    let states: Vec<_> = input
        .plan
        .deployments
        .iter()
        .map(|d| {
            let live = input
                .by_ns
                .get(&d.namespace)
                .filter(|bd| bd.metadata.deletion_timestamp.is_none());
            // What a cluster runs is its deploymentID with the content of its copies: a
            // rotation changes the copies, not the BundleDeployment (decision 0089-signed-copies).
            let desired = d.spec.as_ref().map(|s| {
                tender_types::hash::effective_deployment_id(
                    &s.deployment_id,
                    d.copies
                        .iter()
                        .map(|c| (c.copy_name.as_str(), c.hash.as_str())),
                )
            });
            let live = live.map(|bd| {
                let expected = ctx.expected_deployment_id(bd);
                let state = classify_with(bd, &expected);
                (expected, state)
            });
            (d, desired, live)
        })
        .collect();
    let clusters: Vec<ClusterRollout<'_>> = states
        .iter()
        .map(|(d, desired, live)| ClusterRollout {
            name: &d.cluster,
            labels: labels_of
                .get(d.cluster.as_str())
                .copied()
                .unwrap_or(super::observe::no_labels()),
            desired: desired.as_deref(),
            live: live.as_ref().map(|(id, state)| (id.as_str(), *state)),
        })
        .collect();
    let revision = revisions::revision(input.spec, input.sources);
    let resume = bundle
        .annotations()
        .get(labels::ROLLOUT_RESUME)
        .map(String::as_str);
    let new_revision = kept.state.as_ref().is_none_or(|s| s.revision != revision);
    let mut snapshot = if new_revision {
        revisions::Snapshot::default()
    } else {
        kept.snapshot.clone()
    };
    let inputs = rollout::Inputs {
        strategy: input.strategy,
        revision: &revision,
        previous: kept.state.as_ref(),
        resume,
        rollback_possible: !snapshot.overflow,
        now: ctx.clock.now().as_millisecond(),
    };
    let gate = match rollout::gate(&inputs, &clusters, input.groups) {
        Ok(gate) => gate,
        Err(e) => return Ok(Err(Halt::InvalidStrategy(e.to_string()))),
    };
    // The previous revision of each cluster about to be released, kept before its first write.
    let ns_of: BTreeMap<&str, &str> = input
        .plan
        .deployments
        .iter()
        .map(|d| (d.cluster.as_str(), d.namespace.as_str()))
        .collect();
    let keys = ctx.keys();
    for cluster in &gate.snapshot {
        let Some(cluster_ns) = ns_of.get(cluster.as_str()) else {
            continue;
        };
        let copies: Vec<_> = input
            .copies_by_ns
            .get(*cluster_ns)
            .map(|v| v.iter().map(|c| (c.kind, c.name.clone())).collect())
            .unwrap_or_default();
        revisions::keep(
            &ctx.client,
            keys.trusted(),
            &mut snapshot,
            &name,
            cluster,
            cluster_ns,
            &copies,
        )
        .await
        .map_err(crate::kube_err("keep the previous revision"))?;
    }
    let targeted: BTreeSet<String> = ns_of.keys().map(|c| c.to_string()).collect();
    revisions::prune(&mut snapshot, &targeted);
    if kept.state.as_ref() != Some(&gate.state) || kept.snapshot != snapshot {
        ctx.exec
            .execute(revisions::write_op(
                bundle,
                shard,
                own_ns,
                &gate.state,
                &snapshot,
            ))
            .await?;
    }
    Ok(Ok(Waves { gate, snapshot }))
}

/// The decision for `cluster` (release when there is no gate).
pub(crate) fn decision(waves: Option<&Waves>, cluster: &str) -> Decision {
    waves
        .and_then(|w| w.gate.decisions.get(cluster).copied())
        .unwrap_or(Decision::Release)
}

/// Writes `cluster`'s previous revision (copies first, then its BundleDeployment), each only
/// where the live one differs; nothing when no previous revision was kept.
pub(crate) async fn write_rollback(
    ctx: &Ctx,
    bundle: &Bundle,
    desired: &super::plan::DesiredDeployment,
    snapshot: &revisions::Snapshot,
) -> Result<usize, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let Some(spec) = revisions::previous_spec(snapshot, &desired.cluster) else {
        return Ok(0);
    };
    let bd_name = tender_types::names::bundle_deployment_name(&name);
    let Some(live) = super::observe::live_deployment(ctx, &desired.namespace, &bd_name) else {
        return Ok(0);
    };
    let Some(uid) = live.metadata.uid.clone() else {
        return Ok(0);
    };
    let shard = ctx.config.shard_id.as_deref();
    let owner = ops::copy_owner(&name, uid.clone());
    let owned = ops::owned_labels(&ns, &name, &desired.cluster, &desired.namespace, shard);
    let kept = revisions::previous_copies(
        snapshot,
        &desired.cluster,
        &desired.namespace,
        &owner,
        &owned,
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
        let live_copy = super::observe::live_copy(ctx, kind, &desired.namespace, &copy_name);
        let want = DesiredCopy {
            kind,
            source_kind: tender_types::copy::CopyableKind {
                api_version: entry.api_version().to_string(),
                kind: entry.kind.clone(),
            },
            source: entry.name.clone(),
            copy_name: copy_name.clone(),
            bytes: 0,
            hash: content_hash,
        };
        let keys = ctx.keys();
        let CopyStep::Write { .. } = ops::copy_step(&want, live_copy.as_ref(), &uid, &keys) else {
            continue;
        };
        // Signed anew, later than the live copy: an agent takes a rollback as it takes a
        // rotation, and still refuses an old copy replayed by anyone else.
        let to = ops::CopyTarget {
            bundle_ns: &ns,
            cluster_ns: &desired.namespace,
            owner: &owner,
            labels: &owned,
            keys: &keys,
            signed_at: super::next_signed_at(ctx.clock.unix_millis(), live_copy.as_ref()),
        };
        let mut body = body;
        body["metadata"]["annotations"][labels::HUB_SIGNATURE] =
            serde_json::Value::String(to.signature(&want, &want.hash));
        let op = Op::Apply(Apply {
            key: ops::copy_key(kind, &desired.namespace, &copy_name),
            body,
            replace_if_immutable: true,
            fingerprint: None,
        });
        if ctx.exec.execute(op).await?.wrote {
            written += 1;
        }
    }
    if let DeploymentStep::Write(op) =
        ops::deployment_step(&ns, &name, desired, Some(&spec), Some(&live), shard)
        && ctx.exec.execute(*op).await?.wrote
    {
        written += 1;
    }
    Ok(written)
}
