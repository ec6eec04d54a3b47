//! The whole deployment as ordered phases (decision 0088), planned from what the agent observed
//! in one pass: namespace manifests, the other namespaces, copies, CRDs, the pre hooks, the
//! ordinary objects, the post hooks, and the prune set. Pure: the executor runs the phases,
//! [`gate`] says when one may not start, and a refused or failing object is an entry to report.

use serde_json::Value;
use tender_types::hash::value_hash;
use tender_types::labels;
use tender_types::{ObjectRef, ObjectState, ObjectStatus};

use super::{Desired, Planned, group_of, prune_set, union};
use crate::hooks::{DeletePolicy, HookEvent};

/// Annotation on a hook object: the deploymentID of the run that created it. A hook whose
/// object carries the current run has run (or is running) for this deployment.
pub const HOOK_RUN: &str = "tender.dev/hook-run";

/// A phase of a deployment, in execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Namespace objects among the manifests (the other namespaces are ensured after them).
    Namespaces,
    /// Secret/ConfigMap copies and copies of other kinds.
    Copies,
    /// CustomResourceDefinitions from a chart's `crds/` directory.
    Crds,
    /// Helm hooks of one event (`pre-install`, `pre-upgrade`, `post-…`).
    Hooks(HookEvent),
    /// The inline manifests and the chart's ordinary objects.
    Objects,
}

impl Phase {
    /// The phase's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Namespaces => "namespaces",
            Self::Copies => "copies",
            Self::Crds => "CRDs",
            Self::Hooks(e) => e.as_str(),
            Self::Objects => "objects",
        }
    }
}

/// One hook to run: its object (with [`HOOK_RUN`]) and what Helm says about it.
#[derive(Clone, Debug, PartialEq)]
pub struct HookStep {
    /// The object as applied.
    pub desired: Desired,
    /// The event it runs at.
    pub event: HookEvent,
    /// `helm.sh/hook-delete-policy`.
    pub delete: DeletePolicy,
    /// Whether the rollout waits for it (a Job or a Pod).
    pub waits: bool,
}

/// A hook's object marked with the run (deploymentID) creating it, content hash renewed.
pub fn hook_object(mut desired: Desired, run: &str) -> Desired {
    let annotations = &mut desired.body["metadata"]["annotations"];
    if let Some(map) = annotations.as_object_mut() {
        map.remove(labels::CONTENT_HASH);
        map.insert(HOOK_RUN.into(), Value::String(run.to_string()));
    }
    desired.hash = value_hash(&desired.body);
    desired.body["metadata"]["annotations"][labels::CONTENT_HASH] =
        Value::String(desired.hash.clone());
    desired
}

/// One entry of a phase.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    /// Nothing to write: the object's status is already known (refused, not rendered, kind
    /// missing…).
    Report(ObjectStatus),
    /// Apply an object; `chart` says it came from the chart (its `takeOwnership` applies).
    Apply {
        /// The object.
        desired: Desired,
        /// Rendered by the chart.
        chart: bool,
    },
    /// Run a hook.
    Hook(HookStep),
}

impl Entry {
    fn of(planned: Planned, chart: bool) -> Self {
        match planned {
            Ok(desired) => Self::Apply { desired, chart },
            Err(status) => Self::Report(status),
        }
    }

    /// The object this entry is about.
    pub fn key(&self) -> ObjectRef {
        match self {
            Self::Report(s) => ObjectRef {
                api_version: s.api_version.clone(),
                kind: s.kind.clone(),
                namespace: s.namespace.clone(),
                name: s.name.clone(),
            },
            Self::Apply { desired, .. } => desired.key.clone(),
            Self::Hook(h) => h.desired.key.clone(),
        }
    }
}

/// A phase and its entries.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedPhase {
    /// Which phase.
    pub phase: Phase,
    /// Its entries, in order.
    pub entries: Vec<Entry>,
}

/// What one deployment will do, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct DeployPlan {
    /// The inventory written before anything is created: every object that may exist after
    /// this run (previous ∪ desired).
    pub record: Vec<ObjectRef>,
    /// Every object the deployment wants (refused ones included, so they are not pruned).
    pub desired: Vec<ObjectRef>,
    /// Namespaces ensured after the namespace manifests (those not among the manifests).
    pub namespaces: Vec<String>,
    /// The phases.
    pub phases: Vec<PlannedPhase>,
    /// Recorded objects no longer desired: removed once every phase is in place.
    pub prune: Vec<ObjectRef>,
}

