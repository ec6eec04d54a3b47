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
use crate::sync::{ensure_namespace, sync_object};
use crate::{Result, cleanup, downstream, policy, report};

/// Re-check of objects somebody else owns: their deletion does not reach our label-filtered watches.
const CONFLICT_RECHECK: Duration = Duration::from_secs(30);
/// The hub's copy is behind the BundleDeployment; its watch normally triggers us first.
const COPY_WAIT: Duration = Duration::from_secs(2);
/// How long a hub copy ahead of its BundleDeployment waits for the new BundleDeployment
/// before the deployment reports the copy as not matching (decision 55).
const COPY_AHEAD_GRACE: Duration = Duration::from_secs(10);

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

    // A rotation writes the copy before the BundleDeployment, so the copy's event often comes
    // first: wait for the BundleDeployment rather than report the copy Missing and then Ready
    // again (a status write, its reversal and an event per rotation).
    if waits_for_rotation(ctx, &name, pending, opts) {
        return Ok(Action::requeue(COPY_WAIT));
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

    // Observe and plan.
    let default_ns = Some(opts.default_namespace.as_str()).filter(|d| !d.is_empty());
    let copies_ns =
        namespaces::copies_namespace(opts.target_namespace.as_deref(), default_ns).to_string();
    outcome.copy_feature_disabled =
        !ctx.config.copy_resources_downstream && !opts.downstream_resources.is_empty();
    // Fan-out: every listed and every matching namespace instead of the one copies namespace.
    let fan_out = fan_out_namespaces(ctx, opts);
    let copy_namespaces: Vec<String> = match &fan_out {
        Ok(Some(set)) => set.iter().cloned().collect(),
        Ok(None) | Err(_) => vec![copies_ns.clone()],
    };
    let mut copies: Vec<Planned> = Vec::new();
    if !outcome.copy_feature_disabled {
        let keep = opts.keep_resources;
        for entry in &opts.downstream_resources {
            if let Err(msg) = &fan_out {
                let key = plan::key(entry.api_version(), &entry.kind, None, &entry.name);
                copies.push(Err(status::object(
                    &key,
                    ObjectState::Error,
                    Some(msg.clone()),
                )));
            } else if entry.is_carried() {
                copies.extend(plan_carried(ctx, entry, &copy_namespaces, &owner, keep).await);
            } else {
                for ns in &copy_namespaces {
                    copies.push(ctx.copies.desired(entry, ns, &owner, keep).await);
                }
            }
        }
    }
    let manifest_namespaces = fan_out.as_ref().ok().cloned().flatten();
    let mut manifests: Vec<Planned> = Vec::new();
    for m in &spec.resources {
        manifests.extend(plan_manifest(ctx, m, opts, manifest_namespaces.as_ref(), &owner).await);
    }
    // The chart's objects follow the inline manifests through the same path; a chart that
    // cannot be rendered is one Error entry, which blocks pruning (nothing deployed goes away).
    let chart_from = manifests.len();
    if let Some(helm) = &spec.helm {
        let release = helm.release_name_or(&name);
        let sources = crate::helm::needed_sources(helm, &copies_ns);
        let rendered = match crate::helm::pending_copy(&copies, &sources) {
            // A copy the chart reads is on its way: wait for it (Missing), not a failure.
            Some(waiting) => Err(status::object(
                &crate::helm::chart_key(helm, release, &copies_ns),
                ObjectState::Missing,
                Some(format!("waiting for {} to be copied", waiting.describe())),
            )),
            None => Ok(ctx
                .charts
                .render(
                    &ctx.down,
                    &name,
                    helm,
                    &copies_ns,
                    &copies,
                    ctx.config.policy.reads(&ctx.config.agent_namespace),
                )
                .await),
        };
        match rendered {
            Err(waiting) => manifests.push(Err(waiting)),
            Ok(r) => match r {
                Ok(objects) => {
                    for m in &objects {
                        manifests.extend(
                            plan_manifest(ctx, m, opts, manifest_namespaces.as_ref(), &owner).await,
                        );
                    }
                }
                Err(failure) => {
                    tracing::warn!(bundle_deployment = %name, reason = failure.reason, "chart not rendered");
                    let key = crate::helm::chart_key(helm, release, &copies_ns);
                    manifests.push(Err(status::object(
                        &key,
                        ObjectState::Error,
                        Some(failure.to_string()),
                    )));
                }
            },
        }
    }
    // The owner's policy: a refused object is reported and left alone (not applied, and kept
    // out of pruning so an object deployed before the policy changed stays as it is).
    let mut refused_keys: Vec<ObjectRef> = Vec::new();
    for p in copies.iter_mut().chain(manifests.iter_mut()) {
        if let Ok(d) = p
            && let Some(why) = ctx
                .config
                .policy
                .refusal(&d.key, &ctx.config.agent_namespace)
        {
            refused_keys.push(d.key.clone());
            *p = Err(status::object(&d.key, ObjectState::Error, Some(why)));
        }
    }
    let desired_keys: Vec<ObjectRef> = copies
        .iter()
        .chain(&manifests)
        .filter_map(|p| p.as_ref().ok().map(|d| d.key.clone()))
        .chain(refused_keys)
        .collect();

    // Record what may be created before creating it, so a crash leaves nothing unknown.
    let prev_inventory = ctx.read_inventory(&owner).await?.map(|r| r.objects);
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
                Some(sync_object(ctx, &writer, d, &owner, mode, &mut outcome.corrected).await);
        }
    }
    let mut needed: BTreeSet<String> = manifests
        .iter()
        .filter_map(|p| p.as_ref().ok().and_then(|d| d.key.namespace.clone()))
        .collect();
    needed.extend(
        copies
            .iter()
            .filter_map(|p| p.as_ref().ok().and_then(|d| d.key.namespace.clone())),
    );
    let mut namespace_errors: HashMap<String, String> = HashMap::new();
    for ns in needed.difference(&own_namespaces) {
        if let Err(msg) = ensure_namespace(ctx, &writer, ns).await {
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
                None => sync_object(ctx, &writer, d, &owner, mode, &mut outcome.corrected).await,
            },
        };
        outcome.copies.push(s);
    }
    // A refused object will not come by waiting: it blocks neither ordering nor pruning.
    let in_place = |s: &ObjectStatus| s.state.is_in_place() || policy::is_refused(s);
    let copies_in_place = outcome.copies.iter().all(in_place);
    let chart_mode = Mode {
        take_ownership: mode.take_ownership || spec.helm.as_ref().is_some_and(|h| h.take_ownership),
        ..mode
    };
    for (i, (p, state)) in manifests.iter().zip(manifest_states).enumerate() {
        let mode = if i >= chart_from { chart_mode } else { mode };
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
                None => sync_object(ctx, &writer, d, &owner, mode, &mut outcome.corrected).await,
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
        cleanup::remove_objects(ctx, &writer, &owner, &stale, opts.keep_resources).await?;
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

/// Every object of a deployment refused as a whole (its ServiceAccount not allowed), each
/// reported `Error` with the refusal.
fn refused_identity(
    spec: &tender_types::BundleDeploymentSpec,
    name: &str,
    refusal: &str,
    outcome: &mut Outcome,
) {
    let error = |key: &ObjectRef| status::object(key, ObjectState::Error, Some(refusal.into()));
    outcome.copies = spec
        .options
        .downstream_resources
        .iter()
        .map(|e| error(&plan::key(e.api_version(), &e.kind, None, &e.name)))
        .collect();
    outcome.manifests = spec
        .resources
        .iter()
        .map(|m| {
            error(&plan::key(
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

/// Whether deployment `name`, applied as it is, should leave everything alone for now because
/// a hub copy is ahead of it (its new BundleDeployment is on its way), for at most
/// [`COPY_AHEAD_GRACE`]; after that it reports the copy like any other mismatch.
fn waits_for_rotation(
    ctx: &Context,
    name: &str,
    pending: bool,
    opts: &BundleDeploymentOptions,
) -> bool {
    let mut ahead = ctx.copies_ahead.lock().expect("lock");
    let copying = ctx.config.copy_resources_downstream;
    if pending
        || !copying
        || !opts
            .downstream_resources
            .iter()
            .any(|e| ctx.copies.ahead(e))
    {
        ahead.remove(name);
        return false;
    }
    let since = *ahead
        .entry(name.to_string())
        .or_insert_with(std::time::Instant::now);
    since.elapsed() < COPY_AHEAD_GRACE
}

/// When to reconcile again: on change only, unless a copy is still missing on the hub (soon)
/// or an object is blocked by a conflict or an error (every 30 s).
fn next_look(outcome: &Outcome) -> Action {
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
        Action::requeue(COPY_WAIT)
    } else {
        Action::requeue(CONFLICT_RECHECK)
    }
}

/// The fan-out namespaces of a deployment (`None`: it does not fan out), from the downstream
/// namespace cache; `Err` says why the selector cannot be evaluated.
fn fan_out_namespaces(
    ctx: &Context,
    opts: &BundleDeploymentOptions,
) -> std::result::Result<Option<BTreeSet<String>>, String> {
    if opts.target_namespaces.is_empty() && opts.target_namespace_selector.is_none() {
        return Ok(None);
    }
    let cached = ctx.namespaces.state();
    let existing = cached.iter().map(|ns| {
        (
            ns.metadata.name.as_deref().unwrap_or_default(),
            ns.metadata.labels.as_ref().unwrap_or(&EMPTY),
            ns.metadata.deletion_timestamp.is_some(),
        )
    });
    namespaces::fan_out_namespaces(
        &opts.target_namespaces,
        opts.target_namespace_selector.as_ref(),
        existing,
    )
    .map_err(|e| format!("invalid targetNamespaceSelector: {e}"))
}

static EMPTY: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();

/// The downstream objects for a source of any kind but Secret/ConfigMap: its kind must be
/// served downstream (else `KindNotInstalled`), its carrier verified; one per fan-out
/// namespace for a namespaced kind, once for a cluster-scoped one.
// `Planned` carries an ObjectStatus as its error by design (it is the status to report).
#[allow(clippy::result_large_err)]
async fn plan_carried(
    ctx: &Context,
    entry: &tender_types::CopiedResource,
    copy_namespaces: &[String],
    owner: &Owner,
    keep: bool,
) -> Vec<Planned> {
    let key = plan::key(entry.api_version(), &entry.kind, None, &entry.name);
    let (resource, namespaced) = match ctx.down.resolve(entry.api_version(), &entry.kind).await {
        Ok(found) => found,
        Err(e) => {
            let msg = downstream::unresolved(entry.api_version(), &entry.kind, &e);
            return vec![Err(status::object(&key, ObjectState::Error, Some(msg)))];
        }
    };
    ctx.drift.ensure_for(&resource, &owner.name);
    let object = match ctx.copies.carried(entry).await {
        Ok(object) => object,
        Err(msg) => return vec![Err(status::object(&key, ObjectState::Missing, Some(msg)))],
    };
    if namespaced {
        copy_namespaces
            .iter()
            .map(|ns| Ok(plan::carried_copy(&object, entry, Some(ns), owner, keep)))
            .collect()
    } else {
        vec![Ok(plan::carried_copy(&object, entry, None, owner, keep))]
    }
}

/// A manifest as desired downstream (its kind discovered and watched for drift): once, or
/// with fan-out once per namespace for a namespaced kind.
// `Planned` carries an ObjectStatus as its error by design (it is the status to report).
#[allow(clippy::result_large_err)]
async fn plan_manifest(
    ctx: &Context,
    m: &Manifest,
    opts: &BundleDeploymentOptions,
    fan_out: Option<&BTreeSet<String>>,
    owner: &Owner,
) -> Vec<Planned> {
    let key = plan::key(
        m.api_version().unwrap_or_default(),
        m.kind().unwrap_or_default(),
        m.namespace(),
        m.name().unwrap_or_default(),
    );
    let (resource, namespaced) = match ctx.down.resolve(&key.api_version, &key.kind).await {
        Ok(found) => found,
        Err(e) => {
            let msg = downstream::unresolved(&key.api_version, &key.kind, &e);
            return vec![Err(status::object(&key, ObjectState::Error, Some(msg)))];
        }
    };
    ctx.drift.ensure_for(&resource, &owner.name);
    let one = |opts: &BundleDeploymentOptions| {
        plan::manifest(m, namespaced, opts, owner)
            .map_err(|msg| status::object(&key, ObjectState::Error, Some(msg)))
    };
    match fan_out {
        Some(set) if namespaced => set
            .iter()
            .map(|ns| {
                let mut o = opts.clone();
                o.target_namespace = Some(ns.clone());
                one(&o)
            })
            .collect(),
        _ => vec![one(opts)],
    }
}
