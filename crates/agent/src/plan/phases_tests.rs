use serde_json::json;
use tender_types::{Manifest, ObjectState};

use super::super::fixtures::*;
use super::super::{key, manifest};
use super::*;
use crate::hooks::{DeletePolicy, HookEvent};

#[allow(clippy::result_large_err)]
fn object(kind: &str, name: &str) -> Planned {
    let api = if kind == "Deployment" || kind == "Job" {
        if kind == "Job" { "batch/v1" } else { "apps/v1" }
    } else {
        "v1"
    };
    let m = Manifest(json!({"apiVersion": api, "kind": kind, "metadata": {"name": name}}));
    manifest(&m, kind != "Namespace", &opts(Some("apps")), &owner())
        .map_err(|msg| not_started(&key(api, kind, None, name), &msg))
}

fn hook(event: HookEvent, name: &str) -> (HookEvent, Planned, DeletePolicy, bool) {
    let p = object("Job", name).map(|d| hook_object(d, "d2"));
    (event, p, DeletePolicy::default(), true)
}

fn observed(pending: bool, upgrade: bool) -> Observed {
    let (pre, post) = HookEvent::around(upgrade);
    Observed {
        pending,
        copies: vec![Ok(db_copy(&hub_secret()))],
        manifests: vec![
            object("Namespace", "apps"),
            object("ConfigMap", "inline"),
            object("Deployment", "web"),
        ],
        chart_from: 2,
        crds: vec![object("CustomResourceDefinition", "widgets.x.io")],
        hooks: vec![hook(pre, "migrate"), hook(post, "notify")],
        upgrade,
        refused: vec![key("v1", "Secret", Some("apps"), "refused")],
        previous: vec![
            key("v1", "ConfigMap", Some("apps"), "inline"),
            key("v1", "ConfigMap", Some("apps"), "gone"),
        ],
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
    let plan = plan(observed(true, false));
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
                s(&["apply ConfigMap inline", "chart Deployment web"])
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
            .contains(&key("v1", "Secret", Some("apps"), "refused"))
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
    let upgrade = plan(observed(true, true));
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
    let applied = plan(observed(false, true));
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
    o.manifests.push(Err(not_started(
        &key("v1", "Chart", None, "web"),
        "ChartRenderFailed: boom",
    )));
    let plan = plan(o);
    let objects = plan
        .phases
        .iter()
        .find(|p| p.phase == Phase::Objects)
        .unwrap();
    assert!(matches!(objects.entries.last(), Some(Entry::Report(_))));
}

#[test]
fn a_hook_failure_names_its_deployment() {
    assert_eq!(run_marker("0123456789abcdef"), "[deployment 0123456789ab]");
    assert_eq!(run_marker("d2"), "[deployment d2]");
}
