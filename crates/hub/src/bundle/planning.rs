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
    let matched = plan.matched_namespaces(&ns);
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    use serde_json::json;
    use tender_runtime::Op;
    use tender_types::{Bundle, BundleDeployment, BundleState, names};

    use super::*;
    use crate::bundle::depends::Resolution;

    fn bundle(spec: serde_json::Value) -> Arc<Bundle> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
                "metadata": {"name": "app", "namespace": "ws", "uid": "b-uid", "generation": 1},
                "spec": spec,
            }))
            .unwrap(),
        )
    }

    fn cluster(name: &str) -> Arc<Cluster> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
                "metadata": {"name": name, "namespace": "ws", "labels": {"env": "prod"}},
                "spec": {},
            }))
            .unwrap(),
        )
    }

    fn deployment(cluster: &str, deleting: bool) -> (String, Arc<BundleDeployment>) {
        let cns = names::cluster_namespace("ws", cluster);
        let mut bd: BundleDeployment = serde_json::from_value(json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "BundleDeployment",
            "metadata": {"name": "app", "namespace": cns, "uid": format!("uid-{cluster}")},
            "spec": {"deploymentID": "x", "options": {"defaultNamespace": "default"}},
        }))
        .unwrap();
        if deleting {
            bd.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
                ));
        }
        (cns, Arc::new(bd))
    }

    /// The Bundle targeting `env=prod` as read with `clusters` (each in its hub namespace).
    fn seen(spec: serde_json::Value, clusters: &[&str]) -> Seen {
        let clusters: Vec<Arc<Cluster>> = clusters.iter().map(|c| cluster(c)).collect();
        let owned = clusters
            .iter()
            .map(|c| {
                Some(names::cluster_namespace(
                    "ws",
                    c.metadata.name.as_deref().unwrap(),
                ))
            })
            .collect();
        Seen {
            bundle: bundle(spec),
            version: None,
            clusters,
            owned,
            groups: Vec::new(),
            sources: BTreeMap::new(),
            copying: plan::Copying {
                enabled: true,
                allowed: tender_types::copy::CopyableKind::parse_list(
                    tender_types::copy::DEFAULT_COPYABLE_KINDS,
                )
                .unwrap(),
            },
            fetched: HashMap::new(),
            existing: HashMap::new(),
            copies_by_ns: HashMap::new(),
            depends: None,
            served_elsewhere: BTreeSet::new(),
            upstream: None,
            copy_limit: usize::MAX,
            rollout: Ok(Default::default()),
        }
    }

    fn prod() -> serde_json::Value {
        json!({"targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
               "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "cm"}, "data": {"a": "b"}}]})
    }

    #[test]
    fn depends_on_holds_the_clusters_where_a_dependency_is_not_ready() {
        let mut s = seen(prod(), &["east", "west"]);
        let east = names::cluster_namespace("ws", "east");
        let west = names::cluster_namespace("ws", "west");
        let resolution = Resolution::Resolved(vec![(
            serde_json::from_value(json!({"name": "db"})).unwrap(),
            vec!["db".to_string()],
        )]);
        let states = HashMap::from([
            (("db".to_string(), east.clone()), BundleState::Ready),
            (("db".to_string(), west.clone()), BundleState::NotReady),
        ]);
        s.depends = Some((resolution, states));
        let gated = gated(&s).unwrap();
        let spec_of = |ns: &str| {
            gated
                .plan
                .deployments
                .iter()
                .find(|d| d.namespace == ns)
                .map(|d| d.spec.is_some())
        };
        assert_eq!(spec_of(&east), Some(true), "its dependency is ready there");
        assert_eq!(spec_of(&west), Some(false), "held: nothing written there");
        assert_eq!(
            gated.depends.held,
            vec![("west".to_string(), "db: NotReady".to_string())]
        );
    }

    #[test]
    fn nothing_is_held_without_depends_on_or_under_the_copy_limit() {
        let gated = gated(&seen(prod(), &["east"])).unwrap();
        assert!(gated.depends == depends::Gate::default() && gated.copy_limit.is_none());
        assert!(gated.plan.deployments.iter().all(|d| d.spec.is_some()));
    }

    #[test]
    fn untargeting_deletes_only_the_bundle_deployments_that_are_ours_to_delete() {
        let mut s = seen(prod(), &["east"]);
        // east is targeted; gone was untargeted; leaving is being deleted already; moved
        // belongs to a Cluster another shard serves.
        for (c, deleting) in [
            ("east", false),
            ("gone", false),
            ("leaving", true),
            ("moved", false),
        ] {
            let (cns, bd) = deployment(c, deleting);
            s.existing.insert(cns, bd);
        }
        s.served_elsewhere
            .insert(names::cluster_namespace("ws", "moved"));
        let gated = gated(&s).unwrap();
        let ops = untargeted(&s, &gated.plan);
        let deleted: Vec<_> = ops
            .iter()
            .map(|op| match op {
                Op::Delete { key, uid } => (key.namespace.clone(), uid.clone()),
                other => panic!("a delete, not {other:?}"),
            })
            .collect();
        assert_eq!(
            deleted,
            vec![(
                Some(names::cluster_namespace("ws", "gone")),
                Some("uid-gone".to_string())
            )]
        );
    }
}
