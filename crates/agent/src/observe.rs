//! Observing one BundleDeployment once (decision 0088): who it is written as, its copies from
//! the hub, discovery of every kind, the fan-out namespaces, the inventory and the rendered
//! chart (objects, CRDs and hooks), with the owner's policy applied — everything the pure
//! [`plan::deployment_plan`] needs.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use tender_types::{
    BundleDeployment, BundleDeploymentOptions, Manifest, ObjectRef, ObjectState, namespaces,
};

use crate::context::Context;
use crate::hooks::{HookEvent, RenderedChart};
use crate::inventory::Recorded;
use crate::plan::{self, Owner, Planned};
use crate::status;
use crate::{Result, downstream};

/// Default bound on a hook (Helm's `--timeout` default).
const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(300);

/// What one observation found.
pub(crate) struct Observation {
    /// The plan's inputs.
    pub(crate) input: plan::Observed,
    /// The inventory as read (`None`: none yet).
    pub(crate) recorded: Option<Recorded>,
    /// The deploymentID that first installed the chart (recorded with the inventory).
    pub(crate) chart_installed_by: Option<String>,
    /// downstreamResources present but the copy feature is off on this agent.
    pub(crate) copy_feature_disabled: bool,
    /// How long a hook may run.
    pub(crate) hook_timeout: Duration,
}

/// Observes `bd` for owner `owner`; `pending` says a new deploymentID waits to be applied.
pub(crate) async fn observe(
    ctx: &Context,
    bd: &BundleDeployment,
    owner: &Owner,
    pending: bool,
) -> Result<Observation> {
    let name = bd.name_any();
    let spec = &bd.spec;
    let opts = &spec.options;
    let default_ns = Some(opts.default_namespace.as_str()).filter(|d| !d.is_empty());
    let copies_ns =
        namespaces::copies_namespace(opts.target_namespace.as_deref(), default_ns).to_string();
    let copy_feature_disabled =
        !ctx.config.copy_resources_downstream && !opts.downstream_resources.is_empty();
    // Fan-out: every listed and every matching namespace instead of the one copies namespace.
    let fan_out = fan_out_namespaces(ctx, opts);
    let copy_namespaces: Vec<String> = match &fan_out {
        Ok(Some(set)) => set.iter().cloned().collect(),
        Ok(None) | Err(_) => vec![copies_ns.clone()],
    };
    let mut copies: Vec<Planned> = Vec::new();
    if !copy_feature_disabled {
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
                copies.extend(plan_carried(ctx, entry, &copy_namespaces, owner, keep).await);
            } else {
                for ns in &copy_namespaces {
                    copies.push(ctx.copies.desired(entry, ns, owner, keep).await);
                }
            }
        }
    }
    let manifest_namespaces = fan_out.as_ref().ok().cloned().flatten();
    let mut manifests: Vec<Planned> = Vec::new();
    for m in &spec.resources {
        manifests.extend(plan_manifest(ctx, m, opts, manifest_namespaces.as_ref(), owner).await);
    }
    let recorded = ctx.read_inventory(owner).await?;
    // The chart is upgraded once a deployment before this one installed it.
    let chart_installed_by = spec.helm.as_ref().map(|_| {
        recorded
            .as_ref()
            .and_then(|r| r.chart_installed_by.clone())
            .unwrap_or_else(|| spec.deployment_id.clone())
    });
    let upgrade = chart_installed_by
        .as_deref()
        .is_some_and(|id| id != spec.deployment_id);
    // The chart's objects follow the inline manifests through the same path; a chart that
    // cannot be rendered is one Error entry, which blocks pruning (nothing deployed goes away).
    let chart_from = manifests.len();
    let mut crds: Vec<Planned> = Vec::new();
    let mut hooks = Vec::new();
    if let Some(helm) = &spec.helm {
        let release = helm.release_name_or(&name);
        let key = crate::helm::chart_key(helm, release, &copies_ns);
        let sources = crate::helm::needed_sources(helm, &copies_ns);
        let rendered = match crate::helm::pending_copy(&copies, &sources) {
            // A copy the chart reads is on its way: wait for it (Missing), not a failure.
            Some(waiting) => Err(status::object(
                &key,
                ObjectState::Missing,
                Some(format!("waiting for {} to be copied", waiting.describe())),
            )),
            None => ctx
                .charts
                .render(
                    &ctx.down,
                    &name,
                    helm,
                    &copies_ns,
                    upgrade,
                    &copies,
                    ctx.config.policy.reads(&ctx.config.agent_namespace),
                )
                .await
                .map_err(|failure| {
                    tracing::warn!(bundle_deployment = %name, reason = failure.reason, "chart not rendered");
                    status::object(&key, ObjectState::Error, Some(failure.to_string()))
                }),
        };
        match rendered {
            Err(entry) => manifests.push(Err(entry)),
            Ok(chart) => {
                let RenderedChart {
                    crds: chart_crds,
                    objects,
                    hooks: chart_hooks,
                } = chart;
                // CRDs from `crds/` are never deleted by tender, as Helm never deletes them.
                let mut kept = opts.clone();
                kept.keep_resources = true;
                for m in &chart_crds {
                    crds.extend(plan_manifest(ctx, m, &kept, None, owner).await);
                }
                for m in &objects {
                    manifests.extend(
                        plan_manifest(ctx, m, opts, manifest_namespaces.as_ref(), owner).await,
                    );
                }
                let (pre, post) = HookEvent::around(upgrade);
                for event in [pre, post] {
                    for hook in crate::hooks::ordered(&chart_hooks, event) {
                        for p in plan_manifest(ctx, &hook.manifest, opts, None, owner).await {
                            let p = p.map(|d| plan::hook_object(d, &spec.deployment_id));
                            hooks.push((event, p, hook.delete, hook.waits()));
                        }
                    }
                }
            }
        }
    }
    // The owner's policy: a refused object is reported and left alone (not applied, and kept
    // out of pruning so an object deployed before the policy changed stays as it is).
    let mut refused: Vec<ObjectRef> = Vec::new();
    let hook_entries = hooks.iter_mut().map(|(_, p, _, _)| p);
    for p in copies
        .iter_mut()
        .chain(manifests.iter_mut())
        .chain(crds.iter_mut())
        .chain(hook_entries)
    {
        if let Ok(d) = p
            && let Some(why) = ctx
                .config
                .policy
                .refusal(&d.key, &ctx.config.agent_namespace)
        {
            refused.push(d.key.clone());
            *p = Err(status::object(&d.key, ObjectState::Error, Some(why)));
        }
    }
    let hook_timeout = spec
        .helm
        .as_ref()
        .and_then(|h| h.timeout_seconds)
        .map(|s| Duration::from_secs(u64::from(s)))
        .unwrap_or(DEFAULT_HOOK_TIMEOUT);
    Ok(Observation {
        input: plan::Observed {
            pending,
            copies,
            manifests,
            chart_from,
            crds,
            hooks,
            upgrade,
            refused,
            previous: recorded
                .as_ref()
                .map(|r| r.objects.clone())
                .unwrap_or_default(),
        },
        recorded,
        chart_installed_by,
        copy_feature_disabled,
        hook_timeout,
    })
}

