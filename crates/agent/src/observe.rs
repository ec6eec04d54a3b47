//! Observing one BundleDeployment once (decision 0088-phased-deploy-and-helm-hooks): who it is
//! written as, its copies from the hub, discovery of every kind, the fan-out namespaces, the
//! inventory and the rendered chart (objects, CRDs and hooks), with the owner's policy applied —
//! everything the pure [`plan::deployment_plan`] needs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::ResourceExt;
use tender_types::{
    BundleDeployment, BundleDeploymentOptions, Manifest, ObjectRef, ObjectState, ObjectStatus,
    namespaces,
};

use crate::context::Context;
use crate::hooks::{HookEvent, RenderedChart};
use crate::inventory::Recorded;
use crate::plan::{self, Found, FoundHook, Owner, Planned};
use crate::{Result, downstream};

/// Default bound on a hook (Helm's `--timeout` default).
const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one of `bd`'s hooks may run: the chart's `timeoutSeconds`, else Helm's default.
pub(crate) fn hook_timeout(bd: &BundleDeployment) -> Duration {
    bd.spec
        .helm
        .as_ref()
        .and_then(|h| h.timeout_seconds)
        .map(|s| Duration::from_secs(u64::from(s)))
        .unwrap_or(DEFAULT_HOOK_TIMEOUT)
}

