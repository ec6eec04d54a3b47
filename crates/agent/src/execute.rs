//! Runs a [`DeployPlan`]'s phases in order (decision 0088-phased-deploy-and-helm-hooks): namespace
//! manifests, the other namespaces, then each phase once [`plan::gate`] lets it start. An object
//! decided by the plan is written by [`write_object`] (or its decided state reported); a hook is created for this run (its previous run's object deleted
//! first), waited for, and judged. What each entry became is returned per phase; nothing here
//! decides the deployment's status.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use tender_runtime::executor::Apply;
use tender_runtime::{Executor, Op};
use tender_types::conditions::reason;
use tender_types::{ObjectRef, ObjectState, ObjectStatus};

use crate::context::Context;
use crate::downstream;
use crate::downstream::message;
use crate::plan::{self, DeployPlan, Entry, HookProgress, HookStep, Mode, Owner, Phase};

use crate::sync::{ensure_namespace, settled, write_object};

/// How one run of a deployment's phases went.
#[derive(Debug, Default)]
pub(crate) struct Executed {
    /// Each phase with the status of each of its entries (hooks included).
    pub(crate) phases: Vec<(Phase, Vec<ObjectStatus>)>,
    /// Objects restored after downstream drift.
    pub(crate) corrected: Vec<ObjectRef>,
    /// A hook is running: look again soon (its Job's changes also wake the deployment).
    pub(crate) hook_running: bool,
    /// The kinds written, to watch for drift (started by the report step).
    pub(crate) watch: Vec<kube::discovery::ApiResource>,
}

/// How the entries of a run are written.
pub(crate) struct Run<'a> {
    pub(crate) ctx: &'a Context,
    pub(crate) writer: &'a Executor,
    pub(crate) owner: &'a Owner,
    /// For the manifests (the plan's decisions were made with it; `pending` gates phases).
    pub(crate) mode: Mode,
    /// The deploymentID this run applies (marks hook objects).
    pub(crate) run: &'a str,
    /// How long a hook may run (the chart's timeout).
    pub(crate) hook_timeout: Duration,
    /// Hooks this run already saw fail (from the last reported status): not started again.
    pub(crate) failed_hooks: &'a [ObjectRef],
    /// Labels and annotations for the namespaces this run creates (`namespaceLabels`,
    /// `namespaceAnnotations`); a namespace that exists is never changed.
    pub(crate) namespace_meta: plan::NamespaceMeta<'a>,
}