/// The hooks of `event` (`pre-delete`, `post-delete`) of the chart of `bd`, rendered as the
/// upgrade of what is deployed, as phase entries; `Err` says why the chart cannot be rendered.
pub(crate) async fn removal_hooks(
    ctx: &Context,
    bd: &BundleDeployment,
    owner: &Owner,
    event: HookEvent,
) -> std::result::Result<Vec<plan::Entry>, String> {
    let Some(helm) = &bd.spec.helm else {
        return Ok(Vec::new());
    };
    let opts = &bd.spec.options;
    let default_ns = Some(opts.default_namespace.as_str()).filter(|d| !d.is_empty());
    let copies_ns = namespaces::copies_namespace(opts.target_namespace.as_deref(), default_ns);
    let chart = ctx
        .charts
        .render(
            &ctx.down,
            &bd.name_any(),
            helm,
            copies_ns,
            true,
            &[],
            ctx.config.policy.reads(&ctx.config.agent_namespace),
        )
        .await
        .map_err(|f| f.to_string())?;
    let mut entries = Vec::new();
    for hook in chart.hooks_of(event) {
        for p in plan_manifest(ctx, &hook.manifest, opts, None, owner).await {
            entries.push(match p {
                Ok(d) => match ctx
                    .config
                    .policy
                    .refusal(&d.key, &ctx.config.agent_namespace)
                {
                    Some(why) => {
                        plan::Entry::Report(status::object(&d.key, ObjectState::Error, Some(why)))
                    }
                    None => plan::Entry::Hook(plan::HookStep {
                        desired: plan::hook_object(d, &bd.spec.deployment_id),
                        event,
                        delete: hook.delete,
                        waits: hook.waits(),
                    }),
                },
                Err(s) => plan::Entry::Report(s),
            });
        }
    }
    Ok(entries)
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
