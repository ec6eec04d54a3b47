//! Deploying one BundleDeployment: observe (hub copies, discovery, the inventory), plan each
//! object, then execute in order — inventory first, namespace manifests, the other namespaces,
//! copies, and only when every copy is in place the remaining manifests — prune, and report.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tender_types::{
    BundleDeployment, BundleDeploymentOptions, Manifest, ObjectRef, ObjectState, ObjectStatus,
    namespaces,
};

use crate::context::Context;
use crate::plan::{self, Desired, Mode, Owner, Planned};
use crate::status::{self, Outcome};
use crate::sync::{ensure_namespace, message, sync_object};
use crate::{Result, cleanup, report};

/// Re-check of objects somebody else owns: their deletion does not reach our label-filtered watches.
const CONFLICT_RECHECK: Duration = Duration::from_secs(30);
/// The hub's copy is behind the BundleDeployment; its watch normally triggers us first.
const COPY_WAIT: Duration = Duration::from_secs(2);

/// Copy → apply → prune → status for `bd`; the action says when to look again.
pub(crate) async fn deploy(bd: &BundleDeployment, ctx: &Context) -> Result<Action> {
    let name = bd.name_any();
    let owner = Owner::new(&ctx.config.cluster_namespace, &name);
    let spec = &bd.spec;
    let opts = &spec.options;
    let prev = bd.status.as_ref();
    let prev_applied = prev.and_then(|s| s.applied_deployment_id.clone());
    let pending = prev_applied.as_deref() != Some(spec.deployment_id.as_str());
    let mut outcome = Outcome {
        deployment_id: spec.deployment_id.clone(),
        generation: bd.metadata.generation,
        applied_id: prev_applied,
        ..Default::default()
    };
    if spec.paused && pending {
        outcome.paused = true;
        outcome.manifests = prev.map(|p| p.resources.clone()).unwrap_or_default();
        report::report(ctx, bd, &outcome).await?;
        return Ok(Action::await_change());
    }

    // Observe and plan.
    let default_ns = Some(opts.default_namespace.as_str()).filter(|d| !d.is_empty());
    let copies_ns =
        namespaces::copies_namespace(opts.target_namespace.as_deref(), default_ns).to_string();
    outcome.copy_feature_disabled =
        !ctx.config.copy_resources_downstream && !opts.downstream_resources.is_empty();
    let mut copies: Vec<Planned> = Vec::new();
    if !outcome.copy_feature_disabled {
        for entry in &opts.downstream_resources {
            let keep = opts.keep_resources;
            copies.push(ctx.copies.desired(entry, &copies_ns, &owner, keep).await);
        }
    }
    let mut manifests: Vec<Planned> = Vec::new();
    for m in &spec.resources {
        manifests.push(plan_manifest(ctx, m, opts, &owner).await);
    }
    let desired_keys: Vec<ObjectRef> = copies
        .iter()
        .chain(&manifests)
        .filter_map(|p| p.as_ref().ok().map(|d| d.key.clone()))
        .collect();

    // Record what may be created before creating it, so a crash leaves nothing unknown.
    let prev_inventory = ctx.inventory.read(&owner).await?.map(|r| r.objects);
    let recorded = plan::union(prev_inventory.as_deref().unwrap_or_default(), &desired_keys);
    ctx.inventory
        .write(&owner, prev_inventory.as_deref(), &recorded)
        .await?;

    // Namespace manifests first, then the other namespaces, then copies, then the rest.
    let is_ns = |p: &Planned| {
        p.as_ref().is_ok_and(|d| {
            d.key.kind == "Namespace" && plan::group_of(&d.key.api_version).is_empty()
        })
    };
    let own_namespaces: BTreeSet<String> = manifests
        .iter()
        .filter(|p| is_ns(p))
        .filter_map(|p| p.as_ref().ok().map(|d| d.key.name.clone()))
        .collect();
    let mut manifest_states: Vec<Option<ObjectStatus>> = vec![None; manifests.len()];
    let mode = Mode {
        pending,
        correct_drift: opts.correct_drift,
        take_ownership: opts.take_ownership,
    };
    for (i, p) in manifests.iter().enumerate() {
        if let Ok(d) = p
            && is_ns(p)
        {
            manifest_states[i] =
                Some(sync_object(ctx, d, &owner, mode, &mut outcome.corrected).await);
        }
    }
    let mut needed: BTreeSet<String> = manifests
        .iter()
        .filter_map(|p| p.as_ref().ok().and_then(|d| d.key.namespace.clone()))
        .collect();
    if copies.iter().any(|c| c.is_ok()) {
        needed.insert(copies_ns.clone());
    }
    let mut namespace_errors: HashMap<String, String> = HashMap::new();
    for ns in needed.difference(&own_namespaces) {
        if let Err(msg) = ensure_namespace(ctx, ns).await {
            namespace_errors.insert(ns.clone(), msg);
        }
    }
    let ns_error = |d: &Desired| {
        d.key
            .namespace
            .as_ref()
            .and_then(|ns| namespace_errors.get(ns))
            .map(|msg| status::object(&d.key, ObjectState::Error, Some(msg.clone())))
    };

    for p in &copies {
        let s = match p {
            Err(s) => s.clone(),
            Ok(d) => match ns_error(d) {
                Some(s) => s,
                None => sync_object(ctx, d, &owner, mode, &mut outcome.corrected).await,
            },
        };
        outcome.copies.push(s);
    }
    let in_place = |s: &ObjectStatus| s.state.is_in_place();
    let copies_in_place = outcome.copies.iter().all(in_place);
    for (p, state) in manifests.iter().zip(manifest_states) {
        let s = match (state, p) {
            (Some(s), _) => s,
            (None, Err(s)) => s.clone(),
            (None, Ok(d)) if pending && !copies_in_place => status::object(
                &d.key,
                ObjectState::Missing,
                Some("waiting for every copy to be in place".into()),
            ),
            (None, Ok(d)) => match ns_error(d) {
                Some(s) => s,
                None => sync_object(ctx, d, &owner, mode, &mut outcome.corrected).await,
            },
        };
        outcome.manifests.push(s);
    }

    // Prune and narrow the inventory only when everything desired is in place.
    if outcome
        .copies
        .iter()
        .chain(&outcome.manifests)
        .all(in_place)
    {
        let stale = plan::prune_set(&recorded, &desired_keys);
        cleanup::remove_objects(ctx, &owner, &stale, opts.keep_resources).await?;
        ctx.inventory
            .write(&owner, Some(&recorded), &desired_keys)
            .await?;
        if pending {
            outcome.applied_id = Some(spec.deployment_id.clone());
            ctx.metrics.deployed();
            tracing::info!(bundle_deployment = %name, deployment_id = %spec.deployment_id, "deployment applied");
        }
    }
    report::report(ctx, bd, &outcome).await?;
    Ok(next_look(&outcome))
}

