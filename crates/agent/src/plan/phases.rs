//! The whole deployment as ordered phases (decision 0088-phased-deploy-and-helm-hooks), planned
//! from what the agent observed in one pass: namespace manifests, the other namespaces, copies,
//! CRDs, the pre hooks, the ordinary objects, the post hooks, and the prune set. Pure: the
//! executor runs the phases, [`gate`] says when one may not start, and a refused or failing object
//! is an entry to report.

use std::collections::BTreeSet;

use serde_json::Value;
use tender_types::hash::value_hash;
use tender_types::labels;
use tender_types::{BundleDeploymentOptions, Manifest, ObjectRef, ObjectState, ObjectStatus};

use super::{Desired, Mode, Owner, Planned, group_of, manifest, prune_set, union};
use crate::hooks::{DeletePolicy, HookEvent};
use crate::policy::Policy;

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
        /// A CRD of the chart's `crds/`: one that exists without tender's metadata (a hook or
        /// an earlier Helm install made it) is the chart's own and adopted, never a Conflict.
        adopt: bool,
    },
    /// Run a hook.
    Hook(HookStep),
    /// An `Apply` decided from the live object: nothing to write, the object's state is known
    /// (in sync, a conflict, drift left alone, refused adoption, unreadable).
    Settled(ObjectStatus),
    /// An `Apply` decided from the live object: these operations.
    Write(super::Write),
}

impl Entry {
    fn of(planned: Planned, chart: bool) -> Self {
        match planned {
            Ok(desired) => Self::Apply {
                desired,
                chart,
                adopt: false,
            },
            Err(status) => Self::Report(status),
        }
    }

    /// How an entry is written: `manifests` for inline manifests and copies, `chart` for the
    /// chart's objects; a `crds/` CRD is adopted whatever `takeOwnership` says (Helm's own
    /// `crds/` install never fails on an existing CRD). Another BundleDeployment's CRD stays a
    /// Conflict ([`super::may_write`]).
    pub fn mode(&self, manifests: Mode, chart: Mode) -> Mode {
        match self {
            Self::Apply { adopt: true, .. } => Mode {
                take_ownership: true,
                ..chart
            },
            Self::Apply { chart: true, .. } => chart,
            _ => manifests,
        }
    }

