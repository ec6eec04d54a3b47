use serde_json::json;
use tender_types::{Manifest, ObjectState};

use super::super::fixtures::*;
use super::super::{HookProgress, finished, hook_progress, run_marker};
use super::super::{key, manifest, object_plan};
use super::*;
use crate::hooks::{DeletePolicy, HookEvent};
use crate::policy::Policy;

#[allow(clippy::result_large_err)]
fn found(kind: &str, name: &str) -> Found {
    let api = match kind {
        "Deployment" => "apps/v1",
        "Job" => "batch/v1",
        "CustomResourceDefinition" => "apiextensions.k8s.io/v1",
        _ => "v1",
    };
    Found {
        manifest: Manifest(json!({"apiVersion": api, "kind": kind, "metadata": {"name": name}})),
        namespaced: Ok(!matches!(kind, "Namespace" | "CustomResourceDefinition")),
    }
}

#[allow(clippy::result_large_err)]
fn object(kind: &str, name: &str) -> Planned {
    let f = found(kind, name);
    manifest(
        &f.manifest,
        f.namespaced.unwrap(),
        &opts(Some("apps")),
        &owner(),
    )
    .map_err(|msg| not_started(&key("v1", kind, None, name), &msg))
}

fn hook(event: HookEvent, name: &str) -> FoundHook {
    FoundHook {
        event,
        found: found("Job", name),
        delete: DeletePolicy::default(),
        waits: true,
    }
}

/// The owner refuses PodTemplates (and nothing else) in these tests.
fn policy() -> Policy {
    Policy {
        allowed_namespaces: Vec::new(),
        refused_kinds: vec!["PodTemplate".into()],
        readable_namespaces: None,
    }
}

fn planned(o: Observed) -> DeployPlan {
    plan(o, &policy(), "tender-system")
}

fn observed(pending: bool, upgrade: bool) -> Observed {
    let (pre, post) = HookEvent::around(upgrade);
    Observed {
        pending,
        run: "d2".into(),
        owner: owner(),
        options: opts(Some("apps")),
        copies: vec![FoundCopy::Planned(Ok(db_copy(&hub_secret())))],
        manifests: vec![
            found("Namespace", "apps"),
            found("ConfigMap", "inline"),
            found("PodTemplate", "refused"),
            found("Deployment", "web"),
        ],
        chart_from: 3,
        crds: vec![found("CustomResourceDefinition", "widgets.x.io")],
        hooks: vec![hook(pre, "migrate"), hook(post, "notify")],
        upgrade,
        previous: vec![
            key("v1", "ConfigMap", Some("apps"), "inline"),
            key("v1", "ConfigMap", Some("apps"), "gone"),
        ],
        ..Default::default()
    }
}

fn shape(plan: &DeployPlan) -> Vec<(String, Vec<String>)> {
    plan.phases
        .iter()
        .map(|p| {
            let entries = p
                .entries
                .iter()
                .map(|e| {
                    let k = e.key();
                    let what = match e {
                        Entry::Report(_) => "report",
                        Entry::Apply { chart: true, .. } => "chart",
                        Entry::Apply { .. } => "apply",
                        Entry::Hook(_) => "hook",
                        Entry::Settled(_) => "settled",
                        Entry::Write(_) => "write",
                    };
                    format!("{what} {} {}", k.kind, k.name)
                })
                .collect();
            (p.phase.name().to_string(), entries)
        })
        .collect()
}

#[test]
fn an_install_runs_its_phases_in_helm_order() {
    let plan = planned(observed(true, false));
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        shape(&plan),
        vec![
            ("namespaces".into(), s(&["apply Namespace apps"])),
            ("copies".into(), s(&["apply Secret db"])),
            (
                "CRDs".into(),
                s(&["chart CustomResourceDefinition widgets.x.io"])
            ),
            ("pre-install".into(), s(&["hook Job migrate"])),
            (
                "objects".into(),
                s(&[
                    "apply ConfigMap inline",
                    "report PodTemplate refused",
                    "chart Deployment web"
                ])
            ),
            ("post-install".into(), s(&["hook Job notify"])),
        ]
    );
    // Hooks and refused objects are recorded and never pruned; what went is.
    assert!(
        plan.desired
            .contains(&key("batch/v1", "Job", Some("apps"), "migrate"))
    );
    assert!(
        plan.desired
            .contains(&key("v1", "PodTemplate", Some("apps"), "refused"))
    );
    assert_eq!(
        plan.prune,
        vec![key("v1", "ConfigMap", Some("apps"), "gone")]
    );
    assert!(
        plan.record
            .contains(&key("v1", "ConfigMap", Some("apps"), "gone"))
    );
    // The namespace among the manifests is not ensured a second time.
    assert!(plan.namespaces.is_empty());
}

