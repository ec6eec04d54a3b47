//! Rollouts in waves (`spec.rolloutStrategy`, docs/rollouts.md): which clusters' waves are
//! released, when a wave has failed, what is rolled back. Pure: the Bundle reconcile gives it
//! the clusters with their desired and live deployment, the state kept in the rollout Secret
//! (`names::rollout_secret`) and the time; it answers one [`Decision`] per cluster, the next
//! state, the status and when to look again (decision 0093-rollout-waves).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tender_types::conditions::reason;
use tender_types::rollout::{OnFailure, PartitionStatus, RolloutStrategy, scaled};
use tender_types::targeting::{ClusterInfo, GroupInfo};

use crate::summary::DeploymentState;

/// How long after its release a wave's failing clusters start counting against `maxFailures`:
/// an agent may report a failure for a moment while a new BundleDeployment's copies are
/// still arriving (decision 0093-rollout-waves).
const FAILURE_SETTLE_MS: i64 = 5_000;

/// One targeted cluster as the gate sees it.
#[derive(Debug, Clone)]
pub struct ClusterRollout<'a> {
    /// Name of the Cluster.
    pub name: &'a str,
    /// Its labels (what partitions select).
    pub labels: &'a BTreeMap<String, String>,
    /// The deploymentID the Bundle wants there (`None` while blocked: nothing is written).
    pub desired: Option<&'a str>,
    /// The live BundleDeployment's deploymentID and state (`None`: none exists yet).
    pub live: Option<(&'a str, DeploymentState)>,
}

/// What the hub does for one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Its wave is released (or it has no BundleDeployment yet): write as without a strategy.
    Release,
    /// Its wave is not released: leave its copies and BundleDeployment exactly as they are.
    Hold,
    /// Its wave failed and is rolled back: write its previous revision (from the snapshot).
    Rollback,
}

/// A failed wave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// Index of the wave.
    pub wave: usize,
    /// [`reason::PROGRESS_DEADLINE_EXCEEDED`] or [`reason::FAILURE_BUDGET_EXCEEDED`].
    pub reason: String,
    /// Unix milliseconds.
    pub at: i64,
}

/// One wave's progress, in unix milliseconds (whole seconds would cut a soak short by up to one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaveState {
    /// When it was released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<i64>,
    /// Since when it has been done (ready within its maxUnavailable), while it stays so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<i64>,
}

/// What the hub keeps of a rollout between reconciles (no Secret value: the previous
/// revisions are kept beside it, [`super::revisions`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// The revision being rolled out ([`super::revisions::revision`]).
    pub revision: String,
    /// Per wave, in order.
    #[serde(default)]
    pub waves: Vec<WaveState>,
    /// The rollout failed: no further wave is released until resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Failure>,
    /// The failed wave was rolled back.
    #[serde(default)]
    pub rolled_back: bool,
    /// Every wave was done and soaked: later changes of readiness no longer fail it.
    #[serde(default)]
    pub complete: bool,
    /// The last `tender.dev/rollout-resume` value acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
}

/// One Event to record on the Bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutEvent {
    /// Warning (a failure) or Normal.
    pub warning: bool,
    /// Stable reason word.
    pub reason: &'static str,
    /// Message (names and counts, never values).
    pub message: String,
}

/// The conditions a rollout sets: (type, status, reason, message).
pub type RolloutCondition = (&'static str, bool, &'static str, String);

/// The gate's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// Per cluster name.
    pub decisions: BTreeMap<String, Decision>,
    /// The state to keep (written only when it differs from the one read).
    pub state: State,
    /// Clusters whose previous revision must be kept before their wave's first write.
    pub snapshot: Vec<String>,
    /// Per wave, for `status.partitions`.
    pub partitions: Vec<PartitionStatus>,
    /// Clusters not ready at the wanted deployment.
    pub unavailable: usize,
    /// Waves not done.
    pub unavailable_partitions: usize,
    /// `maxUnavailablePartitions` resolved.
    pub max_unavailable_partitions: usize,
    /// Conditions to set.
    pub conditions: Vec<RolloutCondition>,
    /// Events of this pass.
    pub events: Vec<RolloutEvent>,
    /// When a deadline or a soak ends, if one is running.
    pub next: Option<Duration>,
    /// The wave of each cluster, by name.
    pub wave_of: BTreeMap<String, usize>,
}