    /// The object this entry is about.
    pub fn key(&self) -> ObjectRef {
        match self {
            Self::Report(s) => s.object(),
            Self::Apply { desired, .. } => desired.key.clone(),
            Self::Hook(h) => h.desired.key.clone(),
            Self::Settled(s) => s.object(),
            Self::Write(w) => w.desired.key.clone(),
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
    /// The first phase, `record`: the inventory written before anything is created (`None`:
    /// the recorded one already lists every object of this run).
    pub record_write: Option<InventoryWrite>,
    /// The last phase, `prune`, once every other is in place ([`may_prune`]): `prune` removed
    /// (the last recorded first; kept with `keepResources`), then the inventory narrowed to
    /// `desired` with this run's chart release (`None`: it already says so).
    pub final_write: Option<InventoryWrite>,
    /// `keepResources`: pruning only strips tender's metadata.
    pub keep: bool,
}

/// The content of one inventory write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryWrite {
    /// The objects recorded.
    pub objects: Vec<ObjectRef>,
    /// The chart release recorded (`<revision>/<deploymentID>`).
    pub release: Option<String>,
}

/// The inventory write that makes the recorded inventory (`recorded`: objects and release;
/// `None`: there is none yet) say `objects` and `release`; `None` when it already does.
pub fn inventory_write(
    recorded: Option<(&[ObjectRef], Option<&str>)>,
    objects: &[ObjectRef],
    release: Option<&str>,
) -> Option<InventoryWrite> {
    let same = recorded.is_some_and(|(o, r)| o == objects && r == release);
    (!same).then(|| InventoryWrite {
        objects: objects.to_vec(),
        release: release.map(str::to_string),
    })
}

/// Whether the prune phase runs: every entry of every phase run before is in place.
pub fn may_prune(done: &[(Phase, Vec<ObjectStatus>)]) -> bool {
    done.iter().flat_map(|(_, s)| s).all(in_place)
}

/// A manifest as observed: its kind's scope from discovery (`Err`: why it cannot be applied,
/// e.g. `KindNotInstalled`).
#[derive(Clone, Debug)]
pub struct Found {
    /// The manifest as written or rendered.
    pub manifest: Manifest,
    /// Whether its kind is namespaced downstream.
    pub namespaced: Result<bool, String>,
}

/// A copy as observed: planned from the hub's verified Secret or ConfigMap, or an object of
/// another kind carried by a verified carrier (planned here, [`super::carried_copy`]).
#[derive(Clone, Debug)]
pub enum FoundCopy {
    /// A Secret or ConfigMap copy (or why it cannot be made).
    Planned(Planned),
    /// A carried object for one namespace (`None`: cluster-scoped).
    Carried {
        /// The verified carrier's object.
        object: Value,
        /// Its `downstreamResources` entry.
        entry: tender_types::CopiedResource,
        /// Where it goes.
        namespace: Option<String>,
        /// When the hub signed the carrier.
        signed_at: u64,
    },
}

impl FoundCopy {
    /// The copy planned, for `owner` (`keep`: `keepResources`).
    // `Planned` carries an ObjectStatus as its error by design (it is the status to report).
    #[allow(clippy::result_large_err)]
    fn plan(self, owner: &Owner, keep: bool) -> Planned {
        match self {
            Self::Planned(p) => p,
            Self::Carried {
                object,
                entry,
                namespace,
                signed_at,
            } => Ok(super::carried_copy(
                &object,
                &entry,
                namespace.as_deref(),
                owner,
                keep,
                signed_at,
            )),
        }
    }
}

/// A chart hook as observed.
#[derive(Clone, Debug)]
pub struct FoundHook {
    /// The event it runs at.
    pub event: HookEvent,
    /// Its object.
    pub found: Found,
    /// `helm.sh/hook-delete-policy`.
    pub delete: DeletePolicy,
    /// Whether the rollout waits for it.
    pub waits: bool,
}

/// What one observation of a deployment found: the plan's only input besides the owner's
/// policy.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// A new deploymentID is waiting to be applied.
    pub pending: bool,
    /// The deploymentID (marks this run's hook objects).
    pub run: String,
    /// Whose objects these are.
    pub owner: Owner,
    /// The deployment's options.
    pub options: BundleDeploymentOptions,
    /// The fan-out namespaces (`None`: no fan-out, or its selector is invalid).
    pub fan_out: Option<BTreeSet<String>>,
    /// The copies, in `downstreamResources` order (one per fan-out namespace).
    pub copies: Vec<FoundCopy>,
    /// The inline manifests followed by the chart's ordinary objects (from `chart_from` on).
    pub manifests: Vec<Found>,
    /// Index of the first chart object in `manifests`.
    pub chart_from: usize,
    /// The chart's entry when it was not rendered (failed, or waiting for a copy).
    pub chart_entry: Option<ObjectStatus>,
    /// CRDs from the chart's `crds/` directory.
    pub crds: Vec<Found>,
    /// The chart's hooks of this run's events, in Helm's order per event.
    pub hooks: Vec<FoundHook>,
    /// Whether the chart is upgraded (an earlier deployment of it was applied).
    pub upgrade: bool,
    /// The inventory before this run.
    pub previous: Vec<ObjectRef>,
    /// Whether there is an inventory (one is written even when it lists nothing).
    pub recorded: bool,
    /// The chart release the inventory records (the one applied last).
    pub applied_release: Option<String>,
    /// This run's chart release, recorded once it is applied.
    pub release: Option<String>,
}

fn is_namespace(p: &Planned) -> bool {
    p.as_ref()
        .is_ok_and(|d| d.key.kind == "Namespace" && group_of(&d.key.api_version).is_empty())
}