#[test]
fn an_upgrade_runs_the_upgrade_hooks_and_an_applied_deployment_runs_none() {
    let upgrade = planned(observed(true, true));
    let phases: Vec<_> = upgrade.phases.iter().map(|p| p.phase.name()).collect();
    assert_eq!(
        phases,
        [
            "namespaces",
            "copies",
            "CRDs",
            "pre-upgrade",
            "objects",
            "post-upgrade"
        ]
    );
    let applied = planned(observed(false, true));
    let phases: Vec<_> = applied.phases.iter().map(|p| p.phase.name()).collect();
    assert_eq!(phases, ["namespaces", "copies", "CRDs", "objects"]);
    // Its hook objects stay recorded (not pruned while the chart renders them).
    assert!(
        applied
            .desired
            .contains(&key("batch/v1", "Job", Some("apps"), "notify"))
    );
}

#[test]
fn a_hook_object_carries_its_run_and_a_renewed_hash() {
    let plain = object("Job", "migrate").unwrap();
    let marked = hook_object(plain.clone(), "d2");
    assert_eq!(marked.body["metadata"]["annotations"][HOOK_RUN], "d2");
    assert_ne!(marked.hash, plain.hash);
    assert_eq!(
        marked.body["metadata"]["annotations"][labels::CONTENT_HASH],
        marked.hash.as_str()
    );
    assert_eq!(hook_object(plain, "d2"), marked, "deterministic");
}

fn st(kind: &str, state: ObjectState) -> ObjectStatus {
    not_started(&key("v1", kind, Some("apps"), "x"), "m").with_state(state)
}

trait WithState {
    fn with_state(self, state: ObjectState) -> Self;
}

impl WithState for ObjectStatus {
    fn with_state(mut self, state: ObjectState) -> Self {
        self.state = state;
        self
    }
}

#[test]
fn gates_hold_later_phases_while_pending_only() {
    let copies_missing = vec![(Phase::Copies, vec![st("Secret", ObjectState::Missing)])];
    assert!(gate(Phase::Objects, true, &copies_missing).is_some());
    assert!(gate(Phase::Hooks(HookEvent::PreInstall), true, &copies_missing).is_some());
    assert_eq!(gate(Phase::Objects, false, &copies_missing), None);
    let hook_running = vec![
        (Phase::Copies, vec![st("Secret", ObjectState::Ready)]),
        (
            Phase::Hooks(HookEvent::PreInstall),
            vec![st("Job", ObjectState::Missing)],
        ),
    ];
    let why = gate(Phase::Objects, true, &hook_running).unwrap();
    assert!(why.contains("pre-install"), "{why}");
    let objects_failed = vec![(Phase::Objects, vec![st("ConfigMap", ObjectState::Error)])];
    assert!(gate(Phase::Hooks(HookEvent::PostInstall), true, &objects_failed).is_some());
    let fine = vec![
        (Phase::Copies, vec![st("Secret", ObjectState::Ready)]),
        (Phase::Objects, vec![st("ConfigMap", ObjectState::NotReady)]),
    ];
    assert_eq!(
        gate(Phase::Hooks(HookEvent::PostInstall), true, &fine),
        None
    );
}

#[test]
fn hook_progress_follows_the_live_object_of_this_run() {
    let step = HookStep {
        desired: hook_object(object("Job", "migrate").unwrap(), "d2"),
        event: HookEvent::PreInstall,
        delete: DeletePolicy::default(),
        waits: true,
    };
    let live = |run: &str, status: Value| json!({"kind": "Job", "metadata": {"uid": "u1", "annotations": {HOOK_RUN: run}}, "status": status});
    assert_eq!(
        hook_progress(&step, "d2", None, false),
        HookProgress::Start { replace: None }
    );
    assert_eq!(
        hook_progress(&step, "d2", Some(&live("d1", json!({}))), true),
        HookProgress::Start {
            replace: Some("u1".into())
        }
    );
    assert_eq!(
        hook_progress(&step, "d2", Some(&live("d1", json!({}))), false),
        HookProgress::NotOurs
    );
    assert_eq!(
        hook_progress(&step, "d2", Some(&live("d2", json!({}))), true),
        HookProgress::Running
    );
    let complete = json!({"conditions": [{"type": "Complete", "status": "True"}]});
    assert_eq!(
        hook_progress(&step, "d2", Some(&live("d2", complete)), true),
        HookProgress::Succeeded
    );
    let failed = json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]});
    assert_eq!(
        hook_progress(&step, "d2", Some(&live("d2", failed)), true),
        HookProgress::Failed(
            "BackoffLimitExceeded: Job has reached the specified backoff limit".into()
        )
    );
    let pod = json!({"kind": "Pod", "status": {"phase": "Succeeded"}});
    assert_eq!(finished(&pod), Some(Ok(())));
    let not_waited = HookStep {
        waits: false,
        ..step
    };
    assert_eq!(
        hook_progress(&not_waited, "d2", Some(&live("d2", json!({}))), true),
        HookProgress::Succeeded
    );
}