/// Inputs besides the clusters.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The strategy.
    pub strategy: &'a RolloutStrategy,
    /// The revision the Bundle wants now.
    pub revision: &'a str,
    /// The state read back (`None`: no rollout yet).
    pub previous: Option<&'a State>,
    /// The Bundle's `tender.dev/rollout-resume` annotation.
    pub resume: Option<&'a str>,
    /// Whether the previous revision of every cluster released so far is kept.
    pub rollback_possible: bool,
    /// Unix milliseconds now.
    pub now: i64,
}

pub use tender_types::waves::InvalidStrategy;

/// Splits `clusters` into waves: (name, wave cluster indices, maxUnavailable), clusters in
/// name order ([`tender_types::waves`], which `tender status` shares).
pub fn waves(
    strategy: &RolloutStrategy,
    clusters: &[ClusterRollout<'_>],
    groups: &[GroupInfo<'_>],
) -> Result<Vec<(String, Vec<usize>, usize)>, InvalidStrategy> {
    let infos: Vec<ClusterInfo<'_>> = clusters
        .iter()
        .map(|c| ClusterInfo {
            name: c.name,
            labels: c.labels,
        })
        .collect();
    Ok(tender_types::waves::waves(strategy, &infos, groups)?
        .into_iter()
        .map(|w| (w.name, w.members, w.max_unavailable))
        .collect())
}

/// The gate for one Bundle reconcile.
pub fn gate(
    inputs: &Inputs<'_>,
    clusters: &[ClusterRollout<'_>],
    groups: &[GroupInfo<'_>],
) -> Result<Gate, InvalidStrategy> {
    let strategy = inputs.strategy;
    let now = inputs.now;
    let waves = waves(strategy, clusters, groups)?;
    let max_partitions = scaled(strategy.max_unavailable_partitions.as_ref(), waves.len(), 0)
        .map_err(|e| InvalidStrategy(e.to_string()))?;
    let soak = 1000 * i64::from(strategy.soak_seconds.unwrap_or(0));
    let deadline = strategy
        .progress_deadline_seconds
        .map(|s| 1000 * i64::from(s));
    let on_failure = strategy.on_failure.unwrap_or_default();
    let mut events = Vec::new();

    let mut state = starting_state(inputs, waves.len(), &mut events);

    let mut wave_of = BTreeMap::new();
    let mut snapshot = Vec::new();
    let mut partitions = Vec::new();
    let mut next: Option<i64> = None;
    let mut wake = |at: i64| next = Some(next.map_or(at, |n: i64| n.min(at)));
    let (mut unavailable_total, mut unavailable_partitions, mut failures) = (0, 0, 0usize);
    let mut not_passed = 0;
    let mut failed_now = None;
    for (i, (name, members, max_unavailable)) in waves.iter().enumerate() {
        let current = |c: &ClusterRollout<'_>| match (c.desired, c.live) {
            (None, _) => true,
            (Some(want), Some((have, _))) => want == have,
            (Some(_), None) => false,
        };
        let ready = |c: &ClusterRollout<'_>| {
            current(c) && c.live.is_some_and(|(_, s)| s == DeploymentState::Ready)
        };
        let unavailable = members.iter().filter(|&&c| !ready(&clusters[c])).count();
        let done = unavailable <= *max_unavailable;
        let blocked = state.failed.is_some() || not_passed > max_partitions;
        let w = &mut state.waves[i];
        if w.released_at.is_none() && !blocked {
            w.released_at = Some(now);
            if on_failure == OnFailure::Rollback {
                snapshot.extend(
                    members
                        .iter()
                        .map(|&c| &clusters[c])
                        .filter(|c| c.live.is_some() && !current(c))
                        .map(|c| c.name.to_string()),
                );
            }
        }
        let released = w.released_at.is_some();
        if state.complete {
            // Kept as it was when the rollout completed.
        } else if released && done {
            w.done_at.get_or_insert(now);
        } else {
            w.done_at = None;
        }
        let passed = state.complete || w.done_at.is_some_and(|d| now >= d + soak);
        if !passed {
            not_passed += 1;
        }
        if let Some(d) = w.done_at.filter(|_| !passed) {
            wake(d + soak);
        }
        if released && !done && state.failed.is_none() && !state.complete {
            if let (Some(limit), Some(at)) = (deadline, w.released_at) {
                if now >= at + limit {
                    failed_now.get_or_insert((i, reason::PROGRESS_DEADLINE_EXCEEDED));
                } else {
                    wake(at + limit);
                }
            }
            let settled = w
                .released_at
                .is_some_and(|at| now >= at + FAILURE_SETTLE_MS);
            failures += members
                .iter()
                .filter(|_| settled)
                .map(|&c| &clusters[c])
                .filter(|c| {
                    current(c)
                        && c.live
                            .is_some_and(|(_, s)| s == DeploymentState::ErrApplied)
                })
                .count();
            if failures > strategy.max_failures.unwrap_or(0) as usize {
                failed_now.get_or_insert((i, reason::FAILURE_BUDGET_EXCEEDED));
            }
        }
        unavailable_total += unavailable;
        if !done {
            unavailable_partitions += 1;
        }
        let rolled_back = state.rolled_back && state.failed.as_ref().is_some_and(|f| f.wave == i);
        let failed_here = state.failed.as_ref().is_some_and(|f| f.wave == i);
        partitions.push(PartitionStatus {
            name: name.clone(),
            count: to_i32(members.len()),
            max_unavailable: to_i32(*max_unavailable),
            unavailable: to_i32(unavailable),
            phase: match () {
                _ if rolled_back => "RolledBack",
                _ if failed_here => "Failed",
                _ if !released => "Waiting",
                _ if passed => "Done",
                _ if done => "Soaking",
                _ => "Progressing",
            }
            .to_string(),
        });
        for &c in members {
            wave_of.insert(clusters[c].name.to_string(), i);
        }
    }
    if let Some((wave, why)) = failed_now {
        record_failure(
            &mut state,
            (wave, why),
            inputs,
            on_failure,
            &mut partitions,
            &mut events,
        );
    }
    let decisions = decisions(&waves, &state, clusters);
    if state.failed.is_none() && partitions.iter().all(|p| p.phase == "Done") {
        state.complete = true;
    }
    // A failure stops the clocks: resume restarts them.
    if state.failed.is_some() {
        next = None;
    }
    let conditions = conditions(&state, &partitions, on_failure, inputs.rollback_possible);
    Ok(Gate {
        decisions,
        snapshot,
        partitions,
        unavailable: unavailable_total,
        unavailable_partitions,
        max_unavailable_partitions: max_partitions,
        conditions,
        events,
        next: next.map(|at| Duration::from_millis(u64::try_from(at - now).unwrap_or(0).max(100))),
        wave_of,
        state,
    })
}

/// The state the gate starts from: the kept one for the same revision, else a new one (a
/// `RolloutStarted` event when it replaces another); a new `resume` value resumes a failure.
fn starting_state(inputs: &Inputs<'_>, waves: usize, events: &mut Vec<RolloutEvent>) -> State {
    let now = inputs.now;
    let mut state = match inputs.previous {
        Some(s) if s.revision == inputs.revision => s.clone(),
        previous => {
            if previous.is_some() {
                events.push(RolloutEvent {
                    warning: false,
                    reason: "RolloutStarted",
                    message: format!("rolling out in {waves} waves"),
                });
            }
            State {
                revision: inputs.revision.to_string(),
                resume: inputs.resume.map(str::to_string),
                ..State::default()
            }
        }
    };
    state.waves.resize(waves, WaveState::default());
    // A first rollout (no state yet) starts from what is deployed: the waves still gate it.
    if inputs.resume.is_some() && inputs.resume != state.resume.as_deref() {
        state.resume = inputs.resume.map(str::to_string);
        if let Some(f) = state.failed.take() {
            if state.rolled_back {
                // Start over: every wave waits again, the first is released below.
                state
                    .waves
                    .iter_mut()
                    .for_each(|w| *w = WaveState::default());
            } else if let Some(w) = state.waves.get_mut(f.wave) {
                w.released_at = Some(now);
            }
            state.rolled_back = false;
            events.push(RolloutEvent {
                warning: false,
                reason: "RolloutResumed",
                message: format!("resumed at wave {}", f.wave + 1),
            });
        }
    }
    state
}

/// Records wave `wave`'s failure (`why`): the state, the event, the wave's phase; rolled
/// back when the strategy says so and the previous revision was kept.
fn record_failure(
    state: &mut State,
    (wave, why): (usize, &'static str),
    inputs: &Inputs<'_>,
    on_failure: OnFailure,
    partitions: &mut [PartitionStatus],
    events: &mut Vec<RolloutEvent>,
) {
    let now = inputs.now;
    state.failed = Some(Failure {
        wave,
        reason: why.to_string(),
        at: now,
    });
    let rollback = on_failure == OnFailure::Rollback && inputs.rollback_possible;
    state.rolled_back = rollback;
    events.push(RolloutEvent {
        warning: true,
        reason: if rollback { reason::ROLLED_BACK } else { why },
        message: format!(
            "wave {} ({}) failed: {why}; {}",
            wave + 1,
            partitions[wave].name,
            if rollback {
                "its clusters are returned to their previous revision and the rollout stops"
            } else if on_failure == OnFailure::Rollback {
                "its previous revision was not kept, so the rollout pauses"
            } else {
                "the rollout pauses"
            }
        ),
    });
    partitions[wave].phase = if rollback { "RolledBack" } else { "Failed" }.to_string();
}

/// Each cluster's decision: rolled back in a rolled-back wave, released in a released wave
/// (or when it has nothing deployed yet), else held.
fn decisions(
    waves: &[(String, Vec<usize>, usize)],
    state: &State,
    clusters: &[ClusterRollout<'_>],
) -> BTreeMap<String, Decision> {
    let mut decisions = BTreeMap::new();
    for (i, (_, members, _)) in waves.iter().enumerate() {
        let released = state.waves[i].released_at.is_some();
        let rolled_back = state.rolled_back && state.failed.as_ref().is_some_and(|f| f.wave == i);
        for &c in members {
            let cluster = &clusters[c];
            let decision = if rolled_back {
                Decision::Rollback
            } else if released || cluster.live.is_none() {
                Decision::Release
            } else {
                Decision::Hold
            };
            decisions.insert(cluster.name.to_string(), decision);
        }
    }
    decisions
}

fn conditions(
    state: &State,
    partitions: &[PartitionStatus],
    on_failure: OnFailure,
    rollback_possible: bool,
) -> Vec<RolloutCondition> {
    use tender_types::conditions::{
        TYPE_ROLLED_BACK, TYPE_ROLLOUT_HALTED, TYPE_ROLLOUT_PROGRESSING,
    };
    let mut out = Vec::new();
    let wave_name = |i: usize| partitions.get(i).map(|p| p.name.as_str()).unwrap_or("?");
    match &state.failed {
        Some(f) => {
            let why = if f.reason == reason::FAILURE_BUDGET_EXCEEDED {
                reason::FAILURE_BUDGET_EXCEEDED
            } else {
                reason::PROGRESS_DEADLINE_EXCEEDED
            };
            let halted_reason =
                if on_failure == OnFailure::Rollback && !rollback_possible && !state.rolled_back {
                    reason::ROLLBACK_UNAVAILABLE
                } else {
                    why
                };
            out.push((
                TYPE_ROLLOUT_PROGRESSING,
                false,
                why,
                format!("wave {} ({}) failed", f.wave + 1, wave_name(f.wave)),
            ));
            out.push((
                TYPE_ROLLOUT_HALTED,
                true,
                halted_reason,
                format!(
                    "wave {} ({}) failed ({why}); no further wave is released until `tender rollout resume` or a new revision",
                    f.wave + 1,
                    wave_name(f.wave)
                ),
            ));
            out.push(if state.rolled_back {
                (
                    TYPE_ROLLED_BACK,
                    true,
                    reason::ROLLED_BACK,
                    format!(
                        "the clusters of wave {} ({}) are back at their previous revision",
                        f.wave + 1,
                        wave_name(f.wave)
                    ),
                )
            } else {
                (
                    TYPE_ROLLED_BACK,
                    false,
                    why,
                    "nothing rolled back".to_string(),
                )
            });
        }
        None => {
            let active = partitions
                .iter()
                .position(|p| p.phase != "Done")
                .map(|i| (i, partitions[i].phase.as_str()));
            out.push(match active {
                None => (
                    TYPE_ROLLOUT_PROGRESSING,
                    false,
                    reason::ROLLOUT_COMPLETE,
                    format!("all {} waves are ready", partitions.len()),
                ),
                Some((i, "Soaking")) => (
                    TYPE_ROLLOUT_PROGRESSING,
                    true,
                    reason::WAVE_SOAKING,
                    format!("wave {} ({}) is ready and soaking", i + 1, wave_name(i)),
                ),
                Some((i, _)) => (
                    TYPE_ROLLOUT_PROGRESSING,
                    true,
                    reason::WAVE_PROGRESSING,
                    format!("wave {} ({}) is rolling out", i + 1, wave_name(i)),
                ),
            });
            let why = match active {
                None => reason::ROLLOUT_COMPLETE,
                Some(_) => reason::WAVE_PROGRESSING,
            };
            out.push((TYPE_ROLLOUT_HALTED, false, why, "not halted".to_string()));
            out.push((
                TYPE_ROLLED_BACK,
                false,
                why,
                "nothing rolled back".to_string(),
            ));
        }
    }
    out
}

fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests;