/// When to reconcile again: on change only, unless a copy is still missing on the hub (soon)
/// or an object is blocked by a conflict or an error (every 30 s).
fn next_look(outcome: &Outcome) -> Action {
    let blocked = outcome.copies.iter().chain(&outcome.manifests).any(|s| {
        matches!(
            s.state,
            ObjectState::Conflict | ObjectState::Error | ObjectState::Missing
        )
    });
    if !blocked {
        Action::await_change()
    } else if outcome
        .copies
        .iter()
        .any(|s| s.state == ObjectState::Missing)
    {
        Action::requeue(COPY_WAIT)
    } else {
        Action::requeue(CONFLICT_RECHECK)
    }
}

/// A manifest as desired downstream (its kind discovered and watched for drift).
async fn plan_manifest(
    ctx: &Context,
    m: &Manifest,
    opts: &BundleDeploymentOptions,
    owner: &Owner,
) -> Planned {
    let key = plan::key(
        m.api_version().unwrap_or_default(),
        m.kind().unwrap_or_default(),
        m.namespace(),
        m.name().unwrap_or_default(),
    );
    let (resource, namespaced) = ctx
        .down
        .resolve(&key.api_version, &key.kind)
        .await
        .map_err(|e| {
            status::object(
                &key,
                ObjectState::Error,
                Some(format!("unknown kind downstream: {}", message(&e))),
            )
        })?;
    ctx.drift.ensure(&resource);
    plan::manifest(m, namespaced, opts, owner)
        .map_err(|msg| status::object(&key, ObjectState::Error, Some(msg)))
}
