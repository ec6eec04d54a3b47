//! The Bundle's plan computed off the reconcile's async threads: [`plan::plan`] renders the
//! values templates, up to a budget per cluster (decision 0110-templates-bounded-in-work), so
//! it runs on a blocking thread with what it reads owned and handed back.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use tender_types::targeting::{GroupInfo, TargetingError};
use tender_types::{Bundle, Cluster, ClusterGroup};

use super::observe::no_labels;
use super::plan::{self, ClusterView, SourceKey};
use super::poll;

/// What planning reads, owned so that it can run on a blocking thread, and handed back.
pub(super) struct Planning {
    pub(super) bundle: Arc<Bundle>,
    /// The chart version the poll controller recorded, if any.
    pub(super) version: Option<String>,
    pub(super) clusters: Vec<Arc<Cluster>>,
    pub(super) owned: Vec<Option<String>>,
    pub(super) groups: Vec<Arc<ClusterGroup>>,
    pub(super) sources: BTreeMap<SourceKey, plan::SourceState>,
    pub(super) copying: plan::Copying,
}

/// [`plan::plan`] on a blocking thread: it renders the values templates, up to a budget per
/// cluster (decision 0110-templates-bounded-in-work), and a tokio worker busy with one Bundle's
/// templates would stall the reconciles of every workspace. `None` when the runtime shuts
/// down first.
pub(super) async fn plan_blocking(
    input: Planning,
) -> Option<(Planning, Result<plan::Plan, TargetingError>)> {
    let task = tokio::task::spawn_blocking(move || {
        let b = &input.bundle;
        let ns = b.namespace().unwrap_or_default();
        let spec = poll::resolved_spec(&b.spec, input.version.as_deref());
        let views = cluster_views(&input.clusters, &input.owned, &ns);
        let infos = group_infos(&input.groups);
        let planned = plan::plan(
            &b.name_any(),
            &spec,
            &views,
            &infos,
            &input.sources,
            &input.copying,
        );
        (input, planned)
    });
    match task.await {
        Ok(done) => Some(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
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
