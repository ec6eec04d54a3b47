//! ClusterGroup controller: how many Clusters a group selects and how many are ready.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tender_types::cluster_group::MAX_NON_READY_CLUSTERS;
use tender_types::conditions::{self, TYPE_READY, reason};
use tender_types::targeting::selector_matches;
use tender_types::{ClusterGroup, ClusterGroupDisplay, ClusterGroupStatus};

use crate::Error;
use crate::context::{Ctx, status_op};

const CONTROLLER: &str = "clustergroup";

/// A Cluster as a group's status counts it.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// Name of the Cluster.
    pub name: &'a str,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Whether its `Ready` condition is true.
    pub ready: bool,
}

/// The status of a group with `selector` over `clusters`, starting from `existing`.
pub fn group_status(
    existing: Option<&ClusterGroupStatus>,
    selector: &LabelSelector,
    clusters: &[Member<'_>],
    generation: Option<i64>,
    now: Time,
) -> ClusterGroupStatus {
    let mut status = existing.cloned().unwrap_or_default();
    status.observed_generation = generation;
    let selected: Result<Vec<&Member<'_>>, _> = clusters
        .iter()
        .filter_map(|c| match selector_matches(selector, c.labels) {
            Ok(true) => Some(Ok(c)),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        })
        .collect();
    let (ready, why, message, state) = match selected {
        Err(error) => {
            status.cluster_count = 0;
            status.ready_cluster_count = 0;
            status.non_ready_clusters.clear();
            (
                false,
                reason::INVALID_SELECTOR,
                format!("spec.selector: {error}"),
                "InvalidSelector",
            )
        }
        Ok(members) => {
            let mut non_ready: Vec<&str> = members
                .iter()
                .filter(|c| !c.ready)
                .map(|c| c.name)
                .collect();
            non_ready.sort_unstable();
            status.cluster_count = i32::try_from(members.len()).unwrap_or(i32::MAX);
            status.ready_cluster_count =
                status.cluster_count - i32::try_from(non_ready.len()).unwrap_or(i32::MAX);
            status.non_ready_clusters = non_ready
                .iter()
                .take(MAX_NON_READY_CLUSTERS)
                .map(ToString::to_string)
                .collect();
            if members.is_empty() {
                (
                    false,
                    reason::NO_CLUSTERS_MATCHED,
                    "the selector matches no Cluster".to_string(),
                    "Empty",
                )
            } else if non_ready.is_empty() {
                (true, reason::READY, String::new(), "Ready")
            } else {
                (
                    false,
                    reason::NOT_READY,
                    format!(
                        "{} of {} clusters not ready",
                        non_ready.len(),
                        members.len()
                    ),
                    "NotReady",
                )
            }
        }
    };
    conditions::set_condition(
        &mut status.conditions,
        TYPE_READY,
        ready,
        why,
        &message,
        generation,
        now,
    );
    status.display = Some(ClusterGroupDisplay {
        ready_clusters: format!("{}/{}", status.ready_cluster_count, status.cluster_count),
        state: state.to_string(),
    });
    status
}

pub(crate) async fn reconcile(group: Arc<ClusterGroup>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    // The cache as it is now (see the Cluster reconciler): never decide on an older snapshot.
    let group = ctx
        .stores
        .groups
        .get(&kube::runtime::reflector::ObjectRef::from_obj(
            group.as_ref(),
        ))
        .unwrap_or(group);
    let ns = group.namespace().unwrap_or_default();
    let clusters = ctx.clusters_in(&ns);
    let members: Vec<Member<'_>> = clusters
        .iter()
        .map(|c| Member {
            name: c.metadata.name.as_deref().unwrap_or_default(),
            labels: c.metadata.labels.as_ref().unwrap_or(&EMPTY),
            ready: c
                .status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, TYPE_READY)),
        })
        .collect();
    let status = group_status(
        group.status.as_ref(),
        &group.spec.selector,
        &members,
        group.metadata.generation,
        Time(ctx.clock.now()),
    );
    let desired =
        tender_types::hash::value_hash(&serde_json::to_value(&status).unwrap_or_default());
    let op = status_op::<ClusterGroup, _>(
        &ns,
        &group.name_any(),
        group.resource_version(),
        group.status.as_ref(),
        &status,
        desired,
    );
    ctx.write_status(op).await?;
    ctx.retries.succeeded(group.as_ref());
    Ok(Action::await_change())
}

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

pub(crate) fn error_policy(group: Arc<ClusterGroup>, error: &Error, ctx: Arc<Ctx>) -> Action {
    tender_runtime::retry::error_policy(
        CONTROLLER,
        group.as_ref(),
        error,
        &ctx.retries,
        &ctx.metrics,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn counts_selected_and_ready_clusters() {
        let prod = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        let dev = BTreeMap::from([("env".to_string(), "dev".to_string())]);
        let members = [
            Member {
                name: "b",
                labels: &prod,
                ready: false,
            },
            Member {
                name: "a",
                labels: &prod,
                ready: false,
            },
            Member {
                name: "c",
                labels: &prod,
                ready: true,
            },
            Member {
                name: "d",
                labels: &dev,
                ready: true,
            },
        ];
        let selector = LabelSelector {
            match_labels: Some(prod.clone()),
            ..Default::default()
        };
        let s = group_status(None, &selector, &members, Some(1), at(1));
        assert_eq!((s.cluster_count, s.ready_cluster_count), (3, 1));
        assert_eq!(s.non_ready_clusters, ["a", "b"]);
        assert_eq!(s.display.as_ref().unwrap().ready_clusters, "1/3");
        assert_eq!(
            group_status(Some(&s), &selector, &members, Some(1), at(9)),
            s
        );

        let all = group_status(None, &LabelSelector::default(), &members, None, at(1));
        assert_eq!(all.cluster_count, 4);

        let bad = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: "Near".into(),
                values: None,
            }]),
            ..Default::default()
        };
        let s = group_status(None, &bad, &members, None, at(1));
        let ready = conditions::find_condition(&s.conditions, TYPE_READY).unwrap();
        assert_eq!(ready.reason, reason::INVALID_SELECTOR);
    }
}