#[test]
fn a_refused_or_unrendered_entry_is_reported_not_written() {
    let mut o = observed(true, false);
    o.chart_entry = Some(not_started(
        &key("v1", "Chart", None, "web"),
        "ChartRenderFailed: boom",
    ));
    o.manifests.push(Found {
        namespaced: Err("KindNotInstalled: Widget".into()),
        ..found("Widget", "w")
    });
    let plan = planned(o);
    let objects = plan
        .phases
        .iter()
        .find(|p| p.phase == Phase::Objects)
        .unwrap();
    let n = objects.entries.len();
    assert!(
        matches!(objects.entries[n - 2], Entry::Report(_)),
        "the unknown kind"
    );
    assert!(
        matches!(objects.entries[n - 1], Entry::Report(_)),
        "the chart"
    );
}

#[test]
fn a_hook_failure_names_its_deployment() {
    assert_eq!(run_marker("0123456789abcdef"), "[deployment 0123456789ab]");
    assert_eq!(run_marker("d2"), "[deployment d2]");
}

/// The `crds/` entry of `plan`, with the mode it is written in.
fn crd_entry(plan: &DeployPlan, manifests: Mode, chart: Mode) -> (Desired, Mode) {
    let phase = plan
        .phases
        .iter()
        .find(|p| p.phase == Phase::Crds)
        .expect("a CRDs phase");
    match &phase.entries[..] {
        [e @ Entry::Apply { desired, .. }] => (desired.clone(), e.mode(manifests, chart)),
        other => panic!("one CRD to apply: {other:?}"),
    }
}

fn crd_key(name: &str) -> tender_runtime::ObjectKey {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    tender_runtime::ObjectKey::of::<CustomResourceDefinition>(None, name)
}

/// A pre-install hook that creates (or replaces) one of the chart's `crds/` CRDs leaves it
/// without tender's metadata: the chart's own CRD is adopted (Helm skips an existing `crds/`
/// CRD), never a Conflict, whatever takeOwnership says; another BundleDeployment's stays one,
/// and so does an unmanaged CRD the chart renders under `templates/`.
#[test]
fn a_crds_crd_a_hook_made_is_adopted_not_a_conflict() {
    let plan = planned(observed(true, false));
    let mode = Mode {
        pending: true,
        correct_drift: false,
        take_ownership: false,
    };
    let (desired, crd_mode) = crd_entry(&plan, mode, mode);
    assert!(crd_mode.take_ownership);
    let key = crd_key("widgets.x.io");
    let made_by_hook = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.x.io", "uid": "u", "resourceVersion": "3",
                     "annotations": {"note": "the hook's"}},
        "spec": {"group": "x.io"}
    });
    for pending in [true, false] {
        let mode = Mode {
            pending,
            ..crd_mode
        };
        assert!(
            matches!(
                object_plan(&desired, &key, Some(&made_by_hook), &owner(), mode),
                super::super::ObjectPlan::Write { .. }
            ),
            "adopted (pending: {pending})"
        );
    }
    let mut theirs = made_by_hook.clone();
    theirs["metadata"]["annotations"][tender_types::labels::OWNER_ANNOTATION] =
        json!("cluster-ws-c2-1/other");
    assert!(matches!(
        object_plan(&desired, &key, Some(&theirs), &owner(), crd_mode),
        super::super::ObjectPlan::Settled {
            state: ObjectState::Conflict,
            ..
        }
    ));
    // Any other entry keeps the takeOwnership it was given.
    let objects = plan
        .phases
        .iter()
        .find(|p| p.phase == Phase::Objects)
        .unwrap();
    assert!(
        objects
            .entries
            .iter()
            .all(|e| !e.mode(mode, mode).take_ownership)
    );
}

/// A `crds/` CRD is never deleted: not when the Bundle goes (keepResources or not), not when
/// an upgrade stops rendering it — it is stripped of tender's metadata and stays, and every
/// custom resource of its kind with it.
#[test]
fn a_crds_crd_is_never_deleted() {
    use super::super::removal_op;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tender_runtime::Op;

    let plan = planned(observed(true, false));
    let mode = Mode {
        pending: true,
        correct_drift: false,
        take_ownership: false,
    };
    let (desired, _) = crd_entry(&plan, mode, mode);
    assert!(!plan.prune.contains(&desired.key), "desired, not pruned");
    let mut live: ObjectMeta = serde_json::from_value(desired.body["metadata"].clone()).unwrap();
    live.uid = Some("u".into());
    for keep in [false, true] {
        let op = removal_op(crd_key("widgets.x.io"), &live, &owner(), keep);
        assert!(
            matches!(op, Some((Op::MergePatch { .. }, "strip"))),
            "keepResources {keep}: {op:?}"
        );
    }
    // An upgrade whose chart no longer has the CRD prunes it: stripped, not deleted.
    let mut next = observed(true, true);
    next.crds.clear();
    next.previous.push(desired.key.clone());
    let upgrade = planned(next);
    assert!(upgrade.prune.contains(&desired.key));
    assert!(matches!(
        removal_op(crd_key("widgets.x.io"), &live, &owner(), false),
        Some((Op::MergePatch { .. }, "strip"))
    ));
}

