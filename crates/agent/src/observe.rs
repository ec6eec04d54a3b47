//! Observing one BundleDeployment (decision 0088-phased-deploy-and-helm-hooks, decision
//! 0118-agent-decides-in-the-plan): its copies from the hub, discovery of every kind, the
//! fan-out namespaces and the inventory ([`observe`]), then — once the chart is rendered
//! ([`crate::rendering`]) and the objects planned — the live object of each ([`live`]). Only
//! reads: the pure [`plan`] decides, the drift watches of the kinds found here are started by
//! the report step.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::ResourceExt;
use kube::discovery::ApiResource;
use tender_runtime::reconcile::{error_text, is_not_found};
use tender_types::conditions::reason;
use tender_types::{
    BundleDeployment, BundleDeploymentOptions, Manifest, ObjectRef, ObjectState, ObjectStatus,
    namespaces,
};

use crate::context::Context;
use crate::files;
use crate::hooks::HookEvent;
use crate::plan::{self, DeployPlan, Entry, Found, FoundCopy, FoundHook, Live, LiveState, Owner};
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
    /// The plan's inputs (the chart's are filled by [`crate::rendering::render`]).
    pub(crate) input: plan::Observed,
    /// The chart's revision this run renders (`None`: no chart).
    pub(crate) revision: Option<u32>,
    /// Where the copies (and the chart's release) go without fan-out.
    pub(crate) copies_namespace: String,
    /// downstreamResources present but the copy feature is off on this agent.
    pub(crate) copy_feature_disabled: bool,
    /// How long a hook may run.
    pub(crate) hook_timeout: Duration,
    /// The kinds this deployment writes, to watch for drift (started by the report step).
    pub(crate) watch: Vec<ApiResource>,
    /// The files of `resources`, decoded (or why they cannot be), for the chart they carry.
    pub(crate) files: std::result::Result<Vec<files::File>, files::FileError>,
}

/// Observes `bd` for owner `owner`; `pending` says a new deploymentID waits to be applied.
pub(crate) async fn observe(
    ctx: &Context,
    bd: &BundleDeployment,
    owner: &Owner,
    pending: bool,
    verified: &BTreeMap<String, String>,
) -> Result<Observation> {
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
    let mut watch = Vec::new();
    let mut copies: Vec<FoundCopy> = Vec::new();
    if !copy_feature_disabled {
        let keep = opts.keep_resources;
        for entry in &opts.downstream_resources {
            if let Err(msg) = &fan_out {
                let key = ObjectRef::new(entry.api_version(), &entry.kind, None, &entry.name);
                copies.push(FoundCopy::Planned(Err(ObjectStatus::new(
                    &key,
                    ObjectState::Error,
                    Some(msg.clone()),
                ))));
            } else if entry.is_carried() {
                copies.extend(carried(ctx, entry, &copy_namespaces, owner, &mut watch).await);
            } else {
                for ns in &copy_namespaces {
                    let planned = ctx.copies.desired(entry, ns, owner, keep).await;
                    copies.push(FoundCopy::Planned(planned));
                }
            }
        }
    }
    let mut manifests: Vec<Found> = Vec::new();
    for m in Manifest::manifests(&spec.resources) {
        manifests.push(find(ctx, m, &mut watch).await);
    }
    let files = files::decode_all(Manifest::files(&spec.resources));
    manifests.extend(file_manifests(ctx, &files, &mut watch).await);
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
    let chart_from = manifests.len();
    Ok(Observation {
        input: plan::Observed {
            pending,
            run: spec.deployment_id.clone(),
            owner: owner.clone(),
            options: consumed_hashes(opts, verified),
            fan_out: fan_out.ok().flatten(),
            copies,
            manifests,
            chart_from,
            chart_entry: None,
            crds: Vec::new(),
            hooks: Vec::new(),
            upgrade,
            previous: recorded
                .as_ref()
                .map(|r| r.objects.clone())
                .unwrap_or_default(),
            recorded: recorded.is_some(),
            applied_release: recorded.as_ref().and_then(|r| r.chart_release.clone()),
            release: chart_release,
        },
        revision,
        copies_namespace: copies_ns,
        copy_feature_disabled,
        hook_timeout: hook_timeout(bd),
        watch,
        files,
    })
}

/// The manifests of the manifest files among `files` (decision 0123-files-in-a-bundle), or one
/// error entry naming the file that cannot be read (an error blocks pruning).
async fn file_manifests(
    ctx: &Context,
    files: &std::result::Result<Vec<files::File>, files::FileError>,
    watch: &mut Vec<ApiResource>,
) -> Vec<Found> {
    let read = files
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|f| files::manifests(f));
    match read {
        Ok(manifests) => {
            let mut out = Vec::with_capacity(manifests.len());
            for m in &manifests {
                out.push(find(ctx, m, watch).await);
            }
            out
        }
        Err(e) => vec![Found {
            manifest: e.manifest(),
            namespaced: Err(format!("{}: {e}", reason::FILES_INVALID)),
        }],
    }
}

