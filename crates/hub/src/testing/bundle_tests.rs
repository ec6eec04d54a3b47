//! The Bundle controller in-process: what `bundle::reconcile` writes, situation by situation,
//! asserted on the requests the fake apiserver recorded (never on the controller's internals).

use std::time::Duration;

use serde_json::json;
use tender_types::conditions::{self, TYPE_READY, reason};

use super::*;

const COPY: &str = "app-secret-db-83cc1460";

/// A Bundle copying Secret `db` to every cluster labelled `env=prod`.
fn copying_spec() -> Value {
    json!({
        "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
        "downstreamResources": [{"kind": "Secret", "name": "db"}],
    })
}

fn cns(cluster: &str) -> String {
    names::cluster_namespace(WS, cluster)
}

fn bd_write(cluster: &str) -> String {
    format!("apply bundledeployments {}/app", cns(cluster))
}

fn copy_write(cluster: &str) -> String {
    format!("apply secrets {}/{COPY}", cns(cluster))
}

/// The writes, sorted (clusters are written concurrently, in no fixed order).
fn sorted(mut writes: Vec<String>) -> Vec<String> {
    writes.sort();
    writes
}

fn strings(items: &[String]) -> Vec<String> {
    sorted(items.to_vec())
}

/// `(status, reason)` of condition `type_` on Bundle `name` as stored.
fn condition(hub: &TestHub, name: &str, type_: &str) -> Option<(String, String)> {
    let bundle: Bundle = hub.get(Some(WS), name)?;
    let status = bundle.status?;
    conditions::find_condition(&status.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// The copy of Secret `db` in `cluster`'s namespace, its `password` as text.
fn copied_password(hub: &TestHub, cluster: &str) -> Option<String> {
    let copy: Secret = hub.get(Some(&cns(cluster)), COPY)?;
    let value = copy.data?.get("password")?.0.clone();
    Some(String::from_utf8(value).expect("text"))
}

/// Two prod clusters and a dev one, Secret `db`, and Bundle `app` copying it to prod, fanned
/// out once (its writes taken).
async fn fanned_out() -> TestHub {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.cluster("dev", &[("env", "dev")]);
    hub.secret("db", &[("password", "v1")]);
    hub.bundle("app", copying_spec());
    hub.reconcile_bundle("app").await;
    hub.take_writes();
    hub
}

#[tokio::test(start_paused = true)]
async fn first_fan_out_writes_one_deployment_and_its_copy_per_targeted_cluster() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.cluster("dev", &[("env", "dev")]);
    hub.secret("db", &[("password", "v1")]);
    hub.bundle("app", copying_spec());
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    assert_eq!(
        sorted(writes.clone()),
        strings(&[
            bd_write("one"),
            bd_write("two"),
            copy_write("one"),
            copy_write("two"),
            format!("status bundles {WS}/app"),
        ])
    );
    // A new BundleDeployment goes before its copies (they are owned by its uid).
    for c in ["one", "two"] {
        let at = |w: String| writes.iter().position(|x| *x == w).expect("written");
        assert!(at(bd_write(c)) < at(copy_write(c)), "{writes:#?}");
    }
    assert_eq!(copied_password(&hub, "one").as_deref(), Some("v1"));
    let bd: BundleDeployment = hub.get(Some(&cns("one")), "app").expect("BundleDeployment");
    let copy: Secret = hub.get(Some(&cns("one")), COPY).expect("copy");
    let owner = &copy.metadata.owner_references.expect("owned")[0];
    assert_eq!(
        Some(&owner.uid),
        bd.metadata.uid.as_ref(),
        "the copy goes with its BundleDeployment"
    );
    assert!(
        hub.get::<BundleDeployment>(Some(&cns("dev")), "app")
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_reconcile_with_nothing_changed_writes_nothing() {
    let hub = fanned_out().await;
    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
    // Not even later: nothing in the Bundle's status depends on the time passing.
    tokio::time::advance(Duration::from_secs(3600)).await;
    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
    assert!(hub.fake.take_writes().is_empty(), "no event either");
}

#[tokio::test(start_paused = true)]
async fn a_rotation_writes_exactly_one_copy_per_cluster_and_no_deployment() {
    let hub = fanned_out().await;
    let before: BundleDeployment = hub.get(Some(&cns("one")), "app").expect("bd");
    hub.secret("db", &[("password", "v2")]);
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    let copies: Vec<String> = writes
        .iter()
        .filter(|w| w.contains(" secrets "))
        .cloned()
        .collect();
    assert_eq!(
        sorted(copies),
        strings(&[copy_write("one"), copy_write("two")])
    );
    assert!(
        !writes.iter().any(|w| w.contains("bundledeployments")),
        "the BundleDeployment's hash did not change: {writes:#?}"
    );
    assert_eq!(copied_password(&hub, "one").as_deref(), Some("v2"));
    assert_eq!(copied_password(&hub, "two").as_deref(), Some("v2"));
    let after: BundleDeployment = hub.get(Some(&cns("one")), "app").expect("bd");
    assert_eq!(
        before.metadata.resource_version,
        after.metadata.resource_version
    );

    // Settled: the next reconcile writes nothing.
    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn untargeting_a_cluster_deletes_its_deployment_only() {
    let hub = fanned_out().await;
    hub.edit::<Cluster>(Some(WS), "two", |c| {
        c["metadata"]["labels"]["env"] = "staging".into()
    });
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    let cluster_writes: Vec<&String> = writes.iter().filter(|w| !w.contains(" bundles ")).collect();
    assert_eq!(
        cluster_writes,
        [&format!("delete bundledeployments {}/app", cns("two"))]
    );
    // The agent's finalizer holds it until the agent has cleaned up downstream.
    let leaving: BundleDeployment = hub.get(Some(&cns("two")), "app").expect("terminating");
    assert!(leaving.metadata.deletion_timestamp.is_some());
    assert!(
        hub.get::<BundleDeployment>(Some(&cns("one")), "app")
            .is_some()
    );

    // Deleted once: the next reconcile leaves it to the agent.
    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn copies_over_the_limit_are_held_and_reported() {
    let hub = TestHub::with_config(HubConfig {
        max_copied_bytes_per_bundle: 3,
        ..test_config()
    });
    hub.cluster("one", &[("env", "prod")]);
    hub.secret("db", &[("password", "longer than three bytes")]);
    hub.bundle("app", copying_spec());
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    assert_eq!(
        hub.take_writes(),
        [format!("status bundles {WS}/app")],
        "nothing but status"
    );
    let (status, why) =
        condition(&hub, "app", conditions::TYPE_RESOURCES_COPIED).expect("condition");
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", reason::COPY_LIMIT_EXCEEDED)
    );
}

#[tokio::test(start_paused = true)]
async fn a_template_failing_for_one_cluster_still_writes_the_others() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod"), ("region", "eu")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.bundle(
        "app",
        json!({
            "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
            "helm": {"chart": "oci://example.com/charts/app", "version": "1.0.0",
                     "values": {"region": "${ .ClusterLabels.region }"}},
        }),
    );
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    assert_eq!(
        hub.take_writes(),
        [bd_write("one"), format!("status bundles {WS}/app")]
    );
    let bd: BundleDeployment = hub.get(Some(&cns("one")), "app").expect("bd");
    let values = bd.spec.helm.and_then(|h| h.values).expect("values");
    assert_eq!(values.0.get("region"), Some(&json!("eu")));
    let (status, why) = condition(&hub, "app", TYPE_READY).expect("condition");
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", reason::VALUES_TEMPLATE_FAILED)
    );
}

#[tokio::test(start_paused = true)]
async fn depends_on_holds_a_cluster_until_its_dependency_is_ready_there() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    let targets = json!([{"clusterSelector": {"matchLabels": {"env": "prod"}}}]);
    hub.bundle("base", json!({"targets": targets}));
    hub.bundle(
        "app",
        json!({"targets": targets, "dependsOn": [{"name": "base"}]}),
    );
    hub.reconcile_bundle("base").await;
    hub.report("one", "base", true);
    hub.report("two", "base", false);
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    assert_eq!(
        hub.take_writes(),
        [bd_write("one"), format!("status bundles {WS}/app")]
    );
    let (status, why) = condition(&hub, "app", TYPE_READY).expect("condition");
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", reason::DEPENDENCY_NOT_READY)
    );

    // Ready there too: released.
    hub.report("two", "base", true);
    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    assert!(writes.contains(&bd_write("two")), "{writes:#?}");
    assert!(!writes.contains(&bd_write("one")), "{writes:#?}");
}

