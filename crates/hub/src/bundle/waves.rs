//! The Bundle reconcile's one call into rollouts: ask the pure gate ([`super::rollout`])
//! which clusters are released, given the kept state the read step found, and keep the
//! previous revisions it needs ([`super::revisions`]). What the gate decided is returned as
//! operations — the state write and its Events — that the execute step runs before any
//! cluster is written; a rolled-back cluster's previous revision is written there too,
//! through the copy path a release takes ([`super::execute::write_rollback`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kube::{Resource, ResourceExt};
use tender_types::rollout::RolloutStrategy;
use tender_types::targeting::GroupInfo;
use tender_types::{Bundle, BundleDeployment, labels};

use super::ops::LiveCopy;
use super::plan::{ClusterView, Plan, SourceKey, SourceState};
use super::read::Seen;
use super::revisions;
use super::rollout::{self, ClusterRollout, Decision, Gate};
use super::status::{BundleFacts, RolloutFacts};
use crate::Error;
use crate::context::Ctx;
use crate::summary::classify_with;

/// What the reconcile needs of the gate.
pub(crate) struct Waves {
    /// The gate's answer.
    pub gate: Gate,
    /// The previous revisions kept.
    pub snapshot: revisions::Snapshot,
    /// The write of the rollout state and the previous revisions, when either changed: run
    /// before any cluster is written.
    pub state_write: Option<tender_runtime::Op>,
    /// The gate's Events, after the state write.
    pub events: Vec<tender_runtime::Op>,
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
    /// What the rollout Secret keeps, as the read step found it.
    pub kept: &'a Result<revisions::Kept, revisions::Unreadable>,
}

/// Why the gate answered nothing: nothing is released then but clusters without a
/// BundleDeployment, and nothing is rolled back.
pub(crate) enum Halt {
    /// The strategy has an invalid value (the message says which).
    InvalidStrategy(String),
    /// The kept state does not parse or verify (decision 0112).
    InvalidState(String),
}

/// The reconcile's rollout step for the Bundle `seen` read and its `plan`: the gate's answer
/// (`None` without a strategy, or when it halts, which `facts` then says), with the state
/// write and the gate's Events for the execute step.
pub(crate) async fn step(
    ctx: &Ctx,
    seen: &Seen,
    plan: &Plan,
    facts: &mut BundleFacts,
) -> Result<Option<Waves>, Error> {
    let bundle = seen.bundle.as_ref();
    let Some(strategy) = &bundle.spec.rollout_strategy else {
        return Ok(None);
    };
    let ns = bundle.namespace().unwrap_or_default();
    let spec = super::poll::resolved_spec(&bundle.spec, seen.version.as_deref());
    let views = super::planning::cluster_views(&seen.clusters, &seen.owned, &ns);
    let groups = super::planning::group_infos(&seen.groups);
    let input = GateInput {
        strategy,
        spec: &spec,
        plan,
        views: &views,
        groups: &groups,
        by_ns: &seen.existing,
        copies_by_ns: &seen.copies_by_ns,
        sources: &seen.sources,
        kept: &seen.rollout,
    };
    match gate(ctx, bundle, &input).await? {
        Ok(mut w) => {
            facts.rollout = Some(RolloutFacts::of(&w.gate));
            let reference = bundle.object_ref(&());
            w.events = super::events::rollout_events(&reference, &w.gate.events);
            Ok(Some(w))
        }
        // Its Event comes with the status write (events::transition_events).
        Err(halt) => {
            facts.rollout = Some(RolloutFacts::halted(&halt));
            Ok(None)
        }
    }
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
    let kept = match input.kept {
        Ok(kept) => kept,
        Err(revisions::Unreadable(why)) => return Ok(Err(Halt::InvalidState(why.clone()))),
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
    let state_write = (kept.state.as_ref() != Some(&gate.state) || kept.snapshot != snapshot)
        .then(|| revisions::write_op(bundle, shard, own_ns, &gate.state, &snapshot));
    Ok(Ok(Waves {
        gate,
        snapshot,
        state_write,
        events: Vec::new(),
    }))
}

/// The decision for `cluster` (release when there is no gate).
pub(crate) fn decision(waves: Option<&Waves>, cluster: &str) -> Decision {
    waves
        .and_then(|w| w.gate.decisions.get(cluster).copied())
        .unwrap_or(Decision::Release)
}