/// The desired objects of one observed manifest: once, or with fan-out once per namespace for
/// a namespaced kind.
// `Planned` carries an ObjectStatus as its error by design (it is the status to report).
#[allow(clippy::result_large_err)]
fn desired_of(
    found: &Found,
    options: &BundleDeploymentOptions,
    fan_out: Option<&BTreeSet<String>>,
    owner: &Owner,
) -> Vec<Planned> {
    let m = &found.manifest;
    let key = ObjectRef::new(
        m.api_version().unwrap_or_default(),
        m.kind().unwrap_or_default(),
        m.namespace(),
        m.name().unwrap_or_default(),
    );
    let error = |msg: String| ObjectStatus::new(&key, ObjectState::Error, Some(msg));
    let namespaced = match &found.namespaced {
        Ok(namespaced) => *namespaced,
        Err(msg) => return vec![Err(error(msg.clone()))],
    };
    let one = |o: &BundleDeploymentOptions| manifest(m, namespaced, o, owner).map_err(error);
    match fan_out {
        Some(set) if namespaced => set
            .iter()
            .map(|ns| {
                let mut o = options.clone();
                o.target_namespace = Some(ns.clone());
                one(&o)
            })
            .collect(),
        _ => vec![one(options)],
    }
}

/// The phases of a deployment. Hooks run only while a new deploymentID is pending (an applied
/// deployment is kept in place without running them again). An object the owner's `policy`
/// refuses is reported and left alone (not applied, and kept out of pruning so an object
/// deployed before the policy changed stays as it is).
pub fn plan(observed: Observed, policy: &Policy, agent_namespace: &str) -> DeployPlan {
    let Observed {
        pending,
        run,
        owner,
        options,
        fan_out,
        copies,
        manifests,
        chart_from,
        chart_entry,
        crds,
        hooks,
        upgrade,
        previous,
        recorded,
        applied_release,
        release,
    } = observed;
    let mut objects: Vec<(Planned, bool)> = Vec::new();
    for (i, found) in manifests.iter().enumerate() {
        let chart = i >= chart_from;
        for p in desired_of(found, &options, fan_out.as_ref(), &owner) {
            objects.push((p, chart));
        }
    }
    objects.extend(chart_entry.map(|s| (Err(s), true)));
    // CRDs from `crds/` are never deleted by tender, as Helm never deletes them.
    let mut kept = options.clone();
    kept.keep_resources = true;
    let mut crds: Vec<Planned> = crds
        .iter()
        .flat_map(|f| desired_of(f, &kept, None, &owner))
        .collect();
    let mut hooks: Vec<(HookEvent, Planned, DeletePolicy, bool)> = hooks
        .iter()
        .flat_map(|h| {
            desired_of(&h.found, &options, None, &owner)
                .into_iter()
                .map(|p| (h.event, p.map(|d| hook_object(d, &run)), h.delete, h.waits))
        })
        .collect();
    let mut copies: Vec<Planned> = copies
        .into_iter()
        .map(
            #[allow(clippy::result_large_err)]
            |c| c.plan(&owner, options.keep_resources),
        )
        .collect();
    let mut refused: Vec<ObjectRef> = Vec::new();
    let all = copies
        .iter_mut()
        .chain(objects.iter_mut().map(|(p, _)| p))
        .chain(crds.iter_mut())
        .chain(hooks.iter_mut().map(|(_, p, _, _)| p));
    for p in all {
        if let Ok(d) = p
            && let Some(why) = policy.refusal(&d.key, agent_namespace)
        {
            refused.push(d.key.clone());
            *p = Err(ObjectStatus::new(&d.key, ObjectState::Error, Some(why)));
        }
    }

    let hook_objects: Vec<&Planned> = hooks.iter().map(|(_, p, _, _)| p).collect();
    let desired = desired_keys(&copies, &crds, &objects, &hook_objects, refused);
    let record = union(&previous, &desired);
    let prune = prune_set(&record, &desired);

    let namespaces = other_namespaces(&copies, &crds, &objects, &hook_objects);

    let (ns_objects, rest): (Vec<_>, Vec<_>) =
        objects.into_iter().partition(|(p, _)| is_namespace(p));
    let mut phases = vec![
        PlannedPhase {
            phase: Phase::Namespaces,
            entries: ns_objects
                .into_iter()
                .map(|(p, chart)| Entry::of(p, chart))
                .collect(),
        },
        PlannedPhase {
            phase: Phase::Copies,
            entries: copies.into_iter().map(|p| Entry::of(p, false)).collect(),
        },
        PlannedPhase {
            phase: Phase::Crds,
            entries: crds
                .into_iter()
                .map(|p| match Entry::of(p, true) {
                    Entry::Apply { desired, chart, .. } => Entry::Apply {
                        desired,
                        chart,
                        adopt: true,
                    },
                    e => e,
                })
                .collect(),
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
            .map(|(p, chart)| Entry::of(p, chart))
            .collect(),
    });
    if pending {
        phases.push(hook_phase(post));
    }
    phases.retain(|p| !p.entries.is_empty());
    let before = recorded.then_some((previous.as_slice(), applied_release.as_deref()));
    let record_write = inventory_write(before, &record, applied_release.as_deref());
    let after = Some((record.as_slice(), applied_release.as_deref()));
    let final_write = inventory_write(after, &desired, release.as_deref());
    DeployPlan {
        record,
        desired,
        namespaces,
        phases,
        prune,
        record_write,
        final_write,
        keep: options.keep_resources,
    }
}