/// The observed inputs of a deployment's plan.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// A new deploymentID is waiting to be applied.
    pub pending: bool,
    /// The copies, in `downstreamResources` order (one per fan-out namespace).
    pub copies: Vec<Planned>,
    /// The inline manifests followed by the chart's ordinary objects (from `chart_from` on).
    pub manifests: Vec<Planned>,
    /// Index of the first chart object in `manifests`.
    pub chart_from: usize,
    /// CRDs from the chart's `crds/` directory.
    pub crds: Vec<Planned>,
    /// The chart's hooks of the events this run executes, in Helm's order per event.
    pub hooks: Vec<(HookEvent, Planned, DeletePolicy, bool)>,
    /// Whether the chart is upgraded (an earlier deployment of it was applied).
    pub upgrade: bool,
    /// Objects refused by the owner's policy (kept out of pruning).
    pub refused: Vec<ObjectRef>,
    /// The inventory before this run.
    pub previous: Vec<ObjectRef>,
}

fn is_namespace(p: &Planned) -> bool {
    p.as_ref()
        .is_ok_and(|d| d.key.kind == "Namespace" && group_of(&d.key.api_version).is_empty())
}

/// The phases of a deployment. Hooks run only while a new deploymentID is pending (an applied
/// deployment is kept in place without running them again).
pub fn plan(observed: Observed) -> DeployPlan {
    let Observed {
        pending,
        copies,
        manifests,
        chart_from,
        crds,
        hooks,
        upgrade,
        refused,
        previous,
    } = observed;
    let keys = |list: &[Planned]| -> Vec<ObjectRef> {
        list.iter()
            .filter_map(|p| p.as_ref().ok().map(|d| d.key.clone()))
            .collect()
    };
    let mut desired = keys(&copies);
    desired.extend(keys(&crds));
    desired.extend(keys(&manifests));
    // A hook object is findable like any other (a crash leaves nothing unknown); it is kept
    // while the chart renders it and pruned when the chart stops rendering it.
    desired.extend(
        hooks
            .iter()
            .filter_map(|(_, p, _, _)| p.as_ref().ok().map(|d| d.key.clone())),
    );
    desired.extend(refused);
    dedup(&mut desired);
    let record = union(&previous, &desired);
    let prune = prune_set(&record, &desired);

    let own_namespaces: Vec<String> = manifests
        .iter()
        .filter(|p| is_namespace(p))
        .filter_map(|p| p.as_ref().ok().map(|d| d.key.name.clone()))
        .collect();
    let mut namespaces: Vec<String> = manifests
        .iter()
        .chain(&copies)
        .chain(&crds)
        .chain(hooks.iter().map(|(_, p, _, _)| p))
        .filter_map(|p| p.as_ref().ok().and_then(|d| d.key.namespace.clone()))
        .filter(|ns| !own_namespaces.contains(ns))
        .collect();
    namespaces.sort();
    namespaces.dedup();

    let (ns_manifests, rest): (Vec<_>, Vec<_>) = manifests
        .into_iter()
        .enumerate()
        .partition(|(_, p)| is_namespace(p));
    let mut phases = vec![
        PlannedPhase {
            phase: Phase::Namespaces,
            entries: ns_manifests
                .into_iter()
                .map(|(i, p)| Entry::of(p, i >= chart_from))
                .collect(),
        },
        PlannedPhase {
            phase: Phase::Copies,
            entries: copies.into_iter().map(|p| Entry::of(p, false)).collect(),
        },
        PlannedPhase {
            phase: Phase::Crds,
            entries: crds.into_iter().map(|p| Entry::of(p, true)).collect(),
        },
    ];
    let (pre, post) = HookEvent::around(upgrade);
    let hook_phase = |event: HookEvent| PlannedPhase {
        phase: Phase::Hooks(event),
        entries: hooks
            .iter()
            .filter(|(e, ..)| *e == event)
            .map(|(_, p, delete, waits)| match p {
                Ok(desired) => Entry::Hook(HookStep {
                    desired: desired.clone(),
                    event,
                    delete: *delete,
                    waits: *waits,
                }),
                Err(s) => Entry::Report(s.clone()),
            })
            .collect(),
    };
    if pending {
        phases.push(hook_phase(pre));
    }
    phases.push(PlannedPhase {
        phase: Phase::Objects,
        entries: rest
            .into_iter()
            .map(|(i, p)| Entry::of(p, i >= chart_from))
            .collect(),
    });
    if pending {
        phases.push(hook_phase(post));
    }
    phases.retain(|p| !p.entries.is_empty());
    DeployPlan {
        record,
        desired,
        namespaces,
        phases,
        prune,
    }
}

fn dedup(list: &mut Vec<ObjectRef>) {
    let mut seen = std::collections::BTreeSet::new();
    list.retain(|k| seen.insert(k.clone()));
}

