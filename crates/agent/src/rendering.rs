//! Rendering a deployment's chart, the step between observing and planning (decision
//! 0118-agent-decides-in-the-plan): values and credentials from the observed copies or the
//! downstream cluster, the chart from its repository, `helm template`, then discovery of each
//! rendered object's kind. The chart's objects, CRDs and hooks join the observation; a chart
//! that cannot be rendered is one entry (Error, or Missing while a copy it reads is on its
//! way), which blocks pruning (nothing deployed goes away).

use kube::ResourceExt;
use tender_types::{BundleDeployment, ObjectState, ObjectStatus};

use crate::context::Context;
use crate::hooks::{HookEvent, RenderedChart};
use crate::observe::{Observation, find};
use crate::plan::{FoundCopy, FoundHook, Planned};

/// Renders `bd`'s chart (if any) into `observed`.
pub(crate) async fn render(ctx: &Context, bd: &BundleDeployment, observed: &mut Observation) {
    let Some(helm) = &bd.spec.helm else {
        return;
    };
    let name = bd.name_any();
    let copies_ns = observed.copies_namespace.clone();
    let release = helm.release_name_or(&name);
    let key = crate::helm::chart_key(helm, release, &copies_ns);
    let sources = crate::helm::needed_sources(helm, &copies_ns);
    // Values and credentials come from the Secret and ConfigMap copies about to be applied.
    let copies: Vec<Planned> = observed
        .input
        .copies
        .iter()
        .filter_map(|c| match c {
            FoundCopy::Planned(p) => Some(p.clone()),
            FoundCopy::Carried { .. } => None,
        })
        .collect();
    // A chart carried in the files cannot be rendered from files that cannot be read.
    let files: &[crate::files::File] = match (&observed.files, helm.files_dir()) {
        (Ok(files), _) => files,
        (Err(_), None) => &[],
        (Err(e), Some(_)) => {
            observed.input.chart_entry = Some(ObjectStatus::new(
                &key,
                ObjectState::Error,
                Some(format!(
                    "{}: the chart's files cannot be read: {e}",
                    tender_types::conditions::reason::FILES_INVALID
                )),
            ));
            return;
        }
    };
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
                observed.revision.unwrap_or(1),
                &copies,
                files,
                ctx.config.policy.reads(&ctx.config.agent_namespace),
            )
            .await
            .map_err(|failure| {
                tracing::warn!(bundle_deployment = %name, reason = failure.reason, "chart not rendered");
                ObjectStatus::new(&key, ObjectState::Error, Some(failure.to_string()))
            }),
    };
    let RenderedChart {
        crds,
        objects,
        hooks,
    } = match rendered {
        Ok(chart) => chart,
        Err(entry) => {
            observed.input.chart_entry = Some(entry);
            return;
        }
    };
    let (input, watch) = (&mut observed.input, &mut observed.watch);
    for m in &crds {
        input.crds.push(find(ctx, m, watch).await);
    }
    for m in &objects {
        input.manifests.push(find(ctx, m, watch).await);
    }
    let (pre, post) = HookEvent::around(input.upgrade);
    for event in [pre, post] {
        for hook in crate::hooks::ordered(&hooks, event) {
            input.hooks.push(FoundHook {
                event,
                found: find(ctx, &hook.manifest, watch).await,
                delete: hook.delete,
                waits: hook.waits(),
            });
        }
    }
}