#[tokio::test(start_paused = true)]
async fn a_forged_cluster_status_does_not_move_where_the_hub_writes() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("victim", &[("env", "dev")]);
    hub.secret("db", &[("password", "v1")]);
    // The agent of `one` (which may write its Cluster's status) claims another cluster's
    // namespace as its own.
    hub.edit::<Cluster>(Some(WS), "one", |c| {
        c["status"] = json!({"namespace": cns("victim")});
    });
    hub.bundle("app", copying_spec());
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    assert_eq!(
        sorted(writes.clone()),
        strings(&[
            bd_write("one"),
            copy_write("one"),
            format!("status bundles {WS}/app")
        ])
    );
    assert!(
        hub.get::<BundleDeployment>(Some(&cns("victim")), "app")
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn a_namespace_the_hub_did_not_create_is_never_written_into() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.secret("db", &[("password", "v1")]);
    // The namespace was replaced by someone else's of the same name: its uid is not the one
    // recorded on the Cluster.
    let resource = ApiResource::erase::<Namespace>(&());
    let theirs = hub
        .fake
        .get(&resource, None, &cns("one"))
        .expect("namespace");
    hub.fake.remove(&resource, None, &cns("one"));
    let mut replaced = theirs.clone();
    replaced["metadata"]
        .as_object_mut()
        .expect("meta")
        .remove("uid");
    hub.fake.insert(&resource, replaced);
    hub.sync();
    hub.bundle("app", copying_spec());
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), [format!("status bundles {WS}/app")]);
}