#[test]
fn the_inventory_is_recorded_first_only_when_it_lacks_an_object_and_narrowed_last() {
    // No inventory yet: recorded first (even a plan with nothing new writes one), then
    // narrowed to what is desired.
    let plan = planned(observed(true, false));
    let first = plan.record_write.clone().expect("no inventory yet");
    assert_eq!(first.objects, plan.record);
    assert_eq!(first.release, None);
    let last = plan.final_write.clone().expect("`gone` is pruned");
    assert_eq!(last.objects, plan.desired);
    assert!(
        !last
            .objects
            .contains(&key("v1", "ConfigMap", Some("apps"), "gone"))
    );
    assert_eq!(plan.prune, [key("v1", "ConfigMap", Some("apps"), "gone")]);

    // An inventory listing exactly what is desired, with the chart's release applied: no
    // inventory write at all.
    let mut o = observed(false, true);
    let desired = planned(o.clone()).desired;
    o.previous = desired.clone();
    o.recorded = true;
    o.applied_release = Some("2/d2".into());
    o.release = Some("2/d2".into());
    let plan = planned(o.clone());
    assert_eq!(plan.record_write, None);
    assert_eq!(plan.final_write, None);
    assert!(plan.prune.is_empty());

    // An upgrade's release is recorded once applied, not before.
    o.release = Some("3/d3".into());
    let plan = planned(o);
    assert_eq!(plan.record_write, None, "nothing new to record");
    let last = plan.final_write.expect("the release advances");
    assert_eq!(last.release.as_deref(), Some("3/d3"));
    assert_eq!(last.objects, desired);
}

#[test]
fn inventory_writes_compare_objects_and_release() {
    let a = [key("v1", "ConfigMap", Some("apps"), "a")];
    assert!(inventory_write(None, &[], None).is_some(), "none yet");
    assert_eq!(
        inventory_write(Some((&a, Some("1/x"))), &a, Some("1/x")),
        None
    );
    assert!(inventory_write(Some((&a, Some("1/x"))), &a, Some("2/y")).is_some());
    assert!(inventory_write(Some((&a, None)), &[], None).is_some());
}

#[test]
fn pruning_waits_for_every_phase_in_place() {
    let ready = vec![(Phase::Copies, vec![st("Secret", ObjectState::Ready)])];
    assert!(may_prune(&ready));
    assert!(may_prune(&[]));
    let mut waiting = ready.clone();
    waiting.push((
        Phase::Objects,
        vec![
            st("ConfigMap", ObjectState::Ready),
            st("Deployment", ObjectState::Conflict),
        ],
    ));
    assert!(!may_prune(&waiting), "a conflict keeps what is deployed");
}

#[test]
fn a_carried_copy_is_planned_per_namespace_with_keep_resources() {
    let mut o = observed(true, false);
    o.options.keep_resources = true;
    let entry = tender_types::CopiedResource {
        api_version: Some("example.io/v1".into()),
        ..entry("Widget", "w")
    };
    let object = json!({"apiVersion": "example.io/v1", "kind": "Widget",
                        "metadata": {"name": "w", "namespace": "hub-ns"}, "spec": {"size": 1}});
    o.copies = ["a", "b"]
        .into_iter()
        .map(|ns| FoundCopy::Carried {
            object: object.clone(),
            entry: entry.clone(),
            namespace: Some(ns.into()),
            signed_at: 7,
        })
        .collect();
    let plan = planned(o);
    let copies = &plan
        .phases
        .iter()
        .find(|p| p.phase == Phase::Copies)
        .unwrap()
        .entries;
    let keys: Vec<_> = copies.iter().map(Entry::key).collect();
    assert_eq!(
        keys,
        [
            key("example.io/v1", "Widget", Some("a"), "w"),
            key("example.io/v1", "Widget", Some("b"), "w")
        ]
    );
    let Entry::Apply { desired, .. } = &copies[0] else {
        panic!("{:?}", copies[0]);
    };
    assert_eq!(desired.body["metadata"]["namespace"], "a");
    assert_eq!(desired.body["spec"]["size"], 1);
    assert!(plan.keep, "keepResources reaches the prune phase");
}
