//! Deploying one BundleDeployment, top to bottom (decisions 0088-phased-deploy-and-helm-hooks,
//! 0118-agent-decides-in-the-plan): observe ([`observe`], only reads), render the chart
//! ([`rendering`]), plan the phases ([`plan::deployment_plan`], pure), read the live objects
//! and decide each ([`plan::decide`], pure), run the phases ([`execute`]: record the inventory,
//! the planned phases, prune once everything is in place), and report (the drift watches, then
//! the status).

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tender_types::{BundleDeployment, ObjectRef, ObjectState, ObjectStatus, namespaces};

use crate::context::Context;
use crate::execute::{Executed, Run};
use crate::plan::{self, Mode, Owner, Phase};
use crate::status::Outcome;
use crate::{Result, observe, policy, rendering, report};

/// Observe → plan → execute → report for `bd`; the action says when to look again.
pub(crate) async fn deploy(bd: &BundleDeployment, ctx: &Context) -> Result<Action> {
    let name = bd.name_any();
    let owner = Owner::new(&ctx.config.cluster_namespace, &name);
    // What is deployed is the spec together with the copies the agent trusts now: a rotation
    // (a new signed copy) redeploys without a BundleDeployment write (decision
    // 0089-signed-copies). From here on `spec.deploymentID` is that effective id.
    let base_id = bd.spec.deployment_id.clone();
    let (effective, verified) = effective(ctx, bd, &name).await;
    let bd = &effective;
    let spec = &bd.spec;
    let opts = &spec.options;
    let prev = bd.status.as_ref();
    let prev_applied = prev.and_then(|s| {
        s.applied_copies_id
            .clone()
            .or_else(|| s.applied_deployment_id.clone())
    });
    let pending = prev_applied.as_deref() != Some(spec.deployment_id.as_str());
    let mut outcome = Outcome {
        deployment_id: spec.deployment_id.clone(),
        generation: bd.metadata.generation,
        applied_id: prev_applied,
        applied_base_id: prev.and_then(|s| s.applied_deployment_id.clone()),
        ..Default::default()
    };
    if spec.paused && pending {
        outcome.paused = true;
        outcome.manifests = prev.map(|p| p.resources.clone()).unwrap_or_default();
        report::report(ctx, bd, &outcome).await?;
        return Ok(Action::await_change());
    }

    // Who this deployment is written as: refused outright when it names a ServiceAccount the
    // downstream owner does not allow (nothing applied, nothing pruned; waiting cannot help).
    let writer = match ctx.identities.writer(opts.service_account.as_deref()) {
        Ok(writer) => writer,
        Err(refusal) => {
            refused_identity(spec, &name, &refusal, &mut outcome);
            tracing::warn!(bundle_deployment = %name, %refusal, "deployment refused");
            report::report(ctx, bd, &outcome).await?;
            return Ok(Action::await_change());
        }
    };

    // Observe (only reads), render the chart, plan (pure: the phases, then every object
    // decided from its live state).
    let mut observed = observe::observe(ctx, bd, &owner, pending, &verified).await?;
    rendering::render(ctx, bd, &mut observed).await;
    outcome.copy_feature_disabled = observed.copy_feature_disabled;
    let mode = Mode {
        pending,
        correct_drift: opts.correct_drift,
        take_ownership: opts.take_ownership,
    };
    let modes = plan::Modes {
        manifests: mode,
        chart: Mode {
            take_ownership: mode.take_ownership
                || spec.helm.as_ref().is_some_and(|h| h.take_ownership),
            ..mode
        },
    };
    let agent_ns = &ctx.config.agent_namespace;
    let phases = plan::deployment_plan(observed.input, &ctx.config.policy, agent_ns);
    let live = observe::live(ctx, &phases).await;
    let plan = plan::decide(phases, &live, modes, &owner, agent_ns);
    // Execute the phases: record, the planned phases, and prune once all is in place.
    let failed_hooks = plan::failed_hooks(bd.status.as_ref(), &spec.deployment_id);
    let run = Run {
        ctx,
        writer: &writer,
        owner: &owner,
        mode,
        run: &spec.deployment_id,
        hook_timeout: observed.hook_timeout,
        failed_hooks: &failed_hooks,
        namespace_meta: if ctx.config.policy.namespace_metadata_allowed() {
            plan::NamespaceMeta {
                labels: Some(&opts.namespace_labels),
                annotations: Some(&opts.namespace_annotations),
            }
        } else {
            plan::NamespaceMeta::default()
        },
    };
    run.record(&plan).await?;
    let mut executed = run.execute(&plan).await;
    let hook_running = executed.hook_running;
    let prune = plan::may_prune(&executed.phases);
    let mut watch = std::mem::take(&mut observed.watch);
    watch.append(&mut executed.watch);
    outcome_of(executed, &mut outcome);

    // Prune and narrow the inventory only when everything desired is in place.
    let mut applied_now = false;
    if prune {
        run.prune(&plan).await?;
        if pending {
            applied_now = true;
            outcome.applied_id = Some(spec.deployment_id.clone());
            outcome.applied_base_id = Some(base_id.clone());
            ctx.metrics.deployed();
            tracing::info!(bundle_deployment = %name, deployment_id = %spec.deployment_id, "deployment applied");
        }
    }
    // Report: the drift watches of every kind observed or written, then the status.
    observe::start_watches(ctx, &name, &watch);
    report::report(ctx, bd, &outcome).await?;
    // A `hook-succeeded` hook's object is this run's record of having run until the run is
    // reported applied; then it goes.
    if applied_now {
        run.delete_succeeded_hooks(&plan).await;
    }
    Ok(if hook_running {
        // A running hook's Job or Pod wakes the deployment when it changes; this is the
        // fallback.
        Action::requeue(ctx.config.hook_poll)
    } else {
        next_look(&outcome, &ctx.config)
    })
}

