//! Where a Helm hook's run stands, judged from its live Job or Pod and from the last reported
//! status (decision 0088-phased-deploy-and-helm-hooks). Pure: the executor asks, and acts.

use serde_json::Value;
use tender_types::{ObjectRef, ObjectState, ObjectStatus};

use super::phases::{HOOK_RUN, HookStep};

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

/// The hooks the last reported status says failed in run `deployment_id` (a `hook-failed`
/// hook's object is gone; it is not started again before a new deployment).
pub fn failed_hooks(
    status: Option<&tender_types::BundleDeploymentStatus>,
    deployment_id: &str,
) -> Vec<ObjectRef> {
    let marker = run_marker(deployment_id);
    status
        .iter()
        .flat_map(|s| &s.resources)
        .filter(|s| {
            s.state == ObjectState::Error
                && s.message.as_deref().is_some_and(|m| {
                    m.starts_with(tender_types::conditions::reason::HOOK_FAILED)
                        && m.contains(&marker)
                })
        })
        .map(ObjectStatus::object)
        .collect()
}

/// How a hook failure names the deployment (run) it failed in.
pub fn run_marker(deployment_id: &str) -> String {
    let short: String = deployment_id.chars().take(12).collect();
    format!("[deployment {short}]")
}
