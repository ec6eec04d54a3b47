//! The ClusterGroup controller in-process: the counts `group::reconcile` writes into a group's
//! status, and nothing when they did not change.

use serde_json::json;
use tender_types::conditions::{self, TYPE_READY, reason};

use super::*;

/// Sets Cluster `name`'s `Ready` condition as its own controller would have.
fn set_ready(hub: &TestHub, name: &str, ready: bool) {
    let at = hub.now().to_string();
    hub.edit::<Cluster>(Some(WS), name, |c| {
        c["status"] = json!({"conditions": [{
            "type": "Ready", "status": if ready { "True" } else { "False" },
            "reason": "Test", "message": "", "lastTransitionTime": at,
        }]});
    });
}

/// (clusterCount, readyClusterCount, nonReadyClusters, Ready reason) of group `name`.
fn counts(hub: &TestHub, name: &str) -> (i32, i32, Vec<String>, String) {
    let group: ClusterGroup = hub.get(Some(WS), name).expect("the group");
    let s = group.status.expect("status");
    let ready = conditions::find_condition(&s.conditions, TYPE_READY).expect("Ready");
    (
        s.cluster_count,
        s.ready_cluster_count,
        s.non_ready_clusters,
        ready.reason.clone(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_group_counts_its_clusters_and_writes_only_when_they_change() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.cluster("dev", &[("env", "dev")]);
    set_ready(&hub, "one", true);
    set_ready(&hub, "two", false);
    set_ready(&hub, "dev", true);
    hub.group("prod", json!({"matchLabels": {"env": "prod"}}));
    hub.take_writes();

    hub.reconcile_group("prod").await;
    assert_eq!(
        hub.take_writes(),
        [format!("status clustergroups {WS}/prod")]
    );
    assert_eq!(
        counts(&hub, "prod"),
        (2, 1, vec!["two".to_string()], reason::NOT_READY.to_string())
    );

    // Idle: nothing changed, nothing written, even an hour later.
    hub.reconcile_group("prod").await;
    tokio::time::advance(std::time::Duration::from_secs(3600)).await;
    hub.reconcile_group("prod").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());

    // A cluster outside the group changes: still nothing.
    set_ready(&hub, "dev", false);
    hub.reconcile_group("prod").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());

    // Its last member becomes ready: one write.
    set_ready(&hub, "two", true);
    hub.reconcile_group("prod").await;
    assert_eq!(
        hub.take_writes(),
        [format!("status clustergroups {WS}/prod")]
    );
    assert_eq!(
        counts(&hub, "prod"),
        (2, 2, vec![], reason::READY.to_string())
    );
}

#[tokio::test(start_paused = true)]
async fn a_group_matching_nothing_says_so() {
    let hub = TestHub::new();
    hub.cluster("dev", &[("env", "dev")]);
    hub.group("prod", json!({"matchLabels": {"env": "prod"}}));
    hub.take_writes();

    hub.reconcile_group("prod").await;
    assert_eq!(
        counts(&hub, "prod"),
        (0, 0, vec![], reason::NO_CLUSTERS_MATCHED.to_string())
    );
}