/// The options the manifests are planned with. `rolloutOnCopyChange` hashes what each
/// workload consumes: the content hash of each copy the agent verified (`verified`, by copy
/// name), since the spec carries none (decision 0089-signed-copies). Only the manifests' plan
/// reads these; the copies were verified by their signatures.
fn consumed_hashes(
    opts: &BundleDeploymentOptions,
    verified: &BTreeMap<String, String>,
) -> BundleDeploymentOptions {
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
    options
}

/// The live object of every object `plan` applies: from the cache of managed objects, else
/// the apiserver (absent, or not ours); why it cannot be read otherwise.
pub(crate) async fn live(ctx: &Context, plan: &DeployPlan) -> LiveState {
    let mut out = LiveState::new();
    for phase in &plan.phases {
        for entry in &phase.entries {
            let Entry::Apply { desired, .. } = entry else {
                continue;
            };
            if !out.contains_key(&desired.key) {
                let found = live_object(ctx, &desired.key).await;
                out.insert(desired.key.clone(), found);
            }
        }
    }
    out
}

async fn live_object(ctx: &Context, r: &ObjectRef) -> std::result::Result<Live, String> {
    let (key, api) = ctx
        .down
        .locate(r)
        .await
        .map_err(|e| downstream::unresolved(&r.api_version, &r.kind, &e))?;
    let object = match ctx.drift.cached(&key) {
        Some(cached) => Some(serde_json::to_value(cached.as_ref()).unwrap_or_default()),
        None => match api.get_opt(&r.name).await {
            Ok(live) => live.map(|o| serde_json::to_value(o).unwrap_or_default()),
            Err(e) => {
                let msg = format!("cannot read: {}", error_text(&e, key.is_secret()));
                let gone = is_not_found(&e);
                return Err(crate::sync::unless_gone(ctx, r, &key, gone, msg).await);
            }
        },
    };
    Ok(Live { key, object })
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
            &files::decode_all(Manifest::files(&bd.spec.resources)).map_err(|e| e.to_string())?,
            ctx.config.policy.reads(&ctx.config.agent_namespace),
        )
        .await
        .map_err(|f| f.to_string())?;
    let mut hooks = Vec::new();
    let mut watch = Vec::new();
    for hook in chart.hooks_of(event) {
        hooks.push(FoundHook {
            event,
            found: find(ctx, &hook.manifest, &mut watch).await,
            delete: hook.delete,
            waits: hook.waits(),
        });
    }
    start_watches(ctx, &owner.name, &watch);
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

/// Starts the drift watches of `kinds` for BundleDeployment `bd` (the report step's).
pub(crate) fn start_watches(ctx: &Context, bd: &str, kinds: &[ApiResource]) {
    for resource in kinds {
        ctx.drift.ensure_for(resource, bd);
    }
}

/// The carried objects of a source of any kind but Secret/ConfigMap: its kind must be served
/// downstream (else `KindNotInstalled`), its carrier verified; one per fan-out namespace for a
/// namespaced kind, once for a cluster-scoped one. Its kind is added to `watch`.
async fn carried(
    ctx: &Context,
    entry: &tender_types::CopiedResource,
    copy_namespaces: &[String],
    owner: &Owner,
    watch: &mut Vec<ApiResource>,
) -> Vec<FoundCopy> {
    let key = ObjectRef::new(entry.api_version(), &entry.kind, None, &entry.name);
    let (resource, namespaced) = match ctx.down.resolve(entry.api_version(), &entry.kind).await {
        Ok(found) => found,
        Err(e) => {
            let msg = downstream::unresolved(entry.api_version(), &entry.kind, &e);
            let status = ObjectStatus::new(&key, ObjectState::Error, Some(msg));
            return vec![FoundCopy::Planned(Err(status))];
        }
    };
    watch.push(resource);
    let (object, signed_at) = match ctx.copies.carried(&owner.name, entry).await {
        Ok(found) => found,
        Err(failure) => return vec![FoundCopy::Planned(Err(failure.status(&key)))],
    };
    let namespaces: Vec<Option<String>> = if namespaced {
        copy_namespaces.iter().cloned().map(Some).collect()
    } else {
        vec![None]
    };
    namespaces
        .into_iter()
        .map(|namespace| FoundCopy::Carried {
            object: object.clone(),
            entry: entry.clone(),
            namespace,
            signed_at,
        })
        .collect()
}

/// A manifest as observed: its kind discovered downstream (and added to `watch`), or why it
/// cannot be (`KindNotInstalled`).
pub(crate) async fn find(ctx: &Context, m: &Manifest, watch: &mut Vec<ApiResource>) -> Found {
    let (api_version, kind) = (
        m.api_version().unwrap_or_default(),
        m.kind().unwrap_or_default(),
    );
    let namespaced = match ctx.down.resolve(api_version, kind).await {
        Ok((resource, namespaced)) => {
            watch.push(resource);
            Ok(namespaced)
        }
        Err(e) => Err(downstream::unresolved(api_version, kind, &e)),
    };
    Found {
        manifest: m.clone(),
        namespaced,
    }
}