/// Clusters `one` (wave 1) and `two` (wave 2) at revision v1 of Secret `db`, both ready, under
/// Bundle `app` rolling out in two waves (60 s soak, 300 s deadline, rollback on failure).
async fn rolled_out_in_waves() -> TestHub {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod"), ("wave", "1")]);
    hub.cluster("two", &[("env", "prod"), ("wave", "2")]);
    hub.secret("db", &[("password", "v1")]);
    let mut spec = copying_spec();
    spec["rolloutStrategy"] = json!({
        "partitions": [
            {"name": "canary", "clusterSelector": {"matchLabels": {"wave": "1"}}},
            {"name": "rest", "clusterSelector": {"matchLabels": {"wave": "2"}}},
        ],
        "progressDeadlineSeconds": 300,
        "soakSeconds": 60,
        "onFailure": "Rollback",
    });
    hub.bundle("app", spec);
    hub.reconcile_bundle("app").await;
    hub.report("one", "app", true);
    hub.report("two", "app", true);
    hub.reconcile_bundle("app").await;
    hub.take_writes();
    hub
}

/// The copy and BundleDeployment writes among `writes` (no status, no rollout state).
fn cluster_writes(writes: &[String]) -> Vec<String> {
    sorted(
        writes
            .iter()
            .filter(|w| w.contains(" bundledeployments ") || w.contains(&format!("/{COPY}")))
            .cloned()
            .collect(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_wave_is_held_until_the_one_before_is_ready_and_has_soaked() {
    let hub = rolled_out_in_waves().await;
    hub.secret("db", &[("password", "v2")]);
    hub.take_writes();

    // The rotation reaches the first wave only; the rollout's state is kept in the hub's own
    // namespace, never the workspace (decision 0112).
    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    assert_eq!(cluster_writes(&writes), [copy_write("one")]);
    let own = format!(
        "apply secrets {}/tender-rollout-",
        hub.ctx.config.own_namespace()
    );
    assert!(writes.iter().any(|w| w.starts_with(&own)), "{writes:#?}");
    assert!(
        !writes
            .iter()
            .any(|w| w.contains(&format!(" {WS}/")) && !w.starts_with("status ")),
        "{writes:#?}"
    );
    assert_eq!(copied_password(&hub, "two").as_deref(), Some("v1"));

    // Wave 1 ready: it soaks 60 s before wave 2 is released.
    hub.report("one", "app", true);
    hub.reconcile_bundle("app").await;
    assert_eq!(cluster_writes(&hub.take_writes()), Vec::<String>::new());
    tokio::time::advance(Duration::from_secs(59)).await;
    hub.reconcile_bundle("app").await;
    assert_eq!(
        cluster_writes(&hub.take_writes()),
        Vec::<String>::new(),
        "still soaking"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    hub.reconcile_bundle("app").await;
    assert_eq!(cluster_writes(&hub.take_writes()), [copy_write("two")]);
    assert_eq!(copied_password(&hub, "two").as_deref(), Some("v2"));
}

#[tokio::test(start_paused = true)]
async fn a_wave_not_ready_by_its_deadline_is_rolled_back() {
    let hub = rolled_out_in_waves().await;
    hub.secret("db", &[("password", "bad")]);
    hub.reconcile_bundle("app").await;
    assert_eq!(copied_password(&hub, "one").as_deref(), Some("bad"));
    hub.take_writes();

    // Never ready at the new revision: within the deadline nothing happens ...
    tokio::time::advance(Duration::from_secs(299)).await;
    hub.reconcile_bundle("app").await;
    assert_eq!(cluster_writes(&hub.take_writes()), Vec::<String>::new());
    // ... past it, wave 1 gets its previous copy back and wave 2 never saw the bad one.
    tokio::time::advance(Duration::from_secs(2)).await;
    hub.reconcile_bundle("app").await;
    let writes = cluster_writes(&hub.take_writes());
    assert!(writes.contains(&copy_write("one")), "{writes:#?}");
    assert!(
        !writes.iter().any(|w| w.contains(&cns("two"))),
        "{writes:#?}"
    );
    assert_eq!(copied_password(&hub, "one").as_deref(), Some("v1"));
    assert_eq!(copied_password(&hub, "two").as_deref(), Some("v1"));
    let (status, _) = condition(&hub, "app", conditions::TYPE_ROLLOUT_HALTED).expect("halted");
    assert_eq!(status, "True");

    // Rolled back once: later reconciles leave it there.
    hub.reconcile_bundle("app").await;
    tokio::time::advance(Duration::from_secs(600)).await;
    hub.reconcile_bundle("app").await;
    assert_eq!(cluster_writes(&hub.take_writes()), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn the_rollout_state_is_read_from_its_cache_not_from_the_apiserver() {
    let hub = rolled_out_in_waves().await;
    hub.fake.take_requests();
    hub.reconcile_bundle("app").await;
    let rollout_requests: Vec<String> = hub
        .fake
        .take_requests()
        .iter()
        .filter(|r| r.path.contains("/secrets/tender-rollout-"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(rollout_requests, Vec::<String>::new());
}

/// Decision 0121: a reconcile that runs before the cache shows the hub's own last write of
/// the rollout state must not take the state before it as the truth — that would start the
/// revision anew, drop the previous revision kept for wave 1, and the rollback past the
/// deadline would have nothing to restore.
#[tokio::test(start_paused = true)]
async fn a_rollback_restores_the_kept_revision_while_the_state_cache_lags_the_hubs_write() {
    let hub = rolled_out_in_waves().await;
    // The rollout state cache keeps showing the state of revision v1 from here on.
    hub.lag_rollout_cache(true);
    hub.secret("db", &[("password", "bad")]);
    hub.reconcile_bundle("app").await;
    assert_eq!(copied_password(&hub, "one").as_deref(), Some("bad"));
    assert_eq!(hub.ctx.rollout_writes.len(), 1, "the write is remembered");
    hub.take_writes();

    // Within the deadline: nothing is released again, nothing new is kept.
    tokio::time::advance(Duration::from_secs(299)).await;
    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), [format!("status bundles {WS}/app")]);
    // Past it, wave 1 gets v1 back: the revision kept before the rotation was not dropped.
    tokio::time::advance(Duration::from_secs(2)).await;
    hub.reconcile_bundle("app").await;
    let writes = cluster_writes(&hub.take_writes());
    assert_eq!(writes, [copy_write("one")]);
    assert_eq!(copied_password(&hub, "one").as_deref(), Some("v1"));
    assert_eq!(copied_password(&hub, "two").as_deref(), Some("v1"));

    // The cache catches up: the memo retires and the cache decides, with nothing to write.
    hub.lag_rollout_cache(false);
    hub.sync();
    assert_eq!(hub.ctx.rollout_writes.len(), 0);
    hub.reconcile_bundle("app").await;
    assert_eq!(cluster_writes(&hub.take_writes()), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_deployment_too_large_for_one_cluster_is_reported_and_the_others_written() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.secret("db", &[("password", "v1")]);
    let path = format!(
        "/apis/{}/namespaces/{}/bundledeployments/app",
        tender_types::API_GROUP_VERSION,
        cns("two")
    );
    hub.fake.fail(Some(http::Method::PATCH), &path, 413);
    hub.bundle("app", copying_spec());
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    let writes = sorted(hub.take_writes());
    assert_eq!(
        writes,
        strings(&[
            bd_write("one"),
            bd_write("two"),
            copy_write("one"),
            format!("status bundles {WS}/app"),
        ]),
        "the refused BundleDeployment was tried once, and no copy follows it"
    );
    let (status, why) = condition(&hub, "app", TYPE_READY).expect("condition");
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", reason::TOO_LARGE)
    );
}

#[tokio::test(start_paused = true)]
async fn a_copy_deleted_downstream_of_the_hub_is_written_again_alone() {
    let hub = fanned_out().await;
    assert!(
        hub.fake
            .remove(&ApiResource::erase::<Secret>(&()), Some(&cns("two")), COPY)
    );
    hub.sync();

    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), [copy_write("two")]);
    assert_eq!(copied_password(&hub, "two").as_deref(), Some("v1"));
}

#[tokio::test(start_paused = true)]
async fn a_deleted_bundle_deletes_its_deployments_then_lets_go() {
    let hub = fanned_out().await;
    hub.edit::<Bundle>(Some(WS), "app", |b| {
        b["metadata"]["deletionTimestamp"] = START.into();
    });

    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    assert_eq!(
        sorted(writes[..2].to_vec()),
        strings(&[
            format!("delete bundledeployments {}/app", cns("one")),
            format!("delete bundledeployments {}/app", cns("two")),
        ])
    );
    // Then its cleanup finalizer goes, and with it the Bundle.
    assert_eq!(writes[2..], [format!("patch bundles {WS}/app")]);
    assert!(hub.get::<Bundle>(Some(WS), "app").is_none());
}