impl Run<'_> {
    /// Executes `plan`.
    pub(crate) async fn execute(&self, plan: &DeployPlan) -> Executed {
        let mut done = Executed::default();
        let mut namespace_errors: Vec<(String, String)> = Vec::new();
        let mut ensured = false;
        for planned in &plan.phases {
            // The other namespaces right after the namespace manifests (before anything else).
            if planned.phase != Phase::Namespaces && !ensured {
                namespace_errors = self.ensure_namespaces(plan).await;
                ensured = true;
            }
            let gated = plan::gate(planned.phase, self.mode.pending, &done.phases);
            let mut statuses = Vec::with_capacity(planned.entries.len());
            for entry in &planned.entries {
                let s = match (&gated, entry) {
                    (_, Entry::Report(s)) => s.clone(),
                    (Some(why), e) => plan::not_started(&e.key(), why),
                    (None, e) => match namespace_error(&e.key(), &namespace_errors) {
                        Some(s) => s,
                        None => self.entry(e, &mut done).await,
                    },
                };
                statuses.push(s);
            }
            done.phases.push((planned.phase, statuses));
        }
        if !ensured {
            self.ensure_namespaces(plan).await;
        }
        done.phases.retain(|(_, s)| !s.is_empty());
        done
    }

    /// The plan's first phase: the inventory recorded before anything is created (a crash
    /// leaves nothing unknown).
    pub(crate) async fn record(&self, plan: &DeployPlan) -> crate::Result<()> {
        match &plan.record_write {
            Some(write) => self.ctx.inventory.put(self.owner, write).await,
            None => Ok(()),
        }
    }

    /// The plan's last phase, run once every other is in place ([`plan::may_prune`]): the
    /// recorded objects no longer desired removed, then the inventory narrowed.
    pub(crate) async fn prune(&self, plan: &DeployPlan) -> crate::Result<()> {
        crate::prune::remove_objects(self.ctx, self.writer, self.owner, &plan.prune, plan.keep)
            .await?;
        match &plan.final_write {
            Some(write) => self.ctx.inventory.put(self.owner, write).await,
            None => Ok(()),
        }
    }

    /// Ensures the plan's namespaces; the errors by namespace.
    async fn ensure_namespaces(&self, plan: &DeployPlan) -> Vec<(String, String)> {
        let mut errors = Vec::new();
        for ns in &plan.namespaces {
            if let Err(msg) = ensure_namespace(self.ctx, self.writer, ns, self.namespace_meta).await
            {
                errors.push((ns.clone(), msg));
            }
        }
        errors
    }

    async fn entry(&self, entry: &Entry, done: &mut Executed) -> ObjectStatus {
        match entry {
            Entry::Report(s) => s.clone(),
            Entry::Settled(s) => settled(self.ctx, s),
            Entry::Write(w) => {
                write_object(
                    self.ctx,
                    self.writer,
                    w,
                    &mut done.corrected,
                    &mut done.watch,
                )
                .await
            }
            // Every object is decided before execution ([`plan::decide`]).
            Entry::Apply { desired, .. } => ObjectStatus::new(
                &desired.key,
                ObjectState::Error,
                Some("not decided from its live object".into()),
            ),
            Entry::Hook(step) => {
                let s = self.hook(step, &mut done.watch).await;
                if s.state == ObjectState::Missing {
                    done.hook_running = true;
                }
                s
            }
        }
    }

    /// Runs hook `step` one step further: start it, or judge it.
    async fn hook(
        &self,
        step: &HookStep,
        watch: &mut Vec<kube::discovery::ApiResource>,
    ) -> ObjectStatus {
        let key = &step.desired.key;
        let named = format!("hook {key} ({})", step.event.as_str());
        let failed = |why: String| {
            ObjectStatus::new(
                key,
                ObjectState::Error,
                Some(format!(
                    "{}: {named} failed {}: {why}",
                    reason::HOOK_FAILED,
                    plan::run_marker(self.run)
                )),
            )
        };
        if self.failed_hooks.contains(key) {
            return failed("it failed in this deployment; a new deployment runs it again".into());
        }
        let (okey, api) = match self.ctx.down.locate(key).await {
            Ok(x) => x,
            Err(e) => {
                let msg = downstream::unresolved(&key.api_version, &key.kind, &e);
                return ObjectStatus::new(key, ObjectState::Error, Some(msg));
            }
        };
        let live = match api.get_opt(&key.name).await {
            Ok(live) => live.map(|o| serde_json::to_value(o).unwrap_or_default()),
            Err(e) => {
                let msg = format!(
                    "cannot read {named}: {}",
                    tender_runtime::reconcile::error_text(&e, okey.is_secret())
                );
                return ObjectStatus::new(key, ObjectState::Error, Some(msg));
            }
        };
        let owned = live.as_ref().is_some_and(|l| {
            let annotations: Option<std::collections::BTreeMap<String, String>> =
                serde_json::from_value(l["metadata"]["annotations"].clone()).unwrap_or_default();
            plan::ownership(annotations.as_ref(), self.owner) == plan::Ownership::Ours
        });
        let waiting = || {
            ObjectStatus::new(
                key,
                ObjectState::Missing,
                Some(format!("waiting for {named} to complete")),
            )
        };
        let progress = plan::hook_progress(step, self.run, live.as_ref(), owned);
        let progress = match progress {
            HookProgress::Start { replace } => {
                let apply = Apply {
                    key: okey.clone(),
                    body: step.desired.body.clone(),
                    replace_if_immutable: false,
                    fingerprint: None,
                };
                let op = match replace {
                    // The previous run's object goes first (before-hook-creation, Helm's
                    // default; a policy without it would make Helm fail on the name).
                    Some(uid) => Op::Recreate {
                        uid: Some(uid),
                        apply,
                    },
                    None => Op::Apply(apply),
                };
                tracing::info!(hook = %key, event = step.event.as_str(), "starting hook");
                match self.writer.execute(op).await {
                    Ok(outcome) => {
                        self.ctx.metrics.written("apply", &key.kind);
                        watch.push(okey.resource.clone());
                        let created = outcome
                            .object
                            .map(|o| serde_json::to_value(o).unwrap_or_default());
                        plan::hook_progress(step, self.run, created.as_ref(), true)
                    }
                    Err(e) => return failed(message(&e)),
                }
            }
            other => other,
        };
        match progress {
            HookProgress::Succeeded => ObjectStatus::new(key, ObjectState::Ready, None),
            HookProgress::Running | HookProgress::Start { .. } => match started_at(live.as_ref()) {
                Some(t) if elapsed(t) > self.hook_timeout => failed(format!(
                    "it did not complete within {}s (helm.timeoutSeconds)",
                    self.hook_timeout.as_secs()
                )),
                _ => waiting(),
            },
            HookProgress::Failed(why) => {
                if step.delete.failed
                    && let Some(uid) = live.as_ref().and_then(|l| l["metadata"]["uid"].as_str())
                {
                    let op = Op::Delete {
                        key: okey,
                        uid: Some(uid.to_string()),
                    };
                    if let Err(e) = self.writer.execute(op).await {
                        tracing::warn!(hook = %key, error = %message(&e), "failed hook not deleted");
                    }
                }
                tracing::warn!(hook = %key, event = step.event.as_str(), "hook failed");
                failed(why)
            }
            HookProgress::NotOurs => failed(
                "an object of that name exists and is not tender's (it is never replaced)".into(),
            ),
        }
    }

    /// Deletes this run's hooks whose policy is `hook-succeeded`, once the whole deployment is
    /// applied (their objects are this run's record of having run until then).
    pub(crate) async fn delete_succeeded_hooks(&self, plan: &DeployPlan) {
        for planned in &plan.phases {
            for entry in &planned.entries {
                let Entry::Hook(step) = entry else { continue };
                if !step.delete.succeeded {
                    continue;
                }
                let Ok((okey, api)) = self.ctx.down.locate(&step.desired.key).await else {
                    continue;
                };
                let Ok(Some(live)) = api.get_opt(&step.desired.key.name).await else {
                    continue;
                };
                let live = serde_json::to_value(live).unwrap_or_default();
                if live["metadata"]["annotations"][plan::HOOK_RUN].as_str() != Some(self.run) {
                    continue;
                }
                let uid = live["metadata"]["uid"].as_str().map(str::to_string);
                if let Err(e) = self.writer.execute(Op::Delete { key: okey, uid }).await {
                    tracing::warn!(hook = %step.desired.key, error = %message(&e), "succeeded hook not deleted");
                }
            }
        }
    }
}

fn namespace_error(key: &ObjectRef, errors: &[(String, String)]) -> Option<ObjectStatus> {
    let ns = key.namespace.as_ref()?;
    errors
        .iter()
        .find(|(n, _)| n == ns)
        .map(|(_, msg)| ObjectStatus::new(key, ObjectState::Error, Some(msg.clone())))
}

fn started_at(live: Option<&Value>) -> Option<Timestamp> {
    live?["metadata"]["creationTimestamp"]
        .as_str()?
        .parse()
        .ok()
}

fn elapsed(t: Timestamp) -> Duration {
    let d = Timestamp::now().duration_since(t);
    Duration::try_from(d).unwrap_or_default()
}