/// What one observation found.
pub(crate) struct Observation {
    /// The plan's inputs.
    pub(crate) input: plan::Observed,
    /// The inventory as read (`None`: none yet).
    pub(crate) recorded: Option<Recorded>,
    /// The chart's release, `<revision>/<deploymentID>` (recorded with the inventory).
    pub(crate) chart_release: Option<String>,
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
    verified: &BTreeMap<String, String>,
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
                let key = ObjectRef::new(entry.api_version(), &entry.kind, None, &entry.name);
                copies.push(Err(ObjectStatus::new(
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
    let mut manifests: Vec<Found> = Vec::new();
    for m in &spec.resources {
        manifests.push(find(ctx, m, owner).await);
    }
    let recorded = ctx.read_inventory(owner).await?;
    // The release applied last is recorded `<revision>/<deploymentID>`; another deploymentID
    // is its next revision (an upgrade), the first one revision 1 (the install).
    let revision = spec.helm.as_ref().map(|_| {
        crate::helm::next_release(
            recorded.as_ref().and_then(|r| r.chart_release.as_deref()),
            &spec.deployment_id,
        )
    });
    let upgrade = revision.is_some_and(|r| r > 1);
    let chart_release = revision.map(|r| format!("{r}/{}", spec.deployment_id));
    // The chart's objects follow the inline manifests through the same path; a chart that
    // cannot be rendered is one Error entry, which blocks pruning (nothing deployed goes away).
    let chart_from = manifests.len();
    let mut crds: Vec<Found> = Vec::new();
    let mut hooks: Vec<FoundHook> = Vec::new();
    let mut chart_entry = None;
    if let Some(helm) = &spec.helm {
        let release = helm.release_name_or(&name);
        let key = crate::helm::chart_key(helm, release, &copies_ns);
        let sources = crate::helm::needed_sources(helm, &copies_ns);
        let rendered = match crate::helm::pending_copy(&copies, &sources) {
            // A copy the chart reads is on its way: wait for it (Missing), not a failure.
            Some(waiting) => Err(ObjectStatus::new(
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
                    revision.unwrap_or(1),
                    &copies,
                    ctx.config.policy.reads(&ctx.config.agent_namespace),
                )
                .await
                .map_err(|failure| {
                    tracing::warn!(bundle_deployment = %name, reason = failure.reason, "chart not rendered");
                    ObjectStatus::new(&key, ObjectState::Error, Some(failure.to_string()))
                }),
        };
        match rendered {
            Err(entry) => chart_entry = Some(entry),
            Ok(chart) => {
                let RenderedChart {
                    crds: chart_crds,
                    objects,
                    hooks: chart_hooks,
                } = chart;
                for m in &chart_crds {
                    crds.push(find(ctx, m, owner).await);
                }
                for m in &objects {
                    manifests.push(find(ctx, m, owner).await);
                }
                let (pre, post) = HookEvent::around(upgrade);
                for event in [pre, post] {
                    for hook in crate::hooks::ordered(&chart_hooks, event) {
                        hooks.push(FoundHook {
                            event,
                            found: find(ctx, &hook.manifest, owner).await,
                            delete: hook.delete,
                            waits: hook.waits(),
                        });
                    }
                }
            }
        }
    }
    let hook_timeout = hook_timeout(bd);
    // `rolloutOnCopyChange` hashes what each workload consumes: the content hash of each copy
    // the agent verified (`verified`, by copy name), since the spec carries none (decision
    // 0089-signed-copies). Only the manifests' plan reads these; the copies above were
    // verified by their signatures.
    let mut options = opts.clone();
    if options.rollout_on_copy_change {
        for entry in &mut options.downstream_resources {
            if entry.hash.is_empty()
                && let Some(hash) = verified.get(&entry.copy_name)
            {
                entry.hash = hash.clone();
            }
        }
    }
    Ok(Observation {
        input: plan::Observed {
            pending,
            run: spec.deployment_id.clone(),
            owner: owner.clone(),
            options,
            fan_out: fan_out.ok().flatten(),
            copies,
            manifests,
            chart_from,
            chart_entry,
            crds,
            hooks,
            upgrade,
            previous: recorded
                .as_ref()
                .map(|r| r.objects.clone())
                .unwrap_or_default(),
        },
        recorded,
        chart_release,
        copy_feature_disabled,
        hook_timeout,
    })
}

/// The hooks of `event` (`pre-delete`, `post-delete`) of the chart of `bd`, rendered as the
/// release that is deployed, as phase entries; `Err` says why the chart cannot be rendered.
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
    // Rendered as the release that is deployed (its hooks as that revision rendered them).
    let recorded = ctx.read_inventory(owner).await.map_err(|e| e.to_string())?;
    let revision =
        crate::helm::recorded_revision(recorded.as_ref().and_then(|r| r.chart_release.as_deref()))
            .unwrap_or(1);
    let chart = ctx
        .charts
        .render(
            &ctx.down,
            &bd.name_any(),
            helm,
            copies_ns,
            revision,
            &[],
            ctx.config.policy.reads(&ctx.config.agent_namespace),
        )
        .await
        .map_err(|f| f.to_string())?;
    let mut hooks = Vec::new();
    for hook in chart.hooks_of(event) {
        hooks.push(FoundHook {
            event,
            found: find(ctx, &hook.manifest, owner).await,
            delete: hook.delete,
            waits: hook.waits(),
        });
    }
    Ok(plan::removal_hook_entries(
        &hooks,
        opts,
        owner,
        &bd.spec.deployment_id,
        &ctx.config.policy,
        &ctx.config.agent_namespace,
    ))
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
    let key = ObjectRef::new(entry.api_version(), &entry.kind, None, &entry.name);
    let (resource, namespaced) = match ctx.down.resolve(entry.api_version(), &entry.kind).await {
        Ok(found) => found,
        Err(e) => {
            let msg = downstream::unresolved(entry.api_version(), &entry.kind, &e);
            return vec![Err(ObjectStatus::new(&key, ObjectState::Error, Some(msg)))];
        }
    };
    ctx.drift.ensure_for(&resource, &owner.name);
    let (object, signed_at) = match ctx.copies.carried(&owner.name, entry).await {
        Ok(found) => found,
        Err(failure) => return vec![Err(failure.status(&key))],
    };
    if namespaced {
        copy_namespaces
            .iter()
            .map(|ns| {
                Ok(plan::carried_copy(
                    &object,
                    entry,
                    Some(ns),
                    owner,
                    keep,
                    signed_at,
                ))
            })
            .collect()
    } else {
        vec![Ok(plan::carried_copy(
            &object, entry, None, owner, keep, signed_at,
        ))]
    }
}

/// A manifest as observed: its kind discovered downstream (and watched for drift), or why it
/// cannot be (`KindNotInstalled`).
async fn find(ctx: &Context, m: &Manifest, owner: &Owner) -> Found {
    let (api_version, kind) = (
        m.api_version().unwrap_or_default(),
        m.kind().unwrap_or_default(),
    );
    let namespaced = match ctx.down.resolve(api_version, kind).await {
        Ok((resource, namespaced)) => {
            ctx.drift.ensure_for(&resource, &owner.name);
            Ok(namespaced)
        }
        Err(e) => Err(downstream::unresolved(api_version, kind, &e)),
    };
    Found {
        manifest: m.clone(),
        namespaced,
    }
}
