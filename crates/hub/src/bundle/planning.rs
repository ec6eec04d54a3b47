//! The Bundle's pure plan over what the read step saw ([`Seen`]): targeting, templates and
//! copies ([`plan::plan`]), then the copy limit and `dependsOn`; and the deletions of
//! untargeted clusters. [`plan::plan`] renders the values templates, up to a budget per
//! cluster (decision 0110-templates-bounded-in-work), so it runs on a blocking thread with
//! what it reads owned and handed back.

use std::sync::Arc;

use kube::ResourceExt;
use tender_types::targeting::{GroupInfo, TargetingError};
use tender_types::{Cluster, ClusterGroup};

use super::depends;
use super::observe::no_labels;
use super::plan::{self, ClusterView};
use super::poll;
use super::read::Seen;

/// The plan with every gate applied before the rollout's: the copy limit and `dependsOn`.
pub(super) struct Gated {
    pub(super) plan: plan::Plan,
    /// Copies held for their size: (bytes, limit).
    pub(super) copy_limit: Option<(usize, usize)>,
    /// What `dependsOn` held (decision 0097-depends-on-per-cluster).
    pub(super) depends: depends::Gate,
}

/// [`plan::plan`] and its gates on a blocking thread: it renders the values templates, up to
/// a budget per cluster (decision 0110-templates-bounded-in-work), and a tokio worker busy
/// with one Bundle's templates would stall the reconciles of every workspace. `None` when the
/// runtime shuts down first.
pub(super) async fn plan_blocking(seen: Seen) -> Option<(Seen, Result<Gated, TargetingError>)> {
    let task = tokio::task::spawn_blocking(move || {
        let planned = gated(&seen);
        (seen, planned)
    });
    match task.await {
        Ok(done) => Some(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}

/// Targeting, templates, copies, then the copy limit and `dependsOn`. Pure.
fn gated(seen: &Seen) -> Result<Gated, TargetingError> {
    let b = &seen.bundle;
    let ns = b.namespace().unwrap_or_default();
    let spec = poll::resolved_spec(&b.spec, seen.version.as_deref());
    let views = cluster_views(&seen.clusters, &seen.owned, &ns);
    let infos = group_infos(&seen.groups);
    let mut plan = plan::plan(
        &b.name_any(),
        &spec,
        &views,
        &infos,
        &seen.sources,
        &seen.copying,
    )?;
    let copy_limit = plan
        .hold_copies_over(seen.copy_limit)
        .then_some((plan.copied_bytes, seen.copy_limit));
    // dependsOn: clusters whose dependencies are not in an accepted state there are held
    // (decision 0097-depends-on-per-cluster).
    let depends = match &seen.depends {
        Some((resolution, states)) => depends::gate(&mut plan, resolution, |dependency, cns| {
            states
                .get(&(dependency.to_string(), cns.to_string()))
                .copied()
        }),
        None => depends::Gate::default(),
    };
    Ok(Gated {
        plan,
        copy_limit,
        depends,
    })
}

/// The ops deleting the BundleDeployments of clusters no longer targeted (not those being
/// deleted already, nor those of a Cluster another shard serves: that replica adopts it).
/// Pure.
pub(super) fn untargeted(seen: &Seen, plan: &plan::Plan) -> Vec<tender_runtime::Op> {
    let ns = seen.bundle.namespace().unwrap_or_default();
    let matched: std::collections::BTreeSet<String> = plan
        .matched
        .iter()
        .map(|c| tender_types::names::cluster_namespace(&ns, c))
        .collect();
    let mut ops: Vec<_> = seen
        .existing
        .iter()
        .filter(|(cns, bd)| {
            bd.metadata.deletion_timestamp.is_none()
                && !matched.contains(*cns)
                && !seen.served_elsewhere.contains(*cns)
        })
        .map(|(cns, bd)| (cns, super::ops::delete_deployment_op(bd)))
        .collect();
    ops.sort_by(|a, b| a.0.cmp(b.0));
    ops.into_iter().map(|(_, op)| op).collect()
}

/// The Clusters of workspace `ns` as planning sees them; `owned[i]` is `clusters[i]`'s
/// namespace on the hub.
pub(super) fn cluster_views<'a>(
    clusters: &'a [Arc<Cluster>],
    owned: &'a [Option<String>],
    ns: &'a str,
) -> Vec<ClusterView<'a>> {
    clusters
        .iter()
        .zip(owned)
        .map(|(c, namespace)| ClusterView {
            name: c.metadata.name.as_deref().unwrap_or_default(),
            labels: c.metadata.labels.as_ref().unwrap_or(no_labels()),
            namespace: namespace.as_deref(),
            paused: c.spec.paused,
            workspace: ns,
            annotations: c.metadata.annotations.as_ref().unwrap_or(no_labels()),
            template_values: c.spec.template_values.as_ref().map(|v| &v.0),
        })
        .collect()
}

pub(super) fn group_infos(groups: &[Arc<ClusterGroup>]) -> Vec<GroupInfo<'_>> {
    groups
        .iter()
        .map(|g| GroupInfo {
            name: g.metadata.name.as_deref().unwrap_or_default(),
            labels: g.metadata.labels.as_ref().unwrap_or(no_labels()),
            selector: &g.spec.selector,
        })
        .collect()
}
