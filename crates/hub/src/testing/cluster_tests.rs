//! The Cluster controller in-process: what `cluster::reconcile` writes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;
use tender_types::conditions::{self, TYPE_AGENT_CONNECTED, reason};

use super::*;

fn cns(cluster: &str) -> String {
    names::cluster_namespace(WS, cluster)
}

/// `(status, reason)` of condition `type_` on Cluster `name` as stored.
fn condition(hub: &TestHub, name: &str, type_: &str) -> Option<(String, String)> {
    let cluster: Cluster = hub.get(Some(WS), name)?;
    let status = cluster.status?;
    conditions::find_condition(&status.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Cluster `one`, registered by its own reconciles (writes taken).
async fn registered(hub: &TestHub) {
    hub.put::<Cluster>(json!({"metadata": {"name": "one", "namespace": WS, "labels": {"env": "prod"}}, "spec": {}}));
    hub.sync();
    for _ in 0..3 {
        hub.reconcile_cluster("one").await;
    }
    hub.take_writes();
}

#[tokio::test(start_paused = true)]
async fn a_new_cluster_is_registered_step_by_step_then_left_alone() {
    let hub = TestHub::new();
    hub.put::<Cluster>(json!({"metadata": {"name": "one", "namespace": WS}, "spec": {}}));
    hub.sync();
    let ns = cns("one");

    // The cleanup finalizer first.
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), [format!("patch clusters {WS}/one")]);
    let cluster: Cluster = hub.get(Some(WS), "one").expect("cluster");
    assert_eq!(
        cluster.metadata.finalizers,
        Some(vec![labels::CLUSTER_CLEANUP_FINALIZER.to_string()])
    );

    // Its namespace: a claim recorded, the namespace created, its uid recorded.
    hub.reconcile_cluster("one").await;
    assert_eq!(
        hub.take_writes(),
        [
            format!("patch clusters {WS}/one"),
            format!("create namespaces {ns}"),
            format!("patch clusters {WS}/one"),
        ]
    );
    let namespace: Namespace = hub.get(None, &ns).expect("namespace");
    let cluster: Cluster = hub.get(Some(WS), "one").expect("cluster");
    assert_eq!(
        cluster
            .metadata
            .annotations
            .expect("annotations")
            .get(labels::NAMESPACE_UID),
        namespace.metadata.uid.as_ref()
    );

    // Then the agent's identity and access, and the status.
    hub.reconcile_cluster("one").await;
    assert_eq!(
        hub.take_writes(),
        [
            format!("apply serviceaccounts {ns}/tender-agent"),
            format!("apply roles {ns}/tender-agent"),
            format!("apply rolebindings {ns}/tender-agent"),
            format!("apply roles {WS}/tender-agent-one"),
            format!("apply rolebindings {WS}/tender-agent-one"),
            format!("status clusters {WS}/one"),
        ]
    );
    let (status, why) = condition(&hub, "one", TYPE_AGENT_CONNECTED).expect("condition");
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", reason::WAITING_FOR_AGENT)
    );

    // Nothing changed: nothing written.
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_namespace_someone_else_created_is_not_provisioned() {
    let hub = TestHub::new();
    hub.fake.insert(
        &ApiResource::erase::<Namespace>(&()),
        json!({"metadata": {"name": cns("one"), "labels": {labels::WORKSPACE: WS}}}),
    );
    hub.put::<Cluster>(json!({"metadata": {"name": "one", "namespace": WS, "finalizers": [labels::CLUSTER_CLEANUP_FINALIZER]}, "spec": {}}));
    hub.sync();

    hub.reconcile_cluster("one").await;
    assert_eq!(
        hub.take_writes(),
        [format!("status clusters {WS}/one")],
        "status only"
    );
    let cluster: Cluster = hub.get(Some(WS), "one").expect("cluster");
    assert!(
        cluster
            .metadata
            .annotations
            .is_none_or(|a| !a.contains_key(labels::NAMESPACE_UID))
    );
}

#[tokio::test(start_paused = true)]
async fn an_agent_is_offline_once_its_heartbeat_is_older_than_the_configured_time() {
    let hub = TestHub::with_config(HubConfig {
        agent_offline_after: Duration::from_secs(30),
        ..test_config()
    });
    registered(&hub).await;
    let renewed = hub.now().to_string();
    hub.fake.insert(
        &ApiResource::erase::<Lease>(&()),
        json!({"metadata": {"name": names::AGENT_LEASE, "namespace": cns("one")},
               "spec": {"holderIdentity": "agent", "renewTime": renewed}}),
    );
    hub.sync();
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), [format!("status clusters {WS}/one")]);
    let (status, _) = condition(&hub, "one", TYPE_AGENT_CONNECTED).expect("condition");
    assert_eq!(status, "True");

    tokio::time::advance(Duration::from_secs(29)).await;
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new(), "still within 30 s");
    tokio::time::advance(Duration::from_secs(2)).await;
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), [format!("status clusters {WS}/one")]);
    let (status, why) = condition(&hub, "one", TYPE_AGENT_CONNECTED).expect("condition");
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", reason::AGENT_OFFLINE)
    );
}

#[tokio::test(start_paused = true)]
async fn a_summary_only_change_waits_the_configured_delay() {
    let hub = TestHub::with_config(HubConfig {
        cluster_summary_delay: Duration::from_secs(20),
        ..test_config()
    });
    registered(&hub).await;
    hub.bundle(
        "app",
        json!({"targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}]}),
    );
    hub.reconcile_bundle("app").await;
    hub.take_writes();

    // The BundleDeployment's arrival moves only the summary: held for the delay.
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
    tokio::time::advance(Duration::from_secs(19)).await;
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new(), "still within 20 s");
    tokio::time::advance(Duration::from_secs(2)).await;
    hub.reconcile_cluster("one").await;
    assert_eq!(hub.take_writes(), [format!("status clusters {WS}/one")]);
    let cluster: Cluster = hub.get(Some(WS), "one").expect("cluster");
    let summary = cluster.status.and_then(|s| s.summary).expect("summary");
    assert_eq!(summary.desired_ready, 1);
}