/// Why a phase may not start, given the statuses of the phases before it (`None`: it may).
/// While a deployment is pending nothing after the copies starts before every copy is in
/// place, and nothing after a hook phase before each of its hooks is done; an applied
/// deployment keeps every object in place independently.
pub fn gate(phase: Phase, pending: bool, before: &[(Phase, Vec<ObjectStatus>)]) -> Option<String> {
    if !pending {
        return None;
    }
    for (done, statuses) in before {
        let blocked = statuses.iter().find(|s| !in_place(s));
        match (done, blocked) {
            (Phase::Copies, Some(_)) if phase != Phase::Copies => {
                return Some("waiting for every copy to be in place".into());
            }
            (Phase::Hooks(event), Some(s)) => {
                return Some(format!(
                    "waiting for the {} hooks ({} {} not done)",
                    event.as_str(),
                    s.kind,
                    s.name
                ));
            }
            (Phase::Crds, Some(s)) => {
                return Some(format!("waiting for CRD {} to be applied", s.name));
            }
            // Post hooks run once every ordinary object is applied.
            (Phase::Objects, Some(s)) if matches!(phase, Phase::Hooks(_)) => {
                return Some(format!("waiting for {} {} to be applied", s.kind, s.name));
            }
            _ => {}
        }
    }
    None
}

/// Whether a status lets the next phase start: applied (ready or not), or refused by the
/// owner's policy (it will not come by waiting).
pub fn in_place(s: &ObjectStatus) -> bool {
    s.state.is_in_place() || crate::policy::is_refused(s)
}

/// How far a hook object is: from the live object (absent, another run's, or this run's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookProgress {
    /// Not there for this run: (re)create it, deleting the previous run's object first when
    /// there is one.
    Start {
        /// uid of a previous run's object to delete first.
        replace: Option<String>,
    },
    /// Created for this run and still running.
    Running,
    /// Done (a hook that is not waited for is done once applied).
    Succeeded,
    /// Failed, with why.
    Failed(String),
    /// Somebody else's object has the hook's name: never touched.
    NotOurs,
}

/// The progress of hook `step` for run `run` from its live object.
pub fn hook_progress(
    step: &HookStep,
    run: &str,
    live: Option<&Value>,
    owned: bool,
) -> HookProgress {
    let Some(live) = live else {
        return HookProgress::Start { replace: None };
    };
    if !owned {
        return HookProgress::NotOurs;
    }
    let this_run = live["metadata"]["annotations"][HOOK_RUN].as_str() == Some(run);
    if !this_run || live["metadata"]["deletionTimestamp"].is_string() {
        return HookProgress::Start {
            replace: live["metadata"]["uid"].as_str().map(str::to_string),
        };
    }
    if !step.waits {
        return HookProgress::Succeeded;
    }
    match finished(live) {
        Some(Ok(())) => HookProgress::Succeeded,
        Some(Err(why)) => HookProgress::Failed(why),
        None => HookProgress::Running,
    }
}

/// A Job's or Pod's end: `Some(Ok)` succeeded, `Some(Err)` failed (with the controller's
/// message), `None` still running.
pub fn finished(live: &Value) -> Option<Result<(), String>> {
    let status = &live["status"];
    match live["kind"].as_str() {
        Some("Pod") => match status["phase"].as_str() {
            Some("Succeeded") => Some(Ok(())),
            Some("Failed") => Some(Err(status["message"]
                .as_str()
                .unwrap_or("the Pod failed")
                .to_string())),
            _ => None,
        },
        _ => {
            let conditions = status["conditions"].as_array()?;
            let is = |t: &str| {
                conditions
                    .iter()
                    .find(|c| c["type"] == t && c["status"] == "True")
            };
            if is("Complete").is_some() {
                Some(Ok(()))
            } else {
                is("Failed").map(|c| {
                    Err(format!(
                        "{}: {}",
                        c["reason"].as_str().unwrap_or("Failed"),
                        c["message"].as_str().unwrap_or("the Job failed")
                    ))
                })
            }
        }
    }
}

/// How a hook failure names the deployment (run) it failed in.
pub fn run_marker(deployment_id: &str) -> String {
    let short: String = deployment_id.chars().take(12).collect();
    format!("[deployment {short}]")
}

/// The status of an entry that did not run because its phase was gated.
pub fn not_started(key: &ObjectRef, why: &str) -> ObjectStatus {
    ObjectStatus {
        api_version: key.api_version.clone(),
        kind: key.kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        state: ObjectState::Missing,
        message: Some(why.to_string()),
    }
}

#[cfg(test)]
#[path = "phases_tests.rs"]
mod tests;