/// Every object the deployment wants, in apply order, refused ones included (so they are not
/// pruned). A hook object is findable like any other (a crash leaves nothing unknown); it is
/// kept while the chart renders it and pruned when the chart stops rendering it.
fn desired_keys(
    copies: &[Planned],
    crds: &[Planned],
    objects: &[(Planned, bool)],
    hooks: &[&Planned],
    refused: Vec<ObjectRef>,
) -> Vec<ObjectRef> {
    let mut desired: Vec<ObjectRef> = copies
        .iter()
        .chain(crds)
        .chain(objects.iter().map(|(p, _)| p))
        .chain(hooks.iter().copied())
        .filter_map(|p| p.as_ref().ok().map(|d| d.key.clone()))
        .collect();
    desired.extend(refused);
    dedup(&mut desired);
    desired
}

/// The namespaces objects land in that are not among the namespace manifests, sorted.
fn other_namespaces(
    copies: &[Planned],
    crds: &[Planned],
    objects: &[(Planned, bool)],
    hooks: &[&Planned],
) -> Vec<String> {
    let own_namespaces: Vec<String> = objects
        .iter()
        .filter(|(p, _)| is_namespace(p))
        .filter_map(|(p, _)| p.as_ref().ok().map(|d| d.key.name.clone()))
        .collect();
    let mut namespaces: Vec<String> = objects
        .iter()
        .map(|(p, _)| p)
        .chain(copies)
        .chain(crds)
        .chain(hooks.iter().copied())
        .filter_map(|p| p.as_ref().ok().and_then(|d| d.key.namespace.clone()))
        .filter(|ns| !own_namespaces.contains(ns))
        .collect();
    namespaces.sort();
    namespaces.dedup();
    namespaces
}

/// The entries of removal hooks (`pre-delete`, `post-delete`) as observed.
pub fn removal_hooks(
    hooks: &[FoundHook],
    options: &BundleDeploymentOptions,
    owner: &Owner,
    run: &str,
    policy: &Policy,
    agent_namespace: &str,
) -> Vec<Entry> {
    hooks
        .iter()
        .flat_map(|h| {
            desired_of(&h.found, options, None, owner)
                .into_iter()
                .map(move |p| match p {
                    Ok(d) => match policy.refusal(&d.key, agent_namespace) {
                        Some(why) => {
                            Entry::Report(ObjectStatus::new(&d.key, ObjectState::Error, Some(why)))
                        }
                        None => Entry::Hook(HookStep {
                            desired: hook_object(d, run),
                            event: h.event,
                            delete: h.delete,
                            waits: h.waits,
                        }),
                    },
                    Err(s) => Entry::Report(s),
                })
        })
        .collect()
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

/// The status of an entry that did not run because its phase was gated.
pub fn not_started(key: &ObjectRef, why: &str) -> ObjectStatus {
    ObjectStatus::new(key, ObjectState::Missing, Some(why.to_string()))
}

#[cfg(test)]
#[path = "phases_tests.rs"]
mod tests;