/// The outcome's object lists from the phases: copies, then every other phase's objects; a
/// hook is listed while it runs or after it failed, not once it is done (its object may go).
fn outcome_of(executed: Executed, outcome: &mut Outcome) {
    outcome.corrected = executed.corrected;
    for (phase, statuses) in executed.phases {
        match phase {
            Phase::Copies => outcome.copies.extend(statuses),
            Phase::Hooks(_) => outcome.manifests.extend(
                statuses
                    .into_iter()
                    .filter(|s| s.state != ObjectState::Ready),
            ),
            _ => outcome.manifests.extend(statuses),
        }
    }
}

/// Every object of a deployment refused as a whole (its ServiceAccount not allowed), each
/// reported `Error` with the refusal.
fn refused_identity(
    spec: &tender_types::BundleDeploymentSpec,
    name: &str,
    refusal: &str,
    outcome: &mut Outcome,
) {
    let error = |key: &ObjectRef| ObjectStatus::new(key, ObjectState::Error, Some(refusal.into()));
    outcome.copies = spec
        .options
        .downstream_resources
        .iter()
        .map(|e| error(&ObjectRef::new(e.api_version(), &e.kind, None, &e.name)))
        .collect();
    // Files are not objects: a chart they carry is the chart entry below.
    outcome.manifests = tender_types::Manifest::manifests(&spec.resources)
        .map(|m| {
            error(&ObjectRef::new(
                m.api_version().unwrap_or_default(),
                m.kind().unwrap_or_default(),
                m.namespace(),
                m.name().unwrap_or_default(),
            ))
        })
        .collect();
    if let Some(helm) = &spec.helm {
        let o = &spec.options;
        let default = Some(o.default_namespace.as_str()).filter(|d| !d.is_empty());
        let ns = namespaces::copies_namespace(o.target_namespace.as_deref(), default);
        outcome.manifests.push(error(&crate::helm::chart_key(
            helm,
            helm.release_name_or(name),
            ns,
        )));
    }
}

/// `bd` with `spec.deploymentID` replaced by the effective id: the spec's id and the content
/// hash of each copy the agent trusts now ("" for one it does not, so that a refused copy
/// never counts as applied). Without copies (or with copying off) it is the spec's. Also
/// those hashes by copy name, for what else reads them in this reconcile.
async fn effective(
    ctx: &Context,
    bd: &BundleDeployment,
    name: &str,
) -> (BundleDeployment, BTreeMap<String, String>) {
    let mut bd = bd.clone();
    let entries = &bd.spec.options.downstream_resources;
    let mut verified = BTreeMap::new();
    if ctx.config.copy_resources_downstream && !entries.is_empty() {
        let hashes = ctx.copies.hashes(name, entries).await;
        bd.spec.deployment_id = tender_types::hash::effective_deployment_id(
            &bd.spec.deployment_id,
            hashes.iter().map(|(c, h)| (c.as_str(), h.as_str())),
        );
        verified = hashes.into_iter().filter(|(_, h)| !h.is_empty()).collect();
    }
    (bd, verified)
}

/// When to reconcile again: on change only, unless a copy is still missing on the hub
/// (`copy_wait`: its watch normally triggers us first) or an object is blocked by a conflict
/// or an error (every `conflict_recheck`: the deletion of an object somebody else owns does
/// not reach our label-filtered watches).
fn next_look(outcome: &Outcome, config: &crate::config::AgentConfig) -> Action {
    let blocked = outcome.copies.iter().chain(&outcome.manifests).any(|s| {
        matches!(
            s.state,
            ObjectState::Conflict | ObjectState::Error | ObjectState::Missing
        ) && !policy::is_refused(s)
    });
    if !blocked {
        Action::await_change()
    } else if outcome
        .copies
        .iter()
        .any(|s| s.state == ObjectState::Missing)
    {
        Action::requeue(config.copy_wait)
    } else {
        Action::requeue(config.conflict_recheck)
    }
}
